"""A compaction batch of many small local files read by one DuckDB scan, rather than one pyarrow read per file.

Reading a 10-row span file with pyarrow costs 1-3 ms here, most of it per
column chunk and per file, whatever the rows; a day of 20,000 such files
spent most of its compaction there. DuckDB's ``read_parquet`` over the
batch's list of files does the same decoding in C++ on its own threads, at
about a third of the CPU a file (``benchmarks/bench_many_files.py``).

Its answer is taken only when it is the batch, exactly: the columns the
group's Arrow schema names, in its order, each cast back to its type (DuckDB
spells the UTC zone ``Etc/UTC`` and a list's item ``l``; the cast is checked,
never lossy), and as many rows as the files' footers count. Anything else —
an error on a damaged page, a row count that differs, a type it reads
another way — answers ``None``, and :func:`~.compact_steps.read_files`
reads the batch file by file as before, which names a damaged file. So the
guarantees of compaction (a corrupt file is named and nothing is changed,
schema versions never mixed, nothing lost) do not depend on this path.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from otel_replay import _duck as duck
from otel_replay.exporters.id_keys import ID_KEYS_METADATA_KEY

__all__ = ["DUCK_MIN_FILES", "READ_BATCH_ROWS", "duck_read"]

_log = logging.getLogger("otel_replay")

DUCK_MIN_FILES = 16
"""Below this many files a batch is read file by file (DuckDB's set-up costs more than it saves)."""

READ_BATCH_ROWS = 65_536
"""Rows of each Arrow batch DuckDB hands over (cast one by one, then made contiguous by the caller)."""


def _group_schema(first: Path | str) -> pa.Schema:
    """The Arrow schema a batch is read as: the first file's, without its own id keys (they describe its rows)."""
    schema = pq.read_schema(first)
    metadata = {k: v for k, v in (schema.metadata or {}).items() if k != ID_KEYS_METADATA_KEY}
    return schema.with_metadata(metadata)


def duck_read(paths: Sequence[Path | str], expected_rows: int | None, threads: int) -> pa.Table | None:
    """The rows of ``paths`` (local files of one schema group) read by DuckDB, in file order; ``None``: not usable.

    ``expected_rows``: the rows the files' footers count (``None``: not
    checked). ``threads``: DuckDB's threads for the scan. ``None`` when
    DuckDB fails on any file, or its answer is not exactly the group's
    columns and rows (see the module docstring): the caller then reads the
    files one by one.
    """
    if len(paths) < DUCK_MIN_FILES:
        return None
    try:
        schema = _group_schema(paths[0])
    except (pa.ArrowException, OSError):
        return None
    con = duck.connect()
    try:
        con.execute(f"SET threads = {max(1, int(threads))}")
        con.execute("SET preserve_insertion_order = true")  # rows in file order, as the per-file read gives them
        reader = con.sql(
            "SELECT * FROM read_parquet($files, hive_partitioning = false, union_by_name = false)",
            params={"files": [str(p) for p in paths]},
        ).to_arrow_reader(READ_BATCH_ROWS)
        if reader.schema.names != schema.names:
            return None
        plain = schema.remove_metadata()
        pieces = [pa.Table.from_batches([batch]).cast(plain) for batch in reader]
    except (duckdb.Error, pa.ArrowException, OSError, ValueError, TypeError) as exc:  # the reader raises OSError
        _log.debug(
            "otel-replay: DuckDB could not read a batch of %d files (%s); reading them one by one", len(paths), exc
        )
        return None
    finally:
        con.close()
    table = pa.concat_tables(pieces) if pieces else plain.empty_table()
    if expected_rows is not None and table.num_rows != expected_rows:
        return None
    return table.replace_schema_metadata(schema.metadata)
