"""Seals hold: records copied into other traces, rows the hash cannot encode, forked processes, SDK limits.

Also the capture-input errors (nesting, huge numbers) and relative dataset paths.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_replay
from otel_replay import Action, ConflictingRecords, DependencySnapshot, ReferenceLedger, audit, settings
from otel_replay import semconv as sc
from otel_replay.capture.recorder import Recorder, get_recorder, set_recorder
from otel_replay.errors import CaptureError, ConfigError
from otel_replay.exporters import ParquetSpanExporter
from otel_replay.gate import reads
from otel_replay.integrity import (
    MISPLACED,
    Chain,
    SealCheck,
    SigningKey,
    StoredRecord,
    load_signing_key,
    restore_attributes,
    verify_records,
)
from otel_replay.query.trust import select_trusted, split_trusted

from ._support import in_forked_child, payment, snapshot, timestamps_as_ints
from .query.test_trust import Rows, _add_file, _decision_row, _replay_cli, _rows

KEY = SigningKey(b"k" * 32)
LIVE = {"budget_remaining": 3_000, "allow_list": ["acme-supplies"]}


@pytest.fixture
def decided(tmp_path, dataset):
    """One sealed $4,200 payment decision with read/model/act children, and a live state that rolls it back."""
    telemetry = otel_replay.configure(dataset, set_global=False)
    with audit("vendor_payment", snapshot=snapshot()) as d:
        d.read(invoice="INV-1")
        d.model("gpt-4o", "invoice matches PO")
        d.act(payment())
    telemetry.shutdown()
    live = tmp_path / "live.json"
    live.write_text(json.dumps(LIVE))
    return d.record, live


def _rows_all(dataset: Path) -> tuple[list[Path], Rows]:
    """Every data file's rows (with times as int ns) and the first file's schema."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = sorted((dataset / "spans").rglob("*.parquet"))
    rows = Rows()
    for path in paths:
        table = pq.read_table(path)
        rows.extend(table.cast(pa.schema([f.with_type(timestamps_as_ints(f.type)) for f in table.schema])).to_pylist())
        rows.schema = table.schema
    return paths, rows


def _sealed(record_id: str = "r1", **extra: object) -> tuple[str, int, dict]:
    attrs = {sc.KIND: sc.KIND_DECISION, sc.RECORD_ID: record_id, **extra}
    Chain(KEY).seal(record_id, sc.SPAN_DECISION, 1_000, attrs)
    return sc.SPAN_DECISION, 1_000, attrs


def _stored(attrs: dict, *, trace: str = "t" * 32, span: str = "s" * 16, file: str = "a.parquet") -> StoredRecord:
    return StoredRecord(str(attrs[sc.RECORD_ID]), sc.SPAN_DECISION, 1_000, attrs, file, trace, span)


# --- finding 8: a sealed record copied into another trace ------------------------------------------


def test_a_decision_copied_into_another_trace_is_named_a_copy_and_the_original_keeps_its_place(decided, dataset):
    """The seal covers the span a record was sealed in (replay.record.span): the copy is refused, not both."""
    record, live = decided
    _, table = _rows(dataset)
    copy = dict(_decision_row(table, record.record_id))
    copy["trace_id"], copy["span_id"] = "a" * 32, "b" * 16
    forged_child = dict(next(r for r in table if r["name"] == sc.SPAN_MODEL))
    forged_child.update(trace_id="a" * 32, span_id="c" * 16, parent_span_id="b" * 16, name="replay.model FORGED")
    path = _add_file(dataset, [copy, forged_child], table.schema, name="part-0-copy.parquet")
    assert record.seal is not None and record.seal.span == f"{record.span.trace_id}-{record.span.span_id}"
    with otel_replay.open(dataset) as store:
        report = store.verify(load_signing_key())
        (problem,) = report.problems  # the copy alone: no "sequence number claimed twice" besides it
        assert problem.record_id == record.record_id and problem.file == str(path)
        assert problem.problem.startswith(MISPLACED) and f"{'a' * 32}-{'b' * 16}" in problem.problem
        assert record.seal.span in problem.problem
        assert store.record(record.record_id) == record  # the original, at its own span
        shown = store.rows("SELECT trace_id, span_id FROM decisions WHERE record_id = ?", [record.record_id])
        assert shown == [{"trace_id": record.span.trace_id, "span_id": record.span.span_id}]  # not the copy
        assert len(store.rows("SELECT * FROM spans WHERE record_id = ?", [record.record_id])) >= 3
        tree = store.causal_tree(record.record_id)
        assert tree[0]["span_id"] == record.span.span_id and not any("FORGED" in r["name"] for r in tree)
    result = _replay_cli(record.record_id, dataset, live)
    assert result.exit_code == 0 and "ROLLBACK" in result.output, result.output


