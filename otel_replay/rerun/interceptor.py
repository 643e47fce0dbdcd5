"""The interceptor: installs a record or rerun mode at the seam, with every boundary patch, and removes it all.

One interceptor is active per process at a time. Entering it patches the
clock, entropy and HTTP boundaries (and, for a rerun, the leak guards),
and installs the mode at the seam; ``audit()`` reports every decision it
seals to that mode itself (its ``decision`` method), whatever sink or
recorder the agent uses. Leaving it puts every original object back, also when the
code inside raised.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import ClassVar

from otel_replay import _seam, redaction
from otel_replay.errors import ConfigError
from otel_replay.rerun.actions import install_actions
from otel_replay.rerun.boundaries import install_clock_and_entropy
from otel_replay.rerun.codec import arguments_key
from otel_replay.rerun.http import install_http
from otel_replay.rerun.patching import PatchSet

__all__ = ["Interceptor"]


class Interceptor:
    """Context manager: ``mode`` at the seam plus the boundary patches, removed exactly on exit."""

    _lock = threading.Lock()
    _active: ClassVar[Interceptor | None] = None

    def __init__(
        self,
        mode: _seam.Mode,
        *,
        guards: Callable[[PatchSet], None] | None = None,
        rerun: bool = False,
    ) -> None:
        """Prepare to install ``mode``; ``guards`` adds the rerun's leak guards."""
        self.mode = mode
        self.rerun = rerun
        self._guards = guards
        self._patches = PatchSet()
        self._previous_mode: _seam.Mode | None = None
        self.http_clients: list[str] = []
        self._installed = False
        self._key: AbstractContextManager[None] | None = None

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
            redaction.check_settings()  # a bad OTEL_REPLAY_REDACT_* is refused here, not at the first write
            install_clock_and_entropy(self._patches)
            self.http_clients = install_http(self._patches)
            install_actions(self._patches)
            if self._guards is not None:
                self._guards(self._patches)
            # The mode's argument-hash key (its recording's), in force while it is installed.
            self._key = arguments_key(getattr(self.mode, "arguments_key", None))
            self._key.__enter__()
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
            self._patches.remove()
        finally:
            key, self._key = self._key, None
            if key is not None:
                key.__exit__(None, None, None)
            with Interceptor._lock:
                Interceptor._active = None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._undo()
