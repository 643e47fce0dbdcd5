"""The HTTP boundary: httpx transports (sync and async) and the requests adapter.

Patched at the transport level, where the final request (after auth, base URL
and default headers) meets the network: ``httpx.HTTPTransport.handle_request``,
``httpx.AsyncHTTPTransport.handle_async_request`` and
``requests.adapters.HTTPAdapter.send``, ``urllib3``'s ``HTTPConnectionPool.urlopen`` (for
urllib3 used directly; under requests the adapter is the boundary), and the same transports of ``httpx2``,
the httpx fork recent ``openai`` releases use. The OpenAI and Anthropic clients ride on
httpx, so a recorded model call reruns by serving its HTTP responses.

A call is matched on everything that decides what it does (method, full URL, compared headers, body),
unredacted, through a keyed hash; only the stored text is redacted (the texts:
:mod:`~otel_replay.rerun.http_match`). A request body the agent streams (a generator, an iterator, a file) is
hashed as it goes, never held whole (:mod:`~otel_replay.rerun.http_body`).

httpx and requests are imported only when the boundary is installed.
"""

from __future__ import annotations

import base64
import importlib
import io
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

from otel_replay import _seam, settings
from otel_replay._seam import through
from otel_replay.rerun.callers import INSIDE, exporters_traffic
from otel_replay.rerun.codec import redact_headers, redact_url
from otel_replay.rerun.events import BoundaryCall, stream_key
from otel_replay.rerun.http_body import BodySeen, chunks_of, drain, drain_async, read_spool, tee, tee_async
from otel_replay.rerun.http_decode import Decoder, decode_bounded, httpx_decoder, urllib3_decoder
from otel_replay.rerun.http_match import body_text, request_texts, request_texts_lazy
from otel_replay.rerun.http_raw import over_bytes, read_head, release
from otel_replay.rerun.http_stream import ChainReader, head_async, head_sync
from otel_replay.rerun.patching import PatchSet

T = TypeVar("T")

__all__ = ["MAX_BODY_BYTES", "RESPONSE_FORMAT", "install_http"]

MAX_BODY_BYTES = 8 * 1024 * 1024
"""Default cap on a recorded response body (``OTEL_REPLAY_RERUN_MAX_BODY`` overrides)."""


_cap = MAX_BODY_BYTES
"""The cap in force: ``OTEL_REPLAY_RERUN_MAX_BODY`` as read (and checked) by :func:`install_http`."""


def _max_body() -> int:
    return int(settings.env_number(settings.RERUN_MAX_BODY, MAX_BODY_BYTES, integer=True))


RESPONSE_FORMAT = 2
"""Shape of a stored HTTP response (its ``"format"``; absent in recordings made before it was added, which are 1).

2: the body is stored decoded (never the compressed bytes) and the headers are stored as they are to be
served: ``Content-Encoding`` dropped from a decoded body, ``Content-Length`` made the stored body's length
only when the body was changed (redacted, capped or decoded). 1: the headers are as the server sent them."""


def _response_value(
    status: int, reason: str, headers: Any, raw: bytes, decode: Decoder | None = None, complete: bool = True
) -> dict[str, Any]:
    """The stored form of a response; ``complete=False``: ``raw`` is only the head of a longer body."""
    cap = _cap
    pairs = list(headers.items()) if hasattr(headers, "items") else list(headers)
    value: dict[str, Any] = {"format": RESPONSE_FORMAT, "status": status, "reason": reason}
    capped: dict[str, Any] | None = None
    if decode is not None and raw:
        try:
            decoded = decode_bounded(decode(raw, cap), cap)
        except Exception as exc:  # the client raises this to the agent when it reads the body
            kept = b""
            why = f"{type(exc).__name__}: {exc}"[:200]
            capped = {"recorded_bytes": 0, "original_bytes": len(raw), "undecodable": why}
        else:
            kept = decoded.kept
            if decoded.total > cap or not complete:
                capped = {"recorded_bytes": len(kept), "original_bytes": decoded.total}
                if not (decoded.complete and complete):
                    capped["at_least"] = True
        pairs = [(k, v) for k, v in pairs if _name(k) != "content-encoding"]
    else:
        kept = raw[:cap]
        if len(raw) > cap or not complete:
            capped = {"recorded_bytes": len(kept), "original_bytes": len(raw)}
            if not complete:
                capped["at_least"] = True
    value["body"] = body_text(kept)
    served = response_body(value)
    if served != raw:  # redacted, capped or decoded: the stated length is the served body's
        pairs = [(k, str(len(served)) if _name(k) == "content-length" else v) for k, v in pairs]
    value["headers"] = redact_headers(pairs)
    if capped is not None:
        value["capped"] = capped
    return value