def test_a_record_sealed_before_places_were_sealed_still_conflicts_when_copied(decided, dataset):
    """An older record (no replay.record.span): its copy is still refused in both places, as before."""
    record, _ = decided
    _, table = _rows(dataset)
    row = dict(_decision_row(table, record.record_id))
    body = restore_attributes(row)
    for key in (sc.RECORD_SPAN, sc.RECORD_HASH, sc.RECORD_SIGNATURE):
        body.pop(key)
    body[sc.RECORD_ID] = "older-1"
    Chain(load_signing_key()).seal("older-1", row["name"], record.span.start_ns, body)  # sealed without a place
    stored = {k: v for k, v in body.items() if k not in sc.PROMOTED_COLUMNS}
    original = dict(row, record_id="older-1", trace_id="d" * 32, span_id="e" * 16, attributes=json.dumps(stored))
    copy = dict(original, trace_id="a" * 32, span_id="b" * 16)
    _add_file(dataset, [original, copy], table.schema, name="older.parquet")
    with otel_replay.open(dataset) as store:
        problems = store.verify(load_signing_key()).problems
        assert [p.record_id for p in problems] == ["older-1"] and "copied to another trace" in problems[0].problem
        with pytest.raises(ConflictingRecords, match="copied to another trace"):
            store.record("older-1")
        assert len(store.rows("SELECT * FROM decisions WHERE record_id = 'older-1'")) == 2  # both shown, as before
        assert store.record(record.record_id) == record


def test_the_same_record_stored_twice_at_the_same_span_still_verifies_once(decided, dataset):
    record, _ = decided
    _, table = _rows(dataset)
    _add_file(dataset, [dict(_decision_row(table, record.record_id))], table.schema, name="retry.parquet")
    with otel_replay.open(dataset) as store:
        report = store.verify(load_signing_key())
        assert report.ok, report.problems
        assert store.record(record.record_id) == record


def test_a_copied_record_conflicts_where_its_place_is_read_and_stays_content_elsewhere():
    name, start, attrs = _sealed("gate-1")
    _, _, other = _sealed("gate-2")
    rows = [
        _stored(attrs, file="a.parquet"),
        _stored(dict(attrs), file="b.parquet"),  # a retry: the same span
        _stored(dict(attrs), trace="e" * 32, span="f" * 16, file="c.parquet"),  # a copy elsewhere
        _stored(other, span="o" * 16),
    ]
    check = SealCheck(KEY)
    with pytest.raises(ConflictingRecords, match="copied to another trace"):
        select_trusted("gate-1", rows[:3], check, where="here")
    assert select_trusted("gate-1", rows[:2], check, where="here").span.span_id == "s" * 16
    # Readers of content only (receipts, compensations, outcomes) keep it: the sealed content is the same.
    trusted, refused = split_trusted(rows, check)
    assert len(trusted) == 4 and refused == []
    report = verify_records(rows, KEY)
    assert [p.file for p in report.problems] == ["c.parquet"] and report.records == 2
    assert "copied to another trace" in report.problems[0].problem and "f" * 16 in report.problems[0].problem


