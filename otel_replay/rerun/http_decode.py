"""Decode a compressed (``Content-Encoding``) response body for storing, bounded, with the client's own decoder.

A recording stores what the agent read (the decoded body), redacted, never the
compressed bytes (which would hold every secret in them unredacted). Decoding
goes through the client library's decoder, so the stored body is exactly what
that client handed the agent, and it is fed 16 KiB of compressed input at a
time: at most the cap is kept, and decoded bytes past it are only counted, up
to :data:`COUNT_LIMIT` times the cap, so a compression bomb costs bounded
memory and time.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["COUNT_LIMIT", "Decoded", "Undecodable", "decode_bounded", "httpx_decoder", "urllib3_decoder"]

_SLICE = 16 * 1024
"""Compressed bytes fed to a decoder at a time (deflate expands at most ~1000:1, so a step stays ~16 MiB)."""

COUNT_LIMIT = 64
"""Decoded bytes are counted up to this many times the cap; past it the original size is a lower bound."""

Decoder = Callable[[bytes], Iterator[bytes]]
"""Compressed body → its decoded bytes, piece by piece (raises :class:`Undecodable` or the client's error)."""


class Undecodable(Exception):
    """A body whose Content-Encoding the client does not decode (the agent got the compressed bytes)."""


@dataclass(frozen=True)
class Decoded:
    """The start of a decoded body and how long it was."""

    kept: bytes
    """At most ``cap`` decoded bytes."""
    total: int
    """Decoded bytes counted."""
    complete: bool
    """``total`` is the whole decoded length (not cut at :data:`COUNT_LIMIT` times the cap)."""


def decode_bounded(pieces: Iterator[bytes], cap: int) -> Decoded:
    """Keep at most ``cap`` bytes of ``pieces`` and count the rest, up to :data:`COUNT_LIMIT` × ``cap``."""
    out = bytearray()
    total = 0
    limit = max(cap, _SLICE) * COUNT_LIMIT
    for piece in pieces:
        total += len(piece)
        if len(out) < cap:
            out += piece[: cap - len(out)]
        if total > limit:
            return Decoded(bytes(out), total, False)
    return Decoded(bytes(out), total, True)


def _slices(raw: bytes) -> Iterator[bytes]:
    view = memoryview(raw)
    for start in range(0, len(raw), _SLICE):
        yield bytes(view[start : start + _SLICE])


def _codings(headers: Any) -> list[str]:
    out = []
    for key, value in headers:
        name = key.decode("latin-1") if isinstance(key, bytes) else str(key)
        if name.lower() == "content-encoding":
            text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
            out += [c.strip().lower() for c in text.split(",") if c.strip() and c.strip().lower() != "identity"]
    return out


def _check(headers: Any, supported: Any) -> None:
    unknown = [c for c in _codings(headers) if c not in supported]
    if unknown:
        raise Undecodable(f"Content-Encoding {', '.join(unknown)} is not decoded by the client")


def httpx_decoder(httpx: Any, headers: Any) -> Decoder:
    """Decode as ``httpx`` (or the ``httpx2`` fork, passed as ``httpx``) decodes a response with ``headers``."""
    supported = getattr(getattr(httpx, "_decoders", None), "SUPPORTED_DECODERS", ("gzip", "deflate"))

    def decode(raw: bytes) -> Iterator[bytes]:
        _check(headers, supported)
        stream = type("Slices", (httpx.SyncByteStream,), {"__iter__": lambda self: _slices(raw)})()
        return iter(httpx.Response(200, headers=headers, stream=stream).iter_bytes())

    return decode


def urllib3_decoder(headers: Any) -> Decoder:
    """Decode as ``urllib3`` (and so ``requests``) decodes a response with ``headers``."""
    import urllib3
    from urllib3.response import HTTPResponse

    def decode(raw: bytes) -> Iterator[bytes]:
        _check(headers, HTTPResponse.CONTENT_DECODERS)
        response = HTTPResponse(
            body=io.BytesIO(raw),
            headers=urllib3.HTTPHeaderDict(headers),
            preload_content=False,
            decode_content=True,
            enforce_content_length=False,
        )
        while piece := response.read(_SLICE):
            yield piece

    return decode
