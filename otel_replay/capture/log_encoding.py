"""The write-ahead log's record encoding: spans as one OTLP ``ExportTraceServiceRequest``'s wire bytes.

:class:`RequestEncoder` writes the bytes the SDK's protobuf encoder would
(``encode_spans(spans).SerializeToString()``), directly, a fraction of the
CPU; what it cannot write the same way it leaves to the SDK's encoder.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from otel_replay import semconv as sc
from otel_replay._wire import SMALL_VARINTS as _SMALL
from otel_replay._wire import varint as _varint
from otel_replay._wire import varint_of as _varint_of
from otel_replay.capture.direct_spans import RecordSpan

__all__ = ["RequestEncoder"]

# --- the log's record encoding --------------------------------------------------------------------------
# A record is an OTLP ExportTraceServiceRequest. The SDK's encoder builds one protobuf object per attribute
# (0.2 ms for a gate record, on the committing thread); this writes the same message's wire bytes directly,
# with the resource and scope encoded once per (resource, scope). Anything it does not know how to write the
# same way (an int past 64 bits, a lone surrogate, a value of another type) goes to the SDK's encoder, which
# then decides (tests/gate/test_gate_write_ahead.py compares both on hostile spans). A gate record's span, a
# RecordSpan of known shape, is written with the fields that shape fixes as constants
# (tests/capture/test_direct_spans.py compares those bytes with the SDK encoder's too).

_pack_double = struct.Struct("<d").pack
_pack_fixed64 = struct.Struct("<Q").pack
_pack_fixed32 = struct.Struct("<I").pack
_INT64 = (-(1 << 63), (1 << 63) - 1)
_HAS_IS_REMOTE = 0x100  # SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE = 0x200  # SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK


class _Unencodable(Exception):
    """A span this encoder leaves to the SDK's."""


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: ``tag`` (its key byte(s)), the length, ``payload``."""
    return tag + _varint(len(payload)) + payload


def _any_value(value: Any) -> bytes:
    """An ``AnyValue``'s bytes (its oneof is written even when it holds a default, as protobuf does)."""
    cls = value.__class__
    if cls is str:
        return _field(b"\x0a", value.encode())  # a lone surrogate raises: left to the SDK
    if cls is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if cls is int:
        if not _INT64[0] <= value <= _INT64[1]:
            raise _Unencodable("int past 64 bits")
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if cls is float:
        return b"\x21" + _pack_double(value)
    if value is None:
        return b""
    if cls is bytes:
        return _field(b"\x3a", value)
    if cls is tuple or cls is list:
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any_value(item)) for item in value))
    raise _Unencodable(f"attribute value of type {cls.__name__}")


def _key_field(key: str) -> bytes:
    """Field 1 of a ``KeyValue``: the key (none for an empty key, as protobuf writes a default)."""
    if key.__class__ is not str:
        raise _Unencodable("attribute key that is not a str")
    return _field(b"\x0a", key.encode()) if key else b""


_REPEATED = frozenset(
    (
        sc.KIND,
        sc.RECORD_SOURCE,
        sc.RECORD_CHAIN_ID,
        sc.RECORD_KEY_ID,
        sc.AGENT_ID,
        sc.GATE_STAGE,
        sc.GATE_FIX,
        sc.GATE_EXECUTED,
        sc.GATE_DETAIL,
    )
)
"""Keys of a record whose text repeats from record to record (a kind, a stage, the chain and key ids)."""
_REPEAT_VALUE = 256  # a value longer than this is encoded each time, never kept
_REPEATS_KEPT = 1024  # (key, value) fields kept at most: later ones are encoded each time
_repeats: dict[tuple[str, str], bytes] = {}  # (key, text) -> its whole KeyValue field under tag 0x4a (a span's)

_PREFIX_KEYS = 512  # keys kept per tag with their text prefixes (later keys: computed each time)
_PREFIX_SIZES = 512  # text lengths kept per key
_KeyInfo = tuple[bytes, dict[int, bytes], bool]
_KEY_INFOS: dict[bytes, dict[str, _KeyInfo]] = {b"\x4a": {}, b"\x1a": {}, b"\x22": {}}
"""Per tag, per key: its key field, a text ``KeyValue`` field's bytes before the text by the text's length in
bytes, and whether its short texts are kept whole (:data:`_REPEATED`, only under a span's tag 0x4a)."""


