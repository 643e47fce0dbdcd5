"""The file kinds a dataset partitions by date: spans (``spans/``) and OTLP log records (``logs/``).

Both kinds go through the same partition steps: a per-partition manifest and
its reader rule (:mod:`manifest`), a lease, compaction (:mod:`compact`,
:mod:`compact_s3`) and retention (:mod:`retention`). What differs is held
here: the directory, the lease name, the order rows are written in, which
columns a file must have, and whether compaction derives anything from the
rows. Span compaction removes exact duplicates (an OTLP retry stores a span
twice under its ids) and writes the side index and the facts file; log
records carry no id of their own (two equal records may both have been
logged), so their compaction keeps every row and derives nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from otel_replay.exporters.schema import LOG_SCHEMA, LOGS_DIR, SPANS_DIR

from .span_columns import REQUIRED_COLUMNS, columns_problem, expected_families, schema_problem

__all__ = ["KINDS", "LOGS", "LOG_REQUIRED_COLUMNS", "SPANS", "FileKind", "log_schema_problem"]

LOG_REQUIRED_COLUMNS = ("time", "observed_time", "trace_id", "span_id")
"""Columns every log record file has (a file without them is not one)."""

_LOG_FAMILIES = expected_families(LOG_SCHEMA)


def log_schema_problem(schema: pa.Schema) -> str | None:
    """What makes ``schema`` unreadable as log records, or ``None`` (the rule spans follow, on the log columns)."""
    return columns_problem(schema, _LOG_FAMILIES, LOG_REQUIRED_COLUMNS, "log record")


@dataclass(frozen=True)
class FileKind:
    """One kind of partitioned file: where it lives and what its partition steps do differently."""

    directory: str
    """The folder under the dataset holding the ``date=`` partitions."""
    rows: str
    """What a row is, for messages (``spans``, ``log records``)."""
    sort_key: tuple[str, ...]
    """The order compacted files are written in."""
    derived: bool
    """Whether compaction removes exact duplicates by id and writes the side index and facts file."""
    required: tuple[str, ...]
    """Columns a file of this kind must have."""

    def lease_name(self, partition: str) -> str:
        """The lease name of ``partition`` (``date=…``): spans keep the bare name, other kinds are prefixed."""
        return partition if self is SPANS else f"{self.directory}-{partition}"

    def label(self, partition: str) -> str:
        """How reports name ``partition``: bare for spans (as always), ``logs/date=…`` for log records."""
        return partition if self is SPANS else f"{self.directory}/{partition}"

    def schema_problem(self, schema: pa.Schema) -> str | None:
        """What makes ``schema`` unreadable as this kind, or ``None``."""
        return schema_problem(schema) if self is SPANS else log_schema_problem(schema)


SPANS = FileKind(SPANS_DIR, "spans", ("correlation_id", "trace_id", "start_time", "span_id"), True, REQUIRED_COLUMNS)
"""Span files, ``spans/date=…``."""
LOGS = FileKind(LOGS_DIR, "log records", ("time", "observed_time", "trace_id", "span_id"), False, LOG_REQUIRED_COLUMNS)
"""OTLP log record files, ``logs/date=…``."""
KINDS = (SPANS, LOGS)
"""Every kind, in the order compaction and retention visit them."""
