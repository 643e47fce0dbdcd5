"""HTTP reads the agent makes: the contrib httpx/requests instrumentations, plus bodies under the capture switch.

The OpenTelemetry contrib instrumentations already make a CLIENT span per
request (method, URL, status). What replay adds is the content — what the
agent sent and what came back — recorded only with content capture on,
redacted and capped like every other captured content, as
``replay.http.request.body`` and ``replay.http.response.body``:

* ``requests``: request and response bodies (a response opened with
  ``stream=True`` and not yet read is left alone: reading it here would
  consume the caller's stream);
* ``httpx``: request bodies given as bytes, text, JSON or form data, and the
  response body of a call whose caller reads the whole body anyway
  (``client.get(...)``, ``client.send(request)``; not ``client.stream(...)``
  or ``send(stream=True)``, whose streams are never touched). The contrib
  span ends before the client reads the body, so a small wrapper inside the
  contrib one (:mod:`otel_replay.instrumentation._httpx_body`) buffers such a
  body while the span is open and hands the client a fresh stream of the same
  bytes.

:func:`instrument_http` turns both contrib instrumentations on with these
hooks. Under ``opentelemetry-instrument`` the contrib instrumentors load on
their own; with content capture on, otel-replay's ``opentelemetry_post_instrument``
hook re-instruments them with these hooks (:mod:`otel_replay.instrumentation.autoconf`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry.trace import Span, TracerProvider

from otel_replay import semconv as sc
from otel_replay.instrumentation import _httpx_body
from otel_replay.instrumentation._common import content_enabled, guard
from otel_replay.instrumentation._genai import write_content
from otel_replay.redaction import SCAN_CHARS as _SCAN_CHARS

__all__ = [
    "CONTRIB",
    "contrib_instrumentors",
    "httpx_hooks",
    "instrument_http",
    "instrument_with_hooks",
    "requests_hooks",
    "uninstrument_http",
]


_READ_LIMIT = 4 * _SCAN_CHARS
"""Bytes of a body looked at: no more than redaction scans (UTF-8 is at most 4 bytes a character)."""


def _text(body: Any) -> str | None:
    if body is None or body == b"" or body == "":
        return None
    if isinstance(body, bytes | bytearray):
        return bytes(body[:_READ_LIMIT]).decode("utf-8", "replace")  # a huge body is never decoded whole
    if isinstance(body, str):
        return body[:_SCAN_CHARS]
    return None  # a generator or file: streamed, not ours to consume


def _set(span: Span, attribute: str, body: Any) -> None:
    text = _text(body)
    if text is not None and span.is_recording():
        write_content(span, attribute, text)


def requests_hooks(capture_content: bool | None = None) -> dict[str, Callable[..., None]]:
    """``request_hook`` / ``response_hook`` for ``RequestsInstrumentor().instrument(...)``."""
    capture = content_enabled(capture_content)

    def request_hook(span: Span, request: Any) -> None:
        if capture:
            guard("http request body", _set, span, sc.HTTP_REQUEST_BODY, getattr(request, "body", None))

    def response_hook(span: Span, request: Any, response: Any) -> None:
        if capture and getattr(response, "_content", False) is not False:  # already read: safe to look at
            guard("http response body", _set, span, sc.HTTP_RESPONSE_BODY, response.content)

    return {"request_hook": request_hook, "response_hook": response_hook}


def _httpx_request_body(request: Any) -> Any:
    stream: Any = request[3] if isinstance(request, tuple) else getattr(request, "stream", None)
    if type(stream).__name__ != "ByteStream":
        return None  # a streamed upload: never consumed here
    return b"".join(stream)


def httpx_hooks(capture_content: bool | None = None) -> dict[str, Callable[..., Any]]:
    """``request_hook`` / ``async_request_hook`` for ``HTTPXClientInstrumentor().instrument(...)``."""
    capture = content_enabled(capture_content)

    def request_hook(span: Span, request: Any) -> None:
        if capture:
            guard("http request body", lambda: _set(span, sc.HTTP_REQUEST_BODY, _httpx_request_body(request)))

    async def async_request_hook(span: Span, request: Any) -> None:
        request_hook(span, request)

    def response_hook(span: Span, request: Any, response: Any) -> None:
        body = _httpx_body.buffered_body(response)
        if capture and body is not None:
            guard("http response body", _set, span, sc.HTTP_RESPONSE_BODY, body)

    async def async_response_hook(span: Span, request: Any, response: Any) -> None:
        response_hook(span, request, response)

    return {
        "request_hook": request_hook,
        "async_request_hook": async_request_hook,
        "response_hook": response_hook,
        "async_response_hook": async_response_hook,
    }


CONTRIB: tuple[tuple[str, str, Callable[[bool | None], dict[str, Callable[..., Any]]]], ...] = (
    ("opentelemetry.instrumentation.requests", "RequestsInstrumentor", requests_hooks),
    ("opentelemetry.instrumentation.httpx", "HTTPXClientInstrumentor", httpx_hooks),
)


def contrib_instrumentors() -> Iterator[tuple[Any, Callable[[bool | None], dict[str, Callable[..., Any]]]]]:
    """Each contrib HTTP instrumentor that is installed, with its body hook factory (see :data:`CONTRIB`)."""
    for module_name, class_name, hooks in CONTRIB:
        try:
            instrumentor = getattr(importlib.import_module(module_name), class_name)()
        except ImportError:
            continue
        yield instrumentor, hooks


def instrument_http(*, tracer_provider: TracerProvider | None = None, capture_content: bool | None = None) -> list[str]:
    """Turn on the contrib ``requests`` and ``httpx`` instrumentations (those installed) with the body hooks.

    The contrib instrumentor table is :data:`CONTRIB` (module, class, hook factory).

    Returns the instrumentors turned on. One already on (e.g. by ``opentelemetry-instrument``) is left as it is.
    """
    done = []
    for instrumentor, hooks in contrib_instrumentors():
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrument_with_hooks(instrumentor, hooks, capture_content, tracer_provider=tracer_provider)
            done.append(type(instrumentor).__name__)
    return done


def instrument_with_hooks(
    instrumentor: Any,
    hooks: Callable[[bool | None], dict[str, Callable[..., Any]]],
    capture_content: bool | None,
    **kwargs: Any,
) -> None:
    """Instrument one contrib ``instrumentor`` with its body ``hooks``.

    For httpx with content capture on, the body buffer goes in first, so that
    it runs inside the contrib wrapper, while the contrib span is open.
    """
    if type(instrumentor).__name__ == "HTTPXClientInstrumentor" and content_enabled(capture_content):
        _httpx_body.install()
    instrumentor.instrument(**kwargs, **hooks(capture_content))


def uninstrument_http() -> None:
    """Turn the contrib ``requests`` and ``httpx`` instrumentations off."""
    for instrumentor, _ in contrib_instrumentors():
        if instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()
    _httpx_body.uninstall()  # after the contrib wrapper around it is gone
