"""What ``opentelemetry-instrument`` runs after the SDK is configured and the instrumentors are loaded.

Registered in the ``opentelemetry_post_instrument`` entry-point group:

* :class:`~otel_replay.capture.context.CorrelationSpanProcessor` is added to
  the provider the distro configured, so every span in the process carries
  the correlation, session and agent ids in scope (from OpenTelemetry
  baggage, e.g. propagated in from an upstream service), as it does after
  :func:`otel_replay.configure`. Without an SDK provider (no distro
  installed) there is nothing to add to, and nothing is done.
* With content capture on (``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``),
  the contrib ``requests`` / ``httpx`` instrumentors that loaded on their own
  are re-instrumented with otel-replay's body hooks
  (:mod:`otel_replay.instrumentation.http_bodies`).
"""

from __future__ import annotations

import logging

from opentelemetry import trace

from otel_replay.capture.context import CorrelationSpanProcessor
from otel_replay.instrumentation._common import content_enabled

__all__ = ["add_correlation_processor", "after_instrument"]

_log = logging.getLogger("otel_replay.instrumentation")


def add_correlation_processor() -> None:
    """Add the correlation processor to the global SDK provider, once."""
    provider = trace.get_tracer_provider()
    add = getattr(provider, "add_span_processor", None)
    if add is None:
        _log.debug("otel-replay: no SDK TracerProvider configured; correlation ids are stamped by our spans only")
        return
    if getattr(provider, "_otel_replay_correlation", False):
        return
    add(CorrelationSpanProcessor())
    provider._otel_replay_correlation = True  # type: ignore[attr-defined]


def _rehook_http() -> None:
    from otel_replay.instrumentation.http_bodies import contrib_instrumentors, instrument_with_hooks

    for instrumentor, hooks in contrib_instrumentors():
        if instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()
            instrument_with_hooks(instrumentor, hooks, True)


def after_instrument() -> None:
    """The ``opentelemetry_post_instrument`` hook: correlation ids everywhere; HTTP bodies when capture is on."""
    add_correlation_processor()
    if content_enabled(None):
        try:
            _rehook_http()
        except Exception as exc:  # never break the application's start-up
            _log.warning("otel-replay: could not add the HTTP body hooks: %s", exc)