def _key_info(tag: bytes, key: str) -> _KeyInfo:
    """``key``'s entry of :data:`_KEY_INFOS` under ``tag``, made (and kept, within :data:`_PREFIX_KEYS`) now."""
    infos = _KEY_INFOS[tag]
    info: _KeyInfo = (_key_field(key), {}, tag == b"\x4a" and key in _REPEATED)
    if len(infos) < _PREFIX_KEYS:
        infos[key] = info
    return info


def _key_values(tag: bytes, attributes: Any, repeats: dict[tuple[str, str], bytes] | None = None) -> bytes:
    """Repeated ``KeyValue`` fields under ``tag`` for ``attributes`` (in their order).

    The pieces of every field go into one list joined once (a record's
    content is a few long JSON texts: each is copied once, not once per
    enclosing length prefix). A key costs one lookup (:data:`_KEY_INFOS`):
    its field and its text prefixes by length. ``repeats``: the fields of
    short texts under the :data:`_REPEATED` keys, kept there and reused
    (only for ``tag`` 0x4a).
    """
    if not attributes:
        return b""
    parts: list[bytes] = []
    extend = parts.extend
    small = _SMALL
    infos = _KEY_INFOS[tag]
    for key, value in attributes.items():
        info = infos.get(key) if key.__class__ is str else None
        if info is None:
            info = _key_info(tag, key)  # a key that is not a str raises: left to the SDK
        if value.__class__ is str:  # most of a record: its content is JSON text
            if info[2] and repeats is not None and len(value) <= _REPEAT_VALUE:
                field = repeats.get((key, value))
                if field is None:
                    field = _text_field(tag, info[0], value)
                    if len(repeats) < _REPEATS_KEPT:
                        repeats[(key, value)] = field
                parts.append(field)
                continue
            raw = value.encode()  # a lone surrogate raises: left to the SDK
            prefix = info[1].get(len(raw))
            if prefix is None:
                prefix = _text_prefix(tag, info[0], len(raw), info[1])
            extend((prefix, raw))
        else:
            head = info[0]
            any_value = _any_value(value)
            size = len(any_value)
            any_size = small[size] if size < 4096 else _varint_of(size)
            size += len(head) + 1 + len(any_size)
            extend((tag, small[size] if size < 4096 else _varint_of(size), head, b"\x12", any_size, any_value))
    return b"".join(parts)


def _text_prefix(tag: bytes, head: bytes, size: int, kept: dict[int, bytes] | None) -> bytes:
    """The bytes of a ``KeyValue`` field under ``tag`` (key field ``head``) before a text of ``size`` bytes.

    Kept in ``kept`` (bounded) when given: a record's texts are of a few
    lengths (ids, hashes), so most fields cost a lookup, not three varints.
    """
    raw_size = _varint(size)
    any_size = _varint(1 + len(raw_size) + size)  # the AnyValue: its string field
    total = len(head) + 1 + len(any_size) + 1 + len(raw_size) + size  # the KeyValue: key, then the AnyValue field
    prefix = tag + _varint(total) + head + b"\x12" + any_size + b"\x0a" + raw_size
    if kept is not None and len(kept) < _PREFIX_SIZES:
        kept[size] = prefix
    return prefix


def _text_field(tag: bytes, head: bytes, value: str) -> bytes:
    """One ``KeyValue`` field under ``tag`` whose key field is ``head`` and whose value is the text ``value``."""
    raw = value.encode()  # a lone surrogate raises: left to the SDK
    return _text_prefix(tag, head, len(raw), None) + raw


def _attributes_of(span: ReadableSpan) -> Any:
    """``span``'s attributes to read: the SDK's own dict when the span keeps one, else ``span.attributes``.

    ``span.attributes`` is a read-only view of the SDK's ``BoundedAttributes``,
    which reads each attribute through two Python calls; an ended span's
    dict behind it holds the same items in the same order. A span built
    without the SDK's (:mod:`otel_replay.capture.direct_spans`) holds a plain dict.
    """
    held = getattr(span, "_attributes", None)
    if held.__class__ is dict:
        return held
    inner = getattr(held, "_dict", None)
    return inner if inner.__class__ is dict else span.attributes


def _flags(context: Any) -> bytes:
    return _pack_fixed32(_HAS_IS_REMOTE | (_IS_REMOTE if context is not None and context.is_remote else 0))


