"""``invoke_agent``: name the agent that is running, as an OpenTelemetry GenAI ``invoke_agent`` span.

::

    with otel_replay.invoke_agent("pricer", agent_id="pricer-eu-7"):
        client.chat.completions.create(...)   # a child span carrying gen_ai.agent.name = "pricer"

The span is ``invoke_agent {name}`` (INTERNAL, ``gen_ai.operation.name =
invoke_agent``) with ``gen_ai.agent.name``, ``gen_ai.agent.id`` and
``gen_ai.agent.description`` when given. Every model and tool span started
inside — in this thread, in asyncio tasks, and in pool threads under
``ThreadContextInstrumentor`` — is its child and carries
``gen_ai.agent.name``; an agent id given here is put in scope like
``otel_replay.session(agent_id=...)``, so decisions and other spans get it as
``replay.agent_id``. Agents nest: the innermost name is the one stamped. An
exception leaving the block marks the span as an error (its message kept,
redacted, only with content capture on) and propagates unchanged.

The name stays in this process (a context value, not baggage): it is not sent
to the services the agent calls.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import baggage, context
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, TracerProvider

from otel_replay import semconv as sc
from otel_replay.instrumentation._common import AGENT_NAME_KEY, begin, content_enabled, end_error, scope_ids, tracer_for

__all__ = ["invoke_agent"]

INVOKE_AGENT = "invoke_agent"
"""The GenAI operation name of an agent run."""


@contextmanager
def invoke_agent(
    name: str,
    *,
    agent_id: str | None = None,
    description: str | None = None,
    tracer_provider: TracerProvider | None = None,
) -> Iterator[Span]:
    """Run the block as agent ``name``: an ``invoke_agent {name}`` span whose model and tool calls carry the name.

    Yields the span (non-recording when instrumentation is suppressed). Raises
    ``ValueError`` for an empty or non-string ``name`` or ``agent_id``.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"invoke_agent: the agent name must be a non-empty string, got {name!r}")
    if agent_id is not None and (not isinstance(agent_id, str) or not agent_id):
        raise ValueError(f"invoke_agent: agent_id must be a non-empty string, got {agent_id!r}")
    ctx = context.set_value(AGENT_NAME_KEY, name)
    if agent_id is not None:
        ctx = baggage.set_baggage(sc.BAGGAGE_AGENT_ID, agent_id, ctx)
    scope_token = context.attach(ctx)
    try:
        attributes: dict[str, Any] = {sc.GEN_AI_OPERATION_NAME: INVOKE_AGENT}
        scope_ids(attributes)
        if description:
            attributes[sc.GEN_AI_AGENT_DESCRIPTION] = description
        started = begin(
            tracer_for("agent", tracer_provider),
            f"{INVOKE_AGENT} {name}",
            SpanKind.INTERNAL,
            attributes,
            model_layer=False,
        )
        if started is None:  # suppressed: run the block unrecorded
            yield INVALID_SPAN
            return
        span, span_token = started
        try:
            yield span
        except BaseException as exc:
            context.detach(span_token)
            end_error(span, exc, content_enabled(None))  # the message is content: redacted, or type only
            raise
        context.detach(span_token)
        span.end()
    finally:
        context.detach(scope_token)
