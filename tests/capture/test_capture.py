from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import threading

import duckdb
import pytest
from opentelemetry.trace import StatusCode

import otel_replay
from otel_replay import (
    AuditLog,
    CaptureError,
    DecisionTracer,
    DependencySnapshot,
    MemorySink,
    Report,
    audit,
    correlation,
    session,
)
from otel_replay import semconv as sc
from otel_replay.capture import Recorder, get_recorder, set_recorder
from otel_replay.capture.audit import current_decision, decision_in_block
from otel_replay.errors import RecordingError

from .._support import payment, snapshot


def test_audit_builds_sealed_record_and_hands_it_to_sink(telemetry):
    sink = MemorySink()
    with audit("vendor_payment", snapshot=snapshot(), sink=sink, agent_id="ap") as d:
        d.read(invoice="INV-1").read(po="PO-9")
        d.model("gpt-x", decision_basis="PO match", output={"approve": True})
        d.act(payment())
    record = d.record
    assert sink.get(record.record_id) is record
    assert record.inputs == {"invoice": "INV-1", "po": "PO-9"}
    assert record.models[0].model_id == "gpt-x" and record.models[0].output == {"approve": True}
    assert record.action.cost == 4200 and record.agent_id == "ap"
    assert record.seal is not None and len(record.seal.hash) == 64 and record.seal.seq >= 0
    assert record.error is None


def test_record_is_unavailable_inside_block(telemetry):
    with audit("x", snapshot=snapshot()) as d:
        with pytest.raises(CaptureError, match="only after the audit block"):
            _ = d.record


def test_snapshot_state_not_json_is_refused_with_path():
    with pytest.raises(CaptureError, match=r"\$\.limits\.when is a datetime"):
        import datetime

        DependencySnapshot({"limits": {"when": datetime.datetime.now()}})
    with pytest.raises(CaptureError, match="NaN|nan"):
        DependencySnapshot({"x": float("nan")})


def test_snapshot_is_deep_copied():
    state = {"allow_list": ["a"]}
    snap = DependencySnapshot(state)
    state["allow_list"].append("b")
    assert snap.state == {"allow_list": ["a"]}


def test_act_twice_and_wrong_types_are_refused(telemetry):
    with audit("x", snapshot=snapshot()) as d:
        d.act(payment())
        with pytest.raises(CaptureError, match="already called"):
            d.act(payment())
        with pytest.raises(CaptureError, match="takes an Action"):
            d.act({"type": "x"})  # type: ignore[arg-type]
    with pytest.raises(CaptureError, match="DependencySnapshot"):
        with audit("x", snapshot={"a": 1}):  # type: ignore[arg-type]
            pass


def test_exception_is_recorded_and_reraised(telemetry, dataset):
    with pytest.raises(RuntimeError, match="rail down"):
        with audit("vendor_payment", snapshot=snapshot()) as d:
            d.act(payment())
            raise RuntimeError("rail down")
    assert "RuntimeError: rail down" in d.record.error
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        row = store.rows("SELECT status_code, error FROM decisions WHERE record_id = ?", [d.record.record_id])[0]
        events = store.rows(
            "SELECT events FROM spans WHERE record_id = ? AND name = 'replay.decision'", [d.record.record_id]
        )
    assert row["status_code"] == StatusCode.ERROR.name
    assert "rail down" in row["error"]
    assert events[0]["events"][0]["name"] == "exception"


def test_span_tree_and_reports(telemetry, dataset):
    with audit("vendor_payment", snapshot=snapshot()) as d:
        d.read(invoice="INV-1")
        d.attach(Report("data", "po_match", passed=True))
        d.model("gpt-x")
        d.attach(Report("model", "grounded", passed=False, detail={"why": "no citation"}))
        d.attach(Report("harness", "latency_ok", passed=True))
        d.act(payment())
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        spans = store.rows(
            "SELECT name, replay_kind, span_id, parent_span_id, events FROM spans WHERE record_id = ?",
            [d.record.record_id],
        )
    by_name = {s["name"]: s for s in spans}
    root = by_name[sc.SPAN_DECISION]
    for child in (sc.SPAN_READ, sc.SPAN_MODEL, sc.SPAN_ACT):
        assert by_name[child]["parent_span_id"] == root["span_id"]
    stages = {name: [json.loads(e["attributes"])[sc.REPORT_STAGE] for e in s["events"]] for name, s in by_name.items()}
    assert stages[sc.SPAN_READ] == ["data"]
    assert stages[sc.SPAN_MODEL] == ["model"]
    assert stages[sc.SPAN_DECISION] == ["harness"]
    assert [r.name for r in d.record.reports] == ["po_match", "grounded", "latency_ok"]


