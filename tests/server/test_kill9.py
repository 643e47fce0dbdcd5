"""``kill -9`` of a running ``otel-replay serve``: nothing acknowledged is lost, nothing is duplicated."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from .conftest import make_spans, parquet_rows, stop_process

_READY = re.compile(r"grpc 127\.0\.0\.1:(\d+) http 127\.0\.0\.1:(\d+)")


def start_server(dataset: Path, flush_seconds: float = 0.3) -> tuple[subprocess.Popen[str], int]:
    command = [sys.executable, "-m", "otel_replay", "serve", "--dataset", str(dataset)]
    command += ["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--flush-seconds", str(flush_seconds)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = _READY.search(line)
    if match is None:
        stop_process(proc, signal.SIGKILL)
        raise AssertionError(f"server did not start: {line!r}")
    return proc, int(match.group(1))


def wait_for_rows(dataset: Path, count: int, deadline: float = 60.0) -> list[dict]:
    end = time.monotonic() + deadline
    while True:
        got = parquet_rows(dataset)
        if len(got) >= count or time.monotonic() > end:
            return got
        time.sleep(0.2)


def test_sigkill_loses_nothing_acknowledged_and_duplicates_nothing(tmp_path: Path) -> None:
    dataset = tmp_path / "ds"
    spans = make_spans(600)  # 1200 spans
    batches = [spans[i : i + 40] for i in range(0, len(spans), 40)]
    proc, port = start_server(dataset, flush_seconds=3600)  # everything acknowledged stays in the WAL
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
        stop_process(proc, signal.SIGKILL)
    assert len(batches) // 2 <= len(acked) < len(batches)
    assert parquet_rows(dataset) == [] and list((dataset / "_wal" / "default").glob("*.wal"))

    restarted, _ = start_server(dataset)  # replays the WAL into Parquet
    try:
        must = {(f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}") for n in acked for s in batches[n]}
        got = wait_for_rows(dataset, len(must))
        keys = [(r["trace_id"], r["span_id"]) for r in got]
        assert len(keys) == len(set(keys)), "a span was stored twice"
        assert must <= set(keys), f"{len(must - set(keys))} acknowledged spans lost"
    finally:
        code = stop_process(restarted, signal.SIGTERM)  # graceful: drain, flush, exit 0
    assert code == 0
    final = parquet_rows(dataset)
    assert len(final) == len(got)
    assert not list((dataset / "_wal" / "default").glob("*.wal"))
