"""The Arrow/Parquet schema of the ``spans`` dataset (storage schema version 2).

One row per span. Ids are lowercase hex, times are UTC nanoseconds, the
attributes that replay and the SQL need most are promoted to typed columns
(see :data:`otel_replay.semconv.PROMOTED_COLUMNS`), and the rest stay in a JSON
object column. Files live under ``<dataset>/spans/date=YYYY-MM-DD/`` (hive
partitioning on the span's UTC start date).

Version 2 added three typed columns (``outcome_decision_id`` string,
``outcome_correct`` bool, ``decision_confidence`` double), after the version 1
columns they follow; a version 1 file simply lacks them.
"""

from __future__ import annotations

import pyarrow as pa

from otel_replay import semconv as sc

__all__ = [
    "DATE_COLUMN",
    "EVENT_TYPE",
    "LINK_TYPE",
    "COMPENSATIONS_DIR",
    "LOGS_DIR",
    "LOG_SCHEMA",
    "LOG_SCHEMA_VERSION",
    "OUTCOMES_DIR",
    "PROMOTED_ARROW_TYPES",
    "SCHEMA_METADATA_KEY",
    "SPAN_SCHEMA",
    "SPANS_DIR",
]

DATE_COLUMN = "date"
"""Partition column carried beside the rows until the writer splits on it (here, below both, so that the
writer's users, the storage backend among them, do not import the span conversion and the OTLP classes)."""
SPANS_DIR = "spans"
"""The dataset's span files: ``<dataset>/spans/date=YYYY-MM-DD/``."""
COMPENSATIONS_DIR = "_compensations"
"""Compensation claims beside the spans: ``<dataset>/_compensations/`` (one claim file per receipt)."""
OUTCOMES_DIR = "_outcomes"
"""Outcome claims beside the spans: ``<dataset>/_outcomes/`` (claim files, or the local claim store)."""
SCHEMA_METADATA_KEY = b"otel_replay.schema_version"

_TS = pa.timestamp("ns", tz="UTC")
_ARROW = {str: pa.string(), bool: pa.bool_(), float: pa.float64()}

PROMOTED_ARROW_TYPES: dict[str, pa.DataType] = {
    column: _ARROW[sc.PROMOTED_TYPES.get(key, str)] for key, column in sc.PROMOTED_COLUMNS.items()
}
"""Promoted column name -> its Arrow type."""

EVENT_TYPE = pa.struct(
    [
        pa.field("time", _TS),
        pa.field("name", pa.string()),
        pa.field("attributes", pa.string()),
    ]
)
LINK_TYPE = pa.struct(
    [
        pa.field("trace_id", pa.string()),
        pa.field("span_id", pa.string()),
        pa.field("trace_state", pa.string()),
        pa.field("attributes", pa.string()),
    ]
)

SPAN_SCHEMA = pa.schema(
    [
        pa.field("trace_id", pa.string(), nullable=False),
        pa.field("span_id", pa.string(), nullable=False),
        pa.field("parent_span_id", pa.string()),
        pa.field("trace_state", pa.string()),
        pa.field("name", pa.string(), nullable=False),
        pa.field("kind", pa.string()),
        pa.field("service_name", pa.string()),
        pa.field("scope_name", pa.string()),
        pa.field("scope_version", pa.string()),
        pa.field("start_time", _TS),
        pa.field("end_time", _TS),
        pa.field("duration_ns", pa.int64()),
        pa.field("status_code", pa.string()),
        pa.field("status_message", pa.string()),
        *[pa.field(column, kind) for column, kind in PROMOTED_ARROW_TYPES.items()],
        pa.field("attributes", pa.string()),
        pa.field("resource_attributes", pa.string()),
        pa.field("events", pa.list_(EVENT_TYPE)),
        pa.field("links", pa.list_(LINK_TYPE)),
        pa.field("dropped_attributes_count", pa.int32()),
        pa.field("dropped_events_count", pa.int32()),
        pa.field("dropped_links_count", pa.int32()),
    ],
    metadata={SCHEMA_METADATA_KEY: sc.SCHEMA_VERSION.encode()},
)

LOGS_DIR = "logs"
"""The dataset's log record files: ``<dataset>/logs/date=YYYY-MM-DD/`` (by the record's time, else observed time)."""
LOG_SCHEMA_VERSION = "1"
"""The log records' own schema version, in each log file's footer under :data:`SCHEMA_METADATA_KEY`."""

LOG_SCHEMA = pa.schema(
    [
        pa.field("time", _TS),
        pa.field("observed_time", _TS),
        pa.field("severity_number", pa.int32()),
        pa.field("severity_text", pa.string()),
        pa.field("body", pa.string()),
        pa.field("attributes", pa.string()),
        pa.field("event_name", pa.string()),
        pa.field("trace_id", pa.string()),
        pa.field("span_id", pa.string()),
        pa.field("flags", pa.int64()),
        pa.field("dropped_attributes_count", pa.int32()),
        pa.field("service_name", pa.string()),
        pa.field("resource_attributes", pa.string()),
        pa.field("scope_name", pa.string()),
        pa.field("scope_version", pa.string()),
        pa.field("scope_attributes", pa.string()),
    ],
    metadata={SCHEMA_METADATA_KEY: LOG_SCHEMA_VERSION.encode()},
)
"""One row per OTLP log record (see docs/reference/schema.md): ``body`` and ``attributes`` are JSON text,
redacted, ``body`` capped as captured content is; ids are lowercase hex (NULL when the record has none);
``event_name`` is the record's ``event_name`` field, else its ``event.name`` attribute."""
