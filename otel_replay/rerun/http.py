"""The HTTP boundary: httpx transports (sync and async) and the requests adapter.

Patched at the transport level, where the final request (after auth, base URL
and default headers) meets the network: ``httpx.HTTPTransport.handle_request``,
``httpx.AsyncHTTPTransport.handle_async_request`` and
``requests.adapters.HTTPAdapter.send``, ``urllib3``'s ``HTTPConnectionPool.urlopen`` (for
urllib3 used directly; under requests the adapter is the boundary), and the same transports of ``httpx2``,
the httpx fork recent ``openai`` releases use. The OpenAI and Anthropic clients ride on
httpx, so a recorded model call reruns by serving its HTTP responses.

A call is matched on method, URL and body (secrets redacted first, at record
time and at match time alike). Headers are recorded (redacted) but not
matched: clients put per-attempt values in them (retry counts, idempotency keys).

httpx and requests are imported only when the boundary is installed.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
from typing import Any

from otel_replay import settings
from otel_replay.instrumentation._seam import through
from otel_replay.rerun.callers import INSIDE, exporters_traffic
from otel_replay.rerun.codec import redact_headers, redact_json_text, redact_url
from otel_replay.rerun.events import BoundaryCall, stream_key
from otel_replay.rerun.patching import PatchSet

__all__ = ["MAX_BODY_BYTES", "install_http", "request_arguments"]

MAX_BODY_BYTES = 8 * 1024 * 1024
"""Default cap on a recorded response body (``OTEL_REPLAY_RERUN_MAX_BODY`` overrides)."""


_cap = MAX_BODY_BYTES
"""The cap in force: ``OTEL_REPLAY_RERUN_MAX_BODY`` as read (and checked) by :func:`install_http`."""


def _max_body() -> int:
    return int(settings.env_number(settings.RERUN_MAX_BODY, MAX_BODY_BYTES, integer=True))


def _body_text(raw: bytes) -> Any:
    try:
        return redact_json_text(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return {"$b64": base64.b64encode(raw).decode("ascii")}


def request_arguments(method: str, url: str, body: bytes) -> str:
    """The canonical, redacted arguments of one request: what a rerun step is matched on."""
    if not body:
        shown: Any = ""
    elif len(body) > 65_536:
        shown = {"$sha256": hashlib.sha256(body).hexdigest(), "bytes": len(body)}
    else:
        shown = _body_text(body)
    return json.dumps(
        {"method": method.upper(), "url": redact_url(url), "body": shown},
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    )


def _response_value(status: int, reason: str, headers: Any, raw: bytes, encoded: bool) -> dict[str, Any]:
    cap = _cap
    capped = len(raw) > cap
    kept = raw[:cap]
    body: Any = {"$b64": base64.b64encode(kept).decode("ascii")} if encoded else _body_text(kept)
    value: dict[str, Any] = {"status": status, "reason": reason, "headers": redact_headers(headers), "body": body}
    if capped:
        value["capped"] = {"recorded_bytes": cap, "original_bytes": len(raw)}
    return value


def _live(status: int, reason: str, headers: Any, raw: bytes, encoded: bool) -> dict[str, Any]:
    """The response as it came: handed to the agent unchanged (stored through :func:`_stored`)."""
    return {"status": status, "reason": reason, "headers": list(headers), "raw": raw, "encoded": encoded}


def _stored(live: dict[str, Any]) -> dict[str, Any]:
    """What is written for a live response: secrets redacted, the body capped."""
    return _response_value(live["status"], live["reason"], live["headers"], live["raw"], live["encoded"])


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

    A recorded body may be shorter than it came (redacted, capped), so a stated
    ``Content-Length`` is made to agree with the body actually served.
    """
    pairs = [(k, v) for k, v in value.get("headers", [])]
    if "raw" in value:
        return pairs
    return [(k, str(len(body)) if _name(k) == "content-length" else v) for k, v in pairs]


def _name(key: Any) -> str:
    return (key.decode("latin-1") if isinstance(key, bytes) else str(key)).lower()


def _call(method: str, url: str, body: bytes, *, is_async: bool = False) -> BoundaryCall:
    name = f"{method.upper()} {redact_url(url).partition('?')[0]}"
    return BoundaryCall(
        "http",
        name,
        stream=stream_key("http", name),
        arguments_text=request_arguments(method, url, body),
        is_async=is_async,
        record_as=_stored,
    )