def _live(status: int, reason: str, headers: Any, raw: bytes, decode: Decoder | None, **rest: Any) -> dict[str, Any]:
    """The response as it came: handed to the agent unchanged (stored through :func:`_stored`).

    ``decode`` decodes ``raw`` as the client does (``None``: not encoded); ``rest`` carries what only the
    live side uses: the client's own response object (``response``), or, when ``raw`` is only the head of
    a longer body, the live rest of it (``rest``) and how the live response is let go (``close``).
    """
    return {"status": status, "reason": reason, "headers": list(headers), "raw": raw, "decode": decode, **rest}


def _stored(live: dict[str, Any]) -> dict[str, Any]:
    """What is written for a live response: decoded, secrets redacted, the body capped."""
    complete = live.get("rest") is None
    return _response_value(live["status"], live["reason"], live["headers"], live["raw"], live["decode"], complete)


def response_body(value: dict[str, Any]) -> bytes:
    """The body bytes of a live or recorded response."""
    if "raw" in value:
        return bytes(value["raw"])
    body = value.get("body", "")
    if isinstance(body, dict):
        return base64.b64decode(body.get("$b64", ""))
    return str(body).encode("utf-8")


def response_headers(value: dict[str, Any], body: bytes) -> list[tuple[Any, Any]]:
    """The header pairs to answer with.

    A live response and a stored one of format 2 are answered as they are. In
    format 1 the headers are as the server sent them while the body may be
    shorter (redacted, capped), so a stated ``Content-Length`` is made to agree
    with the body served, except for an empty body that was not capped: a HEAD
    or 304 answer, whose length is that of a body never sent.
    """
    pairs = [(k, v) for k, v in value.get("headers", [])]
    if "raw" in value or value.get("format", 1) >= 2 or (not body and "capped" not in value):
        return pairs
    return [(k, str(len(body)) if _name(k) == "content-length" else v) for k, v in pairs]


def _latin1(text: Any) -> bytes:
    return text if isinstance(text, bytes) else str(text).encode("latin-1", "replace")


def _name(key: Any) -> str:
    return (key.decode("latin-1") if isinstance(key, bytes) else str(key)).lower()


def _call(
    method: str,
    url: str,
    headers: Any,
    body: BodySeen,
    *,
    is_async: bool = False,
    unread: bool = False,
    sending: bool = False,
) -> BoundaryCall:
    """The boundary call of one request; ``sending``: its body is still on its way (texts read after the call)."""
    name = f"{method.upper()} {redact_url(url).partition('?')[0]}"
    kept = list(headers.items()) if isinstance(headers, Mapping) else list(headers or ())
    if sending:
        texts: list[tuple[str, str]] = []

        def later() -> tuple[str, str]:
            if not texts:
                texts.append(request_texts(method, url, kept, body, unread=unread))
            return texts[0]

        return BoundaryCall(
            "http", name, stream=stream_key("http", name), is_async=is_async, record_as=_stored, later=later
        )
    matched, stored = request_texts_lazy(method, url, kept, body, unread=unread)
    return BoundaryCall(
        "http",
        name,
        stream=stream_key("http", name),
        is_async=is_async,
        record_as=_stored,
        match_text=matched,
        shown=stored,  # built when a recording stores it or a divergence shows it: a matched call never does
    )


def _raising(error: Exception | None, invoke: Callable[[], T]) -> Callable[[], T]:
    """``invoke``, or, when the agent's body failed while a rerun read it, a call that raises that failure."""
    if error is None:
        return invoke

    def fail() -> T:
        raise error

    return fail


def _raising_async(error: Exception | None, invoke: Callable[[], Awaitable[T]]) -> Callable[[], Awaitable[T]]:
    """The async form of :func:`_raising`."""
    if error is None:
        return invoke

    async def fail() -> T:
        raise error

    return fail


def _recording() -> bool:
    """The mode at the seam records (a streamed body is hashed on its way), rather than serving a rerun.

    Said by the mode itself (``records``: :class:`~otel_replay.rerun.record.RecordMode` sets it), so the
    boundary does not import the mode that installs it.
    """
    return getattr(_seam.current(), "records", False) is True


def _streamed(body: Any) -> bool:
    """A requests/urllib3 body read as it is sent (a file or an iterable), not one given whole."""
    return body is not None and not isinstance(body, (bytes, str, bytearray, memoryview))


