"""The span -> row conversion: one row builder, fed from SDK spans or OTLP protobuf.

Everything that decides what a row *is* (which attributes are promoted to
typed columns, how values become JSON, id and time encoding, the partition
date) lives in :class:`RowBuilder`. Two thin readers feed it: one walks SDK
``ReadableSpan`` objects (the in-process exporter), the other walks decoded
OTLP ``ResourceSpans`` (the OTLP receiver, ``ingest``). Both hand the builder
the same plain values, so a span exported in-process and the same span sent
over OTLP become byte-identical rows; ``tests/test_rows.py`` pins that by
pushing one set of spans through both (the SDK's own OTLP encoder on one side).

The SDK reader exists because encoding to protobuf and decoding it again in
the same process costs more than the whole row build (see benchmarks/).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans
from opentelemetry.sdk.trace import ReadableSpan

from otel_replay import semconv as sc
from otel_replay.errors import PayloadError

from .schema import SPAN_SCHEMA

__all__ = [
    "DATE_COLUMN",
    "TIME_LIMIT_NS",
    "RowBuilder",
    "any_value",
    "request_to_table",
    "resource_spans_to_table",
    "span_time_error",
    "spans_to_table",
]

DATE_COLUMN = "date"
"""Partition column carried beside the rows until the writer splits on it."""

_OTLP_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
_OTLP_STATUS = ("UNSET", "OK", "ERROR")
_DAY_NS = 86_400 * 1_000_000_000
_PROMOTED_KEYS = tuple(sc.PROMOTED_COLUMNS)
ROW_ORDER = (
    "trace_id",
    "span_id",
    "parent_span_id",
    "trace_state",
    "name",
    "kind",
    "service_name",
    "scope_name",
    "scope_version",
    "start_time",
    "end_time",
    "duration_ns",
    "status_code",
    "status_message",
    *sc.PROMOTED_COLUMNS.values(),
    "attributes",
    "resource_attributes",
    "events",
    "links",
    "dropped_attributes_count",
    "dropped_events_count",
    "dropped_links_count",
)
"""The order of the values in a :class:`RowBuilder` row; equal to ``SPAN_SCHEMA`` (pinned by a test)."""


def _bytes_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    raise TypeError(f"{type(value).__name__} is not an attribute value")


_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=_bytes_default).encode

TIME_LIMIT_NS = 2**63 - 1
"""Span, end and event times must be below this (int64 nanoseconds; 2262-04-11, DuckDB's "infinity")."""
_TIME_LIMIT = TIME_LIMIT_NS
_COUNT_LIMIT = 2**31 - 1  # the dropped_* columns are int32


def span_time_error(start_ns: int, end_ns: int, event_times: Iterable[int] = ()) -> str | None:
    """Why a span's times cannot be stored, or ``None`` when they can.

    A time must be a whole number of nanoseconds in ``[0, TIME_LIMIT_NS)``: the
    dataset stores ``timestamp(ns)`` (int64), and OTLP's unsigned fields can
    carry up to ``2**64-1``. An end before the start is storable (its
    ``duration_ns`` is NULL), so it is not an error by itself. Both span
    readers, the in-process exporter and the OTLP receiver call this per span,
    so one bad span is refused alone instead of failing its whole batch.
    """
    for label, value in (("start_time", start_ns), ("end_time", end_ns)):
        if not 0 <= value < TIME_LIMIT_NS:
            return f"{label} {value} ns is out of range (0 to {TIME_LIMIT_NS - 1})"
    for index, value in enumerate(event_times):
        if not 0 <= value < TIME_LIMIT_NS:
            return f"event {index} time {value} ns is out of range (0 to {TIME_LIMIT_NS - 1})"
    return None


def _span_label(trace_id: str, span_id: str, name: str) -> str:
    return f"span {name!r} (trace {trace_id}, span {span_id})"


class RowBuilder:
    """Accumulates spans as row tuples and turns them into one Arrow table.

    Args:
        rejected: where to note spans that cannot be stored (one line each,
            naming the span and why); such spans are left out. Without it, the
            first such span raises :class:`~otel_replay.errors.PayloadError`.

    """

    def __init__(self, rejected: list[str] | None = None) -> None:
        """Start an empty batch."""
        self.rows: list[tuple[Any, ...]] = []
        self._days: dict[int, str] = {}
        self._rejected = rejected

    def _refuse(self, label: str, reason: str) -> None:
        if self._rejected is None:
            raise PayloadError(f"{label}: {reason}")
        self._rejected.append(f"{label}: {reason}")

    def add(
        self,
        *,
        trace_id: str,
        span_id: str,
        parent_span_id: str | None,
        trace_state: str | None,
        name: str,
        kind: str,
        resource: tuple[str | None, str],
        scope: tuple[str | None, str | None],
        start: int,
        end: int,
        status: tuple[str, str | None],
        attributes: dict[str, Any],
        events: list[dict[str, Any]],
        links: list[dict[str, Any]],
        dropped: tuple[int, int, int],
    ) -> bool:
        """Append one span; ``False`` when it was refused (see the class docstring).

        ``attributes`` is consumed (promoted keys are removed).
        """
        # The hot path: inline comparisons (span_time_error says why, when one fails).
        bad = not (0 <= start < _TIME_LIMIT and 0 <= end < _TIME_LIMIT)
        for ev in events:
            if not 0 <= ev["time"] < _TIME_LIMIT:
                bad = True
        if bad:
            why = span_time_error(start, end, [ev["time"] for ev in events])
            self._refuse(_span_label(trace_id, span_id, name), why or "time out of range")
            return False
        if (dropped[0] | dropped[1] | dropped[2]) > _COUNT_LIMIT:  # any above 2**31-1 (all are >= 0)
            self._refuse(_span_label(trace_id, span_id, name), f"dropped counts {dropped} exceed {_COUNT_LIMIT}")
            return False
        promoted: list[str | None] = []
        for key in _PROMOTED_KEYS:
            value = attributes.get(key)
            if value.__class__ is str:
                del attributes[key]
                promoted.append(value)
            else:
                promoted.append(None)
        day = start // _DAY_NS
        date = self._days.get(day)
        if date is None:
            date = self._days[day] = datetime.fromtimestamp(day * 86_400, tz=UTC).strftime("%Y-%m-%d")
        # Order: the columns of SPAN_SCHEMA (a test pins it), then the partition date.
        self.rows.append(
            (
                trace_id,
                span_id,
                parent_span_id,
                trace_state,
                name,
                kind,
                resource[0],
                scope[0],
                scope[1],
                start,
                end,
                end - start if end >= start else None,
                status[0],
                status[1],
                *promoted,
                _dumps(attributes),
                resource[1],
                events,
                links,
                dropped[0],
                dropped[1],
                dropped[2],
                date,
            )
        )
        return True

    def table(self) -> pa.Table:
        """The batch as an Arrow table in :data:`SPAN_SCHEMA`, plus the ``date`` column."""
        columns = list(zip(*self.rows, strict=True)) if self.rows else [()] * (len(SPAN_SCHEMA) + 1)
        arrays = [pa.array(col, type=f.type) for col, f in zip(columns, SPAN_SCHEMA, strict=False)]
        table = pa.Table.from_arrays(arrays, schema=SPAN_SCHEMA)
        return table.append_column(DATE_COLUMN, pa.array(columns[-1], pa.string()))


def _resource(attributes: Mapping[str, Any]) -> tuple[str | None, str]:
    service = attributes.get(sc.SERVICE_NAME)
    return (service if isinstance(service, str) else None), _dumps(dict(attributes))


# --- OTLP protobuf reader ------------------------------------------------------
def any_value(value: Any) -> Any:
    """Convert an OTLP ``AnyValue`` to a JSON-ready Python value (bytes become base64 text)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return getattr(value, kind)


def _pb_attrs(kvs: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


def resource_spans_to_table(resource_spans: Sequence[ResourceSpans], rejected: list[str] | None = None) -> pa.Table:
    """Convert OTLP ``ResourceSpans`` messages to one Arrow table (plus ``date``).

    A span that cannot be stored (see :func:`span_time_error`) is noted in
    ``rejected`` and left out; without ``rejected`` it raises ``PayloadError``.
    """
    rows = RowBuilder(rejected)
    for rs in resource_spans:
        resource = _resource(_pb_attrs(rs.resource.attributes))
        for ss in rs.scope_spans:
            scope = (ss.scope.name or None, ss.scope.version or None)
            for span in ss.spans:
                rows.add(
                    trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex() or None,
                    trace_state=span.trace_state or None,
                    name=span.name,
                    kind=_OTLP_KINDS[span.kind] if span.kind < len(_OTLP_KINDS) else str(span.kind),
                    resource=resource,
                    scope=scope,
                    start=span.start_time_unix_nano,
                    end=span.end_time_unix_nano,
                    status=(
                        _OTLP_STATUS[span.status.code]
                        if span.status.code < len(_OTLP_STATUS)
                        else str(span.status.code),
                        span.status.message or None,
                    ),
                    attributes=_pb_attrs(span.attributes),
                    events=[
                        {"time": ev.time_unix_nano, "name": ev.name, "attributes": _dumps(_pb_attrs(ev.attributes))}
                        for ev in span.events
                    ],
                    links=[
                        {
                            "trace_id": link.trace_id.hex(),
                            "span_id": link.span_id.hex(),
                            "trace_state": link.trace_state or None,
                            "attributes": _dumps(_pb_attrs(link.attributes)),
                        }
                        for link in span.links
                    ],
                    dropped=(span.dropped_attributes_count, span.dropped_events_count, span.dropped_links_count),
                )
    return rows.table()


def request_to_table(request: ExportTraceServiceRequest, rejected: list[str] | None = None) -> pa.Table:
    """Convert a decoded OTLP ``ExportTraceServiceRequest`` to rows (``rejected``: as above)."""
    return resource_spans_to_table(request.resource_spans, rejected)


# --- SDK span reader -----------------------------------------------------------


def _sdk_attrs(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    # Tuples need no conversion: JSON encodes them as arrays, like OTLP arrays.
    if not attributes:
        return {}
    # The SDK's BoundedAttributes keeps a plain dict; copying it directly skips
    # a Python-level walk of the mapping (a fifth of the exporter's time).
    inner = getattr(attributes, "_dict", None)
    return dict(inner) if isinstance(inner, dict) else dict(attributes)


def _span_attrs(span: ReadableSpan) -> dict[str, Any]:
    # ``span.attributes`` is a read-only view over the span's BoundedAttributes.
    return _sdk_attrs(getattr(span, "_attributes", None) or span.attributes)


def spans_to_table(spans: Sequence[ReadableSpan], rejected: list[str] | None = None) -> pa.Table:
    """Convert SDK spans to rows (the same rows OTLP-encoding them would give).

    A span that cannot be stored (see :func:`span_time_error`) is noted in
    ``rejected`` and left out; without ``rejected`` it raises ``PayloadError``.
    """
    rows = RowBuilder(rejected)
    resources: dict[int, tuple[str | None, str]] = {}
    for span in spans:
        ctx = span.context
        parent = span.parent
        res = span.resource
        resource = resources.get(id(res))
        if resource is None:
            resource = resources[id(res)] = _resource(res.attributes)
        scope = span.instrumentation_scope
        status = span.status
        header = ctx.trace_state.to_header() if ctx.trace_state else ""
        rows.add(
            trace_id=f"{ctx.trace_id:032x}",
            span_id=f"{ctx.span_id:016x}",
            parent_span_id=f"{parent.span_id:016x}" if parent is not None else None,
            trace_state=header or None,
            name=span.name,
            kind=span.kind.name,
            resource=resource,
            scope=(scope.name or None, scope.version or None) if scope is not None else (None, None),
            start=span.start_time or 0,
            end=span.end_time or 0,
            status=(status.status_code.name, status.description or None),
            attributes=_span_attrs(span),
            events=[
                {"time": ev.timestamp, "name": ev.name, "attributes": _dumps(_sdk_attrs(ev.attributes))}
                for ev in span.events
            ],
            links=[
                {
                    "trace_id": f"{link.context.trace_id:032x}",
                    "span_id": f"{link.context.span_id:016x}",
                    "trace_state": (link.context.trace_state.to_header() or None) if link.context.trace_state else None,
                    "attributes": _dumps(_sdk_attrs(link.attributes)),
                }
                for link in span.links
            ],
            dropped=(span.dropped_attributes, span.dropped_events, span.dropped_links),
        )
    return rows.table()
