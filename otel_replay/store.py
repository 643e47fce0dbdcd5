"""DuckDB over the Parquet dataset: views, ``queries/*.sql``, rehydration and verify.

Storage knows the span schema and the SQL; it knows nothing of the capture API.
DuckDB and pyarrow errors are converted here, at the boundary, into
:class:`QueryError` / :class:`CorruptFileError` with the cause kept.

Two DuckDB databases serve one store: the internal one runs the shipped
``queries/*.sql``; analyst SQL (:meth:`Store.query`, :meth:`Store.rows`,
``otel-replay sql``) runs on a second one closed off per
:mod:`otel_replay.analyst`: it reads the dataset's files and nothing else,
and writes nothing.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from otel_replay import _duck as duck
from otel_replay import semconv as sc
from otel_replay._corrupt import could_be_a_bad_file, find_corrupt
from otel_replay._json import loads, strict_loads
from otel_replay.analyst import check_statements, close_off, table_rows
from otel_replay.errors import (
    CorruptFileError,
    DatasetError,
    PayloadError,
    QueryError,
    ReadOnlyViolation,
    RecordNotFound,
    message_line,
)
from otel_replay.exporters.schema import SCHEMA_METADATA_KEY, SPAN_SCHEMA, SPANS_DIR
from otel_replay.integrity import (
    SealCheck,
    SigningKey,
    StoredRecord,
    VerifyProblem,
    VerifyReport,
    load_signing_key,
    verify_records,
)
from otel_replay.location import Location, register_with, resolve
from otel_replay.records import Action, DecisionRecord, SpanRef
from otel_replay.storage.facts import point_facts, unpoint_facts
from otel_replay.storage.manifest import RemoteSnapshot, live_files, remote_live_files, remote_partitions
from otel_replay.storage.side_index import Listing, indexed_and_tail, partition_listing
from otel_replay.storage.span_columns import (
    arrow_schema_coarse,
    arrow_schema_problem,
    schema_problem,
    time_range_problem,
)
from otel_replay.storage.tail_index import TailIndex
from otel_replay.trust import TrustedRecord, select_trusted, split_trusted

__all__ = ["Store", "load_sql", "open_store", "restore_attributes", "stored_record"]

_log = logging.getLogger(__name__)
_FILES_VAR = "otel_replay_files"
_IDENT = re.compile(r"[a-z_][a-z0-9_]*")
_QUERY_NAME = re.compile(r"[a-z_][a-z0-9_]*(?:/[a-z_][a-z0-9_]*)?")
_VARIABLE = re.compile(r"getvariable\('([a-z_][a-z0-9_]*)'\)")
_MAGIC = b"PAR1"
_MAX_FOOTER = 64 * 2**20
_OURS_MAJOR = int(sc.SCHEMA_VERSION.split(".")[0])
_UNION_VAR = "otel_replay_union_by_name"
_LEGACY_VAR = "otel_replay_legacy_outcomes"
_TYPED_OUTCOMES = 2  # the storage schema version that promoted outcome_decision_id
_SCALARS = frozenset({str, int, float, bool, bytes})  # variable values Store._set may skip setting again
_FACTS_QUERIES = ("calibration", "decision_summary")  # read compaction's facts files (storage/facts.py)
_ARROW_SCHEMA_KEY = b"ARROW:schema"
# DuckDB optimizers a point lookup does without. Over the few files the side index names, a chain's rows
# are a handful, so what these would gain in execution is less than they cost in planning, which DuckDB
# repeats at every execution: without them a 10M-span chain lookup plans in 5.6 ms instead of 7 (of about
# 18 ms in all). Planning only: the rows are the same. Kept on: the filter pushdowns, the column pruning,
# the row-group pruner and the CTE rules, which decide how much Parquet is read.
_LEAN_OPTIMIZERS = (
    "join_order", "statistics_propagation", "common_subplan", "self_join_aggregate", "aggregate_reuse",
    "window_self_join", "duplicate_groups", "projection_pullup", "common_subexpressions",
    "outer_join_simplification", "join_elimination", "redundant_order_keys", "projection_placement",
    "top_n_window_elimination", "window_rewriter", "partial_aggregate_pushdown", "type_pushdown",
    "scalar_fn_pushdown", "distinct_aggregate_rewrite", "grouping_sets", "partitioned_execution",
    "sampling_pushdown", "aggregate_function_rewriter", "unnest_rewriter", "regex_range", "empty_result_pullup",
    "common_aggregate", "compressed_materialization", "in_clause", "reorder_filter", "column_lifetime",
)  # fmt: skip
_LEAN_FILES = 64  # a narrowed lookup over more files than this plans with every optimizer
_Ids = Mapping[str, str | list[str]]  # id column -> value (outcome_decision_id: several)
# A shipped query that joins a decision's outcomes (found by outcome_decision_id, under any correlation id).
_READS_OUTCOMES = re.compile(r"\b(?:outcome_spans_for|outcomes_of|outcomes_in)\s*\(|\b(?:FROM|JOIN)\s+outcomes\b", re.I)
Keys = SigningKey | Sequence[SigningKey] | None
Params = Sequence[Any] | Mapping[str, Any] | None
T = TypeVar("T")


@cache
def load_sql(name: str) -> str:
    """The text of ``queries/<name>.sql`` as shipped in the package (``name`` like ``record`` or ``chains/trade``)."""
    if not _QUERY_NAME.fullmatch(name):
        raise QueryError(f"bad query name {name!r}: expected a shipped file such as 'record' or 'chains/trade'")
    try:
        return resources.files("otel_replay.queries").joinpath(f"{name}.sql").read_text(encoding="utf-8")
    except FileNotFoundError:
        raise QueryError(f"no SQL file queries/{name}.sql") from None


def restore_attributes(row: Mapping[str, Any]) -> dict[str, Any]:
    """A span's full attribute dict: the JSON column plus the promoted columns.

    Raises:
        PayloadError: the JSON is not one unambiguous object (duplicate keys,
            too deep, not an object), or an attribute is stored both in its
            promoted column and in the JSON (two places could disagree).

    """
    where = f"attributes of span {row.get('span_id') or '?'}"
    attrs: dict[str, Any] = strict_loads(row["attributes"], where=where) if row.get("attributes") else {}
    if not isinstance(attrs, dict):
        raise PayloadError(f"{where}: not a JSON object")
    for key, column in sc.PROMOTED_COLUMNS.items():
        value = row.get(column)
        if value is not None:
            if key in attrs:
                raise PayloadError(f"{where}: {key!r} is stored both in column {column} and in the JSON")
            attrs[key] = value
    return attrs


def stored_record(row: Mapping[str, Any]) -> StoredRecord:
    """A record row as the seal check sees it; unreadable attributes are marked, not raised."""
    try:
        attrs, unreadable = restore_attributes(row), None
    except PayloadError as exc:
        attrs, unreadable = {}, str(exc)
    return StoredRecord(
        str(row.get("record_id") or "?"),
        row["name"],
        int(row["start_ns"]),
        attrs,
        str(row.get("filename") or ""),
        row.get("trace_id") or "",
        row.get("span_id") or "",
        unreadable,
    )


def _read_footer(path: str, size: int, location: Location | None = None) -> bytes | str:
    """The Thrift footer of the Parquet file ``path``, or what is wrong with its framing.

    ``location``: the remote dataset ``path`` (an ``s3://`` URL) belongs to.
    """
    if size < 12:
        return f"{size} bytes, too short for Parquet"
    opened = location.open_object(path, size) if location else open(path, "rb")
    with opened as handle:
        head = handle.read(4)
        handle.seek(size - 8)
        tail = handle.read(8)
        if head != _MAGIC or tail[4:] != _MAGIC:
            return "no Parquet magic at its start or end (truncated or not Parquet)"
        length = int.from_bytes(tail[:4], "little")
        if not 0 < length <= min(size - 12, _MAX_FOOTER):
            return f"footer length {length} does not fit a {size}-byte file"
        handle.seek(size - 8 - length)
        return handle.read(length)


def footer_value(footer: bytes, key: bytes) -> bytes | None:
    """The value of ``key`` in a Parquet footer's key-value metadata (``None`` when absent).

    A key-value pair in the footer's Thrift compact encoding is field 1
    (header 0x18, varint length, key) then field 2 (0x18, varint length,
    value). The key-value metadata is the footer's field 5, after the row
    groups and their statistics, so the last match is the writer's: a span
    value that happens to hold the same bytes can only sit before it.
    """
    pattern = b"\x18" + bytes([len(key)]) + key + b"\x18"
    at = footer.rfind(pattern)
    if at < 0:
        return None
    at += len(pattern)
    length, shift = 0, 0
    while at < len(footer) and shift < 35:  # varint
        byte = footer[at]
        at += 1
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return footer[at : at + length]


def schema_version(footer: bytes) -> str | None:
    """The storage schema version in a Parquet footer (``None`` when the writer recorded none)."""
    raw = footer_value(footer, SCHEMA_METADATA_KEY)
    return None if raw is None else raw[:64].decode("ascii", "replace")


def _check_version(path: str, footer: bytes) -> int | None:
    """The file's major storage schema version (``None``: not recorded).

    Raises:
        DatasetError: the version is unreadable, or newer than this otel-replay reads.

    """
    version = schema_version(footer)
    if version is None:
        return None
    major = version.split(".")[0]
    if not major.isdigit() or len(major) > 6:
        raise DatasetError(f"{path}: unreadable storage schema version {version!r}")
    if int(major) > _OURS_MAJOR:
        raise DatasetError(
            f"{path}: written with storage schema version {version}, newer than this otel-replay reads "
            f"({sc.SCHEMA_VERSION}); upgrade otel-replay to read it"
        )
    return int(major)


_BIND_ATTEMPTS = 5
"""Listings tried when files vanish between a refresh's listing and its binding (retention dropping partitions)."""

VANISHED = CorruptFileError("", "vanished")
"""What :meth:`Store._check` returns for a listed file that is gone: not live (never reported as corrupt)."""

_NOT_ABOUT_FILES = (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException, duckdb.InterruptException)
"""DuckDB errors that a vanished or replaced file never causes (a vanished file is an IO or permission error)."""


class Store:
    """An open dataset: DuckDB views over its Parquet files.

    Args:
        dataset: the dataset directory (the one holding ``spans/``), or an
            ``s3://bucket/prefix`` URI (see :mod:`otel_replay.location`).
        skip_corrupt: leave unreadable Parquet files out (listed in
            :attr:`skipped`) instead of raising :class:`CorruptFileError`.
        database: a DuckDB database path, default in-memory.
        keys: verification keys for records that drive replay and the gate
            (default: the signing key from the environment or key file, never created).
        require_signed: records must carry a valid signature from one of
            ``keys`` (default). ``False`` accepts a record signed with an
            unknown key on its hash alone; unsealed and edited rows are never accepted.

    Files written after opening are seen after :meth:`refresh`. Rows are
    trusted per :mod:`otel_replay.trust`: :meth:`record`, :meth:`receipts_for`,
    :meth:`compensation_for` and :meth:`verified_outcomes` use only rows that
    pass the seal check; the SQL views show every stored row.
    :meth:`query` and :meth:`rows` run analyst SQL read-only: they can read
    the dataset's files and nothing else (:mod:`otel_replay.analyst`).

    """

    def __init__(
        self,
        dataset: str | os.PathLike[str],
        *,
        skip_corrupt: bool = False,
        database: str = ":memory:",
        keys: Keys = None,
        require_signed: bool = True,
    ) -> None:
        """Open ``dataset``; see the class docstring."""
        self.location = resolve(dataset)
        self.dataset: Path | str = self.location.root if self.location.remote else Path(self.location.root)
        self._keys = keys
        self.require_signed = require_signed
        self._seal_check: SealCheck | None = None
        if isinstance(self.dataset, Path) and self.dataset.exists() and not self.dataset.is_dir():
            raise DatasetError(f"dataset {self.dataset} is a file, not a directory")
        self.location.check()
        self.skip_corrupt = skip_corrupt
        self.files: list[str] = []
        self.skipped: list[CorruptFileError] = []
        self._checked: dict[str, tuple[int, int]] = {}
        self._arrow_schema: dict[str, bytes | None] = {}  # the writer's Arrow schema, to skip union_by_name
        self._major: dict[str, int | None] = {}  # each file's major storage schema version (None: not recorded)
        self._decoded: dict[str, tuple[int, int]] = {}
        self._times_read: dict[str, tuple[int, int]] = {}  # files whose span times were read and fit in nanoseconds
        self._bad: dict[str, tuple[tuple[int, int], CorruptFileError]] = {}
        self._analyst: duckdb.DuckDBPyConnection | None = None
        self._scope: list[str] | None = None  # the files the running lookup reads (None: self.files)
        self._pointed: list[str] | None = None  # the files the internal connection's variables name
        self._current_source = False  # span_source defined for files that all have the current columns
        self._snapshot: RemoteSnapshot | None = None  # a remote dataset's listing at the last refresh
        self._listing: Listing | None = None  # the partitions the running lookup searches (listed once per lookup)
        self._lean: str | None = None  # the optimizers disabled on the internal connection now (None: not set yet)
        self._lean_names: str | None = None  # _LEAN_OPTIMIZERS this DuckDB knows, comma-separated
        # DuckDB keeps disabled_optimizers per database, not per connection: only a database of the
        # store's own (in memory) may be planned lean; a file database may be shared with other connections.
        self._may_plan_lean = database in ("", ":memory:")
        self._tail = TailIndex(self.location)  # ids of the files no side index covers yet
        self._vars: dict[str, tuple[type, Any]] = {}  # what each variable on the internal connection holds
        self._lock = threading.RLock()
        try:
            self._con = duck.connect(database)
            register_with(self._con, self.location)
            self._con.execute("SET TimeZone = 'UTC'")
            # Footers are read once per file, not at every query (binding reads them all with union_by_name).
            self._con.execute("SET parquet_metadata_cache = true")
        except duckdb.Error as exc:
            raise DatasetError(f"cannot open DuckDB database {database}: {exc}") from exc
        _recover_logs(self.location.root)
        self.refresh()

    # --- files and views ----------------------------------------------------
    def _scan(self, missing: list[str] | None = None) -> list[str]:
        """The live files; ``missing`` (skip_corrupt) collects compacted files a manifest lists that are gone."""
        try:
            # Through the partition manifests: a glob would also list files a compaction superseded.
            if self.location.remote:  # one listing per refresh; lookups reuse it (see _narrow)
                self._snapshot = remote_partitions(self.location, missing=missing)
                return remote_live_files(self.location, self._snapshot)
            return live_files(self.location, missing=missing)
        except OSError as exc:
            root = self.location.join(SPANS_DIR)
            raise DatasetError(f"cannot list the files of {root}: {exc.strerror or exc}") from exc

    def _stamp(self, path: str) -> tuple[int, int] | None:
        """(size, mtime) of ``path``; ``None`` when it is gone or cannot be stat'ed (a symlink loop, no permission)."""
        if self.location.remote:
            return self.location.stat(path)
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_size, st.st_mtime_ns)

    def _check(self, path: str) -> CorruptFileError | None:
        """The cheap check at open: Parquet magic at both ends, a footer that fits, a schema version we read.

        Reads a file's first 4 bytes and its footer, about 20 µs a file; the
        span columns' types are checked from the footer's Arrow schema (decoded
        once per distinct writer schema). Cached by (size, mtime). A file
        damaged past its footer is named by the query that reads it
        (:meth:`_attempt`). A file that is gone is :data:`VANISHED` (not live,
        not corrupt: retention or compaction removed it after the listing).

        Raises:
            DatasetError: the file was written with a newer major storage schema version.

        """
        if self.location.remote:
            # objects are written once and never rewritten under the same name: a verdict on one stands
            bad_object = self._bad.get(path)
            if bad_object is not None:
                return bad_object[1]
            if path in self._checked:
                return None
            stamp = self.location.listed_stat(path)
        else:
            try:
                st = os.stat(path)
                stamp = (st.st_size, st.st_mtime_ns)
            except FileNotFoundError:
                stamp = None
            except OSError as exc:  # a symlink loop, no permission: a bad file, named
                return CorruptFileError(path, exc.strerror or str(exc))
        if stamp is None:
            return VANISHED
        bad = self._bad.get(path)
        if bad is not None and bad[0] == stamp:
            return bad[1]
        if self._checked.get(path) == stamp:
            return None
        try:
            footer = _read_footer(path, stamp[0], self.location if self.location.remote else None)
        except FileNotFoundError:
            return VANISHED
        except OSError as exc:
            return CorruptFileError(path, exc.strerror or str(exc))
        if isinstance(footer, str):
            return CorruptFileError(path, footer)
        major = _check_version(path, footer)
        arrow = footer_value(footer, _ARROW_SCHEMA_KEY)
        if arrow is None:
            problem = self._schema_problem(path)
        else:
            problem = arrow_schema_problem(arrow)
            if problem is None and arrow_schema_coarse(arrow):  # not nanoseconds (never ours): check the range
                problem = self._time_problem(path)
        if problem is not None:
            self._bad[path] = (stamp, CorruptFileError(path, problem))
            return self._bad[path][1]
        self._major[path] = major
        self._checked[path] = stamp
        self._arrow_schema[path] = arrow
        return None

    def _schema_problem(self, path: str) -> str | None:
        """:func:`schema_problem` and :func:`time_range_problem` of a file whose footer has no Arrow schema.

        Another writer's file: one footer parse, and a read of a time column
        only when it is coarser than nanoseconds and lacks statistics.
        """
        return self._parquet_problem(path, statistics=True, schema=True)

    def _time_problem(self, path: str, *, statistics: bool = True) -> str | None:
        """:func:`time_range_problem` of ``path`` (a file whose span times are not all nanoseconds)."""
        return self._parquet_problem(path, statistics=statistics, schema=False)

    def _parquet_problem(self, path: str, *, statistics: bool, schema: bool) -> str | None:
        import pyarrow.parquet as pq

        try:
            source = self.location.open_object(path) if self.location.remote else path
            parquet = pq.ParquetFile(source)
            problem = schema_problem(parquet.schema_arrow) if schema else None
            return problem or time_range_problem(source, parquet.metadata, statistics=statistics)
        except FileNotFoundError:
            return None  # gone: the query that reads it re-lists
        except (OSError, pa.ArrowException, ValueError) as exc:
            return str(exc).splitlines()[0] if str(exc) else type(exc).__name__

    def _union_by_name(self, files: Sequence[str]) -> bool:
        """Whether ``files`` need DuckDB's union_by_name: not when one writer schema is recorded in every footer.

        With it DuckDB reads every file's schema each time a query binds the
        views (about 0.15 ms a file); without it, only the first file's.
        """
        schemas = {self._arrow_schema.get(path) for path in files}
        return len(schemas) != 1 or None in schemas

    def _legacy_outcomes(self, files: Sequence[str]) -> bool:
        """Whether any of ``files`` may keep an outcome's decision id only in its JSON (schema version 1 or unknown)."""
        return any((self._major.get(path) or 0) < _TYPED_OUTCOMES for path in files)

    def _set(self, con: duckdb.DuckDBPyConnection, name: str, value: Any) -> None:
        """``SET VARIABLE name = value`` (bound, never formatted); skipped when the internal connection holds it.

        A lookup sets a handful of variables; each ``SET`` is a round trip
        into DuckDB, and most of them keep their value from one lookup to the
        next (the limit, the files of a warm store).
        """
        # Only immutable scalars are remembered: a list the caller passed may change before the next call.
        held = (type(value), value) if value is None or type(value) in _SCALARS else None
        if held is not None and con is self._con and self._vars.get(name) == held:
            return
        con.execute(f"SET VARIABLE {name} = ?", [value])
        if con is self._con:
            if held is None:
                self._vars.pop(name, None)
            else:
                self._vars[name] = held

    def _point_at(self, con: duckdb.DuckDBPyConnection, files: Sequence[str]) -> None:
        """Set the variables the views read for ``files``: the list, union_by_name, and the legacy-outcome hint."""
        self._set(con, _FILES_VAR, list(files) or None)
        self._set(con, _UNION_VAR, self._union_by_name(files))
        self._set(con, _LEGACY_VAR, self._legacy_outcomes(files))

    def refresh(self) -> None:
        """Rescan the dataset's files, validate new ones, and (re)define the views.

        A file that vanishes between the listing and the check or the binding
        (retention dropped its partition, a compaction's grace period ended)
        is simply not live, and the listing that named it is stale (it may miss
        what replaced the file): the dataset is listed again, up to five times.
        """
        with self._lock:
            for attempt in range(_BIND_ATTEMPTS):
                files, skipped, vanished = self._live()
                if vanished and attempt < _BIND_ATTEMPTS - 1:
                    # A listed file went away (a compaction swapped its partition, retention dropped it): the
                    # listing is stale and may miss what replaced it, so list again rather than read less.
                    continue
                self.files, self.skipped = files, skipped
                self._tail.keep_only(files)
                try:
                    self._define_views(self._con, files)
                except QueryError as exc:
                    vanished = isinstance(exc.__cause__, duckdb.IOException) or any(
                        self._stamp(path) is None for path in files
                    )
                    if attempt == _BIND_ATTEMPTS - 1 or not vanished:
                        raise
                    continue  # a listed file went away before the views bound: list again
                break
            if self._analyst is not None:
                self._analyst.close()
                self._analyst = None

    def _live(self) -> tuple[list[str], list[CorruptFileError], bool]:
        """(the readable live files, the ones skipped as corrupt, whether a listed file was gone when checked)."""
        files, skipped = [], []
        vanished = False
        known = {problem.path for problem in self.skipped}
        missing: list[str] | None = [] if self.skip_corrupt else None
        for path in self._scan(missing):
            problem = self._check(path)
            if problem is None:
                files.append(path)
            elif problem is VANISHED:
                vanished = True
            elif self.skip_corrupt:
                if path not in known:
                    _log.warning("otel-replay: skipping %s", problem)
                skipped.append(problem)
            else:
                raise problem
        for path in missing or ():
            problem = CorruptFileError(path, "listed by its partition's _manifest.json but missing (spans lost)")
            if path not in known:
                _log.warning("otel-replay: skipping %s", problem)
            skipped.append(problem)
        return files, skipped, vanished

    def _define_views(self, con: duckdb.DuckDBPyConnection, files: list[str]) -> None:
        if con is self._con:
            self._pointed = None  # until the views are defined over ``files``
        try:
            if files:
                self._point_at(con, files)
                # Every file with the current columns: the cheaper source; any older file: the one that supplies them.
                current = not self._legacy_outcomes(files)
                con.execute(load_sql("source_current" if current else "source"))
                if con is self._con:
                    self._current_source = current
            else:
                self._set(con, _FILES_VAR, None)
                self._set(con, _LEGACY_VAR, False)
                empty = (
                    SPAN_SCHEMA.empty_table()
                    .append_column("date", pa.array([], pa.date32()))
                    .append_column("filename", pa.array([], pa.string()))
                )
                con.register("otel_replay_empty_spans", empty)
                con.execute(load_sql("empty_source"))
            con.execute(load_sql("views"))
            if con is self._con:
                self._pointed = list(files)
        except duckdb.Error as exc:
            raise QueryError(f"defining views over {self.dataset}: {exc}") from exc

    def _analyst_con(self) -> duckdb.DuckDBPyConnection:
        """The closed-off database analyst SQL runs on (see :mod:`otel_replay.analyst`)."""
        if self._analyst is None:
            try:
                con = duck.connect(":memory:")
                register_with(con, self.location)
                con.execute("SET TimeZone = 'UTC'")
                con.execute("SET python_enable_replacements = false")
            except duckdb.Error as exc:
                raise QueryError(f"cannot open the analyst database: {exc}") from exc
            try:
                self._define_views(con, self.files)
                con.execute(load_sql("facts_views"))  # decision_facts, first_outcomes: computed from the spans here
                close_off(con, self.files)
            except QueryError:
                con.close()
                raise
            self._analyst = con
        return self._analyst

    def _attempt(self, fetch: Callable[[], T]) -> T:
        """Run ``fetch``, naming the file when a damaged Parquet page breaks it.

        With ``skip_corrupt`` the damaged file joins :attr:`skipped`, the views
        are redefined without it and ``fetch`` runs again.
        """
        for _ in range(len(self.files) + 2):  # each retry leaves at least one file out
            try:
                return fetch()
            except duckdb.Error as exc:
                # a parse/bind/catalog error (a typo) never asks the files: on s3:// that would be a HEAD each
                if not isinstance(exc, _NOT_ABOUT_FILES) and any(self._stamp(path) is None for path in self._reading()):
                    # A compaction replaced files this store had listed: read the live set instead.
                    self.refresh()
                    continue
                if isinstance(exc, duckdb.PermissionException):
                    raise ReadOnlyViolation(
                        f"refused: {str(exc).splitlines()[0]} (analyst SQL reads only the dataset's own Parquet files)"
                    ) from exc
                found = self._find_damaged(exc)
                if not found:
                    raise QueryError(f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
                if not self.skip_corrupt:
                    raise found[0] from exc
                self.refresh()
        raise QueryError(f"files in {self.dataset} kept changing while damaged ones were being left out; retry")

    def _reading(self) -> list[str]:
        return self.files if self._scope is None else self._scope

    def _find_damaged(self, exc: duckdb.Error) -> list[CorruptFileError]:
        reading = self._reading()
        if not reading or not could_be_a_bad_file(exc):
            return []
        stamps = {path: self._stamp(path) for path in reading}
        unproven = [path for path in reading if stamps[path] is None or self._decoded.get(path) != stamps[path]]
        # A time cast to nanoseconds that failed: reading the time columns (footers, for our files) costs less than
        # decoding every file, and such a file decodes alone anyway.
        found = self._find_out_of_range(reading, stamps) if isinstance(exc, duckdb.ConversionException) else []
        if found:
            unproven = []
        else:
            found = find_corrupt(self._con, unproven)
        bad = {problem.path for problem in found}
        for path in unproven:
            stamp = stamps[path]
            if stamp is not None and path not in bad:
                self._decoded[path] = stamp
        for problem in found:
            stamp = stamps[problem.path]
            if stamp is not None:
                self._bad[problem.path] = (stamp, problem)
        return found

    def _find_out_of_range(
        self, reading: Sequence[str], stamps: Mapping[str, tuple[int, int] | None]
    ) -> list[CorruptFileError]:
        """The files of ``reading`` holding a span time that does not fit in nanoseconds, read past any statistics.

        Admission decided from the footer (its Arrow schema, its statistics),
        which another writer may have got wrong; a file that decodes alone but
        not cast to nanoseconds with the others is named here, after the fact.
        Each file is read at most once per (size, mtime).
        """
        found = []
        for path in reading:
            stamp = stamps.get(path)
            if stamp is None or self._times_read.get(path) == stamp:
                continue
            problem = self._time_problem(path, statistics=False)
            if problem is not None:
                found.append(CorruptFileError(path, problem))
            else:
                self._times_read[path] = stamp
        return found

    # --- running SQL ----------------------------------------------------------
    @staticmethod
    def _arrow(relation: duckdb.DuckDBPyRelation | None) -> pa.Table:
        if relation is None:
            return pa.table({})
        # DuckDB 2 renamed Relation.arrow() to to_arrow_table().
        fetch = getattr(relation, "to_arrow_table", None) or relation.arrow
        table: pa.Table = fetch()
        return table

    def _execute(self, sql: str) -> pa.Table:
        """Run one shipped query on the internal connection; its rows as an Arrow table.

        Executed directly rather than through ``con.sql(...)``: a relation binds
        its query once to describe it and again to run it, and binding the
        views costs more than a point lookup's scan.
        """
        result = self._con.execute(sql)
        if result.description is None:
            return pa.table({})
        return duck.arrow(result)  # copies the rows once (DuckDB 2 warns so): a lookup's rows are few

    def query(self, sql: str, params: Params = None) -> pa.Table:
        """Run analyst ``sql`` read-only on the dataset's views; returns an Arrow table.

        Parameters are bound, never interpolated. Every statement must be a
        query (see :mod:`otel_replay.analyst`); with several, the last one's
        result is returned.

        Raises:
            ReadOnlyViolation: a statement would write, attach, configure, or
                read a file that is not one of the dataset's.
            CorruptFileError: a dataset file is damaged (names it), unless
                the store skips corrupt files.
            QueryError: DuckDB refused or failed the query.

        """

        def fetch() -> pa.Table:
            con = self._analyst_con()
            statements = check_statements(con, sql)
            if params is not None and len(statements) > 1:
                raise QueryError(f"parameters bind to one statement; the SQL holds {len(statements)}")
            result = pa.table({})
            for statement in statements:
                result = self._arrow(con.sql(statement, params=params))
            return result

        with self._lock:
            return self._attempt(fetch)

    def rows(self, sql: str, params: Params = None) -> list[dict[str, Any]]:
        """Like :meth:`query`, as a list of dicts (a repeated column name gets ``_2``, ``_3``)."""
        names, values = table_rows(self.query(sql, params))
        return [dict(zip(names, row, strict=True)) for row in values]

    def run(self, name: str, **variables: Any) -> list[dict[str, Any]]:
        """Run ``queries/<name>.sql`` with DuckDB variables set (``SET VARIABLE``).

        Every variable the file reads and the call does not give is set to
        NULL first: a variable persists on the connection, and a value left by
        an earlier call must never leak into this one. ``calibration`` and
        ``decision_summary`` read compaction's facts files, as :meth:`calibration` does.
        """
        if name in _FACTS_QUERIES:
            return self._run_with_facts(name, **variables)
        return self._run(name, None, variables)

    def run_for(self, name: str, ids: Mapping[str, str | None], **variables: Any) -> list[dict[str, Any]]:
        """Like :meth:`run`, reading only the files that may hold rows carrying one of ``ids``.

        ``ids`` maps an indexed column (``correlation_id``, ``trace_id``,
        ``session_id``, ``record_id``) to a value; the dataset's side index
        (written by ``otel-replay compact``) names the compacted files holding
        it, and every file written since the index is read too. Without an
        index (or with no id that is not ``None``) every file is read. Use it
        for a query whose rows come from spans carrying one of ``ids``, plus
        the outcomes of the decisions among them. For a query that joins
        outcomes (the chains, ``traces``), an outcome may be stored under any
        correlation id and in any file: the side index also maps each
        decision id to the files holding its outcomes, and when one of the
        decisions in the result has an outcome in a file that was not read,
        the query runs again with those files too. The rows are those of
        :meth:`run`. A dataset holding storage schema version 1 files
        (outcome decision ids only in the JSON) is read whole for such a query.
        A lookup the index narrowed to a few files is planned without DuckDB
        optimizers that cost more planning than they save on a handful of
        rows (``_LEAN_OPTIMIZERS``; only on the default in-memory database,
        as DuckDB keeps that setting per database); the rows are the same.
        ``calibration`` and ``decision_summary`` read every decision, as in :meth:`run`.
        """
        if name in _FACTS_QUERIES:  # every decision, whatever the ids: as run() reads them
            return self._run_with_facts(name, **variables)
        given = {key: str(value) for key, value in ids.items() if value is not None}
        return self._run(name, given or None, variables)

    def _run(self, name: str, ids: _Ids | None, variables: Mapping[str, Any]) -> list[dict[str, Any]]:
        sql = load_sql(name)
        for key in variables:
            if not _IDENT.fullmatch(key):
                raise QueryError(f"bad variable name {key!r} for {name}.sql")
            if key.startswith("otel_replay_"):
                raise QueryError(f"variable {key!r} for {name}.sql is the store's own (it names the files read)")
        # The store's own variables (otel_replay_*) are set below, never reset to NULL.
        values = dict.fromkeys(name for name in _VARIABLE.findall(sql) if not name.startswith("otel_replay_"))
        values.update(variables)

        outcomes = _READS_OUTCOMES.search(sql) is not None
        # Outcomes looked up by decision id: a version 1 file keeps that id only in the JSON.
        by_decision = outcomes or (ids is not None and "outcome_decision_id" in ids)

        def fetch() -> pa.Table:
            self._listing = None  # list the partitions again on each attempt (a retry follows a refresh)
            scope = self._narrow(ids, outcomes=by_decision) if ids else None
            if scope is not None and not scope:
                return pa.table({})  # no file can hold the id: every shipped lookup is empty over no rows
            for key, value in values.items():
                self._set(self._con, key, value)
            table = self._execute_over(sql, scope)
            if outcomes and scope is not None:
                wider = self._with_outcomes(scope, table)
                if wider is not None:  # an outcome of a decision shown is stored in a file not read
                    table = self._execute_over(sql, wider)
            return table

        with self._lock:
            try:
                names, rows = table_rows(self._attempt(fetch))
            finally:
                self._scope = None
                self._listing = None
        return [dict(zip(names, row, strict=True)) for row in rows]

    def _execute_over(self, sql: str, scope: list[str] | None) -> pa.Table:
        """Run ``sql`` with the views pointed at ``scope`` (``None``: every file)."""
        self._scope = scope
        reading = self.files if scope is None else scope
        if reading != self._pointed:  # the variables stay set between lookups of the same files
            if self._current_source and self._legacy_outcomes(reading):
                # A file the views were not defined for (an older writer's, newer than the last refresh).
                self._define_views(self._con, self.files + [p for p in reading if p not in self.files])
            self._point_at(self._con, reading)
            self._pointed = list(reading)
        self._plan_lean(self._may_plan_lean and scope is not None and len(scope) <= _LEAN_FILES)
        return self._execute(sql)

    def _plan_lean(self, lean: bool) -> None:
        """Disable :data:`_LEAN_OPTIMIZERS` on the internal connection for a point lookup, enable them otherwise."""
        if lean and self._lean_names is None:
            known = {name for (name,) in self._con.execute("SELECT name FROM duckdb_optimizers()").fetchall()}
            self._lean_names = ",".join(name for name in _LEAN_OPTIMIZERS if name in known)  # DuckDB 1.x lacks some
        disabled = (self._lean_names or "") if lean else ""
        if disabled != self._lean:
            self._con.execute(f"SET disabled_optimizers = '{disabled}'")  # names from the list above, not input
            self._lean = disabled

    def _candidates(self, wanted: Sequence[tuple[str, str]]) -> list[str] | None:
        """The live files that may hold one of ``wanted`` ((kind, id) pairs); ``None`` when nothing is indexed.

        The side index names the compacted files; of the files newer than it,
        only those whose own ids (read once each, by the stamp of their last
        check: :class:`~.storage.tail_index.TailIndex`) may match. A file never
        checked yet is kept, checked by :meth:`_usable`, and indexed next time.

        Raises:
            DatasetError: a manifest or index cannot be read.

        """
        if self._listing is None:  # one listing per lookup: the chain's files and its outcomes' agree
            self._listing = partition_listing(self.location, self._snapshot)
        split = indexed_and_tail(self.location, wanted, snapshot=self._snapshot, listing=self._listing)
        if split is None:
            return None
        hits, tail = split
        return sorted(hits + self._tail.holding(tail, wanted, self._checked))

    def _narrow(self, ids: _Ids, *, outcomes: bool = False) -> list[str] | None:
        """The checked files that may hold ``ids`` (see :func:`~.side_index.files_for`); ``None``: every file.

        ``outcomes``: the query finds outcomes by their decision id (see :meth:`_with_outcomes`).
        """
        if not self.files:
            return None  # the views stand on the empty source until refresh() finds files
        wanted = [
            (kind, value) for kind, values in ids.items() for value in ([values] if isinstance(values, str) else values)
        ]
        try:
            found = self._candidates(wanted)
        except DatasetError as exc:
            _log.warning("otel-replay: side index not used, reading every file: %s", exc)
            return None
        if found is None:
            return None
        scope = self._usable(found)
        if outcomes and scope and self._legacy_outcomes(self.files + scope):
            # A version 1 outcome names its decision only in the JSON, which nothing indexes: every file,
            # arrivals since the last refresh included. (A version 1 file newer than the index is always in
            # the scope of a lookup by decision id: the tail index cannot narrow it by that kind.)
            return sorted(set(self.files).union(scope))
        return scope

    def _with_outcomes(self, scope: list[str], result: pa.Table) -> list[str] | None:
        """``scope`` plus the files holding outcomes of the decisions in ``result``; ``None``: nothing to add.

        An outcome can be stored under any correlation id (or none) and in any
        file. What a chain shows of a decision's outcome depends only on that
        decision's outcome spans, so it is exact when every file the side
        index names for the shown decisions' outcomes was read (of the files
        newer than the index, every one that holds such an outcome). The
        result's ``record_id`` column holds those decisions (a query without
        one is run again over every file).
        """
        if result.num_columns == 0:
            return None  # not a query that returns rows
        every = sorted(set(self.files).union(scope))
        if "record_id" not in result.column_names:
            return every
        shown = result.column("record_id")
        if "layer" in result.column_names:  # a chain: decisions are its 'trace' rows
            shown = result.filter(pc.equal(result.column("layer"), "trace")).column("record_id")
        decided = sorted({str(value) for value in shown.to_pylist() if value is not None})
        if not decided:
            return None
        try:
            holding = self._candidates([("outcome_decision_id", decision) for decision in decided])
        except DatasetError as exc:
            _log.warning("otel-replay: side index not used for outcomes, reading every file: %s", exc)
            return every
        if holding is None:
            return every
        listed = set(scope)
        more = self._usable([path for path in holding if path not in listed])
        return sorted(listed.union(more)) if more else None

    def _usable(self, found: Sequence[str]) -> list[str]:
        """``found`` less the files skipped as corrupt; newly seen files are checked first."""
        skipped = {problem.path for problem in self.skipped}
        scope = []
        for path in found:  # not intersected with self.files: that list may predate a compaction
            if path in skipped:
                continue
            problem = self._check(path)
            if problem is None:
                scope.append(path)
            elif problem is VANISHED:
                scope.append(path)  # gone since the listing: the query fails on it, re-lists and retries (_attempt)
            elif self.skip_corrupt:
                _log.warning("otel-replay: skipping %s", problem)
                self.skipped.append(problem)
            else:
                raise problem
        return scope

    # --- records: only rows that pass the seal check act ----------------------
    @property
    def seal_check(self) -> SealCheck:
        """The rule rows must pass to drive replay and the gate (built on first use)."""
        if self._seal_check is None:
            keys = self._keys if self._keys is not None else load_signing_key(create=False)
            self._seal_check = SealCheck(keys, require_signed=self.require_signed)
        return self._seal_check

    def record_rows(self, **filters: Any) -> list[StoredRecord]:
        """Every stored row of ``queries/record.sql`` matching ``filters`` as the seal check sees it (none trusted yet).

        ``record_id=`` and ``decision_ids=`` (a decision's outcomes) are narrowed by the side index;
        other filters (a gate record's decision id lives in the JSON) read every file.
        """
        if set(filters) == {"record_id"} and filters["record_id"] is not None:
            rows = self.run_for("record", {"record_id": str(filters["record_id"])}, **filters)
        elif set(filters) == {"decision_ids"} and filters["decision_ids"]:
            # the outcomes of these decisions, wherever stored: the side index maps decision ids to files
            decided = [str(d) for d in filters["decision_ids"]]
            rows = self._run("record", {"outcome_decision_id": decided}, {"decision_ids": decided})
        else:
            rows = self.run("record", **filters)  # a gate's decision id lives in the JSON: not indexed
        return [stored_record(row) for row in rows]

    def trusted_record(self, record_id: str, *, what: str = "record") -> TrustedRecord:
        """The one verified row of ``record_id``.

        Raises:
            RecordNotFound: nothing claims the id.
            UntrustedRecord: rows claim it, none is sealed and verified.
            ConflictingRecords: verified rows claim it with different content.

        """
        rows = self.record_rows(record_id=record_id)
        found = select_trusted(record_id, rows, self.seal_check, where=str(self.dataset), what=what)
        for problem in found.ignored:
            _log.warning("otel-replay: ignoring an untrusted row claiming %s", problem)
        return found

    def record(self, record_id: str) -> DecisionRecord:
        """Rehydrate the decision record ``record_id`` from its verified row."""
        found = self.trusted_record(record_id, what="decision record")
        kind = found.attributes.get(sc.KIND)
        if kind != sc.KIND_DECISION:
            raise RecordNotFound(
                f"record {record_id!r} in {self.dataset} is a{'n' if str(kind)[:1] in 'aeiou' else ''} "
                f"{kind} record, not a decision"
            )
        return DecisionRecord.from_attributes(found.attributes, found.span)

    def decision_span(self, decision_id: str) -> SpanRef | None:
        """Where the verified decision ``decision_id`` is stored, or ``None`` when nothing claims it."""
        try:
            return self.record(decision_id).span
        except RecordNotFound:
            return None

    def verified_outcomes(self, decision_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The verified outcome of each decision that has one (decision id -> outcome fields).

        Outcomes are immutable, so a decision with two verified outcomes (a
        dataset written without outcome claims) has none that can be trusted:
        its entry has ``outcome_id`` and ``outcome_correct`` ``None``, the
        outcome ids in ``conflicting`` and a ``note`` naming them and their
        files, and a warning is logged. The other decisions read as usual.
        """
        if not decision_ids:
            return {}
        rows = self.record_rows(decision_ids=list(decision_ids))
        trusted, _ = split_trusted(rows, self.seal_check)
        found: dict[str, dict[str, Any]] = {}
        for rec in trusted:
            attrs = rec.attributes
            if attrs.get(sc.KIND) != sc.KIND_OUTCOME:
                continue
            decision_id = str(attrs.get(sc.OUTCOME_DECISION_ID))
            outcome = {
                "outcome_id": rec.record_id,
                "decision_id": decision_id,
                "outcome_correct": attrs.get(sc.OUTCOME_CORRECT),
                "note": attrs.get(sc.OUTCOME_NOTE),
                "recorded_at": rec.start_ns,
                "file": rec.file,
            }
            earlier = found.get(decision_id)
            if earlier is None:
                found[decision_id] = outcome
            elif earlier["outcome_id"] != rec.record_id and rec.record_id not in earlier.get("conflicting", ()):
                found[decision_id] = _conflict(earlier, outcome)
        return found

    def has_outcome(self, decision_id: str) -> bool:
        """Whether a verified outcome for ``decision_id`` is stored."""
        return decision_id in self.verified_outcomes([decision_id])

    def intent_decisions(self, correlation_id: str) -> list[DecisionRecord]:
        """The decisions of ``correlation_id`` as their verified commit intents sealed them, oldest first.

        What a chain shows for a decision whose process died inside its
        ``audit()`` block after a commit (no decision span was stored). One
        per decision: its latest intent.
        """
        rows = self.run_for("record", {"correlation_id": correlation_id}, intent_correlation_id=correlation_id)
        trusted, _ = split_trusted([stored_record(row) for row in rows], self.seal_check)
        found: dict[str, DecisionRecord] = {}
        for rec in sorted(trusted, key=lambda r: (r.start_ns, r.record_id)):
            text = rec.attributes.get(sc.GATE_DECISION_RECORD)
            if rec.attributes.get(sc.GATE_EXECUTED) != sc.GATE_INTENT or text is None:
                continue
            data = loads(text, where=f"decision of intent record {rec.record_id}")
            decision_id = rec.attributes.get(sc.GATE_DECISION_ID)
            if not isinstance(data, dict) or data.get(sc.RECORD_ID) != decision_id:
                raise DatasetError(f"intent record {rec.record_id} holds another decision than {decision_id}")
            found[str(decision_id)] = DecisionRecord.from_attributes(
                data, SpanRef(rec.trace_id, rec.span_id, rec.start_ns)
            )
        return list(found.values())

    def unknown_commits_for(self, decision_id: str) -> list[tuple[str, Action]]:
        """The commit intents of ``decision_id`` no commit record answers: executed? unknown - check the rail.

        Each as (intent gate record id, action). The gate seals an intent
        durably before it calls the rail and a ``committed`` or
        ``commit_failed`` record naming it after the rail answered: an intent
        alone means the process died inside the rail (or before its record
        was stored), so whether the action happened is known to the rail only.
        """
        return self.unknown_commits_of([decision_id]).get(decision_id, [])

    def unknown_commits_of(self, decision_ids: Sequence[str]) -> dict[str, list[tuple[str, Action]]]:
        """:meth:`unknown_commits_for` of several decisions in one read: decision id -> its unanswered intents."""
        if not decision_ids:
            return {}
        rows = self.record_rows(gate_decision_ids=[str(d) for d in decision_ids])
        trusted, refused = split_trusted(rows, self.seal_check)
        for problem in refused:
            _log.warning("otel-replay: ignoring an untrusted gate row %s", problem)
        records = sorted(
            (r for r in trusted if r.attributes.get(sc.KIND) == sc.KIND_GATE), key=lambda r: (r.start_ns, r.record_id)
        )
        answered = {r.attributes.get(sc.GATE_INTENT_ID) for r in records}
        unknown: dict[str, list[tuple[str, Action]]] = {}
        for rec in records:
            attrs = rec.attributes
            if attrs.get(sc.GATE_EXECUTED) != sc.GATE_INTENT or rec.record_id in answered:
                continue
            data = loads(attrs.get(sc.GATE_ACTION), where=f"action of intent record {rec.record_id}") or {}
            try:
                action = Action(data["type"], data.get("arguments") or {}, data.get("cost"))
            except (KeyError, TypeError, ValueError) as exc:
                raise DatasetError(f"intent record {rec.record_id} stores an action that is not one: {exc}") from None
            found = unknown.setdefault(str(attrs.get(sc.GATE_DECISION_ID)), [])
            if all(r != rec.record_id for r, _ in found):
                found.append((rec.record_id, action))
        return unknown

    def audit_entries(self, correlation_id: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Audit entries (all, or for one correlation id) in the order they were recorded."""
        rows = self.run("audit_entries", correlation_id=correlation_id, entry_limit=limit)
        for row in rows:
            row["payload"] = loads(row["payload"], where=f"payload of audit entry {row['entry_id']}") or {}
        return rows

    def causal_tree(self, record_id: str) -> list[dict[str, Any]]:
        """The decision span of ``record_id`` and every span below it, depth-first.

        A description, not an action: when one span claims the id it is used
        as stored (no key needed); when several do, only the verified one is.
        """
        rows = [r for r in self.record_rows(record_id=record_id) if r.name == sc.SPAN_DECISION]
        if not rows:
            raise RecordNotFound(f"no decision record {record_id!r} in {self.dataset}")
        places = {(r.trace_id, r.span_id) for r in rows}
        if len(places) == 1:
            trace_id, span_id = places.pop()
        else:
            span = self.record(record_id).span
            trace_id, span_id = span.trace_id, span.span_id
        return self.run("causal_tree", root_trace_id=trace_id, root_span_id=span_id)

    def calibration(self, decision_type: str | None = None) -> list[dict[str, Any]]:
        """Confidence buckets against outcome correctness (``queries/calibration.sql``).

        Reads compaction's facts files for the partitions they cover and the
        spans for everything else (:mod:`otel_replay.storage.facts`): the same
        rows as joining the ``decisions`` and ``outcomes`` views.
        """
        return self._run_with_facts("calibration", decision_type=decision_type)

    def decision_summary(self, decision_type: str | None = None) -> list[dict[str, Any]]:
        """A scan of every decision: per type, count, count with a confidence, mean confidence.

        ``queries/decision_summary.sql``; the same figures as grouping the
        ``decisions`` view, read like :meth:`calibration`.
        """
        return self._run_with_facts("decision_summary", decision_type=decision_type)

    def _run_with_facts(self, name: str, **variables: Any) -> list[dict[str, Any]]:
        """:meth:`run` with ``span_facts`` pointed at the facts files usable for the files read."""
        with self._lock:
            # the views over facts, apart from views.sql so that opening a dataset does not bind them
            for attempt in range(2):
                try:
                    self._con.execute(load_sql("facts_views"))
                    break
                except duckdb.Error as exc:
                    if attempt or isinstance(exc, _NOT_ABOUT_FILES):
                        raise QueryError(f"defining the facts views over {self.dataset}: {message_line(exc)}") from exc
                    self.refresh()  # binding reads the files: a compaction may have replaced the listed ones
            # _run reads every file: the plan covers them (remote ones with the sizes their listing gave)
            sizes = {path: stamp[0] for path, stamp in self._checked.items()}
            used = bool(self.files) and point_facts(self._con, self.files, sizes, self.location)
            try:
                return self._run(name, None, variables)
            except QueryError:
                if not used:
                    raise
                _log.warning("otel-replay: %s failed on the facts files; computing it from the spans", name)
                unpoint_facts(self._con)
                used = False
                return self._run(name, None, variables)
            finally:
                if used:
                    unpoint_facts(self._con)

    def verify(self, keys: Keys) -> VerifyReport:
        """Check every record span's seal: hash, signature (with ``keys``) and chain links.

        Files left out as corrupt (``skip_corrupt``) are listed in
        :attr:`VerifyReport.unreadable_files`, and the report is then not ok:
        what could not be read was not checked.
        """
        if not self.files:
            report = VerifyReport()
            report.unreadable_files = [problem.path for problem in self.skipped]
            return report
        from otel_replay.storage.retention_marks import expected_before, read_marks, vouched_links

        marks, refused_marks = read_marks(self.location, keys)
        gates: list[StoredRecord] = []

        def rows() -> Iterator[StoredRecord]:
            for row in self.run("sealed_records"):
                rec = stored_record(row)
                if rec.attributes.get(sc.KIND) == sc.KIND_GATE:
                    gates.append(rec)  # kept for the commit intents no commit record answers
                yield rec

        report = verify_records(rows(), keys, dropped=vouched_links(marks), expected=expected_before(marks))
        report.problems += refused_marks
        report.unknown_commits = _unknown_commits(gates)
        report.unreadable_files = [problem.path for problem in self.skipped]
        return report

    def close(self) -> None:
        """Close the DuckDB connections."""
        with self._lock:
            if self._analyst is not None:
                self._analyst.close()
                self._analyst = None
            self._con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _unknown_commits(rows: Sequence[StoredRecord]) -> list[VerifyProblem]:
    """The commit intents among ``rows`` that no gate row answers (names as its intent): executed? unknown."""
    gates = [r for r in rows if r.attributes.get(sc.KIND) == sc.KIND_GATE]
    answered = {r.attributes.get(sc.GATE_INTENT_ID) for r in gates}
    unknown: dict[str, VerifyProblem] = {}
    for rec in gates:
        attrs = rec.attributes
        if attrs.get(sc.GATE_EXECUTED) != sc.GATE_INTENT or rec.record_id in answered or rec.record_id in unknown:
            continue
        action = loads(attrs.get(sc.GATE_ACTION), where=f"action of intent record {rec.record_id}") or {}
        what = action.get("type") if isinstance(action, dict) else None
        unknown[rec.record_id] = VerifyProblem(
            rec.record_id,
            f"commit intent of {what!r} for decision {attrs.get(sc.GATE_DECISION_ID)} has no commit record: "
            "executed? unknown - check the rail",
            rec.file,
        )
    return list(unknown.values())


def _recover_logs(dataset: str) -> None:
    """Convert capture write-ahead logs a crashed process left on ``dataset`` (best effort: a reader may not write).

    Their records were acknowledged durable (a gate's intent and commit
    records): a reader must see them, not only the next ``configure()``.
    """
    from otel_replay.capture.write_ahead import log_root, recover

    try:
        if not log_root(dataset).is_dir():
            return
        recover(dataset)
    except Exception as exc:  # noqa: BLE001 - the logs stay on disk for the next configure() to convert
        _log.warning("otel-replay: could not convert the write-ahead logs left in %s: %s", dataset, exc)


def open_store(
    dataset: str | os.PathLike[str], *, skip_corrupt: bool = False, keys: Keys = None, require_signed: bool = True
) -> Store:
    """Open ``dataset`` for querying (``otel_replay.open``); see :class:`Store` for the arguments."""
    return Store(dataset, skip_corrupt=skip_corrupt, keys=keys, require_signed=require_signed)


def _conflict(earlier: dict[str, Any], outcome: dict[str, Any]) -> dict[str, Any]:
    """A decision's entry once a second verified outcome was found: no outcome, the conflict named."""
    ids = [*earlier.get("conflicting", [earlier["outcome_id"]]), outcome["outcome_id"]]
    files = [*earlier.get("files", [earlier["file"]]), outcome["file"]]
    where = ", ".join(f"{i} in {f}" for i, f in zip(ids, files, strict=True))
    note = f"conflicting outcomes: {where}; outcomes are immutable, so none is shown"
    _log.warning("otel-replay: decision %s has %d verified outcomes (%s)", outcome["decision_id"], len(ids), where)
    return {
        "outcome_id": None,
        "decision_id": outcome["decision_id"],
        "outcome_correct": None,
        "note": note,
        "recorded_at": None,
        "file": None,
        "conflicting": ids,
        "files": files,
    }
