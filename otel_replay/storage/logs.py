"""OTLP log records: how they wait in the write-ahead log, what is admitted, and their Parquet rows.

The receiver keeps log requests in the same write-ahead log as span requests,
so they share its group commit, sealing, crash recovery and quarantine. A
record holds an ``ExportTraceServiceRequest`` (its first byte is ``0x0a``,
field 1) or a log request wrapped as field 2 (:func:`wrap_logs`: ``0x12``,
a varint length, then the serialized ``ExportLogsServiceRequest``). A
reader that knows only spans decodes a wrapped record as a request with an
unknown field and no spans; the converter tells them apart with
:func:`logs_payload`.

Rows (:data:`~otel_replay.exporters.schema.LOG_SCHEMA`) live under
``<dataset>/logs/date=YYYY-MM-DD/``, named after their segment like span
files, so converting a segment again rewrites the same files. Bodies and
attributes are redacted, and a body is capped as captured content is
(:data:`~otel_replay.redaction.MAX_CONTENT_CHARS`).
"""

from __future__ import annotations

import json
import math
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

from otel_replay import semconv as sc
from otel_replay._json import compact_json
from otel_replay._wire import read_varint, varint
from otel_replay.exporters.otlp_wire import any_value
from otel_replay.exporters.rows import COUNT_LIMIT, TIME_LIMIT_NS
from otel_replay.exporters.schema import LOG_SCHEMA, LOGS_DIR
from otel_replay.exporters.writer import write_table
from otel_replay.location import resolve
from otel_replay.redaction import MAX_CONTENT_CHARS, SCAN_CHARS, redact, redact_value
from otel_replay.storage.admitted import Admission

__all__ = [
    "CHUNK_BYTES",
    "CHUNK_ROWS",
    "EVENT_NAME_ATTRIBUTE",
    "LOGS_TAG",
    "LogWriter",
    "admit_logs",
    "body_json",
    "logs_payload",
    "logs_to_table",
    "wrap_logs",
]

LOGS_TAG = 0x12
"""First byte of a write-ahead log record that holds a log request (field 2, length-delimited)."""
EVENT_NAME_ATTRIBUTE = "event.name"
"""The attribute older SDKs carry an event's name in (newer ones fill the LogRecord's ``event_name``)."""
_DAY_NS = 86_400 * 1_000_000_000
_DATE = "date"
CHUNK_ROWS = 100_000
"""Log rows per output chunk (per date), as for spans; the same records always give the same chunks."""
CHUNK_BYTES = 128 * 1024 * 1024
"""Arrow bytes collected before a chunk is written (whichever of rows and bytes comes first)."""


def wrap_logs(payload: bytes) -> bytes:
    """A serialized ``ExportLogsServiceRequest`` as a write-ahead log record (see the module docstring)."""
    return bytes((LOGS_TAG,)) + varint(len(payload)) + payload


def logs_payload(record: bytes) -> bytes | None:
    """The log request inside a record made by :func:`wrap_logs`, or ``None`` for any other record (spans)."""
    if not record or record[0] != LOGS_TAG:
        return None
    value, at = read_varint(record, 1)
    if at < 0 or at + value != len(record):
        return None  # not one whole wrapped request: not ours
    return record[at:]


def _record_day(record: LogRecord) -> int:
    return (record.time_unix_nano or record.observed_time_unix_nano) // _DAY_NS


def _problem(record: LogRecord) -> tuple[str, str] | None:
    trace_id, span_id = record.trace_id, record.span_id
    if len(trace_id) not in (0, 16) or len(span_id) not in (0, 8):
        return (
            f"trace_id must be 16 bytes and span_id 8 bytes, or absent (got {len(trace_id)} and {len(span_id)})",
            "bad_ids",
        )
    if span_id and not trace_id:
        return "a span_id without a trace_id", "bad_ids"
    if trace_id == bytes(16) or span_id == bytes(8):
        return "an all-zero trace_id or span_id is invalid (OTLP)", "bad_ids"
    if record.time_unix_nano >= TIME_LIMIT_NS or record.observed_time_unix_nano >= TIME_LIMIT_NS:
        return "time_unix_nano or observed_time_unix_nano is past what the dataset stores (year 2262)", "bad_times"
    if record.dropped_attributes_count > COUNT_LIMIT:
        return f"dropped_attributes_count {record.dropped_attributes_count} exceeds {COUNT_LIMIT}", "bad_counts"
    return None