def _install_httpx(patches: PatchSet, module: str) -> None:
    httpx: Any = importlib.import_module(module)

    class Tee(httpx.SyncByteStream):
        """The head read for the recording, then the rest of the body as it arrives."""

        def __init__(self, head: bytes, rest: Any, close: Any) -> None:
            self._head, self._rest, self._close = head, rest, close

        def __iter__(self) -> Iterator[bytes]:
            head, self._head = self._head, b""
            if head:
                yield head
            yield from self._rest

        def close(self) -> None:
            self._close()

    class AsyncTee(httpx.AsyncByteStream):
        """The async form of ``Tee``."""

        def __init__(self, head: bytes, rest: Any, close: Any) -> None:
            self._head, self._rest, self._close = head, rest, close

        async def __aiter__(self) -> AsyncIterator[bytes]:
            head, self._head = self._head, b""
            if head:
                yield head
            async for chunk in self._rest:
                yield chunk

        async def aclose(self) -> None:
            await self._close()

    def to_response(value: dict[str, Any], request: Any, tee: Any = None) -> Any:
        body = response_body(value)
        rest = value.get("rest")
        return httpx.Response(
            int(value["status"]),
            # As bytes: stored headers are Latin-1 text, and httpx encodes str headers as ASCII (a raw UTF-8
            # `filename="résumé.pdf"` would raise UnicodeEncodeError in the agent).
            headers=[(_latin1(k), _latin1(v)) for k, v in response_headers(value, body)],
            stream=httpx.ByteStream(body) if rest is None else tee(body, rest, value["close"]),
            request=request,
            extensions={"reason_phrase": str(value.get("reason", "")).encode("latin-1", "replace")},
        )

    class BodyTee(httpx.SyncByteStream):
        """The agent's streamed request body, sent as it comes and seen on its way (recording)."""

        def __init__(self, stream: Any, seen: BodySeen) -> None:
            self._stream, self._seen = stream, seen

        def __iter__(self) -> Iterator[bytes]:
            return tee(self._stream, self._seen)

        def close(self) -> None:
            self._stream.close()

    class AsyncBodyTee(httpx.AsyncByteStream):
        """The async form of ``BodyTee``."""

        def __init__(self, stream: Any, seen: BodySeen) -> None:
            self._stream, self._seen = stream, seen

        def __aiter__(self) -> AsyncIterator[bytes]:
            return tee_async(self._stream, self._seen)

        async def aclose(self) -> None:
            await self._stream.aclose()

    class Spooled(httpx.SyncByteStream, httpx.AsyncByteStream):
        """A body a rerun read to compare it, sent from its spool if the call runs live."""

        def __init__(self, spool: Any) -> None:
            self._spool = spool

        def __iter__(self) -> Iterator[bytes]:
            return read_spool(self._spool)

        async def __aiter__(self) -> AsyncIterator[bytes]:
            for block in read_spool(self._spool):
                yield block

    def request_body(request: Any, is_async: bool) -> tuple[BodySeen, Any]:
        """What a request's body is, and the stream to send in its place (``None``: its own, given whole)."""
        stream = request.stream
        if isinstance(stream, httpx.ByteStream):  # bytes given whole: no copy, no wrapping
            return BodySeen.of(b"".join(stream)), None
        seen = BodySeen()
        return seen, (AsyncBodyTee if is_async else BodyTee)(stream, seen)

    def sync_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        request = args[0] if args else kwargs["request"]
        if INSIDE.get() or exporters_traffic():
            return wrapped(*args, **kwargs)
        original, spool, failed = request.stream, None, None
        body, sending = request_body(request, False)
        if sending is not None and not _recording():  # a rerun reads the body to compare it, sends nothing
            body, spool, failed = drain(original)
            sending = Spooled(spool)
        call = _call(
            request.method, str(request.url), request.headers.raw, body, sending=spool is None and sending is not None
        )

        def invoke() -> dict[str, Any]:
            response = wrapped(*args, **kwargs)
            try:
                raw, rest = head_sync(response.iter_raw(), _cap)
            except BaseException:
                response.close()
                raise
            if rest is None:
                response.close()
            decode = httpx_decoder(httpx, response.headers.raw) if "content-encoding" in response.headers else None
            status, reason, headers = response.status_code, response.reason_phrase, response.headers.raw
            return _live(status, reason, headers, raw, decode, rest=rest, close=response.close)

        if sending is not None:
            request.stream = sending
        try:
            return to_response(through(call, _raising(failed, invoke)), request, Tee)
        finally:
            request.stream = original
            if spool is not None:
                spool.close()

    async def async_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        request = args[0] if args else kwargs["request"]
        if INSIDE.get() or exporters_traffic():
            return await wrapped(*args, **kwargs)
        original, spool, failed = request.stream, None, None
        body, sending = request_body(request, True)
        if sending is not None and not _recording():
            body, spool, failed = await drain_async(original)
            sending = Spooled(spool)
        call = _call(
            request.method,
            str(request.url),
            request.headers.raw,
            body,
            is_async=True,
            sending=spool is None and sending is not None,
        )

        async def invoke() -> dict[str, Any]:
            response = await wrapped(*args, **kwargs)
            try:
                raw, rest = await head_async(response.aiter_raw(), _cap)
            except BaseException:
                await response.aclose()
                raise
            if rest is None:
                await response.aclose()
            decode = httpx_decoder(httpx, response.headers.raw) if "content-encoding" in response.headers else None
            status, reason, headers = response.status_code, response.reason_phrase, response.headers.raw
            return _live(status, reason, headers, raw, decode, rest=rest, close=response.aclose)

        if sending is not None:
            request.stream = sending
        try:
            value = await through(call, _raising_async(failed, invoke))
        finally:
            request.stream = original
            if spool is not None:
                spool.close()
        return to_response(value, request, AsyncTee)

    patches.wrap(httpx.HTTPTransport, "handle_request", sync_wrapper)
    patches.wrap(httpx.AsyncHTTPTransport, "handle_async_request", async_wrapper)


