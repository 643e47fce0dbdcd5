"""Distinct start dates per WAL segment are bounded across requests (each date is a Parquet file per segment)."""

from __future__ import annotations

import time

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_replay.errors import Overloaded
from otel_replay.server import Receiver
from otel_replay.server.server import MAX_DATES_PER_SEGMENT
from otel_replay.storage.convert import MAX_DATES_PER_REQUEST

from .conftest import make_spans, parquet_rows
from .test_http_errors import post

_DAY = 86_400 * 1_000_000_000


def _on_days(first_day: int, count: int) -> ExportTraceServiceRequest:
    """A request of ``count`` spans, each on its own day from ``first_day`` (days since the epoch)."""
    request = encode_spans(make_spans((count + 1) // 2)[:count])
    for n, span in enumerate(request.resource_spans[0].scope_spans[0].spans):
        span.start_time_unix_nano = (first_day + n) * _DAY
        span.end_time_unix_nano = (first_day + n) * _DAY + 1
        span.ClearField("events")
    return request


def test_requests_past_the_segments_date_budget_are_shed_until_it_is_sealed(make_receiver) -> None:
    receiver: Receiver = make_receiver(grpc=None, flush_seconds=3600)  # one segment until sealed below
    per = MAX_DATES_PER_REQUEST
    for n in range(MAX_DATES_PER_SEGMENT // per):  # fills the budget exactly, one request's worth at a time
        assert receiver.accept(_on_days(10_000 + n * per, per)) == (0, "")
    status, headers, body = post(receiver, _on_days(20_000, 1).SerializeToString())
    assert status == 429 and "Retry-After" in headers
    assert f"more than {MAX_DATES_PER_SEGMENT} distinct start dates" in body.decode(errors="replace")
    assert receiver.accept(_on_days(10_000, per)) == (0, "")  # dates the segment holds already: taken
    today = time.time_ns() // _DAY
    assert receiver.accept(_on_days(today - 1, 3)) == (0, "")  # live traffic is never shed for its dates
    receiver.wal.rotate()  # sealed: a new segment, a new budget
    assert receiver.accept(_on_days(20_000, 1)) == (0, "")
    with pytest.raises(Overloaded):  # one request alone may bring MAX_DATES_PER_REQUEST; the next may not exceed
        for n in range(MAX_DATES_PER_SEGMENT // per + 1):
            receiver.accept(_on_days(30_000 + n * per, per))
    receiver.stop()
    dates = {row["start_time"] // _DAY for row in parquet_rows(receiver.config.dataset)}
    assert len(dates - {today - 1, today, today + 1}) <= 2 * MAX_DATES_PER_SEGMENT
