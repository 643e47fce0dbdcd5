"""Record a whole process: ``OTEL_REPLAY_RECORD_SESSION=<id> opentelemetry-instrument python agent.py``.

:class:`RecordingInstrumentor` is an OpenTelemetry instrumentor (entry point
group ``opentelemetry_instrumentor``): when ``OTEL_REPLAY_RECORD_SESSION`` is
set, instrumenting starts a recording of that session for the whole process
(``auto`` picks a new id), and the recording is finished - its final, sealed
chunk written - when the process exits or the instrumentor is uninstrumented.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from otel_replay import settings
from otel_replay.capture.context import session as session_scope
from otel_replay.capture.recorder import get_recorder
from otel_replay.errors import OtelReplayError
from otel_replay.instrumentation.autoconf import refuse_start, starting_up
from otel_replay.records import new_id
from otel_replay.rerun.interceptor import Interceptor
from otel_replay.rerun.record import RecordMode

__all__ = ["RecordingInstrumentor", "start_process_recording", "stop_process_recording"]

_lock = threading.Lock()
_running: tuple[RecordMode, Interceptor, Any] | None = None


def start_process_recording(session_id: str | None = None) -> RecordMode:
    """Start recording the whole process as ``session_id`` (a new id for ``None`` or ``auto``).

    Raises:
        ConfigError: a malformed setting (the signing key, ``OTEL_REPLAY_RERUN_MAX_BODY``),
            found now rather than when the last chunk is sealed at exit; nothing was started.

    """
    global _running
    with _lock:
        if _running is not None:
            return _running[0]
        get_recorder().chain  # noqa: B018 - resolves the signing key now: a bad one fails before the agent runs
        sid = new_id() if session_id in (None, "", "auto") else str(session_id)
        mode = RecordMode(sid)
        scope = session_scope(sid)
        scope.__enter__()  # the process's root context carries the session id from here on
        interceptor = Interceptor(mode)
        try:
            interceptor.__enter__()  # reads OTEL_REPLAY_RERUN_MAX_BODY
        except BaseException:
            scope.__exit__(None, None, None)
            raise
        _running = (mode, interceptor, scope)
    atexit.register(stop_process_recording)
    return mode


def stop_process_recording(outcome: str = "returned") -> str | None:
    """Finish the process recording (write its final chunk); returns its fingerprint, ``None`` if none ran."""
    global _running
    with _lock:
        running, _running = _running, None
    if running is None:
        return None
    mode, interceptor, scope = running
    try:
        return mode.finish(outcome)
    finally:
        interceptor.__exit__(None, None, None)
        try:
            scope.__exit__(None, None, None)
        except ValueError:  # detached from another context at exit: nothing left to restore
            pass


class RecordingInstrumentor(BaseInstrumentor):
    """Starts a process-wide recording when ``OTEL_REPLAY_RECORD_SESSION`` is set."""

    def instrumentation_dependencies(self) -> Collection[str]:
        """No client library is needed: the HTTP clients are patched only when installed."""
        return []

    def _instrument(self, **kwargs: Any) -> None:
        session_id = kwargs.get("session_id") or settings.env_text(settings.RECORD_SESSION)
        if session_id:
            try:
                start_process_recording(str(session_id))
            except OtelReplayError as exc:
                if not starting_up():
                    raise
                refuse_start(f"cannot record session {session_id}: {exc}")

    def _uninstrument(self, **kwargs: Any) -> None:
        stop_process_recording()
