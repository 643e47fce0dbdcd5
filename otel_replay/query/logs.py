"""The log record views (``log_records``, ``genai_events``) over the dataset's ``logs/`` files.

Log records are their own file kind (:data:`~otel_replay.exporters.schema.LOG_SCHEMA`,
written by the receiver under ``<dataset>/logs/date=*/``): ``log_source``
reads them (or, before any arrive, an empty table with their columns), and
``queries/log_records.sql`` defines the views on it.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa

from otel_replay.exporters.schema import LOG_SCHEMA, LOGS_DIR
from otel_replay.location import Location
from otel_replay.query.files import literal_paths
from otel_replay.storage.manifest import live_files

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
    """The dataset's live log record files, sorted: its partitions read through their manifests, as span files are.

    A compaction of ``logs/`` keeps the files it replaced for a grace period;
    the reader rule (:func:`~otel_replay.storage.manifest.live_files`) leaves
    them out, so no record is counted twice.
    """
    return live_files(location, directory=LOGS_DIR)


def define_log_views(con: duckdb.DuckDBPyConnection, files: list[str], views_sql: str | None = None) -> None:
    """Define ``log_source`` over ``files`` (an empty table of the log columns when there are none), then the views.

    ``views_sql``: ``queries/log_records.sql``; ``None``: only the source (the query engine defines the views
    when a query names them).
    """
    if files:
        con.execute(f"SET VARIABLE {_FILES_VAR} = ?", [literal_paths(files)])  # each path as itself, not a glob
        con.execute(_SOURCE)
    else:
        empty = (
            LOG_SCHEMA.empty_table()
            .append_column("date", pa.array([], pa.date32()))
            .append_column("filename", pa.array([], pa.string()))
        )
        con.register(_EMPTY, empty)
        con.execute(_EMPTY_SOURCE)
    if views_sql is not None:
        con.execute(views_sql)
