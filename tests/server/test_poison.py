"""Poison spans and poison WAL segments: refused per span at admission; a segment that cannot be converted is
quarantined and salvaged span by span, never blocks the segments behind it, and SIGTERM/restart finish cleanly."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import struct
import time
import zlib
from pathlib import Path

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from otel_replay.server import Receiver

from .._support import ForkedProcess, Zygote
from .conftest import make_spans, parquet_rows, serve_forked, stop_forked

POISON = 2**64 - 1
METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_READY = re.compile(r"grpc 127\.0\.0\.1:(\d+) http 127\.0\.0\.1:(\d+)")


def _keys(request: ExportTraceServiceRequest) -> set[tuple[str, str]]:
    return {
        (span.trace_id.hex(), span.span_id.hex())
        for rs in request.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    }


def _with_poison(count: int, field: str = "start_time_unix_nano") -> tuple[ExportTraceServiceRequest, tuple]:
    """A request of ``2 * count`` spans, one of which (it has an event) carries an unstorable time."""
    request = encode_spans(make_spans(count))
    span = next(s for s in request.resource_spans[0].scope_spans[0].spans if s.events)
    if field == "event":
        span.events[0].time_unix_nano = POISON
    else:
        setattr(span, field, POISON)
    return request, (span.trace_id.hex(), span.span_id.hex())


def _http_post(port: int, body: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _http_get(port: int, path: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def _grpc_export(port: int, body: bytes) -> ExportTraceServiceResponse:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(METHOD, response_deserializer=ExportTraceServiceResponse.FromString)
        return call(body, timeout=10)


@pytest.mark.parametrize("field", ["start_time_unix_nano", "end_time_unix_nano", "event"])
def test_out_of_range_time_is_refused_per_span_over_http_and_grpc(receiver: Receiver, field: str) -> None:
    assert receiver.http_address is not None and receiver.grpc_address is not None
    via_http, bad_http = _with_poison(3, field)
    via_grpc, bad_grpc = _with_poison(2, field)
    status, raw = _http_post(receiver.http_address[1], via_http.SerializeToString())
    assert status == 200
    partial = ExportTraceServiceResponse.FromString(raw).partial_success
    assert partial.rejected_spans == 1 and "out of range" in partial.error_message
    assert bad_http[1] in partial.error_message  # names the span
    partial = _grpc_export(receiver.grpc_address[1], via_grpc.SerializeToString()).partial_success
    assert partial.rejected_spans == 1 and "out of range" in partial.error_message
    assert "otel_replay_spans_rejected_bad_time_total 2" in _http_get(receiver.http_address[1], "/metrics")
    receiver.stop()
    stored = {(r["trace_id"], r["span_id"]) for r in parquet_rows(receiver.config.dataset)}
    assert stored == (_keys(via_http) | _keys(via_grpc)) - {bad_http, bad_grpc}  # every good span lands
    assert len(stored) == 8


def _wal_record(payload: bytes) -> bytes:
    return struct.pack("<II", len(payload), zlib.crc32(payload)) + payload


def _start(zygote: Zygote, dataset: Path, log: Path) -> tuple[ForkedProcess, int, int]:
    args = ["--dataset", str(dataset), "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--flush-seconds", "0.2"]
    proc = serve_forked(zygote, *args, stderr_to=log)
    line = proc.stdout.readline()
    match = _READY.search(line)
    if match is None:
        stop_forked(proc, signal.SIGKILL)
        raise AssertionError(f"server did not start: {line!r} {log.read_text()}")
    return proc, int(match.group(1)), int(match.group(2))


def _wait_rows(dataset: Path, count: int) -> set[tuple[str, str]]:
    end = time.monotonic() + 60
    while True:
        got = {(r["trace_id"], r["span_id"]) for r in parquet_rows(dataset)}
        if len(got) >= count or time.monotonic() > end:
            return got
        time.sleep(0.2)


def _wait_metrics(port: int, text: str) -> str:
    """The metrics page once it shows ``text``: a salvage's rows are in Parquet before its report and counters."""
    end = time.monotonic() + 60
    while True:
        metrics = _http_get(port, "/metrics")
        if text in metrics or time.monotonic() > end:
            return metrics
        time.sleep(0.1)


