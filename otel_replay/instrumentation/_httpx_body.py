"""Buffer an httpx response body inside the contrib HTTP span, for calls whose caller reads it whole.

The contrib httpx instrumentation ends its CLIENT span when the transport
returns, before the client reads the body, so its response hook never sees
the content. This module adds two wrappers, installed only with content
capture on:

* around ``Client.send`` / ``AsyncClient.send``: notes in a context variable
  whether the caller asked for a stream (``stream=True``, ``client.stream``);
* around ``HTTPTransport.handle_request`` / ``AsyncHTTPTransport.handle_async_request``,
  installed *before* the contrib instrumentor so it runs inside the contrib
  span: when the caller reads the body whole anyway, the raw bytes are read
  here, the transport's stream is closed, and the response gets a fresh
  stream of the same bytes that also carries the decoded start of the body
  (at most what redaction scans) for the contrib response hook.

The client then reads, decodes, times and closes the response exactly as
before; a streamed response is never touched. A network error while reading
raises from ``send`` as it would have from the client's own read.
"""

from __future__ import annotations

import contextvars
from typing import Any

from opentelemetry import trace

from otel_replay.instrumentation._common import Layers
from otel_replay.redaction import SCAN_CHARS as _SCAN_CHARS

__all__ = ["buffered_body", "install", "installed", "uninstall"]

_DECODED_LIMIT = 4 * _SCAN_CHARS
"""Decoded bytes kept for the span: no more than redaction scans (UTF-8 is at most 4 bytes a character)."""

_CALLER_READS_WHOLE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "otel_replay_httpx_reads_whole", default=False
)

_layers = Layers()


def installed() -> bool:
    """Whether the wrappers are in place."""
    return bool(_layers)


_PROBE_CHUNK = 16 * 1024
"""Compressed bytes fed to the decoder at a time: deflate expands at most ~1000:1, so one step stays ~16 MiB."""


def _slices(raw: bytes) -> Any:
    view = memoryview(raw)
    for start in range(0, len(raw), _PROBE_CHUNK):
        yield bytes(view[start : start + _PROBE_CHUNK])


def _decoded_start(httpx: Any, headers: Any, raw: bytes) -> bytes | None:
    """The first bytes of ``raw`` decoded by its Content-Encoding; ``None`` if it does not decode.

    The body is fed to httpx's decoder in small slices and decoding stops once
    enough is decoded, so a compressed bomb is never inflated whole here.
    """
    stream = type("Slices", (httpx.SyncByteStream,), {"__iter__": lambda self: _slices(raw)})()
    probe = httpx.Response(200, headers=headers, stream=stream)
    out = bytearray()
    try:
        for chunk in probe.iter_bytes():
            out += chunk
            if len(out) >= _DECODED_LIMIT:
                break
    except httpx.DecodingError:
        return None  # the client's own read raises this to the caller
    return bytes(out[:_DECODED_LIMIT])


def _buffered_stream_class(httpx: Any) -> Any:
    class BufferedStream(httpx.ByteStream):
        """The response's bytes, read while the contrib span was open, plus their decoded start."""

        def __init__(self, raw: bytes, decoded: bytes | None) -> None:
            super().__init__(raw)
            self.otel_replay_decoded = decoded

    return BufferedStream


def _wants_buffer(response: Any, httpx: Any) -> bool:
    return (
        _CALLER_READS_WHOLE.get()
        and isinstance(response, httpx.Response)
        and not hasattr(response, "_content")
        and trace.get_current_span().is_recording()
    )


def buffered_body(response_info: Any) -> bytes | None:
    """The decoded start of a response body buffered here (from the contrib hook's response info), else ``None``."""
    return getattr(getattr(response_info, "stream", None), "otel_replay_decoded", None)


def install() -> None:
    """Wrap httpx's ``send`` and transports (once); call before the contrib instrumentor wraps them."""
    if _layers:
        return
    try:
        # optional dependency: httpx (the `http` extra)
        import httpx
    except ImportError:
        return
    buffered = _buffered_stream_class(httpx)

    def send(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        token = _CALLER_READS_WHOLE.set(not kwargs.get("stream", False))
        try:
            return wrapped(*args, **kwargs)
        finally:
            _CALLER_READS_WHOLE.reset(token)

    async def async_send(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        token = _CALLER_READS_WHOLE.set(not kwargs.get("stream", False))
        try:
            return await wrapped(*args, **kwargs)
        finally:
            _CALLER_READS_WHOLE.reset(token)

    def handle(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        response = wrapped(*args, **kwargs)
        if _wants_buffer(response, httpx):
            try:
                raw = b"".join(response.stream)
            finally:
                response.stream.close()
            response.stream = buffered(raw, _decoded_start(httpx, response.headers, raw))
        return response

    async def async_handle(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        response = await wrapped(*args, **kwargs)
        if _wants_buffer(response, httpx):
            try:
                raw = b"".join([chunk async for chunk in response.stream])
            finally:
                await response.stream.aclose()
            response.stream = buffered(raw, _decoded_start(httpx, response.headers, raw))
        return response

    _layers.wrap("httpx", "Client.send", send)
    _layers.wrap("httpx", "AsyncClient.send", async_send)
    _layers.wrap("httpx", "HTTPTransport.handle_request", handle)
    _layers.wrap("httpx", "AsyncHTTPTransport.handle_async_request", async_handle)


def uninstall() -> None:
    """Take the wrappers out (spliced out of the chain if the contrib instrumentor is still wrapped over them)."""
    _layers.remove()
