"""DuckDB over the Parquet dataset: views, ``queries/*.sql``, rehydration and verify.

Storage knows the span schema and the SQL; it knows nothing of the capture API.
DuckDB and pyarrow errors are converted here, at the boundary, into
:class:`QueryError` / :class:`CorruptFileError` with the cause kept.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from otel_replay import semconv as sc
from otel_replay.errors import CorruptFileError, DatasetError, QueryError, RecordNotFound
from otel_replay.exporters.schema import SPAN_SCHEMA, SPANS_DIR
from otel_replay.integrity import SigningKey, StoredRecord, VerifyReport, verify_records
from otel_replay.records import DecisionRecord, SpanRef

__all__ = ["Store", "load_sql", "open_store", "restore_attributes"]

_log = logging.getLogger(__name__)
_FILES_VAR = "otel_replay_files"
_IDENT = re.compile(r"[a-z_][a-z0-9_]*")


@cache
def load_sql(name: str) -> str:
    """The text of ``queries/<name>.sql`` as shipped in the package."""
    try:
        return resources.files("otel_replay.queries").joinpath(f"{name}.sql").read_text(encoding="utf-8")
    except FileNotFoundError:
        raise QueryError(f"no SQL file queries/{name}.sql") from None


def _micro(t: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(t) and t.unit == "ns":
        return pa.timestamp("us", tz=t.tz)
    if pa.types.is_list(t):
        return pa.list_(_micro(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_micro(f.type)) for f in t])
    return t


def _python_safe(table: pa.Table) -> pa.Table:
    """Cast nanosecond timestamps, nested ones too, to microseconds (``datetime`` has no ns)."""
    target = pa.schema([f.with_type(_micro(f.type)) for f in table.schema])
    return table if target.equals(table.schema) else table.cast(target, safe=False)


def restore_attributes(row: Mapping[str, Any]) -> dict[str, Any]:
    """A span's full attribute dict: the JSON column plus the promoted columns."""
    attrs: dict[str, Any] = json.loads(row["attributes"]) if row.get("attributes") else {}
    for key, column in sc.PROMOTED_COLUMNS.items():
        value = row.get(column)
        if value is not None:
            attrs[key] = value
    return attrs


