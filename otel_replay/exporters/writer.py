"""Buffered, atomic Parquet writer for the ``spans`` dataset.

Rows are buffered in memory and rolled into one file per partition when the
buffer reaches ``max_rows`` rows, ``max_bytes`` bytes or ``max_age_seconds``
seconds; the writer's own thread writes the files, so appending never waits
for the disk (until the bounded backlog is full, see ``DatasetWriter.offer``).
A file is written under a dot-prefixed temporary name, fsynced, then
renamed into place (and the directory fsynced), so a reader never sees a
half-written file and a crash leaves at worst an ignorable ``.tmp`` file.
On an object store (``s3://bucket/prefix``, see
:mod:`otel_replay.location`) a file is one PUT (a multipart upload
for a large one), which is atomic: the object appears whole or not at all.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from otel_replay import settings
from otel_replay.errors import ConfigError, DatasetError, PartialWriteError
from otel_replay.location import Location, PerBackend, resolve

from .checksum import parquet_parts
from .id_keys import footer_metadata
from .key_log import append_entry
from .schema import DATE_COLUMN, SPAN_SCHEMA, SPANS_DIR

__all__ = [
    "TEMP_NAME",
    "DatasetWriter",
    "PartialWriteError",
    "WriterStats",
    "fsync_dir",
    "temp_path",
    "write_atomic",
    "write_bytes_atomic",
    "write_partitions",
    "write_table",
]

_log = logging.getLogger(__name__)


def fsync_dir(path: Path) -> None:
    """Fsync a directory so a rename inside it survives a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


TEMP_NAME = re.compile(r"\..+\.\d+-[0-9a-f]{8}\.tmp")
"""The name :func:`temp_path` gives: ``.<name>.<pid>-<8 hex>.tmp``."""


def temp_path(path: Path) -> Path:
    """A temp file next to ``path``, unique per writer: two processes writing the same path never share one."""
    return path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")


def write_bytes_atomic(data: bytes, path: Path) -> None:
    """Write ``data`` to ``path`` via a temp file unique to this writer, fsync, rename, and a directory fsync."""
    _replace_atomic(path, lambda handle: handle.write(data))


def _write_parquet(
    table: pa.Table, where: object, compression: str, footer: Mapping[bytes, bytes] | None, **kw: object
) -> None:
    """``pq.write_table``, plus ``footer`` in the file's key-value metadata only (not in its Arrow schema)."""
    with pq.ParquetWriter(where, table.schema, compression=compression, **kw) as writer:
        writer.write_table(table)
        if footer:
            writer.add_key_value_metadata(dict(footer))


def write_atomic(
    table: pa.Table, path: Path, *, compression: str = "zstd", footer: Mapping[bytes, bytes] | None = None
) -> None:
    """Write ``table`` to ``path`` via temp file + fsync + rename (``footer``: more key-value metadata).

    The file's footer also carries the CRC-32 of its bytes (:mod:`.checksum`): compaction reads such a file the
    fast way only when its bytes are proved intact.
    """
    parts = parquet_parts(table, compression, footer)
    _replace_atomic(path, lambda handle: handle.writelines(parts))


