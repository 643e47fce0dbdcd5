"""OTLP/JSON <-> protobuf, per the OTLP specification's JSON rules.

OTLP/JSON is the proto3 JSON mapping with two differences this module
handles: trace and span ids are hex strings (not base64), and enums are
integers. Field names are lowerCamelCase (the original snake_case names are
accepted too), 64-bit integers may be strings or numbers, and unknown fields
are ignored.

Documents are parsed strictly (duplicate keys, ``NaN`` and deep nesting are
refused) and every failure is a one-line :class:`PayloadError`, which the
HTTP receiver answers with 400 and ``ingest`` reports per record.
"""

from __future__ import annotations

import base64
import re
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_replay._json import strict_loads
from otel_replay.errors import PayloadError

__all__ = ["PayloadError", "message_to_json", "request_from_json", "request_from_obj", "request_to_obj"]

_ID_KEYS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")
_FAILED_FIELD = re.compile(r"Failed to parse (\w+) field: ")


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
    except (json_format.ParseError, ValueError, TypeError, AttributeError, OverflowError, RecursionError) as exc:
        raise PayloadError(f"invalid OTLP/JSON: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    """``Failed to parse a field: Failed to parse b field: why`` -> ``a.b: why``, on one line."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    text = " ".join(str(exc).split())
    path = _FAILED_FIELD.findall(text)
    reason = _FAILED_FIELD.sub("", text).rstrip(".")
    if len(reason) > 200:
        reason = reason[:200] + "..."
    if len(path) > 8:
        path = [*path[:4], "...", *path[-3:]]
    return f"{'.'.join(path)}: {reason}" if path else reason


def request_from_json(data: bytes | str, *, where: str = "invalid JSON") -> ExportTraceServiceRequest:
    """Parse an OTLP/JSON document, refusing what :func:`otel_replay._json.strict_loads` refuses.

    Duplicate keys, ``NaN``, nesting too deep and non-UTF-8 text raise a
    one-line :class:`PayloadError` starting with ``where``; so do values the
    OTLP schema cannot hold (an out-of-range or non-numeric integer, a
    non-hex id). Never ``RecursionError`` or ``OverflowError``.
    """
    return request_from_obj(strict_loads(data, where=where))


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
