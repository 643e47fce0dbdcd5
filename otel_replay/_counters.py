"""Thread-safe counters shared by the receiver's ``/metrics`` and the exporter's compaction stats."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

__all__ = ["CompactionCounters"]


@dataclass
class CompactionCounters:
    """What background compaction did; ``add`` is atomic. The receiver's ``Metrics`` extends it."""

    compaction_runs: int = 0
    partitions_compacted: int = 0
    compaction_duplicates_removed: int = 0
    compaction_errors: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **deltas: int) -> None:
        """Add to counters atomically."""
        with self.lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)
