"""Correlation, session and agent ids carried in OpenTelemetry context.

The ids live in OpenTelemetry *baggage*, so they follow the context wherever
it goes: into child threads and asyncio tasks that copy context, and across
processes when the W3C baggage propagator is configured (the SDK default).
:class:`CorrelationSpanProcessor` stamps them on every span started in scope,
including spans made by other instrumentations, so nobody has to thread an id
through by hand.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry import baggage, context
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from otel_replay import semconv as sc

__all__ = [
    "CorrelationIds",
    "CorrelationSpanProcessor",
    "correlation",
    "current_ids",
    "redacted_urls",
    "scope_attributes",
    "session",
]

_KEYS = (
    (sc.BAGGAGE_CORRELATION_ID, sc.CORRELATION_ID),
    (sc.BAGGAGE_SESSION_ID, sc.SESSION_ID),
    (sc.BAGGAGE_AGENT_ID, sc.AGENT_ID),
)


@dataclass(frozen=True)
class CorrelationIds:
    """The ids in scope (each may be ``None``)."""

    correlation_id: str | None = None
    session_id: str | None = None
    agent_id: str | None = None


def current_ids(ctx: Context | None = None) -> CorrelationIds:
    """The correlation, session and agent ids in ``ctx`` (default: the current context)."""
    values = baggage.get_all(ctx)
    return CorrelationIds(
        _str(values.get(sc.BAGGAGE_CORRELATION_ID)),
        _str(values.get(sc.BAGGAGE_SESSION_ID)),
        _str(values.get(sc.BAGGAGE_AGENT_ID)),
    )


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


@contextmanager
def _scope(values: dict[str, str | None]) -> Iterator[None]:
    ctx = context.get_current()
    for key, value in values.items():
        if value is not None:
            ctx = baggage.set_baggage(key, str(value), ctx)
    token = context.attach(ctx)
    try:
        yield
    finally:
        context.detach(token)


@contextmanager
def correlation(
    correlation_id: str | None = None, *, session_id: str | None = None, agent_id: str | None = None
) -> Iterator[str]:
    """Put a correlation id (a new UUID when none is given) in scope; yields it.

    Every span started inside, in this thread or in tasks/threads that copy
    the context, carries ``replay.correlation_id``.
    """
    cid = correlation_id or str(uuid.uuid4())
    with _scope({sc.BAGGAGE_CORRELATION_ID: cid, sc.BAGGAGE_SESSION_ID: session_id, sc.BAGGAGE_AGENT_ID: agent_id}):
        yield cid


@contextmanager
def session(session_id: str | None = None, *, agent_id: str | None = None) -> Iterator[str]:
    """Put a session id (a new UUID when none is given) and optionally an agent id in scope."""
    sid = session_id or str(uuid.uuid4())
    with _scope({sc.BAGGAGE_SESSION_ID: sid, sc.BAGGAGE_AGENT_ID: agent_id}):
        yield sid


def scope_attributes(existing: Mapping[str, Any] | None, ctx: Context | None = None) -> dict[str, str]:
    """The id attributes the scope in ``ctx`` adds to a span that has ``existing`` attributes."""
    values = baggage.get_all(ctx)
    if not values:
        return {}
    added = {}
    for bag_key, attr_key in _KEYS:
        value = values.get(bag_key)
        if value and (existing is None or attr_key not in existing):
            added[attr_key] = str(value)
    return added


_URL_ATTRIBUTES = ("url.full", "http.url")
"""Where HTTP client instrumentations put the request URL (current and older semantic conventions)."""


def redacted_urls(attributes: Mapping[str, Any] | None) -> dict[str, str]:
    """The URL attributes of a span whose value holds a secret, with the secret replaced by ``[REDACTED]``.

    The contrib HTTP instrumentations keep a query string such as
    ``?api_key=...`` or ``?token=...`` in ``url.full`` (they redact only a
    few signature parameters); this covers the rest with the one redaction
    engine (:func:`otel_replay.redaction.redact`).
    """
    if not attributes:
        return {}
    out = {}
    for key in _URL_ATTRIBUTES:
        value = attributes.get(key)
        if isinstance(value, str) and ("?" in value or "@" in value):
            from otel_replay.redaction import redact  # only for a URL that may hold a secret

            cleaned = redact(value)
            if cleaned != value:
                out[key] = cleaned
    return out


class CorrelationSpanProcessor(SpanProcessor):
    """Stamp the ids in scope onto every span as it starts, and redact secrets from its URL attributes.

    An id already set on the span (passed explicitly) is left alone. A secret
    in ``url.full`` / ``http.url`` (``?api_key=``, ``?token=``, a password in
    the authority) is replaced by ``[REDACTED]`` before the span is exported.
    Add it to your own ``TracerProvider`` with ``provider.add_span_processor(...)``;
    :func:`otel_replay.configure` and ``opentelemetry-instrument`` add it for you.
    """

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Copy the baggage ids into span attributes; redact secrets from URL attributes."""
        scope = span.instrumentation_scope
        if scope is not None and scope.name == sc.INSTRUMENTATION_NAME:
            return  # otel-replay's own spans are stamped when they are created
        added = scope_attributes(span.attributes, parent_context)
        added.update(redacted_urls(span.attributes))
        if added:
            span.set_attributes(added)

    def on_end(self, span: ReadableSpan) -> None:
        """Nothing to do at span end."""

    def shutdown(self) -> None:
        """Nothing to release."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered."""
        return True
