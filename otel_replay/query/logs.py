"""The log record views (``log_records``, ``genai_events``) over the dataset's ``logs/`` files.

Log records are their own file kind (:data:`~otel_replay.exporters.schema.LOG_SCHEMA`,
written by the receiver under ``<dataset>/logs/date=*/``): ``log_source``
reads them (or, before any arrive, an empty table with their columns), and
``queries/log_records.sql`` defines the views on it.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from otel_replay.exporters.schema import LOG_SCHEMA, LOGS_DIR
from otel_replay.location import Location

__all__ = ["define_log_views", "log_files"]

_FILES_VAR = "otel_replay_log_files"
_EMPTY = "otel_replay_empty_logs"
_SOURCE = f"""
CREATE OR REPLACE VIEW log_source AS
SELECT * FROM read_parquet(
    getvariable('{_FILES_VAR}'), hive_partitioning = true, union_by_name = true, filename = true
)
"""
_EMPTY_SOURCE = f"CREATE OR REPLACE VIEW log_source AS SELECT * FROM {_EMPTY}"


def log_files(location: Location) -> list[str]:
    """The dataset's log record files, sorted (temporary files, named with a leading dot, left out)."""
    root = location.join(LOGS_DIR)
    if location.remote:
        found = [f"s3://{info.path}" for info in location.files_under(root)]
    else:
        found = [str(path) for path in Path(root).rglob("*.parquet")]
    return sorted(p for p in found if p.endswith(".parquet") and not p.rsplit("/", 1)[-1].startswith("."))


def define_log_views(con: duckdb.DuckDBPyConnection, files: list[str], views_sql: str) -> None:
    """Define ``log_source`` over ``files`` (an empty table of the log columns when there are none), then the views."""
    if files:
        con.execute(f"SET VARIABLE {_FILES_VAR} = ?", [files])
        con.execute(_SOURCE)
    else:
        empty = (
            LOG_SCHEMA.empty_table()
            .append_column("date", pa.array([], pa.date32()))
            .append_column("filename", pa.array([], pa.string()))
        )
        con.register(_EMPTY, empty)
        con.execute(_EMPTY_SOURCE)
    con.execute(views_sql)