def _trace_state(state: Any) -> bytes:
    if state is None or not len(state):  # most spans: no trace state (len: not the join of no items)
        return b""
    text = ",".join(f"{key}={value}" for key, value in state.items())
    return _field(b"\x1a", text.encode()) if text else b""


def _count(tag: bytes, count: int) -> bytes:
    return tag + _varint(count) if count else b""


_SPAN_KIND = {kind: kind.value + 1 for kind in SpanKind}  # OTLP numbers kinds from 1 (0 is "unspecified")


def _span_bytes(span: ReadableSpan) -> bytes:
    """The OTLP ``Span`` message of ``span``."""
    ctx = span.get_span_context()
    if ctx is None:
        raise _Unencodable("span without a context")
    parent = span.parent
    out = [
        b"\x0a\x10" + ctx.trace_id.to_bytes(16, "big"),
        b"\x12\x08" + ctx.span_id.to_bytes(8, "big"),
        _trace_state(ctx.trace_state),
        b"\x22\x08" + parent.span_id.to_bytes(8, "big") if parent else b"",
        _field(b"\x2a", span.name.encode()) if span.name else b"",
        _count(b"\x30", _SPAN_KIND[span.kind]),
        b"\x39" + _pack_fixed64(span.start_time) if span.start_time else b"",
        b"\x41" + _pack_fixed64(span.end_time) if span.end_time else b"",
        _key_values(b"\x4a", _attributes_of(span)),
        _count(b"\x50", span.dropped_attributes),
    ]
    for event in span.events:
        out.append(
            _field(
                b"\x5a",
                (b"\x09" + _pack_fixed64(event.timestamp) if event.timestamp else b"")
                + (_field(b"\x12", event.name.encode()) if event.name else b"")
                + _key_values(b"\x1a", event.attributes)
                + _count(b"\x20", event.dropped_attributes),
            )
        )
    out.append(_count(b"\x60", span.dropped_events))
    for link in span.links:
        out.append(
            _field(
                b"\x6a",
                b"\x0a\x10"
                + link.context.trace_id.to_bytes(16, "big")
                + b"\x12\x08"
                + link.context.span_id.to_bytes(8, "big")
                + _key_values(b"\x22", link.attributes)
                + _count(b"\x28", link.dropped_attributes)
                + b"\x35"
                + _flags(link.context),
            )
        )
    out.append(_count(b"\x70", span.dropped_links))
    status = span.status
    if status is not None:
        message = status.description
        out.append(
            _field(
                b"\x7a",
                (_field(b"\x12", message.encode()) if message else b"") + _count(b"\x18", status.status_code.value),
            )
        )
    out.append(b"\x85\x01" + _flags(parent))
    return b"".join(out)


_KIND_INTERNAL = b"\x30" + _varint(_SPAN_KIND[SpanKind.INTERNAL])
_STATUS_UNSET = _field(b"\x7a", b"")  # a status field with no message and code 0 (unset), as the SDK writes it


def _record_span_bytes(span: ReadableSpan) -> bytes:
    """The OTLP ``Span`` message of a :class:`RecordSpan`: what :func:`_span_bytes` writes, less what is known.

    Its kind is internal and its status unset; it has no events and no
    links and drops nothing, so those fields are written as constants or
    not at all; its attribute texts that repeat are kept (:data:`_REPEATED`).
    """
    return _internal_span_bytes(span.context, span.parent, span.name, span.start_time, span.end_time, span)


def _internal_span_bytes(ctx: Any, parent: Any, name: str, start: Any, end: Any, span: ReadableSpan) -> bytes:
    """The OTLP ``Span`` message of an internal span, status unset, with no events or links, dropping nothing."""
    return b"".join(
        (
            b"\x0a\x10",
            ctx.trace_id.to_bytes(16, "big"),
            b"\x12\x08",
            ctx.span_id.to_bytes(8, "big"),
            _trace_state(ctx.trace_state),
            b"\x22\x08" + parent.span_id.to_bytes(8, "big") if parent else b"",
            _field(b"\x2a", name.encode()) if name else b"",
            _KIND_INTERNAL,
            b"\x39" + _pack_fixed64(start) if start else b"",
            b"\x41" + _pack_fixed64(end) if end else b"",
            _key_values(b"\x4a", _attributes_of(span), _repeats),
            _STATUS_UNSET,
            b"\x85\x01",
            _flags(parent),
        )
    )


_INTERNAL = SpanKind.INTERNAL
_UNSET = StatusCode.UNSET


