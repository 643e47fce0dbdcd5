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
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_replay._json import strict_loads
from otel_replay.errors import PayloadError

__all__ = [
    "PayloadError",
    "logs_request_from_json",
    "logs_request_from_obj",
    "message_to_json",
    "request_from_json",
    "request_from_obj",
    "request_to_obj",
]

_ID_FIELDS = frozenset({"trace_id", "span_id", "parent_span_id"})
"""Fields of ``Span``, ``Span.Link`` and ``LogRecord`` that OTLP/JSON spells as hex, not base64."""
_HEX_ID_MESSAGES = frozenset(
    {
        "opentelemetry.proto.trace.v1.Span",
        "opentelemetry.proto.trace.v1.Span.Link",
        "opentelemetry.proto.logs.v1.LogRecord",
    }
)
_BASE64 = re.compile(r"(?:[A-Za-z0-9+/_-]{4})*(?:[A-Za-z0-9+/_-]{2}(?:==)?|[A-Za-z0-9+/_-]{3}=?)?")
"""What protobuf's JSON parser would decode without dropping characters (standard or URL-safe alphabet)."""
_INT32 = range(-(2**31), 2**31)
_STRICT_ENUMS = frozenset({"opentelemetry.proto.logs.v1.SeverityNumber"})
"""Enums whose unknown names are refused (the parser, told to ignore unknown fields, would store 0 silently)."""
_FAILED_FIELD = re.compile(r"Failed to parse (\w+) field: ")
_FIELDS: dict[str, dict[str, FieldDescriptor]] = {}


def _fields(descriptor: Descriptor) -> dict[str, FieldDescriptor]:
    """A message's fields by both JSON spellings (``traceId`` and ``trace_id``)."""
    fields = _FIELDS.get(descriptor.full_name)
    if fields is None:
        fields = {}
        for field in descriptor.fields:
            fields[field.name] = fields[field.json_name] = field
        _FIELDS[descriptor.full_name] = fields
    return fields


def _check(obj: Any, descriptor: Descriptor, where: str) -> None:
    """Refuse what ``json_format`` would silently get wrong; turn hex ids into the base64 it expects.

    ``json_format`` keeps only the last of two spellings of one field
    (``resourceSpans`` and ``resource_spans``), truncates an enum number to
    32 bits and drops characters that are not base64; each is a one-line
    :class:`PayloadError` naming the field and where it is.
    """
    if not isinstance(obj, dict):
        raise PayloadError(f"{where} must be a JSON object")
    fields = _fields(descriptor)
    hex_ids = descriptor.full_name in _HEX_ID_MESSAGES
    seen: dict[str, str] = {}
    for key, value in obj.items():
        field = fields.get(key)
        if field is None:
            continue  # unknown fields are ignored, per OTLP/JSON
        if field.name in seen:
            raise PayloadError(f"{where}: {seen[field.name]!r} and {key!r} are the same field; give it once")
        seen[field.name] = key
        if value is None:
            continue
        path = f"{where}.{key}"
        if field.is_repeated:
            if not isinstance(value, list):
                raise PayloadError(f"{path} must be a JSON array")
            for i, item in enumerate(value):
                _check_value(obj, key, item, field, f"{path}[{i}]", hex_ids, value, i)
        else:
            _check_value(obj, key, value, field, path, hex_ids, None, 0)


def _check_value(
    obj: dict[str, Any],
    key: str,
    value: Any,
    field: FieldDescriptor,
    path: str,
    hex_ids: bool,
    items: list[Any] | None,
    index: int,
) -> None:
    kind = field.type
    if kind == FieldDescriptor.TYPE_MESSAGE:
        if value is not None:
            _check(value, field.message_type, path)
    elif kind == FieldDescriptor.TYPE_ENUM:
        _check_enum(value, field, path)
    elif kind == FieldDescriptor.TYPE_BYTES and isinstance(value, str):
        if hex_ids and field.name in _ID_FIELDS:
            if value:
                try:
                    encoded = base64.b64encode(bytes.fromhex(value)).decode()
                except ValueError:
                    raise PayloadError(f"{path} is not a hex string: {value[:40]!r}") from None
                if items is None:
                    obj[key] = encoded
                else:
                    items[index] = encoded
        elif not _BASE64.fullmatch(value):
            raise PayloadError(f"{path} is not base64: {value[:40]!r}")


