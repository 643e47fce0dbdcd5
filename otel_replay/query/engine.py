"""The DuckDB engine under a :class:`~otel_replay.query.store.Store`: views, shipped queries, narrowing, plans.

Storage knows the span schema and the SQL; it knows nothing of the capture
API. DuckDB and pyarrow errors are converted here, at the boundary, into
:class:`QueryError` / :class:`CorruptFileError` with the cause kept.

Two DuckDB databases serve one store: the internal one runs the shipped
``queries/*.sql``, narrowed by the side index to the files that may hold the
ids asked for; analyst SQL runs on a second one closed off per
:mod:`otel_replay.query.analyst`: it reads the dataset's files and nothing
else, and writes nothing. Which files are live is :mod:`otel_replay.query.files`'s.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from otel_replay import _duck as duck
from otel_replay._corrupt import could_be_a_bad_file, find_corrupt
from otel_replay.errors import CorruptFileError, DatasetError, QueryError, ReadOnlyViolation, message_line
from otel_replay.exporters.schema import SPAN_SCHEMA
from otel_replay.location import Location, register_with
from otel_replay.query.analyst import check_statements, close_off, table_rows
from otel_replay.query.catalog import ViewCatalog
from otel_replay.query.files import VANISHED, FileTriage, literal_paths, note_skipped
from otel_replay.query.keys import probe_array
from otel_replay.query.logs import define_log_views, log_files
from otel_replay.storage.facts import point_facts, unpoint_facts
from otel_replay.storage.side_index import Listing, indexed_and_tail, partition_listing
from otel_replay.storage.tail_index import TailIndex

__all__ = ["Engine", "Ids", "Params", "load_sql"]

_log = logging.getLogger(__name__)
_FILES_VAR = "otel_replay_files"
_IDENT = re.compile(r"[a-z_][a-z0-9_]*")
_QUERY_NAME = re.compile(r"[a-z_][a-z0-9_]*(?:/[a-z_][a-z0-9_]*)?")
_VARIABLE = re.compile(r"getvariable\('([a-z_][a-z0-9_]*)'\)")
_UNION_VAR = "otel_replay_union_by_name"
_LEGACY_VAR = "otel_replay_legacy_outcomes"
_SCALARS = frozenset({str, int, float, bool, bytes})  # variable values Engine._set may skip setting again
_LOG_VIEWS = re.compile(r"\b(?:log_records|genai_events|log_source)\b", re.I)  # analyst SQL that reads log records
_LOG_VIEW_NAMES = ("log_records", "genai_events")  # the views over log_source (queries/log_records.sql)
_FACTS_QUERIES = ("calibration", "decision_summary")  # read compaction's facts files (storage/facts.py)
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
_READ_IDS_UP_TO = 1 << 20  # with no side index, a file without id keys is read for its ids up to this size
Ids = Mapping[str, str | list[str]]  # id column -> value (outcome_decision_id: several)
# A shipped query that joins a decision's outcomes (found by outcome_decision_id, under any correlation id).
_READS_OUTCOMES = re.compile(r"\b(?:outcome_spans_for|outcomes_of|outcomes_in)\s*\(|\b(?:FROM|JOIN)\s+outcomes\b", re.I)
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


@cache
def _catalog() -> ViewCatalog:
    """The shared views and macros: views.sql, the contract evidence, log record and facts views, in that order."""
    return ViewCatalog([load_sql(name) for name in ("views", "contract_verdicts", "log_records", "facts_views")])


_BIND_ATTEMPTS = 5
"""Listings tried when files vanish between a refresh's listing and its binding (retention dropping partitions)."""

_NOT_ABOUT_FILES = (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException, duckdb.InterruptException)
"""DuckDB errors that a vanished or replaced file never causes (a vanished file is an IO or permission error)."""


def _check_utf8(root: str, dataset: Path | str) -> None:
    """Refuse a dataset whose path DuckDB cannot take (it reads only UTF-8 paths), naming the first bad byte."""
    for ch in root:
        if "\udc80" <= ch <= "\udcff":  # a byte of the path that is not UTF-8, as os.fsdecode keeps it
            shown = os.fsencode(str(dataset)).decode("utf-8", "backslashreplace")
            raise DatasetError(
                f"dataset {shown}: its path is not valid UTF-8 (byte 0x{ord(ch) - 0xDC00:02x}), and DuckDB reads "
                "only UTF-8 paths; rename it"
            )


