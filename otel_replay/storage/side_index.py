"""The side index: id -> the compacted files that hold it, with min/max start time.

Compaction writes one small Parquet file per partition (``_index-g<gen>.pq``;
the ``.pq`` suffix keeps it out of ``*.parquet`` globs) with one row per
(id kind, id, file): ``kind`` (``correlation_id``, ``trace_id``,
``session_id``, ``record_id``, ``outcome_decision_id``), ``key``, ``file`` (a
name in the partition), ``min_start``, ``max_start``, ``rows``; sorted by
(kind, key) with small row groups, so a lookup reads one row group per id.
The file's metadata lists the kinds it covers (``otel_replay.index_kinds``):
an index written before a kind was added says nothing about it, so a lookup
by that kind reads every file of the partition.

:func:`files_for` answers "which files may hold this id": for each partition,
the indexed files that hold it plus every live file the index does not cover
(arrivals newer than the last compaction), so a query over its answer is as
complete as one over every file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from functools import lru_cache
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from otel_replay.errors import ConfigError, DatasetError
from otel_replay.exporters.schema import SPANS_DIR
from otel_replay.location import Location, resolve

from .manifest import Manifest, RemoteSnapshot, partition_dirs, partition_live_names

__all__ = [
    "INDEX_KINDS",
    "INDEX_SCHEMA",
    "KINDS_METADATA_KEY",
    "build_index",
    "file_index_rows",
    "files_for",
    "index_bytes",
    "indexed_and_tail",
    "merge_index",
    "write_index",
]

INDEX_KINDS = ("correlation_id", "trace_id", "session_id", "record_id", "outcome_decision_id")
"""The span columns the side index maps to files (``outcome_decision_id``: where a decision's outcomes are)."""
KINDS_METADATA_KEY = b"otel_replay.index_kinds"
_LEGACY_KINDS = frozenset(("correlation_id", "trace_id", "session_id", "record_id"))  # an index without the key

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
_INDEX_ROW_GROUP = 2048  # a lookup decodes one group per id (0.2 ms); fewer groups keep a cold open short


def file_index_rows(table: pa.Table) -> dict[str, pa.Table]:
    """The index rows of one file holding ``table``'s rows, per kind with values: key, min_start, max_start, rows.

    Unsorted, and without the ``kind`` and ``file`` columns (added once, by
    :func:`build_index` or :func:`merge_index`): compaction holds these for
    every file it wrote until the partition's index is merged.
    """
    found: dict[str, pa.Table] = {}
    for kind in INDEX_KINDS:
        if kind not in table.column_names:
            continue
        sub = table.select([kind, "start_time"]).filter(pc.is_valid(table.column(kind)))
        if sub.num_rows == 0:
            continue
        grouped = sub.group_by(kind).aggregate([("start_time", "min"), ("start_time", "max"), ([], "count_all")])
        found[kind] = pa.table(
            {
                "key": grouped.column(kind).cast(pa.string()),
                "min_start": grouped.column("start_time_min"),
                "max_start": grouped.column("start_time_max"),
                "rows": grouped.column("count_all").cast(pa.int64()),
            }
        )
    return found


def _labelled(kind: str, name: str, rows: pa.Table) -> pa.Table:
    """A file's rows of one kind (:func:`file_index_rows`) as index rows, with their ``kind`` and ``file``."""
    n = rows.num_rows
    return pa.table(
        {
            "kind": pa.repeat(pa.scalar(kind, pa.string()), n),
            "key": rows.column("key"),
            "file": pa.repeat(pa.scalar(name, pa.string()), n),
            "min_start": rows.column("min_start"),
            "max_start": rows.column("max_start"),
            "rows": rows.column("rows"),
        },
        schema=INDEX_SCHEMA,
    )


def _covered(column_sets: Sequence[Collection[str]]) -> dict[bytes, bytes]:
    """The index metadata: kinds that are a column of every file (a version 1 file has no ``outcome_decision_id``)."""
    covered = [kind for kind in INDEX_KINDS if all(kind in columns for columns in column_sets)]
    return {KINDS_METADATA_KEY: ",".join(covered).encode()}


def build_index(parts: Sequence[tuple[str, pa.Table]]) -> pa.Table:
    """The index rows of ``parts`` (file name, the rows written to it), sorted by (kind, key, file).

    The table's metadata lists the kinds it covers: those that are a column
    of every part (a version 1 file has no ``outcome_decision_id``).
    """
    metadata = _covered([table.column_names for _, table in parts])
    pieces = [
        _labelled(kind, name, rows) for name, table in parts for kind, rows in file_index_rows(table).items()
    ]
    if not pieces:
        return INDEX_SCHEMA.empty_table().replace_schema_metadata(metadata)
    table = pa.concat_tables(pieces)
    table = table.take(pc.sort_indices(table, [("kind", "ascending"), ("key", "ascending"), ("file", "ascending")]))
    return table.replace_schema_metadata(metadata)


def _in_key_order(kind_and_files: tuple[str, list[tuple[str, pa.Table]]]) -> pa.Table:
    """One kind's rows (files in name order) sorted by key; the stable sort keeps file order within a key."""
    kind, files = kind_and_files
    rows = pa.concat_tables([_labelled(kind, name, part) for name, part in files]).combine_chunks()
    return rows.take(pc.sort_indices(rows.column("key")))


def merge_index(
    parts: Sequence[tuple[str, Collection[str], Mapping[str, pa.Table]]],
    map_each: Callable[
        [Callable[[tuple[str, list[tuple[str, pa.Table]]]], pa.Table], list[tuple[str, list[tuple[str, pa.Table]]]]],
        Iterable[pa.Table],
    ] = map,
) -> pa.Table:
    """:func:`build_index`'s table from per-file rows: (file name, the file's columns, its :func:`file_index_rows`).

    Equal to :func:`build_index` of the files, row for row, but cheaper: a
    table sort on three string keys is replaced by one stable sort on ``key``
    per kind, over rows laid out in file name order (so ties on a key keep
    (key, file) order), kinds concatenated in name order. ``map_each`` runs
    the per-kind sorts (``map``, or one that spreads them over threads and
    returns their results in order).
    """
    metadata = _covered([columns for _, columns, _ in parts])
    by_kind: dict[str, list[tuple[str, pa.Table]]] = {}
    for name, _, kinds in sorted(parts, key=lambda part: part[0]):
        for kind, rows in kinds.items():
            if rows.num_rows:
                by_kind.setdefault(kind, []).append((name, rows))
    if not by_kind:
        return INDEX_SCHEMA.empty_table().replace_schema_metadata(metadata)
    ordered = list(map_each(_in_key_order, [(kind, by_kind[kind]) for kind in sorted(by_kind)]))
    return pa.concat_tables(ordered).replace_schema_metadata(metadata)


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


_Bounds = list[tuple[str, str, str, str]]
# handle, each group's bounds, the groups of one kind in (kind, key) order, the others, the kinds covered
_Index = tuple[pq.ParquetFile, _Bounds, list[int], list[int], frozenset[str]]


@lru_cache(maxsize=256)
def _open_index(path: str, stamp: tuple[int, int]) -> _Index:
    """An open index file, each row group's (min kind, min key, max kind, max key) and the kinds it covers.

    Cached by size and mtime.
    """
    return _index_bounds(pq.ParquetFile(path))


def _index_bounds(handle: pq.ParquetFile) -> _Index:
    meta = handle.metadata
    listed = (meta.metadata or {}).get(KINDS_METADATA_KEY)
    kinds = frozenset(listed.decode("utf-8", "replace").split(",")) if listed is not None else _LEGACY_KINDS
    kind_col, key_col = meta.schema.names.index("kind"), meta.schema.names.index("key")
    bounds = []
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        ks, vs = rg.column(kind_col).statistics, rg.column(key_col).statistics
        if ks is None or vs is None or not ks.has_min_max or not vs.has_min_max:
            bounds.append(("", "", "\uffff", "\uffff"))
        else:
            bounds.append((ks.min, vs.min, ks.max, vs.max))
    regular, irregular = _split(bounds)
    return handle, bounds, regular, irregular, kinds


def _split(bounds: _Bounds) -> tuple[list[int], list[int]]:
    """The row groups holding one kind, when their key ranges follow each other (binary search holds), and the rest.

    A group that spans two kinds has bounds mixing both (its key range is
    not its rows' range within a kind): it is checked on its own.
    """
    regular = [i for i, (kmin, _, kmax, _) in enumerate(bounds) if kmin == kmax and kmin != ""]
    for a, b in zip(regular, regular[1:], strict=False):
        if (bounds[a][2], bounds[a][3]) > (bounds[b][0], bounds[b][1]) or bounds[a][:2] > bounds[a][2:]:
            return [], list(range(len(bounds)))
    irregular = sorted(set(range(len(bounds))) - set(regular))
    return regular, irregular


_REMOTE_INDEXES: dict[str, _Index] = {}


def _open_remote_index(location: Location, path: str) -> _Index:
    """A remote index file: its name is unique per compaction and objects are never rewritten, so cached by path."""
    cached = _REMOTE_INDEXES.get(path)
    if cached is None:
        cached = _index_bounds(pq.ParquetFile(location.fs.open_input_file(location.fs_path(path))))
        if len(_REMOTE_INDEXES) >= 256:
            _REMOTE_INDEXES.pop(next(iter(_REMOTE_INDEXES)))
        _REMOTE_INDEXES[path] = cached
    return cached


def _groups_holding(bounds: _Bounds, regular: list[int], irregular: list[int], pair: tuple[str, str]) -> list[int]:
    """The row groups whose (kind, key) range holds ``pair``: a binary search of ``regular``, a scan of the rest."""
    found = [i for i in irregular if bounds[i][:2] <= pair <= bounds[i][2:]]
    lo, hi = 0, len(regular)
    while lo < hi:  # the first regular group whose max is not below the pair
        mid = (lo + hi) // 2
        if bounds[regular[mid]][2:] < pair:
            lo = mid + 1
        else:
            hi = mid
    for i in regular[lo:]:  # a key's rows (one per file) may run over several groups
        if bounds[i][:2] > pair:
            break
        found.append(i)
    return found


def _lookup(path: Path | str, wanted: list[tuple[str, str]], location: Location | None = None) -> set[str] | None:
    """File names the index at ``path`` maps any of ``wanted`` (kind, key) to.

    ``None`` when the index does not cover one of the wanted kinds (written
    before that kind was indexed): every file of the partition may hold it.
    """
    try:
        if location is not None:
            handle, bounds, regular, irregular, kinds = _open_remote_index(location, str(path))
        else:
            st = os.stat(path)
            handle, bounds, regular, irregular, kinds = _open_index(str(path), (st.st_size, st.st_mtime_ns))
    except (OSError, pa.ArrowException) as exc:
        raise DatasetError(f"cannot read the side index {path}: {str(exc).splitlines()[0]}") from exc
    if any(kind not in kinds for kind, _ in wanted):
        return None
    groups = sorted({i for pair in wanted for i in _groups_holding(bounds, regular, irregular, pair)})
    if not groups:
        return set()
    try:
        table = handle.read_row_groups(groups, columns=["kind", "key", "file"], use_threads=False)
    except (OSError, pa.ArrowException) as exc:
        raise DatasetError(f"cannot read the side index {path}: {str(exc).splitlines()[0]}") from exc
    # One vectorised pass for the keys, then the few hits in Python for their kind.
    hits = table.filter(pc.is_in(table.column("key"), pa.array([key for _, key in wanted], pa.string())))
    pairs = set(wanted)
    columns = (hits.column(name).to_pylist() for name in ("kind", "key", "file"))
    return {file for kind, key, file in zip(*columns, strict=True) if (kind, key) in pairs}


def files_for(
    dataset: str | os.PathLike[str] | Location,
    *,
    correlation_id: str | None = None,
    trace_id: str | None = None,
    session_id: str | None = None,
    record_id: str | None = None,
    outcome_decision_id: str | Sequence[str] | None = None,
    snapshot: RemoteSnapshot | None = None,
) -> list[str] | None:
    """The live files that may hold rows with any of the given ids, or ``None`` when nothing is indexed.

    ``outcome_decision_id`` (one decision id or several) asks for the files
    holding outcome spans of those decisions (the typed column of storage
    schema version 2; a version 1 file keeps it in its JSON and is never
    indexed by it, nor is a partition whose index predates the kind: all its
    files are returned).

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
    wanted = [(kind, str(key)) for kind, key in given.items() if key is not None]
    if isinstance(outcome_decision_id, str):
        outcome_decision_id = [outcome_decision_id]
    wanted += [("outcome_decision_id", str(key)) for key in outcome_decision_id or () if key is not None]
    split = indexed_and_tail(dataset, wanted, snapshot)
    return None if split is None else sorted(split[0] + split[1])


def indexed_and_tail(
    dataset: str | os.PathLike[str] | Location,
    wanted: Sequence[tuple[str, str]],
    snapshot: RemoteSnapshot | None = None,
) -> tuple[list[str], list[str]] | None:
    """:func:`files_for` in two parts: (indexed files that may hold one of ``wanted``, live files no index covers).

    ``wanted`` holds (kind, id) pairs, each kind one of :data:`INDEX_KINDS`.
    The second list is what :class:`~.tail_index.TailIndex` narrows further.
    ``None`` when no partition has a side index.

    Raises:
        ConfigError: no id given, or a kind that is not indexed.
        DatasetError: a manifest or index cannot be read.

    """
    if not wanted:
        raise ConfigError(
            "files_for needs at least one id (correlation_id, trace_id, session_id, record_id or outcome_decision_id)"
        )
    unknown = sorted({kind for kind, _ in wanted if kind not in INDEX_KINDS})
    if unknown:
        raise ConfigError(f"not an indexed id kind: {', '.join(unknown)} (one of {', '.join(INDEX_KINDS)})")
    location = resolve(dataset)
    hits: list[str] = []
    tail: list[str] = []
    indexed = False
    for head, manifest, live, index in _partitions(location, snapshot):
        if manifest is None or index is None:
            tail.extend(head + name for name in live)
            continue
        indexed = True
        found = _lookup(index, list(wanted), location if location.remote else None)
        covered = set(manifest.files)
        for name in live:
            if name not in covered:
                tail.append(head + name)
            elif found is None or name in found:
                hits.append(head + name)
    return (hits, tail) if indexed else None


def _partitions(
    location: Location, snapshot: RemoteSnapshot | None
) -> Iterator[tuple[str, Manifest | None, list[str], str | None]]:
    """Each partition as (path prefix of its files, manifest, live file names, its index's path or ``None``)."""
    if location.remote:
        from .manifest import remote_partitions, visible_names

        partitions, _ = snapshot if snapshot is not None else remote_partitions(location)
        for head, manifest, names in partitions:
            url = location.join(SPANS_DIR, head)
            index = f"{url}/{manifest.index}" if manifest is not None and manifest.index else None
            yield f"{url}/", manifest, visible_names(names, manifest), index
        return
    for partition in partition_dirs(location.root):
        manifest, live = partition_live_names(partition)
        index = str(partition / manifest.index) if manifest is not None and manifest.index else None
        yield f"{partition}{os.sep}", manifest, live, index