def _check_enum(value: Any, field: FieldDescriptor, path: str) -> None:
    """Refuse an enum value the parser would wrap into another (it applies ``int()``, the store keeps 32 bits).

    Accepted: a value name, or an integer within int32 (a JSON number, an
    integral float such as ``2.0``, or a numeric string such as ``"2"``).
    Refused: ``true``/``false``, fractions (``1.9``) and anything past int32
    (``4294967298``, ``"4294967297"``, ``4294967298.0``): each would be stored
    as some other value.
    """
    if isinstance(value, bool):
        raise PayloadError(f"{path}: enum value {value!r} must be a number or a name, not a boolean")
    if isinstance(value, float):
        if not value.is_integer():
            raise PayloadError(f"{path}: enum value {value!r} is not an integer")
        value = int(value)
    elif isinstance(value, str):
        if value in field.enum_type.values_by_name:
            return
        try:
            value = int(value)
        except ValueError:
            if field.enum_type.full_name in _STRICT_ENUMS:
                raise PayloadError(f"{path}: {value[:40]!r} is not a {field.enum_type.name} name or number") from None
            return  # not a number: the parser names it as an invalid enum value
    if isinstance(value, int) and value not in _INT32:
        raise PayloadError(f"{path}: enum value {value} is out of range")


def request_from_obj(obj: Any) -> ExportTraceServiceRequest:
    """Build a request from decoded OTLP/JSON (``TracesData`` or an export request)."""
    return _from_obj(obj, ExportTraceServiceRequest(), "traces must be a JSON object with resourceSpans")


def logs_request_from_obj(obj: Any) -> ExportLogsServiceRequest:
    """Build a logs request from decoded OTLP/JSON (``LogsData`` or an export request)."""
    return _from_obj(obj, ExportLogsServiceRequest(), "logs must be a JSON object with resourceLogs")


_M = TypeVar("_M", bound=Message)


def _from_obj(obj: Any, request: _M, shape: str) -> _M:
    """Fill ``request`` from decoded OTLP/JSON ``obj``, checked against its schema first (see :func:`_check`)."""
    if not isinstance(obj, dict):
        raise PayloadError(f"OTLP/JSON {shape}")
    try:
        _check(obj, request.DESCRIPTOR, "request")
    except RecursionError:
        raise PayloadError("invalid OTLP/JSON: nested too deeply") from None
    try:
        return json_format.ParseDict(obj, request, ignore_unknown_fields=True)
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


def logs_request_from_json(data: bytes | str, *, where: str = "invalid JSON") -> ExportLogsServiceRequest:
    """Parse an OTLP/JSON logs document (``LogsData`` or an export request) as :func:`request_from_json` does."""
    return logs_request_from_obj(strict_loads(data, where=where))


def message_to_json(message: Message) -> bytes:
    """Encode a response (or ``google.rpc.Status``) as OTLP/JSON."""
    return json_format.MessageToJson(message, indent=None).encode()


def _hex_ids(obj: dict[str, Any]) -> None:
    for key in ("traceId", "spanId", "parentSpanId"):
        if key in obj:
            obj[key] = base64.b64decode(obj[key]).hex()


def request_to_obj(request: Message) -> dict[str, Any]:
    """Encode a request (or ``TracesData``, ``LogsData``) as an OTLP/JSON object: hex ids, integer enums."""
    obj = json_format.MessageToDict(request, use_integers_for_enums=True)
    for rs in obj.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                _hex_ids(span)
                for link in span.get("links", []):
                    _hex_ids(link)
    for rl in obj.get("resourceLogs", []):
        for sl in rl.get("scopeLogs", []):
            for record in sl.get("logRecords", []):
                _hex_ids(record)
    return obj
