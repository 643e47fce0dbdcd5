"""A batch of many small local files is read in one DuckDB scan, which gives exactly what the file-by-file read does."""

from __future__ import annotations

import datetime as dt
import importlib
import math
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otel_replay.errors import CorruptFileError
from otel_replay.storage import compact, live_files
from otel_replay.storage.compact_duck import DUCK_MIN_FILES, duck_read
from otel_replay.storage.manifest import is_compacted_name, partition_dirs

from .conftest import ReadWatch, count_rows

steps = importlib.import_module("otel_replay.storage.compact_steps")


def _small_files(make_dataset: Any, files: int = 40) -> tuple[Path, dict[str, Any], list[str]]:
    path, figures = make_dataset(spans=3 * files, ids=files, rows_per_file=3, duplicates=0.02)
    return path, figures, sorted(str(p) for p in (path / "spans").rglob("*.parquet"))


def _hostile(schema: pa.Schema, like: pa.Table) -> pa.Table:
    """Rows of ``like``'s schema holding values a decoder may get wrong: bounds, NaN, NUL, empty and null lists."""
    rows = [dict(like.slice(0, 1).to_pylist()[0]) for _ in range(6)]
    utc = dt.UTC
    rows[0] |= {"events": [], "links": None, "decision_confidence": math.nan, "attributes": "nul\x00 é 😀"}
    rows[1] |= {"events": None, "links": [], "decision_confidence": -0.0, "outcome_correct": None}
    rows[2] |= {"events": [{"time": None, "name": None, "attributes": None}], "status_message": ""}
    rows[3] |= {"start_time": dt.datetime(1677, 9, 22, tzinfo=utc), "end_time": dt.datetime(2262, 4, 11, tzinfo=utc)}
    rows[4] |= {"decision_confidence": math.inf, "dropped_attributes_count": -(2**31), "duration_ns": 2**63 - 1}
    rows[5] |= {"parent_span_id": None, "correlation_id": None, "resource_attributes": "{" * 500}
    for i, row in enumerate(rows):
        row["span_id"] = f"hostile{i}"
    return pa.Table.from_pylist(rows, schema=schema)


def test_the_scan_gives_the_rows_and_schema_of_the_file_by_file_read(make_dataset) -> None:
    _, _, files = _small_files(make_dataset)
    first = pq.read_table(files[0])
    for i in (5, 17, 30):  # hostile rows among ordinary ones, written the way the writer writes a file
        pq.write_table(_hostile(first.schema, first), files[i], compression="zstd")
    expected = steps._load(files, None, steps.Workers(1))
    rows = sum(pq.read_metadata(f).num_rows for f in files)
    for threads in (1, 2):
        scanned = duck_read(files, rows, threads)
        assert scanned is not None
        assert scanned.schema.equals(expected.schema, check_metadata=True)
        assert scanned.num_rows == expected.num_rows == rows
        assert repr(scanned.to_pylist()) == repr(expected.to_pylist())  # in order; NaN and -0.0 compared by repr
    nan = [v for v in scanned.column("decision_confidence").to_pylist() if v is not None and math.isnan(v)]
    assert len(nan) == 3


def test_an_answer_that_is_not_the_batch_is_refused(make_dataset) -> None:
    _, _, files = _small_files(make_dataset)
    rows = sum(pq.read_metadata(f).num_rows for f in files)
    assert duck_read(files, rows + 1, 1) is None  # a row count other than the footers'
    assert duck_read(files[: DUCK_MIN_FILES - 1], None, 1) is None  # too few files to pay for the scan
    Path(files[9]).write_bytes(b"PAR1" + b"\x00" * 64 + b"PAR1")  # a file it cannot read
    assert duck_read(files, None, 1) is None


def test_a_healthy_day_is_compacted_without_a_file_by_file_read(make_dataset, monkeypatch) -> None:
    path, figures, files = _small_files(make_dataset, files=120)
    watch = ReadWatch(monkeypatch)
    report = compact(path, grace_seconds=0)
    per_partition = {p.name: sum(1 for f in files if p.name in f) for p in partition_dirs(path)}
    assert max(per_partition.values()) >= DUCK_MIN_FILES
    read_alone = {Path(f).parent.name for f in watch.read}
    assert all(per_partition[name] < DUCK_MIN_FILES for name in read_alone)  # the rest came from one scan each
    assert report.duplicates_removed == figures["duplicates_written"]
    after = live_files(path)
    assert all(is_compacted_name(Path(f).name) for f in after)
    assert count_rows(after) == (figures["unique_spans"],) * 2


def test_a_damaged_page_in_a_scanned_batch_is_named_by_the_file_by_file_read(make_dataset, monkeypatch) -> None:
    path, _, files = _small_files(make_dataset, files=60)
    victim = Path(files[len(files) // 2])
    data = bytearray(victim.read_bytes())
    data[4:300] = os.urandom(296)  # its pages are noise; its magic and footer are intact
    victim.write_bytes(bytes(data))
    watch = ReadWatch(monkeypatch)
    before = sorted(os.listdir(victim.parent))
    with pytest.raises(CorruptFileError, match=victim.name):
        compact(path, partitions=[victim.parent.name])
    assert watch.read  # the scan failed and the batch was read again file by file, which named the file
    assert sorted(n for n in os.listdir(victim.parent) if n.endswith(".parquet")) == sorted(
        n for n in before if n.endswith(".parquet")
    )
