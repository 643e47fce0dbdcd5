"""Stream proxies whose span ends exactly once, however the stream ends.

A streamed model call returns before any content arrives; its span stays open
until the stream ends, which is one of: exhausted, ``close()``, leaving a
``with`` block, an exception while iterating, or the stream dropped
unconsumed (garbage-collected). Whichever comes first ends the span, with the
aggregated content and usage the accumulator gathered; the rest are no-ops.
The proxies forward every other attribute to the client's stream object.

``type()`` of an observed stream is the proxy class, not the client's
``Stream``: the proxy must stand between the caller and the stream to see its
chunks and its end, and a client's stream class cannot be subclassed or
patched per call without changing it for uninstrumented code too.
``isinstance(stream, openai.Stream)`` holds (the proxy reports the wrapped
object's class as its ``__class__``), and so does every attribute and method.

A streamed call read through ``with_streaming_response`` (or
``with_raw_response``) returns a response whose ``parse()`` gives the stream:
:class:`StreamResponse` hands that stream out observed, and closing the
response without reading it ends the span as ``closed``.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from types import TracebackType
from typing import Any, Protocol

import wrapt
from opentelemetry.trace import Span

from otel_replay import semconv as sc
from otel_replay.instrumentation._common import end_error, guard

__all__ = ["Accumulator", "AsyncStreamProxy", "StreamEnd", "StreamResponse", "SyncStreamProxy"]

_log = logging.getLogger("otel_replay.instrumentation")


class Accumulator(Protocol):
    """Gathers what a stream's chunks say, and writes it on the span at the end."""

    def add(self, chunk: Any) -> None:
        """Take one chunk (or event) into account."""

    def finish(self, span: Span) -> None:
        """Write the aggregate (content, usage, finish reasons, tool calls) on ``span``."""


class StreamEnd:
    """Ends one stream's span once: the first of exhaustion, close, ``with`` exit, error, or drop."""

    __slots__ = ("_done", "_lock", "accumulator", "capture", "first", "span")

    def __init__(self, span: Span, accumulator: Accumulator, *, capture: bool = False) -> None:
        self.span = span
        self.capture = capture
        """Content capture on: an error's message is kept (redacted); off: its type only."""
        self.accumulator = accumulator
        self._done = False
        self._lock = threading.Lock()
        self.first = 0
        """When the first chunk arrived (``time.time_ns()``), 0 before."""

    def add(self, chunk: Any) -> None:
        """Feed a chunk to the accumulator (errors in it never reach the caller)."""
        if not self._done:
            try:
                self.accumulator.add(chunk)
            except Exception as exc:
                _log.debug("otel-replay: stream chunk extraction failed; the stream proceeds: %r", exc)

    def __enter__(self) -> StreamEnd:
        """Guard one step of the stream: ``with end: chunk = next(it)``."""
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """The step ended the stream: exhausted (``StopIteration`` / ``StopAsyncIteration``) or failed."""
        if exc is None:
            return
        if isinstance(exc, StopIteration | StopAsyncIteration):
            self.finish("exhausted")
        else:
            self.finish("error", exc)

    def finish(self, how: str, exc: BaseException | None = None) -> None:
        """End the span (first call only), recording how the stream ended."""
        if self._done:  # already ended (the flag is only ever set): no lock needed to see that
            return
        with self._lock:
            if self._done:
                return
            self._done = True
        guard("stream aggregate extraction", self.accumulator.finish, self.span)
        started = getattr(self.span, "start_time", None)
        if self.first and isinstance(started, int):
            seconds = max(self.first - started, 0) / 1e9
            self.span.set_attribute(sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, seconds)
        self.span.set_attribute(sc.STREAM_END, how)
        if exc is not None:
            end_error(self.span, exc, self.capture)
        else:
            self.span.end()


class _Observed(wrapt.ObjectProxy):
    """What both stream proxies share: a stream dropped unconsumed ends its span."""

    def __del__(self) -> None:
        end = getattr(self, "_self_end", None)
        if end is not None:
            end.finish("abandoned")