def test_a_commit_and_its_compensation_copied_into_another_trace_still_count(tmp_path, dataset):
    """Hiding them would mean no refund (receipt gone) or a second one (compensation gone)."""
    with otel_replay.configure(dataset, set_global=False):
        ledger = ReferenceLedger(10_000)
        with audit("vendor_payment", snapshot=snapshot()) as d:
            d.act(payment())
            gate = otel_replay.ActionGate(ledger, dataset=dataset)
            receipt = gate.commit(payment(), record_id=d.record_id)
    live = tmp_path / "live.json"
    live.write_text(json.dumps(LIVE))
    result = _replay_cli(d.record_id, dataset, live, "--execute", "--rail", "otel_replay.demo:demo_ledger")
    assert result.exit_code == 0 and "rolled_back" in result.output, result.output
    _, table = _rows_all(dataset)
    copies = [dict(r, trace_id="a" * 32, span_id=f"{i:016x}") for i, r in enumerate(table) if r["name"] == sc.SPAN_GATE]
    assert {json.loads(r["attributes"])[sc.GATE_STAGE] for r in copies} >= {"commit", "post_commit"}
    _add_file(dataset, copies, table.schema, name="part-0-copy.parquet")
    with otel_replay.open(dataset) as store:
        assert {r["receipt_id"] for r in reads.receipts_for(store, d.record_id)} == {receipt.receipt_id}
        assert reads.compensation_for(store, d.record_id)["executed"] == "rolled_back"
        problems = store.verify(load_signing_key()).problems
        assert len(problems) == len(copies) and all(p.problem.startswith(MISPLACED) for p in problems)
        gates = store.rows("SELECT trace_id FROM gates WHERE decision_id = ?", [d.record_id])
        assert gates and all(g["trace_id"] != "a" * 32 for g in gates)  # the copies are not in the view


# --- finding 10: a row the hash cannot encode -------------------------------------------------------


def test_a_row_with_an_escaped_lone_surrogate_is_refused_and_named_the_genuine_one_acts(decided, dataset):
    record, live = decided
    _, table = _rows(dataset)
    forged = dict(_decision_row(table, record.record_id))
    forged["attributes"] = forged["attributes"][:-1] + ',"replay.note":"\\ud800"}'  # valid ASCII JSON
    forged["span_id"] = "f" * 16
    path = _add_file(dataset, [forged], table.schema)
    with otel_replay.open(dataset) as store:
        report = store.verify(load_signing_key())
        (problem,) = report.problems
        assert problem.record_id == record.record_id and problem.file == str(path)
        assert problem.problem.startswith("unreadable attributes:") and "surrogate" in problem.problem
        assert report.records == 2  # the genuine one verified as well
        assert store.record(record.record_id) == record
    result = _replay_cli(record.record_id, dataset, live)
    assert result.exit_code == 0 and "ROLLBACK" in result.output, result.output


def test_seal_check_turns_unhashable_values_into_a_problem():
    name, start, attrs = _sealed()
    nested: object = 1
    for _ in range(5_000):
        nested = {"a": nested}
    check = SealCheck(KEY)
    for bad in ("\ud800", nested):
        problem, signed = check.problem(_stored({**attrs, "replay.note": bad}))
        assert problem is not None and problem.startswith("unreadable attributes:") and not signed


# --- finding 9: forks and retention ----------------------------------------------------------------


def test_a_forked_child_seals_into_a_new_chain():
    recorder = Recorder(key=KEY)
    parent = recorder.chain.seal("p0", sc.SPAN_DECISION, 1, {sc.RECORD_ID: "p0"})

    def child() -> list[object]:
        seal = recorder.chain.seal("c0", sc.SPAN_DECISION, 2, {sc.RECORD_ID: "c0"})
        return [seal.chain_id, seal.seq, seal.prev_hash]

    chain_id, seq, prev_hash = in_forked_child(child)
    assert chain_id != parent.chain_id and seq == 0 and prev_hash == "0" * 64
    assert recorder.chain.seal("p1", sc.SPAN_DECISION, 3, {sc.RECORD_ID: "p1"}).seq == 1  # the parent goes on


def test_verify_says_retention_may_have_dropped_a_chain_start():
    chain = Chain(KEY)
    rows = []
    for i in range(4):
        attrs = {sc.RECORD_ID: f"r{i}"}
        chain.seal(f"r{i}", sc.SPAN_DECISION, 1_000, attrs)
        rows.append(_stored(attrs, span=f"{i:016x}"))
    start_cut = verify_records(rows[2:], KEY).problems
    assert len(start_cut) == 1 and "dropped by retention" in start_cut[0].problem
    middle_cut = verify_records([rows[0], rows[1], rows[3]], KEY).problems
    assert len(middle_cut) == 1 and "retention" not in middle_cut[0].problem


