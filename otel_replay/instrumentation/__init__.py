"""Auto-instrumentation: wrapt-based instrumentors for LLM clients, agent tools and thread pools.

==============================  =======================================  ==============================
instrumentor                    wraps                                    entry point
==============================  =======================================  ==============================
``OpenAIInstrumentor``          ``chat.completions.create``,             ``otel_replay_openai``
                                ``responses.create`` (sync + async)
``AnthropicInstrumentor``       ``messages.create``, ``messages.stream``  ``otel_replay_anthropic``
``ThreadContextInstrumentor``   ``ThreadPoolExecutor.submit``            ``otel_replay_threads``
==============================  =======================================  ==============================

Each is an OpenTelemetry ``BaseInstrumentor``: ``opentelemetry-instrument``
loads them through the ``opentelemetry_instrumentor`` entry-point group, and
``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=otel_replay_openai`` turns one off.
In code, :func:`instrument` turns on every one whose client library is
installed. Tools are declared with :func:`tool` or wrapped in place with
:func:`wrap_tool`; :func:`invoke_agent` names the agent running (an
``invoke_agent {name}`` span whose model and tool calls carry
``gen_ai.agent.name``). No client library is imported until an instrumentor runs,
and no instrumentor until its name is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from otel_replay import _lazy

if TYPE_CHECKING:  # what the names below resolve to on first use, for type checkers
    from opentelemetry.trace import TracerProvider

    from otel_replay.instrumentation.agent import invoke_agent
    from otel_replay.instrumentation.anthropic_client import AnthropicInstrumentor
    from otel_replay.instrumentation.openai_client import OpenAIInstrumentor
    from otel_replay.instrumentation.threads import ThreadContextInstrumentor
    from otel_replay.instrumentation.tools import tool, unwrap_tool, wrap_tool

__all__ = [
    "AnthropicInstrumentor",
    "OpenAIInstrumentor",
    "ThreadContextInstrumentor",
    "instrument",
    "invoke_agent",
    "tool",
    "uninstrument",
    "unwrap_tool",
    "wrap_tool",
]

_LAZY = {
    "AnthropicInstrumentor": ".anthropic_client",
    "invoke_agent": ".agent",
    "OpenAIInstrumentor": ".openai_client",
    "ThreadContextInstrumentor": ".threads",
    "tool": ".tools",
    "unwrap_tool": ".tools",
    "wrap_tool": ".tools",
}
"""Public names imported on first use: name -> module."""

__getattr__, __dir__ = _lazy.exports(__name__, _LAZY, submodules=True)


def _installed(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def _available() -> list[Any]:
    # Imported here for start-up cost: the instrumentors load OpenTelemetry's instrumentation
    # package (and its requirement parsing), which only instrument() and uninstrument() need.
    from otel_replay.instrumentation.anthropic_client import AnthropicInstrumentor
    from otel_replay.instrumentation.openai_client import OpenAIInstrumentor
    from otel_replay.instrumentation.threads import ThreadContextInstrumentor

    found: list[Any] = [ThreadContextInstrumentor()]
    if _installed("openai"):
        found.append(OpenAIInstrumentor())
    if _installed("anthropic"):
        found.append(AnthropicInstrumentor())
    return found


def instrument(*, tracer_provider: TracerProvider | None = None, capture_content: bool | None = None) -> list[str]:
    """Turn on every instrumentor whose library is installed; returns their class names.

    ``capture_content`` defaults to ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``.
    Calling it again is a no-op (each instrumentor instruments once).
    """
    names = []
    for instrumentor in _available():
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(tracer_provider=tracer_provider, capture_content=capture_content)
        names.append(type(instrumentor).__name__)
    return names


def uninstrument() -> None:
    """Turn every instrumentor off again; the client methods are the originals afterwards."""
    for instrumentor in _available():
        if instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()
