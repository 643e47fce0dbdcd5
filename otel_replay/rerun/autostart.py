"""Record a whole process: ``OTEL_REPLAY_RECORD_SESSION=<id> opentelemetry-instrument python agent.py``.

:class:`RecordingInstrumentor` is an OpenTelemetry instrumentor (entry point
group ``opentelemetry_instrumentor``): when ``OTEL_REPLAY_RECORD_SESSION`` is
set, instrumenting starts a recording of that session for the whole process
(``auto`` picks a new id), and the recording is finished - its final, sealed
chunk written - when the process exits or the instrumentor is uninstrumented.

The recorded outcome is how the process ended: ``raised <module>:<qualname>: <message>``
when an uncaught exception reached ``sys.excepthook`` (chained, so the usual
traceback is still printed; ``sys.last_value`` when the program's own hook
replaced ours) or the program called ``sys.exit`` with a non-zero code,
``returned`` otherwise.
"""

from __future__ import annotations

import atexit
import sys
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
from otel_replay.rerun.record import RecordMode, outcome_of

__all__ = ["RecordingInstrumentor", "start_process_recording", "stop_process_recording"]

_lock = threading.Lock()
_running: tuple[RecordMode, Interceptor, Any] | None = None
_ended: str | None = None
"""How the process is ending, as seen by the hooks below (``None``: no crash, no failing exit seen)."""
_hooks: tuple[Any, Any, Any, Any] | None = None
"""(previous excepthook, ours, previous sys.exit, ours), to put back exactly."""


def _install_hooks() -> None:
    global _hooks
    previous_hook, previous_exit = sys.excepthook, sys.exit

    def excepthook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        global _ended
        _ended = outcome_of(exc)
        previous_hook(exc_type, exc, tb)

    def exit(status: object = None) -> None:  # noqa: A001 - stands in for sys.exit
        global _ended
        if status not in (None, 0):  # the exit code the process will end with (a caught one too: documented)
            _ended = outcome_of(SystemExit(status))
        previous_exit(status)  # type: ignore[arg-type]

    sys.excepthook, sys.exit = excepthook, exit  # type: ignore[assignment]
    _hooks = (previous_hook, excepthook, previous_exit, exit)


def _remove_hooks() -> None:
    global _hooks
    if _hooks is None:
        return
    previous_hook, ours_hook, previous_exit, ours_exit = _hooks
    _hooks = None
    if sys.excepthook is ours_hook:  # someone chained after us: leave theirs (it calls ours, which is harmless)
        sys.excepthook = previous_hook
    if sys.exit is ours_exit:
        sys.exit = previous_exit


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
        _install_hooks()
    atexit.register(stop_process_recording)
    return mode


def _uncaught() -> str | None:
    """The exception that ended the process, when our chained excepthook never saw it.

    A program that installs its own ``sys.excepthook`` without chaining (``rich.traceback.install()``)
    replaces ours; the interpreter still sets ``sys.last_exc`` / ``sys.last_value`` before calling any hook.
    """
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if not isinstance(exc, BaseException):
        return None
    return outcome_of(exc)


def stop_process_recording(outcome: str | None = None) -> str | None:
    """Finish the process recording (write its final chunk); returns its fingerprint, ``None`` if none ran.

    ``outcome`` defaults to how the process is ending: ``raised <module>:<qualname>: <message>`` after an uncaught
    exception or a non-zero ``sys.exit``, else ``returned``.
    """
    global _running, _ended
    with _lock:
        running, _running = _running, None
        ended, _ended = _ended, None
        _remove_hooks()
    if running is None:
        return None
    mode, interceptor, scope = running
    try:
        return mode.finish(outcome if outcome is not None else ended or _uncaught() or "returned")
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
