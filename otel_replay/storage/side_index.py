"""The side index: id -> the compacted files that hold it, with min/max start time.

Compaction writes one small Parquet file per partition (``_index-g<gen>.pq``;
the ``.pq`` suffix keeps it out of ``*.parquet`` globs) with one row per
(id kind, id, file): ``kind`` (``correlation_id``, ``trace_id``,
``session_id``, ``record_id``), ``key``, ``file`` (a name in the partition),
``min_start``, ``max_start``, ``rows``; sorted by (kind, key) with small row
groups, so a lookup reads one row group.

:func:`files_for` answers "which files may hold this id": for each partition,
the indexed files that hold it plus every live file the index does not cover
(arrivals newer than the last compaction), so a query over its answer is as
complete as one over every file.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from otel_replay.errors import ConfigError, DatasetError
from otel_replay.exporters.schema import SPANS_DIR
from otel_replay.location import Location, resolve

from .manifest import RemoteSnapshot, partition_dirs, partition_live_names

__all__ = ["INDEX_KINDS", "INDEX_SCHEMA", "build_index", "files_for", "index_bytes", "indexed_and_tail", "write_index"]

INDEX_KINDS = ("correlation_id", "trace_id", "session_id", "record_id")
"""The span columns the side index maps to files."""

INDEX_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("file", pa.string(), nullable=False),
        pa.field("min_start", pa.timestamp("ns", tz="UTC")),
        pa.field("max_start", pa.timestamp("ns", tz="UTC")),
        pa.field("rows", pa.int64(), nullable=False),
    ]
)
_INDEX_ROW_GROUP = 2048


def build_index(parts: Sequence[tuple[str, pa.Table]]) -> pa.Table:
    """The index rows of ``parts`` (file name, the rows written to it), sorted by (kind, key)."""
    pieces: list[pa.Table] = []
    for name, table in parts:
        for kind in INDEX_KINDS:
            if kind not in table.column_names:
                continue
            sub = table.select([kind, "start_time"]).filter(pc.is_valid(table.column(kind)))
            if sub.num_rows == 0:
                continue
            grouped = sub.group_by(kind).aggregate([("start_time", "min"), ("start_time", "max"), ([], "count_all")])
            n = grouped.num_rows
            pieces.append(
                pa.table(
                    {
                        "kind": pa.array([kind] * n, pa.string()),
                        "key": grouped.column(kind).cast(pa.string()),
                        "file": pa.array([name] * n, pa.string()),
                        "min_start": grouped.column("start_time_min"),
                        "max_start": grouped.column("start_time_max"),
                        "rows": grouped.column("count_all").cast(pa.int64()),
                    },
                    schema=INDEX_SCHEMA,
                )
            )
    if not pieces:
        return INDEX_SCHEMA.empty_table()
    table = pa.concat_tables(pieces)
    return table.take(pc.sort_indices(table, [("kind", "ascending"), ("key", "ascending"), ("file", "ascending")]))


def _write_to(table: pa.Table, sink: object) -> None:
    pq.write_table(
        table,
        sink,
        compression="zstd",
        row_group_size=_INDEX_ROW_GROUP,
        use_dictionary=["kind", "file"],
        write_statistics=True,
    )


def write_index(table: pa.Table, path: Path) -> None:
    """Write an index table to ``path`` (the caller renames it into place)."""
    with open(path, "wb") as handle:
        _write_to(table, handle)
        handle.flush()
        os.fsync(handle.fileno())


def index_bytes(table: pa.Table) -> bytes:
    """An index table as the bytes of its Parquet file (for one object PUT)."""
    sink = pa.BufferOutputStream()
    _write_to(table, sink)
    return bytes(sink.getvalue().to_pybytes())


@lru_cache(maxsize=256)
def _open_index(path: str, stamp: tuple[int, int]) -> tuple[pq.ParquetFile, list[tuple[str, str, str, str]]]:
    """An open index file and each row group's (min kind, min key, max kind, max key), cached by size and mtime."""
    return _index_bounds(pq.ParquetFile(path))


def _index_bounds(handle: pq.ParquetFile) -> tuple[pq.ParquetFile, list[tuple[str, str, str, str]]]:
    meta = handle.metadata
    kind_col, key_col = meta.schema.names.index("kind"), meta.schema.names.index("key")
    bounds = []
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        ks, vs = rg.column(kind_col).statistics, rg.column(key_col).statistics
        if ks is None or vs is None or not ks.has_min_max or not vs.has_min_max:
            bounds.append(("", "", "\uffff", "\uffff"))
        else:
            bounds.append((ks.min, vs.min, ks.max, vs.max))
    return handle, bounds


_REMOTE_INDEXES: dict[str, tuple[pq.ParquetFile, list[tuple[str, str, str, str]]]] = {}


def _open_remote_index(location: Location, path: str) -> tuple[pq.ParquetFile, list[tuple[str, str, str, str]]]:
    """A remote index file: its name is unique per compaction and objects are never rewritten, so cached by path."""
    cached = _REMOTE_INDEXES.get(path)
    if cached is None:
        cached = _index_bounds(pq.ParquetFile(location.fs.open_input_file(location.fs_path(path))))
        if len(_REMOTE_INDEXES) >= 256:
            _REMOTE_INDEXES.pop(next(iter(_REMOTE_INDEXES)))
        _REMOTE_INDEXES[path] = cached
    return cached


