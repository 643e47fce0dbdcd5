"""A lean protobuf view of OTLP trace requests, for reading many spans quickly from Python.

The generated OTLP classes make every ``KeyValue`` and ``AnyValue`` of every
span a Python message object when it is read, and that, not decoding, is
what converting a request costs (about 15 such objects per span). The
messages here have the same field numbers and wire types as
``opentelemetry/proto/trace/v1/trace.proto`` but declare the attribute lists
as ``repeated bytes``: the parser (upb, in C) hands over each ``KeyValue``'s
encoded bytes, and :data:`KEY_VALUES` decodes each distinct encoding once,
with the real ``KeyValue`` class, and remembers the common scalar ones.
Events arrive as bytes too: an event is its time followed by a name and
attributes that usually repeat, so :func:`read_events` reads the time from
the first nine bytes and decodes the rest once per distinct encoding.

Only bytes that the real ``ExportTraceServiceRequest`` parser has accepted
are read this way (the callers decode with it first, or serialize a message
it produced), so every limit and refusal of that parser still applies.
Singular message fields that protobuf merges when they repeat on the wire
(``status``, ``resource``, ``scope``) stay messages here, so they merge alike.
"""

from __future__ import annotations

import base64
import struct
import sys
from collections.abc import Iterable
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from otel_replay._json import compact_json

__all__ = ["KEY_VALUES", "LiteRequest", "LiteResourceSpans", "any_value", "read_events"]

_F = descriptor_pb2.FieldDescriptorProto
_PACKAGE = "otel_replay.otlp_wire"
_BYTES, _STRING, _FIXED64, _UINT32, _INT32, _MESSAGE = (
    _F.TYPE_BYTES,
    _F.TYPE_STRING,
    _F.TYPE_FIXED64,
    _F.TYPE_UINT32,
    _F.TYPE_INT32,
    _F.TYPE_MESSAGE,
)
# (message, [(number, name, type, repeated, message type)]); numbers as in the OTLP protos.
# Enums are read as int32 (their wire form); attribute lists as the raw bytes of each KeyValue.
_MESSAGES: list[tuple[str, list[tuple[int, str, int, bool, str]]]] = [
    ("Resource", [(1, "attributes", _BYTES, True, "")]),
    ("Scope", [(1, "name", _STRING, False, ""), (2, "version", _STRING, False, "")]),
    ("Status", [(2, "message", _STRING, False, ""), (3, "code", _INT32, False, "")]),
    (
        "Event",
        [
            (1, "time_unix_nano", _FIXED64, False, ""),
            (2, "name", _STRING, False, ""),
            (3, "attributes", _BYTES, True, ""),
        ],
    ),
    (  # an Event after its leading time field: a repeated time here means the split does not hold
        "EventTail",
        [
            (1, "time_unix_nano", _FIXED64, True, ""),
            (2, "name", _STRING, False, ""),
            (3, "attributes", _BYTES, True, ""),
        ],
    ),
    (
        "Link",
        [
            (1, "trace_id", _BYTES, False, ""),
            (2, "span_id", _BYTES, False, ""),
            (3, "trace_state", _STRING, False, ""),
            (4, "attributes", _BYTES, True, ""),
        ],
    ),
    (
        "Span",
        [
            (1, "trace_id", _BYTES, False, ""),
            (2, "span_id", _BYTES, False, ""),
            (3, "trace_state", _STRING, False, ""),
            (4, "parent_span_id", _BYTES, False, ""),
            (5, "name", _STRING, False, ""),
            (6, "kind", _INT32, False, ""),
            (7, "start_time_unix_nano", _FIXED64, False, ""),
            (8, "end_time_unix_nano", _FIXED64, False, ""),
            (9, "attributes", _BYTES, True, ""),
            (10, "dropped_attributes_count", _UINT32, False, ""),
            (11, "events", _BYTES, True, ""),
            (12, "dropped_events_count", _UINT32, False, ""),
            (13, "links", _MESSAGE, True, "Link"),
            (14, "dropped_links_count", _UINT32, False, ""),
            (15, "status", _MESSAGE, False, "Status"),
        ],
    ),
    ("ScopeSpans", [(1, "scope", _MESSAGE, False, "Scope"), (2, "spans", _MESSAGE, True, "Span")]),
    ("ResourceSpans", [(1, "resource", _MESSAGE, False, "Resource"), (2, "scope_spans", _MESSAGE, True, "ScopeSpans")]),
    ("Request", [(1, "resource_spans", _MESSAGE, True, "ResourceSpans")]),
]


