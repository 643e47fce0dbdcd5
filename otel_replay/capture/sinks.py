"""Sinks: where a finished, sealed record is handed in process."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

__all__ = ["MemorySink", "Sink"]


@runtime_checkable
class Sink(Protocol):
    """Anything with ``append(record)``: a list, a queue, a database writer."""

    def append(self, record: Any) -> None:
        """Receive one sealed record."""


class MemorySink:
    """Keeps the newest ``maxlen`` records in memory (default 10000), thread-safe.

    The default sink of :func:`otel_replay.audit`; the durable copy of every
    record is the span in the dataset, so a bounded sink loses nothing.
    """

    def __init__(self, maxlen: int | None = 10_000) -> None:
        """Create an empty sink holding at most ``maxlen`` records (``None``: unbounded)."""
        self._records: deque[Any] = deque(maxlen=maxlen)

    def append(self, record: Any) -> None:
        """Store ``record`` (dropping the oldest when full).

        No lock: a bounded deque's ``append`` is one step that other threads
        cannot interleave with, and readers copy the deque in one step too.
        """
        self._records.append(record)

    def get(self, record_id: str) -> Any:
        """The record with ``record_id``; ``KeyError`` if this sink does not hold it."""
        for record in reversed(self._snapshot()):
            if getattr(record, "record_id", None) == record_id:
                return record
        raise KeyError(record_id)

    def _snapshot(self) -> list[Any]:
        """The records as they are now (appends from other threads meanwhile land after this copy)."""
        while True:
            try:
                return list(self._records)
            except RuntimeError:  # pragma: no cover - an interpreter that lets an append interleave with the copy
                continue

    def __iter__(self) -> Iterator[Any]:
        return iter(self._snapshot())

    def __len__(self) -> int:
        return len(self._records)

    def clear(self) -> None:
        """Forget every record."""
        self._records.clear()
