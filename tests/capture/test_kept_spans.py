"""A log segment converted from the spans its process still holds gives the files its bytes give."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, TraceFlags

import otel_replay
from otel_replay import Action, ActionGate, DependencySnapshot, ReferenceLedger, audit
from otel_replay import semconv as sc
from otel_replay.capture import kept_spans
from otel_replay.capture.direct_spans import ended_record_span
from otel_replay.capture.kept_spans import KeptSpans
from otel_replay.capture.write_ahead import _RequestEncoder, convert_log_segment
from otel_replay.storage.wal import WriteAheadLog

from .test_direct_spans import REMOTE

START_NS = 1_764_000_000_000_000_000
PARENT = REMOTE  # a remote parent with a trace state, as the direct spans' tests use
HOSTILE: dict[str, Any] = {
    "text": "caf\u00e9 \U0001f600 \u202e",
    "control": '\x00\x01\x1f line\nbreak "quoted" \\ back',
    "empty": "",
    "long": "x" * 5000,
    "json": '{"a": [1, 2.5, null], "b": "\u00e9"}',
    "int.max": 2**63 - 1,
    "int.min": -(2**63),
    "int.negative": -1,
    "zero": 0,
    "float": 1e308,
    "float.small": -5e-324,
    "float.negative_zero": -0.0,
    "true": True,
    "false": False,
}


def _tracer(scope: str = "otel_replay") -> Any:
    provider = TracerProvider(resource=Resource.create({"service.name": "k\u00e9pt", "n": 3}))
    return provider.get_tracer(scope, "1.2")


def _record_spans(tracer: Any, count: int = 4) -> list[Any]:
    """Record spans of a known shape, as a gate makes them: a root, children of a remote parent, hostile values."""
    spans = []
    for i in range(count):
        parent = PARENT if i % 2 else None
        trace_id = PARENT.trace_id if parent is not None else 0xABC0 + i
        context = SpanContext(trace_id, 0x1000 + i, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        attributes = {sc.KIND: sc.KIND_GATE, "i": i, **(HOSTILE if i == 2 else {"detail": f"record {i}"})}
        spans.append(
            ended_record_span(tracer, parent, context, sc.SPAN_GATE, START_NS + i * 86_400_000_000_000, attributes)
        )
    return spans


def _segment(directory: Path, payloads: list[bytes]) -> Path:
    """A sealed log segment holding ``payloads`` as its records, as a gate's log writes them."""
    wal = WriteAheadLog(directory)
    for payload in payloads:
        wal.append(payload)
    wal.close()
    [path] = directory.glob("*.wal")
    return path


def _files(dataset: Path) -> dict[str, Any]:
    """Each Parquet file under ``dataset`` by its path there: its rows and its footer's key-value metadata."""
    found = {}
    for path in sorted((dataset / "spans").rglob("*.parquet")):
        found[str(path.relative_to(dataset))] = (pq.read_table(path), pq.read_metadata(path).metadata)
    return found


def _held(spans: list[Any]) -> tuple[KeptSpans, list[bytes]]:
    encoder = _RequestEncoder()
    payloads = [encoder.encode([span]) for span in spans]
    kept = KeptSpans()
    assert all(kept.keep(payload, [span]) for payload, span in zip(payloads, spans, strict=True))
    return kept, payloads


def test_a_segment_converts_from_the_held_spans_to_the_files_and_rows_its_bytes_give(tmp_path):
    spans = _record_spans(_tracer())
    kept, payloads = _held(spans)
    segment = _segment(tmp_path / "log", payloads)
    assert kept.convert(segment, str(tmp_path / "held"), "wal-capture-1-seg") == len(spans)
    assert kept.rows == len(spans) and kept.held == 0  # converted, and forgotten
    assert convert_log_segment(segment, str(tmp_path / "bytes"), "wal-capture-1-seg") == len(spans)
    held, from_bytes = _files(tmp_path / "held"), _files(tmp_path / "bytes")
    assert len(held) == 4  # four start dates: a file per date partition
    assert held.keys() == from_bytes.keys()  # the same names: a recovery from the bytes rewrites these files
    for name, (table, footer) in held.items():
        assert table.equals(from_bytes[name][0]), name
        assert footer == from_bytes[name][1], name  # the footer's id keys too
    assert segment.exists()  # converting never releases the segment: the log does, once written


def test_a_segment_holding_a_record_not_held_is_left_to_its_bytes_and_its_records_are_forgotten(tmp_path):
    spans = _record_spans(_tracer())
    kept, payloads = _held(spans[:-1])
    payloads.append(_RequestEncoder().encode([spans[-1]]))  # appended by another process (a recovered log)
    segment = _segment(tmp_path / "log", payloads)
    assert kept.convert(segment, str(tmp_path / "held"), "seg") is None
    assert kept.held == 0 and kept.rows == 0
    assert not (tmp_path / "held").exists()


