"""The one way the package opens DuckDB: connections that never draw a progress bar.

DuckDB draws a progress bar on standard output for any query that runs
longer than two seconds (``enable_progress_bar`` is on by default, also
outside a terminal), which corrupted ``otel-replay compact --json`` output at
10M spans on a loaded machine; a library must not write to its host's stdout.

Arrow results of ``execute()`` come through :func:`arrow`: DuckDB 2 warns
(``UserWarning``) on each such fetch that the rows are copied once, which the
package does on purpose (a relation from ``con.sql()`` binds the views twice,
which costs a point lookup more than copying its few rows). The warning must
not reach the host, which may turn warnings into errors; but
``warnings.catch_warnings`` swaps process-wide state, so two of our threads
entering and leaving it interleaved could leave our filter installed for
good, or drop one the host added. One lock keeps the package's own entries
from interleaving (the fetch alone is under it, not the query).
"""

from __future__ import annotations

import re
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import duckdb
import pyarrow as pa

__all__ = ["arrow", "connect", "literal_paths"]

_FILTERS = threading.RLock()  # re-entrant: a fetch that ends up fetching again on its thread must not deadlock


def connect(database: str = ":memory:") -> duckdb.DuckDBPyConnection:
    """``duckdb.connect(database)`` with the progress bar off (raises what ``duckdb.connect`` raises)."""
    con = duckdb.connect(database)
    try:
        con.execute("SET enable_progress_bar = false")
    except BaseException:
        con.close()
        raise
    return con


def arrow(result: duckdb.DuckDBPyConnection) -> pa.Table:
    """The rows of ``result`` (what ``execute()`` returned) as an Arrow table, without DuckDB 2's copy warning."""
    # DuckDB 2 names it to_arrow_table(), DuckDB 1.x fetch_arrow_table() (which does not warn)
    fetch: Any = getattr(result, "to_arrow_table", None) or getattr(result, "fetch_arrow_table")  # noqa: B009
    with _FILTERS, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Arrow output on a DB-API result", category=UserWarning)
        table: pa.Table = fetch()
    return table


_GLOB_CHARACTER = re.compile(r"([*?\[])")


def literal_paths(paths: Sequence[str]) -> list[str]:
    """``paths`` as DuckDB file patterns that each match only that file.

    ``read_parquet`` reads every path it is given as a glob: a dataset at
    ``runs[1]`` or ``runs*`` would also read ``runs1``'s or ``runs-old``'s
    file of the same name. Each ``*``, ``?`` and ``[`` becomes a one-character
    class (``[*]``); DuckDB's ``filename`` column still gives the real path.
    """
    return [_GLOB_CHARACTER.sub(r"[\1]", path) for path in paths]