def _install_requests(patches: PatchSet) -> None:
    # optional dependency: requests and urllib3 are patched only where installed
    import requests
    import requests.adapters
    import urllib3
    from requests.cookies import extract_cookies_to_jar
    from requests.structures import CaseInsensitiveDict
    from requests.utils import get_encoding_from_headers
    from urllib3.response import HTTPResponse

    def to_response(value: dict[str, Any], request: Any, adapter: Any) -> requests.Response:
        response = requests.Response()
        response.status_code = int(value["status"])
        response.reason = str(value.get("reason", ""))
        body = response_body(value)
        headers = urllib3.HTTPHeaderDict(response_headers(value, body))  # repeats joined, as for a live answer
        response.headers = CaseInsensitiveDict(headers)
        response.raw = over_bytes(
            body, headers, status=response.status_code, reason=response.reason, method=request.method, url=request.url
        )
        response._content = body
        response._content_consumed = True
        response.url = request.url
        response.request = request
        response.connection = adapter
        response.encoding = get_encoding_from_headers(response.headers)
        # As adapter.build_response does: the response's own jar (`"sid" in r.cookies`) from its Set-Cookie.
        extract_cookies_to_jar(response.cookies, request, response.raw)
        return response

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        request = args[0] if args else kwargs["request"]
        if INSIDE.get() or exporters_traffic():
            return wrapped(*args, **kwargs)
        original, spool, failed = request.body, None, None
        streamed = _streamed(original)
        if not streamed:
            given = original or b""
            body = BodySeen.of(given.encode("utf-8") if isinstance(given, str) else bytes(given))
        elif _recording():  # sent as it comes, seen on its way
            body = BodySeen()
            request.body = tee(chunks_of(original), body)
        else:  # a rerun reads it to compare it, and sends it from the spool only if the call runs live
            body, spool, failed = drain(chunks_of(original))
            request.body = spool
        call = _call(
            request.method,
            request.url,
            request.headers,
            body,
            unread=not isinstance(original, (bytes, str, type(None))),
            sending=streamed and spool is None,
        )

        def invoke() -> dict[str, Any]:
            response = wrapped(*args, **kwargs)
            original = response.raw
            status, reason = response.status_code, response.reason or ""
            if not isinstance(original, HTTPResponse):  # an adapter of another kind: its body, decoded
                headers = [(k, v) for k, v in response.headers.items() if k.lower() != "content-encoding"]
                return _live(status, reason, headers, response.content, None, response=response)
            try:
                raw, rest = read_head(original, _cap)
            except BaseException:
                original.release_conn()
                raise
            if rest is None:
                original.release_conn()
            # The agent gets the real response, its raw body readable again (cookies, r.raw, iter_content).
            response.raw = over_bytes(
                raw,
                original.headers,
                status=status,
                reason=reason,
                method=request.method,
                url=request.url,
                original=original,
                rest=rest,
            )
            headers = list(original.headers.items())
            decode = urllib3_decoder(headers) if "content-encoding" in original.headers else None
            return _live(status, reason, headers, raw, decode, response=response, rest=rest)

        try:
            value = through(call, _raising(failed, invoke))
        finally:
            request.body = original  # as the agent gave it (a redirect rewinds its own file)
            if spool is not None:
                spool.close()
        return value["response"] if "response" in value else to_response(value, request, instance)

    patches.wrap(requests.adapters.HTTPAdapter, "send", wrapper)


