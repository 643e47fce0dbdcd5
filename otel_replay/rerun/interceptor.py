"""The interceptor: installs a record or rerun mode at the seam, with every boundary patch, and removes it all.

One interceptor is active per process at a time. Entering it patches the
clock, entropy and HTTP boundaries (and, for a rerun, the leak guards),
installs the mode at the seam and tees the recorder's sink so decisions made
inside are seen. Leaving it puts every original object back, also when the
code inside raised.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, ClassVar

from otel_replay.capture.recorder import get_recorder
from otel_replay.errors import ConfigError
from otel_replay.instrumentation import _seam
from otel_replay.records import DecisionRecord
from otel_replay.rerun.actions import install_actions
from otel_replay.rerun.boundaries import install_clock_and_entropy
from otel_replay.rerun.codec import stable_json
from otel_replay.rerun.http import install_http
from otel_replay.rerun.patching import PatchSet

__all__ = ["Interceptor", "decision_arguments"]


def decision_arguments(record: DecisionRecord) -> str:
    """What of a decision is compared between runs: type, action, the state it relied on, its inputs."""
    return stable_json(
        {
            "decision_type": record.decision_type,
            "action": record.action.to_json() if record.action is not None else None,
            "state": record.snapshot.state if record.snapshot is not None else None,
            "inputs": record.inputs,
            "error": record.error,
        }
    )


class _Tee:
    """A sink that forwards to the original sink and reports each decision record."""

    def __init__(self, inner: Any, on_decision: Callable[[DecisionRecord], None]) -> None:
        self.inner = inner
        self.on_decision = on_decision

    def append(self, record: Any) -> None:
        self.inner.append(record)
        if isinstance(record, DecisionRecord) and record.source == "audit":
            self.on_decision(record)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __iter__(self) -> Any:
        return iter(self.inner)

    def __len__(self) -> int:
        return len(self.inner)


class Interceptor:
    """Context manager: ``mode`` at the seam plus the boundary patches, removed exactly on exit."""

    _lock = threading.Lock()
    _active: ClassVar[Interceptor | None] = None

    def __init__(
        self,
        mode: _seam.Mode,
        *,
        decisions: Callable[[DecisionRecord], None] | None = None,
        guards: Callable[[PatchSet], None] | None = None,
        rerun: bool = False,
    ) -> None:
        """Prepare to install ``mode``; ``guards`` adds the rerun's leak guards."""
        self.mode = mode
        self.rerun = rerun
        self._decisions = decisions
        self._guards = guards
        self._patches = PatchSet()
        self._previous_mode: _seam.Mode | None = None
        self._recorder: Any = None
        self._sink: Any = None
        self.http_clients: list[str] = []
        self._installed = False

    @classmethod
    def current_rerun(cls) -> Interceptor | None:
        """The active interceptor when it is serving a rerun."""
        active = cls._active
        return active if active is not None and active.rerun else None

    def __enter__(self) -> Interceptor:
        with Interceptor._lock:
            if Interceptor._active is not None:
                raise ConfigError("a recording or rerun is already active in this process; they do not nest")
            Interceptor._active = self
        try:
            install_clock_and_entropy(self._patches)
            self.http_clients = install_http(self._patches)
            install_actions(self._patches)
            if self._guards is not None:
                self._guards(self._patches)
            if self._decisions is not None:
                self._recorder = get_recorder()
                self._sink = self._recorder.sink
                self._recorder.sink = _Tee(self._sink, self._decisions)
            self._previous_mode = _seam.install(self.mode)
            self._installed = True
        except BaseException:
            self._undo()
            raise
        return self

    def _undo(self) -> None:
        try:
            if self._installed:
                _seam.install(self._previous_mode)
                self._installed = False
            if self._recorder is not None:
                self._recorder.sink = self._sink
                self._recorder = None
            self._patches.remove()
        finally:
            with Interceptor._lock:
                Interceptor._active = None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._undo()
