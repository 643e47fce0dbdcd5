"""Compaction's steps shared by both backends (:mod:`compact` on local disk, :mod:`compact_s3` on an object store).

Options and reports; finding the (trace_id, span_id) pairs stored more than
once and the exact duplicate rows among them; grouping files by schema;
reading a group in bounded batches (footers parsed once, files read ahead on
worker threads); the sort order; writing one compacted file; and the
manifest a run swaps in. See :mod:`compact` for the run as a whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow._parquet import ParquetReader

from otel_replay import _duck as duck
from otel_replay.errors import ConfigError, CorruptFileError, DatasetError
from otel_replay.exporters.checksum import CHECKSUM_KEY, UNSTAMPED, stamp
from otel_replay.exporters.id_keys import ID_KEYS_METADATA_KEY
from otel_replay.exporters.schema import SCHEMA_METADATA_KEY
from otel_replay.location import Location, register_with

from .compact_duck import DUCK_CHUNKS, DUCK_FILES, DUCK_MIN_FILES, duck_read
from .compact_footer import footer_head
from .compact_report import CompactReport, PartitionReport, peak_rss
from .facts import facts_of_index
from .manifest import Manifest
from .side_index import INDEX_KINDS
from .span_columns import check_version, has_coarse_times, schema_problem, time_range_problem

__all__ = [
    "BLOOM_COLUMNS",
    "DEFAULT_GRACE_SECONDS",
    "DEFAULT_THREADS",
    "DICTIONARY_COLUMNS",
    "MAX_ROWS",
    "SORT_KEY",
    "CompactReport",
    "Options",
    "PartitionReport",
    "Seen",
    "Workers",
    "plan_batches",
    "exact_duplicates",
    "peak_rss",
    "read_files",
    "repeated_in",
    "repeated_keys",
    "schema_groups",
    "sort_order",
    "swapped_manifest",
    "write_file",
]

P = TypeVar("P", Path, str)
R = TypeVar("R")
T = TypeVar("T")
A = ParamSpec("A")


SORT_KEY = ("correlation_id", "trace_id", "start_time", "span_id")
"""The order compacted files are written in."""

BLOOM_COLUMNS = ("trace_id", "span_id", "correlation_id", "session_id", "record_id", "outcome_decision_id")
"""Id columns with a Parquet bloom filter in compacted files (a chain finds its outcomes by outcome_decision_id)."""

DICTIONARY_COLUMNS = (
    "name",
    "kind",
    "service_name",
    "scope_name",
    "scope_version",
    "status_code",
    "status_message",
    "agent_id",
    "replay_kind",
    "decision_type",
    "resource_attributes",
)
"""Low-cardinality columns written with dictionary encoding (the rest plain)."""

DEFAULT_GRACE_SECONDS = 600.0
"""How long superseded files stay on disk for readers that listed them before a swap."""

DEFAULT_THREADS = 2
"""Worker threads per compaction: files written, index rows grouped and facts extracted side by side."""

MAX_ROWS = 2**31 - 1
"""Largest row count (file, row group, batch) or thread count :class:`Options` accepts."""


@dataclass(frozen=True)
class Options:
    """How a compaction run writes (see :func:`compact`), checked once when made.

    Raises:
        ConfigError: a size, a thread count or the grace period is out of range.

    """

    target_rows: int = 131_072
    row_group_rows: int = 16_384
    max_batch_rows: int = 1_000_000
    bloom: bool = True
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    threads: int = DEFAULT_THREADS
    drop_missing: bool = False

    def __post_init__(self) -> None:
        """Refuse sizes and counts below 1, above :data:`MAX_ROWS` (or not integers) and a bad grace period."""
        for name in ("target_rows", "row_group_rows", "max_batch_rows", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r} must be a positive integer")
            if value > MAX_ROWS:  # past this, Arrow and Parquet fail with a message naming no option
                raise ConfigError(f"{name}={value!r} must be at most {MAX_ROWS}")
        if not self.grace_seconds >= 0 or self.grace_seconds == float("inf"):
            raise ConfigError(f"grace_seconds={self.grace_seconds!r} must be a finite number >= 0")


class Workers:
    """Where compaction's independent work runs: a pool of ``threads`` threads, or inline when ``threads`` is 1.

    pyarrow and DuckDB release the GIL while they encode, compress, group and
    scan, so on several cores files are written, their index rows grouped and
    the facts extracted at the same time as the next sort. Results are always
    taken in submission order, so output does not depend on ``threads``.
    """

    def __init__(self, threads: int) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="otel-replay-compact") if threads > 1 else None

    def submit(self, fn: Callable[A, R], /, *args: A.args, **kwargs: A.kwargs) -> Future[R]:
        """Run ``fn(*args, **kwargs)`` on a worker (inline with one thread: its error is raised at ``result()``)."""
        if self._pool is not None:
            return self._pool.submit(fn, *args, **kwargs)
        done: Future[R] = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except Exception as exc:  # raised by result(), where a worker's would be
            done.set_exception(exc)
        return done

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """``fn`` of each of ``items`` on the workers, results in order."""
        return [future.result() for future in [self.submit(fn, item) for item in items]]

    def close(self, *, cancel: bool = False) -> None:
        """Wait for every submitted task (dropping those not started when ``cancel``): none outlives a partition."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=cancel)


