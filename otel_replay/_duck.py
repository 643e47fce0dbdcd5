"""The one way the package opens DuckDB: connections that never draw a progress bar.

DuckDB draws a progress bar on standard output for any query that runs
longer than two seconds (``enable_progress_bar`` is on by default, also
outside a terminal), which corrupted ``otel-replay compact --json`` output at
10M spans on a loaded machine; a library must not write to its host's stdout.
"""

from __future__ import annotations

import duckdb

__all__ = ["connect"]


def connect(database: str = ":memory:") -> duckdb.DuckDBPyConnection:
    """``duckdb.connect(database)`` with the progress bar off (raises what ``duckdb.connect`` raises)."""
    con = duckdb.connect(database)
    try:
        con.execute("SET enable_progress_bar = false")
    except BaseException:
        con.close()
        raise
    return con