def admit_logs(
    request: ExportLogsServiceRequest, *, max_dates: int | None = None, max_shared_bytes: int | None = None
) -> Admission:
    """Drop, in place, log records that cannot become rows; count them by reason.

    Refused: a trace id that is neither absent nor 16 bytes, a span id that
    is neither absent nor 8 bytes (or one without a trace id, or either all
    zero), a time the dataset cannot store, a dropped count past int32, a
    record on a date (UTC day) beyond the first ``max_dates`` of the request,
    and records past ``max_shared_bytes`` of resource and scope repeated per
    record (as :func:`~otel_replay.storage.convert.admit_spans` does for spans).
    ``message`` names the first refused record (its place in the request) and why.
    """
    result = Admission()
    shared = 0
    for r, rl in enumerate(request.resource_logs):
        resource_bytes = rl.resource.ByteSize() if max_shared_bytes is not None else 0
        for s, sl in enumerate(rl.scope_logs):
            per_record = resource_bytes + sl.scope.ByteSize() if max_shared_bytes is not None else 0
            bad: set[int] = set()
            for i, record in enumerate(sl.log_records):
                found = _problem(record)
                if found is None and max_dates is not None:
                    day = _record_day(record)
                    if day not in result.days:
                        if len(result.days) < max_dates:
                            result.days.add(day)
                        else:
                            found = f"more than {max_dates} distinct dates in one request", "too_many_dates"
                if found is None and max_shared_bytes is not None:
                    if shared + per_record > max_shared_bytes:
                        found = (
                            f"its resource and scope ({per_record} bytes) would take the request past "
                            f"{max_shared_bytes} bytes of resource and scope repeated per record",
                            "too_much_shared",
                        )
                    else:
                        shared += per_record
                if found is None:
                    continue
                reason, counter = found
                setattr(result, counter, getattr(result, counter) + 1)
                bad.add(i)
                if not result.message:
                    result.message = f"log record {i} (resource_logs[{r}].scope_logs[{s}]): {reason}"
            result.accepted += len(sl.log_records) - len(bad)
            result.rejected += len(bad)
            if bad:
                good = [record for i, record in enumerate(sl.log_records) if i not in bad]
                sl.ClearField("log_records")
                sl.log_records.extend(good)
    return result


