"""Whether a Parquet file's columns can be read as spans: the check readers and compaction share.

DuckDB reads a dataset's files as one table, casting each file's columns to
one type: a file whose ``attributes`` is a struct (another writer's) makes
every query fail, naming whichever file it happened to read first. Checking
each new file's schema once names the file itself, so it can be refused or
skipped (``skip_corrupt``).

Span times are read as nanoseconds (DuckDB casts each file's times to the
dataset's ``TIMESTAMPTZ_NS``, compaction's side index to ``timestamp[ns]``):
a file storing them in a coarser unit with a value past 2262 or before 1677
fails every query that reads them, so it is refused like a damaged file
(:func:`time_range_problem`). Files storing nanoseconds (ours) are never
read for this.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from otel_replay.errors import DatasetError
from otel_replay.exporters.schema import SPAN_SCHEMA
from otel_replay.semconv import SCHEMA_VERSION

__all__ = [
    "REQUIRED_COLUMNS",
    "TIME_COLUMNS",
    "arrow_schema_coarse",
    "arrow_schema_problem",
    "check_version",
    "coarse_times",
    "columns_problem",
    "expected_families",
    "schema_problem",
    "time_range_problem",
]

REQUIRED_COLUMNS = ("trace_id", "span_id", "start_time")
"""Columns every span file has (a file without them is not a span file)."""

TIME_COLUMNS = ("start_time", "end_time", "events")
"""Columns holding span times read as nanoseconds (``events``: each event's ``time``)."""

_NS_LIMIT = 2**63 - 1  # DuckDB casts a coarser timestamp to nanoseconds when |value in ns| fits in this
_NS_PER = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
_PARQUET_UNITS = {"milliseconds": "ms", "microseconds": "us", "nanoseconds": "ns"}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _family(t: pa.DataType) -> str:
    """The kind of value a type holds, as far as reading it as a span column goes (widths do not matter)."""
    if pa.types.is_dictionary(t):
        return _family(t.value_type)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "str"
    if getattr(pa.types, "is_string_view", lambda _t: False)(t):
        return "str"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"list<{_family(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct"
    return str(t)


def _nested(kind: str) -> bool:
    return kind == "struct" or kind.startswith(("list<", "map<"))


def schema_problem(schema: pa.Schema) -> str | None:
    """What makes ``schema`` unreadable as spans, or ``None``.

    A file must have the id and time columns with their types. Another span
    column may hold another scalar type (DuckDB reads the column as text and
    the views cast it, a bad value becoming NULL in that row only), but not a
    nested value where the span schema has a scalar or the other way round:
    no cast joins those, and every query over the dataset would fail.
    """
    return columns_problem(schema, _EXPECTED, REQUIRED_COLUMNS, "span")


def columns_problem(schema: pa.Schema, expected: Mapping[str, str], required: Sequence[str], what: str) -> str | None:
    """What makes ``schema`` unreadable as ``what`` rows whose columns have the ``expected`` families, or ``None``.

    The rule of :func:`schema_problem`, for any file kind: ``required``
    columns must be there with their family; any column may not be nested
    where a scalar is expected or the other way round. ``expected``: as
    :func:`expected_families` gives it.
    """
    names = set(schema.names)
    for name in required:
        if name not in names:
            return f"not a {what} file: no {name} column"
    for f in schema:
        family = expected.get(f.name)
        if family is None:
            continue
        actual = _family(f.type)
        strict = f.name in required or _nested(actual) or _nested(family)
        if strict and actual != family:
            return f"column {f.name} is {f.type}, not the {what} schema's {family}"
    return None


def expected_families(schema: pa.Schema) -> dict[str, str]:
    """Each column of ``schema`` and the family of values it holds (what :func:`columns_problem` compares)."""
    return {f.name: _family(f.type) for f in schema}


_EXPECTED = expected_families(SPAN_SCHEMA)


@lru_cache(maxsize=64)
def arrow_schema_problem(serialized: bytes) -> str | None:
    """:func:`schema_problem` of a footer's ``ARROW:schema`` value (base64 IPC), cached: one writer, one value."""
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(serialized)))
    except (ValueError, pa.ArrowException) as exc:
        return f"unreadable Arrow schema in its footer ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
    return schema_problem(schema)


def check_version(path: str, version: bytes | None) -> None:
    """Refuse a file whose storage schema version (its footer's value) is newer than this otel-replay reads.

    Raises:
        DatasetError: the version is unreadable or newer (names the file).

    """
    if version is None:
        return
    text = version[:64].decode("ascii", "replace")
    major = text.split(".")[0]
    if not major.isdigit() or len(major) > 6:
        raise DatasetError(f"{path}: unreadable storage schema version {text!r}")
    if int(major) > int(SCHEMA_VERSION.split(".")[0]):
        raise DatasetError(
            f"{path}: written with storage schema version {text}, newer than this otel-replay reads "
            f"({SCHEMA_VERSION}); upgrade otel-replay to compact it (nothing was changed)"
        )


def _coarse(t: pa.DataType) -> bool:
    """Whether ``t`` holds a timestamp in a unit other than nanoseconds (at any depth)."""
    if pa.types.is_timestamp(t):
        return bool(t.unit != "ns")
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _coarse(t.value_type)
    if pa.types.is_struct(t):
        return any(_coarse(f.type) for f in t)
    return False


def coarse_times(schema: pa.Schema) -> bool:
    """Whether a span time column of ``schema`` is a timestamp coarser than nanoseconds (its range needs a check)."""
    return any(_coarse(schema.field(name).type) for name in TIME_COLUMNS if name in schema.names)


