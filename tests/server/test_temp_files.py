"""A failed Parquet write leaves no temp file; a stale one (a crash's) is removed by compaction's cleanup."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pytest

from otel_replay.exporters.rows import spans_to_table
from otel_replay.exporters.writer import temp_path, write_atomic, write_bytes_atomic, write_partitions
from otel_replay.storage import compact

from .conftest import make_spans


def test_a_failed_write_removes_its_temp_file(tmp_path: Path) -> None:
    # Parquet has no month-day-nano interval: pyarrow fails after the temp file is open (as a full disk would).
    table = pa.table({"x": pa.array([(1, 2, 3)], type=pa.month_day_nano_interval())})
    with pytest.raises(pa.ArrowException):
        write_atomic(table, tmp_path / "out.parquet")
    with pytest.raises(TypeError):
        write_bytes_atomic("not bytes", tmp_path / "out.bin")  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == []


def test_compaction_removes_writer_temp_files_older_than_its_grace_only(tmp_path: Path) -> None:
    dataset = tmp_path / "ds"
    (path,) = write_partitions(spans_to_table(make_spans(5)), dataset / "spans", lambda date: "wal-x-00000.parquet")
    assert isinstance(path, Path)
    stale, fresh = temp_path(path), temp_path(path.with_name("wal-y-00000.parquet"))
    for leftover in (stale, fresh):
        leftover.write_bytes(b"PAR1 partial")
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))
    report = compact(dataset, grace_seconds=60)
    assert not stale.exists() and fresh.exists()  # a fresh one may belong to a write in flight
    assert report.partitions[0].leftovers_deleted == 1
