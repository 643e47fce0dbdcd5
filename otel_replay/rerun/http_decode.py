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

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from otel_replay.rerun.http_stream import ChainReader

__all__ = ["COUNT_LIMIT", "Decoded", "Undecodable", "decode_bounded", "httpx_decoder", "urllib3_decoder"]

_SLICE = 16 * 1024
"""Compressed bytes fed to a decoder at a time (deflate expands at most ~1000:1, so a step stays ~16 MiB)."""

COUNT_LIMIT = 64
"""Decoded bytes are counted up to this many times the cap; past it the original size is a lower bound."""

Decoder = Callable[[bytes, int], Iterator[bytes]]
"""(compressed body, cap) → its decoded bytes, piece by piece (raises :class:`Undecodable` or the client's error)."""


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
    limit = _limit(cap)
    try:
        for piece in pieces:
            total += len(piece)
            if len(out) < cap:
                out += piece[: cap - len(out)]
            if total > limit:
                return Decoded(bytes(out), total, False)
    except _LayerCut:  # an inner layer of a chained encoding went past the limit: what came out so far
        return Decoded(bytes(out), total, False)
    return Decoded(bytes(out), total, True)


def _limit(cap: int) -> int:
    return max(cap, _SLICE) * COUNT_LIMIT


class _LayerCut(Exception):
    """An intermediate layer of a chained Content-Encoding decoded past the limit: decoding stops there."""


def _resliced(pieces: Iterator[bytes], limit: int | None) -> Iterator[bytes]:
    """``pieces`` again in slices of at most :data:`_SLICE` (the next layer never gets a large piece at once).

    ``limit``: raise :class:`_LayerCut` once more than this many bytes came through (an inner layer's output).
    """
    total = 0
    for piece in pieces:
        total += len(piece)
        if limit is not None and total > limit:
            raise _LayerCut
        yield from _slices(piece)


def _layered(
    raw: bytes, cap: int, codings: list[str], one: Callable[[str, Iterator[bytes]], Iterator[bytes]]
) -> Iterator[bytes]:
    """Decode ``raw`` one coding at a time (the last applied first), each layer fed slices of the one below.

    A client decoding ``gzip, gzip`` itself inflates the inner layer whole from each piece of the outer one
    (16 KiB in, 1 GiB out); here every layer gets at most :data:`_SLICE` bytes at a time and stops once its
    output passes the limit, so no step yields more than about a slice × the coding's ratio.
    """
    pieces: Iterator[bytes] = _slices(raw)
    for inner in range(len(codings) - 1, -1, -1):
        pieces = one(codings[inner], pieces)
        if inner:  # an intermediate layer: bounded as the final output is (which decode_bounded bounds)
            pieces = _resliced(pieces, _limit(cap))
    return pieces


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

    def one(coding: str, pieces: Iterator[bytes]) -> Iterator[bytes]:
        stream = type("Pieces", (httpx.SyncByteStream,), {"__iter__": lambda self: pieces})()
        return iter(httpx.Response(200, headers=[("content-encoding", coding)], stream=stream).iter_bytes())

    def decode(raw: bytes, cap: int) -> Iterator[bytes]:
        _check(headers, supported)
        return _layered(raw, cap, _codings(headers), one)

    return decode


def urllib3_decoder(headers: Any) -> Decoder:
    """Decode as ``urllib3`` (and so ``requests``) decodes a response with ``headers``."""
    # optional dependency: urllib3, only when its responses are served
    import urllib3
    from urllib3.response import HTTPResponse

    def one(coding: str, pieces: Iterator[bytes]) -> Iterator[bytes]:
        response = HTTPResponse(
            body=ChainReader(b"", pieces, _keep),  # urllib3 reads the body from a file
            headers=urllib3.HTTPHeaderDict({"content-encoding": coding}),
            preload_content=False,
            decode_content=True,
            enforce_content_length=False,
        )
        while piece := response.read(_SLICE):
            yield piece

    def decode(raw: bytes, cap: int) -> Iterator[bytes]:
        _check(headers, HTTPResponse.CONTENT_DECODERS)
        return _layered(raw, cap, _codings(headers), one)

    return decode


def _keep(finished: bool) -> None:
    """Nothing to release: the pieces are in memory."""