def test_a_damaged_segment_is_left_to_the_salvage_and_nothing_stays_held(tmp_path):
    spans = _record_spans(_tracer())
    kept, payloads = _held(spans)
    segment = _segment(tmp_path / "log", payloads)
    data = bytearray(segment.read_bytes())
    data[20] ^= 0xFF  # inside the first record: whole records follow, so damage, not a torn tail
    segment.write_bytes(bytes(data))
    assert kept.convert(segment, str(tmp_path / "held"), "seg") is None
    assert kept.held == 0
    assert not (tmp_path / "held").exists()


def test_a_span_the_rows_refuse_is_left_to_the_bytes(tmp_path):
    [span] = _record_spans(_tracer(), 1)
    span._start_time = span._end_time = 2**64 - 1  # past what a Parquet timestamp holds
    kept, payloads = _held([span])
    segment = _segment(tmp_path / "log", payloads)
    assert kept.convert(segment, str(tmp_path / "held"), "seg") is None
    assert kept.held == 0 and not (tmp_path / "held").exists()


def test_only_record_spans_are_held_each_once_and_up_to_the_bound(monkeypatch):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.get_tracer("t").start_span("sdk span", attributes={sc.KIND: sc.KIND_GATE}).end()
    [sdk_span] = exporter.get_finished_spans()
    kept = KeptSpans()
    assert kept.keep(_RequestEncoder().encode([sdk_span]), [sdk_span])  # an SDK span too
    kept.drop([_RequestEncoder().encode([sdk_span])])
    assert not kept.keep(b"\x0a\x00", [])
    first, second = _record_spans(_tracer(), 2)
    payload, other = _RequestEncoder().encode([first]), _RequestEncoder().encode([second])
    monkeypatch.setattr(kept_spans, "KEPT_BYTES", len(payload) + len(other) - 1)
    assert kept.keep(payload, [first])
    assert not kept.keep(payload, [first])  # the same bytes again: the first holds them
    assert not kept.keep(other, [second])  # past the bound: its bytes convert it
    kept.drop([payload, b"never held"])
    assert kept.held == 0
    assert kept.keep(other, [second])  # room again


def test_gated_commits_convert_from_their_held_spans_once_each_and_verify(tmp_path, monkeypatch):
    """Through the real path: the log's segments convert from the spans its process holds, every record once."""
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", "kept-spans-test-key-0123456789abcdef")
    dataset = tmp_path / "traces"
    telemetry = otel_replay.configure(dataset, set_global=False)
    try:
        assert telemetry.log is not None
        gate = ActionGate(ReferenceLedger(balance=100.0), dataset=dataset)
        for i in range(3):
            with audit("refund", snapshot=DependencySnapshot({"balance": 100}, version="v1")) as d:
                action = Action("refund", {"order": f"o-{i}", "note": "caf\u00e9 \U0001f600"}, cost=1.0)
                d.act(action)
                gate.commit(action, record_id=d.record_id)
            if i == 1:
                assert telemetry.force_flush()  # one segment converted here, the next at shutdown
        log = telemetry.log
    finally:
        telemetry.shutdown()
    # Every span the log took (an intent and a commit record a commit, and the decision the next intent carried)
    # converted from held spans.
    assert log._kept.rows == log.appended == 7 and log._kept.held == 0
    with otel_replay.open(dataset) as store:
        gates = store.rows("SELECT executed, count(*) AS n FROM gates GROUP BY executed ORDER BY executed")
        assert [(row["executed"], row["n"]) for row in gates] == [("committed", 3), ("intent", 3)]
        assert store.rows("SELECT span_id FROM spans GROUP BY span_id HAVING count(*) > 1") == []
        assert store.verify(None).problems == []


@pytest.mark.parametrize("fail", ["write", "fsync"])
def test_a_record_the_log_could_not_write_is_not_held(tmp_path, monkeypatch, fail):
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", "kept-spans-test-key-0123456789abcdef")
    telemetry = otel_replay.configure(tmp_path / "traces", set_global=False)
    try:
        log = telemetry.log
        assert log is not None
        [span] = _record_spans(_tracer(), 1)
        log.append([span])  # opens the log
        wal = log._wal

        def refuse(*args: Any, **kwargs: Any) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(wal, "_write_queued" if fail == "write" else "_sync", refuse)
        [other] = _record_spans(_tracer(), 2)[1:]
        with pytest.raises(OSError):
            log.append([other])
        assert log._kept.held == 1  # the first only
    finally:
        monkeypatch.undo()
        telemetry.shutdown()


def test_a_record_of_several_spans_converts_from_them_in_their_order(tmp_path):
    spans = _record_spans(_tracer())
    encoder = _RequestEncoder()
    records = [spans[:3], spans[3:]]  # one record of three spans, one of one
    payloads = [encoder.encode(group) for group in records]
    kept = KeptSpans()
    assert all(kept.keep(payload, group) for payload, group in zip(payloads, records, strict=True))
    segment = _segment(tmp_path / "log", payloads)
    assert kept.convert(segment, str(tmp_path / "held"), "seg") == 4
    assert convert_log_segment(segment, str(tmp_path / "bytes"), "seg") == 4
    held, from_bytes = _files(tmp_path / "held"), _files(tmp_path / "bytes")
    assert held.keys() == from_bytes.keys()
    assert all(table.equals(from_bytes[name][0]) for name, (table, _) in held.items())


