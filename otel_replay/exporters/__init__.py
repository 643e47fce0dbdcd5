"""Span exporters and the span -> row conversion (installed as ``otel_replay.exporters``)."""

from __future__ import annotations

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
