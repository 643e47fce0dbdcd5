"""Write-ahead for records that must be durable before a call returns (a gate's intent and commit records).

:func:`otel_replay.configure` gives its pipeline a :class:`SpanLog`: the
receiver's write-ahead log (:class:`otel_replay.storage.wal.WriteAheadLog`, one
format and one recovery code: each record is an OTLP
``ExportTraceServiceRequest``) in a directory of this process's own,
``<dataset>/_wal/capture-<pid>-<random>/`` (for an ``s3://`` dataset a local
directory, see :func:`log_root`). A span handed to :meth:`SpanLog.append` is
fsynced before the call returns; concurrent appends share one fsync (group
commit). Such a span never goes through the ``BatchSpanProcessor``
(:class:`WriteAheadProcessor` keeps it from it), so it is stored once.

A thread of the log's own seals the active segment once it is
``seal_seconds`` old (or sooner, once the records held for it as spans
reach :data:`SEAL_HELD`) and converts sealed segments to Parquet with the
receiver's converter (:class:`otel_replay.storage.convert.ChunkWriter`; the
one-span records regrouped first by :func:`otel_replay.storage.regroup.regrouped`,
so a run of them converts as one batch; while this process still holds a
segment's records as spans, from the spans instead, see
:mod:`otel_replay.capture.kept_spans`), under names derived from the segment (``wal-capture-...-<segment>-NNNNN``),
then deletes them: converting a segment again, after a crash, rewrites the
same files. :meth:`SpanLog.close` (at ``Telemetry.shutdown()``, else at
interpreter exit) converts the rest. A process that died leaves its directory
behind; :func:`recover` (run by the next :func:`otel_replay.configure`,
:func:`otel_replay.open`, ``otel-replay compact`` or ``serve`` on the dataset)
converts the directories no live process holds, salvaging a damaged segment
record by record, and removes them.

Without a gate nothing is appended here: spans take the ``BatchSpanProcessor``
path as before and nothing waits on the disk.
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import shutil
import struct
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import SpanKind

from otel_replay import semconv as sc
from otel_replay._wire import SMALL_VARINTS as _SMALL
from otel_replay._wire import varint as _varint
from otel_replay._wire import varint_of as _varint_of
from otel_replay.capture.direct_spans import RecordSpan
from otel_replay.capture.kept_spans import KEPT_BYTES, KeptSpans
from otel_replay.capture.log_recovery import CAPTURE_PREFIX, convert_log_segment, log_root, recover, segment_prefix
from otel_replay.errors import OtelReplayError

__all__ = [
    "CAPTURE_PREFIX",
    "HOLD_LIMIT",
    "SpanLog",
    "WriteAheadProcessor",
    "convert_log_segment",
    "log_root",
    "recover",
]

_log = logging.getLogger(__name__)

_SEQ = sc.RECORD_SEQ  # a span with a chain position is a sealed record

SEAL_SECONDS = 5.0
"""How old the active segment gets before it is sealed and converted: one Parquet file per date per interval."""

SEAL_HELD = KEPT_BYTES // 4
"""Bytes of records held as spans (:mod:`otel_replay.capture.kept_spans`) past which the active segment is sealed
before it is ``seal_seconds`` old.