def body_json(value: Any) -> str:
    """A log body as JSON text: secrets redacted (by key name, then by shape), cut past ``MAX_CONTENT_CHARS``.

    The result is always valid JSON: a body too long to keep whole (or that
    redaction left unparseable) is stored as a JSON string of its redacted,
    cut text, with a marker saying how much was cut.
    """
    value = redact_value(value)
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:  # NaN or an infinity (OTLP doubles may be either): kept as text, so the body stays JSON
        text = json.dumps(_finite(value), ensure_ascii=False, separators=(",", ":"))
    if len(text) <= MAX_CONTENT_CHARS:
        redacted = redact(text)
        try:
            json.loads(redacted)
        except ValueError:
            return json.dumps(redacted, ensure_ascii=False)
        return redacted
    kept = redact(text[:SCAN_CHARS])
    cut = len(text) - MAX_CONTENT_CHARS
    return json.dumps(f"{kept[:MAX_CONTENT_CHARS]}…[{cut}+ chars cut]", ensure_ascii=False)


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by its text (``"nan"``, ``"inf"``, ``"-inf"``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


def _time(ns: int) -> int | None:
    return ns or None


def logs_to_table(request: ExportLogsServiceRequest) -> pa.Table:
    """The request's log records as rows of :data:`LOG_SCHEMA`, plus the ``date`` partition column.

    Call it on an admitted request (:func:`admit_logs`): its times and counts fit the columns.
    """
    cols: dict[str, list[Any]] = {f.name: [] for f in LOG_SCHEMA}
    days: list[int] = []
    for rl in request.resource_logs:
        resource = redact_value(_attributes(rl.resource.attributes))
        service = resource.get(sc.SERVICE_NAME)
        resource_json = compact_json(resource)
        for sl in rl.scope_logs:
            scope_json = compact_json(redact_value(_attributes(sl.scope.attributes)))
            for record in sl.log_records:
                attrs = redact_value(_attributes(record.attributes))
                event = record.event_name or attrs.get(EVENT_NAME_ATTRIBUTE)
                body = record.body if record.HasField("body") else None
                row = {
                    "time": _time(record.time_unix_nano),
                    "observed_time": _time(record.observed_time_unix_nano),
                    "severity_number": record.severity_number or None,
                    "severity_text": record.severity_text or None,
                    "body": None if body is None else body_json(any_value(body)),
                    "attributes": compact_json(attrs),
                    "event_name": event if isinstance(event, str) and event else None,
                    "trace_id": record.trace_id.hex() or None,
                    "span_id": record.span_id.hex() or None,
                    "flags": record.flags,
                    "dropped_attributes_count": record.dropped_attributes_count,
                    "service_name": service if isinstance(service, str) else None,
                    "resource_attributes": resource_json,
                    "scope_name": sl.scope.name or None,
                    "scope_version": sl.scope.version or None,
                    "scope_attributes": scope_json,
                }
                for name, value in row.items():
                    cols[name].append(value)
                days.append(_record_day(record))
    arrays = [pa.array(cols[f.name], pa.int64() if f.name.endswith("time") else f.type) for f in LOG_SCHEMA]
    arrays = [a.cast(f.type) for a, f in zip(arrays, LOG_SCHEMA, strict=True)]
    table = pa.Table.from_arrays(arrays, schema=LOG_SCHEMA)
    names = {day: datetime.fromtimestamp(day * 86_400, tz=UTC).strftime("%Y-%m-%d") for day in set(days)}
    return table.append_column(_DATE, pa.array([names[d] for d in days], pa.string()))


class LogWriter:
    """Collect log row tables and write them as ``<prefix>-<chunk>.parquet`` per date under ``<dataset>/logs/``.

    The same input gives the same files: a chunk is written once it holds ``chunk_rows`` rows or
    :data:`CHUNK_BYTES` bytes, and at :meth:`flush`; chunks are named in order.
    """

    def __init__(self, dataset: str | os.PathLike[str], prefix: str, *, chunk_rows: int = CHUNK_ROWS) -> None:
        """Write under ``<dataset>/logs/date=*/``, names starting with ``prefix``."""
        self.chunk_rows = chunk_rows
        self.location = resolve(dataset)
        self.logs_dir: Path | str = self.location.native(self.location.join(LOGS_DIR))
        self.prefix = prefix
        self.rows_written = 0
        self.paths: list[Path | str] = []
        self._tables: list[pa.Table] = []
        self._rows = 0
        self._bytes = 0
        self._chunk = 0

    def add_payload(self, payload: bytes) -> int:
        """Decode a serialized ``ExportLogsServiceRequest`` (raising what the parser raises) and add its rows."""
        return self.add_request(ExportLogsServiceRequest.FromString(payload))

    def add_request(self, request: ExportLogsServiceRequest) -> int:
        """Add the rows of an admitted request (:func:`admit_logs`); how many."""
        table = logs_to_table(request)
        if table.num_rows:
            self._tables.append(table)
            self._rows += table.num_rows
            self._bytes += table.nbytes
            if self._rows >= self.chunk_rows or self._bytes >= CHUNK_BYTES:  # bounded: a chunk is written as it fills
                self.flush()
        return table.num_rows

    def flush(self) -> None:
        """Write the collected rows as the next chunk (one file per date)."""
        if not self._tables:
            return
        table = pa.concat_tables(self._tables)
        name = f"{self.prefix}-{self._chunk:05d}.parquet"
        dates = table.column(_DATE)
        body = table.drop_columns([_DATE])
        for date in sorted(set(dates.to_pylist())):
            part = body.filter(pc.equal(dates, date))
            path = self.location.native(self.location.join(LOGS_DIR, f"date={date}", name))
            write_table(part, self.location, path)
            self.paths.append(path)
        self._tables, self._rows, self._bytes = [], 0, 0
        self.rows_written += table.num_rows
        self._chunk += 1
