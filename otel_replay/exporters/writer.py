"""Buffered, atomic Parquet writer for the ``spans`` dataset.

Rows are buffered in memory and rolled into one file per partition when the
buffer reaches ``max_rows`` rows, ``max_bytes`` bytes or ``max_age_seconds``
seconds. A file is written under a dot-prefixed temporary name, fsynced, then
renamed into place (and the directory fsynced), so a reader never sees a
half-written file and a crash leaves at worst an ignorable ``.tmp`` file.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from otel_replay.errors import ConfigError, DatasetError, PartialWriteError

from .rows import DATE_COLUMN
from .schema import SPAN_SCHEMA, SPANS_DIR

__all__ = ["DatasetWriter", "PartialWriteError", "WriterStats", "fsync_dir", "write_atomic", "write_partitions"]

_log = logging.getLogger(__name__)


def fsync_dir(path: Path) -> None:
    """Fsync a directory so a rename inside it survives a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(table: pa.Table, path: Path, *, compression: str = "zstd") -> None:
    """Write ``table`` to ``path`` via temp file + fsync + rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Unique per writer: two processes writing the same path never share a temp file.
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "wb") as handle:
        pq.write_table(table, handle, compression=compression)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_partitions(table: pa.Table, spans_dir: Path, file_name: Callable[[str], str]) -> list[Path]:
    """Write rows (with their ``date`` column) as one file per date under ``spans_dir/date=…/``.

    ``file_name(date)`` names each file. Every file is written with
    :func:`write_atomic` and carries the storage schema version.
    """
    dates = table.column(DATE_COLUMN)
    body = table.drop_columns([DATE_COLUMN]).replace_schema_metadata(SPAN_SCHEMA.metadata)
    unique = pc.unique(dates).to_pylist()
    paths: list[Path] = []
    for date in unique:
        part = body if len(unique) == 1 else body.filter(pc.equal(dates, date))
        path = spans_dir / f"date={date}" / file_name(date)
        try:
            write_atomic(part, path)
        except Exception as exc:
            raise PartialWriteError(paths, unique[: len(paths)]) from exc
        paths.append(path)
    return paths


@dataclass
class WriterStats:
    """Counters a writer keeps: what it took, wrote, and could not write.

    ``rows_dropped`` counts every span that will never reach Parquet: spans
    refused as unstorable (also in ``spans_rejected``), spans handed over after
    shutdown, and a backlog dropped after writes kept failing.
    """

    rows_buffered: int = 0
    rows_written: int = 0
    files_written: int = 0
    write_errors: int = 0
    rows_dropped: int = 0
    spans_rejected: int = 0


class DatasetWriter:
    """Append Arrow tables (from :mod:`rows`) to a hive-partitioned dataset.

    Thread-safe. ``flush()`` writes whatever is buffered; ``close()`` flushes and
    stops the age timer. A failed write keeps its rows buffered and retries on
    the next flush. Only when writes keep failing and the backlog passes four
    times ``max_rows`` is it dropped, logged as an error and counted in
    ``stats.rows_dropped``: never silently.
    """

    def __init__(
        self,
        dataset_dir: str | os.PathLike[str],
        *,
        max_rows: int = 200_000,
        max_bytes: int = 128 * 1024 * 1024,
        max_age_seconds: float = 5.0,
        file_prefix: str = "part",
    ) -> None:
        """Open (creating) ``dataset_dir``; see the class docstring for the roll rules."""
        for name, value in (("max_rows", max_rows), ("max_bytes", max_bytes), ("max_age_seconds", max_age_seconds)):
            if not value > 0 or value != value or value == float("inf"):
                raise ConfigError(f"{name}={value!r} must be a positive finite number")
        self.root = Path(dataset_dir)
        self.spans_dir = self.root / SPANS_DIR
        try:
            self.spans_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatasetError(f"cannot create the dataset directory {self.spans_dir}: {exc.strerror or exc}") from exc
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.max_age_seconds = max_age_seconds
        self.file_prefix = file_prefix
        self.stats = WriterStats()
        self._lock = threading.RLock()
        self._buffer: list[pa.Table] = []
        self._rows = 0
        self._bytes = 0
        self._oldest: float | None = None
        self._closed = threading.Event()
        self._timer = threading.Thread(target=self._age_loop, name="otel-replay-writer", daemon=True)
        self._timer.start()

    def count_dropped(self, rows: int, *, rejected: bool = False) -> None:
        """Count ``rows`` spans that will never be written (``rejected``: refused as unstorable)."""
        with self._lock:
            self.stats.rows_dropped += rows
            if rejected:
                self.stats.spans_rejected += rows

    @property
    def buffered_rows(self) -> int:
        """Rows accepted but not yet in a Parquet file."""
        return self._rows

    def append(self, table: pa.Table) -> list[Path]:
        """Buffer ``table`` (with its ``date`` column); roll files when a limit is hit."""
        if table.num_rows == 0:
            return []
        with self._lock:
            self._buffer.append(table)
            self._rows += table.num_rows
            self._bytes += table.nbytes
            self.stats.rows_buffered += table.num_rows
            if self._oldest is None:
                self._oldest = time.monotonic()
            if self._rows >= self.max_rows or self._bytes >= self.max_bytes:
                return self.flush()
            return []

    def flush(self) -> list[Path]:
        """Write every buffered row to new files, one per partition date."""
        with self._lock:
            if not self._buffer:
                return []
            table = pa.concat_tables(self._buffer)
            try:
                paths = self._write(table)
            except Exception as exc:
                self.stats.write_errors += 1
                if table.num_rows > 4 * self.max_rows:
                    self.stats.rows_dropped += table.num_rows
                    _log.exception(
                        "otel-replay: writing to %s keeps failing; DROPPED %d buffered spans (%d dropped so far)",
                        self.spans_dir,
                        table.num_rows,
                        self.stats.rows_dropped,
                    )
                    self._buffer, self._rows, self._bytes, self._oldest = [], 0, 0, None
                else:
                    _log.exception(
                        "otel-replay: writing %d spans to %s failed; kept buffered", table.num_rows, self.spans_dir
                    )
                    self._buffer = [self._unwritten(table, exc)]
                raise
            self.stats.rows_written += table.num_rows
            self.stats.files_written += len(paths)
            self._buffer = []
            self._rows = 0
            self._bytes = 0
            self._oldest = None
            return paths

    def _unwritten(self, table: pa.Table, error: Exception) -> pa.Table:
        """``table`` less the partitions a failed flush did write (so a retry never duplicates them)."""
        if not isinstance(error, PartialWriteError) or not error.dates:
            return table
        done = pc.is_in(table.column(DATE_COLUMN), value_set=pa.array(error.dates, pa.string()))
        rest = table.filter(pc.invert(done))
        self.stats.rows_written += table.num_rows - rest.num_rows
        self.stats.files_written += len(error.paths)
        self._rows = rest.num_rows
        return rest

    def close(self) -> None:
        """Flush and stop the age timer."""
        self._closed.set()
        self.flush()

    def _write(self, table: pa.Table) -> list[Path]:
        stamp = time.time_ns()
        return write_partitions(
            table, self.spans_dir, lambda date: f"{self.file_prefix}-{stamp}-{uuid.uuid4().hex[:12]}.parquet"
        )

    def _age_loop(self) -> None:
        interval = max(0.05, self.max_age_seconds / 4)
        while not self._closed.wait(interval):
            oldest = self._oldest
            if oldest is not None and time.monotonic() - oldest >= self.max_age_seconds:
                try:
                    self.flush()
                except Exception:  # logged in flush; retried next tick
                    pass
