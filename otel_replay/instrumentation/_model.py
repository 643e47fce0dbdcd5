"""The wrapt wrapper around a client's model-call method, sync and async, streaming and not.

Each provider describes its method with a :class:`ModelMethod` (how to read
the request, the response and a stream); the wrappers here do the rest:

1. start a CLIENT span ``{operation} {model}`` as a child of the current span
   (inheriting the decision's record id), unless suppressed;
2. run the call through the seam (:func:`otel_replay._seam.through`);
3. on an exception: ``error.type``, status ERROR, the exception event, re-raise;
4. on a result: a stream comes back wrapped so the span ends when the stream
   does; a raw response (``with_raw_response``) is parsed through the client's
   own cached ``parse()``; a ``with_streaming_response`` response of a
   non-streamed call ends the span at the headers (its body is the caller's
   to read), one of a streamed call hands out its stream from ``parse()``
   observed like a plain stream; anything else is read for the response
   attributes.

Beside another GenAI instrumentation on the same client (either order), ours
still records the call: beneath the peer's span when the peer wraps outside
ours, around it when the peer's wrapper sits beneath ours (always so for
OpenInference, which wraps the client's lower ``request``). Ours carries the
decision's record id (from the enclosing ``audit()`` when the peer's span
between them has none) and the tool calls; ``model_calls`` keeps ours and
leaves out the peer's span of the same trace with the same response id, at any
depth, so a call is one row.

Every extraction step is guarded: if it fails, the user's call proceeds with
the same result or exception, and the failure is logged at debug level.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry import context
from opentelemetry.trace import Span, SpanKind, Tracer

from otel_replay import semconv as sc
from otel_replay._seam import Call, through, through_async
from otel_replay._seam import current as current_mode
from otel_replay.instrumentation._common import SUPPRESS_GENAI_KEY, Started, begin, end_failed, guard
from otel_replay.instrumentation._genai import Input, request_attributes, write_input
from otel_replay.instrumentation._streams import (
    Accumulator,
    AsyncStreamProxy,
    StreamEnd,
    StreamResponse,
    SyncStreamProxy,
)

__all__ = ["ModelMethod", "async_wrapper", "sync_wrapper"]

_log = logging.getLogger("otel_replay.instrumentation")

_RAW_HEADER: Final = "X-Stainless-Raw-Response"
HTTP_STATUS: Final = "http.response.status_code"


@dataclass(frozen=True)
class ModelMethod:
    """How to observe one client method."""

    provider: str
    seam_name: str
    record: Callable[[Span, Any, bool], None]
    """Write a complete response object's attributes (and content when capture is on)."""
    accumulator: Callable[[bool], Accumulator]
    """A fresh accumulator for a stream (the flag: capture content)."""
    input_content: Callable[[Mapping[str, Any]], Input]
    """The request content to capture, in the conventions' shapes: system instructions, messages, tools."""
    streams: Callable[[Mapping[str, Any]], bool] = lambda kwargs: kwargs.get("stream") is True


def _start(
    tracer: Tracer, method: ModelMethod, instance: Any, kwargs: Mapping[str, Any], capture: bool
) -> Started | None:
    attrs = request_attributes(method.provider, kwargs, getattr(instance, "_client", None))
    model = attrs.get(sc.GEN_AI_REQUEST_MODEL)
    name = f"{sc.GEN_AI_OP_CHAT} {model}" if model else sc.GEN_AI_OP_CHAT
    started = begin(tracer, name, SpanKind.CLIENT, attrs, model_layer=True)
    if started is not None and capture:
        span = started[0]
        guard("input content", lambda: write_input(span, method.input_content(kwargs)))
    return started


def _raw_mode(kwargs: Mapping[str, Any]) -> str | None:
    headers = kwargs.get("extra_headers")
    if isinstance(headers, Mapping):
        mode = headers.get(_RAW_HEADER)
        return str(mode) if mode is not None else None
    return None


