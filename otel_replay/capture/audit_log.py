"""``AuditLog``: inter-agent messages and system actions, stored as spans.

Entries keep the writer's own ``created_at`` (which may be skewed between
agents); chains sort on it, not on arrival order.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from otel_replay import semconv as sc
from otel_replay._json import normalise
from otel_replay.capture.context import current_ids
from otel_replay.capture.reader import DatasetReader
from otel_replay.capture.recorder import get_recorder
from otel_replay.capture.sinks import Sink
from otel_replay.errors import CaptureError
from otel_replay.records import AuditEntry, id_problem, iso_utc, new_id

__all__ = ["AuditLog"]

_UNLIMITED = 2**62


class AuditLog:
    """Append-only log of inter-agent messages and system actions.

    Args:
        sink: receives every sealed :class:`AuditEntry` (default: recorder's sink).
        store: an open :class:`otel_replay.Store`; when given, :meth:`query`
            reads the dataset instead of this process's entries.

    """

    def __init__(self, sink: Sink | None = None, store: DatasetReader | None = None) -> None:
        """Create a log; see the class docstring."""
        self._sink = sink
        self._store = store
        self._entries: deque[AuditEntry] = deque(maxlen=10_000)  # the dataset keeps them all
        self._lock = threading.Lock()

    def append(
        self,
        event_type: str,
        *,
        source_agent: str,
        target_agent: str | None = None,
        payload: dict[str, Any] | None = None,
        correlation_id: str | None = None,
        session_id: str | None = None,
        created_at: datetime | str | None = None,
    ) -> AuditEntry:
        """Append one entry; ids default to the enclosing correlation scope (ids are text: another type is refused)."""
        problem = id_problem({"correlation_id": correlation_id, "session_id": session_id})
        if problem is not None:
            raise CaptureError(f"audit log entry {event_type!r}: {problem}")
        scope = current_ids()
        entry = AuditEntry(
            entry_id=new_id(),
            event_type=event_type,
            source_agent=source_agent,
            target_agent=target_agent,
            correlation_id=correlation_id or scope.correlation_id,
            session_id=session_id or scope.session_id,
            created_at=iso_utc(created_at) or datetime.now(UTC).isoformat(),
            payload=normalise(payload or {}, where=f"audit entry {event_type!r} payload"),
        )
        _, seal = get_recorder().emit(sc.SPAN_AUDIT_ENTRY, entry.entry_id, entry.to_attributes())
        entry = replace(entry, seal=seal)
        with self._lock:
            self._entries.append(entry)
        (self._sink if self._sink is not None else get_recorder().sink).append(entry)
        return entry

    def query(self, correlation_id: str | None = None, limit: int | None = 100) -> list[dict[str, Any]]:
        """Entries for ``correlation_id`` (all when ``None``), in insertion order, at most ``limit`` (``None``: all).

        Without a store this reads the newest 10,000 entries of this process.
        """
        if self._store is not None:
            wanted = _UNLIMITED if limit is None else limit
            return self._store.audit_entries(correlation_id=correlation_id, limit=wanted)
        with self._lock:
            rows = [e.to_json() for e in self._entries if correlation_id is None or e.correlation_id == correlation_id]
        return rows if limit is None else rows[:limit]
