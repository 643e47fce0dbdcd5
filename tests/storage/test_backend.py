"""The storage backend seam on a local directory: the same operations the object store backend offers."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otel_replay.location import resolve
from otel_replay.storage.backend import LocalBackend, backend_for


def test_a_local_dataset_gets_the_local_backend(tmp_path: Path) -> None:
    assert isinstance(backend_for(resolve(tmp_path)), LocalBackend)


def test_a_write_replaces_the_file_whole_and_leaves_no_temp_file(tmp_path: Path) -> None:
    backend = backend_for(resolve(tmp_path))
    target = str(tmp_path / "_retention" / "mark.json")  # the directory is made by the write
    backend.write_atomic(target, b"first")
    backend.write_atomic(target, b"second")
    assert backend.read_bytes(target) == b"second"
    assert backend.size(target) == len(b"second")
    assert os.listdir(tmp_path / "_retention") == ["mark.json"]


def test_missing_files_read_as_none_and_delete_says_whether_one_was_there(tmp_path: Path) -> None:
    backend = backend_for(resolve(tmp_path))
    path = str(tmp_path / "gone.json")
    assert backend.read_bytes(path) is None
    assert backend.size(path) is None
    assert backend.delete(path) is False
    backend.write_atomic(path, b"{}")
    assert backend.delete(path) is True
    assert not os.path.exists(path)


def test_listing_names_files_and_only_directories_below(tmp_path: Path) -> None:
    backend = backend_for(resolve(tmp_path))
    spans = tmp_path / "spans"
    (spans / "date=2026-01-01").mkdir(parents=True)
    (spans / "date=2026-01-02").mkdir()
    (spans / "stray.txt").write_text("not a directory")
    pq.write_table(pa.table({"x": [1, 2, 3]}), spans / "date=2026-01-01" / "a.parquet")
    assert backend.subdirectories(str(spans)) == {"date=2026-01-01", "date=2026-01-02"}
    assert backend.subdirectories(str(tmp_path / "nothing")) == set()
    listed = [backend.path_of(info) for info in backend.files_under(str(spans / "date=2026-01-01"))]
    assert listed == [str(spans / "date=2026-01-01" / "a.parquet")]
    assert pq.read_table(backend.source(listed[0]))["x"].to_pylist() == [1, 2, 3]
    assert pq.ParquetFile(backend.open_input(listed[0])).metadata.num_rows == 3


def test_a_local_source_that_is_missing_fails_as_file_not_found(tmp_path: Path) -> None:
    backend = backend_for(resolve(tmp_path))
    with pytest.raises(FileNotFoundError):
        pq.read_metadata(backend.source(str(tmp_path / "missing.parquet")))


def test_a_local_dataset_is_a_directory_that_keeps_its_own_log_and_state(tmp_path: Path) -> None:
    backend = backend_for(resolve(f"file://{tmp_path}/traces"))
    assert backend.directory == tmp_path / "traces"
    assert backend.keeps_local_log and not backend.immutable_files and not backend.snapshots_listing
    assert backend.local_dir("wal") == tmp_path / "traces" / "_wal"
    assert backend.local_dir("governance") == tmp_path / "traces" / "_governance"


def test_a_local_stamp_follows_a_file_rewritten_under_its_name(tmp_path: Path) -> None:
    backend = backend_for(resolve(tmp_path))
    path = str(tmp_path / "a.json")
    with pytest.raises(FileNotFoundError):
        backend.stamp(path)
    backend.write_atomic(path, b"one")
    assert backend.stamp(path)[0] == 3 and backend.listed_stamp(path)[0] == 3
    backend.write_atomic(path, b"three")
    assert backend.stamp(path)[0] == 5 and backend.listed_stamp(path)[0] == 5  # nothing remembered
    os.symlink(path + ".loop", path + ".loop")
    with pytest.raises(OSError):
        backend.stamp(path + ".loop")
