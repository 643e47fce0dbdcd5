"""Retention: drop whole partitions older than a number of days, never part of one.

A partition is dropped under its lease by one ``rename`` of its directory out
of ``spans/`` (into ``<dataset>/.trash/``), so readers see all of it or none
of it, then the moved directory is deleted. What is dropped is counted.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from otel_replay.errors import ConfigError

from .lease import PartitionLease
from .manifest import partition_date, partition_dirs, partition_live_files

__all__ = ["RetentionReport", "drop_older_than"]


@dataclass
class RetentionReport:
    """Partitions dropped (with their live files and rows) and partitions skipped as busy."""

    dropped: list[str] = field(default_factory=list)
    files: int = 0
    rows: int = 0
    bytes: int = 0
    busy: list[str] = field(default_factory=list)


def _rows(path: Path) -> int:
    try:
        return pq.read_metadata(path).num_rows
    except (pa.ArrowException, OSError):
        return 0


def drop_older_than(
    dataset: str | os.PathLike[str],
    days: int,
    *,
    today: dt.date | None = None,
    lease_wait: float = 0.0,
) -> RetentionReport:
    """Drop every partition whose date is more than ``days`` days before ``today`` (UTC).

    ``days=0`` keeps only today's (and future) partitions. A partition whose
    lease another process holds (a compaction in progress) is left and listed
    in ``busy``.

    Raises:
        ConfigError: ``days`` is not a whole number from 0 to 999999.

    """
    if isinstance(days, bool) or not isinstance(days, int) or not 0 <= days < 1_000_000:
        raise ConfigError(f"older than {days!r} days: give a whole number of days from 0 to 999999")
    today = today or dt.datetime.now(dt.UTC).date()
    cutoff = today - dt.timedelta(days=days)
    root = Path(dataset)
    report = RetentionReport()
    for partition in partition_dirs(root):
        if dt.date.fromisoformat(partition_date(partition)) >= cutoff:
            continue
        lease = PartitionLease(root, partition.name)
        if not lease.acquire(wait=lease_wait):
            report.busy.append(partition.name)
            continue
        try:
            _, live = partition_live_files(partition)
            rows, size = sum(_rows(p) for p in live), sum(p.stat().st_size for p in live)
            trash = root / ".trash" / f"{partition.name}-{uuid.uuid4().hex[:8]}"
            trash.parent.mkdir(exist_ok=True)
            os.rename(partition, trash)
            shutil.rmtree(trash, ignore_errors=True)
        finally:
            lease.release()
        report.dropped.append(partition.name)
        report.files += len(live)
        report.rows += rows
        report.bytes += size
    return report
