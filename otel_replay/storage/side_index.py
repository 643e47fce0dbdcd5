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

A process that looks up one kind in one index again (a warm
:class:`~otel_replay.query.store.Store`) holds that kind's sorted keys in memory
(:class:`_HeldKeys`, within :data:`HELD_KEYS_BYTES`), so each later lookup
is a binary search of an Arrow array, microseconds instead of decoding an
index row group (about 3 ms at 10M spans). The first lookup reads row groups
as before, so a one-shot process (``otel-replay chain``) pays nothing extra.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from functools import lru_cache, partial
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from otel_replay.errors import ConfigError, DatasetError
from otel_replay.exporters.id_keys import GATE_KIND
from otel_replay.exporters.schema import SPANS_DIR
from otel_replay.location import Location, resolve

from .backend import Backend, backend_for
from .manifest import Manifest, RemoteSnapshot, partition_dirs, partition_live_names, remote_partitions, visible_names

__all__ = [
    "HELD_KEYS_BYTES",
    "INDEX_KINDS",
    "INDEX_SCHEMA",
    "KINDS_METADATA_KEY",
    "SEARCHED_KINDS",
    "build_index",
    "file_index_rows",
    "files_for",
    "Listing",
    "index_bytes",
    "indexed_and_tail",
    "merge_index",
    "partition_listing",
    "write_index",
]

INDEX_KINDS = ("correlation_id", "trace_id", "session_id", "record_id", "outcome_decision_id")
"""The span columns the side index maps to files (``outcome_decision_id``: where a decision's outcomes are)."""
SEARCHED_KINDS = (*INDEX_KINDS, GATE_KIND)
"""The kinds :func:`indexed_and_tail` searches by: a gate record's decision id is in no index (every indexed file
may hold it), only in the keys of the files newer than one (:mod:`otel_replay.exporters.id_keys`)."""
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
HELD_KEYS_BYTES = 256 * 2**20
"""The most bytes of index keys a process holds in memory; one kind of one partition holds at most a quarter.

At 10M spans across 1M trade ids (four days) a chain lookup's two kinds
hold 67 MB; record ids (100 MB a day there) stay on disk.
"""
_HOLD_AFTER = 2  # the lookup of one kind in one index that loads its keys (the first reads row groups)
_STALE_SECONDS = 60.0  # a held kind unused this long gives its room to another
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
    """See :func:`_open_index`.

    Raises:
        DatasetError: the file is not a side index (its columns are not :data:`INDEX_SCHEMA`'s): the caller
            then reads every file of the partition.

    """
    actual = {f.name: f.type for f in handle.schema_arrow}
    for f in INDEX_SCHEMA:
        if f.name in ("kind", "key", "file") and actual.get(f.name) not in (pa.string(), pa.large_string()):
            raise DatasetError(f"not a side index: column {f.name} is {actual.get(f.name, 'missing')}, not string")
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


_IMMUTABLE_INDEXES: dict[str, _Index] = {}


def _open_immutable_index(backend: Backend, path: str) -> _Index:
    """An index file of a backend that never rewrites a name (its name is unique per compaction): cached by path."""
    cached = _IMMUTABLE_INDEXES.get(path)
    if cached is None:
        cached = _index_bounds(pq.ParquetFile(backend.open_input(path)))
        if len(_IMMUTABLE_INDEXES) >= 256:
            _IMMUTABLE_INDEXES.pop(next(iter(_IMMUTABLE_INDEXES)))
        _IMMUTABLE_INDEXES[path] = cached
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


class _HeldKeys:
    """One kind's rows of one index file in memory: keys sorted as Arrow sorts them, each with its file."""

    __slots__ = ("files", "keys", "names", "nbytes", "used")

    def __init__(self, keys: pa.Array, files: pa.DictionaryArray) -> None:
        self.keys = keys
        self.files = files.indices
        self.names: list[str] = files.dictionary.to_pylist()
        self.nbytes = keys.nbytes + files.nbytes
        self.used = time.monotonic()

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> str:  # for bisect: one scalar per probe, about 20 probes a key
        value: str = self.keys[i].as_py()
        return value

    def files_of(self, key: str) -> set[str]:
        """The files holding ``key`` (an exact match; Python orders str as Arrow orders UTF-8)."""
        found = set()
        i = bisect.bisect_left(self, key)
        while i < len(self.keys) and self.keys[i].as_py() == key:
            found.add(self.names[self.files[i].as_py()])
            i += 1
        return found


def _kind_groups(bounds: _Bounds, kind: str) -> list[int]:
    return [i for i, (kmin, _, kmax, _) in enumerate(bounds) if kmin <= kind <= kmax]