def _ended_span_bytes(span: ReadableSpan) -> bytes:
    """The OTLP ``Span`` message of any ended span; by its known shape where it has one.

    A :class:`RecordSpan` (a gate record), or a ``ReadableSpan`` as the SDK
    ends it (a decision or audit entry held for a write-ahead) whose fields
    say it is internal, status unset, without events or links and dropping
    nothing, is written by :func:`_internal_span_bytes`; any other by
    :func:`_span_bytes`. The bytes are the same either way.
    """
    cls = span.__class__
    if cls is RecordSpan:
        return _record_span_bytes(span)
    if cls is ReadableSpan:
        # The SDK's own fields, read once (its properties copy the events and links into new tuples).
        ctx, events, links, status = span._context, span._events, span._links, span._status
        if (
            ctx is not None
            and span._kind is _INTERNAL
            and not events
            and not links
            and status.status_code is _UNSET
            and not status.description
            and not getattr(events, "dropped", 0)
            and not getattr(links, "dropped", 0)
            and not getattr(span._attributes, "dropped", 0)
        ):
            return _internal_span_bytes(ctx, span._parent, span._name, span._start_time, span._end_time, span)
    return _span_bytes(span)


class RequestEncoder:
    """Encodes spans as one ``ExportTraceServiceRequest``'s bytes; the resource and scope parts once each."""

    def __init__(self) -> None:
        self._frames: dict[tuple[int, int], tuple[Any, Any, tuple[bytes, bytes, bytes, bytes]]] = {}

    def _frame(self, span: ReadableSpan) -> tuple[bytes, bytes, bytes, bytes]:
        """``span``'s resource and scope fields, and the schema URL fields of ``ResourceSpans`` and ``ScopeSpans``."""
        resource, scope = span.resource, span.instrumentation_scope
        kept = self._frames.get((id(resource), id(scope)))
        if kept is not None and kept[0] is resource and kept[1] is scope:
            return kept[2]
        # start-up cost: the SDK's OTLP encoder (protobuf) loads with the first sealed record
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        # The SDK's encoding of this span's resource and scope, kept (with the objects, so an id is not reused).
        group = encode_spans([span]).resource_spans[0]
        scoped = group.scope_spans[0]
        resource_part = _field(b"\x0a", group.resource.SerializeToString())
        scope_part = _field(b"\x0a", scoped.scope.SerializeToString())
        resource_url = _field(b"\x1a", group.schema_url.encode()) if group.schema_url else b""
        scope_url = _field(b"\x1a", scoped.schema_url.encode()) if scoped.schema_url else b""
        frame = (resource_part, scope_part, resource_url, scope_url)
        if len(self._frames) >= 64:  # a process has a provider or two: a runaway number is not all kept
            self._frames.clear()
        self._frames[(id(resource), id(scope))] = (resource, scope, frame)
        return frame

    def encode(self, spans: Sequence[ReadableSpan]) -> bytes:
        """The serialized request holding ``spans``."""
        try:
            return self._encode(spans)
        except Exception:  # noqa: BLE001 - what this does not write as the SDK does, the SDK writes
            # start-up cost: the SDK's OTLP encoder (protobuf) loads with the first sealed record
            from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

            return encode_spans(spans).SerializeToString()

    def _encode(self, spans: Sequence[ReadableSpan]) -> bytes:
        if not spans:
            raise _Unencodable("no spans")
        first = spans[0]
        if len(spans) == 1 and first.__class__ is RecordSpan:  # a record written ahead: one span of a known shape
            if first.instrumentation_scope is None:
                raise _Unencodable("a span without a scope")
            resource_part, scope_part, resource_url, scope_url = self._frame(first)
            scoped = scope_part + _field(b"\x12", _record_span_bytes(first)) + scope_url
            return _field(b"\x0a", resource_part + _field(b"\x12", scoped) + resource_url)
        resource, scope = first.resource, first.instrumentation_scope
        if scope is None or any(s.resource is not resource or s.instrumentation_scope is not scope for s in spans):
            raise _Unencodable("spans of several resources or scopes")
        resource_part, scope_part, resource_url, scope_url = self._frame(first)
        scoped = scope_part + b"".join(_field(b"\x12", _ended_span_bytes(s)) for s in spans) + scope_url
        group = resource_part + _field(b"\x12", scoped) + resource_url
        return _field(b"\x0a", group)
