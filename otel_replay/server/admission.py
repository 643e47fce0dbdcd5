"""Admission control of the receiver: what a request is charged in memory before and while it is decoded.

A request holds a :class:`Reservation` of in-flight bytes that grows with
the bytes actually read, inflated and about to be decoded
(:func:`decode_charge`); the receiver refuses it with :class:`Overloaded`
(429 / ``RESOURCE_EXHAUSTED``, or 503 / ``UNAVAILABLE`` while it shuts down)
when its budget would be exceeded, and a body whose decoding alone would
take too much is refused outright (:func:`decode_limit_error`, 413).
:class:`Intake` is what the OTLP services need of the receiver.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_replay.errors import Overloaded
from otel_replay.storage.wal import WriteAheadLog

from .config import Metrics, ServerConfig

__all__ = [
    "JSON_EXPANSION",
    "MAX_DECODE_FACTOR",
    "PROTOBUF_EXPANSION",
    "Intake",
    "Overloaded",
    "Reservation",
    "decode_charge",
    "decode_limit_error",
    "release_free_memory",
]

PROTOBUF_EXPANSION = 7
"""In-flight bytes reserved per byte of a protobuf body as it is read: the body, the decoded message, the WAL copy.

Measured (``benchmarks/bench_hostile.py``, 25 MiB requests of SDK spans):
decoding a protobuf ``ExportTraceServiceRequest`` takes about 5x its size in
Python/upb objects, and the WAL copy another 1-2x. Before decoding, the charge
is raised to :func:`decode_charge`, which also covers bodies of many tiny
messages.
"""
PROTOBUF_MESSAGE_BYTES = 64
"""In-flight bytes reserved per sub-message a protobuf body may hold (see :func:`decode_charge`).

Measured (upb, protobuf 7): an empty ``AnyValue`` decodes to 42 bytes, an empty
``KeyValue`` 54, ``Span.Event`` 62, ``ResourceSpans``/``ScopeSpans`` 64.
"""
PROTOBUF_SPAN_BYTES = 120
"""Reserved on top of :data:`PROTOBUF_MESSAGE_BYTES` per possible ``Span`` (an empty one decodes to 177 bytes)."""
MAX_DECODE_FACTOR = 24
"""A request whose :func:`decode_charge` exceeds this many times ``max_request_bytes`` is refused (413).

SDK spans are charged about 18x their protobuf size and 14x their OTLP/JSON
size; a body of nothing but tiny messages, up to 92x. The cap keeps one
request alone in flight (always let through) from taking more than this.
"""
JSON_EXPANSION = 3
"""In-flight bytes reserved per byte of an OTLP/JSON body as it is read (before :func:`decode_charge`)."""
JSON_NODE_BYTES = 192
"""In-flight bytes reserved per JSON object, array or element of an OTLP/JSON body.

Measured: parsed and converted, an OTLP/JSON node takes 114 bytes for SDK
spans, 115 for an empty ``{}`` in an array, up to 200 for an object with many
distinct keys (the dict, its keys, and the decoded message).
"""


def decode_limit_error(charge: int, max_request_bytes: int) -> str | None:
    """Why a body charged ``charge`` by :func:`decode_charge` is refused (413), or None when it may be decoded."""
    limit = MAX_DECODE_FACTOR * max_request_bytes
    if charge <= limit:
        return None
    return (
        f"body would decode to about {charge >> 20} MiB of objects, over the {limit >> 20} MiB limit "
        f"({MAX_DECODE_FACTOR} x the request limit); send fewer, larger values per request"
    )


def _message_tags() -> bytes:
    """The first byte of every tag of a message field in an OTLP trace request, minimal or padded (0x80 set)."""
    tags: set[int] = set()
    todo, seen = [ExportTraceServiceRequest.DESCRIPTOR], set()
    while todo:
        descriptor = todo.pop()
        if descriptor.full_name in seen:
            continue
        seen.add(descriptor.full_name)
        for field in descriptor.fields:
            if field.message_type is not None:
                if field.number > 15:  # a two-byte tag: its first byte would not identify it
                    raise AssertionError(f"{descriptor.full_name}.{field.name} has a two-byte tag")
                tag = field.number << 3 | 2
                tags.update((tag, tag | 0x80))
                todo.append(field.message_type)
    return bytes(sorted(tags))


_MESSAGE_TAGS = _message_tags()


def decode_charge(body: bytes | bytearray, as_json: bool) -> int:
    """An upper bound of the memory decoding ``body`` takes, cheap to compute (C-speed counts, no parsing).

    Decoding costs per node, not per byte: 2 bytes of protobuf (an empty
    sub-message) or 3 of JSON (``{},``) become a whole object. Every protobuf
    sub-message starts with one of :data:`_MESSAGE_TAGS`, and every JSON node
    with ``{``, ``[`` or follows a ``,``; counting those bytes over-counts (ids
    and text hold them too), never under-counts.
    """
    if as_json:
        nodes = body.count(b"{") + body.count(b"[") + body.count(b",")
        return max(JSON_EXPANSION * len(body), 2 * len(body) + JSON_NODE_BYTES * nodes)
    messages = len(body) - len(body.translate(None, _MESSAGE_TAGS))
    spans = body.count(b"\x12") + body.count(b"\x92")  # ScopeSpans.spans is field 2: every Span starts so
    charge = PROTOBUF_MESSAGE_BYTES * messages + PROTOBUF_SPAN_BYTES * spans
    return max(PROTOBUF_EXPANSION * len(body), charge)


def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


_TRIM = _malloc_trim()


def release_free_memory() -> None:
    """Give memory freed by a large request back to the OS (glibc keeps it per thread arena otherwise).

    Without this, every thread that once decoded a large request keeps that
    much RSS, and the memory bound would grow with the number of threads.
    """
    if _TRIM is not None:
        _TRIM(0)


class Reservation:
    """In-flight bytes held by one request; grows as the request is read and decoded."""

    def __init__(self, grow: Callable[[Reservation, int], None]) -> None:
        """An empty reservation whose growth ``grow`` charges to a budget (raising :class:`Overloaded` when full)."""
        self._grow = grow
        self.held = 0

    def grow(self, nbytes: int) -> None:
        """Reserve ``nbytes`` more, or raise :class:`Overloaded` (counted as shed)."""
        self._grow(self, nbytes)


class Intake(Protocol):
    """What the OTLP services need of the receiver (:class:`~.server.Receiver` is one)."""

    config: ServerConfig
    metrics: Metrics
    wal: WriteAheadLog

    @property
    def draining(self) -> bool:
        """Whether the receiver is shutting down (new requests get 503 / ``UNAVAILABLE``)."""

    def admit(self, nbytes: int = 0) -> AbstractContextManager[Reservation]:
        """Open a reservation of ``nbytes`` in-flight bytes or raise :class:`Overloaded`."""

    def accept(self, request: ExportTraceServiceRequest) -> tuple[int, str]:
        """Make ``request``'s storable spans durable; returns (rejected spans, message)."""

    def accept_logs(self, request: ExportLogsServiceRequest) -> tuple[int, str]:
        """Make ``request``'s storable log records durable; returns (rejected log records, message)."""

    def reject(self, spans: int = 0, *, too_large: bool = False) -> None:
        """Count a request refused as malformed (or, with ``too_large``, over a size limit)."""

    def metrics_text(self) -> str:
        """Prometheus text exposition of the counters and gauges."""

    def metrics_line(self) -> str:
        """One human-readable line of the main figures."""
