"""Compaction: content kept, duplicates counted, layout (sort, bloom, zstd, dictionary) verified by DuckDB."""

from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otel_replay.errors import ConfigError, CorruptFileError, DatasetError
from otel_replay.exporters.schema import SCHEMA_METADATA_KEY, SPAN_SCHEMA
from otel_replay.query.store import Store
from otel_replay.storage import compact, live_files
from otel_replay.storage.manifest import MANIFEST_NAME, partition_dirs

from .conftest import count_rows

CONTENT = (
    "trace_id, span_id, name, epoch_ns(start_time), epoch_ns(end_time), attributes, correlation_id, record_id, "
    "replay_kind, to_json(events), parent_span_id"
)


def _content(files: list[str]) -> list[tuple[object, ...]]:
    con = duckdb.connect()
    try:
        return sorted(con.execute(f"SELECT DISTINCT {CONTENT} FROM read_parquet(?)", [files]).fetchall())
    finally:
        con.close()


def test_compaction_keeps_every_span_and_removes_only_exact_duplicates(make_dataset) -> None:
    path, figures = make_dataset()
    before = live_files(path)
    assert count_rows(before) == (figures["spans_written"], figures["unique_spans"])
    content = _content(before)
    report = compact(path, grace_seconds=0)
    after = live_files(path)
    assert report.duplicates_removed == figures["duplicates_written"] > 0
    assert report.output_rows == figures["unique_spans"] == report.input_rows - report.duplicates_removed
    assert count_rows(after) == (figures["unique_spans"], figures["unique_spans"])
    assert _content(after) == content  # same spans, nanoseconds included
    assert all(Path(f).name.startswith("compact-g1-") for f in after)
    # grace 0: nothing superseded is left on disk, so even a plain glob is exact
    glob = [str(p) for p in (path / "spans").rglob("*.parquet")]
    assert sorted(glob) == after


def test_same_ids_with_different_content_are_kept_as_evidence(make_dataset, tmp_path: Path) -> None:
    path, _ = make_dataset(duplicates=0)
    first = pq.read_table(live_files(path)[0])
    row = first.slice(3, 1)
    forged = row.set_column(
        row.schema.get_field_index("attributes"), "attributes", pa.array(['{"forged":true}'], pa.string())
    )
    partition = Path(live_files(path)[0]).parent
    pq.write_table(pa.concat_tables([row, forged, row]), partition / "part-9-aaaaaaaaaaaa.parquet")
    report = compact(path, grace_seconds=0)
    assert report.duplicates_removed == 2  # the two exact copies of `row`
    assert report.conflicting_kept == 2  # `row` and the forged one, both kept
    con = duckdb.connect()
    got = con.execute(
        "SELECT attributes FROM read_parquet(?) WHERE trace_id = ? AND span_id = ? ORDER BY 1",
        [live_files(path), row.column("trace_id")[0].as_py(), row.column("span_id")[0].as_py()],
    ).fetchall()
    assert sorted(a for (a,) in got) == sorted([row.column("attributes")[0].as_py(), '{"forged":true}'])


