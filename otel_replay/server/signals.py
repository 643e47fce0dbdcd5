"""The two OTLP signals the receiver takes (:data:`TRACES`, :data:`LOGS`), and which one a stored payload holds.

Both services (``/v1/traces`` and ``/v1/logs``; ``TraceService`` and
``LogsService``) parse, store and reply through one path, the signal's
:class:`Signal` saying which message, which store call and which reply.

The Collector's file exporter writes ``TracesData`` and ``LogsData`` alike,
as OTLP/JSON or protobuf, with nothing outside the payload saying which.
JSON names it: ``resourceSpans`` or ``resourceLogs``. In protobuf the two
are the same shape down to their records (field 1 resources, field 2 scopes,
field 2 records), so the first record's fields decide (past empty resources
and scopes): a span's and a log
record's fields of the same number have different wire types (a span's field
1 is its trace id, bytes; a log record's is its time, a fixed64). A record
whose fields fit both is read as spans, as ingest always read it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsPartialSuccess,
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from otel_replay._json import strict_loads
from otel_replay._wire import read_varint
from otel_replay.errors import PayloadError

from .admission import Intake
from .otlp_json import logs_request_from_json, logs_request_from_obj, request_from_json, request_from_obj

__all__ = ["LOGS", "TRACES", "OtlpRequest", "Signal", "is_logs_payload", "otlp_from_json", "otlp_from_proto"]

OtlpRequest = ExportTraceServiceRequest | ExportLogsServiceRequest
"""A request of either signal."""

@dataclass(frozen=True)
class Signal:
    """What differs between receiving traces and receiving logs: the message, where it is stored, the reply."""

    request_type: type[Message]
    from_json: Callable[[bytes], Message]
    """OTLP/JSON bytes to the request (one-line :class:`~otel_replay.errors.PayloadError` when they are not one)."""
    store: Callable[[Intake, Any], tuple[int, str]]
    """Admit and store a request on the receiver: (records rejected, why the first was)."""
    partial: Callable[[int, str], Message]
    """The response's ``partial_success`` for (records rejected, why)."""
    response_type: type[Message]

    @property
    def name(self) -> str:
        """The request message's name, for error messages."""
        return self.request_type.DESCRIPTOR.name

    def reply(self, rejected: int, message: str) -> Message:
        """The response to a stored request: with a partial success when records were rejected."""
        if rejected:
            return self.response_type(partial_success=self.partial(rejected, message))
        return self.response_type()


TRACES = Signal(
    ExportTraceServiceRequest,
    request_from_json,
    lambda intake, request: intake.accept(request),
    lambda rejected, why: ExportTracePartialSuccess(rejected_spans=rejected, error_message=why),
    ExportTraceServiceResponse,
)
"""Spans: ``/v1/traces``, ``TraceService/Export``."""
LOGS = Signal(
    ExportLogsServiceRequest,
    logs_request_from_json,
    lambda intake, request: intake.accept_logs(request),
    lambda rejected, why: ExportLogsPartialSuccess(rejected_log_records=rejected, error_message=why),
    ExportLogsServiceResponse,
)
"""Log records: ``/v1/logs``, ``LogsService/Export``."""

_LEN, _VARINT, _I64, _I32 = 2, 0, 1, 5
_SPAN_TYPES = {1: _LEN, 2: _LEN, 3: _LEN, 4: _LEN, 5: _LEN, 6: _VARINT, 7: _I64, 8: _I64, 9: _LEN, 10: _VARINT}
_SPAN_TYPES |= {11: _LEN, 12: _VARINT, 13: _LEN, 14: _VARINT, 15: _LEN, 16: _I32}
_LOG_TYPES = {1: _I64, 2: _VARINT, 3: _LEN, 5: _LEN, 6: _LEN, 7: _VARINT, 8: _I32, 9: _LEN, 10: _LEN, 11: _I64}
_LOG_TYPES |= {12: _LEN}
_FIXED = {_I64: 8, _I32: 4}


def _field(data: bytes, at: int, end: int) -> tuple[int, int, int, int] | None:
    """(number, wire type, start of its value, end of the field) of the field at ``at``, or ``None``."""
    key, at = read_varint(data, at, end)
    if at < 0:
        return None
    number, wire = key >> 3, key & 7
    if wire == _LEN:
        size, at = read_varint(data, at, end)
        return (number, wire, at, at + size) if 0 <= at and at + size <= end else None
    if wire == _VARINT:
        _, after = read_varint(data, at, end)
        return (number, wire, at, after) if after >= 0 else None
    if wire in _FIXED and at + _FIXED[wire] <= end:
        return number, wire, at, at + _FIXED[wire]
    return None


def _each(data: bytes, start: int, end: int, number: int) -> Iterator[tuple[int, int]]:
    """The value bounds of each length-delimited field ``number`` in ``data[start:end]``, up to a damaged field."""
    at = start
    while at < end:
        found = _field(data, at, end)
        if found is None:
            return
        if found[0] == number and found[1] == _LEN:
            yield found[2], found[3]
        at = found[3]


def _first_record(data: bytes) -> tuple[int, int] | None:
    """The bounds of the first record (span or log record) of any scope of any resource, or ``None``."""
    for resource in _each(data, 0, len(data), 1):
        for scope in _each(data, *resource, 2):
            for record in _each(data, *scope, 2):
                return record
    return None


def is_logs_payload(data: bytes) -> bool:
    """Whether protobuf ``data`` (``TracesData`` or ``LogsData``) holds log records (see the module docstring)."""
    bounds = _first_record(data)
    if bounds is None:
        return False
    at, end = bounds
    fits_spans = fits_logs = True
    while at < end:
        found = _field(data, at, end)
        if found is None:
            return False
        number, wire, _, at = found
        fits_spans = fits_spans and _SPAN_TYPES.get(number, wire) == wire
        fits_logs = fits_logs and _LOG_TYPES.get(number, wire) == wire
    return fits_logs and not fits_spans


def otlp_from_proto(data: bytes) -> OtlpRequest:
    """Parse protobuf ``TracesData`` or ``LogsData`` as the request of its signal.

    Raises:
        PayloadError: the bytes are not a protobuf message (one line, naming the signal tried).

    """
    logs = is_logs_payload(data)
    request: OtlpRequest = ExportLogsServiceRequest() if logs else ExportTraceServiceRequest()
    try:
        request.ParseFromString(data)
    except DecodeError as exc:
        raise PayloadError(f"not a protobuf {'LogsData' if logs else 'TracesData'}: {exc}") from None
    return request


def otlp_from_json(data: bytes | str, *, where: str = "invalid JSON") -> OtlpRequest:
    """Parse an OTLP/JSON traces or logs document, as the ``resourceLogs`` key (or its absence) says.

    Refuses what :func:`~otel_replay.server.otlp_json.request_from_json` refuses, with its one-line errors.
    """
    obj: Any = strict_loads(data, where=where)
    if isinstance(obj, dict) and ("resourceLogs" in obj or "resource_logs" in obj):
        return logs_request_from_obj(obj)
    return request_from_obj(obj)
