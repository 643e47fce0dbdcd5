"""OTLP/JSON <-> protobuf, per the OTLP specification's JSON rules.

OTLP/JSON is the proto3 JSON mapping with two differences this module
handles: trace and span ids are hex strings (not base64), and enums are
integers. Field names are lowerCamelCase (the original snake_case names are
accepted too), 64-bit integers may be strings or numbers, and unknown fields
are ignored.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_replay.errors import PayloadError

__all__ = ["PayloadError", "message_to_json", "request_from_json", "request_from_obj", "request_to_obj"]

_ID_KEYS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")



def _items(obj: dict[str, Any], *keys: str) -> list[Any]:
    for key in keys:
        value = obj.get(key)
        if value is not None:
            if not isinstance(value, list):
                raise PayloadError(f"{key} must be a JSON array")
            return value
    return []


def _fix_ids(obj: Any, where: str) -> None:
    if not isinstance(obj, dict):
        raise PayloadError(f"{where} must be a JSON object")
    for key in _ID_KEYS:
        value = obj.get(key)
        if isinstance(value, str) and value:
            try:
                obj[key] = base64.b64encode(bytes.fromhex(value)).decode()
            except ValueError:
                raise PayloadError(f"{where}.{key} is not a hex string: {value[:40]!r}") from None


def request_from_obj(obj: Any) -> ExportTraceServiceRequest:
    """Build a request from decoded OTLP/JSON (``TracesData`` or an export request)."""
    if not isinstance(obj, dict):
        raise PayloadError("OTLP/JSON traces must be a JSON object with resourceSpans")
    for rs in _items(obj, "resourceSpans", "resource_spans"):
        if not isinstance(rs, dict):
            raise PayloadError("resourceSpans[] must be objects")
        for ss in _items(rs, "scopeSpans", "scope_spans"):
            if not isinstance(ss, dict):
                raise PayloadError("scopeSpans[] must be objects")
            for span in _items(ss, "spans"):
                _fix_ids(span, "span")
                for link in _items(span, "links"):
                    _fix_ids(link, "link")
    try:
        return json_format.ParseDict(obj, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, AttributeError) as exc:
        raise PayloadError(f"invalid OTLP/JSON: {str(exc).splitlines()[0]}") from None


def request_from_json(data: bytes | str) -> ExportTraceServiceRequest:
    """Parse an OTLP/JSON document."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PayloadError(f"invalid JSON: {exc}") from None
    return request_from_obj(obj)


def message_to_json(message: Message) -> bytes:
    """Encode a response (or ``google.rpc.Status``) as OTLP/JSON."""
    return json_format.MessageToJson(message, indent=None).encode()


def _hex_ids(obj: dict[str, Any]) -> None:
    for key in ("traceId", "spanId", "parentSpanId"):
        if key in obj:
            obj[key] = base64.b64decode(obj[key]).hex()


def request_to_obj(request: Message) -> dict[str, Any]:
    """Encode a request (or ``TracesData``) as an OTLP/JSON object: hex ids, integer enums."""
    obj = json_format.MessageToDict(request, use_integers_for_enums=True)
    for rs in obj.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                _hex_ids(span)
                for link in span.get("links", []):
                    _hex_ids(link)
    return obj