A segment converts from its held spans only when every one of its records is
held, and at most :data:`~otel_replay.capture.kept_spans.KEPT_BYTES` are: at
~2,000 gated commits a second (two records of ~2.1 KiB each) a segment of
five seconds holds 42 MB, so past the bound every segment was decoded from its
bytes again. Sealed at a quarter of the bound, the records appended while the
log's thread gets to it (it may be converting the segment before, sharing the
GIL with the agents) fit in the rest: at half, under load, some did not.
"""


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


def _record_span_bytes(span: RecordSpan) -> bytes:
    """The OTLP ``Span`` message of a :class:`RecordSpan`: what :func:`_span_bytes` writes, less what is known.

    Its kind is internal and its status unset; it has no events and no
    links and drops nothing, so those fields are written as constants or
    not at all; its attribute texts that repeat are kept (:data:`_REPEATED`).
    """
    ctx = span.context
    parent = span.parent
    start, end = span.start_time, span.end_time
    name = span.name
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


class _RequestEncoder:
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
        scoped = scope_part + b"".join(_field(b"\x12", _span_bytes(s)) for s in spans) + scope_url
        group = resource_part + _field(b"\x12", scoped) + resource_url
        return _field(b"\x0a", group)


_logs: weakref.WeakSet[SpanLog] = weakref.WeakSet()
_processors: weakref.WeakSet[WriteAheadProcessor] = weakref.WeakSet()


def _fresh_logs_in_child() -> None:
    """After ``fork()``, in the child: every log starts a directory of its own on its next append.

    The parent's log (its file, its lock, its converter) stays the
    parent's: the child never appends to it, seals it or converts it; nor
    does it write the record spans the parent held for its next write-ahead.
    """
    for log in list(_logs):
        log._forked()
    for processor in list(_processors):
        processor._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_logs_in_child)


@atexit.register
def _close_at_exit() -> None:
    """At interpreter exit, convert what every open log holds (a process that never called ``shutdown()``)."""
    for log in list(_logs):
        try:
            log.close()
        except Exception as exc:  # noqa: BLE001 - kept on disk: the next configure() converts it
            _log.error("otel-replay: closing the capture write-ahead log %s at exit failed: %s", log.directory, exc)


class SpanLog:
    """The write-ahead log of spans of this process for one dataset; see the module docstring.

    Nothing is created until the first :meth:`append`: a pipeline without a
    gate never touches the disk here.
    """

    def __init__(self, dataset: str, *, seal_seconds: float = SEAL_SECONDS) -> None:
        """A log for ``dataset`` in a directory of this process's own under :func:`log_root` (made on first use)."""
        self.dataset = dataset
        self.seal_seconds = seal_seconds
        self.directory = log_root(dataset) / f"{CAPTURE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        self._wal: Any = None
        self._encode: Any = None
        self._open_lock = threading.Lock()
        self._lock = threading.Lock()  # one conversion at a time
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by an append past SEAL_HELD: the log's thread seals and converts now
        self._closed = False
        self._thread: threading.Thread | None = None
        self._kept = KeptSpans()
        self.on_tick: Callable[[], object] | None = None
        """Called on the log's thread at each of its turns (the pipeline releases held record spans grown old)."""
        self.appended = 0
        self.converted_rows = 0
        self.convert_errors = 0
        _logs.add(self)

    def _forked(self) -> None:
        self._wal = None  # the parent's: left open, never closed here (closing would seal the parent's segment)
        self._thread = None
        self._open_lock = threading.Lock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._kept = KeptSpans()  # the parent's records are the parent's to convert
        self.directory = self.directory.with_name(f"{CAPTURE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")

    def _opened(self) -> Any:
        wal = self._wal
        if wal is not None:
            return wal
        with self._open_lock:
            if self._wal is None:
                # start-up cost: the log loads when a gate first writes ahead; an agent without a gate never pays for it
                from otel_replay.storage.wal import WriteAheadLog

                if self._closed:
                    raise OtelReplayError(f"the write-ahead log {self.directory} is closed")
                self._encode = _RequestEncoder().encode
                self._wal = WriteAheadLog(self.directory)
                self._thread = threading.Thread(target=self._loop, name="otel-replay-capture-wal", daemon=True)
                self._thread.start()
            return self._wal

    def append(self, spans: Sequence[ReadableSpan]) -> None:
        """Append ``spans`` as one record; returns once it is fsynced (raises when it could not be)."""
        wal = self._opened()
        payload = self._encode(spans)
        held = self._kept
        kept = held.keep(payload, spans)
        try:
            wal.append(payload)
        except BaseException:
            if kept:
                held.drop((payload,))  # never written: no segment holds it
            raise
        self.appended += len(spans)
        if kept and held.held_bytes >= SEAL_HELD and not self._wake.is_set():
            self._wake.set()

    def convert(self, *, seal: bool = False) -> int:
        """Seal the active segment (``seal``: now; else once ``seal_seconds`` old), convert the sealed ones; rows."""
        with self._lock:
            if self._closed or self._wal is None:
                return 0
            self._wal.rotate(min_age_seconds=0.0 if seal else self.seal_seconds)
            return self._convert_sealed()

    def _convert_sealed(self) -> int:
        """Convert every sealed segment, oldest first, releasing each once written (caller holds ``_lock``).

        A segment whose every record this process still holds as spans is
        converted from them (:meth:`~otel_replay.capture.kept_spans.KeptSpans.convert`); any other from its bytes.
        """
        rows = 0
        for segment in self._wal.sealed():
            prefix = segment_prefix(self.directory, segment.segment_id)
            written = self._kept.convert(segment.path, self.dataset, prefix)
            rows += convert_log_segment(segment.path, self.dataset, prefix) if written is None else written
            self._wal.release(segment)
        self.converted_rows += rows
        return rows

    def _seal_early(self) -> bool:
        """Whether to seal the active segment before its age: its held records are past :data:`SEAL_HELD`.

        Not while a sealed segment waits (its conversion failed and is
        retried): its held records count too, and sealing each time would
        only cut the active segment into more, smaller files.
        """
        wal = self._wal
        return self._kept.held_bytes >= SEAL_HELD and wal is not None and not wal.sealed()

    def _loop(self) -> None:
        interval = max(0.05, min(self.seal_seconds / 4, 1.0))
        wake, stop = self._wake, self._stop
        while True:
            wake.wait(interval)
            if stop.is_set():
                return
            wake.clear()
            tick = self.on_tick
            if tick is not None:
                try:
                    tick()
                except Exception as exc:  # noqa: BLE001 - held spans stay held: released at the next turn or flush
                    _log.error("otel-replay: releasing held record spans failed: %s", exc)
            try:
                self.convert(seal=self._seal_early())
            except Exception as exc:  # noqa: BLE001 - the log still holds everything: retried next time
                self.convert_errors += 1
                _log.error("otel-replay: converting the capture write-ahead log %s failed: %s", self.directory, exc)

    def close(self) -> None:
        """Stop the converter, seal the log (appends fail from here) and convert all of it; remove the directory.

        A conversion that fails leaves the directory (its segments) for the
        next :func:`otel_replay.configure` on this dataset to convert.
        """
        with self._open_lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._lock:
            wal = self._wal
            if wal is None:
                return
            wal.close(unlock=False)  # still ours: no recover() takes the directory while it is converted
            try:
                self._convert_sealed()
            except Exception as exc:  # noqa: BLE001 - kept on disk: recover() converts it later
                self.convert_errors += 1
                _log.error(
                    "otel-replay: converting the capture write-ahead log %s at shutdown failed: %s; the next "
                    "configure() on this dataset converts it",
                    self.directory,
                    exc,
                )
            else:
                shutil.rmtree(self.directory, ignore_errors=True)
            finally:
                wal.unlock()


