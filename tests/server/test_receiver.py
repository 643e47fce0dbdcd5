"""OTLP/gRPC and OTLP/HTTP with the SDK's own exporters: exactly-once, same rows as in-process."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult

import otel_replay
from otel_replay import AuditLog, DecisionTracer, ReplayBuilder, correlation, load_signing_key
from otel_replay.server import Receiver

from .conftest import expected_rows, make_spans, parquet_rows, rows, sdk_exporter


@pytest.mark.parametrize("transport", ["grpc", "http", "http-gzip"])
def test_every_span_arrives_exactly_once_intact(receiver: Receiver, transport: str) -> None:
    spans = make_spans(150)  # 300 spans: roots with attributes, events, links; children
    exporter = sdk_exporter(receiver, transport)
    for start in range(0, len(spans), 64):
        assert exporter.export(spans[start : start + 64]) == SpanExportResult.SUCCESS
    exporter.shutdown()
    receiver.stop()  # drains and converts the whole WAL

    got = parquet_rows(receiver.config.dataset)
    assert len(got) == len(spans) == len({(r["trace_id"], r["span_id"]) for r in got})
    assert got == expected_rows(spans)  # identical to the in-process conversion
    root = next(r for r in got if r["name"] == "root" and json.loads(r["attributes"])["i"] == 7)
    assert json.loads(root["attributes"]) == {"i": 7, "s": "v7", "f": 3.5, "b": False, "arr": [1, 2, 7]}
    assert [e["name"] for e in root["events"]] == ["evt"]
    assert json.loads(root["events"][0]["attributes"]) == {"e.i": 7, "e.s": "x"}
    assert len(root["links"]) == 1 and json.loads(root["links"][0]["attributes"]) == {"link.n": 7}
    assert root["service_name"] == "svc" and root["scope_name"] == "tests.server"
    m = receiver.metrics.snapshot()
    assert m["spans_received"] == m["spans_accepted"] == m["spans_written"] == len(spans)
    assert m["spans_rejected"] == 0


def _workload() -> list[str]:
    log, tracer = AuditLog(), DecisionTracer()
    ids = []
    for n in range(3):
        with correlation(f"trade-{n}") as cid:
            log.append("signal_received", source_agent="router", payload={"n": n})
            decision = tracer.decision("sizer", "position_sizing", f"size {n}", 0.5 + n / 10, {"n": n})
            log.append("order_sent", source_agent="executor", target_agent="broker")
            ids.append(cid)
        tracer.record_outcome(decision, n % 2 == 0)
    return ids


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_chains_from_received_spans_equal_in_process_chains(make_receiver, tmp_path, transport) -> None:
    receiver = make_receiver()
    local = tmp_path / "in-process"
    telemetry = otel_replay.configure(local, service_name="agents", set_global=False)
    telemetry.provider.add_span_processor(BatchSpanProcessor(sdk_exporter(receiver, transport)))
    try:
        ids = _workload()
    finally:
        telemetry.shutdown()  # flushes both exporters: Parquet in-process and OTLP to the receiver
    receiver.stop()

    assert parquet_rows(receiver.config.dataset) == parquet_rows(local)
    with otel_replay.open(local) as mine, otel_replay.open(receiver.config.dataset) as theirs:
        for cid in ids:
            expected = ReplayBuilder(mine).build_trade_chain(cid)
            assert len(expected.traces) == 1 and len(expected.audit_entries) == 2
            assert ReplayBuilder(theirs).build_trade_chain(cid) == expected
        assert theirs.verify(load_signing_key()).ok
    assert rows(receiver.config.dataset, "SELECT count(*) AS n FROM decisions")[0]["n"] == 3


def test_an_idle_converter_takes_a_full_enough_segment_before_the_flush_interval(make_receiver, monkeypatch) -> None:
    """Conversion keeps up with acknowledgement: with a long flush interval, spans still land while serving."""
    import time

    from otel_replay.server import server

    monkeypatch.setattr(server, "EARLY_SEAL_BYTES", 1)  # any record is "a chunk's worth"
    receiver = make_receiver(flush_seconds=3600.0)
    spans = make_spans(40)
    exporter = sdk_exporter(receiver, "grpc")
    assert exporter.export(spans) == SpanExportResult.SUCCESS
    deadline = time.monotonic() + 30
    while receiver.metrics.snapshot()["spans_written"] < len(spans) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert receiver.metrics.snapshot()["spans_written"] == len(spans)  # long before the hour is up
    assert parquet_rows(receiver.config.dataset) == expected_rows(spans)
    monkeypatch.setattr(server, "EARLY_SEAL_BYTES", 1 << 40)  # a quiet receiver: sealed by age only
    assert exporter.export(spans[:4]) == SpanExportResult.SUCCESS
    time.sleep(1.0)
    assert receiver.metrics.snapshot()["spans_written"] == len(spans) and receiver.wal.active_records == 1
    exporter.shutdown()
    receiver.stop()
    assert len(parquet_rows(receiver.config.dataset)) == len(spans) + 4
