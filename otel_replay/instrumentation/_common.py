"""What every instrumentor shares: its tracer, starting a span in the decision tree, suppression, safety.

* A span started by an instrumentor inside ``audit()`` is a child of the
  decision (it starts in the current context) and inherits the decision's
  ``replay.record.id`` from its parent span, so it lands in ``model_calls`` /
  ``acts`` under that record. A tool span passes the id on to model calls
  made inside the tool.
* Suppression: while one of our model spans is current, a second layer of
  ours (a framework over the client) adds no second model span; a peer
  instrumentation's model span does not suppress ours (ours carries the
  decision, the views drop the peer's repeat). The standard
  ``suppress_instrumentation()`` key is honoured too.
* Safety: :func:`guard` runs attribute extraction so that an internal error is
  logged at debug level and never reaches the user's call.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from contextvars import Token
from typing import Any, Final

import wrapt
from opentelemetry import baggage, context, trace
from opentelemetry.context import Context
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer, TracerProvider

from otel_replay import semconv as sc
from otel_replay import settings
from otel_replay.capture.audit import current_decision
from otel_replay.redaction import redact_error

__all__ = [
    "AGENT_NAME_KEY",
    "SUPPRESS_GENAI_KEY",
    "PROXY",
    "Layers",
    "Started",
    "begin",
    "content_enabled",
    "end_error",
    "guard",
    "scope_ids",
    "tracer_for",
]

_log = logging.getLogger("otel_replay.instrumentation")

VERSION: Final = "0.1.0"

AGENT_NAME_KEY: Final = context.create_key("otel_replay-agent-name")
"""Context key holding the name of the agent running (set by ``invoke_agent``), stamped as ``gen_ai.agent.name``."""

SUPPRESS_GENAI_KEY: Final = context.create_key("otel_replay-suppress-genai")
"""Context key set while one of our model spans is current: inner layers add no second model span."""

_MODEL_OPERATIONS: Final = frozenset({"chat", "text_completion", "generate_content", "embeddings"})

Started = tuple[Span, Token[Context]]
"""A started span and the context token to detach when the call returns."""


PROXY: Final = getattr(wrapt, "BaseObjectProxy", wrapt.ObjectProxy)
"""What every wrapt wrapper is an instance of (wrapt 2 puts ``FunctionWrapper`` and bound methods under
``BaseObjectProxy``, outside ``ObjectProxy``)."""


class Layers:
    """The wrapt layers one instrumentor installed, so that uninstrumenting takes out exactly those.

    OpenTelemetry's ``unwrap`` replaces whatever is outermost, so with another
    instrumentation wrapped on top of ours it would strip theirs and leave ours.
    Here our own layer is found in the chain and spliced out; the others stay.

    :meth:`wrap_when_imported` leaves a module the application has not
    imported unimported (``openai`` costs ~0.65 s of CPU, ``anthropic`` ~1.5 s):
    its layers go in when the application first imports it. A post-import hook
    cannot be taken back, so :meth:`remove` retires the hooks registered before
    it, and a retired hook installs nothing.
    """

    def __init__(self) -> None:
        """Nothing installed yet."""
        self._installed: list[tuple[Any, str, Any]] = []
        self._generation = 0  # bumped by remove(): hooks from an earlier generation are retired

    def __bool__(self) -> bool:
        """Whether any layer is installed."""
        return bool(self._installed)

    def wrap(self, module: str, target: str, wrapper: Callable[..., Any]) -> None:
        """``wrapt.wrap_function_wrapper(module, target, wrapper)``, remembering the layer it added."""
        wrapt.wrap_function_wrapper(module, target, wrapper)
        owner: Any = importlib.import_module(module)
        path, _, attr = target.rpartition(".")
        for part in path.split(".") if path else ():
            owner = getattr(owner, part)
        self._installed.append((owner, attr, vars(owner)[attr]))

    def wrap_when_imported(self, module: str, wrappers: Mapping[str, Callable[..., Any]]) -> None:
        """:meth:`wrap` each ``target: wrapper`` of ``module``: at once if it is imported, else at its first import.

        A late wrap runs inside the application's ``import``: a failure there is
        logged and the module's layers taken out again, never raised into the import.
        """
        if module in sys.modules:
            for target, wrapper in wrappers.items():
                self.wrap(module, target, wrapper)
            return
        generation = self._generation

        def install(_module: Any) -> None:
            if generation != self._generation:
                return  # uninstrumented before the import: this hook's instrumentation is no longer active
            done = len(self._installed)
            try:
                for target, wrapper in wrappers.items():
                    self.wrap(module, target, wrapper)
            except Exception as exc:
                _log.warning("otel-replay: could not wrap %s on import; its calls are not traced: %r", module, exc)
                self._remove_after(done)

        wrapt.register_post_import_hook(install, module)

    def remove(self) -> None:
        """Take every layer this instance added out of its chain, newest first; retire hooks not yet run."""
        self._generation += 1
        self._remove_after(0)

    def _remove_after(self, keep: int) -> None:
        """Take out the layers installed after the first ``keep``, newest first."""
        while len(self._installed) > keep:
            owner, attr, layer = self._installed.pop()
            current = vars(owner).get(attr)
            if current is layer:
                setattr(owner, attr, layer.__wrapped__)
                continue
            while isinstance(current, PROXY):  # someone wrapped over ours: splice ours out
                inner = current.__wrapped__
                if inner is layer:
                    current.__wrapped__ = layer.__wrapped__
                    break
                current = inner


def tracer_for(library: str, tracer_provider: TracerProvider | None) -> Tracer:
    """The tracer an instrumentor records through (scope ``otel_replay.instrumentation.<library>``)."""
    return trace.get_tracer(f"{sc.INSTRUMENTATION_SCOPE_PREFIX}.{library}", VERSION, tracer_provider)


_CONTENT_ON: Final = frozenset({"true", "1", "yes", "on", "span_only", "span_and_event"})
"""Values of the GenAI content switch that put content on spans: a yes, or upstream's span modes."""
_CONTENT_OFF: Final = frozenset({"", "false", "0", "no", "off", "no_content", "event_only"})
"""Values that keep content off spans (``event_only``: upstream puts it in log events, which we do not emit)."""
_content_warned: set[str] = set()


