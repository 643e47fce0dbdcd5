"""Whether a Parquet file's columns can be read as spans: the check readers and compaction share.

DuckDB reads a dataset's files as one table, casting each file's columns to
one type: a file whose ``attributes`` is a struct (another writer's) makes
every query fail, naming whichever file it happened to read first. Checking
each new file's schema once names the file itself, so it can be refused or
skipped (``skip_corrupt``).
"""

from __future__ import annotations

import base64
from functools import lru_cache

import pyarrow as pa

from otel_replay.errors import DatasetError
from otel_replay.exporters.schema import SPAN_SCHEMA
from otel_replay.semconv import SCHEMA_VERSION

__all__ = ["REQUIRED_COLUMNS", "arrow_schema_problem", "check_version", "schema_problem"]

REQUIRED_COLUMNS = ("trace_id", "span_id", "start_time")
"""Columns every span file has (a file without them is not a span file)."""


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


_EXPECTED = {f.name: _family(f.type) for f in SPAN_SCHEMA}


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
    names = set(schema.names)
    for name in REQUIRED_COLUMNS:
        if name not in names:
            return f"not a span file: no {name} column"
    for f in schema:
        expected = _EXPECTED.get(f.name)
        if expected is None:
            continue
        actual = _family(f.type)
        strict = f.name in REQUIRED_COLUMNS or _nested(actual) or _nested(expected)
        if strict and actual != expected:
            return f"column {f.name} is {f.type}, not the span schema's {SPAN_SCHEMA.field(f.name).type}"
    return None


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