def _classes() -> dict[str, Any]:
    file = descriptor_pb2.FileDescriptorProto(name="otel_replay_otlp_wire.proto", package=_PACKAGE, syntax="proto3")
    for name, fields in _MESSAGES:
        message = file.message_type.add(name=name)
        for number, field_name, kind, repeated, type_name in fields:
            label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
            field = message.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                field.type_name = f".{_PACKAGE}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    find = pool.FindMessageTypeByName
    return {name: message_factory.GetMessageClass(find(f"{_PACKAGE}.{name}")) for name, _ in _MESSAGES}


_CLASSES = _classes()
LiteResourceSpans: Any = _CLASSES["ResourceSpans"]
"""``ResourceSpans`` with attribute lists as raw ``KeyValue`` bytes."""
_Event: Any = _CLASSES["Event"]
_EventTail: Any = _CLASSES["EventTail"]
LiteRequest: Any = _CLASSES["Request"]
"""``ExportTraceServiceRequest`` with attribute lists as raw ``KeyValue`` bytes."""


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


_SCALAR_KINDS = frozenset({"string_value", "bool_value", "int_value", "double_value"})
_CACHE_ENTRIES = 1 << 14
_CACHE_BYTES = 256  # longer encodings are decoded every time: the memory stays under ~10 MB per table


_DOUBLE = struct.Struct("<d")


def _short_scalar(raw: bytes) -> tuple[str, Any] | None:
    """Decode the common ``KeyValue`` shape directly, or ``None`` for the real class to decode.

    The shape: ``key`` (field 1) then ``value`` (field 2), each shorter than
    128 bytes, the value holding exactly one string, bool, int or double and
    nothing else follows. Everything else (other fields, other order, repeated
    fields, longer lengths, a bool that is not 0 or 1, an int past 64 bits)
    is left to ``KeyValue.FromString``. Only bytes the real parser accepted
    reach here, so its UTF-8 check has already passed (``tests/exporters/test_rows.py``
    compares the two on mutated encodings).
    """
    size = len(raw)
    if size < 6 or raw[0] != 0x0A or raw[1] > 0x7F:
        return None
    at = raw[1] + 2  # the value's tag
    if at + 3 > size or raw[at] != 0x12 or at + 2 + raw[at + 1] != size:
        return None
    key = raw[2:at].decode()
    tag, at = raw[at + 2], at + 3
    if tag == 0x0A:  # string_value
        if at < size and raw[at] <= 0x7F and at + 1 + raw[at] == size:
            return key, raw[at + 1 :].decode()
    elif tag == 0x18:  # int_value: a varint ending exactly at the end, at most 10 bytes
        if size - at > 10 or raw[-1] > 0x7F or any(b <= 0x7F for b in raw[at:-1]):
            return None
        value = 0
        for shift, byte in enumerate(raw[at:]):
            value |= (byte & 0x7F) << (7 * shift)
        if value >= 1 << 64:
            return None
        return key, value - (1 << 64) if value >= 1 << 63 else value
    elif tag == 0x10:  # bool_value
        if size == at + 1 and raw[at] <= 1:
            return key, raw[at] == 1
    elif tag == 0x21 and size == at + 8:  # double_value
        return key, _DOUBLE.unpack_from(raw, at)[0]
    return None


