"""Finding which Parquet file broke a query.

A file whose footer is intact but whose data pages are damaged passes the
footer check at open and fails only when a query decodes the damaged page,
with a DuckDB message that names no file. :func:`find_corrupt` decodes every
value of each file in turn to name the culprit.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from importlib import resources

import duckdb

from otel_replay.errors import CorruptFileError

__all__ = ["could_be_a_bad_file", "find_corrupt", "probe"]

# Errors raised before any data is read: never a file's fault.
_NOT_A_READ = (
    duckdb.ParserException,
    duckdb.BinderException,
    duckdb.CatalogException,
    duckdb.PermissionException,
    duckdb.InterruptException,
)


def could_be_a_bad_file(exc: duckdb.Error) -> bool:
    """Whether ``exc`` may come from decoding a damaged file (worth probing the files)."""
    return not isinstance(exc, _NOT_A_READ)


@cache
def _probe_sql() -> str:
    return resources.files("otel_replay.queries").joinpath("probe_file.sql").read_text(encoding="utf-8")


def probe(con: duckdb.DuckDBPyConnection, path: str) -> CorruptFileError | None:
    """Decode every value of ``path`` (hashing each column); the error found, or ``None``."""
    try:
        con.execute(_probe_sql(), [path]).fetchall()
    except duckdb.InterruptException:
        raise
    except duckdb.Error as exc:
        lines = [line.strip().rstrip(":").strip() for line in str(exc).splitlines()]
        reason = next((line for line in lines if line), "")
        return CorruptFileError(path, reason or type(exc).__name__)
    return None


def find_corrupt(con: duckdb.DuckDBPyConnection, paths: Iterable[str]) -> list[CorruptFileError]:
    """Every file of ``paths`` that fails a full decode."""
    return [problem for problem in (probe(con, path) for path in paths) if problem is not None]