def _replace_atomic(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """``write`` into a temp file unique to this writer, fsync it, rename it to ``path``, fsync the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # e.g. the disk is full: leave no partial file behind
        raise
    fsync_dir(path.parent)


def put_object(
    table: pa.Table,
    location: Location,
    path: str,
    *,
    compression: str = "zstd",
    footer: Mapping[bytes, bytes] | None = None,
) -> None:
    """Write ``table`` as the object ``path`` (URL form) of a remote ``location``: one atomic PUT or upload."""
    try:
        _write_parquet(table, location.fs_path(path), compression, footer, filesystem=location.fs)
    except (OSError, pa.ArrowException) as exc:
        raise location.error(f"cannot write {path}", exc) from exc


def _write_file(
    table: pa.Table,
    location: Location,
    path: str,
    *,
    compression: str = "zstd",
    footer: Mapping[bytes, bytes] | None = None,
) -> None:
    """Write ``table`` as the file ``path`` of a local ``location``: :func:`write_atomic` (its directories made)."""
    write_atomic(table, Path(path), compression=compression, footer=footer)


_TABLE_WRITES = PerBackend(local=_write_file, objects=put_object)


def write_table(
    table: pa.Table, location: Location, path: Path | str, *, footer: Mapping[bytes, bytes] | None = None
) -> None:
    """Write ``table`` as the Parquet file ``path`` of ``location``, whole or not at all, durable on return.

    Locally a temp file, fsync and rename (:func:`write_atomic`); on an
    object store one PUT or upload (:func:`put_object`). ``footer``: more
    key-value metadata.

    Raises:
        OSError: a local file cannot be written (the disk is full, permission denied).
        DatasetError: an object cannot be written (named, with why).

    """
    _TABLE_WRITES.of(location)(table, location, str(path), footer=footer)


def _by_date(table: pa.Table) -> list[tuple[str, pa.Table]]:
    """``table``'s rows split by their ``date`` column, in date order (rows keep their order within a date).

    One stable sort and zero-copy slices: filtering the table once per date
    would cost dates x rows.
    """
    dates = table.column(DATE_COLUMN)
    body = table.drop_columns([DATE_COLUMN]).replace_schema_metadata(SPAN_SCHEMA.metadata)
    counts = pc.value_counts(dates)
    if len(counts) <= 1:
        return [(date.as_py(), body) for date in counts.field("values")]
    order = pc.sort_indices(dates)  # stable
    body = body.take(order)
    counts = pc.value_counts(dates.take(order))  # first-appearance order of a sorted column: date order
    parts: list[tuple[str, pa.Table]] = []
    offset = 0
    for date, count in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True):
        parts.append((date, body.slice(offset, count)))
        offset += count
    return parts


def write_partitions(
    table: pa.Table, spans_dir: str | os.PathLike[str], file_name: Callable[[str], str]
) -> list[Path | str]:
    """Write rows (with their ``date`` column) as one file per date under ``spans_dir/date=…/``.

    ``file_name(date)`` names each file. Every file is written with
    :func:`write_table` (local: ``Path`` results; when ``spans_dir`` is an
    ``s3://`` URL, one object each: URL-string results); each carries the
    storage schema version and, in its footer, the keys of its ids (:mod:`.id_keys`).
    """
    location = resolve(spans_dir)
    paths: list[Path | str] = []
    parts = _by_date(table)
    unique = [date for date, _ in parts]
    for date, part in parts:
        footer = footer_metadata(part)  # the file's ids: a lookup finds it without reading it
        path = location.native(location.join(f"date={date}", file_name(date)))
        try:
            write_table(part, location, path, footer=footer)
        except Exception as exc:
            raise PartialWriteError(paths, unique[: len(paths)]) from exc
        paths.append(path)
        append_entry(path, footer)  # its keys in the partition's log: readers need not open it (.key_log)
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


_writers: weakref.WeakSet[DatasetWriter] = weakref.WeakSet()


def _fresh_writers_in_child() -> None:
    """After ``fork()``, in the child: every writer starts empty, with locks and a writer thread of its own.

    The rows a writer held at the fork (buffered, pending, being written) are
    the parent's to write: a child that wrote them too would store each of
    those spans twice. Its locks may have been held by a parent's thread
    that does not run here.
    """
    for writer in list(_writers):
        writer._forked()


if hasattr(os, "register_at_fork"):  # not on Windows, where there is no fork
    os.register_at_fork(after_in_child=_fresh_writers_in_child)


class DatasetWriter:
    """Append Arrow tables (from :mod:`rows`) to a hive-partitioned dataset, writing on a thread of its own.

    ``append`` only buffers: it never writes, so the caller (an exporter on
    the ``BatchSpanProcessor`` thread) is never held up by a slow disk. When
    the buffer reaches ``max_rows`` rows or ``max_bytes`` bytes it becomes one
    pending file, which the writer thread writes; rows older than
    ``max_age_seconds`` are rolled by the same thread. ``flush()`` writes
    everything accepted so far on the calling thread and returns when it is
    durable (or raises); ``close()`` flushes and stops the thread.

    A failed write keeps its rows (first in line) and is retried on the next
    roll, on a flush, or after a pause. Only when writes keep failing and the
    backlog reaches four times ``max_rows`` is it dropped, logged as an error
    and counted in ``stats.rows_dropped``: never silently. ``when_full`` says
    what :meth:`offer` does while that many rows wait for the disk: ``"wait"``
    (default) or ``"drop"`` (and count).
    """

    def __init__(
        self,
        dataset_dir: str | os.PathLike[str],
        *,
        max_rows: int = 200_000,
        max_bytes: int = 128 * 1024 * 1024,
        max_age_seconds: float = 5.0,
        file_prefix: str = "part",
        when_full: str = "wait",
    ) -> None:
        """Open (creating) ``dataset_dir``; see the class docstring for the roll rules and ``when_full``."""
        if when_full not in ("wait", "drop"):
            raise ConfigError(f"when_full={when_full!r} must be 'wait' or 'drop'")
        max_rows = int(settings.check_number("max_rows", max_rows, integer=True, maximum=2**53))
        max_bytes = int(settings.check_number("max_bytes", max_bytes, integer=True, maximum=2**53))
        # past this the roll and the retry after a failed write would never come: spans would sit unwritten
        max_age_seconds = settings.check_number("max_age_seconds", max_age_seconds, maximum=settings.MAX_WAIT_SECONDS)
        self.location = resolve(dataset_dir)
        self.root: Path | str
        self.spans_dir: Path | str
        self.location.check()  # an object store: one clear line now, not a write error per file later
        self.root = self.location.native(self.location.root)
        self.spans_dir = self.location.native(self.location.join(SPANS_DIR))
        try:
            self.location.make_dirs(self.spans_dir)  # a directory is made now; an object store has none
        except OSError as exc:
            raise DatasetError(f"cannot create the dataset directory {self.spans_dir}: {exc.strerror or exc}") from exc
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.max_age_seconds = max_age_seconds
        self.file_prefix = file_prefix
        self.when_full = when_full
        self.stats = WriterStats()
        self._lock = threading.Lock()  # the buffers and stats; never held during a write
        self._write_lock = threading.Lock()  # one write at a time, oldest rows first
        self._wake = threading.Condition(self._lock)
        self._buffer: list[pa.Table] = []  # the file being filled
        self._buffer_rows = 0
        self._bytes = 0
        self._oldest: float | None = None
        self._pending: collections.deque[pa.Table] = collections.deque()  # full files waiting to be written
        self._pending_rows = 0
        self._inflight_rows = 0
        self._failed = False  # the last write failed: retry on new rows, a flush, or after a pause
        self._failed_at = 0.0
        self._warned = False
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otel-replay-writer", daemon=True)
        self._thread.start()
        _writers.add(self)

    def _forked(self) -> None:
        """In a forked child: the parent's rows forgotten (see :func:`_fresh_writers_in_child`), a thread started."""
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._buffer, self._buffer_rows, self._bytes, self._oldest = [], 0, 0, None
        self._pending = collections.deque()
        self._pending_rows = self._inflight_rows = 0
        self._failed = False
        closed = self._closed.is_set()
        self._closed = threading.Event()
        if closed:
            self._closed.set()
            return
        self._thread = threading.Thread(target=self._run, name="otel-replay-writer", daemon=True)
        self._thread.start()

    def count_dropped(self, rows: int, *, rejected: bool = False) -> None:
        """Count ``rows`` spans that will never be written (``rejected``: refused as unstorable)."""
        with self._lock:
            self.stats.rows_dropped += rows
            if rejected:
                self.stats.spans_rejected += rows

    @property
    def buffered_rows(self) -> int:
        """Rows accepted but not yet in a Parquet file (including a file being written now)."""
        with self._lock:
            return self._buffer_rows + self._pending_rows + self._inflight_rows

    def append(self, table: pa.Table) -> list[Path | str]:
        """Buffer ``table`` (with its ``date`` column); see :meth:`offer`. Returns ``[]`` (no file is written here)."""
        self.offer(table)
        return []

    def offer(self, table: pa.Table) -> bool:
        """Buffer ``table`` (with its ``date`` column); ``False`` when it was dropped (and counted).

        Never writes: a full buffer becomes a pending file for the writer
        thread. The hand-off is bounded: while four full files
        (``4 * max_rows`` rows) already wait for the disk, ``when_full="wait"``
        (the default, for batch jobs) waits for the writer to catch up, and
        ``when_full="drop"`` (the exporter, whose caller must never wait for
        the disk) drops the new rows, logs that once and counts them in
        ``stats.rows_dropped``. Memory stays bounded either way.
        """
        if table.num_rows == 0:
            return True
        with self._lock:
            while self._pending_rows + self._inflight_rows >= 4 * self.max_rows:
                if self.when_full == "drop":
                    self.stats.rows_dropped += table.num_rows
                    first, self._warned = not self._warned, True
                    dropped = self.stats.rows_dropped
                    break
                self._wake.wait()
            else:
                self._buffer.append(table)
                self._buffer_rows += table.num_rows
                self._bytes += table.nbytes
                self.stats.rows_buffered += table.num_rows
                if self._oldest is None:
                    self._oldest = time.monotonic()
                if self._buffer_rows >= self.max_rows or self._bytes >= self.max_bytes:
                    self._seal()
                    self._failed = False
                    self._wake.notify_all()
                return True
        if first:
            _log.error(
                "otel-replay: %d spans are waiting for %s to be written; DROPPED %d new spans "
                "(%d dropped so far, counted in stats.rows_dropped; later drops are counted, not logged)",
                self.buffered_rows,
                self.spans_dir,
                table.num_rows,
                dropped,
            )
        return False

    def _seal(self) -> None:
        """Turn the buffer into one pending file (caller holds ``_lock``)."""
        if self._buffer:
            self._pending.append(pa.concat_tables(self._buffer) if len(self._buffer) > 1 else self._buffer[0])
            self._pending_rows += self._buffer_rows
            self._buffer, self._buffer_rows, self._bytes, self._oldest = [], 0, 0, None

    def flush(self) -> list[Path | str]:
        """Write every row accepted so far, one file per pending batch and partition date; durable on return.

        Raises the first write error (those rows stay first in line, see the class docstring).
        """
        paths: list[Path | str] = []
        with self._write_lock:
            with self._lock:
                self._seal()
                self._failed = False
            while self._write_next(paths):
                pass
        return paths

    def _write_next(self, paths: list[Path | str]) -> bool:
        """Write the oldest pending file (caller holds ``_write_lock``); ``False`` when none was left."""
        with self._lock:
            if not self._pending:
                return False
            table = self._pending.popleft()
            self._pending_rows -= table.num_rows
            self._inflight_rows = table.num_rows
        try:
            written = self._write(table)
        except Exception as exc:
            with self._lock:
                self._inflight_rows = 0
                self._failed_write(table, exc)
                self._wake.notify_all()  # a waiting offer() sees the backlog it left (or that it was dropped)
            raise
        with self._lock:
            self._inflight_rows = 0
            self.stats.rows_written += table.num_rows
            self.stats.files_written += len(written)
            self._wake.notify_all()
        paths.extend(written)
        return True

    def _failed_write(self, table: pa.Table, error: Exception) -> None:
        """Keep a failed file's unwritten rows first in line, or drop the whole backlog (caller holds ``_lock``)."""
        self.stats.write_errors += 1
        self._failed, self._failed_at = True, time.monotonic()
        rest = self._unwritten(table, error)
        backlog = rest.num_rows + self._pending_rows + self._buffer_rows
        if backlog >= 4 * self.max_rows:
            self.stats.rows_dropped += backlog
            _log.error(
                "otel-replay: writing to %s keeps failing; DROPPED %d buffered spans (%d dropped so far)",
                self.spans_dir,
                backlog,
                self.stats.rows_dropped,
                exc_info=error,
            )
            self._pending.clear()
            self._pending_rows = 0
            self._buffer, self._buffer_rows, self._bytes, self._oldest = [], 0, 0, None
            return
        _log.error(
            "otel-replay: writing %d spans to %s failed; kept buffered", rest.num_rows, self.spans_dir, exc_info=error
        )
        if rest.num_rows:
            self._pending.appendleft(rest)
            self._pending_rows += rest.num_rows

    def _unwritten(self, table: pa.Table, error: Exception) -> pa.Table:
        """``table`` less the partitions a failed write did write (so a retry never duplicates them)."""
        if not isinstance(error, PartialWriteError) or not error.dates:
            return table
        done = pc.is_in(table.column(DATE_COLUMN), value_set=pa.array(error.dates, pa.string()))
        rest = table.filter(pc.invert(done))
        self.stats.rows_written += table.num_rows - rest.num_rows
        self.stats.files_written += len(error.paths)
        return rest

    def close(self) -> None:
        """Flush and stop the writer thread."""
        self._closed.set()
        with self._lock:
            self._wake.notify_all()
        try:
            self.flush()
        finally:
            if self._thread is not threading.current_thread():
                self._thread.join(timeout=60)

    def _write(self, table: pa.Table) -> list[Path | str]:
        stamp = time.time_ns()
        return write_partitions(
            table, self.spans_dir, lambda date: f"{self.file_prefix}-{stamp}-{uuid.uuid4().hex[:12]}.parquet"
        )

    def _run(self) -> None:
        """The writer thread: write pending files as they come, roll the buffer by age."""
        interval = max(0.05, min(self.max_age_seconds / 4, 1.0))
        while not self._closed.is_set():
            with self._lock:
                if not self._pending or self._failed:
                    self._wake.wait(interval)
                if self._closed.is_set():
                    return
                if self._failed and time.monotonic() - self._failed_at >= max(1.0, self.max_age_seconds):
                    self._failed = False
                oldest = self._oldest
                if oldest is not None and time.monotonic() - oldest >= self.max_age_seconds:
                    self._seal()
                    self._failed = False
                ready = bool(self._pending) and not self._failed
            if ready:
                try:
                    with self._write_lock:
                        while self._write_next([]):
                            pass
                except Exception:  # logged in _failed_write; retried on the next roll, age tick or flush
                    pass