def test_layout_sorted_zstd_dictionary_and_bloom_filters(make_dataset) -> None:
    path, _ = make_dataset(duplicates=0)
    compact(path, grace_seconds=0, row_group_rows=256)
    con = duckdb.connect()
    for file in live_files(path):
        table = pq.read_table(file)
        assert table.schema.metadata[SCHEMA_METADATA_KEY] == SPAN_SCHEMA.metadata[SCHEMA_METADATA_KEY]
        keys = list(
            zip(*(table.column(c).to_pylist() for c in ("correlation_id", "trace_id", "start_time")), strict=True)
        )
        present = [k for k in keys if k[0] is not None]
        assert present == sorted(present) and keys[: len(present)] == present  # NULL correlation ids last
        meta = con.execute(
            "SELECT path_in_schema, compression, encodings, bloom_filter_offset, row_group_num_rows "
            "FROM parquet_metadata(?)",
            [file],
        ).fetchall()
        assert {m[1] for m in meta} == {"ZSTD"}
        assert max(m[4] for m in meta) <= 256
        blooms = {m[0] for m in meta if m[3] is not None}
        assert {"trace_id", "span_id", "correlation_id", "session_id", "record_id", "outcome_decision_id"} <= blooms
        assert "attributes" not in blooms
        encodings = {m[0]: m[2] for m in meta}
        assert "DICTIONARY" in encodings["replay_kind"] and "DICTIONARY" not in encodings["attributes"]
        # absent ids: the filters rule out nearly every row group (a bloom filter may say "maybe")
        excluded = con.execute(
            "SELECT avg(bloom_filter_excludes::INT) FROM parquet_bloom_probe(?, 'correlation_id', ?)",
            [file, "no-such-correlation-id"],
        ).fetchone()
        misses = [
            con.execute(
                "SELECT avg(bloom_filter_excludes::INT) FROM parquet_bloom_probe(?, 'record_id', ?)", [file, f"x{i}"]
            ).fetchone()[0]
            for i in range(20)
        ]
        assert excluded is not None and sum(misses) / len(misses) > 0.8
        # a present id is never excluded from the row group holding it (no false negatives)
        some_id = table.column("correlation_id")[0].as_py()
        hit = con.execute(
            "SELECT bloom_filter_excludes FROM parquet_bloom_probe(?, 'correlation_id', ?) WHERE row_group_id = 0",
            [file, some_id],
        ).fetchone()
        assert hit == (False,)


def test_store_sees_the_same_chain_after_compaction(make_dataset) -> None:
    path, _ = make_dataset()
    with Store(path) as store:
        before = store.run("chains/trade", chain_id="trade-000000042")
        calibration = store.calibration()
    compact(path, grace_seconds=0)
    with Store(path) as store:
        assert store.run("chains/trade", chain_id="trade-000000042") == before
        assert store.calibration() == calibration
    assert len(before) >= 5


def test_recompaction_merges_arrivals_and_is_a_no_op_when_current(make_dataset) -> None:
    path, figures = make_dataset(duplicates=0)
    compact(path, grace_seconds=0)
    again = compact(path, grace_seconds=0)
    assert {p.status for p in again.partitions} == {"current"}
    partition = partition_dirs(path)[0]
    extra = pq.read_table(live_files(path)[0]).slice(0, 5)
    fresh = extra.set_column(0, "trace_id", pa.array(["f" * 32] * 5, pa.string()))
    pq.write_table(fresh.replace_schema_metadata(extra.schema.metadata), partition / "part-1-bbbbbbbbbbbb.parquet")
    report = compact(path, grace_seconds=0, partitions=[partition.name])
    assert [p.status for p in report.partitions] == ["compacted"]
    assert count_rows(live_files(path))[0] == figures["unique_spans"] + 5
    manifest = json.loads((partition / MANIFEST_NAME).read_text())
    assert manifest["generation"] == 2 and manifest["superseded"] == {}


def test_different_schema_versions_are_never_merged(make_dataset) -> None:
    path, _ = make_dataset(duplicates=0)
    partition = partition_dirs(path)[0]
    sample = pq.read_table(next(partition.glob("part-*.parquet"))).slice(0, 3)
    # a newer schema version is refused (tests/storage/test_unexpected_files.py)
    older = sample.replace_schema_metadata({SCHEMA_METADATA_KEY: b"1"})
    pq.write_table(older, partition / "part-2-cccccccccccc.parquet")
    compact(path, grace_seconds=0, partitions=[partition.name])
    versions = sorted(pq.read_schema(f).metadata[SCHEMA_METADATA_KEY] for f in live_files(path) if partition.name in f)
    assert versions == sorted([SPAN_SCHEMA.metadata[SCHEMA_METADATA_KEY], b"1"])


