"""Compaction, retention and the write of a finished table, held to the same behaviour on both backends.

Each of these has one implementation for a local directory and one for an
object store, picked once from the dataset's location. Each test runs once
on a directory and once on a bucket of the local S3-compatible server,
with a dataset that is there and with one that is not (a missing directory,
a missing bucket).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otel_replay.errors import DatasetError
from otel_replay.exporters.writer import write_partitions, write_table
from otel_replay.location import PerBackend, resolve
from otel_replay.storage import compact, drop_older_than, live_files
from otel_replay.storage.backend import backend_for
from otel_replay.storage.logs import LogWriter
from otel_replay.storage.manifest import is_compacted_name, partition_names

from ..storage.conftest import load_generator
from ..storage.test_log_partitions import log_request
from .conftest import keys

MISSING_BUCKET = "otel-replay-no-such-bucket"


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def dataset(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """An empty dataset: a directory not made yet, or a prefix of a fresh bucket."""
    if where == "local":
        return str(tmp_path / "not-made-yet" / "ds")
    return f"s3://{request.getfixturevalue('bucket')}/ds"


@pytest.fixture
def missing(where: str, tmp_path: Path) -> str:
    """A dataset that cannot be there: under a directory that does not exist, or in a bucket that does not."""
    return str(tmp_path / "nowhere" / "ds") if where == "local" else f"s3://{MISSING_BUCKET}/ds"


def _generate(dataset: str) -> dict[str, Any]:
    """A small dataset over two days, with retried (exact duplicate) spans, in many small arrival-order files."""
    figures: dict[str, Any] = load_generator().generate(
        dataset,
        spans=240,
        ids=24,
        days=2,
        rows_per_file=40,
        duplicates=0.05,
        seed=11,  # type: ignore[arg-type]
    )
    return figures


def _rows(dataset: str, files: list[str]) -> int:
    backend = backend_for(resolve(dataset))
    return sum(pq.ParquetFile(backend.source(f)).metadata.num_rows for f in files)


def test_each_operation_picks_the_implementation_of_where_the_dataset_lives(tmp_path: Path) -> None:
    pick = PerBackend(local="directory", objects="object store")
    assert pick.of(resolve(tmp_path)) == "directory"
    assert pick.of(resolve(str(tmp_path / "ds"))) == "directory"
    assert pick.of(resolve(f"file://{tmp_path}/ds")) == "directory"  # a file:// URI is a local directory
    assert pick.of(resolve(f"s3://{MISSING_BUCKET}/ds")) == "object store"  # chosen without a request


def test_compaction_sorts_and_drops_retried_spans_the_same_way_on_either_backend(dataset: str) -> None:
    figures = _generate(dataset)
    arrivals = live_files(dataset)
    assert _rows(dataset, arrivals) == figures["spans_written"]
    report = compact(dataset, grace_seconds=3600)
    assert report.partitions and {p.status for p in report.partitions} == {"compacted"}
    assert report.duplicates_removed == figures["duplicates_written"] > 0
    assert sum(p.output_rows for p in report.partitions) == figures["unique_spans"]
    after = live_files(dataset)
    assert after and all(is_compacted_name(f.rpartition("/")[2]) for f in after)
    assert _rows(dataset, after) == figures["unique_spans"]


def test_compaction_of_a_dataset_that_is_not_there_fails_in_one_line_naming_it(where: str, missing: str) -> None:
    with pytest.raises(DatasetError) as caught:
        compact(missing)
    said = str(caught.value)
    assert "\n" not in said
    if where == "local":
        assert said == f"dataset {missing} does not exist or is not a directory"
        assert not Path(missing).parent.exists()  # nothing was made
    else:
        assert f"bucket {MISSING_BUCKET!r} does not exist" in said and missing in said


def test_retention_drops_old_partitions_whole_on_either_backend(dataset: str) -> None:
    _generate(dataset)
    names = partition_names(dataset)
    assert len(names) >= 2
    oldest = names[0]
    in_oldest = [f for f in live_files(dataset) if f"/{oldest}/" in f]
    kept = [f for f in live_files(dataset) if f"/{oldest}/" not in f]
    rows = _rows(dataset, in_oldest)
    today = dt.date.fromisoformat(names[1].removeprefix("date="))
    report = drop_older_than(dataset, 0, today=today, grace_seconds=0)
    assert report.dropped == [oldest] and report.busy == []
    assert report.files == len(in_oldest) and report.rows == rows > 0
    assert partition_names(dataset) == names[1:]
    assert live_files(dataset) == kept
    assert drop_older_than(dataset, 0, today=today, grace_seconds=0).dropped == []  # nothing of it is left


def test_retention_of_a_dataset_that_is_not_there(where: str, missing: str) -> None:
    if where == "local":  # nothing to drop, and nothing made
        report = drop_older_than(missing, 0, today=dt.date(2026, 1, 3))
        assert report.dropped == [] and report.busy == [] and report.files == 0
        assert not Path(missing).parent.exists()
        return
    with pytest.raises(DatasetError, match=f"bucket {MISSING_BUCKET!r} does not exist") as caught:
        drop_older_than(missing, 0, today=dt.date(2026, 1, 3))
    assert "\n" not in str(caught.value)


def test_a_finished_table_is_written_whole_and_replaced_whole_where_the_dataset_lives(where: str, dataset: str) -> None:
    location = resolve(dataset)
    path = location.native(location.join("extra", "date=2026-01-01", "t.parquet"))
    assert isinstance(path, Path) == (where == "local")  # the form the package hands paths around in
    write_table(pa.table({"x": [1, 2, 3]}), location, path, footer={b"who": b"first"})
    write_table(pa.table({"x": [4, 5]}), location, path, footer={b"who": b"second"})
    backend = backend_for(location)
    read = pq.ParquetFile(backend.source(str(path)))
    assert read.read().column("x").to_pylist() == [4, 5]
    assert read.metadata.metadata[b"who"] == b"second"
    listed = [backend.path_of(info) for info in backend.files_under(location.join("extra"))]
    assert listed == [str(path)]  # no temp file left beside it


def test_a_table_that_cannot_be_written_fails_and_leaves_nothing(where: str, tmp_path: Path, missing: str) -> None:
    if where == "local":  # the dataset's place is taken by a file: no directory can be made there
        blocker = tmp_path / "taken"
        blocker.write_text("not a directory")
        location = resolve(str(blocker / "ds"))
        with pytest.raises(OSError):
            write_table(pa.table({"x": [1]}), location, location.native(location.join("t.parquet")))
        assert blocker.read_text() == "not a directory" and [p.name for p in tmp_path.iterdir()] == ["taken"]
        return
    location = resolve(missing)
    with pytest.raises(DatasetError) as caught:
        write_table(pa.table({"x": [1]}), location, location.join("t.parquet"))
    said = str(caught.value)
    assert said.startswith(f"dataset {missing}: cannot write {missing}/t.parquet: ") and "\n" not in said
    assert MISSING_BUCKET in said


def test_span_partitions_are_written_one_file_per_date_in_the_location_s_form(where: str, dataset: str) -> None:
    location = resolve(dataset)
    spans = location.native(location.join("spans"))
    rows = pa.table({"x": [1, 2, 3], "date": ["2026-01-02", "2026-01-01", "2026-01-02"]})
    written = write_partitions(rows, spans, lambda date: f"part-{date}.parquet")
    dates = ("2026-01-01", "2026-01-02")
    expected = [location.native(location.join("spans", f"date={d}", f"part-{d}.parquet")) for d in dates]
    assert written == expected
    backend = backend_for(location)
    assert [pq.read_table(backend.source(str(p))).column("x").to_pylist() for p in written] == [[2], [1, 3]]


def test_log_records_land_in_date_partitions_on_either_backend(where: str, dataset: str, s3_or_none: Any) -> None:
    writer = LogWriter(dataset, "seg-00001", chunk_rows=4)
    for day in (0, 1):
        writer.add_payload(log_request(day, 6).SerializeToString())
    writer.flush()
    location = resolve(dataset)
    assert writer.rows_written == 12
    assert all(isinstance(p, Path) == (where == "local") for p in writer.paths)
    backend = backend_for(location)
    per_date = Counter(str(p).split("/date=")[1].split("/")[0] for p in writer.paths)
    assert set(per_date) == {"2026-01-01", "2026-01-02"}
    assert sum(pq.ParquetFile(backend.source(str(p))).metadata.num_rows for p in writer.paths) == 12
    if s3_or_none is not None:  # objects only: no directory marker, no temp object
        client, bucket = s3_or_none
        assert all(k.endswith(".parquet") for k in keys(client, bucket, "ds/logs/"))


def test_log_records_for_a_dataset_that_is_not_there(where: str, missing: str) -> None:
    writer = LogWriter(missing, "seg-00001")
    writer.add_payload(log_request(0, 2).SerializeToString())
    if where == "local":  # a directory is made for them
        writer.flush()
        assert writer.rows_written == 2
        assert writer.paths == [Path(missing) / "logs" / "date=2026-01-01" / "seg-00001-00000.parquet"]
        assert pq.read_metadata(writer.paths[0]).num_rows == 2
        return
    with pytest.raises(DatasetError) as caught:
        writer.flush()
    said = str(caught.value)
    assert said.startswith(f"dataset {missing}: cannot write {missing}/logs/date=2026-01-01/seg-00001-00000.parquet: ")
    assert MISSING_BUCKET in said and "\n" not in said
    assert writer.paths == [] and writer.rows_written == 0


@pytest.fixture
def s3_or_none(where: str, request: pytest.FixtureRequest) -> Any:
    """(boto3 client, bucket) of the dataset fixture on s3; ``None`` on a directory."""
    if where == "local":
        return None
    return request.getfixturevalue("s3"), request.getfixturevalue("bucket")
