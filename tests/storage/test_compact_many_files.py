"""Compaction of many small files: each footer parsed once, files read a few at a time, whatever their number."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from otel_replay.errors import CorruptFileError
from otel_replay.exporters.schema import SCHEMA_METADATA_KEY
from otel_replay.storage import compact, live_files
from otel_replay.storage.manifest import MANIFEST_NAME, is_compacted_name, partition_dirs

from .conftest import ReadWatch, count_rows

compact_module = importlib.import_module("otel_replay.storage.compact_steps")


def _many(make_dataset: Any) -> tuple[Path, dict[str, Any]]:
    """150 files of 3 spans in two partitions (75 in each, compacted as one batch each unless told otherwise),
    generated once per test process for every test here."""
    return make_dataset(spans=450, ids=150, rows_per_file=3, duplicates=0.02)


def _small_bounds(monkeypatch: pytest.MonkeyPatch) -> int:
    """Compaction's read bounds made small, so 150 files are several times them; the most files compaction may
    then hold as tables at once (``GATHER_FILES + READ_AHEAD + 2``: a gathered piece, the files read ahead, the
    one in hand)."""
    monkeypatch.setattr(compact_module, "GATHER_FILES", 8)
    monkeypatch.setattr(compact_module, "READ_AHEAD", 4)
    return compact_module.GATHER_FILES + compact_module.READ_AHEAD + 2


@pytest.mark.slow
def test_many_small_files_are_read_one_by_one_and_never_held_all_at_once(make_dataset, monkeypatch) -> None:
    path, figures = _many(make_dataset)
    inputs = live_files(path)
    held = _small_bounds(monkeypatch)
    assert len(inputs) > 3 * held  # so holding one table per file would show
    watch = ReadWatch(monkeypatch)
    report = compact(path, grace_seconds=0, threads=2)
    assert sorted(watch.read) == sorted(inputs)  # every file read once, on its own
    # a batch of ~75 files never holds them all as tables: a gathered piece, the files read ahead, the one in hand
    assert watch.peak <= held
    assert report.duplicates_removed == figures["duplicates_written"]
    after = live_files(path)
    assert all(is_compacted_name(Path(f).name) for f in after)
    assert count_rows(after) == (figures["unique_spans"],) * 2


@pytest.mark.slow
def test_each_footer_is_parsed_once_and_most_by_their_bytes_before_the_rows_are_read(make_dataset, monkeypatch) -> None:
    path, _ = _many(make_dataset)
    inputs = live_files(path)
    opened: list[str] = []
    real = compact_module.ParquetReader

    class Counting(real):  # type: ignore[misc, valid-type]
        def open(self, source: Any, *args: Any, **kwargs: Any) -> Any:
            opened.append(str(source))
            return super().open(source, *args, **kwargs)

    def no_metadata(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("a footer read again to count rows")

    monkeypatch.setattr(compact_module, "ParquetReader", Counting)
    monkeypatch.setattr(compact_module.pq, "read_metadata", no_metadata)
    compact(path, grace_seconds=0, max_batch_rows=50)  # many batches: their rows come from the first pass
    # Once for the rows; the schema check parses with pyarrow only the first file of each partition (the rest
    # repeat its schema's bytes, compared raw: storage/compact_footer.py).
    assert sorted(set(opened)) == sorted(inputs)
    twice = [path for path in set(opened) if opened.count(path) == 2]
    assert len(opened) == len(inputs) + len(twice) and len(twice) == len(partition_dirs(path))


@pytest.mark.slow
def test_a_tiny_batch_over_many_files_keeps_every_span_once(make_dataset) -> None:
    path, figures = _many(make_dataset)
    report = compact(path, grace_seconds=0, max_batch_rows=24, target_rows=7)
    assert report.duplicates_removed == figures["duplicates_written"] > 0
    after = live_files(path)
    assert count_rows(after) == (figures["unique_spans"],) * 2
    assert all(pq.read_metadata(f).num_rows <= 7 for f in after)
    assert len({Path(f).name.split("-")[2] for f in after}) > 20  # one sorted run per batch


@pytest.mark.slow
def test_a_truncated_file_among_many_small_files_changes_nothing_and_is_named(make_dataset) -> None:
    path, _ = _many(make_dataset)
    partition = partition_dirs(path)[0]
    names = sorted(os.listdir(partition))
    victim = partition / names[len(names) // 2]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])  # its footer is gone
    before = sorted(os.listdir(partition))
    with pytest.raises(CorruptFileError, match=victim.name):
        compact(path, partitions=[partition.name], threads=2)
    assert sorted(os.listdir(partition)) == before  # no manifest, no output, no temp file


def test_a_file_damaged_past_its_footer_fails_the_run_naming_it_and_leaves_no_output(make_dataset) -> None:
    path, figures = _many(make_dataset)
    partition = partition_dirs(path)[0]
    names = sorted(n for n in os.listdir(partition) if n.endswith(".parquet"))
    victim = partition / names[-3]  # read late: outputs of earlier batches may be written already
    data = bytearray(victim.read_bytes())
    data[4:200] = b"\xff" * 196  # column chunks overwritten; magic and footer intact
    victim.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match=victim.name):
        compact(path, partitions=[partition.name], max_batch_rows=60)
    left = os.listdir(partition)
    assert not [n for n in left if is_compacted_name(n) or n.endswith(".tmp") or n.startswith("_index")]
    assert sorted(n for n in left if n.endswith(".parquet")) == names  # every input still there, still live
    assert sorted(Path(f).name for f in live_files(path) if partition.name in f) == names
    assert MANIFEST_NAME not in left or '"pending": {}' in (partition / MANIFEST_NAME).read_text().replace("\n", "")


@pytest.mark.slow
def test_older_schema_versions_among_many_small_files_stay_apart_and_complete(make_dataset) -> None:
    path, figures = _many(make_dataset)
    partition = partition_dirs(path)[0]
    names = sorted(n for n in os.listdir(partition) if n.endswith(".parquet"))
    old = names[::3]  # every third arrival written by an older writer (storage schema version 1)
    for name in old:
        table = pq.read_table(partition / name)
        pq.write_table(table.replace_schema_metadata({SCHEMA_METADATA_KEY: b"1"}), partition / name)
    rows_before = count_rows(live_files(path))
    compact(path, grace_seconds=0, max_batch_rows=70)
    after = [f for f in live_files(path) if partition.name in f]
    versions = {pq.read_schema(f).metadata[SCHEMA_METADATA_KEY] for f in after}
    assert versions == {b"1", b"2"}  # never merged into one schema
    assert count_rows(live_files(path))[1] == rows_before[1] == figures["unique_spans"]
