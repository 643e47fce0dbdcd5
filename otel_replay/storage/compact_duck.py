"""Many small local files of a compaction batch read a chunk at a time by DuckDB, rather than one pyarrow read each.

Reading a 10-row span file with pyarrow costs 1.2-1.6 ms of CPU here, most of
it per column chunk and per file, whatever the rows; a day of 20,000 such
files spent most of its compaction there. DuckDB's ``read_parquet`` over a
list of files decodes the same pages in C++ at about half the CPU a file
(``benchmarks/bench_many_files.py``, tenth session).

A chunk is at most :data:`DUCK_FILES` files, read on one DuckDB thread
(compaction's workers read the next chunk beside it), so memory is one
chunk's rows per worker whatever the number of files. (The fifth session
scanned a whole batch, some 10,000 files, in one query on two DuckDB threads:
1.6 GB of RSS on the 20,660-file day, and reverted it.)

The chunk's first file is read by pyarrow (no footer is parsed twice: its
schema is the one the rest is cast to). DuckDB's answer for the rest is taken
only when it is exactly those files: the columns of that schema, in its
order, each of its type but for names (DuckDB spells the UTC zone ``Etc/UTC``
and a list's item ``l``: the cast renames, it converts no value), and as many
rows as the files' footers count. Anything else (an error on a damaged page,
a row count that differs, a type it reads another way, a zoneless nanosecond
time that may be INT96) answers ``None``, and the caller reads that chunk's files one by
one as before, which names a damaged file.

DuckDB checks no page checksum, and reads some damaged pages pyarrow refuses
(one flipped bit in a page header, its levels or its dictionary indices) as
the right number of rows with other values. So a chunk is handed to DuckDB
only when every file of it carries the CRC-32 of its own bytes that this
project's writer puts in the footer, and the bytes match it
(:func:`~otel_replay.exporters.checksum.checksum_matches`, a few µs a file):
a file of an older version, of another writer, damaged or rewritten makes
its chunk be read file by file by pyarrow. So the guarantees of compaction (a
corrupt file is named and nothing is changed, schema versions never mixed,
nothing lost) do not depend on this path.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import duckdb
import pyarrow as pa

from otel_replay import _duck as duck
from otel_replay.exporters.checksum import checksum_matches
from otel_replay.exporters.id_keys import ID_KEYS_METADATA_KEY

__all__ = ["DUCK_CHUNKS", "DUCK_FILES", "DUCK_MIN_FILES", "duck_read"]

_log = logging.getLogger("otel_replay")

DUCK_CHUNKS = True
"""Whether compaction reads local files a DuckDB chunk at a time (off: every file is read by pyarrow).

DuckDB reads pages pyarrow refuses as the right number of rows with other
values (``tests/storage/test_compact_many_files.py``): :func:`duck_read`
takes no file whose bytes its own checksum does not prove intact.
"""

DUCK_MIN_FILES = 16
"""Below this many files a batch is read file by file (a DuckDB connection and query cost about 2-5 ms)."""

DUCK_FILES = 256
"""Files read by one DuckDB query (2,560 rows of 10-span files; a few MB of Arrow whatever the batch)."""


def _read_as(got: pa.DataType, want: pa.DataType) -> bool:
    """Whether DuckDB's ``got`` is the group's ``want`` but for names a cast changes without touching a value.

    Anything else is refused, not cast: pyarrow casts a struct by its field
    names (a key DuckDB renamed, ``A`` beside ``a`` or a NUL in it, would be
    all NULL), and a DECIMAL wider than 38 digits or an INT96 time comes back
    as a DOUBLE or through microseconds, which casts back to a near value.
    """
    if pa.types.is_timestamp(got) and pa.types.is_timestamp(want):  # Etc/UTC for UTC: the same instants
        # pyarrow reads INT96 as zoneless nanoseconds, and so may a file beside it in the chunk that DuckDB reads
        # first: then DuckDB reads the INT96 values through microseconds as nanoseconds. Zoneless ns: file by file.
        naive_ns = want.tz is None and want.unit == "ns"
        return not naive_ns and got.unit == want.unit and (got.tz is None) == (want.tz is None)
    if pa.types.is_list(got) and pa.types.is_list(want):  # DuckDB names a list's item ``l``
        return _read_as(got.value_type, want.value_type)
    if pa.types.is_struct(got) and pa.types.is_struct(want):
        return [f.name for f in got] == [f.name for f in want] and all(
            _read_as(g.type, w.type) for g, w in zip(got, want, strict=True)
        )
    return bool(got.equals(want))


def duck_read(paths: Sequence[Path | str], schema: pa.Schema, expected_rows: int) -> pa.Table | None:
    """The rows of ``paths`` (local files of one schema group) read by DuckDB, in file order; ``None``: not usable.

    ``schema``: the group's Arrow schema, as pyarrow read the chunk's first
    file (its metadata, less the file's own id keys, is the answer's).
    ``expected_rows``: the rows the files' footers count. ``None`` when DuckDB
    fails on any file, or its answer is not exactly the chunk's columns and
    rows (see the module docstring), or a path holds ``*``, ``?`` or ``[`` (DuckDB
    expands it as a glob, another file's rows among them), or a file's bytes
    are not proved intact by its own checksum (none, or one that does not
    match): the caller then reads the files one by one.
    """
    if not paths or any(c in str(p) for p in paths for c in "*?["):  # DuckDB would expand it as a glob
        return None
    if not all(checksum_matches(p) for p in paths):  # DuckDB may read a damaged page as other values
        return None
    plain = schema.remove_metadata()
    con = duck.connect()
    try:
        # one thread: the scan runs on a compaction worker, beside another reading the next chunk
        con.execute("SET threads = 1")
        con.execute("SET preserve_insertion_order = true")  # rows in file order, as the per-file read gives them
        table = con.sql(
            "SELECT * FROM read_parquet($files, hive_partitioning = false, union_by_name = false)",
            params={"files": [str(p) for p in paths]},
        ).to_arrow_table()
        if table.schema.names != plain.names or not all(
            _read_as(got.type, want.type) for got, want in zip(table.schema, plain, strict=True)
        ):
            return None
        table = table.cast(plain)  # only names: the UTC zone's spelling, a list item's name
    except (duckdb.Error, pa.ArrowException, OSError, ValueError, TypeError) as exc:
        _log.debug("otel-replay: DuckDB could not read %d files (%s); reading them one by one", len(paths), exc)
        return None
    finally:
        con.close()
    if table.num_rows != expected_rows:
        return None
    metadata = {k: v for k, v in (schema.metadata or {}).items() if k != ID_KEYS_METADATA_KEY}
    return table.replace_schema_metadata(metadata)
