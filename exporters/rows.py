"""The one span -> row conversion: OTLP protobuf ``ResourceSpans`` to Arrow.

Both ways into the dataset go through here. The in-process exporter encodes
SDK spans with the OpenTelemetry SDK's own OTLP encoder first
(:func:`spans_to_table`), and the OTLP receiver hands over the request it
decoded (:func:`request_to_table`); so a span that came over the wire and one
exported in-process become the same row.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans
from opentelemetry.sdk.trace import ReadableSpan

from otel_replay import semconv as sc

from .schema import SPAN_SCHEMA

__all__ = ["DATE_COLUMN", "any_value", "request_to_table", "resource_spans_to_table", "spans_to_table"]

DATE_COLUMN = "date"
"""Partition column carried beside the rows until the writer splits on it."""

_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
_STATUS = ("UNSET", "OK", "ERROR")
_DAY_NS = 86_400 * 1_000_000_000
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_PROMOTED = tuple(sc.PROMOTED_COLUMNS.items())
_COLUMNS = [f.name for f in SPAN_SCHEMA]


def any_value(value: Any) -> Any:
    """Convert an OTLP ``AnyValue`` to a JSON-ready Python value.

    Bytes become base64 text (JSON has no bytes type).
    """
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        return value.double_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return None


def _attrs(kvs: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


def _date_of(ns: int, cache: dict[int, str]) -> str:
    day = ns // _DAY_NS
    text = cache.get(day)
    if text is None:
        text = datetime.fromtimestamp(day * 86_400, tz=timezone.utc).strftime("%Y-%m-%d")
        cache[day] = text
    return text


def resource_spans_to_table(resource_spans: Sequence[ResourceSpans]) -> pa.Table:
    """Convert OTLP ``ResourceSpans`` messages to one Arrow table (plus ``date``)."""
    cols: dict[str, list[Any]] = {name: [] for name in _COLUMNS}
    dates: list[str] = []
    day_cache: dict[int, str] = {}
    for rs in resource_spans:
        resource = _attrs(rs.resource.attributes)
        service = resource.get(sc.SERVICE_NAME)
        service = service if isinstance(service, str) else None
        resource_json = _dumps(resource)
        for ss in rs.scope_spans:
            scope_name = ss.scope.name or None
            scope_version = ss.scope.version or None
            for span in ss.spans:
                attrs = _attrs(span.attributes)
                for key, column in _PROMOTED:
                    value = attrs.get(key)
                    if isinstance(value, str):
                        del attrs[key]
                        cols[column].append(value)
                    else:
                        cols[column].append(None)
                start = span.start_time_unix_nano
                end = span.end_time_unix_nano
                cols["trace_id"].append(span.trace_id.hex())
                cols["span_id"].append(span.span_id.hex())
                cols["parent_span_id"].append(span.parent_span_id.hex() or None)
                cols["trace_state"].append(span.trace_state or None)
                cols["name"].append(span.name)
                cols["kind"].append(_KINDS[span.kind] if span.kind < len(_KINDS) else str(span.kind))
                cols["service_name"].append(service)
                cols["scope_name"].append(scope_name)
                cols["scope_version"].append(scope_version)
                cols["start_time"].append(start)
                cols["end_time"].append(end)
                cols["duration_ns"].append(end - start if end >= start else None)
                code = span.status.code
                cols["status_code"].append(_STATUS[code] if code < len(_STATUS) else str(code))
                cols["status_message"].append(span.status.message or None)
                cols["attributes"].append(_dumps(attrs))
                cols["resource_attributes"].append(resource_json)
                cols["events"].append(
                    [
                        {"time": ev.time_unix_nano, "name": ev.name, "attributes": _dumps(_attrs(ev.attributes))}
                        for ev in span.events
                    ]
                )
                cols["links"].append(
                    [
                        {
                            "trace_id": link.trace_id.hex(),
                            "span_id": link.span_id.hex(),
                            "trace_state": link.trace_state or None,
                            "attributes": _dumps(_attrs(link.attributes)),
                        }
                        for link in span.links
                    ]
                )
                cols["dropped_attributes_count"].append(span.dropped_attributes_count)
                cols["dropped_events_count"].append(span.dropped_events_count)
                cols["dropped_links_count"].append(span.dropped_links_count)
                dates.append(_date_of(start, day_cache))
    table = pa.Table.from_pydict(cols, schema=SPAN_SCHEMA)
    return table.append_column(DATE_COLUMN, pa.array(dates, pa.string()))


def request_to_table(request: ExportTraceServiceRequest) -> pa.Table:
    """Convert a decoded OTLP ``ExportTraceServiceRequest`` to rows."""
    return resource_spans_to_table(request.resource_spans)


def spans_to_table(spans: Sequence[ReadableSpan]) -> pa.Table:
    """Convert SDK spans to rows via the SDK's own OTLP protobuf encoder."""
    return request_to_table(encode_spans(spans))
