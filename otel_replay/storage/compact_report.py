"""What a compaction run reports: per partition (:class:`PartitionReport`) and in total (:class:`CompactReport`)."""

from __future__ import annotations

import resource
from dataclasses import dataclass, field

__all__ = ["CompactReport", "PartitionReport", "peak_rss"]


@dataclass
class PartitionReport:
    """What compaction did to one partition.

    ``status``: ``compacted``; ``current`` (already one compacted layout, nothing
    new); ``busy`` (another compactor holds its lease); ``empty``. ``rows``:
    ``spans``, or ``log records`` for a ``logs/date=…`` partition.
    """

    partition: str
    status: str
    input_files: int = 0
    input_rows: int = 0
    output_files: int = 0
    output_rows: int = 0
    duplicates_removed: int = 0
    conflicting_kept: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    superseded_deleted: int = 0
    leftovers_deleted: int = 0
    dropped_missing: list[str] = field(default_factory=list)
    seconds: float = 0.0
    rows: str = "spans"


@dataclass
class CompactReport:
    """What :func:`compact` did, per partition, plus totals."""

    partitions: list[PartitionReport] = field(default_factory=list)
    seconds: float = 0.0
    peak_rss_bytes: int = 0

    def _sum(self, name: str) -> int:
        return sum(int(getattr(p, name)) for p in self.partitions)

    @property
    def input_rows(self) -> int:
        """Span rows read, over every compacted span partition."""
        return sum(p.input_rows for p in self.partitions if p.rows == "spans")

    @property
    def output_rows(self) -> int:
        """Span rows written, over every compacted span partition."""
        return sum(p.output_rows for p in self.partitions if p.rows == "spans")

    @property
    def log_rows(self) -> int:
        """Log record rows rewritten, over every compacted log partition (as many as were read: all are kept)."""
        return sum(p.output_rows for p in self.partitions if p.rows != "spans")

    @property
    def duplicates_removed(self) -> int:
        """Exact duplicate rows removed, over every partition."""
        return self._sum("duplicates_removed")

    @property
    def conflicting_kept(self) -> int:
        """Rows kept although another row has the same ids with different content."""
        return self._sum("conflicting_kept")

    @property
    def dropped_missing(self) -> list[str]:
        """Compacted files a manifest listed but that were missing, dropped from it (``drop_missing``): spans lost."""
        return [f"{p.partition}/{name}" for p in self.partitions for name in p.dropped_missing]

    @property
    def busy(self) -> list[str]:
        """Partitions skipped because another compactor held their lease."""
        return [p.partition for p in self.partitions if p.status == "busy"]

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready summary."""
        return {
            "seconds": round(self.seconds, 3),
            "peak_rss_bytes": self.peak_rss_bytes,
            "input_rows": self.input_rows,
            "output_rows": self.output_rows,
            "log_rows": self.log_rows,
            "duplicates_removed": self.duplicates_removed,
            "conflicting_kept": self.conflicting_kept,
            "dropped_missing": self.dropped_missing,
            "partitions": [vars(p) for p in self.partitions],
        }


def peak_rss() -> int:
    """The most memory (RSS, bytes) this process has held so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
