"""``ParquetSpanExporter``: an OpenTelemetry ``SpanExporter`` writing the dataset."""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, attach, detach, set_value
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_replay import settings
from otel_replay._compaction import Compactor, CompactorFactory, installed_compactor, use_compactor
from otel_replay._counters import CompactionCounters
from otel_replay.errors import ConfigError

from .rows import spans_to_table
from .writer import DatasetWriter, WriterStats

__all__ = [
    "CompactionStats",
    "Compactor",
    "CompactorFactory",
    "ParquetSpanExporter",
    "flush_exporters",
    "use_compactor",
]

_log = logging.getLogger(__name__)


_LOGGED_PER_BATCH = 10
_live: weakref.WeakSet[ParquetSpanExporter] = weakref.WeakSet()


def flush_exporters(timeout_millis: int = 30_000) -> bool:
    """``force_flush`` every open :class:`ParquetSpanExporter` of this process; ``False`` if one failed.

    The SDK's ``TracerProvider.force_flush`` hands queued spans to exporters
    but does not ask them to flush, and this exporter buffers rows into files:
    :meth:`otel_replay.capture.Recorder.flush` calls both when the provider is
    the user's own.
    """
    ok = True
    for exporter in list(_live):
        ok = exporter.force_flush(timeout_millis) and ok
    return ok


@dataclass
class CompactionStats(CompactionCounters):
    """What the exporter's background compaction did (``compact_every_seconds``)."""


def _label(span: ReadableSpan) -> str:
    ctx = span.context
    return f"span {span.name!r} (trace {ctx.trace_id:032x}, span {ctx.span_id:016x})"