def _settle(span: Span, method: ModelMethod, kwargs: Mapping[str, Any], result: Any, capture: bool, aio: bool) -> Any:
    """Record a result and end the span, or hand back a stream proxy that will."""
    mode = _raw_mode(kwargs)
    if mode is None and method.streams(kwargs):
        try:
            end = StreamEnd(span, method.accumulator(capture), capture=capture)
            return AsyncStreamProxy(result, end) if aio else SyncStreamProxy(result, end)
        except Exception as exc:
            _log.debug("otel-replay: the stream could not be observed; it is returned as is: %r", exc)
            span.set_attribute(sc.STREAM_END, f"unobserved: {type(exc).__name__}")
            span.end()
            return result
    if mode is None:
        guard("response extraction", method.record, span, result, capture)
    elif method.streams(kwargs) and callable(getattr(result, "parse", None)):
        # with_streaming_response / with_raw_response of a stream: parse() gives the stream, which the span
        # follows to its end like a plain stream's; closing the response unread ends the span too
        try:
            end = StreamEnd(span, method.accumulator(capture), capture=capture)
            status = getattr(result, "status_code", None)
            if isinstance(status, int):
                span.set_attribute(HTTP_STATUS, status)
            return StreamResponse(result, end, aio=aio)
        except Exception as exc:
            _log.debug("otel-replay: the streamed response could not be observed; it is returned as is: %r", exc)
            span.set_attribute(sc.STREAM_END, f"unobserved: {type(exc).__name__}")
            span.end()
            return result
    else:
        status = getattr(result, "status_code", None)
        if isinstance(status, int):
            span.set_attribute(HTTP_STATUS, status)
        parse = getattr(result, "parse", None)
        if mode in ("true", "raw") and not method.streams(kwargs) and not inspect.iscoroutinefunction(parse):
            # with_raw_response: the body is already read and the client caches parse(), so the caller's own
            # parse() costs nothing more. (An async parse() is left to the caller: it cannot be awaited here.)
            guard("raw response extraction", lambda: method.record(span, result.parse(), capture))
    span.end()
    return result


def _span_for(
    tracer: Tracer, method: ModelMethod, instance: Any, kwargs: dict[str, Any], capture: bool
) -> Started | None:
    """The call's span and context token, or ``None`` when the span could not start (the call goes on unobserved).

    Another instrumentation wrapped beneath ours (installed first) records its own span under ours: both stay,
    and the views keep ours, which carries the decision's record id and the tool calls.
    """
    try:
        return _start(tracer, method, instance, kwargs, capture)
    except Exception as exc:
        _log.debug("otel-replay: span start failed; the call proceeds unrecorded there: %r", exc)
        return None


def sync_wrapper(tracer: Tracer, method: ModelMethod, capture: bool) -> Callable[..., Any]:
    """A wrapt wrapper for a synchronous model-call method.

    With no seam mode installed (the common case) the call is made directly: no :class:`Call` is built and no
    closure allocated; under a mode it goes through :func:`through` exactly as before.
    """
    seam_name = method.seam_name

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if context.get_value(SUPPRESS_GENAI_KEY):
            return wrapped(*args, **kwargs)  # an outer layer of ours records this call
        started = _span_for(tracer, method, instance, kwargs, capture)
        seamed = current_mode() is not None
        if started is None:
            if seamed:
                return through(Call("model", seam_name, kwargs), lambda: wrapped(*args, **kwargs))
            return wrapped(*args, **kwargs)
        try:
            if seamed:
                result = through(Call("model", seam_name, kwargs), lambda: wrapped(*args, **kwargs))
            else:
                result = wrapped(*args, **kwargs)
        except BaseException as exc:
            end_failed(started, exc, capture)
            raise
        context.detach(started[1])
        return _settle(started[0], method, kwargs, result, capture, aio=False)

    return wrapper


def async_wrapper(tracer: Tracer, method: ModelMethod, capture: bool) -> Callable[..., Any]:
    """A wrapt wrapper for an ``async def`` model-call method (the seam is skipped as in :func:`sync_wrapper`)."""
    seam_name = method.seam_name

    async def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if context.get_value(SUPPRESS_GENAI_KEY):
            return await wrapped(*args, **kwargs)
        started = _span_for(tracer, method, instance, kwargs, capture)
        seamed = current_mode() is not None
        if started is None:
            if seamed:
                return await through_async(Call("model", seam_name, kwargs), lambda: wrapped(*args, **kwargs))
            return await wrapped(*args, **kwargs)
        try:
            if seamed:
                result = await through_async(Call("model", seam_name, kwargs), lambda: wrapped(*args, **kwargs))
            else:
                result = await wrapped(*args, **kwargs)
        except BaseException as exc:
            end_failed(started, exc, capture)
            raise
        context.detach(started[1])
        return _settle(started[0], method, kwargs, result, capture, aio=True)

    return wrapper