def test_a_log_holding_records_past_its_seal_bound_seals_before_its_age_so_every_row_comes_from_held_spans(
    tmp_path, monkeypatch
):
    """At a rate where a segment's age would hold more than the bound, the segment is sealed early, whole."""
    from otel_replay.capture import write_ahead
    from otel_replay.capture.write_ahead import SpanLog

    spans = _record_spans(_tracer(), 8)
    size = len(_RequestEncoder().encode([spans[0]]))
    monkeypatch.setattr(write_ahead, "SEAL_HELD", 3 * size)  # three records' worth: sealed after the third
    log = SpanLog(str(tmp_path / "ds"), seal_seconds=3600.0)  # never by age within this test
    try:
        for span in spans[:3]:
            log.append([span])
        deadline = time.monotonic() + 60
        while log.converted_rows < 3 and time.monotonic() < deadline:  # the log's thread, woken by the third append
            time.sleep(0.01)
        assert log.converted_rows == 3 and log._kept.rows == 3  # sealed long before its age, from the held spans
        for span in spans[3:]:
            log.append([span])
    finally:
        log.close()
    assert log.converted_rows == 8 and log._kept.rows == 8 and log._kept.held == 0
    rows = pq.read_table(tmp_path / "ds" / "spans").num_rows
    assert rows == 8


def test_a_log_whose_sealed_segment_waits_to_convert_does_not_seal_early_again(tmp_path, monkeypatch):
    """Held records of a segment whose conversion failed count toward the bound, but do not cut more segments."""
    from otel_replay.capture import write_ahead
    from otel_replay.capture.write_ahead import SpanLog

    spans = _record_spans(_tracer(), 4)
    size = len(_RequestEncoder().encode([spans[0]]))
    monkeypatch.setattr(write_ahead, "SEAL_HELD", 2 * size)
    log = SpanLog(str(tmp_path / "ds"), seal_seconds=3600.0)
    try:
        log._stop.set()  # the log's thread stops at its first wake: the test decides when to seal
        log.append([spans[0]])
        assert not log._seal_early()  # one record: under the bound
        log.append([spans[1]])
        assert log._seal_early()  # two: the active segment is due
        assert log._wal.rotate()  # sealed, and (as after a failed conversion) not converted yet
        log.append([spans[2]])
        assert log._kept.held_bytes >= write_ahead.SEAL_HELD and not log._seal_early()
    finally:
        log.close()
    assert log.converted_rows == 3


def _sdk_spans() -> list[Any]:
    """Spans the SDK ended, as audit() and its children leave them: hostile values, events, links, an error status."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "k\u00e9pt", "n": 3}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("otel_replay", "1.2")
    from opentelemetry.trace import Link, Status, StatusCode, set_span_in_context

    with tracer.start_as_current_span(sc.SPAN_DECISION, attributes={sc.KIND: sc.KIND_DECISION, **HOSTILE}) as root:
        root.add_event("read", {"order": "o-1", "n": 2, "list": [1, 2]}, timestamp=START_NS + 5)
        child = tracer.start_span("model", context=set_span_in_context(root), links=[Link(PARENT, {"why": "x"})],
                                  attributes={"tuple": ("a", "b\u00e9"), "floats": (1.5, -0.0), "bools": (True,)})
        try:
            raise ValueError("caf\u00e9 \x00 boom")
        except ValueError as exc:
            child.record_exception(exc, timestamp=START_NS + 7)
            child.set_status(Status(StatusCode.ERROR, "boom \u202e"))
        child.end()
    provider.get_tracer("another scope").start_span("root elsewhere", context=None).end()
    return list(exporter.get_finished_spans())


def test_spans_the_sdk_ended_convert_from_held_spans_to_the_files_their_bytes_give(tmp_path):
    """Decisions a gate writes ahead with its record are SDK spans: held too, and converted to the same files."""
    linked, *spans = _sdk_spans()  # the child, which has a link, ends first
    assert linked.links and not any(span.links for span in spans)
    encoder = _RequestEncoder()
    assert not KeptSpans().keep(encoder.encode([linked]), [linked])  # a link's trace state: left to the bytes
    records = [spans[:1], spans[1:]]  # the decision, and a span of another scope
    payloads = [encoder.encode(group) for group in records]
    kept = KeptSpans()
    assert all(kept.keep(payload, group) for payload, group in zip(payloads, records, strict=True))
    segment = _segment(tmp_path / "log", payloads)
    assert kept.convert(segment, str(tmp_path / "held"), "wal-capture-1-seg") == len(spans)
    assert kept.rows == len(spans)
    assert convert_log_segment(segment, str(tmp_path / "bytes"), "wal-capture-1-seg") == len(spans)
    held, from_bytes = _files(tmp_path / "held"), _files(tmp_path / "bytes")
    assert held and held.keys() == from_bytes.keys()
    for name, (table, footer) in held.items():
        assert table.equals(from_bytes[name][0]), name
        assert footer == from_bytes[name][1], name