def test_correlation_stamps_every_span_in_scope(telemetry, dataset):
    other = telemetry.provider.get_tracer("some.other.instrumentation")
    seen: dict[str, str] = {}

    def in_thread():
        with other.start_as_current_span("thread-work"):
            pass

    async def task():
        with other.start_as_current_span("task-work"):
            await asyncio.sleep(0)

    with session("sess-1", agent_id="agent-7"), correlation("trade-42") as cid:
        seen["cid"] = cid
        with other.start_as_current_span("http-call"):
            pass
        ctx = contextvars.copy_context()
        worker = threading.Thread(target=ctx.run, args=(in_thread,))
        worker.start()
        worker.join()
        asyncio.run(task())
    with other.start_as_current_span("outside"):
        pass
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        rows = {r["name"]: r for r in store.rows("SELECT name, correlation_id, session_id, agent_id FROM spans")}
    for name in ("http-call", "thread-work", "task-work"):
        assert (rows[name]["correlation_id"], rows[name]["session_id"], rows[name]["agent_id"]) == (
            "trade-42",
            "sess-1",
            "agent-7",
        ), name
    assert rows["outside"]["correlation_id"] is None
    assert seen["cid"] == "trade-42"


def test_explicit_ids_scope_spans_inside_the_block(telemetry, dataset):
    other = telemetry.provider.get_tracer("other")
    with audit("x", snapshot=snapshot(), correlation_id="c-1", session_id="s-1") as d:
        with other.start_as_current_span("inner"):
            pass
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        inner = store.rows("SELECT correlation_id, session_id, parent_span_id FROM spans WHERE name = 'inner'")[0]
    assert inner["correlation_id"] == "c-1" and inner["session_id"] == "s-1"
    assert inner["parent_span_id"] == d.record.span.span_id


def test_audit_without_sdk_still_records(monkeypatch):
    # No configure(): the global no-op provider. The record is still built, sealed and kept.
    sink = MemorySink()
    with audit("x", snapshot=snapshot(), sink=sink) as d:
        d.act(payment())
    assert sink.get(d.record.record_id).seal is not None


def test_handle_is_closed_after_the_block(telemetry):
    with audit("x", snapshot=snapshot()) as d:
        d.act(payment())
    calls = (lambda: d.read(a=1), lambda: d.model("m"), lambda: d.act(payment()), lambda: d.attach(Report("data", "r")))
    for call in calls:
        with pytest.raises(CaptureError, match="after the audit block exited"):
            call()


def test_action_cost_must_be_a_finite_number():
    from otel_replay import Action

    for bad in (float("nan"), float("inf"), "4200", True):
        with pytest.raises(CaptureError, match="cost must be a finite number"):
            Action("pay", {}, cost=bad)


class _FailingSink:
    def append(self, record):
        raise OSError("sink disk full")


@pytest.fixture
def bad_key_recorder(monkeypatch):
    """A recorder that finds a bad key only when it first seals (no configure())."""
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", "short")
    previous = set_recorder(Recorder())
    yield get_recorder()
    set_recorder(previous)


def test_the_agents_exception_propagates_unchanged_when_the_sink_fails(telemetry, caplog):
    """Issue 6 item 16: a failing sink used to replace the agent's exception."""
    error = RuntimeError("rail down")
    before = get_recorder().stats.capture_errors
    with caplog.at_level(logging.ERROR, logger="otel_replay"):
        with pytest.raises(RuntimeError) as info:
            with audit("vendor_payment", snapshot=snapshot(), sink=_FailingSink()) as d:
                d.act(payment())
                raise error
    assert info.value is error and error.__context__ is None and error.__cause__ is None
    assert get_recorder().stats.capture_errors == before + 1
    assert any(d.record_id in r.getMessage() and "sink disk full" in r.getMessage() for r in caplog.records)
    assert "rail down" in d.record.error  # sealed and emitted; only the sink failed