def _held_size(handle: pq.ParquetFile, groups: list[int]) -> int:
    """About the bytes :func:`_hold` would take: the key column as Parquet stores it plain, and a file id a row."""
    meta = handle.metadata
    key_col = meta.schema.names.index("key")
    size = 0
    for i in groups:
        group = meta.row_group(i)
        size += group.column(key_col).total_uncompressed_size + 4 * group.num_rows
    return size


def _hold(handle: pq.ParquetFile, groups: list[int], kind: str) -> _HeldKeys:
    """Read every row of ``kind`` from an index file: its keys (sorted if the file is not) and their files.

    ``handle`` reads ``kind`` and ``file`` as dictionaries (as they are
    stored): about half the time of decoding them as strings.
    """
    table = handle.read_row_groups(groups, columns=["kind", "key", "file"], use_threads=False)
    table = table.unify_dictionaries().combine_chunks()
    kinds = table.column("kind").combine_chunks()
    known = kinds.dictionary.to_pylist()
    mask = pc.equal(kinds.indices, known.index(kind)) if kind in known else pa.repeat(False, len(kinds))
    if table.column("key").null_count:
        mask = pc.and_(mask, pc.is_valid(table.column("key")))
    if not pc.all(mask).as_py():
        table = table.filter(mask)
    keys = table.column("key").combine_chunks()
    if len(keys) > 1 and not pc.all(pc.less_equal(keys[:-1], keys[1:])).as_py():
        order = pc.sort_indices(keys)  # an index compaction did not write: the binary search needs order
        table, keys = table.take(order), keys.take(order)
    return _HeldKeys(keys, table.column("file").combine_chunks())


_Where = tuple[str, object, str]  # (index path, its stamp, kind)