class Store:
    """An open dataset: DuckDB views over its Parquet files.

    Args:
        dataset: the dataset directory (the one holding ``spans/``).
        skip_corrupt: leave unreadable Parquet files out (listed in
            :attr:`skipped`) instead of raising :class:`CorruptFileError`.
        database: a DuckDB database path, default in-memory.

    Files written after opening are seen after :meth:`refresh`.

    """

    def __init__(
        self, dataset: str | os.PathLike[str], *, skip_corrupt: bool = False, database: str = ":memory:"
    ) -> None:
        """Open ``dataset``; see the class docstring."""
        self.dataset = Path(dataset)
        if self.dataset.exists() and not self.dataset.is_dir():
            raise DatasetError(f"dataset {self.dataset} is a file, not a directory")
        self.skip_corrupt = skip_corrupt
        self.files: list[str] = []
        self.skipped: list[CorruptFileError] = []
        self._checked: dict[str, tuple[int, int]] = {}
        self._lock = threading.RLock()
        try:
            self._con = duckdb.connect(database)
            self._con.execute("SET TimeZone = 'UTC'")
        except duckdb.Error as exc:
            raise DatasetError(f"cannot open DuckDB database {database}: {exc}") from exc
        self.refresh()

    # --- files and views ----------------------------------------------------
    def _scan(self) -> list[str]:
        root = self.dataset / SPANS_DIR
        if not root.is_dir():
            return []
        return sorted(str(p) for p in root.rglob("*.parquet") if not p.name.startswith("."))

    def _check(self, path: str) -> CorruptFileError | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return CorruptFileError(path, "vanished while reading")
        stamp = (st.st_size, st.st_mtime_ns)
        if self._checked.get(path) == stamp:
            return None
        try:
            meta = pq.read_metadata(path)
        except (pa.ArrowException, OSError) as exc:
            return CorruptFileError(path, str(exc).splitlines()[0])
        if meta.num_columns == 0:
            return CorruptFileError(path, "no columns")
        self._checked[path] = stamp
        return None

    def refresh(self) -> None:
        """Rescan the dataset's files, validate new ones, and (re)define the views."""
        with self._lock:
            files, skipped = [], []
            for path in self._scan():
                problem = self._check(path)
                if problem is None:
                    files.append(path)
                elif self.skip_corrupt:
                    _log.warning("otel-replay: skipping %s", problem)
                    skipped.append(problem)
                else:
                    raise problem
            self.files, self.skipped = files, skipped
            try:
                if files:
                    self._con.execute(f"SET VARIABLE {_FILES_VAR} = ?", [files])
                    self._con.execute(load_sql("source"))
                else:
                    self._con.execute(f"SET VARIABLE {_FILES_VAR} = NULL")
                    empty = SPAN_SCHEMA.empty_table().append_column("date", pa.array([], pa.date32()))
                    self._con.register("otel_replay_empty_spans", empty)
                    self._con.execute("CREATE OR REPLACE VIEW span_source AS SELECT * FROM otel_replay_empty_spans")
                self._con.execute(load_sql("views"))
            except duckdb.Error as exc:
                raise QueryError(f"defining views over {self.dataset}: {exc}") from exc

    # --- running SQL ----------------------------------------------------------
    def query(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> pa.Table:
        """Run ``sql`` (parameters bound, never interpolated); returns an Arrow table."""
        with self._lock:
            try:
                relation = self._con.sql(sql, params=params)
                if relation is None:
                    return pa.table({})
                # DuckDB 2 renamed Relation.arrow() to to_arrow_table().
                fetch = getattr(relation, "to_arrow_table", None) or relation.arrow
                return fetch()
            except duckdb.Error as exc:
                raise QueryError(f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc

    def rows(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Like :meth:`query`, as a list of dicts."""
        return _python_safe(self.query(sql, params)).to_pylist()

    def run(self, name: str, **variables: Any) -> list[dict[str, Any]]:
        """Run ``queries/<name>.sql`` with DuckDB variables set (``SET VARIABLE``)."""
        with self._lock:
            try:
                for key, value in variables.items():
                    if not _IDENT.fullmatch(key):
                        raise QueryError(f"bad variable name {key!r} for {name}.sql")
                    self._con.execute(f"SET VARIABLE {key} = ?", [value])
            except duckdb.Error as exc:
                raise QueryError(f"setting variables for {name}.sql: {exc}") from exc
            return self.rows(load_sql(name))

    # --- records ------------------------------------------------------------
    def _decision_row(self, record_id: str) -> tuple[dict[str, Any], SpanRef] | None:
        rows = self.run("record", record_id=record_id)
        if not rows or rows[0]["replay_kind"] != sc.KIND_DECISION:
            return None
        row = rows[0]
        return row, SpanRef(row["trace_id"], row["span_id"], int(row["start_ns"]))

    def record(self, record_id: str) -> DecisionRecord:
        """Rehydrate the decision record ``record_id`` from the dataset."""
        found = self._decision_row(record_id)
        if found is None:
            raise RecordNotFound(f"no decision record {record_id!r} in {self.dataset}")
        row, ref = found
        return DecisionRecord.from_attributes(restore_attributes(row), ref)

    def decision_span(self, decision_id: str) -> SpanRef | None:
        """Where the decision ``decision_id`` is stored, or ``None``."""
        found = self._decision_row(decision_id)
        return None if found is None else found[1]

    def has_outcome(self, decision_id: str) -> bool:
        """Whether an outcome for ``decision_id`` is stored."""
        return bool(self.rows("SELECT 1 FROM outcomes WHERE decision_id = ? LIMIT 1", [decision_id]))

    def audit_entries(self, correlation_id: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Audit entries (all, or for one correlation id) in the order they were recorded."""
        rows = self.rows(
            "SELECT * FROM audit_entries WHERE ($cid IS NULL OR correlation_id = $cid) "
            "ORDER BY recorded_at, entry_id LIMIT $limit",
            {"cid": correlation_id, "limit": limit},
        )
        for row in rows:
            row["payload"] = json.loads(row["payload"]) if row.get("payload") else {}
        return rows

    def receipt_for(self, decision_id: str) -> dict[str, Any] | None:
        """The receipt stored when the gate committed ``decision_id``'s action, or ``None``."""
        rows = self.rows(
            "SELECT receipt FROM gates WHERE decision_id = ? AND stage = 'commit' AND receipt IS NOT NULL "
            "ORDER BY recorded_at DESC LIMIT 1",
            [decision_id],
        )
        return json.loads(rows[0]["receipt"]) if rows else None

    def compensation_for(self, decision_id: str) -> dict[str, Any] | None:
        """The gate row that already compensated ``decision_id``'s action, or ``None``."""
        rows = self.rows(
            "SELECT executed, recorded_at, detail FROM gates WHERE decision_id = ? AND stage = 'post_commit' "
            "AND executed IN ('rolled_back', 'reversed') ORDER BY recorded_at LIMIT 1",
            [decision_id],
        )
        return rows[0] if rows else None

    def causal_tree(self, record_id: str) -> list[dict[str, Any]]:
        """The decision span of ``record_id`` and every span below it, depth-first."""
        span = self.decision_span(record_id)
        if span is None:
            raise RecordNotFound(f"no decision record {record_id!r} in {self.dataset}")
        return self.run("causal_tree", root_span_id=span.span_id)

    def calibration(self, decision_type: str | None = None) -> list[dict[str, Any]]:
        """Confidence buckets against outcome correctness."""
        return self.run("calibration", decision_type=decision_type)

    def verify(self, keys: SigningKey | Sequence[SigningKey] | None) -> VerifyReport:
        """Check every record span's seal: hash, signature (with ``keys``) and chain links."""
        if not self.files:
            return VerifyReport()
        stored = (
            StoredRecord(
                row["record_id"] or "?", row["name"], int(row["start_ns"]), restore_attributes(row), row["filename"]
            )
            for row in self.run("sealed_records")
        )
        return verify_records(stored, keys)

    def close(self) -> None:
        """Close the DuckDB connection."""
        with self._lock:
            self._con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_store(dataset: str | os.PathLike[str], *, skip_corrupt: bool = False) -> Store:
    """Open ``dataset`` for querying (``otel_replay.open``)."""
    return Store(dataset, skip_corrupt=skip_corrupt)
