"""A request body seen as it goes: hashed whole and kept only as a short head, whatever its length.

Recording hands the agent's streamed upload (a generator, an iterator, a file)
to the client through :func:`tee` / :func:`tee_async`: every chunk reaches the
server unchanged, and on its way it is fed to a :class:`BodySeen`, which keeps a
SHA-256 of all of it, its length and its first :data:`HEAD_BYTES` (for the
stored, redacted text). A rerun sends nothing: it reads the agent's body the
same way (:func:`drain` / :func:`drain_async`) to compare it, and keeps it in a
spooled file (on disk past a small size) in case the call is run live. Memory
stays bounded by the head and the spool's threshold, never the body's size.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import IO, Any

__all__ = ["HEAD_BYTES", "BodySeen", "chunks_of", "drain", "drain_async", "read_spool", "tee", "tee_async"]

HEAD_BYTES = 65_536
"""How much of a request body is kept for its stored text (a longer body is stored as its length only)."""
_READ = 64 * 1024
_SPOOL_IN_MEMORY = 1024 * 1024
"""A rerun's spooled body stays in memory up to this size, then moves to a temporary file."""


class BodySeen:
    """The SHA-256, length and head of a body fed chunk by chunk; ``complete`` once it was read to its end."""

    __slots__ = ("_head", "_sha", "complete", "size")

    def __init__(self) -> None:
        """An empty body, not read to its end yet."""
        self._sha = hashlib.sha256()
        self._head = bytearray()
        self.size = 0
        self.complete = False

    @classmethod
    def of(cls, data: bytes) -> BodySeen:
        """A body given whole."""
        seen = cls()
        seen.feed(data)
        seen.complete = True
        return seen

    def feed(self, chunk: bytes) -> None:
        """One more piece of the body."""
        self._sha.update(chunk)
        self.size += len(chunk)
        room = HEAD_BYTES - len(self._head)
        if room > 0:
            self._head += chunk[:room]

    @property
    def head(self) -> bytes:
        """The first :data:`HEAD_BYTES` of the body (all of it when it is no longer)."""
        return bytes(self._head)

    def hexdigest(self) -> str:
        """SHA-256 of the body read so far."""
        return self._sha.hexdigest()


def _as_bytes(chunk: Any) -> bytes:
    """A chunk as the client sends it: text as UTF-8 (urllib3 and httpx encode it so), buffers as their bytes."""
    if isinstance(chunk, bytes):
        return chunk
    if isinstance(chunk, str):
        return chunk.encode("utf-8")
    return bytes(chunk)


def chunks_of(body: Any) -> Iterator[bytes]:
    """The pieces of a streamed body as the client sends them: a file read in blocks, an iterable item by item."""
    read = getattr(body, "read", None)
    if read is not None:
        while True:
            block = read(_READ)
            if not block:
                return
            yield _as_bytes(block)
    for chunk in body:
        yield _as_bytes(chunk)


def tee(chunks: Iterable[Any], seen: BodySeen) -> Iterator[bytes]:
    """``chunks`` passed on unchanged (as bytes), each fed to ``seen``; ``seen.complete`` once they ended."""
    for chunk in chunks:
        data = _as_bytes(chunk)
        seen.feed(data)
        yield data
    seen.complete = True


async def tee_async(chunks: AsyncIterable[Any], seen: BodySeen) -> AsyncIterator[bytes]:
    """The async form of :func:`tee`."""
    async for chunk in chunks:
        data = _as_bytes(chunk)
        seen.feed(data)
        yield data
    seen.complete = True


def _spool() -> IO[bytes]:
    return tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY)  # noqa: SIM115 - the caller closes it


def drain(chunks: Iterable[Any]) -> tuple[BodySeen, IO[bytes], Exception | None]:
    """Read a body to its end (a rerun, which sends nothing): what it was, a spooled copy, and how it failed.

    A body that raises part way (the agent's generator failing) is what was read until then, and the error:
    the call is still matched (the recorded one failed the same way, the client raising it) and the error is
    raised where the client would have raised it.
    """
    seen, spool = BodySeen(), _spool()
    try:
        for data in tee(chunks, seen):
            spool.write(data)
    except Exception as exc:
        return seen, spool, exc
    except BaseException:
        spool.close()
        raise
    spool.seek(0)
    return seen, spool, None


async def drain_async(chunks: AsyncIterable[Any]) -> tuple[BodySeen, IO[bytes], Exception | None]:
    """The async form of :func:`drain`."""
    seen, spool = BodySeen(), _spool()
    try:
        async for data in tee_async(chunks, seen):
            spool.write(data)
    except Exception as exc:
        return seen, spool, exc
    except BaseException:
        spool.close()
        raise
    spool.seek(0)
    return seen, spool, None


def read_spool(spool: IO[bytes]) -> Iterator[bytes]:
    """A spooled body, in blocks, from its start."""
    spool.seek(0)
    while True:
        block = spool.read(_READ)
        if not block:
            return
        yield block
