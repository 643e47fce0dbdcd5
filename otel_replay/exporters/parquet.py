"""``ParquetSpanExporter``: an OpenTelemetry ``SpanExporter`` writing the dataset."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, attach, detach, set_value
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_replay import settings

from .rows import spans_to_table
from .writer import DatasetWriter, WriterStats

__all__ = ["ParquetSpanExporter"]

_log = logging.getLogger(__name__)



class ParquetSpanExporter(SpanExporter):
    """Export spans into a hive-partitioned Parquet dataset.

    Args:
        dataset_dir: dataset root; falls back to ``OTEL_REPLAY_DATASET`` and then
            ``./traces``. Files go to ``<dataset_dir>/spans/date=YYYY-MM-DD/``.
        max_rows: roll a file at this many buffered rows
            (``OTEL_REPLAY_MAX_FILE_ROWS``, default 200000).
        max_bytes: roll at this many buffered bytes
            (``OTEL_REPLAY_MAX_FILE_BYTES``, default 128 MiB).
        max_age_seconds: roll rows older than this even if the buffer is small
            (``OTEL_REPLAY_MAX_FILE_AGE``, default 5 s).

    Like every OpenTelemetry exporter it never raises into the application: a
    failure is logged and reported as ``SpanExportResult.FAILURE``.
    ``force_flush`` and ``shutdown`` write every buffered span to disk.

    """

    def __init__(
        self,
        dataset_dir: str | os.PathLike[str] | None = None,
        *,
        max_rows: int | None = None,
        max_bytes: int | None = None,
        max_age_seconds: float | None = None,
    ) -> None:
        """Create the exporter (and the dataset directory)."""
        self.writer = DatasetWriter(
            settings.dataset_dir(dataset_dir),
            max_rows=int(max_rows or settings.env_number(settings.MAX_FILE_ROWS, 200_000, integer=True)),
            max_bytes=int(max_bytes or settings.env_number(settings.MAX_FILE_BYTES, 128 * 1024 * 1024, integer=True)),
            max_age_seconds=float(max_age_seconds or settings.env_number(settings.MAX_FILE_AGE, 5.0)),
        )
        self._shutdown = False

    @property
    def dataset_dir(self) -> str:
        """The dataset root this exporter writes to."""
        return str(self.writer.root)

    @property
    def stats(self) -> WriterStats:
        """Rows buffered, written, files written and write errors so far."""
        return self.writer.stats

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Convert ``spans`` to rows and buffer them for the next file."""
        if self._shutdown:
            _log.warning("otel-replay: export after shutdown; %d spans dropped", len(spans))
            return SpanExportResult.FAILURE
        token = attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
        try:
            self.writer.append(spans_to_table(spans))
            return SpanExportResult.SUCCESS
        except Exception:
            _log.exception("otel-replay: exporting %d spans failed", len(spans))
            return SpanExportResult.FAILURE
        finally:
            detach(token)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Write every buffered span to Parquet now."""
        try:
            self.writer.flush()
            return True
        except Exception:
            return False

    def shutdown(self) -> None:
        """Flush and stop; later exports fail."""
        if self._shutdown:
            return
        self._shutdown = True
        try:
            self.writer.close()
        except Exception:
            _log.exception("otel-replay: final flush to %s failed", self.writer.spans_dir)