class Engine:
    """The DuckDB connections over one dataset's live files, and the shipped queries run on them.

    Args:
        location: the dataset.
        dataset: the dataset as the store names it (in messages).
        skip_corrupt: leave unreadable Parquet files out (listed in :attr:`skipped`).
        database: a DuckDB database path, default in-memory.

    The views stand on no file until :meth:`refresh`.

    """

    def __init__(self, location: Location, dataset: Path | str, *, skip_corrupt: bool, database: str) -> None:
        """Connect; see the class docstring."""
        _check_utf8(location.root, dataset)
        self.location = location
        self.dataset = dataset
        self.skip_corrupt = skip_corrupt
        self.triage = FileTriage(location)
        self.files: list[str] = []
        # The dataset's log record files (the log_records view reads them); None: not listed since the last refresh.
        # Listed only once a query names a log view (see _want_logs): a store that never reads logs never lists them.
        self.log_files: list[str] | None = None
        self._logs_used = False  # a query named a log view: every refresh lists the log files again
        self.skipped: list[CorruptFileError] = []
        self._analyst: duckdb.DuckDBPyConnection | None = None
        self._scope: list[str] | None = None  # the files the running lookup reads (None: self.files)
        self._pointed: list[str] | None = None  # the files the internal connection's variables name
        self._current_source = False  # span_source defined for files that all have the current columns
        self._listing: Listing | None = None  # the partitions the running lookup searches (listed once per lookup)
        self._shared = 0  # one_listing() scopes open: their lookups keep one listing
        self._every: tuple[Listing, list[str]] | None = None  # a listing's files, joined once
        self._lean: str | None = None  # the optimizers disabled on the internal connection now (None: not set yet)
        self._lean_names: str | None = None  # _LEAN_OPTIMIZERS this DuckDB knows, comma-separated
        # DuckDB keeps disabled_optimizers per database, not per connection: only a database of the
        # store's own (in memory) may be planned lean; a file database may be shared with other connections.
        self._may_plan_lean = database in ("", ":memory:")
        self._tail = TailIndex(self.location)  # ids of the files no side index covers yet
        self._vars: dict[str, tuple[type, Any]] = {}  # what each variable on the internal connection holds
        self._views_con: set[str] = set()  # the shared views and macros defined on the internal connection
        self._views_analyst: set[str] = set()  # ... and on the analyst one
        self._lock = threading.RLock()
        try:
            self._con = duck.connect(database)
            register_with(self._con, self.location)
            self._con.execute("SET TimeZone = 'UTC'")
            # Footers are read once per file, not at every query (binding reads them all with union_by_name).
            self._con.execute("SET parquet_metadata_cache = true")
        except duckdb.Error as exc:
            raise DatasetError(f"cannot open DuckDB database {database}: {exc}") from exc

    def refresh(self) -> None:
        """Rescan the dataset's files, validate new ones, and (re)define the views.

        A file that vanishes between the listing and the check or the binding
        (retention dropped its partition, a compaction's grace period ended)
        is simply not live, and the listing that named it is stale (it may miss
        what replaced the file): the dataset is listed again, up to five times.
        """
        with self._lock:
            self._listing = None  # a lookup sharing a listing (one_listing) lists the partitions again
            for attempt in range(_BIND_ATTEMPTS):
                files, skipped, vanished = self.triage.live({p.path for p in self.skipped}, self.skip_corrupt)
                if vanished and attempt < _BIND_ATTEMPTS - 1:
                    # A listed file went away (a compaction swapped its partition, retention dropped it): the
                    # listing is stale and may miss what replaced it, so list again rather than read less.
                    continue
                self.files, self.skipped = files, skipped
                self._tail.keep_only(files)
                self.log_files = log_files(self.location) if self._logs_used else None
                try:
                    self._define_views(self._con, files)
                except QueryError as exc:
                    vanished = isinstance(exc.__cause__, duckdb.IOException) or any(
                        self.triage.stamp(path) is None for path in files
                    )
                    if attempt == _BIND_ATTEMPTS - 1 or not vanished:
                        raise
                    continue  # a listed file went away before the views bound: list again
                break
            if self._analyst is not None:
                self._analyst.close()
                self._analyst = None

    @contextmanager
    def one_listing(self) -> Iterator[None]:
        """The lookups made inside share one listing of the partitions, taken by the first (one command's lookups).

        Each lookup outside such a scope lists the partitions again, so that
        files written since are found without a refresh; inside it, a chain's
        four lookups (its rows, lost decisions, outcomes, unanswered intents)
        see the dataset as it was at the first, as one command does. A
        refresh inside the scope (a file vanished: a compaction swapped its
        partition) lists it again.
        """
        with self._lock:
            self._shared += 1
            try:
                yield
            finally:
                self._shared -= 1
                if not self._shared:
                    self._listing = self._every = None

    def _define_views(self, con: duckdb.DuckDBPyConnection, files: list[str]) -> None:
        """Define the views on ``con`` over ``files`` (the empty source when there are none)."""
        if con is self._con:
            self._pointed = None  # until the views are defined over ``files``
        try:
            if files:
                # Defining a view binds it, and binding read_parquet costs about 80 µs a file (hive partitions):
                # the views are defined over the first file only, then pointed at every file (each query binds
                # them again over the files it reads: 24 bindings over 20,000 files took 40 s at every open).
                self._point_at(con, files[:1], union=self.triage.union_by_name(files))
                # Every file with the current columns: the cheaper source; any older file: the one that supplies them.
                current = not self.triage.legacy_outcomes(files)
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
            # The shared views and macros (views.sql, the contract and log views) are defined when a query names
            # them (_need): a new span_source may change the columns they were bound with, so none stands now.
            self._defined(con).clear()
            define_log_views(con, self.log_files or [])
            if files:
                self._point_at(con, files)
            if con is self._con:
                self._pointed = list(files)
        except duckdb.Error as exc:
            raise QueryError(f"defining views over {self.dataset}: {exc}") from exc

    def _defined(self, con: duckdb.DuckDBPyConnection) -> set[str]:
        """The names of the shared views and macros (:func:`_catalog`) defined on ``con`` since its source was."""
        return self._views_con if con is self._con else self._views_analyst

    def _need(self, con: duckdb.DuckDBPyConnection, sql: str) -> None:
        """Define on ``con`` the shared views and macros ``sql`` names and those they need, not defined yet.

        Defining binds each one over the files the views are pointed at, so
        for it they are pointed at the first of them only (binding costs about
        80 µs a file), then back at all of them.
        """
        defined = self._defined(con)
        names = _catalog().needed(sql, defined)
        if not names:
            return
        pointed = self._pointed if con is self._con else self.files
        narrowed = pointed is not None and len(pointed) > 1
        if narrowed and pointed is not None:
            self._set(con, _FILES_VAR, literal_paths(pointed[:1]))
        try:
            for name in names:
                con.execute(_catalog().statements[name])  # a DuckDB error: the caller's to judge (_attempt)
                defined.add(name)
        finally:
            if narrowed and pointed is not None:
                self._set(con, _FILES_VAR, literal_paths(pointed))

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

    def _point_at(self, con: duckdb.DuckDBPyConnection, files: Sequence[str], union: bool | None = None) -> None:
        """Set the variables the views read for ``files``: the list, union_by_name, and the legacy-outcome hint.

        ``union``: union_by_name as given rather than as ``files`` need it.
        """
        self._set(con, _FILES_VAR, literal_paths(files) or None)  # each path read as itself, never as a glob
        self._set(con, _UNION_VAR, self.triage.union_by_name(files) if union is None else union)
        self._set(con, _LEGACY_VAR, self.triage.legacy_outcomes(files))

    def _analyst_con(self) -> duckdb.DuckDBPyConnection:
        """The closed-off database analyst SQL runs on (see :mod:`otel_replay.query.analyst`)."""
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
                close_off(con, [*self.files, *(self.log_files or [])])
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
                if not isinstance(exc, _NOT_ABOUT_FILES) and any(
                    self.triage.stamp(path) is None for path in [*self._reading(), *(self.log_files or [])]
                ):
                    # A compaction replaced files this store had listed (spans or log records): read the live set.
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
        """The files the running query reads."""
        return self.files if self._scope is None else self._scope

    def _find_damaged(self, exc: duckdb.Error) -> list[CorruptFileError]:
        """The files being read that ``exc`` may come from and that prove damaged (each then remembered)."""
        reading = self._reading()
        if not reading or not could_be_a_bad_file(exc):
            return []
        stamps = {path: self.triage.stamp(path) for path in reading}
        unproven = [path for path in reading if stamps[path] is None or self.triage.decoded.get(path) != stamps[path]]
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
                self.triage.decoded[path] = stamp
        for problem in found:
            stamp = stamps[problem.path]
            if stamp is not None:
                self.triage.bad[problem.path] = (stamp, problem)
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
            if stamp is None or self.triage.times_read.get(path) == stamp:
                continue
            problem = self.triage.time_problem(path, statistics=False)
            if problem is not None:
                found.append(CorruptFileError(path, problem))
            else:
                self.triage.times_read[path] = stamp
        return found

    @staticmethod
    def _arrow(relation: duckdb.DuckDBPyRelation | None) -> pa.Table:
        """A relation's rows as an Arrow table (an empty one for a statement without rows)."""
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
        """Analyst ``sql`` run read-only (:meth:`otel_replay.query.store.Store.query`)."""

        def fetch() -> pa.Table:
            self._want_logs(sql)
            con = self._analyst_con()
            statements = check_statements(con, sql)
            self._need(con, sql)
            if params is not None and len(statements) > 1:
                raise QueryError(f"parameters bind to one statement; the SQL holds {len(statements)}")
            result = pa.table({})
            for statement in statements:
                result = self._arrow(con.sql(statement, params=params))
            return result

        with self._lock:
            return self._attempt(fetch)

    def _want_logs(self, sql: str) -> None:
        """List the log record files and point the log views at them, once ``sql`` names a log view.

        Until then the log views stand on an empty table: on an object store a
        listing of ``logs/`` is requests at every refresh that a store reading
        only spans has no use for.
        """
        if self.log_files is not None or _LOG_VIEWS.search(sql) is None:
            return
        self._logs_used = True
        self.log_files = log_files(self.location)
        try:
            define_log_views(self._con, self.log_files)
            self._defined(self._con).difference_update(_LOG_VIEW_NAMES)  # bound over the source they replace
        except duckdb.Error as exc:
            raise QueryError(f"defining the log views over {self.dataset}: {exc}") from exc
        if self._analyst is not None:  # closed off to the files it was made with: made again with the log files
            self._analyst.close()
            self._analyst = None

    def rows(self, sql: str, params: Params = None) -> list[dict[str, Any]]:
        """:meth:`query` as a list of dicts (:meth:`otel_replay.query.store.Store.rows`)."""
        names, values = table_rows(self.query(sql, params))
        return [dict(zip(names, row, strict=True)) for row in values]

    def run(self, name: str, **variables: Any) -> list[dict[str, Any]]:
        """Run ``queries/<name>.sql`` over every file (:meth:`otel_replay.query.store.Store.run`)."""
        if name in _FACTS_QUERIES:
            return self.run_with_facts(name, **variables)
        return self.run_ids(name, None, variables)

    def run_for(self, name: str, ids: Mapping[str, str | None], **variables: Any) -> list[dict[str, Any]]:
        """Like :meth:`run`, reading only the files that may hold rows carrying one of ``ids``.

        What is read and why is told once, at :meth:`otel_replay.query.store.Store.run_for` (the public
        method over this one). Here: a lookup the index narrowed to a few files is planned without the DuckDB
        optimizers that cost more planning than they save (``_LEAN_OPTIMIZERS``, default in-memory database
        only); ``calibration`` and ``decision_summary`` read every decision, as in :meth:`run`.
        """
        if name in _FACTS_QUERIES:  # every decision, whatever the ids: as run() reads them
            return self.run_with_facts(name, **variables)
        given = {key: str(value) for key, value in ids.items() if value is not None}
        return self.run_ids(name, given or None, variables)

    def run_ids(self, name: str, ids: Ids | None, variables: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Run ``queries/<name>.sql`` over the files that may hold ``ids`` (``None``: every file); ``variables`` set."""
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
            if not self._shared:
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
                if not self._shared:
                    self._listing = self._every = None
        return [dict(zip(names, row, strict=True)) for row in rows]

    def _execute_over(self, sql: str, scope: list[str] | None) -> pa.Table:
        """Run ``sql`` with the views pointed at ``scope`` (``None``: every file)."""
        self._scope = scope
        reading = self.files if scope is None else scope
        if reading != self._pointed:  # the variables stay set between lookups of the same files
            if self._current_source and self.triage.legacy_outcomes(reading):
                # A file the views were not defined for (an older writer's, newer than the last refresh).
                self._define_views(self._con, self.files + [p for p in reading if p not in self.files])
            self._point_at(self._con, reading)
            self._pointed = list(reading)
        self._need(self._con, sql)
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

    def _candidates(self, wanted: Sequence[tuple[str, str]]) -> list[str]:
        """The live files that may hold one of ``wanted`` ((kind, id) pairs).

        The side index names the compacted files; of the files newer than it
        (every file, in a dataset no compaction has indexed, where a file over
        1 MiB without keys is left to the query), only those whose own ids may
        match: the keys in their footer (files this otel-replay wrote), else
        their ids read once each, by the stamp of their last check
        (:class:`~otel_replay.storage.tail_index.TailIndex`). A file never
        checked yet is kept, checked by :meth:`_usable`, and indexed next time.

        Raises:
            DatasetError: a manifest or index cannot be read.

        """
        if self._listing is None:  # one listing per lookup: the chain's files and its outcomes' agree
            self._listing = partition_listing(self.location, self.triage.snapshot)
        listing = self._listing
        # No side index anywhere (a day no compaction has touched): the index search is skipped, not run over every
        # file (an empty listing still checks the kinds asked for).
        indexed = any(manifest is not None and index is not None for _, manifest, _, index in listing)
        searched = listing if indexed else []
        split = indexed_and_tail(self.location, wanted, snapshot=self.triage.snapshot, listing=searched)
        keys, tables = self.triage.footer_keys, self.triage.key_tables
        if split is None:
            # No side index anywhere: every live file is narrowed the same way, but a big file without keys
            # is left to the query (its row groups' statistics narrow it; reading its ids would cost more).
            if self._every is None or self._every[0] is not listing:  # once per listing (one_listing shares it)
                self._every = (listing, [head + name for head, _, live, _ in listing for name in live])
            every = self._every[1]
            sizes = self.triage.checked
            big = [
                p
                for p in every
                if p not in tables and p not in keys and (sizes.get(p) or (0, 0))[0] > _READ_IDS_UP_TO
            ]
            left = set(big)
            split = big, [p for p in every if p not in left] if left else every
        hits, tail = split
        # Files vouched for by their key log: one search of their partition's key table; the rest file by file.
        held, rest = self.triage.narrow(tail, probe_array(wanted))
        return sorted(hits + held + self._tail.holding(rest, wanted, self.triage.checked, keys))

    def _narrow(self, ids: Ids, *, outcomes: bool = False) -> list[str] | None:
        """The checked files that may hold ``ids``; ``None``: every file (see :func:`~otel_replay.storage.files_for`).

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
        scope = self._usable(found)
        if outcomes and scope and self.triage.legacy_outcomes(self.files + scope):
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
            problem = self.triage.check(path)
            if problem is None:
                scope.append(path)
            elif problem is VANISHED:
                scope.append(path)  # gone since the listing: the query fails on it, re-lists and retries (_attempt)
            elif self.skip_corrupt:
                note_skipped(problem)
                self.skipped.append(problem)
            else:
                raise problem
        return scope

    def run_with_facts(self, name: str, **variables: Any) -> list[dict[str, Any]]:
        """:meth:`run` with ``span_facts`` pointed at the facts files usable for the files read."""
        with self._lock:
            # the views over facts, apart from views.sql so that opening a dataset does not bind them
            for attempt in range(2):
                try:
                    facts = load_sql("facts_views")
                    self._need(self._con, f"{facts}\n{load_sql(name)}")  # what the facts views and the query name
                    self._con.execute(facts)
                    break
                except duckdb.Error as exc:
                    if attempt or isinstance(exc, _NOT_ABOUT_FILES):
                        raise QueryError(f"defining the facts views over {self.dataset}: {message_line(exc)}") from exc
                    self.refresh()  # binding reads the files: a compaction may have replaced the listed ones
            # _run reads every file: the plan covers them (remote ones with the sizes their listing gave)
            sizes = {path: stamp[0] for path, stamp in self.triage.checked.items()}
            used = bool(self.files) and point_facts(self._con, self.files, sizes, self.location)
            try:
                return self.run_ids(name, None, variables)
            except QueryError:
                if not used:
                    raise
                _log.warning("otel-replay: %s failed on the facts files; computing it from the spans", name)
                unpoint_facts(self._con)
                used = False
                return self.run_ids(name, None, variables)
            finally:
                if used:
                    unpoint_facts(self._con)

    def close(self) -> None:
        """Close the DuckDB connections."""
        with self._lock:
            if self._analyst is not None:
                self._analyst.close()
                self._analyst = None
            self._con.close()