def test_the_agents_exception_propagates_unchanged_when_the_key_is_bad(bad_key_recorder):
    error = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt) as info:
        with audit("vendor_payment", snapshot=snapshot()) as d:
            raise error
    assert info.value is error and error.__context__ is None
    assert bad_key_recorder.stats.capture_errors == 1
    with pytest.raises(CaptureError, match="no record: sealing and emitting failed: ConfigError"):
        _ = d.record
    with pytest.raises(CaptureError, match="after the audit block exited"):
        d.read(late=True)


def test_a_completed_block_whose_record_cannot_be_kept_says_the_action_stands(telemetry, dataset):
    with pytest.raises(RecordingError, match="the block completed, so its action stands") as info:
        with audit("vendor_payment", snapshot=snapshot(), sink=_FailingSink()) as d:
            d.act(payment())
    assert isinstance(info.value, CaptureError) and isinstance(info.value.__cause__, OSError)
    assert info.value.record is d.record and info.value.record_id == d.record_id
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        assert store.record(d.record_id) == d.record  # the durable copy was emitted before the sink failed


def test_a_completed_block_with_a_bad_key_raises_recording_error(bad_key_recorder):
    with pytest.raises(RecordingError, match="signing key is too short") as info:
        with audit("vendor_payment", snapshot=snapshot()) as d:
            d.act(payment())
    assert info.value.record is None and isinstance(info.value.__cause__, otel_replay.ConfigError)
    assert bad_key_recorder.stats.capture_errors == 1


def test_audit_refuses_to_start_on_a_shut_down_pipeline(dataset, caplog):
    telemetry = otel_replay.configure(dataset, set_global=False)
    closed = telemetry.recorder
    telemetry.shutdown()
    assert get_recorder() is not closed
    previous = set_recorder(closed)
    ran = False
    try:
        with pytest.raises(CaptureError, match="pipeline was shut down"):
            with audit("vendor_payment", snapshot=snapshot()):
                ran = True
        with caplog.at_level(logging.WARNING, logger="otel_replay"):
            otel_replay.AuditLog().append("late", source_agent="a")
            otel_replay.DecisionTracer().decision("a", "late", "after shutdown")
    finally:
        set_recorder(previous)
    assert not ran
    assert closed.stats.dropped_after_shutdown == 2
    lost = [r for r in caplog.records if "after the telemetry pipeline was shut down" in r.getMessage()]
    assert len(lost) == 1  # warned once, counted every time


def test_the_sealed_span_attributes_are_the_records_own(telemetry):
    """audit() reuses read()'s JSON for the inputs: the seal must still cover exactly to_attributes()."""
    from otel_replay.integrity import record_hash

    with audit("vendor_payment", snapshot=snapshot(), correlation_id="c-9") as d:
        d.read(b=2, a=[1, {"z": 1, "y": None}]).read(c="é")
        with pytest.raises(CaptureError, match="read\\(\\) inputs is not JSON-serialisable"):
            d.read(bad={1, 2})  # refused: the inputs already read are kept as they were
        d.read(b=3)
        d.model("gpt-x", decision_basis="PO", output={"approve": True})
        d.act(payment())
    record = d.record
    assert record.inputs == {"a": [1, {"y": None, "z": 1}], "b": 3, "c": "é"}
    attrs = {**record.to_attributes(), **record.seal.to_attributes()}
    assert record_hash(sc.SPAN_DECISION, record.span.start_ns, attrs) == record.seal.hash
    assert get_recorder().chain.key.check(record.seal.hash, record.seal.signature)


def test_an_audit_block_is_entered_once(telemetry):
    block = audit("x", snapshot=snapshot())
    with block as d:
        d.act(payment())
    with pytest.raises(CaptureError, match="entered once"):
        with block:
            pass
    assert d.record.seal is not None


def test_an_open_block_is_found_by_its_record_id_on_another_thread_until_its_decision_is_sealed(telemetry):
    # A gate's commit on a pool thread (no context there) seals the decision as it stands in its intent from this.
    seen: list[object] = []
    with audit("x", snapshot=snapshot()) as d:
        d.act(payment())
        thread = threading.Thread(target=lambda: seen.append(decision_in_block(d.record_id)))
        thread.start()
        thread.join()
    assert seen == [d] and d.record.seal is not None
    assert decision_in_block(d.record_id) is None  # sealed: held for the next write-ahead from here on
    with pytest.raises(ValueError, match="boom"):
        with audit("y", snapshot=snapshot()) as failed:
            raise ValueError("boom")
    assert decision_in_block(failed.record_id) is None


