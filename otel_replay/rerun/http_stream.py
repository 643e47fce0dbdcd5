"""Read the head of a live response body for the recording; the agent reads the rest straight from the network.

Recording keeps at most the cap (``OTEL_REPLAY_RERUN_MAX_BODY``) of a body, so
it reads no more than that before handing the response over: a body that ends
within the cap is read whole (and recorded whole), as before; a longer one is
recorded cut short (``capped``, its length "at least" what was read) and the
agent's client goes on reading the rest as it arrives. Memory stays bounded by
the cap, and a long or endless stream reaches the agent after at most the cap.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Callable, Iterator

__all__ = ["ChainReader", "head_async", "head_sync"]


def head_sync(chunks: Iterator[bytes], cap: int) -> tuple[bytes, Iterator[bytes] | None]:
    """The body's first ``cap`` bytes or more (whole chunks), and the live rest (``None`` when it ended)."""
    buf = bytearray()
    for chunk in chunks:
        buf += chunk
        if len(buf) > cap:
            return bytes(buf), chunks
    return bytes(buf), None


async def head_async(chunks: AsyncIterator[bytes], cap: int) -> tuple[bytes, AsyncIterator[bytes] | None]:
    """The awaitable form of :func:`head_sync`."""
    buf = bytearray()
    async for chunk in chunks:
        buf += chunk
        if len(buf) > cap:
            return bytes(buf), chunks
    return bytes(buf), None


class ChainReader(io.RawIOBase):
    """A binary file reading ``head``, then the chunks of ``rest``; closing it calls ``on_close`` once.

    ``on_close(finished)`` releases the live response: ``finished`` says whether ``rest`` was read to its end
    (the connection can be reused) or the reader was closed early (it cannot).
    """

    def __init__(self, head: bytes, rest: Iterator[bytes] | None, on_close: Callable[[bool], None]) -> None:
        """Read ``head`` then ``rest``."""
        super().__init__()
        self._buffer = memoryview(head)
        self._rest = rest
        self._on_close: Callable[[bool], None] | None = on_close

    def readable(self) -> bool:
        """Always: a body is read."""
        return True

    def readinto(self, target: bytearray | memoryview) -> int:  # type: ignore[override]
        """Fill ``target`` from what is buffered, taking the next live chunk when the buffer is empty."""
        while not self._buffer and self._rest is not None:
            chunk = next(self._rest, None)
            if chunk is None:
                self._rest = None
            else:
                self._buffer = memoryview(chunk)
        size = min(len(target), len(self._buffer))
        target[:size] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        return size

    def close(self) -> None:
        """Close once, releasing the live response."""
        on_close, self._on_close = self._on_close, None
        try:
            if on_close is not None:
                on_close(self._rest is None)
        finally:
            super().close()
