"""Datasets for the storage tests, written by benchmarks/gen_dataset.py through the project's DatasetWriter."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import duckdb
import pyarrow as pa
import pytest

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


@pytest.fixture
def make_dataset(tmp_path: Path) -> Callable[..., tuple[Path, dict[str, Any]]]:
    def make(
        name: str = "ds", *, spans: int = 3000, ids: int = 300, rows_per_file: int = 200, duplicates: float = 0.02
    ) -> tuple[Path, dict[str, Any]]:
        path = tmp_path / name
        figures = load_generator().generate(
            path, spans=spans, ids=ids, days=2, rows_per_file=rows_per_file, duplicates=duplicates, seed=11
        )
        return path, figures

    return make


def count_rows(files: list[str]) -> tuple[int, int]:
    """(rows, distinct (trace_id, span_id)) over ``files`` read by DuckDB."""
    if not files:
        return 0, 0
    con = duckdb.connect()
    try:
        row = con.execute(
            "SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM read_parquet(?)", [files]
        ).fetchone()
    finally:
        con.close()
    assert row is not None
    return int(row[0]), int(row[1])


class ReadWatch:
    """Counts the single-file tables compaction reads (``_read_one``) and the most of them alive at once."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        module = importlib.import_module("otel_replay.storage.compact_steps")
        self.refs: list[weakref.ref[pa.Table]] = []
        self.peak = 0
        self.read: list[str] = []
        real = module._read_one

        def reading(path: Any, location: Any = None) -> pa.Table:
            table = real(path, location)
            self.read.append(str(path))
            self.refs.append(weakref.ref(table))
            self.peak = max(self.peak, sum(ref() is not None for ref in self.refs))
            return table

        monkeypatch.setattr(module, "_read_one", reading)