def _plain_type(t: pa.DataType) -> pa.DataType:
    """``t`` with timestamps as int64 (so rows compare as Python values without losing nanoseconds)."""
    if pa.types.is_timestamp(t):
        return pa.int64()
    if pa.types.is_list(t):
        return pa.list_(_plain_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_plain_type(f.type)) for f in t])
    return t


def repeated_keys(files: Sequence[Path | str], location: Location | None = None) -> pa.Table:
    """(t, s, n): every (trace_id, span_id) stored more than once across ``files``, and how many times.

    DuckDB reads only those two columns; a path DuckDB would expand as a
    glob (``*``, ``?``, ``[``: ``ds[1]`` would read a sibling ``ds1``) is
    read by pyarrow instead, as every other file of ``files``.
    """
    if any(c in str(p) for p in files for c in "*?["):
        return repeated_in(pa.concat_tables([_ids_of(path, location) for path in files]))
    con = duck.connect()
    try:
        if location is not None:
            register_with(con, location)
        return con.sql(
            "SELECT trace_id AS t, span_id AS s, count(*) AS n FROM read_parquet($files) GROUP BY ALL HAVING n > 1",
            params={"files": [str(p) for p in files]},
        ).to_arrow_table()
    except duckdb.Error as exc:
        _name_unreadable_ids(files, location)  # a damaged file: named, rather than the partition
        where = str(files[0]).rpartition("/")[0]
        raise DatasetError(f"scanning span ids in {where}: {str(exc).splitlines()[0]}") from exc
    finally:
        con.close()


def _ids_of(path: Path | str, location: Location | None) -> pa.Table:
    """The ``trace_id`` and ``span_id`` columns of one file, read by pyarrow (:class:`CorruptFileError`: named)."""
    try:
        source = _remote(location, path) if location is not None else str(path)
        reader = ParquetReader()
        reader.open(source, pre_buffer=False)
        names = reader.schema_arrow.names
        ids = reader.read_all(column_indices=[names.index("trace_id"), names.index("span_id")], use_threads=False)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CorruptFileError(str(path), str(exc).splitlines()[0], skippable=False) from exc
    return ids.select(["trace_id", "span_id"]).replace_schema_metadata(None)


def _name_unreadable_ids(files: Sequence[Path | str], location: Location | None) -> None:
    """Raise :class:`CorruptFileError` for the first of ``files`` whose id columns cannot be read (else nothing).

    Raises:
        CorruptFileError: that file, named.

    """
    for path in files:
        _ids_of(path, location)


def repeated_in(table: pa.Table) -> pa.Table:
    """(t, s, n): every (trace_id, span_id) stored more than once in ``table`` (a schema group), how many times."""
    counts = table.select(["trace_id", "span_id"]).group_by(["trace_id", "span_id"]).aggregate([([], "count_all")])
    many = counts.filter(pc.greater(counts.column("count_all"), 1))
    return pa.table(
        {"t": many.column("trace_id"), "s": many.column("span_id"), "n": many.column("count_all").cast(pa.int64())}
    )


def _joined(trace_ids: pa.Array | pa.ChunkedArray, span_ids: pa.Array | pa.ChunkedArray) -> pa.Array:
    joined = pc.binary_join_element_wise(trace_ids, span_ids, "\x00")
    return joined.combine_chunks() if isinstance(joined, pa.ChunkedArray) else joined


