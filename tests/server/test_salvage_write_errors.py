"""A write that fails while a segment is salvaged escapes (salvage is retried) and no buffered row is lost."""

from __future__ import annotations

import errno
import functools
import struct
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_replay.exporters.writer import write_partitions
from otel_replay.storage import convert
from otel_replay.storage.convert import ChunkWriter, salvage_segment

from .conftest import make_spans, parquet_rows, parquet_span_ids


def _sealed_segment(path: Path, records: list[bytes]) -> None:
    with open(path, "wb") as handle:
        for body in records:
            handle.write(struct.pack("<II", len(body), zlib.crc32(body)) + body)
        handle.write(struct.pack("<II", 0, zlib.crc32(b"")))  # the seal mark


def test_a_chunk_that_fails_to_write_keeps_its_rows_for_the_next_try(tmp_path: Path) -> None:
    dataset = tmp_path / "ds"
    dataset.mkdir()
    (dataset / "spans").write_text("a file where the spans directory goes: the write fails")
    writer = ChunkWriter(dataset, "seg-a")
    writer.add_payload(encode_spans(make_spans(5)).SerializeToString())
    with pytest.raises(OSError):
        writer.flush()
    (dataset / "spans").unlink()  # the operator frees the path
    writer.flush()
    assert writer.rows_written == 10 and len(parquet_rows(dataset)) == 10  # make_spans: two spans per count


def _request(spans: int, seed: int) -> bytes:
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    scope_spans = resource_spans.scope_spans.add()
    for n in range(spans):
        span = scope_spans.spans.add()
        span.trace_id = seed.to_bytes(4, "big") * 3 + (n + 1).to_bytes(4, "big")
        span.span_id = seed.to_bytes(4, "big") + (n + 1).to_bytes(4, "big")
        span.name = "s"
        span.start_time_unix_nano = 1_700_000_000_000_000_000 + n
        span.end_time_unix_nano = span.start_time_unix_nano + 1_000
    return request.SerializeToString()


def test_salvage_lets_a_failed_write_escape_instead_of_dropping_earlier_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Chunks of 10,000 rows instead of 100,000: the first fills (and its write fails) after two runs of records
    # (5,000 spans each), with a third still to come, as 105,000 spans did at the default size.
    monkeypatch.setattr(convert, "ChunkWriter", functools.partial(ChunkWriter, chunk_rows=10_000))
    writes: list[int] = []

    def full_disk_once(table: pa.Table, *args: Any, **kwargs: Any) -> list[Any]:
        # A transient ENOSPC: the first chunk's write fails, every later write succeeds. A path blocked until the
        # salvage ended did not show the fault: its last write failed too, so the bad salvage raised anyway.
        writes.append(table.num_rows)
        if len(writes) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_partitions(table, *args, **kwargs)

    monkeypatch.setattr(convert, "write_partitions", full_disk_once)
    dataset = tmp_path / "ds"
    dataset.mkdir()
    segment = tmp_path / "00000000000000000001-abcdef01.wal"
    _sealed_segment(segment, [_request(1_000, seed) for seed in range(1, 12)])  # 11k spans: a chunk fills mid-way
    with pytest.raises(OSError):
        salvage_segment(str(segment), str(dataset), "seg-x")  # not a "salvaged" segment missing a chunk
    assert writes == [10_000]  # the failed write was the full chunk's, mid-way
    report = salvage_segment(str(segment), str(dataset), "seg-x")  # retried: every span lands
    assert report.spans_dropped == 0 and report.records_dropped == 0
    ids = parquet_span_ids(dataset)
    assert report.rows == len(ids) == len(set(ids)) == 11_000
