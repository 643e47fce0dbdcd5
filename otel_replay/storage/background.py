"""Background compaction inside ``otel-replay serve`` (``--compact-every``) and the Parquet exporter.

Every interval the receiver (or exporter) compacts the partitions of days before today (UTC),
through :func:`.compact.compact` and its per-partition lease, so a
long-running receiver keeps its dataset in the clustered layout without a cron
job. Today's partition is left to an explicit ``otel-replay compact``: it is
still being written, and rewriting it every interval would redo the same work.

A failed run is logged and counted, never fatal: the receiver's job is to keep
acknowledging and converting spans. Compaction holds at most
``max_batch_rows`` rows in memory (about 1.6 KB of RSS a row), on top of the
receiver's own bound.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from pathlib import Path

from otel_replay._counters import CompactionCounters
from otel_replay.errors import OtelReplayError

from .compact import compact
from .kinds import KINDS
from .manifest import partition_names

__all__ = ["BackgroundCompactor"]


_log = logging.getLogger("otel_replay.server")


class BackgroundCompactor:
    """Compacts closed day partitions of ``dataset`` every ``every_seconds`` on a daemon thread."""

    def __init__(
        self, dataset: Path | str, every_seconds: float, max_batch_rows: int, metrics: CompactionCounters
    ) -> None:
        """Prepare (not start) the compactor; see the module docstring."""
        self.dataset = dataset
        self.every_seconds = every_seconds
        self.max_batch_rows = max_batch_rows
        self.metrics = metrics
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="otel-replay-compact", daemon=True)

    def start(self) -> None:
        """Start the loop (the first run comes one interval after start)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop; a run in progress is finished first (a partition is never left half-swapped)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def closed_partitions(self) -> list[str]:
        """The day partitions before today (UTC) present in the dataset (of spans or of log records)."""
        today = dt.datetime.now(dt.UTC).date().isoformat()
        names = {name for kind in KINDS for name in partition_names(self.dataset, kind.directory)}
        days = (name.removeprefix("date=") for name in names)
        return sorted(day for day in days if day < today)

    def run_once(self) -> None:
        """Compact every closed partition once; count the outcome in the receiver's metrics."""
        partitions = self.closed_partitions()
        if not partitions:
            return
        try:
            report = compact(self.dataset, partitions=partitions, max_batch_rows=self.max_batch_rows)
        except (OtelReplayError, OSError) as exc:
            self.metrics.add(compaction_errors=1)
            _log.error("otel-replay serve: background compaction failed: %s", exc)
            return
        done = [p for p in report.partitions if p.status == "compacted"]
        self.metrics.add(
            compaction_runs=1,
            partitions_compacted=len(done),
            compaction_duplicates_removed=sum(p.duplicates_removed for p in done),
        )
        if done:
            _log.info("otel-replay serve: compacted %s", ", ".join(p.partition for p in done))

    def _loop(self) -> None:
        while not self._stop.wait(self.every_seconds):
            self.run_once()