class _KeyValues(dict[bytes, tuple[str, Any]]):
    """Encoded ``KeyValue`` -> ``(key, JSON-ready value)``; decodes on a miss.

    Scalar values of short encodings (``_CACHE_BYTES``) are remembered
    (immutable, so rows may share them), up to ``_CACHE_ENTRIES`` encodings,
    after which the memory starts afresh: a stream of unique or long values
    costs one decode each, never unbounded memory.
    Arrays, kvlists and bytes are decoded every time (each row gets its own).
    """

    def __missing__(self, raw: bytes) -> tuple[str, Any]:
        try:
            pair = _short_scalar(raw)
        except UnicodeDecodeError:  # not UTF-8: the real class says how it refuses
            pair = None
        if pair is not None:
            self._keep(raw, pair)
            return pair
        kv = KeyValue.FromString(raw)
        value = kv.value
        kind = value.WhichOneof("value")
        if kind not in _SCALAR_KINDS:
            return kv.key, any_value(value)
        pair = (sys.intern(kv.key), getattr(value, kind))
        self._keep(raw, pair)
        return pair

    def _keep(self, raw: bytes, pair: tuple[str, Any]) -> None:
        if len(raw) <= _CACHE_BYTES:
            if len(self) >= _CACHE_ENTRIES:
                self.clear()
            self[raw] = pair


KEY_VALUES = _KeyValues()
"""The process's decoded ``KeyValue`` memory; ``KEY_VALUES[raw]`` decodes ``raw`` (the real class) if unseen."""
_kv = KEY_VALUES.__getitem__


def _attributes_json(raws: Any) -> str:
    return compact_json(dict(map(_kv, raws)))


class _EventTails(dict[bytes, tuple[str, str] | None]):
    """An event's bytes after its time field -> ``(name, attributes JSON)``, or ``None`` to decode the event whole.

    ``None`` when the rest holds a time too, or does not parse as the rest of
    an event (field 1 with another wire type, which the real parser keeps as
    an unknown field but the repeated ``time_unix_nano`` here would read as packed).

    Bounded like :data:`KEY_VALUES` (short encodings only, so a stack trace is not kept).
    """

    def __missing__(self, tail: bytes) -> tuple[str, str] | None:
        try:
            event = _EventTail.FromString(tail)
        except DecodeError:  # e.g. an unknown field 1 of another wire type: the whole event parses, the tail not
            value = None
        else:
            value = None if len(event.time_unix_nano) else (event.name, _attributes_json(event.attributes))
        if len(tail) <= _CACHE_BYTES:
            if len(self) >= _CACHE_ENTRIES:
                self.clear()
            self[tail] = value
        return value


_EVENT_TAILS = _EventTails()
_TIME_TAG = b"\x09"  # field 1 (time_unix_nano), wire type 1: eight little-endian bytes follow


def read_events(raws: Iterable[bytes]) -> tuple[list[int], list[str], list[str]]:
    """Times, names and attributes JSON (``compact_json``) of encoded ``Span.Event`` messages.

    An event that starts with its time field is split there: the time is read
    from the bytes, the rest looked up in a bounded memory (decoded once per
    distinct rest). Any other event, or one whose rest sets the time again
    (protobuf keeps the last), is decoded whole.
    """
    times: list[int] = []
    names: list[str] = []
    texts: list[str] = []
    tails = _EVENT_TAILS
    for raw in raws:
        found = tails[raw[9:]] if raw[:1] == _TIME_TAG and len(raw) >= 9 else None
        if found is not None:
            times.append(int.from_bytes(raw[1:9], "little"))
            names.append(found[0])
            texts.append(found[1])
        else:
            event = _Event.FromString(raw)
            times.append(event.time_unix_nano)
            names.append(event.name)
            texts.append(_attributes_json(event.attributes))
    return times, names, texts