def _positions_of(table: pa.Table, repeated: pa.Table) -> list[int]:
    """Row positions of ``table`` whose (trace_id, span_id) is in ``repeated`` (vectorized; nulls never match).

    The pair is joined with a NUL between its parts; an id holding a NUL could
    only add a candidate row, never hide one: duplicates are then decided on
    the exact ids and content (:func:`exact_duplicates`).
    """
    if repeated.num_rows == 0 or table.num_rows == 0:
        return []
    key = _joined(table.column("trace_id"), table.column("span_id"))
    wanted = _joined(repeated.column("t"), repeated.column("s"))
    mask = pc.fill_null(pc.is_in(key, value_set=wanted.cast(key.type)), False)
    positions: list[int] = pc.indices_nonzero(mask).to_pylist()
    return positions


class Seen:
    """What the duplicate check holds for one schema group: bounded by the ids in flight, not the group.

    For each repeated (trace_id, span_id) met but not yet met as many times as
    it is stored, a 16-byte digest of each distinct content and how many of
    its rows are still to come; the entry is dropped once its last row is met.
    """

    def __init__(self) -> None:
        self.open: dict[tuple[str, str], tuple[int, set[bytes]]] = {}
        self.conflicting = 0  # rows kept that share their ids with a row of other content (closed entries)

    def conflicting_kept(self) -> int:
        """Rows kept although another row has the same ids with different content, over the group."""
        return self.conflicting + sum(len(c) for _, c in self.open.values() if len(c) > 1)


def exact_duplicates(table: pa.Table, repeated: pa.Table, seen: Seen) -> list[int]:
    """Positions of rows in ``table`` that exactly repeat a row seen before (in it, or in an earlier batch).

    ``repeated`` holds every repeated (t, s) of the group and its count n;
    ``seen`` is updated (see :class:`Seen`).
    """
    if repeated.num_rows == 0:
        return []
    positions = _positions_of(table, repeated)
    if not positions:
        return []
    subset = table.take(positions)
    wanted = _joined(repeated.column("t"), repeated.column("s"))
    key = _joined(subset.column("trace_id"), subset.column("span_id"))
    at = pc.index_in(key, value_set=wanted.cast(key.type))
    counts = repeated.column("n").take(at).to_pylist() if "n" in repeated.column_names else [None] * len(positions)
    plain = subset.cast(pa.schema([f.with_type(_plain_type(f.type)) for f in subset.schema]))
    drop: list[int] = []
    for position, row, n in zip(positions, plain.to_pylist(), counts, strict=True):
        content = json.dumps(row, sort_keys=True, default=repr).encode("utf-8", "surrogatepass")
        digest = hashlib.blake2b(content, digest_size=16).digest()
        ids = (row["trace_id"], row["span_id"])
        left, contents = seen.open.get(ids) or (n if n is not None else -1, set())
        if digest in contents:
            drop.append(position)
        else:
            contents.add(digest)
        left -= 1
        if left == 0:  # its last row: nothing later can repeat it
            seen.open.pop(ids, None)
            seen.conflicting += len(contents) if len(contents) > 1 else 0
        else:
            seen.open[ids] = (left, contents)
    return drop


def plan_batches(
    files: Sequence[P], max_rows: int, location: Location | None = None, rows: Mapping[P, int] | None = None
) -> list[list[P]]:
    """``files`` in consecutive batches of at most ``max_rows`` rows (a bigger file is a batch alone).

    ``rows``: each file's row count as :func:`schema_groups` found it (no footer is read again).
    """
    batches: list[list[P]] = []
    current: list[P] = []
    total = 0
    for path in files:
        n = rows.get(path) if rows is not None else None
        if n is None:
            try:
                if location is not None:
                    n = pq.read_metadata(location.fs_path(str(path)), filesystem=location.fs).num_rows
                else:
                    n = pq.read_metadata(path).num_rows
            except (pa.ArrowException, OSError) as exc:
                raise CorruptFileError(str(path), str(exc).splitlines()[0], skippable=False) from exc
        if current and total + n > max_rows:
            batches.append(current)
            current, total = [], 0
        current.append(path)
        total += n
    if current:
        batches.append(current)
    return batches


def sort_order(table: pa.Table, drop: list[int], sort_key: Sequence[str] = SORT_KEY) -> pa.Array:
    """Row positions in compaction order (``sort_key``, spans' by default), less ``drop``."""
    keys = [(name, "ascending", "at_end") for name in sort_key if name in table.column_names]
    order = pc.sort_indices(table, sort_keys=keys)
    if drop:
        order = order.filter(pc.invert(pc.is_in(order, value_set=pa.array(drop, order.type))))
    return order