def content_enabled(explicit: bool | None) -> bool:
    """Whether to capture content: the keyword argument if given, else the GenAI environment switch.

    A privacy switch fails closed: only an explicit yes (``true``, ``1``,
    ``yes``, ``on``) or one of the OpenTelemetry GenAI utilities' span modes
    (``SPAN_ONLY``, ``SPAN_AND_EVENT``) turns capture on; their ``NO_CONTENT``
    and anything unknown keep it off (an unknown value is logged once).
    """
    if explicit is not None:
        return bool(explicit)
    raw = (settings.env_text(settings.CAPTURE_MESSAGE_CONTENT) or "").strip().lower()
    if raw in _CONTENT_ON:
        return True
    if raw not in _CONTENT_OFF and raw not in _content_warned:
        _content_warned.add(raw)
        _log.warning(
            "otel-replay: %s=%r is not a known value; content is not captured (true or SPAN_ONLY turns it on)",
            settings.CAPTURE_MESSAGE_CONTENT,
            raw,
        )
    return False


def begin(
    tracer: Tracer,
    name: str,
    kind: SpanKind,
    attributes: dict[str, Any],
    *,
    model_layer: bool,
    links: Sequence[Link] = (),
) -> Started | None:
    """Start a span as a child of the current one and make it current; ``None`` when suppressed.

    ``model_layer`` spans (model calls) are suppressed under another
    instrumentation's model span, and suppress model spans beneath them (the
    model wrappers check :data:`SUPPRESS_GENAI_KEY` before calling this).
    """
    if not is_instrumentation_enabled():
        return None
    parent = trace.get_current_span()
    parent_attrs: Mapping[str, Any] | None = getattr(parent, "attributes", None)
    if parent_attrs:
        if model_layer and _ours(parent) and _is_model_span(parent, parent_attrs):
            return None  # one of our model spans is current (audit's d.model()): one model span per call
        record_id = parent_attrs.get(sc.RECORD_ID)
        if record_id is not None and sc.RECORD_ID not in attributes:
            attributes[sc.RECORD_ID] = record_id
    if sc.RECORD_ID not in attributes:
        # a peer instrumentor's span (its model call, its agent step) between the decision and this call carries
        # no record id: the decision whose audit() block runs this code is the one (the views keep our model
        # span and drop a peer's that repeats it by response id, so the call stays one row, with the decision)
        decision = current_decision()
        if decision is not None:
            attributes[sc.RECORD_ID] = decision.record_id
    span = tracer.start_span(name, kind=kind, attributes=attributes, links=links)
    ctx: Context = trace.set_span_in_context(span)
    if model_layer:
        ctx = context.set_value(SUPPRESS_GENAI_KEY, True, ctx)
    return span, context.attach(ctx)