@pytest.mark.slow
def test_poison_segment_is_quarantined_salvaged_and_never_blocks(zygote: Zygote, tmp_path: Path) -> None:
    dataset = tmp_path / "ds"
    wal = dataset / "_wal" / "default"
    wal.mkdir(parents=True)
    # A segment written before admission refused bad times (or by anything that bypassed it): a good request,
    # one with a poison span, a record that is not a request at all, and another good request.
    good_a = encode_spans(make_spans(3))
    poisoned, poison_key = _with_poison(2)
    good_b = encode_spans(make_spans(4))
    records = [good_a.SerializeToString(), poisoned.SerializeToString(), b"\xff\xff\xff\x0fnot protobuf"]
    records.append(good_b.SerializeToString())
    (wal / "00000000000000000001-poison00.wal").write_bytes(b"".join(_wal_record(r) for r in records))
    behind = encode_spans(make_spans(2))  # a later segment: it must not wait behind the poison
    (wal / "00000000000000000002-behind00.wal").write_bytes(_wal_record(behind.SerializeToString()))
    salvageable = _keys(good_a) | (_keys(poisoned) - {poison_key}) | _keys(good_b)

    log = tmp_path / "serve.log"
    proc, grpc_port, http_port = _start(zygote, dataset, log)
    try:
        live_http, live_grpc = encode_spans(make_spans(2)), encode_spans(make_spans(3))
        assert _http_post(http_port, live_http.SerializeToString())[0] == 200
        assert _grpc_export(grpc_port, live_grpc.SerializeToString()) == ExportTraceServiceResponse()
        expected = salvageable | _keys(behind) | _keys(live_http) | _keys(live_grpc)
        got = _wait_rows(dataset, len(expected))
        assert got == expected
        metrics = _wait_metrics(http_port, 'state="salvaged"')
    finally:
        code = stop_forked(proc, signal.SIGTERM)
    assert code == 0
    quarantined = wal / "quarantine" / "00000000000000000001-poison00.wal"
    assert f'otel_replay_quarantined_segment{{path="{quarantined}",state="salvaged"}} 1' in metrics
    assert "otel_replay_segments_quarantined_total 1" in metrics
    assert "otel_replay_quarantine_spans_dropped_total 1" in metrics
    assert "otel_replay_quarantine_records_dropped_total 1" in metrics
    assert "00000000000000000001-poison00.wal" in log.read_text() and "Traceback" not in log.read_text()
    report = json.loads(quarantined.with_name(quarantined.stem + ".report.json").read_text())
    assert report["spans_written"] == len(salvageable) and report["spans_dropped"] == 1
    assert report["records_dropped"] == 1 and any("record 2" in reason for reason in report["reasons"])
    assert not list(wal.glob("*.wal"))  # nothing left blocking the queue

    proc, _, http_port = _start(zygote, dataset, log)  # a restart starts and stops cleanly, adding nothing
    try:
        assert 'state="salvaged"' in _http_get(http_port, "/metrics")
    finally:
        assert stop_forked(proc, signal.SIGTERM) == 0
    rows = parquet_rows(dataset)
    assert len(rows) == len(expected) == len({(r["trace_id"], r["span_id"]) for r in rows})
    assert os.path.exists(quarantined)


def test_admission_and_the_row_builder_agree_on_the_last_storable_time() -> None:
    """2**63-1 was acknowledged at admission, then refused when rows were built: one check now decides both."""
    from otel_replay.exporters.rows import TIME_LIMIT_NS, request_to_table
    from otel_replay.storage.convert import admit_spans

    request = encode_spans(make_spans(3))
    total = len(_keys(request))
    spans = request.resource_spans[0].scope_spans[0].spans
    spans[0].start_time_unix_nano = TIME_LIMIT_NS  # 2**63-1: not storable
    spans[1].start_time_unix_nano = TIME_LIMIT_NS - 1  # the last storable time
    spans[1].end_time_unix_nano = TIME_LIMIT_NS - 1
    admission = admit_spans(request)
    assert (admission.accepted, admission.bad_times) == (total - 1, 1)
    assert f"start_time_unix_nano {TIME_LIMIT_NS} is out of range" in admission.message
    rejected: list[str] = []
    assert request_to_table(request, rejected).num_rows == total - 1 and rejected == []
