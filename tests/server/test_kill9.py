"""``kill -9`` of a running ``otel-replay serve``: nothing acknowledged is lost, nothing is duplicated."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from .._support import ForkedProcess, Zygote
from .conftest import make_spans, parquet_rows, serve_forked, stop_forked

_READY = re.compile(r"grpc 127\.0\.0\.1:(\d+) http 127\.0\.0\.1:(\d+)")


def start_server(
    zygote: Zygote, dataset: Path, flush_seconds: float = 0.3, convert_workers: int = 1
) -> tuple[ForkedProcess, int]:
    args = ["--dataset", str(dataset), "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"]
    args += ["--convert-workers", str(convert_workers)]
    proc = serve_forked(zygote, *args, "--flush-seconds", str(flush_seconds))
    line = proc.stdout.readline()
    match = _READY.search(line)
    if match is None:
        stop_forked(proc, signal.SIGKILL)
        raise AssertionError(f"server did not start: {line!r}")
    return proc, int(match.group(1))


def wait_for_rows(dataset: Path, count: int, deadline: float = 60.0) -> list[dict]:
    end = time.monotonic() + deadline
    while True:
        got = parquet_rows(dataset)
        if len(got) >= count or time.monotonic() > end:
            return got
        time.sleep(0.2)


@pytest.mark.slow
def test_sigkill_loses_nothing_acknowledged_and_duplicates_nothing(zygote: Zygote, tmp_path: Path) -> None:
    dataset = tmp_path / "ds"
    spans = make_spans(600)  # 1200 spans
    batches = [spans[i : i + 40] for i in range(0, len(spans), 40)]
    # Everything acknowledged stays in the WAL: this server converts nothing, so it starts no converter process
    # (an interpreter and its imports, killed unused); the restarted one converts in one, as serve does by default.
    proc, port = start_server(zygote, dataset, flush_seconds=3600, convert_workers=0)
    acked: list[int] = []
    stop = threading.Event()

    def send() -> None:
        exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True, timeout=2)
        for n, batch in enumerate(batches):
            if stop.is_set() or exporter.export(batch) != SpanExportResult.SUCCESS:
                break
            acked.append(n)
        exporter.shutdown()

    sender = threading.Thread(target=send)
    try:
        sender.start()
        while len(acked) < len(batches) // 2 and sender.is_alive():
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)  # mid-stream: some batches acked, one maybe in flight
        proc.wait()
        stop.set()
        sender.join()
    finally:
        stop_forked(proc, signal.SIGKILL)
    assert len(batches) // 2 <= len(acked) < len(batches)
    assert parquet_rows(dataset) == [] and list((dataset / "_wal" / "default").glob("*.wal"))

    restarted, _ = start_server(zygote, dataset)  # replays the WAL into Parquet
    try:
        must = {(f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}") for n in acked for s in batches[n]}
        got = wait_for_rows(dataset, len(must))
        keys = [(r["trace_id"], r["span_id"]) for r in got]
        assert len(keys) == len(set(keys)), "a span was stored twice"
        assert must <= set(keys), f"{len(must - set(keys))} acknowledged spans lost"
    finally:
        code = stop_forked(restarted, signal.SIGTERM)  # graceful: drain, flush, exit 0
    assert code == 0
    final = parquet_rows(dataset)
    assert len(final) == len(got)
    assert not list((dataset / "_wal" / "default").glob("*.wal"))


def _post_json(port: int, body: dict) -> int:
    import http.client
    import json

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/v1/traces", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


@pytest.mark.slow
def test_sigkill_keeps_an_acknowledged_request_that_ends_in_eight_zero_bytes(zygote: Zygote, tmp_path: Path) -> None:
    """The seal mark is 8 zero bytes: the active segment's last record may end so too, and must not be cut."""
    dataset = tmp_path / "ds"
    proc = serve_forked(
        zygote, "--dataset", str(dataset), "--grpc", "off", "--http", "127.0.0.1:0", "--flush-seconds", "3600",
        "--convert-workers", "0",  # it converts nothing: no converter process to start
    )
    acked = []
    try:
        match = re.search(r"http 127\.0\.0\.1:(\d+)", proc.stdout.readline())
        assert match is not None
        port = int(match.group(1))
        for i, cost in enumerate([0.25, 0.5, 0.0]):  # the last span's last attribute: doubleValue 0 -> 8 zero bytes
            span = {
                "traceId": f"{i + 1:032x}",
                "spanId": f"{i + 1:016x}",
                "name": f"call-{i}",
                "startTimeUnixNano": "1700000000000000000",
                "endTimeUnixNano": "1700000001000000000",
                "attributes": [{"key": "llm.cost_usd", "value": {"doubleValue": cost}}],
            }
            if _post_json(port, {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}) == 200:
                acked.append(f"{i + 1:032x}")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        stop_forked(proc, signal.SIGKILL)
    assert len(acked) == 3
    (active,) = (dataset / "_wal" / "default").glob("*.wal")
    assert active.read_bytes().endswith(bytes(8))  # the unsealed segment looks like a sealed one by its end

    restarted, _ = start_server(zygote, dataset)
    try:
        got = wait_for_rows(dataset, 3)
    finally:
        assert stop_forked(restarted, signal.SIGTERM) == 0
    assert sorted(r["trace_id"] for r in got) == acked
    assert not (dataset / "_wal" / "default" / "quarantine").exists()