# --- finding 6: SDK attribute limits -----------------------------------------------------------------


def test_configure_stores_sealed_records_whole_under_sdk_attribute_limits(monkeypatch, dataset):
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "64")
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "8")
    state = {"budget": 10_000, "allow_list": [f"vendor-{i:04d}" for i in range(40)]}
    with otel_replay.configure(dataset, set_global=False):
        with audit("vendor_payment", snapshot=DependencySnapshot(state)) as d:
            d.read(invoice="INV-1")
            d.act(payment())
    with otel_replay.open(dataset) as store:
        report = store.verify(load_signing_key())
        assert report.ok, report.problems
        assert store.record(d.record_id).snapshot.state == state


@pytest.mark.parametrize(
    ("limits", "named"),
    [
        (SpanLimits(max_span_attribute_length=256), "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"),
        (SpanLimits(max_span_attributes=16), "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT"),
    ],
)
def test_a_provider_that_would_cut_records_is_refused_before_anything_is_sealed(limits, named):
    provider = TracerProvider(span_limits=limits)
    exported = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    recorder = Recorder(provider.get_tracer("tests"), key=KEY)
    with pytest.raises(ConfigError, match=named):
        recorder.emit(sc.SPAN_OUTCOME, "o1", {sc.RECORD_ID: "o1"})
    previous = set_recorder(recorder)
    ran = []
    try:
        with pytest.raises(ConfigError, match=named):  # refused when the block starts: its action never runs
            with audit("vendor_payment", snapshot=snapshot()) as d:
                ran.append(d)
    finally:
        set_recorder(previous)
    assert ran == [] and recorder.stats.capture_errors == 0
    assert [s.name for s in exported.get_finished_spans() if s.name == sc.SPAN_DECISION] == []  # nothing sealed
    provider.shutdown()


def test_a_provider_without_limits_records_normally():
    provider = TracerProvider(span_limits=SpanLimits(max_span_attribute_length=SpanLimits.UNSET))
    recorder = Recorder(provider.get_tracer("tests"), key=KEY)
    ref, seal = recorder.emit(sc.SPAN_OUTCOME, "o1", {sc.RECORD_ID: "o1"})
    assert seal.seq == 0 and ref.span_id
    provider.shutdown()


# --- minor c: capture input errors ---------------------------------------------------------------------


def _nest(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Action("pay", {"x": _nest(5_000)}), r"Action\(pay\)\.arguments is nested too deeply"),
        (lambda: DependencySnapshot({"x": _nest(5_000)}), r"DependencySnapshot\.state is nested too deeply"),
        (lambda: Action("pay", {}, cost=10**400), r"Action\(pay\)\.cost .* an int of about 401 digits"),
        (lambda: Action("pay", {"x": [1, 10**5000]}), r"\$\.x\[1\] is an int of about 5001 digits"),
    ],
)
def test_bad_capture_input_is_a_one_line_capture_error_naming_where(make, message):
    with pytest.raises(CaptureError, match=message) as caught:
        make()
    assert "\n" not in str(caught.value) and "is fine" not in str(caught.value)


def test_a_cycle_in_capture_input_is_named():
    looped: dict = {"b": [1]}
    looped["b"].append(looped)
    with pytest.raises(CaptureError, match=r"\$\.x\.b\[1\] is a reference back"):
        Action("pay", {"x": looped})


def test_read_inputs_nested_too_deeply_fail_the_block_with_a_capture_error(telemetry):
    with pytest.raises(CaptureError, match="read\\(\\) inputs is nested too deeply"):
        with audit("vendor_payment", snapshot=snapshot()) as d:
            d.read(deep=_nest(5_000))


# --- minor d: relative dataset paths --------------------------------------------------------------------