def write_file(
    table: pa.Table,
    order: pa.Array,
    path: Path | str,
    row_group_rows: int,
    bloom: bool,
    location: Location | None = None,
    sort_key: Sequence[str] = SORT_KEY,
) -> pa.Table:
    """Write ``table``'s rows at ``order`` (by ``sort_key``, recorded in the footer) to ``path``; the indexed columns.

    One row group per slice. Locally ``path`` is a temp file, fsynced; on an object store it is the
    final object (one upload, visible whole or not at all, and ignored by
    readers until a manifest names it).
    """
    columns = set(table.column_names)
    sorting = [
        pq.SortingColumn(table.column_names.index(name), nulls_first=False) for name in sort_key if name in columns
    ]
    ndv = max(1, min(row_group_rows, len(order)))
    options: dict[str, object] = {}
    if bloom:
        options["bloom_filter_options"] = {c: {"ndv": ndv, "fpp": 0.01} for c in BLOOM_COLUMNS if c in columns}
    kept = [c for c in (*INDEX_KINDS, "start_time") if c in columns]
    slim: list[pa.Table] = []
    # Locally the file is read back for its CRC-32 (exporters.checksum.stamp): opened to read too.
    opened = location.fs.open_output_stream(location.fs_path(str(path))) if location else open(path, "w+b")
    with opened as handle:
        with pq.ParquetWriter(
            handle,
            table.schema,
            compression="zstd",
            use_dictionary=[c for c in DICTIONARY_COLUMNS if c in columns],
            write_statistics=True,
            sorting_columns=sorting,
            **options,
        ) as writer:
            for start in range(0, len(order), row_group_rows):
                piece = table.take(order.slice(start, row_group_rows))
                writer.write_table(piece, row_group_size=row_group_rows)
                slim.append(piece.select(kept))
            if location is None:  # an object is uploaded as it is written: no digits can be put in after
                writer.add_key_value_metadata(UNSTAMPED)
        if location is None:
            stamp(handle)  # the file's own CRC-32: a later compaction may hand it to DuckDB (storage.compact_duck)
            handle.flush()
            os.fsync(handle.fileno())
    return pa.concat_tables(slim) if slim else table.select(kept).slice(0, 0)


def _schema_key(schema: pa.Schema) -> tuple[bytes, str]:
    version = (schema.metadata or {}).get(SCHEMA_METADATA_KEY, b"")
    return version, str(schema.remove_metadata())


def _remote(location: Location, path: Path | str) -> object:
    """The remote object ``path`` through the process cache, its size taken from the partition's listing (no HEAD)."""
    listed = location.listed_stat(str(path))
    return location.open_object(str(path), listed[0] if listed is not None else None)


def _read_one(path: Path | str, location: Location | None = None) -> pa.Table:
    """One file's rows, read on the calling thread (a small file gains nothing from pyarrow's threads).

    An object of a remote dataset is read through the process's object cache
    (:meth:`Location.open_object`): one GET for a small object, which the
    schema check before may already have made.

    Raises:
        CorruptFileError: the file cannot be read (named).

    """
    try:
        source = _remote(location, path) if location is not None else str(path)
        reader = ParquetReader()
        reader.open(source, pre_buffer=False)
        return reader.read_all(use_threads=False)
    except (pa.ArrowException, OSError) as exc:
        raise CorruptFileError(str(path), str(exc).splitlines()[0], skippable=False) from exc


class _Inspected:
    """What :func:`schema_groups` learns of one file from its footer: its group key, rows, or why it is refused."""

    __slots__ = ("judged_by_schema", "key", "problem", "rows")

    def __init__(self, key: tuple[bytes, str], rows: int, problem: CorruptFileError | DatasetError | None) -> None:
        self.key, self.rows, self.problem = key, rows, problem
        self.judged_by_schema = False  # admitted on its schema alone (no time column coarser than nanoseconds)