def _is_model_span(span: Span, attributes: Mapping[str, Any]) -> bool:
    return attributes.get(sc.GEN_AI_OPERATION_NAME) in _MODEL_OPERATIONS and span.is_recording()


def _ours(span: Span) -> bool:
    """Whether ``span`` was started by otel-replay (the decision tracer or one of the instrumentors)."""
    scope = getattr(span, "instrumentation_scope", None)
    name = getattr(scope, "name", None)
    return name == sc.INSTRUMENTATION_NAME or (
        isinstance(name, str) and name.startswith(sc.INSTRUMENTATION_SCOPE_PREFIX + ".")
    )


def scope_ids(attributes: dict[str, Any]) -> None:
    """Add the ids in scope: correlation/session/agent, and the GenAI conversation, agent id and agent name.

    Stamped here as well as by ``CorrelationSpanProcessor``, so the ids are on
    the span even under ``opentelemetry-instrument``, where that processor is
    not installed. The agent name (from ``invoke_agent``) is a context value, not baggage.
    """
    agent_name = context.get_value(AGENT_NAME_KEY)
    if agent_name:
        attributes[sc.GEN_AI_AGENT_NAME] = agent_name
    values = baggage.get_all()
    if not values:
        return
    correlation_id = values.get(sc.BAGGAGE_CORRELATION_ID)
    if correlation_id:
        attributes[sc.CORRELATION_ID] = str(correlation_id)
    session_id = values.get(sc.BAGGAGE_SESSION_ID)
    if session_id:
        attributes[sc.SESSION_ID] = attributes[sc.GEN_AI_CONVERSATION_ID] = str(session_id)
    agent_id = values.get(sc.BAGGAGE_AGENT_ID)
    if agent_id:
        attributes[sc.AGENT_ID] = attributes[sc.GEN_AI_AGENT_ID] = str(agent_id)


def end_error(span: Span, exc: BaseException, capture: bool = False) -> None:
    """Mark ``span`` as failed by ``exc`` and end it.

    ``error.type`` and status ERROR always. The message is content (a tool's ``ValueError`` can carry the
    card number it refused, a client's error the header it sent): with content capture off (``capture``
    false) only the type is kept, in an ``exception`` event holding ``exception.type`` alone, as the GenAI
    conventions advise; with capture on, the message is kept redacted (:func:`otel_replay.redaction.redact_error`)
    and the stack trace is not stored.
    """
    try:
        kind = type(exc)
        span.set_attribute(sc.ERROR_TYPE, kind.__qualname__)
        message = redact_error(exc, capture=capture)
        event: dict[str, Any] = {"exception.type": kind.__qualname__}
        if message is not None:
            event["exception.message"] = message
        span.add_event("exception", event)
        span.set_status(Status(StatusCode.ERROR, kind.__name__ if message is None else f"{kind.__name__}: {message}"))
    except Exception as inner:  # pragma: no cover - the SDK does not raise here
        _log.debug("otel-replay: could not record an error on a span: %s", inner)
    span.end()


def end_failed(started: Started | None, exc: BaseException, capture: bool = False) -> None:
    """The call raised: detach the span's context (``started`` is ``(span, token)``) and end it as an error.

    ``capture``: content capture is on, the error's message is kept redacted (see :func:`end_error`).
    """
    if started is not None:
        context.detach(started[1])
        end_error(started[0], exc, capture)


def guard(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(*args)``; an exception is logged at debug level and ``None`` returned."""
    try:
        return fn(*args)
    except Exception as exc:
        _log.debug("otel-replay: %s failed; the call proceeds unrecorded there: %r", what, exc)
        return None