class SyncStreamProxy(_Observed):
    """A client's synchronous stream, observed."""

    def __init__(self, wrapped: Any, end: StreamEnd) -> None:
        super().__init__(wrapped)
        self._self_end = end
        self._self_it = wrapped if hasattr(wrapped, "__next__") else iter(wrapped)

    def __iter__(self) -> SyncStreamProxy:
        return self

    def __next__(self) -> Any:
        # what ``with self._self_end:`` does, inline (no two calls per chunk)
        try:
            chunk = self._self_it.__next__()
        except StopIteration:
            self._self_end.finish("exhausted")
            raise
        except BaseException as exc:
            self._self_end.finish("error", exc)
            raise
        end = self._self_end  # StreamEnd.add, inline (one call less per chunk)
        if not end.first:
            end.first = time.time_ns()
        if not end._done:
            try:
                end.accumulator.add(chunk)
            except Exception as exc:
                _log.debug("otel-replay: stream chunk extraction failed; the stream proceeds: %r", exc)
        return chunk

    def __enter__(self) -> SyncStreamProxy:
        enter = getattr(self.__wrapped__, "__enter__", None)
        if enter is not None:
            enter()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Any:
        try:
            leave = getattr(self.__wrapped__, "__exit__", None)
            return leave(exc_type, exc, tb) if leave is not None else None
        finally:
            self._self_end.finish("error" if exc is not None else "closed", exc)

    def close(self) -> None:
        """Close the underlying stream and end the span."""
        try:
            close = getattr(self.__wrapped__, "close", None)
            if close is not None:
                close()
        finally:
            self._self_end.finish("closed")


class AsyncStreamProxy(_Observed):
    """A client's asynchronous stream, observed."""

    def __init__(self, wrapped: Any, end: StreamEnd) -> None:
        super().__init__(wrapped)
        self._self_end = end
        self._self_it = wrapped if hasattr(wrapped, "__anext__") else wrapped.__aiter__()

    def __aiter__(self) -> AsyncStreamProxy:
        return self

    async def __anext__(self) -> Any:
        try:
            chunk = await self._self_it.__anext__()
        except StopAsyncIteration:
            self._self_end.finish("exhausted")
            raise
        except BaseException as exc:
            self._self_end.finish("error", exc)
            raise
        end = self._self_end  # StreamEnd.add, inline (one call less per chunk)
        if not end.first:
            end.first = time.time_ns()
        if not end._done:
            try:
                end.accumulator.add(chunk)
            except Exception as exc:
                _log.debug("otel-replay: stream chunk extraction failed; the stream proceeds: %r", exc)
        return chunk

    async def __aenter__(self) -> AsyncStreamProxy:
        enter = getattr(self.__wrapped__, "__aenter__", None)
        if enter is not None:
            await enter()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Any:
        try:
            leave = getattr(self.__wrapped__, "__aexit__", None)
            return (await leave(exc_type, exc, tb)) if leave is not None else None
        finally:
            self._self_end.finish("error" if exc is not None else "closed", exc)

    async def close(self) -> None:
        """Close the underlying stream and end the span."""
        try:
            close = getattr(self.__wrapped__, "close", None)
            if close is not None:
                await close()
        finally:
            self._self_end.finish("closed")


class StreamResponse(_Observed):
    """A streamed call's raw or streaming response: ``parse()`` gives its stream, observed by the same end."""

    def __init__(self, wrapped: Any, end: StreamEnd, *, aio: bool) -> None:
        super().__init__(wrapped)
        self._self_end = end
        self._self_aio = aio
        self._self_stream: Any = None

    def __del__(self) -> None:
        if getattr(self, "_self_stream", None) is None:  # a stream handed out ends its span itself
            super().__del__()

    def _observed(self, stream: Any) -> Any:
        iterable = ("__anext__", "__aiter__") if self._self_aio else ("__next__", "__iter__")
        if not any(hasattr(stream, name) for name in iterable):
            return stream  # parse(to=...) asked for something else: the span covers the request only
        if self._self_stream is None or self._self_stream.__wrapped__ is not stream:
            end = self._self_end
            self._self_stream = AsyncStreamProxy(stream, end) if self._self_aio else SyncStreamProxy(stream, end)
        return self._self_stream

    def parse(self, *args: Any, **kwargs: Any) -> Any:
        """The client's ``parse()``; the stream it gives is observed (an awaitable when the client's is async)."""
        parse = self.__wrapped__.parse
        if inspect.iscoroutinefunction(parse):
            return self._parse_async(parse, args, kwargs)
        return self._observed(parse(*args, **kwargs))

    async def _parse_async(self, parse: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self._observed(await parse(*args, **kwargs))

    def close(self) -> Any:
        """Close the response (an awaitable when the client's is async); an unfinished stream ends ``closed``."""
        result = None
        try:
            result = self.__wrapped__.close()
        finally:
            if not inspect.isawaitable(result):
                self._self_end.finish("closed")
        if inspect.isawaitable(result):
            return self._close_async(result)
        return result

    async def _close_async(self, pending: Any) -> None:
        try:
            await pending
        finally:
            self._self_end.finish("closed")