class _Held:
    """The kinds held in memory, by (index path, stamp, kind); how often each other one was looked up.

    Every lookup reads every partition's index, so the kinds in use are all
    needed at once: when they do not fit, the ones already held stay and the
    rest keep reading row groups (evicting would reload at every lookup).
    Only entries unused for :data:`_STALE_SECONDS` (an index a compaction
    replaced, a kind no longer asked for) make room.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: dict[_Where, _HeldKeys] = {}
        self.nbytes = 0
        self.seen: dict[_Where, int] = {}
        self.declined: set[_Where] = set()

    def get(self, where: _Where) -> _HeldKeys | None:
        """The held keys of ``where``, or ``None`` (then this lookup is counted)."""
        with self.lock:
            held = self.entries.get(where)
            if held is not None:
                held.used = time.monotonic()
                return held
            if len(self.seen) > 4096:
                self.seen.clear()
            self.seen[where] = self.seen.get(where, 0) + 1
            return None

    def _due(self, where: _Where) -> bool:  # under self.lock
        return where not in self.declined and self.seen.get(where, 0) >= _HOLD_AFTER

    def due(self, where: _Where) -> bool:
        """Whether ``where`` was looked up often enough to load, and not declined (a cheap check first)."""
        with self.lock:
            return self._due(where)

    def room_for(self, where: _Where, size_of: Callable[[], int]) -> bool:
        """Whether ``where`` is due (looked up before) and its size fits, making room from stale entries."""
        with self.lock:
            if not self._due(where):
                return False
            size = size_of()
            if size <= HELD_KEYS_BYTES // 4:  # one kind of one partition: a bigger one (record ids) stays on disk
                if self.nbytes + size > HELD_KEYS_BYTES:
                    now = time.monotonic()
                    for stale in [w for w, held in self.entries.items() if now - held.used > _STALE_SECONDS]:
                        self.nbytes -= self.entries.pop(stale).nbytes
                        self.declined.clear()  # room made: what was declined may fit now
                if self.nbytes + size <= HELD_KEYS_BYTES:
                    return True
            if len(self.declined) > 4096:
                self.declined.clear()
            self.declined.add(where)
            return False

    def put(self, where: _Where, held: _HeldKeys) -> None:
        with self.lock:
            previous = self.entries.pop(where, None)
            self.nbytes += held.nbytes - (previous.nbytes if previous is not None else 0)
            self.entries[where] = held
            self.seen.pop(where, None)

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.seen.clear()
            self.declined.clear()
            self.nbytes = 0


_HELD = _Held()


def _lookup(
    path: Path | str, wanted: list[tuple[str, str]], backend: Backend, loads: list[int] | None = None
) -> set[str] | None:
    """File names the index at ``path`` maps any of ``wanted`` (kind, key) to.

    ``None`` when the index does not cover one of the wanted kinds (written
    before that kind was indexed): every file of the partition may hold it.
    A kind looked up in this index before is answered from memory
    (:class:`_HeldKeys`); otherwise the row groups that may hold each key are
    read. ``loads`` (a one-item list, decremented): how many kinds this call
    may still load into memory; ``None``: none (a lookup spreads the loads
    of a warm store over its next lookups instead of stalling one).
    """
    try:
        if backend.immutable_files:
            stamp: object = None  # the index's name is unique per compaction and never rewritten
            handle, bounds, regular, irregular, kinds = _open_immutable_index(backend, str(path))
        else:
            stat = backend.stamp(str(path))
            stamp = stat
            handle, bounds, regular, irregular, kinds = _open_index(str(path), stat)
    except (OSError, pa.ArrowException, DatasetError) as exc:
        raise DatasetError(f"cannot read the side index {path}: {str(exc).splitlines()[0]}") from exc
    if any(kind not in kinds for kind, _ in wanted):
        return None
    found: set[str] = set()
    unheld: list[tuple[str, str]] = []
    for kind in sorted({kind for kind, _ in wanted}):
        where = (str(path), stamp, kind)
        held = _HELD.get(where)
        if held is None and loads is not None and loads[0] > 0 and _HELD.due(where):
            groups = _kind_groups(bounds, kind)
            if _HELD.room_for(where, partial(_held_size, handle, groups)):
                loads[0] -= 1
                try:
                    source = backend.open_input(str(path))
                    reader = pq.ParquetFile(source, read_dictionary=["kind", "file"], metadata=handle.metadata)
                    held = _hold(reader, groups, kind)
                except (OSError, pa.ArrowException) as exc:
                    raise DatasetError(f"cannot read the side index {path}: {str(exc).splitlines()[0]}") from exc
                _HELD.put(where, held)
        mine = [pair for pair in wanted if pair[0] == kind]
        if held is None:
            unheld.extend(mine)
        else:
            for _, key in mine:
                found |= held.files_of(key)
    if unheld:
        found |= _read_groups(path, handle, bounds, regular, irregular, unheld)
    return found


def _read_groups(
    path: Path | str,
    handle: pq.ParquetFile,
    bounds: _Bounds,
    regular: list[int],
    irregular: list[int],
    wanted: list[tuple[str, str]],
) -> set[str]:
    """:func:`_lookup` by reading the index row groups whose bounds may hold each of ``wanted``."""
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
    (what :class:`~otel_replay.query.store.Store` does between refreshes).

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


Listing = list[tuple[str, Manifest | None, list[str], str | None]]
"""Each partition as (path prefix of its files, manifest, live file names, its index's path or ``None``)."""


def partition_listing(dataset: str | os.PathLike[str] | Location, snapshot: RemoteSnapshot | None = None) -> Listing:
    """The partitions :func:`indexed_and_tail` searches, listed now (or from a remote ``snapshot``).

    Raises:
        DatasetError: a manifest cannot be read or names a missing file.

    """
    return list(_partitions(resolve(dataset), snapshot))


def indexed_and_tail(
    dataset: str | os.PathLike[str] | Location,
    wanted: Sequence[tuple[str, str]],
    snapshot: RemoteSnapshot | None = None,
    listing: Listing | None = None,
) -> tuple[list[str], list[str]] | None:
    """:func:`files_for` in two parts: (indexed files that may hold one of ``wanted``, live files no index covers).

    ``wanted`` holds (kind, id) pairs, each kind one of :data:`SEARCHED_KINDS`.
    The second list is what :class:`~.tail_index.TailIndex` narrows further.
    ``None`` when no partition has a side index. ``listing``: search the
    partitions as :func:`partition_listing` listed them (a lookup that asks
    twice, for a chain and then for its outcomes, answers both over one
    listing) instead of listing them again.

    Raises:
        ConfigError: no id given, or a kind that is not indexed.
        DatasetError: a manifest or index cannot be read.

    """
    if not wanted:
        raise ConfigError(
            "files_for needs at least one id (correlation_id, trace_id, session_id, record_id or outcome_decision_id)"
        )
    unknown = sorted({kind for kind, _ in wanted if kind not in SEARCHED_KINDS})
    if unknown:
        raise ConfigError(f"not an indexed id kind: {', '.join(unknown)} (one of {', '.join(SEARCHED_KINDS)})")
    location = resolve(dataset)
    backend = backend_for(location)
    hits: list[str] = []
    tail: list[str] = []
    indexed = False
    loads = [1]  # one kind of one index loaded into memory per call: about 50 ms at 10M spans
    for head, manifest, live, index in listing if listing is not None else _partitions(location, snapshot):
        if manifest is None or index is None:
            tail.extend(head + name for name in live)
            continue
        indexed = True
        found = _lookup(index, list(wanted), backend, loads)
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
    if backend_for(location).snapshots_listing:  # listed once per refresh (a snapshot) or now
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