def test_corrupt_file_changes_nothing_in_its_partition(make_dataset) -> None:
    path, _ = make_dataset(duplicates=0)
    partition = partition_dirs(path)[0]
    before = sorted(os.listdir(partition))
    (partition / "part-3-dddddddddddd.parquet").write_bytes(b"PAR1 truncated")
    with pytest.raises(CorruptFileError, match="part-3-dddddddddddd.parquet"):
        compact(path, partitions=[partition.name])
    assert sorted(os.listdir(partition)) == sorted([*before, "part-3-dddddddddddd.parquet"])


@pytest.mark.parametrize(
    "document, problem",
    [
        ('{"format": 1, "generation": 1, "generation": 2}', "duplicate"),
        ('{"format": 1, "generation": -1}', "generation"),
        ('{"format": 1, "generation": 1, "files": ["../../etc/passwd"]}', "files"),
        ('{"format": 1, "generation": 1, "superseded": {"a.parquet": "yesterday"}}', "superseded"),
        ('{"format": 2, "generation": 1}', "format"),
        ("[" * 5000, "manifest"),
    ],
)
def test_a_bad_manifest_is_a_one_line_error_naming_it(make_dataset, document: str, problem: str) -> None:
    path, _ = make_dataset(spans=400, ids=40, duplicates=0)
    partition = partition_dirs(path)[0]
    (partition / MANIFEST_NAME).write_text(document)
    with pytest.raises(DatasetError) as info:
        live_files(path)
    assert MANIFEST_NAME in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(DatasetError):
        compact(path)


@pytest.mark.parametrize(
    "kwargs", [{"target_rows": 0}, {"row_group_rows": -5}, {"target_rows": True}, {"grace_seconds": float("nan")}]
)
def test_bad_arguments_are_config_errors(make_dataset, kwargs: dict[str, object]) -> None:
    path, _ = make_dataset(spans=100, ids=10)
    with pytest.raises(ConfigError):
        compact(path, **kwargs)  # type: ignore[arg-type]


def test_missing_dataset_and_partition_are_dataset_errors(tmp_path: Path, make_dataset) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        compact(tmp_path / "nowhere")
    path, _ = make_dataset(spans=100, ids=10)
    with pytest.raises(DatasetError, match="date=1999-01-01"):
        compact(path, partitions=["1999-01-01"])


def test_target_rows_splits_files(make_dataset) -> None:
    path, figures = make_dataset(duplicates=0)
    compact(path, grace_seconds=0, target_rows=500)
    files = live_files(path)
    assert all(pq.read_metadata(f).num_rows <= 500 for f in files)
    assert count_rows(files)[0] == figures["unique_spans"]


def test_batches_bound_memory_and_still_remove_duplicates_across_them(make_dataset) -> None:
    path, figures = make_dataset(spans=3000, ids=300, rows_per_file=100, duplicates=0.05)
    partition = partition_dirs(path)[0]
    first = pq.read_table(sorted(partition.glob("part-*.parquet"))[0])  # in the first batch
    row = first.slice(0, 1)
    forged = row.set_column(
        row.schema.get_field_index("attributes"), "attributes", pa.array(['{"forged":1}'], pa.string())
    )
    pq.write_table(forged, partition / "part-99999999999999999999-ffffffffffff.parquet")  # last batch
    report = compact(path, grace_seconds=0, max_batch_rows=400)
    assert report.duplicates_removed == figures["duplicates_written"]
    assert report.conflicting_kept == 2  # the original row (first batch) and the forged one (last batch)
    files = live_files(path)
    assert len({Path(f).name.split("-")[2] for f in files if partition.name in f}) >= 3  # several sorted runs
    assert count_rows(files) == (figures["unique_spans"] + 1, figures["unique_spans"])
    assert all(pq.read_metadata(f).num_rows <= 400 for f in files)