@lru_cache(maxsize=64)
def arrow_schema_coarse(serialized: bytes) -> bool:
    """:func:`coarse_times` of a footer's ``ARROW:schema`` value, cached (``False`` when unreadable)."""
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(serialized)))
    except (ValueError, pa.ArrowException):
        return False  # arrow_schema_problem refuses the file
    return coarse_times(schema)


def _time_leaf(path: str) -> str | None:
    """The span time a Parquet leaf column ``path`` holds, named for messages (``None``: not a span time)."""
    if path in ("start_time", "end_time"):
        return path
    parts = path.split(".")
    return "events.time" if parts[0] == "events" and len(parts) > 1 and parts[-1] == "time" else None


def _parquet_unit(column: Any) -> str | None:
    """The unit of a Parquet timestamp leaf: ``ms``/``us``/``ns``, ``int96``, or ``None`` (not a timestamp)."""
    if column.physical_type == "INT96":  # legacy timestamps: DuckDB reads them as microseconds
        return "int96"
    logical = column.logical_type
    if logical is None or logical.type != "TIMESTAMP":
        return None
    return _PARQUET_UNITS.get(json.loads(logical.to_json()).get("timeUnit", ""))


def _statistics_range(metadata: pq.FileMetaData, i: int) -> tuple[int, int] | None:
    """(min, max) raw values of leaf ``i`` over every row group, from the footer; ``None`` when one lacks them."""
    low: int | None = None
    high: int | None = None
    for r in range(metadata.num_row_groups):
        chunk = metadata.row_group(r).column(i)
        stats = chunk.statistics
        if stats is None or not stats.has_min_max:
            if chunk.num_values and (stats is None or stats.null_count != chunk.num_values):
                return None  # values without statistics: read them
            continue  # an empty or all-null chunk
        lo, hi = stats.min_raw, stats.max_raw
        if not isinstance(lo, int) or not isinstance(hi, int):
            return None
        low = lo if low is None else min(low, lo)
        high = hi if high is None else max(high, hi)
    return (0, 0) if low is None or high is None else (low, high)


def _read_range(source: Any, metadata: pq.FileMetaData, path: str) -> tuple[str, int, int]:
    """(unit, min, max) of the leaf column ``path``, reading that column only (0, 0 when it holds no value).

    INT96 is read as milliseconds: any INT96 value fits, where pyarrow's
    default, nanoseconds, wraps a far date round to another silently.
    """
    parquet = pq.ParquetFile(source, metadata=metadata, coerce_int96_timestamp_unit="ms")
    values: Any = parquet.read(columns=[path]).column(0)
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    while not pa.types.is_timestamp(values.type):
        if pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
            values = values.flatten()
        elif pa.types.is_struct(values.type) and values.type.num_fields == 1:
            values = pc.struct_field(values, [0])
        else:
            raise ValueError(f"column {path} is {values.type}, not a timestamp")
    unit = values.type.unit
    extremes = pc.min_max(values.cast(pa.int64()))
    low, high = extremes["min"].as_py(), extremes["max"].as_py()
    return (unit, 0, 0) if low is None or high is None else (unit, low, high)


def _when(value: int, unit: str) -> str:
    """``value`` (in ``unit`` since the epoch) as a UTC date and time, or as the number when no date holds it."""
    try:
        return (_EPOCH + dt.timedelta(seconds=value * _NS_PER[unit] // 10**9)).isoformat().replace("+00:00", "Z")
    except OverflowError:
        return f"{value} {unit} since 1970-01-01"


def has_coarse_times(schema: pq.ParquetSchema) -> bool:
    """Whether a span time column of the Parquet ``schema`` is stored coarser than nanoseconds (or as INT96).

    Only such a file can hold a span time outside nanoseconds (see :func:`time_range_problem`).
    """
    for i in range(len(schema)):
        column = schema.column(i)
        if _time_leaf(column.path) is not None and _parquet_unit(column) not in (None, "ns"):
            return True
    return False


def time_range_problem(source: Any, metadata: pq.FileMetaData, *, statistics: bool = True) -> str | None:
    """What puts a span time of a Parquet file outside nanoseconds (after 2262-04-11, before 1677-09-21), or ``None``.

    ``source``: the file (a path or an open file object), ``metadata`` its
    parsed footer. Only columns stored in a coarser unit are looked at
    (nanoseconds always fit). Their range comes from the row groups' min/max
    statistics when ``statistics`` and every row group has them, else from
    reading that column alone. Legacy INT96 columns are always read (their
    statistics have no defined order).

    Raises:
        OSError, pyarrow.ArrowException: the column cannot be read (a damaged file).

    """
    schema = metadata.schema
    for i in range(metadata.num_columns):
        column = schema.column(i)
        name = _time_leaf(column.path)
        if name is None:
            continue
        unit = _parquet_unit(column)
        if unit is None or unit == "ns":
            continue
        found = _statistics_range(metadata, i) if statistics and unit != "int96" else None
        if found is None:
            unit, low, high = _read_range(source, metadata, column.path)
        else:
            low, high = found
        per = _NS_PER[unit]
        for value in (low, high):
            if abs(value * per) > _NS_LIMIT:
                return (
                    f"column {name} holds {_when(value, unit)} (timestamp[{unit}]), outside the nanosecond range "
                    "span times are read in (1677-09-21 to 2262-04-11)"
                )
    return None