class ParquetSpanExporter(SpanExporter):
    """Export spans into a hive-partitioned Parquet dataset.

    Args:
        dataset_dir: dataset root; falls back to ``OTEL_REPLAY_DATASET`` and then
            ``./traces``. Files go to ``<dataset_dir>/spans/date=YYYY-MM-DD/``.
            A relative path is made absolute at construction.
        max_rows: roll a file at this many buffered rows
            (``OTEL_REPLAY_MAX_FILE_ROWS``, default 200000).
        max_bytes: roll at this many buffered bytes
            (``OTEL_REPLAY_MAX_FILE_BYTES``, default 128 MiB).
        max_age_seconds: roll rows older than this even if the buffer is small
            (``OTEL_REPLAY_MAX_FILE_AGE``, default 5 s).
        compact_every_seconds: compact the partitions of past days (UTC) every
            this many seconds on a background thread, as ``serve --compact-every``
            does, under the same per-partition lease (``OTEL_REPLAY_COMPACT_EVERY``,
            default off). Counted in :attr:`compaction`.

    ``dataset_dir`` may be ``s3://bucket/prefix`` (see :mod:`otel_replay.location`):
    each file is then one atomic PUT.

    ``export`` converts a batch to Arrow columns and hands it to the
    :class:`~otel_replay.exporters.writer.DatasetWriter`, whose own thread
    writes the Parquet files: the SDK's span queue never backs up behind a
    slow write. If four full files are already waiting for the disk, further
    spans are dropped and counted in ``stats.rows_dropped`` (logged once), not
    queued without bound.

    Like every OpenTelemetry exporter it never raises into the application: a
    failure is logged and reported as ``SpanExportResult.FAILURE``. A span
    that cannot be stored (a time outside int64 nanoseconds, see
    :func:`~otel_replay.exporters.rows.span_time_error`) is dropped alone, logged
    by name and counted in ``stats.spans_rejected`` and ``stats.rows_dropped``;
    the rest of its batch is written. ``force_flush`` and ``shutdown`` write
    every buffered span to disk; ``force_flush`` returns ``False`` when a span
    handed over since the previous flush will never reach Parquet.

    Raises:
        ConfigError: a limit (argument or variable) is not a positive number.
        DatasetError: the dataset directory cannot be created.

    """

    def __init__(
        self,
        dataset_dir: str | os.PathLike[str] | None = None,
        *,
        max_rows: int | None = None,
        max_bytes: int | None = None,
        max_age_seconds: float | None = None,
        compact_every_seconds: float | None = None,
    ) -> None:
        """Create the exporter (and the dataset directory)."""
        # Every setting is checked before the writer starts its thread: a refused exporter leaves nothing running.
        every = (
            compact_every_seconds
            if compact_every_seconds is not None
            else settings.env_number(settings.COMPACT_EVERY, 0.0, maximum=settings.MAX_WAIT_SECONDS, inclusive=True)
        )
        if not 0 <= every <= settings.MAX_WAIT_SECONDS:  # past it the compactor's wait overflows
            raise ConfigError(
                f"compact_every_seconds={every!r} must be a number from 0 (off) to {settings.MAX_WAIT_SECONDS:g}"
            )
        factory = installed_compactor()
        if every and factory is None:
            raise ConfigError("compact_every_seconds needs a compactor: import otel_replay first")
        self.writer = DatasetWriter(
            settings.absolute_dataset(settings.dataset_dir(dataset_dir)),  # a later chdir must not move it
            # Given values are checked by the writer (one line naming the argument); the variables here.
            max_rows=max_rows
            if max_rows is not None
            else int(settings.env_number(settings.MAX_FILE_ROWS, 200_000, integer=True)),
            max_bytes=max_bytes
            if max_bytes is not None
            else int(settings.env_number(settings.MAX_FILE_BYTES, 128 * 1024 * 1024, integer=True)),
            max_age_seconds=max_age_seconds
            if max_age_seconds is not None
            else settings.env_number(settings.MAX_FILE_AGE, 5.0, maximum=settings.MAX_WAIT_SECONDS),
            when_full="drop",  # the SDK's processor thread must never wait for the disk
        )
        self._shutdown = False
        self._flushed_mark = 0
        self._mark_lock = threading.Lock()
        self.compaction = CompactionStats()
        self._compactor: Compactor | None = None
        if every and factory is not None:
            self._compactor = factory(self.writer.location.root, every, 200_000, self.compaction)
            self._compactor.start()
        _live.add(self)

    @property
    def dataset_dir(self) -> str:
        """The dataset root this exporter writes to."""
        return str(self.writer.root)

    @property
    def stats(self) -> WriterStats:
        """Rows buffered, written, dropped and rejected, files written and write errors so far."""
        return self.writer.stats

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Convert ``spans`` to rows and buffer them for the next file.

        Returns ``FAILURE`` when any span of the batch was dropped (the others are kept).
        """
        if self._shutdown:
            self.writer.count_dropped(len(spans))
            _log.warning("otel-replay: export after shutdown; %d spans dropped", len(spans))
            return SpanExportResult.FAILURE
        token = attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
        try:
            rejected: list[str] = []
            try:
                table = spans_to_table(spans, rejected)
            except Exception:  # a span the checks did not foresee: isolate it
                rejected = []
                table = self._span_by_span(spans, rejected)
            if rejected:
                self._reject(rejected, len(spans))
            # Only a hand-off: the writer's own thread writes Parquet, so this
            # thread (the SDK's BatchSpanProcessor) never waits for the disk.
            accepted = self.writer.offer(table)
            return SpanExportResult.SUCCESS if accepted and not rejected else SpanExportResult.FAILURE
        finally:
            detach(token)

    def _span_by_span(self, spans: Sequence[ReadableSpan], rejected: list[str]) -> pa.Table:
        tables = []
        for span in spans:
            try:
                tables.append(spans_to_table([span], rejected))
            except Exception as exc:
                rejected.append(f"{_label(span)}: {type(exc).__name__}: {exc}")
        return pa.concat_tables(tables) if tables else spans_to_table([])

    def _reject(self, rejected: list[str], batch: int) -> None:
        self.writer.count_dropped(len(rejected), rejected=True)
        for line in rejected[:_LOGGED_PER_BATCH]:
            _log.error("otel-replay: dropped %s", line)
        if len(rejected) > _LOGGED_PER_BATCH:
            _log.error("otel-replay: ... and %d more unstorable spans", len(rejected) - _LOGGED_PER_BATCH)
        _log.error(
            "otel-replay: %d of %d spans dropped in one export; %d dropped so far (stats.rows_dropped)",
            len(rejected),
            batch,
            self.writer.stats.rows_dropped,
        )

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Write every buffered span to Parquet now.

        ``False`` when the write failed (the rows stay buffered), or when a
        span handed over since the previous flush was dropped.
        """
        try:
            self.writer.flush()
        except Exception:
            return False
        with self._mark_lock:
            dropped = self.writer.stats.rows_dropped
            clean = dropped == self._flushed_mark
            self._flushed_mark = dropped
        return clean

    def shutdown(self) -> None:
        """Flush and stop; later exports fail (and are counted as dropped)."""
        if self._shutdown:
            return
        self._shutdown = True
        _live.discard(self)
        try:
            self.writer.close()
        except Exception:
            _log.exception("otel-replay: final flush to %s failed", self.writer.spans_dir)
        if self._compactor is not None:
            self._compactor.stop()  # a run in progress finishes: a partition is never left half-swapped
