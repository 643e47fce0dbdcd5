"""A conversion that fails on I/O (a full disk, a path it cannot write) is retried, never quarantined."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from otel_replay.server import Receiver
from otel_replay.server import server as server_module

from .conftest import make_spans, parquet_rows


def _wait(condition: Callable[[], bool], deadline: float = 60.0) -> None:
    end = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.05)


class _FastClock:
    """The receiver module's ``time`` with its monotonic clock running ``speed`` times fast.

    The receiver reads that clock only to schedule retries, so its back-off (1 s, 2 s, 4 s, ...) passes in a tenth
    of the wall; the converter's loop, the WAL's seals and everything else keep real time.
    """

    def __init__(self, speed: float) -> None:
        self._speed = speed
        self._start = time.monotonic()

    def monotonic(self) -> float:
        return self._start + (time.monotonic() - self._start) * self._speed

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def test_io_failures_back_off_without_quarantine_and_nothing_is_lost(
    make_receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(server_module, "time", _FastClock(10.0))  # 7 s of back-off in 0.7 s
    dataset = tmp_path / "ds"
    dataset.mkdir()
    (dataset / "spans").write_text("a file where the spans directory goes: every write fails (OSError)")
    receiver: Receiver = make_receiver(dataset, grpc=None, http=None, flush_seconds=0.1)
    with caplog.at_level(logging.ERROR, logger="otel_replay.server"):
        receiver.accept(encode_spans(make_spans(10)))
        metrics = receiver.metrics
        _wait(lambda: metrics.snapshot()["convert_errors"] >= 3)  # the third used to quarantine it
        assert metrics.snapshot()["segments_quarantined"] == 0 and len(receiver.wal.sealed()) == 1
        (dataset / "spans").unlink()  # the operator frees the path
        # The segment is let go just after its spans are written: wait for both, not the count alone.
        _wait(lambda: metrics.snapshot()["spans_written"] == 20 and receiver.wal.sealed() == [])
    assert metrics.snapshot()["segments_quarantined"] == 0
    assert len(parquet_rows(dataset)) == 20
    # Each failure waited twice as long as the one before before the next try (in the receiver's clock).
    delays = [re.search(r"retrying in (\d+)s", r.getMessage()) for r in caplog.records]
    assert [int(d.group(1)) for d in delays if d][:3] == [1, 2, 4]