def _install_httpx(patches: PatchSet, module: str) -> None:
    httpx: Any = importlib.import_module(module)

    def to_response(value: dict[str, Any], request: Any) -> Any:
        body = response_body(value)
        return httpx.Response(
            int(value["status"]),
            headers=response_headers(value, body),
            stream=httpx.ByteStream(body),
            request=request,
            extensions={"reason_phrase": str(value.get("reason", "")).encode("latin-1", "replace")},
        )

    def sync_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        request = args[0] if args else kwargs["request"]
        if INSIDE.get() or exporters_traffic():
            return wrapped(*args, **kwargs)
        body = request.read()

        def invoke() -> dict[str, Any]:
            response = wrapped(*args, **kwargs)
            try:
                raw = b"".join(response.iter_raw())
            finally:
                response.close()
            encoded = "content-encoding" in response.headers
            return _live(response.status_code, response.reason_phrase, response.headers.raw, raw, encoded)

        return to_response(through(_call(request.method, str(request.url), body), invoke), request)

    async def async_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        request = args[0] if args else kwargs["request"]
        if INSIDE.get() or exporters_traffic():
            return await wrapped(*args, **kwargs)
        body = await request.aread()

        async def invoke() -> dict[str, Any]:
            response = await wrapped(*args, **kwargs)
            try:
                raw = b"".join([chunk async for chunk in response.aiter_raw()])
            finally:
                await response.aclose()
            encoded = "content-encoding" in response.headers
            return _live(response.status_code, response.reason_phrase, response.headers.raw, raw, encoded)

        value = await through(_call(request.method, str(request.url), body, is_async=True), invoke)
        return to_response(value, request)

    patches.wrap(httpx.HTTPTransport, "handle_request", sync_wrapper)
    patches.wrap(httpx.AsyncHTTPTransport, "handle_async_request", async_wrapper)


def _install_requests(patches: PatchSet) -> None:
    import requests
    import requests.adapters
    from requests.structures import CaseInsensitiveDict
    from requests.utils import get_encoding_from_headers

    def to_response(value: dict[str, Any], request: Any, adapter: Any) -> requests.Response:
        response = requests.Response()
        response.status_code = int(value["status"])
        response.reason = str(value.get("reason", ""))
        body = response_body(value)
        response.headers = CaseInsensitiveDict(dict(response_headers(value, body)))
        response._content = body
        response._content_consumed = True
        response.url = request.url
        response.request = request
        response.connection = adapter
        response.encoding = get_encoding_from_headers(response.headers)
        return response

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        request = args[0] if args else kwargs["request"]
        if INSIDE.get() or exporters_traffic():
            return wrapped(*args, **kwargs)
        body = request.body or b""
        body = body.encode("utf-8") if isinstance(body, str) else body
        if not isinstance(body, bytes):  # a file or generator body: matched on its absence
            body = b""

        def invoke() -> dict[str, Any]:
            response = wrapped(*args, **kwargs)
            raw = response.content
            headers = [(k, v) for k, v in response.headers.items() if k.lower() != "content-encoding"]
            return _live(response.status_code, response.reason or "", headers, raw, False)

        return to_response(through(_call(request.method, request.url, body), invoke), request, instance)

    patches.wrap(requests.adapters.HTTPAdapter, "send", wrapper)


def _install_urllib3(patches: PatchSet) -> None:
    import io

    import urllib3
    import urllib3.connectionpool
    from urllib3.response import HTTPResponse

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if INSIDE.get() or exporters_traffic() or len(args) < 2 and ("method" not in kwargs or "url" not in kwargs):
            return wrapped(*args, **kwargs)
        method = str(args[0] if args else kwargs["method"])
        url = str(args[1] if len(args) > 1 else kwargs["url"])
        body = args[2] if len(args) > 2 else kwargs.get("body")
        raw_body = body.encode("utf-8") if isinstance(body, str) else body if isinstance(body, bytes) else b""
        full = url if "://" in url else f"{instance.scheme}://{instance.host}:{instance.port}{url}"
        if len(args) > 12:  # preload_content and decode_content given by position: move them to keywords
            kwargs = {**kwargs, "preload_content": args[12], **({"decode_content": args[13]} if len(args) > 13 else {})}
            args = args[:12]
        preload = kwargs.get("preload_content", True)
        decode = kwargs.get("decode_content", True)
        call_args, call_kwargs = args, kwargs

        def invoke() -> dict[str, Any]:
            response = wrapped(*call_args, **{**call_kwargs, "preload_content": False})
            try:
                raw = response.read(decode_content=False)
            finally:
                response.release_conn()
            encoded = "content-encoding" in response.headers
            return _live(response.status, response.reason or "", list(response.headers.items()), raw, encoded)

        value = through(_call(method, full, raw_body), invoke)
        body = response_body(value)
        return HTTPResponse(
            body=io.BytesIO(body),
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