def _lookup(path: Path | str, wanted: list[tuple[str, str]], location: Location | None = None) -> set[str]:
    """File names the index at ``path`` maps any of ``wanted`` (kind, key) to."""
    try:
        if location is not None:
            handle, bounds = _open_remote_index(location, str(path))
        else:
            st = os.stat(path)
            handle, bounds = _open_index(str(path), (st.st_size, st.st_mtime_ns))
    except (OSError, pa.ArrowException) as exc:
        raise DatasetError(f"cannot read the side index {path}: {str(exc).splitlines()[0]}") from exc
    groups = [
        i
        for i, (kmin, vmin, kmax, vmax) in enumerate(bounds)
        if any((kmin, vmin) <= (kind, key) <= (kmax, vmax) for kind, key in wanted)
    ]
    if not groups:
        return set()
    table = handle.read_row_groups(groups, columns=["kind", "key", "file"])
    mask = None
    for kind, key in wanted:
        hit = pc.and_(pc.equal(table.column("kind"), kind), pc.equal(table.column("key"), key))
        mask = hit if mask is None else pc.or_(mask, hit)
    return set(table.filter(mask).column("file").to_pylist())


def files_for(
    dataset: str | os.PathLike[str] | Location,
    *,
    correlation_id: str | None = None,
    trace_id: str | None = None,
    session_id: str | None = None,
    record_id: str | None = None,
    snapshot: RemoteSnapshot | None = None,
) -> list[str] | None:
    """The live files that may hold rows with any of the given ids, or ``None`` when nothing is indexed.

    Complete at every moment: a partition without an index contributes all its
    live files, and an indexed one its indexed files holding an id plus every
    live file newer than its index. ``None`` means no partition has a side
    index yet (query every file). An empty list means no file can hold the id.
    ``snapshot`` (remote datasets only): answer over that listing, taken by
    :func:`~.manifest.remote_partitions`, instead of listing the bucket again
    (what :class:`~otel_replay.store.Store` does between refreshes).

    Raises:
        ConfigError: no id given.
        DatasetError: a manifest or index cannot be read.

    """
    given = {"correlation_id": correlation_id, "trace_id": trace_id, "session_id": session_id, "record_id": record_id}
    split = indexed_and_tail(dataset, [(kind, str(key)) for kind, key in given.items() if key is not None], snapshot)
    return None if split is None else sorted(split[0] + split[1])


def indexed_and_tail(
    dataset: str | os.PathLike[str] | Location,
    wanted: Sequence[tuple[str, str]],
    snapshot: RemoteSnapshot | None = None,
) -> tuple[list[str], list[str]] | None:
    """:func:`files_for` in two parts: (indexed files holding one of ``wanted``, live files no index covers).

    ``wanted`` holds (kind, id) pairs, kind one of :data:`INDEX_KINDS`. The
    second list is what :class:`~.tail_index.TailIndex` narrows further.
    ``None`` when no partition has a side index.

    Raises:
        ConfigError: no id given, or an unknown kind.
        DatasetError: a manifest or index cannot be read.

    """
    if not wanted:
        raise ConfigError("files_for needs at least one id (correlation_id, trace_id, session_id or record_id)")
    unknown = sorted({kind for kind, _ in wanted if kind not in INDEX_KINDS})
    if unknown:
        raise ConfigError(f"not an indexed id kind: {', '.join(unknown)} (one of {', '.join(INDEX_KINDS)})")
    location = resolve(dataset)
    if location.remote:
        return _remote_indexed_and_tail(location, list(wanted), snapshot)
    hits: list[str] = []
    tail: list[str] = []
    indexed = False
    for partition in partition_dirs(location.root):
        manifest, live = partition_live_names(partition)
        head = f"{partition}{os.sep}"
        if manifest is None or manifest.index is None:
            tail.extend(head + name for name in live)
            continue
        indexed = True
        found = _lookup(partition / manifest.index, list(wanted))
        covered = set(manifest.files)
        for name in live:
            if name not in covered:
                tail.append(head + name)
            elif name in found:
                hits.append(head + name)
    return (hits, tail) if indexed else None


def _remote_indexed_and_tail(
    location: Location, wanted: list[tuple[str, str]], snapshot: RemoteSnapshot | None
) -> tuple[list[str], list[str]] | None:
    """:func:`indexed_and_tail` on an object store: the same rule over :func:`~.manifest.remote_partitions`."""
    from .manifest import remote_partitions, visible_names

    partitions, _ = snapshot if snapshot is not None else remote_partitions(location)
    hits: list[str] = []
    tail: list[str] = []
    indexed = False
    for head, manifest, names in partitions:
        url = location.join(SPANS_DIR, head)
        live = visible_names(names, manifest)
        if manifest is None or manifest.index is None:
            tail.extend(f"{url}/{name}" for name in live)
            continue
        indexed = True
        found = _lookup(f"{url}/{manifest.index}", wanted, location)
        covered = set(manifest.files)
        for name in live:
            if name not in covered:
                tail.append(f"{url}/{name}")
            elif name in found:
                hits.append(f"{url}/{name}")
    return (hits, tail) if indexed else None
