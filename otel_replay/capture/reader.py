"""What capture reads of a dataset through the store it is given: the :class:`DatasetReader` protocol.

A :class:`~otel_replay.capture.tracer.DecisionTracer` or an
:class:`~otel_replay.capture.audit_log.AuditLog` given a store reads the
dataset through these methods only (an :class:`otel_replay.Store` has them
all); capture itself only writes, and knows nothing of the read side.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from otel_replay.records import DecisionRecord

__all__ = ["DatasetReader"]


class DatasetReader(Protocol):
    """An open dataset as capture reads it (an :class:`otel_replay.Store`)."""

    @property
    def dataset(self) -> Path | str:
        """The dataset's directory or URI."""

    def refresh(self) -> None:
        """See what other processes wrote since the dataset was opened."""

    def record(self, record_id: str) -> DecisionRecord:
        """The verified decision ``record_id``; raises :class:`~otel_replay.errors.RecordNotFound`."""

    def has_outcome(self, decision_id: str) -> bool:
        """Whether a verified outcome for ``decision_id`` is stored."""

    def traces(
        self, *, correlation_id: str | None = None, session_id: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Decisions by correlation and/or session id, oldest first, verified outcomes attached."""

    def audit_entries(self, correlation_id: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Audit entries (all, or for one correlation id) in the order they were recorded."""
