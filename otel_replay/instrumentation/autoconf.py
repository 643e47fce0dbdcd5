"""What ``opentelemetry-instrument`` runs after the SDK is configured and the instrumentors are loaded.

Registered in the ``opentelemetry_post_instrument`` entry-point group:

* :class:`~otel_replay.capture.context.CorrelationSpanProcessor` is added to
  the provider the distro configured, so every span in the process carries
  the correlation, session and agent ids in scope (from OpenTelemetry
  baggage, e.g. propagated in from an upstream service), as it does after
  :func:`otel_replay.configure`. Without an SDK provider (no distro
  installed) there is nothing to add to, and nothing is done.
* A malformed otel-replay setting met while the process starts (the
  exporter's, the recording's, and ``OTEL_REPLAY_REDACT_*`` here, whatever the
  exporter) stops it with one line on stderr and exit code 1
  (:func:`refuse_start`): OpenTelemetry's start-up would log it and run
  the application unrecorded, and a bad redaction pattern would raise out of
  the application's first span with a URL (the correlation processor redacts it).
* With content capture on (``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``),
  the contrib ``requests`` / ``httpx`` instrumentors that loaded on their own
  are re-instrumented with otel-replay's body hooks
  (:mod:`otel_replay.instrumentation.http_bodies`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn

from opentelemetry import trace

from otel_replay import redaction
from otel_replay.capture.context import CorrelationSpanProcessor
from otel_replay.errors import OtelReplayError
from otel_replay.instrumentation._common import content_enabled

__all__ = ["STARTUP_ERROR", "add_correlation_processor", "after_instrument", "refuse_start", "starting_up"]

_log = logging.getLogger("otel_replay.instrumentation")

STARTUP_ERROR = 1
"""Exit code of a process stopped at start by a malformed otel-replay setting (a user error, as in the CLI)."""


def starting_up() -> bool:
    """True while ``opentelemetry-instrument``'s ``sitecustomize`` runs: it logs errors and starts the application."""
    module = sys.modules.get("sitecustomize")
    initializing = getattr(getattr(module, "__spec__", None), "_initializing", False)  # set by importlib mid-import
    return bool(initializing) and "auto_instrumentation" in str(getattr(module, "__file__", ""))


def refuse_start(message: str) -> NoReturn:
    """Stop the starting process: ``message`` as one line on stderr, exit :data:`STARTUP_ERROR`.

    Raised during ``sitecustomize`` an exception is logged and the application
    runs unrecorded, and ``SystemExit`` there is a fatal interpreter error with
    a traceback: nothing of the application has run yet, so the process ends here.
    """
    line = " ".join(message.split())
    with contextlib.suppress(OSError):
        sys.stderr.write(f"otel-replay: {line}; not starting\n")
        sys.stderr.flush()
    os._exit(STARTUP_ERROR)


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
    # optional dependency: the contrib HTTP instrumentors, looked up only when hooks are re-applied
    from otel_replay.instrumentation.http_bodies import contrib_instrumentors, instrument_with_hooks

    for instrumentor, hooks in contrib_instrumentors():
        if instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()
            instrument_with_hooks(instrumentor, hooks, True)


def after_instrument() -> None:
    """The ``opentelemetry_post_instrument`` hook: correlation ids everywhere; HTTP bodies when capture is on.

    Raises:
        ConfigError: ``OTEL_REPLAY_REDACT_*`` is malformed, when called outside
            ``opentelemetry-instrument``'s start (there the process stops instead).

    """
    try:
        redaction.check_settings()  # read now: the correlation processor redacts URLs as every span starts
    except OtelReplayError as exc:
        if not starting_up():
            raise
        refuse_start(f"cannot redact spans: {exc}")
    add_correlation_processor()
    if content_enabled(None):
        try:
            _rehook_http()
        except Exception as exc:  # never break the application's start-up
            _log.warning("otel-replay: could not add the HTTP body hooks: %s", exc)
