"""Step-wise inflation of gzip and zlib bodies, charged to a request's reservation as they grow.

Shared by OTLP/HTTP (``Content-Encoding: gzip``) and gRPC (``gzip`` or
``deflate`` messages). A refusal is a :class:`Reply`: the HTTP status and
how to finish the request, which each service maps onto its own protocol.
"""

from __future__ import annotations

import zlib
from typing import Any

from .admission import Reservation

__all__ = ["CHUNK", "Reply", "inflate_members"]

CHUNK = 64 * 1024
"""Bytes read from the socket (and inflated) per step; what a request holds before it is charged."""
_RATIO_FLOOR = 64 * 1024
"""The inflation ratio is checked once this much has been inflated (gzip headers skew small bodies)."""


class Reply(Exception):
    """Finish the request with an error status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        close: bool = False,
        retry_after: int | None = None,
        bomb: bool = False,
        over_ratio: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.close = close
        self.retry_after = retry_after
        self.bomb = bomb  # the reply is delayed (bomb_delay_seconds)
        self.over_ratio = over_ratio  # refused for the inflation ratio (not for the size limit)


def inflate_members(
    read: Any,
    length: int,
    limit: int,
    ratio: int,
    reservation: Reservation,
    factor: int,
    wbits: int = 31,
    what: str = "gzip body",
) -> bytearray | None:
    """Inflate a gzip body of ``length`` bytes read through ``read``, charging ``factor`` x each inflated byte.

    Every member is inflated (``gzip.compress(a) + gzip.compress(b)`` is
    ``a + b``). Nothing beyond ``limit`` inflated bytes is ever produced.
    Returns None when the client went away mid-body. ``wbits`` 15 reads
    zlib streams instead (gRPC's ``deflate``); ``what`` names the input in
    refusals. A refusal for the inflation ratio has ``over_ratio`` set.
    """
    out = bytearray()
    inflater = zlib.decompressobj(wbits=wbits)
    pending = b""
    consumed = 0  # compressed bytes handed to zlib and used
    remaining = length
    member_open = False
    reservation.grow(CHUNK)  # the read buffer
    while True:
        if not pending:
            if remaining == 0:
                break
            pending = read(min(CHUNK, remaining))
            if not pending:
                return None
            remaining -= len(pending)
        if not member_open:
            inflater = zlib.decompressobj(wbits=wbits)
            member_open = True
        before = len(pending)
        try:
            piece = inflater.decompress(pending, CHUNK)
        except zlib.error as exc:
            raise Reply(400, f"invalid {what} at compressed byte {length - remaining - before}: {exc}") from None
        pending = inflater.unconsumed_tail
        if inflater.eof:
            pending = inflater.unused_data + pending
            member_open = False
        consumed += before - len(pending)
        if piece:
            if len(out) + len(piece) > limit:
                raise Reply(413, f"{what} inflates past the {limit} byte limit", close=True, bomb=True)
            reservation.grow(factor * len(piece))
            out += piece
            if ratio and len(out) > _RATIO_FLOOR and len(out) > ratio * max(1, consumed):
                raise Reply(
                    413,
                    f"{what} inflates more than {ratio}:1 (a decompression bomb?)",
                    close=True,
                    bomb=True,
                    over_ratio=True,
                )
    if member_open:
        raise Reply(400, f"truncated {what} (the last gzip member has no end)")
    if length == 0:
        raise Reply(400, f"empty {what}")
    return out
