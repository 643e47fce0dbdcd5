"""Span exporters and the span -> row conversion (installed as ``otel_replay.exporters``).

The names are imported on first use: the read side reads the dataset's schema,
key logs and footer keys from a few modules of this package and does not pay
for the exporter, the OpenTelemetry SDK and the OTLP classes it runs on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from otel_replay import _lazy

if TYPE_CHECKING:  # what the names below resolve to on first use, for type checkers
    from .parquet import ParquetSpanExporter
    from .rows import request_to_table, resource_spans_to_table, span_time_error, spans_to_table
    from .schema import SPAN_SCHEMA, SPANS_DIR
    from .writer import DatasetWriter, WriterStats

__all__ = [
    "SPANS_DIR",
    "SPAN_SCHEMA",
    "DatasetWriter",
    "ParquetSpanExporter",
    "WriterStats",
    "request_to_table",
    "resource_spans_to_table",
    "span_time_error",
    "spans_to_table",
]

_LAZY = {
    "DatasetWriter": ".writer",
    "ParquetSpanExporter": ".parquet",
    "request_to_table": ".rows",
    "resource_spans_to_table": ".rows",
    "span_time_error": ".rows",
    "SPAN_SCHEMA": ".schema",
    "SPANS_DIR": ".schema",
    "spans_to_table": ".rows",
    "WriterStats": ".writer",
}
"""Public names imported on first use: name -> module."""

__getattr__, __dir__ = _lazy.exports(__name__, _LAZY, submodules=True)