class _Checks:
    """The per-schema checks of one :func:`schema_groups` call, made once per distinct schema (thread-safe)."""

    def __init__(self, problem: Callable[[pa.Schema], str | None] = schema_problem) -> None:
        self.problem = problem  # the file kind's column check (spans' by default)
        self.problems: dict[tuple[bytes, str], str | None] = {}  # schema_problem of each distinct Arrow schema
        self.nanoseconds: list[pq.ParquetSchema] = []  # Parquet schemas whose time columns are all nanoseconds
        self.verdicts: dict[tuple[bytes, bytes, bytes], _Inspected] = {}  # by footer signature (compact_footer)
        self.prefixes: list[tuple[bytes, bytes]] = []  # footers' first bytes up to their schema's end (compact_footer)
        self.lock = threading.Lock()

    def schema_problem(self, key: tuple[bytes, str], schema: pa.Schema) -> str | None:
        with self.lock:
            if key in self.problems:
                return self.problems[key]
        problem = self.problem(schema)
        with self.lock:
            self.problems[key] = problem
        return problem

    def time_problem(self, source: object, metadata: pq.FileMetaData) -> str | None:
        parquet_schema = metadata.schema
        with self.lock:
            if any(parquet_schema.equals(known) for known in self.nanoseconds):
                return None  # no time column coarser than nanoseconds: nothing can be out of range
        if not has_coarse_times(parquet_schema):
            with self.lock:
                if len(self.nanoseconds) < 64:
                    self.nanoseconds.append(parquet_schema)
            return None
        # A coarser time past nanoseconds would fail the side index's cast (naming no file) or, stored as
        # INT96, wrap round to another date when read. Read, not taken from statistics: compaction reads it all.
        try:
            return time_range_problem(source, metadata, statistics=False)
        except (pa.ArrowException, OSError, ValueError) as exc:
            return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _inspect(path: P, location: Location | None, checks: _Checks) -> _Inspected:
    """One file's footer, parsed once: its schema group, its row count, or what makes compaction refuse it.

    A local file whose footer repeats the schema bytes of one judged before
    (:func:`~.compact_footer.footer_head`: its raw bytes, not a pyarrow parse)
    gets that file's verdict with its own row count.
    """
    head = footer_head(path, checks.prefixes) if location is None else None
    if head is not None:
        with checks.lock:
            known = checks.verdicts.get(head.signature)
        if known is not None:
            return _Inspected(known.key, head.rows, None)
    found = _inspect_parsed(path, location, checks)
    if head is not None and found.problem is None and found.rows == head.rows and found.judged_by_schema:
        with checks.lock:
            checks.verdicts.setdefault(head.signature, found)
    return found


def _inspect_parsed(path: P, location: Location | None, checks: _Checks) -> _Inspected:
    """:func:`_inspect` through pyarrow's parse of the footer."""
    try:
        source = _remote(location, path) if location is not None else str(path)
        reader = ParquetReader()
        reader.open(source, pre_buffer=False)
        schema = reader.schema_arrow
        metadata = reader.metadata
    except (pa.ArrowException, OSError) as exc:
        error = CorruptFileError(str(path), str(exc).splitlines()[0], skippable=False)
        return _Inspected((b"", ""), 0, error)
    key = _schema_key(schema)
    try:
        check_version(str(path), (schema.metadata or {}).get(SCHEMA_METADATA_KEY))
    except DatasetError as exc:
        return _Inspected(key, 0, exc)
    problem = checks.schema_problem(key, schema) or checks.time_problem(source, metadata)
    if problem is not None:  # readers refuse (or skip) it too; nothing of the partition is changed
        return _Inspected(key, 0, CorruptFileError(str(path), problem, skippable=False))
    found = _Inspected(key, metadata.num_rows, None)
    found.judged_by_schema = not has_coarse_times(metadata.schema)  # else its times were read: not by schema
    return found


def schema_groups(
    files: Sequence[P],
    location: Location | None = None,
    rows: dict[P, int] | None = None,
    workers: Workers | None = None,
    problem: Callable[[pa.Schema], str | None] = schema_problem,
) -> list[list[P]]:
    """``files`` grouped by schema (storage version and columns): groups are never merged.

    Each file's footer is parsed once (on ``workers``, a few files ahead);
    ``rows``, when given, receives each file's row count (for
    :func:`plan_batches`, which then reads no footer again). The span columns (or
    ``problem``'s, another file kind's) are checked once per distinct schema. The first refused file in ``files``'
    order is raised.

    Raises:
        DatasetError: a file was written with a newer storage schema version than this otel-replay reads.
        CorruptFileError: a file is unreadable or not a span file (no id columns, a span column of another type,
            a span time that does not fit in nanoseconds).

    """
    checks = _Checks(problem)
    groups: dict[tuple[bytes, str], list[P]] = {}
    found = _ahead(lambda path: _inspect(path, location, checks), files, workers or Workers(1))
    for path, inspected in zip(files, found, strict=True):
        if inspected.problem is not None:
            found.close()
            raise inspected.problem
        if rows is not None:
            rows[path] = inspected.rows
        groups.setdefault(inspected.key, []).append(path)
    return list(groups.values())