HOLD_LIMIT = 1024
"""Record spans a :class:`WriteAheadProcessor` holds for the next write-ahead; past it they go to the batch queue.

Released at once, they fit the SDK's own queue size (2,048) when a user sets ``OTEL_BSP_MAX_QUEUE_SIZE`` to it.
"""


class WriteAheadProcessor(SpanProcessor):
    """The span processor in front of the ``BatchSpanProcessor``: spans claimed for the log never reach it.

    :meth:`claim` a span (by span id) before it ends; its ended form is then
    kept here for :meth:`take` instead of being queued for the exporter.

    Once the process writes ahead (:meth:`hold_records`, at its first gate
    record), the sealed records that end here (decisions, audit entries,
    outcomes: spans with a chain position) are held for the next write-ahead
    instead, which puts them in the log with its own record (:meth:`take_held`):
    a durable gate record is then never preceded in its chain by a record a
    crash could still take, such as the decision a commit made after its
    ``audit()`` block acts on. Held spans go to ``inner`` after all when they
    are :data:`HOLD_LIMIT` or older than the log's file age
    (:meth:`release_held`, from the log's thread), and at ``force_flush`` and
    ``shutdown``; :meth:`take_held` then says so, and the next write-ahead
    flushes ``inner`` first. Every other span goes to ``inner`` as before.
    """

    def __init__(self, inner: SpanProcessor) -> None:
        """Wrap ``inner`` (the pipeline's ``BatchSpanProcessor``)."""
        self.inner = inner
        self._claimed: dict[int, ReadableSpan | None] = {}
        self._holding = False
        self._held: list[ReadableSpan] = []
        self._held_at = 0.0
        self._released = True  # records went to ``inner`` since the last take: all of them, before holding starts
        self._hold_lock = threading.Lock()
        _processors.add(self)

    def _forked(self) -> None:
        """In a forked child: the held records are the parent's to write; the child's first write-ahead flushes."""
        self._hold_lock = threading.Lock()
        self._held = []
        self._released = True

    def claim(self, span_id: int) -> None:
        """Keep the span ``span_id`` from ``inner`` when it ends."""
        self._claimed[span_id] = None

    def take(self, span_id: int) -> ReadableSpan | None:
        """The claimed span's ended form (``None`` if it did not end), no longer claimed."""
        return self._claimed.pop(span_id, None)

    def hold_records(self) -> None:
        """From now on, hold the record spans that end here for the next write-ahead (see the class docstring)."""
        self._holding = True

    def take_held(self) -> tuple[list[ReadableSpan], bool]:
        """The record spans held since the last take, and whether any went to ``inner`` meanwhile instead."""
        with self._hold_lock:
            held, self._held = self._held, []
            released, self._released = self._released, False
        return held, released

    def give_back(self, spans: Sequence[ReadableSpan]) -> None:
        """Hand ``spans`` to ``inner`` after a write-ahead failed with them: the next write-ahead flushes first."""
        with self._hold_lock:
            self._released = True
        for span in spans:
            self.inner.on_end(span)

    def release_held(self, older_than: float | None = None) -> int:
        """Hand the held record spans to ``inner`` (only when the oldest is ``older_than`` seconds); how many."""
        with self._hold_lock:
            held = self._held
            if not held or (older_than is not None and time.monotonic() - self._held_at < older_than):
                return 0
            self._held = []
            self._released = True
        for span in held:
            self.inner.on_end(span)
        return len(held)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Forwarded to ``inner``."""
        self.inner.on_start(span, parent_context=parent_context)

    def _on_ending(self, span: Span) -> None:
        self.inner._on_ending(span)

    def on_end(self, span: ReadableSpan) -> None:
        """A claimed span is kept for :meth:`take`, a record span held once holding; any other goes to ``inner``."""
        claimed = self._claimed
        if claimed:
            ctx = span.context
            if ctx is not None and ctx.span_id in claimed:
                claimed[ctx.span_id] = span
                return
        if self._holding:
            attributes = span.attributes
            if attributes is not None and _SEQ in attributes:
                with self._hold_lock:
                    held = self._held
                    if not held:
                        self._held_at = time.monotonic()
                    held.append(span)
                    full = len(held) >= HOLD_LIMIT
                if full:
                    self.release_held()
                return
        self.inner.on_end(span)

    def shutdown(self) -> None:
        """The held record spans to ``inner``, then forwarded."""
        self.release_held()
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """The held record spans to ``inner``, then forwarded."""
        self.release_held()
        return self.inner.force_flush(timeout_millis)
