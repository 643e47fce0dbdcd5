"""A conversion that fails on I/O (a full disk, a path it cannot write) is retried, never quarantined."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from otel_replay.server import Receiver

from .conftest import make_spans, parquet_rows


def _wait(condition: Callable[[], bool], deadline: float = 60.0) -> None:
    end = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.1)


def test_io_failures_back_off_without_quarantine_and_nothing_is_lost(make_receiver, tmp_path: Path) -> None:
    dataset = tmp_path / "ds"
    dataset.mkdir()
    (dataset / "spans").write_text("a file where the spans directory goes: every write fails (OSError)")
    receiver: Receiver = make_receiver(dataset, grpc=None, http=None, flush_seconds=0.1)
    receiver.accept(encode_spans(make_spans(10)))
    metrics = receiver.metrics
    _wait(lambda: metrics.snapshot()["convert_errors"] >= 3)  # the third used to quarantine it
    assert metrics.snapshot()["segments_quarantined"] == 0 and len(receiver.wal.sealed()) == 1
    (dataset / "spans").unlink()  # the operator frees the path
    # The segment is let go just after its spans are written: wait for both, not the count alone.
    _wait(lambda: metrics.snapshot()["spans_written"] == 20 and receiver.wal.sealed() == [])
    assert metrics.snapshot()["segments_quarantined"] == 0
    assert len(parquet_rows(dataset)) == 20
