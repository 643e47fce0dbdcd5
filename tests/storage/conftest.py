"""Datasets for the storage tests, written by benchmarks/gen_dataset.py through the project's DatasetWriter."""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from otel_replay.exporters.id_keys import ID_KEYS_METADATA_KEY

ROOT = Path(__file__).resolve().parents[2]


def load_generator() -> ModuleType:
    name = "otel_replay_bench_gen_dataset"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "gen_dataset.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class _Generated:
    """A dataset the generator wrote once in this test process, never handed out itself (tests get copies)."""

    path: Path
    figures: dict[str, Any]
    written_at_ns: int


@pytest.fixture(scope="session")
def generated_datasets() -> dict[tuple[Any, ...], _Generated]:
    """The datasets generated so far in this process, by the generator's arguments (see ``make_dataset``)."""
    return {}


def _copy_as_if_written_now(source: _Generated, target: Path) -> None:
    """Copy ``source`` to ``target``; every copied file and folder gets its original times moved forward by the
    time since the source was written, so the copy's ages (compaction's grace, retention) and their order are
    those of a dataset written just now."""
    shutil.copytree(source.path, target)
    shift = time.time_ns() - source.written_at_ns
    for copied in [target, *target.rglob("*")]:
        original = source.path / copied.relative_to(target)
        info = original.stat()
        os.utime(copied, ns=(info.st_atime_ns + shift, info.st_mtime_ns + shift))


@pytest.fixture
def make_dataset(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, generated_datasets: dict[tuple[Any, ...], _Generated]
) -> Callable[..., tuple[Path, dict[str, Any]]]:
    """A generated dataset of the test's own at ``tmp_path / name``, and the generator's figures.

    The generator is deterministic (a fixed seed) but costly, so each set of arguments is generated once per test
    process and each test gets a copy with fresh times; two calls with the same arguments give equal datasets.
    """

    def make(
        name: str = "ds", *, spans: int = 3000, ids: int = 300, rows_per_file: int = 200, duplicates: float = 0.02
    ) -> tuple[Path, dict[str, Any]]:
        key = (spans, ids, rows_per_file, duplicates)
        if key not in generated_datasets:
            source = tmp_path_factory.mktemp("generated") / "ds"
            figures = load_generator().generate(
                source, spans=spans, ids=ids, days=2, rows_per_file=rows_per_file, duplicates=duplicates, seed=11
            )
            generated_datasets[key] = _Generated(source, figures, time.time_ns())
        generated = generated_datasets[key]
        path = tmp_path / name
        _copy_as_if_written_now(generated, path)
        return path, dict(generated.figures)

    return make


_READER: list[tuple[int, duckdb.DuckDBPyConnection]] = []
"""The DuckDB database ``count_rows`` reads through, made once per process (a new database costs ~40 ms of CPU)."""
_READER_LOCK = threading.Lock()


def _reader() -> duckdb.DuckDBPyConnection:
    """This process's in-memory database for ``count_rows``; a forked child makes its own (never the parent's)."""
    with _READER_LOCK:
        if not _READER or _READER[0][0] != os.getpid():
            con = duckdb.connect()
            # Every read goes to the files as they are now: a file rewritten in place is never served from a cache.
            con.execute("SET enable_external_file_cache = false")
            _READER[:] = [(os.getpid(), con)]
        return _READER[0][1]


def count_rows(files: list[str]) -> tuple[int, int]:
    """(rows, distinct (trace_id, span_id)) over ``files`` read by DuckDB (a cursor of its own: thread-safe)."""
    if not files:
        return 0, 0
    con = _reader().cursor()
    try:
        row = con.execute(
            "SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM read_parquet(?)", [files]
        ).fetchone()
    finally:
        con.close()
    assert row is not None
    return int(row[0]), int(row[1])


class ReadWatch:
    """Counts the single-file tables compaction reads (``_read_one``) and the most of them alive at once.

    Each table is handed on without its file's id keys (footer metadata that describes that file's rows only,
    which compaction drops from every table it gathers). With them, compaction replaced each table by a copy with
    the batch's metadata before holding it: the watched tables died at once, however many copies were held, and a
    gather that ignored its bound passed. Without them the table compaction holds is the one watched.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        module = importlib.import_module("otel_replay.storage.compact_steps")
        self.refs: list[weakref.ref[pa.Table]] = []
        self.peak = 0
        self.read: list[str] = []
        real = module._read_one

        def reading(path: Any, location: Any = None) -> pa.Table:
            table = real(path, location)
            metadata = table.schema.metadata or {}
            if ID_KEYS_METADATA_KEY in metadata:
                table = table.replace_schema_metadata({k: v for k, v in metadata.items() if k != ID_KEYS_METADATA_KEY})
            self.read.append(str(path))
            self.refs.append(weakref.ref(table))
            self.peak = max(self.peak, sum(ref() is not None for ref in self.refs))
            return table

        monkeypatch.setattr(module, "_read_one", reading)