def test_a_bad_snapshot_is_refused_before_anything_is_recorded(telemetry):
    sink = MemorySink()
    for bad in ({"a": 1}, None):
        with pytest.raises(CaptureError, match="snapshot must be a DependencySnapshot"):
            with audit("x", snapshot=bad, sink=sink):  # type: ignore[arg-type]
                pytest.fail("the block must not run")
    assert len(sink) == 0 and current_decision() is None


@pytest.mark.parametrize("name", ["correlation_id", "session_id", "agent_id"])
def test_an_id_given_as_a_number_is_refused_before_the_block_runs(telemetry, name):
    # A chain looks its id up as text: a number would be stored apart from the column it reads, and the chain come
    # back empty. Refused on entry, so no action runs unrecorded.
    sink = MemorySink()
    with pytest.raises(CaptureError, match=f"{name} must be text, got int '42'"):
        with audit("x", snapshot=snapshot(), sink=sink, **{name: 42}):  # type: ignore[arg-type]
            pytest.fail("the block must not run")
    assert len(sink) == 0


def test_tracer_audit_log_and_outcome_refuse_an_id_given_as_a_number(telemetry):
    tracer = DecisionTracer()
    with pytest.raises(CaptureError, match="correlation_id must be text, got int"):
        tracer.decision("a", "step", "numbered", correlation_id=42)  # type: ignore[arg-type]
    with pytest.raises(CaptureError, match="session_id must be text, got float"):
        AuditLog().append("evt", source_agent="a", session_id=4.5)  # type: ignore[arg-type]


def test_explicit_ids_equal_to_the_scope_and_nested_blocks(telemetry, dataset):
    with correlation("c-1", agent_id="ap"):
        with audit("outer", snapshot=snapshot(), correlation_id="c-1") as outer:
            with audit("inner", snapshot=snapshot(), correlation_id="c-2") as inner:
                inner.act(payment())
            outer.act(payment())
    assert (outer.record.correlation_id, outer.record.agent_id) == ("c-1", "ap")
    assert (inner.record.correlation_id, inner.record.agent_id) == ("c-2", "ap")
    assert inner.record.seal.seq == outer.record.seal.seq - 1  # the inner block ends, and is sealed, first
    assert outer.record.seal.prev_id == inner.record_id
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        rows = store.rows(
            "SELECT name, correlation_id, parent_span_id, span_id, record_id FROM spans WHERE record_id IN (?, ?)",
            [outer.record_id, inner.record_id],
        )
    by = {(r["record_id"], r["name"]): r for r in rows}
    outer_span = by[(outer.record_id, sc.SPAN_DECISION)]
    assert by[(inner.record_id, sc.SPAN_DECISION)]["parent_span_id"] == outer_span["span_id"]
    assert {r["correlation_id"] for k, r in by.items() if k[0] == inner.record_id} == {"c-2"}
    assert {r["correlation_id"] for k, r in by.items() if k[0] == outer.record_id} == {"c-1"}


def test_a_failed_decision_stores_its_error_redacted_in_the_record_and_the_span(tmp_path):
    card, token = "4111 1111 1111 1111", "Bearer abcdefghijklmnopqrstuvwxyz012345"
    sink = MemorySink()
    with otel_replay.configure(tmp_path / "ds", set_global=False):
        with pytest.raises(ValueError):
            with audit("refund", snapshot=snapshot(), sink=sink) as d:
                d.act(payment())
                raise ValueError(f"charge of card {card} refused; sent Authorization: {token}")
    record = d.record
    assert record.error is not None and record.error.startswith("ValueError: charge of card")
    assert card not in record.error and "abcdefghijklmnop" not in record.error and "[REDACTED]" in record.error
    stored = b"".join(path.read_bytes() for path in (tmp_path / "ds").rglob("*.parquet"))
    text = "".join(
        str(row)
        for p in (tmp_path / "ds").rglob("*.parquet")
        for row in duckdb.sql(
            f"SELECT attributes, status_message, events::VARCHAR FROM read_parquet('{p}')"  # events hold ns times
        ).fetchall()
    )
    assert "charge of card" in text  # the error and its exception event are stored, redacted
    for secret in (card, "abcdefghijklmnopqrstuvwxyz012345"):
        assert secret.encode() not in stored and secret not in text
