"""Analyst SQL: the sandbox it runs in, and its results as Python values.

The sandbox: what ``otel-replay sql`` and :meth:`Store.query` may run.

Analyst SQL runs on its own in-memory DuckDB database that holds nothing but
the dataset's views. Once the views are defined, the database is closed off:

* only the dataset's validated Parquet files may be opened
  (``allowed_paths``), every other file system access is off
  (``enable_external_access = false``): no ``read_text('/etc/passwd')``, no
  ``COPY ... TO``, no ``ATTACH``, no ``INSTALL`` / ``LOAD``;
* Python replacement scans are off (a query cannot read the caller's variables);
* the configuration is locked (``lock_configuration``), so no ``SET`` reopens it;
* each statement must be a query: ``SELECT``, ``WITH``, ``VALUES``, ``FROM``,
  ``DESCRIBE``, ``SHOW``, ``SUMMARIZE``, or ``EXPLAIN`` of one of these.
  ``CREATE``, ``COPY``, ``ATTACH``, ``SET``, ``PRAGMA``, ``CALL``, ``INSERT`` and
  every other statement type are refused before anything runs.

The statement check is checked first; DuckDB's own switches are the second
line, so a statement the check misjudges still cannot touch a file.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from typing import Any

import duckdb
import pyarrow as pa

from otel_replay.errors import QueryError, ReadOnlyViolation
from otel_replay.query.files import literal_paths

__all__ = [
    "ALLOWED_STATEMENTS",
    "check_statements",
    "close_off",
    "column_values",
    "require_utf8",
    "table_rows",
    "unique_names",
]

ALLOWED_STATEMENTS = "SELECT, WITH, VALUES, FROM, DESCRIBE, SHOW, SUMMARIZE, or EXPLAIN of one of these"
_EXPLAIN = re.compile(r"(?:\s|--[^\n]*(?:\n|$)|/\*.*?\*/)*explain\s+(?:analy[sz]e\s+)?", re.IGNORECASE | re.DOTALL)


def close_off(con: duckdb.DuckDBPyConnection, files: Sequence[str]) -> None:
    """Restrict ``con`` to reading ``files``; call after its views are defined.

    Raises:
        QueryError: DuckDB refused one of the settings (the database is then unusable).

    """
    try:
        if files:
            # the views name each file by the pattern that matches only it (literal_paths); both are the file
            con.execute("SET allowed_paths = ?", [sorted({*files, *literal_paths(files)})])
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except duckdb.Error as exc:
        raise QueryError(f"cannot close off the analyst database: {exc}") from exc


def _kind(statement: duckdb.Statement) -> str:
    return str(statement.type).rsplit(".", 1)[-1]


def require_utf8(text: str, what: str) -> None:
    """Refuse text DuckDB cannot take: ``what`` (e.g. ``QUERY``) is named with the first bad byte.

    A command-line argument that is not UTF-8 reaches Python as lone surrogates
    (``surrogateescape``); DuckDB's parser refuses them with a ``TypeError``.

    Raises:
        QueryError: ``text`` does not encode as UTF-8.

    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        bad = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"lone surrogate U+{code:04X}"
        raise QueryError(f"{what} is not valid UTF-8 ({bad} at character {exc.start})") from None


def check_statements(con: duckdb.DuckDBPyConnection, sql: str) -> list[duckdb.Statement]:
    """Parse ``sql`` and return its statements when every one is a read-only query.

    Raises:
        QueryError: the text does not parse, is not UTF-8, or holds no statement.
        ReadOnlyViolation: a statement is not a query (names its type).

    """
    require_utf8(sql, "the SQL text")
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
    if not statements:
        raise QueryError("no SQL statement given")
    for number, statement in enumerate(statements, 1):
        kind = _kind(statement)
        if kind == "SELECT":
            continue
        if kind == "EXPLAIN" and _explains_a_query(con, statement.query):
            continue
        where = f" (statement {number})" if len(statements) > 1 else ""
        raise ReadOnlyViolation(
            f"refused {kind} statement{where}: analyst SQL is read-only; allowed: {ALLOWED_STATEMENTS}"
        )
    return list(statements)


def _explains_a_query(con: duckdb.DuckDBPyConnection, text: str) -> bool:
    """Whether ``text`` is ``EXPLAIN [ANALYZE]`` of one SELECT (EXPLAIN ANALYZE runs its statement)."""
    head = _EXPLAIN.match(text)
    if head is None:
        return False
    try:
        inner = con.extract_statements(text[head.end() :])
    except duckdb.Error:
        return False
    return len(inner) == 1 and _kind(inner[0]) == "SELECT"


# --- results as Python values ------------------------------------------------
# DuckDB encodes +-infinity as the extreme int64 (timestamps) / int32 (dates);
# Python's datetime stops at year 9999. Such values come back as text, never
# as an OverflowError.
_TS_INFINITY = 2**63 - 1
_DATE_INFINITY = 2**31 - 1
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}


