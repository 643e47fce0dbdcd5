"""The background compaction an exporter starts, handed to it from above.

Compaction lives in the storage layer, above the exporter, so the exporter is
handed it rather than importing it: importing :mod:`otel_replay` installs
:class:`otel_replay.storage.background.BackgroundCompactor` here. The slot
lives in this small module, not in the exporter's, so that the package root
installs it without importing the exporter (and the OpenTelemetry SDK,
pyarrow and protobuf with it) in a process that never exports.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from otel_replay._counters import CompactionCounters

__all__ = ["Compactor", "CompactorFactory", "installed_compactor", "use_compactor"]


class Compactor(Protocol):
    """The background compaction an exporter starts with ``compact_every_seconds`` and stops at shutdown."""

    def start(self) -> None:
        """Start compacting in the background."""

    def stop(self) -> None:
        """Stop; a run in progress finishes first."""


CompactorFactory = Callable[[Path | str, float, int, CompactionCounters], Compactor]
"""Makes a :class:`Compactor` from (dataset root, interval in seconds, rows held at most, counters)."""

_factory: list[CompactorFactory] = []


def use_compactor(factory: CompactorFactory) -> None:
    """Install what ``compact_every_seconds`` starts.

    Compaction lives in the storage layer, above the exporter, so the exporter
    is handed it rather than importing it: importing :mod:`otel_replay` installs
    :class:`otel_replay.storage.background.BackgroundCompactor`.
    """
    _factory[:] = [factory]


def installed_compactor() -> CompactorFactory | None:
    """What :func:`use_compactor` installed last, or ``None``."""
    return _factory[0] if _factory else None
