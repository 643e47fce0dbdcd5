"""One-span OTLP requests regrouped, as bytes, into one ``ResourceSpans`` per run of a resource and scope.

A gate's write-ahead log holds one ``ExportTraceServiceRequest`` per record,
each with its own ``ResourceSpans`` and ``ScopeSpans`` around a single span
(every record must be durable on its own). Joined as they are, a run of such
records converts one resource and one scope per span: the row conversion's
fixed cost per ``ScopeSpans`` then dominates (about 200 µs of CPU per row,
against some 35 µs per row for the exporter's batches). :func:`regrouped`
moves the spans of consecutive requests that share a resource and a scope
(the same bytes, schema URLs included) under one ``ResourceSpans`` and one
``ScopeSpans``, in their order. A row takes only the resource's attributes
and the scope's name and version from around its span, so the rows are the
ones the requests give converted one by one.

Nothing is decoded beyond the two wrapping levels: a request whose wrapping
holds anything else (another field, a field twice, a field that is not
length-delimited, a truncated length) is passed on whole, in its place, for
the converter to judge as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from otel_replay._wire import read_varint

__all__ = ["regrouped"]

_Key = tuple[bytes, bytes, bytes, bytes]  # resource, resource schema URL, scope, scope schema URL (field bytes)


class _Opaque(Exception):
    """A message this module does not regroup (passed on whole)."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """:func:`~otel_replay._wire.read_varint`, raising :class:`_Opaque` (the message is passed on whole)."""
    value, after = read_varint(data, at)
    if after < 0:
        raise _Opaque("bad varint")
    return value, after


def _fields(data: bytes) -> Iterator[tuple[int, bytes, bytes]]:
    """The fields of a message whose every field is length-delimited: (number, the whole field's bytes, payload)."""
    at, end = 0, len(data)
    while at < end:
        key, body = _varint(data, at)
        if key & 7 != 2 or key >> 3 == 0:
            raise _Opaque("a field that is not length-delimited")
        size, body = _varint(data, body)
        stop = body + size
        if stop > end:
            raise _Opaque("a field past the end of its message")
        yield key >> 3, data[at:stop], data[body:stop]
        at = stop


def _once(seen: dict[int, bytes], number: int, field: bytes) -> None:
    if number in seen:
        raise _Opaque(f"field {number} twice")  # protobuf merges repeated message fields: left to the parser
    seen[number] = field


def _spans_of(request: bytes) -> list[tuple[_Key, list[bytes]]]:
    """The spans of ``request`` (each a whole ``spans`` field) grouped by resource and scope, in order."""
    groups: list[tuple[_Key, list[bytes]]] = []
    for number, _, resource_spans in _fields(request):
        if number != 1:
            raise _Opaque(f"request field {number}")
        outer: dict[int, bytes] = {}
        scopes: list[bytes] = []
        for inner_number, field, payload in _fields(resource_spans):
            if inner_number == 2:
                scopes.append(payload)
            elif inner_number in (1, 3):
                _once(outer, inner_number, field)
            else:
                raise _Opaque(f"ResourceSpans field {inner_number}")
        for scope_spans in scopes:
            inner: dict[int, bytes] = {}
            spans: list[bytes] = []
            for scope_number, field, _ in _fields(scope_spans):
                if scope_number == 2:
                    spans.append(field)
                elif scope_number in (1, 3):
                    _once(inner, scope_number, field)
                else:
                    raise _Opaque(f"ScopeSpans field {scope_number}")
            if spans:
                key = (outer.get(1, b""), outer.get(3, b""), inner.get(1, b""), inner.get(3, b""))
                groups.append((key, spans))
    return groups


def _delimited(tag: int, payload: bytes) -> bytes:
    """Field ``tag`` (length-delimited) holding ``payload``."""
    size = len(payload)
    head = bytearray((tag << 3 | 2,))
    while size >= 0x80:
        head.append((size & 0x7F) | 0x80)
        size >>= 7
    head.append(size)
    return bytes(head) + payload


def _request(key: _Key, spans: list[bytes]) -> bytes:
    """One request: a ``ResourceSpans`` of ``key``'s resource holding one ``ScopeSpans`` with ``spans``."""
    resource, resource_url, scope, scope_url = key
    scoped = _delimited(2, scope + b"".join(spans) + scope_url)
    return _delimited(1, resource + scoped + resource_url)


def regrouped(requests: Iterable[bytes], limit: int) -> Iterator[bytes]:
    """Serialized requests holding the spans of ``requests`` in order, regrouped; each about ``limit`` bytes at most.

    Consecutive spans of one resource and scope share one ``ResourceSpans``;
    a request this does not regroup is yielded on its own, in its place
    (what was gathered before it is yielded first). A single span larger
    than ``limit`` makes a request of its own.
    """
    key: _Key | None = None
    spans: list[bytes] = []
    size = 0
    for request in requests:
        try:
            groups = _spans_of(request)
        except _Opaque:
            if spans:
                yield _request(key, spans)  # type: ignore[arg-type]
                key, spans, size = None, [], 0
            yield request
            continue
        for group_key, group_spans in groups:
            for span in group_spans:
                if spans and (group_key != key or size + len(span) > limit):
                    yield _request(key, spans)  # type: ignore[arg-type]
                    spans, size = [], 0
                key = group_key
                spans.append(span)
                size += len(span)
    if spans:
        yield _request(key, spans)  # type: ignore[arg-type]