_FILE_ONLY = frozenset((ID_KEYS_METADATA_KEY, CHECKSUM_KEY))
"""Footer metadata of one input file (pyarrow reads it into the schema's metadata), never carried into its output."""

READ_AHEAD = 8
"""Files read ahead of the one being gathered into a batch (on the workers)."""

GATHER_FILES = 64
"""Single-file tables made one contiguous piece at a time (a file's table keeps about 50 KB of buffers, however few
its rows: 3,000 of them held at once were 301 MB of RSS for a 17 MB table)."""

GATHER_ROWS = 65_536
"""Rows of such pieces made one contiguous piece of the batch (so a batch is a few dozen chunks per column)."""


def read_files(
    paths: Sequence[P],
    location: Location | None = None,
    workers: Workers | None = None,
    rows: Mapping[P, int] | None = None,
) -> pa.Table:
    """The rows of ``paths`` (one schema) as one contiguous table.

    With :data:`~.compact_duck.DUCK_CHUNKS`, local files whose footers' ``rows`` are given are read by DuckDB
    :data:`~.compact_duck.DUCK_FILES` at a time (:func:`~.compact_duck.duck_read`);
    otherwise, and for a chunk it does not read exactly, file by file. At
    most :data:`READ_AHEAD` files (or two chunks) are being read at once, and
    what is read is gathered into contiguous pieces (:data:`GATHER_FILES`
    tables, then :data:`GATHER_ROWS` rows): memory is the batch plus a few
    files, whatever the number of files (a batch of 20,000 small files is
    neither 20,000 chunks per column, each with its own buffers, nor 20,000
    files read at once).
    """
    workers = workers or Workers(1)
    # No name here may keep the chunked table: _contiguous frees its chunks column by column.
    return _contiguous(_load(paths, location, workers, rows), workers)


def _ahead(fn: Callable[[T], R], items: Iterable[T], workers: Workers, depth: int = 0) -> Generator[R, None, None]:
    """``fn`` of each of ``items`` in order, run on ``workers`` at most ``depth`` (:data:`READ_AHEAD`) items ahead.

    On an error (or when the consumer stops) the calls in flight are waited for, not left running.
    """
    ahead: deque[Future[R]] = deque()
    rest = iter(items)
    try:
        for item in rest:
            ahead.append(workers.submit(fn, item))
            if len(ahead) >= (depth or READ_AHEAD):
                break
        while ahead:
            result = ahead.popleft().result()
            for item in rest:
                ahead.append(workers.submit(fn, item))
                break
            yield result
    finally:
        for future in ahead:
            future.cancel()
            if not future.cancelled():
                future.exception()


def _file_tables(
    paths: Sequence[Path | str], location: Location | None, workers: Workers, rows: Mapping[Any, int] | None = None
) -> Iterator[pa.Table]:
    """The files' rows in order, as tables of one file or of a chunk of files.

    With :data:`~.compact_duck.DUCK_CHUNKS`, local files with known ``rows`` are read a DuckDB chunk at a time (two
    chunks ahead); the rest, and a chunk DuckDB does not read exactly, file by file at most :data:`READ_AHEAD` ahead.
    """
    if not DUCK_CHUNKS or location is not None or rows is None or len(paths) < DUCK_MIN_FILES:
        yield from _ahead(lambda path: _read_one(path, location), paths, workers)
        return
    chunks = [paths[i : i + DUCK_FILES] for i in range(0, len(paths), DUCK_FILES)]
    scans = _ahead(lambda chunk: _read_chunk(chunk, rows), chunks, workers, depth=2)
    for chunk, (first, rest) in zip(chunks, scans, strict=True):
        yield first
        if rest is None:  # a damaged file, or an answer that is not the chunk: the read that names the file
            yield from _ahead(lambda path: _read_one(path, location), chunk[1:], workers)
        else:
            yield rest


def _read_chunk(chunk: Sequence[Path | str], rows: Mapping[Any, int]) -> tuple[pa.Table, pa.Table | None]:
    """A chunk's first file read by pyarrow, and the rest by DuckDB as that file's schema (``None``: file by file)."""
    first = _read_one(chunk[0])
    return first, duck_read(chunk[1:], first.schema, sum(rows[p] for p in chunk[1:]))