def _install_urllib3(patches: PatchSet) -> None:
    # optional dependency: urllib3 is patched only where installed
    import urllib3
    import urllib3.connectionpool
    from urllib3.response import HTTPResponse

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if INSIDE.get() or exporters_traffic() or len(args) < 2 and ("method" not in kwargs or "url" not in kwargs):
            return wrapped(*args, **kwargs)
        method = str(args[0] if args else kwargs["method"])
        url = str(args[1] if len(args) > 1 else kwargs["url"])
        body = args[2] if len(args) > 2 else kwargs.get("body")
        headers = args[3] if len(args) > 3 else kwargs.get("headers")
        full = url if "://" in url else f"{instance.scheme}://{instance.host}:{instance.port}{url}"
        if len(args) > 12:  # preload_content and decode_content given by position: move them to keywords
            kwargs = {**kwargs, "preload_content": args[12], **({"decode_content": args[13]} if len(args) > 13 else {})}
            args = args[:12]
        preload = kwargs.get("preload_content", True)
        decode = kwargs.get("decode_content", True)
        streamed, spool, failed = _streamed(body), None, None
        if not streamed:
            seen = BodySeen.of(body.encode("utf-8") if isinstance(body, str) else bytes(body or b""))
            sent = body
        elif _recording():
            seen = BodySeen()
            sent = tee(chunks_of(body), seen)
        else:
            seen, spool, failed = drain(chunks_of(body))
            sent = spool
        if sent is not body:  # the body handed on in the agent's place, where it was given
            if len(args) > 2:
                args = (*args[:2], sent, *args[3:])
            else:
                kwargs = {**kwargs, "body": sent}
        call_args, call_kwargs = args, kwargs
        call = _call(
            method,
            full,
            instance.headers if headers is None else headers,
            seen,
            unread=not isinstance(body, (bytes, str, type(None))),
            sending=streamed and spool is None,
        )

        def invoke() -> dict[str, Any]:
            response = wrapped(*call_args, **{**call_kwargs, "preload_content": False})
            try:
                raw, rest = head_sync(response.stream(64 * 1024, decode_content=False), _cap)
            except BaseException:
                response.release_conn()
                raise
            if rest is None:
                response.release_conn()
            headers = list(response.headers.items())
            decode = urllib3_decoder(headers) if "content-encoding" in response.headers else None
            return _live(
                response.status, response.reason or "", headers, raw, decode, rest=rest, close=release(response)
            )

        try:
            value = through(call, _raising(failed, invoke))
        finally:
            if spool is not None:
                spool.close()
        body = response_body(value)
        rest = value.get("rest")
        return HTTPResponse(
            body=io.BytesIO(body) if rest is None else io.BufferedReader(ChainReader(body, rest, value["close"])),
            headers=urllib3.HTTPHeaderDict(response_headers(value, body)),
            status=int(value["status"]),
            reason=str(value.get("reason", "")),
            preload_content=preload,
            decode_content=decode,
            request_method=method,
            request_url=full,
        )

    patches.wrap(urllib3.connectionpool.HTTPConnectionPool, "urlopen", wrapper)


def install_http(patches: PatchSet) -> list[str]:
    """Wrap the HTTP clients that are installed; returns the names of those wrapped.

    Raises:
        ConfigError: ``OTEL_REPLAY_RERUN_MAX_BODY`` is malformed: refused here, at
            start, not per response (where each one would be dropped from the recording).

    """
    global _cap
    _cap = _max_body()  # one interceptor at a time (they do not nest): the cap of the one installing
    wrapped = []
    for module in ("httpx", "httpx2"):  # httpx2: the fork newer openai releases ride on
        try:
            _install_httpx(patches, module)
            wrapped.append(module)
        except ImportError:
            pass
    for name, install in (("requests", _install_requests), ("urllib3", _install_urllib3)):
        try:
            install(patches)
            wrapped.append(name)
        except ImportError:
            pass
    return wrapped