def unique_names(names: Sequence[str]) -> list[str]:
    """Column names made unique: a repeated ``a`` becomes ``a_2``, ``a_3`` (skipping names in use)."""
    taken = set(names)
    seen: set[str] = set()
    out = []
    for name in names:
        if name in seen:
            n = 2
            while f"{name}_{n}" in taken or f"{name}_{n}" in seen:
                n += 1
            name = f"{name}_{n}"
        seen.add(name)
        out.append(name)
    return out


def _civil(days: int) -> tuple[int, int, int]:
    """(year, month, day) of ``days`` since 1970-01-01, for any int (proleptic Gregorian)."""
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, day


def _date_value(days: int | None) -> Any:
    if days is None:
        return None
    if abs(days) == _DATE_INFINITY:
        return "infinity" if days > 0 else "-infinity"
    year, month, day = _civil(days)
    if 1 <= year <= 9999:
        return dt.date(year, month, day)
    return f"{year:04d}-{month:02d}-{day:02d}"


def _timestamp_value(value: int | None, unit: str, tz: str | None, *, text: bool) -> Any:
    """A timestamp as ``datetime`` (microseconds) or, with ``text`` or out of range, as ISO text."""
    if value is None:
        return None
    if abs(value) == _TS_INFINITY:
        return "infinity" if value > 0 else "-infinity"
    seconds, fraction = divmod(value, _PER_SECOND[unit])
    days, second_of_day = divmod(seconds, 86_400)
    year, month, day = _civil(days)
    hour, rest = divmod(second_of_day, 3600)
    minute, second = divmod(rest, 60)
    if not text and 1 <= year <= 9999:
        micros = fraction * 1_000_000 // _PER_SECOND[unit]
        return dt.datetime(year, month, day, hour, minute, second, micros, tzinfo=dt.UTC if tz else None)
    digits = _DIGITS[unit]
    frac = f".{fraction:0{digits}d}" if fraction else ""
    return f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}{frac}{'+00:00' if tz else ''}"


def _scalar_value(scalar: pa.Scalar) -> Any:
    """One value; nested values are rebuilt piece by piece when Python cannot hold a part as-is."""
    try:
        return scalar.as_py()
    except (OverflowError, ValueError, pa.ArrowException):
        pass
    t = scalar.type
    if not scalar.is_valid:
        return None
    if pa.types.is_timestamp(t):
        return _timestamp_value(scalar.value, t.unit, t.tz, text=False)
    if pa.types.is_date32(t):
        return _date_value(scalar.value)
    if pa.types.is_struct(t):
        return {name: _scalar_value(value) for name, value in scalar.items()}
    if pa.types.is_map(t):
        return [tuple(_scalar_value(part) for part in entry.values()) for entry in scalar.values]
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return [_scalar_value(item) for item in scalar.values]
    return f"<{t} value Python cannot represent>"


def column_values(column: pa.ChunkedArray | pa.Array, *, exact_times: bool = False) -> list[Any]:
    """The values of one result column as Python objects, never raising on range.

    Timestamps become ``datetime`` (truncated to microseconds), or ISO text
    with every stored digit when ``exact_times`` is set; infinities and
    values beyond year 9999 become text.
    """
    t = column.type
    if pa.types.is_timestamp(t):
        ints = column.cast(pa.int64()).to_pylist()
        return [_timestamp_value(v, t.unit, t.tz, text=exact_times) for v in ints]
    if pa.types.is_date32(t):
        return [_date_value(v) for v in column.cast(pa.int32()).to_pylist()]
    try:
        return column.to_pylist()
    except (OverflowError, ValueError, pa.ArrowException):
        pass
    try:  # nested nanosecond timestamps: Python's datetime holds microseconds
        return column.cast(_micro(t), safe=False).to_pylist()
    except (OverflowError, ValueError, pa.ArrowException):
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        return [_scalar_value(scalar) for chunk in chunks for scalar in chunk]


def _micro(t: pa.DataType) -> pa.DataType:
    """``t`` with every nanosecond timestamp inside it made microseconds."""
    if pa.types.is_timestamp(t) and t.unit == "ns":
        return pa.timestamp("us", tz=t.tz)
    if pa.types.is_list(t):
        return pa.list_(_micro(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_micro(f.type)) for f in t])
    return t


def table_rows(table: pa.Table, *, exact_times: bool = False) -> tuple[list[str], list[list[Any]]]:
    """A result as (unique column names, rows of Python values); see :func:`column_values`."""
    names = unique_names(table.column_names)
    columns = [column_values(c, exact_times=exact_times) for c in table.columns]
    return names, [list(row) for row in zip(*columns, strict=True)] if columns else []