def test_configure_resolves_a_relative_dataset_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work").mkdir()
    with otel_replay.configure("traces", set_global=False) as telemetry:
        assert telemetry.dataset == str(tmp_path / "traces")
        assert get_recorder().dataset == str(tmp_path / "traces")
        with audit("pay", snapshot=snapshot()) as d:
            d.act(payment())
        monkeypatch.chdir(tmp_path / "work")
        with audit("pay", snapshot=snapshot()) as d:
            d.act(payment())
        gate_claims = otel_replay.ActionGate(ReferenceLedger(1)).claims.directory
    assert not (tmp_path / "work" / "traces").exists()
    assert Path(gate_claims).is_absolute() and str(gate_claims).startswith(str(tmp_path / "traces"))
    with otel_replay.open(tmp_path / "traces") as store:
        report = store.verify(load_signing_key())
        assert report.ok and report.records == 2


def test_the_exporter_makes_local_paths_absolute_and_leaves_uris(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exporter = ParquetSpanExporter("rel")
    try:
        assert exporter.dataset_dir == str(tmp_path / "rel")
    finally:
        exporter.shutdown()
    assert settings.absolute_dataset("s3://bucket/prefix") == "s3://bucket/prefix"
    assert settings.absolute_dataset("file:///data/traces") == "file:///data/traces"
    assert settings.absolute_dataset("./x") == str(tmp_path / "x")


# --- second reading of the sealed place ---------------------------------------------------------------


def test_a_copy_without_ids_is_left_out_of_the_views_as_verify_refuses_it(decided, dataset):
    """A NULL id read as '?' in SQL as in Python: the copy neither verifies nor shows (it used to count thrice)."""
    record, _ = decided
    _, table = _rows(dataset)
    row = dict(_decision_row(table, record.record_id))
    copies = [dict(row, trace_id=None), dict(row, span_id=None), dict(row, trace_id=None, span_id=None)]
    loose = pa.schema([f.with_nullable(True) if f.name in ("trace_id", "span_id") else f for f in table.schema])
    _add_file(dataset, copies, loose, name="no-ids.parquet")  # a foreign writer's schema lets ids be null
    with otel_replay.open(dataset) as store:
        assert len(store.rows("SELECT * FROM decisions WHERE record_id = ?", [record.record_id])) == 1
        assert sum(r["decisions"] for r in store.decision_summary()) == 1
        problems = store.verify(load_signing_key()).problems
        assert len(problems) == 3 and all(p.problem.startswith(MISPLACED) for p in problems)


def test_a_record_that_cannot_be_sealed_is_refused_before_its_span_starts():
    """A span started and never ended would sit in every processor that tracks open spans."""
    from opentelemetry.sdk.trace import SpanProcessor

    from otel_replay import AuditLog

    class Open(SpanProcessor):
        def __init__(self) -> None:
            self.open: set[int] = set()

        def on_start(self, span, parent_context=None):  # type: ignore[no-untyped-def]
            self.open.add(span.context.span_id)

        def on_end(self, span):  # type: ignore[no-untyped-def]
            self.open.discard(span.context.span_id)

    provider, tracking = TracerProvider(), Open()
    provider.add_span_processor(tracking)
    previous = set_recorder(Recorder(provider.get_tracer(sc.INSTRUMENTATION_NAME), key=KEY))
    try:
        for _ in range(5):
            with pytest.raises(CaptureError, match="cannot be sealed: a value holds text that is not valid Unicode"):
                AuditLog().append("evt", source_agent="agent\ud800")
        AuditLog().append("evt", source_agent="agent")
    finally:
        set_recorder(previous)
    assert tracking.open == set()


def test_problem_messages_bound_the_ids_a_row_carries(decided, dataset):
    """A forged id of 100 000 characters must not become 100 000 characters of verify output per row."""
    record, _ = decided
    _, table = _rows(dataset)
    row = dict(_decision_row(table, record.record_id))
    _add_file(dataset, [dict(row, trace_id="a" * 100_000)], table.schema, name="long-ids.parquet")
    with otel_replay.open(dataset) as store:
        (problem,) = store.verify(load_signing_key()).problems
    assert problem.problem.startswith(MISPLACED) and len(str(problem)) < 600