class _Gather:
    """Tables appended one by one, made contiguous every ``files`` tables or ``rows`` rows (see :func:`read_files`)."""

    def __init__(self, files: int, rows: int) -> None:
        self.files, self.rows = files, rows
        self.held: list[pa.Table] = []
        self.held_rows = 0
        self.done: list[pa.Table] = []

    def add(self, table: pa.Table) -> pa.Table | None:
        """Hold ``table``; the contiguous piece made of what is held when a bound is reached, else ``None``."""
        self.held.append(table)
        self.held_rows += table.num_rows
        if len(self.held) >= self.files or self.held_rows >= self.rows:
            return self.flush()
        return None

    def flush(self) -> pa.Table | None:
        """What is held as one contiguous piece (``None`` when nothing is)."""
        if not self.held:
            return None
        piece = self.held[0] if len(self.held) == 1 else pa.concat_tables(self.held).combine_chunks()
        self.held, self.held_rows = [], 0
        return piece


def _load(
    paths: Sequence[Path | str], location: Location | None, workers: Workers, rows: Mapping[Any, int] | None = None
) -> pa.Table:
    """The rows of ``paths`` as read: a few contiguous pieces (see :func:`read_files`) in one chunked table."""
    schema: pa.Schema | None = None
    files = _Gather(GATHER_FILES, GATHER_ROWS)
    runs = _Gather(MAX_ROWS, GATHER_ROWS)
    pieces: list[pa.Table] = []

    def run(piece: pa.Table | None) -> None:
        made = runs.add(piece) if piece is not None else None
        if made is not None:
            pieces.append(made)

    for table in _file_tables(paths, location, workers, rows):
        if schema is None:  # the first file's id keys and checksum describe that file only: never carried over
            metadata = {k: v for k, v in (table.schema.metadata or {}).items() if k not in _FILE_ONLY}
            schema = table.schema.with_metadata(metadata)
        if table.schema.metadata != schema.metadata:
            table = table.replace_schema_metadata(schema.metadata)  # one schema group: only metadata may differ
        run(files.add(table))
    run(files.flush())
    last = runs.flush()
    if last is not None:
        pieces.append(last)
    if not pieces:
        raise DatasetError("no file to read")
    return pa.concat_tables(pieces)


def _contiguous(table: pa.Table, workers: Workers) -> pa.Table:
    """``table`` with each column in one chunk (take() per row group is several times cheaper than over chunks).

    Columns are combined on the workers, biggest first, and each column's
    chunks are dropped once combined: memory peaks at the batch plus the
    columns in flight, not at twice the batch as ``combine_chunks()`` does.
    """
    schema = table.schema
    columns: list[pa.ChunkedArray | None] = list(table.columns)
    del table

    def combine(i: int) -> pa.Array | pa.ChunkedArray:
        column = columns[i]
        assert column is not None
        columns[i] = None
        return column if column.num_chunks == 1 else column.combine_chunks()

    sizes = [column.nbytes if column is not None else 0 for column in columns]
    by_size = sorted(range(len(columns)), key=lambda i: -sizes[i])
    futures = {i: workers.submit(combine, i) for i in by_size}
    return pa.Table.from_arrays([futures[i].result() for i in range(len(schema))], schema=schema)


def swapped_manifest(
    manifest: Manifest,
    generation: int,
    replaced: Sequence[str],
    old_index: str | None,
    written: Sequence[tuple[str, int]],
    index_name: str | None,
    token: str,
    now: float,
) -> Manifest:
    """The manifest a run of ``generation`` swaps in over ``manifest`` (local and S3 alike).

    It names the ``written`` files (name, rows) and their side index (``None``: a kind without one), marks
    the ``replaced`` files and the old index and facts superseded at ``now``
    (kept for the grace period), and no longer holds the run's ``token`` as pending.
    """
    superseded = dict(manifest.superseded)
    superseded.update(dict.fromkeys(replaced, now))
    if old_index:
        superseded[old_index] = now
        superseded[facts_of_index(old_index) or old_index] = now
    return Manifest(
        generation=generation,
        files=[name for name, _ in written],
        superseded=superseded,
        index=index_name,
        rows=sum(rows for _, rows in written),
        pending={k: at for k, at in manifest.pending.items() if k != token},
    )

