"""Write-ahead for records that must be durable before a call returns (a gate's intent and commit records).

:func:`otel_replay.configure` gives its pipeline a :class:`SpanLog`: the
receiver's write-ahead log (:class:`otel_replay.server.wal.WriteAheadLog`, one
format and one recovery code: each record is an OTLP
``ExportTraceServiceRequest``) in a directory of this process's own,
``<dataset>/_wal/capture-<pid>-<random>/`` (for an ``s3://`` dataset a local
directory, see :func:`log_root`). A span handed to :meth:`SpanLog.append` is
fsynced before the call returns; concurrent appends share one fsync (group
commit). Such a span never goes through the ``BatchSpanProcessor``
(:class:`WriteAheadProcessor` keeps it from it), so it is stored once.

A thread of the log's own seals the active segment once it is
``seal_seconds`` old and converts sealed segments to Parquet with the
receiver's converter (:func:`otel_replay.server.convert.convert_segment`),
under names derived from the segment (``wal-capture-...-<segment>-NNNNN``),
then deletes them: converting a segment again, after a crash, rewrites the
same files. :meth:`SpanLog.close` (at ``Telemetry.shutdown()``, else at
interpreter exit) converts the rest. A process that died leaves its directory
behind; :func:`recover` (run by the next :func:`otel_replay.configure`,
:func:`otel_replay.open`, ``otel-replay compact`` or ``serve`` on the dataset)
converts the directories no live process holds, salvaging a damaged segment
record by record, and removes them.

Without a gate nothing is appended here: spans take the ``BatchSpanProcessor``
path as before and nothing waits on the disk.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import logging
import os
import secrets
import shutil
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from otel_replay.location import resolve

__all__ = ["CAPTURE_PREFIX", "SpanLog", "WriteAheadProcessor", "log_root", "recover"]

_log = logging.getLogger(__name__)

_EMPTY_GRACE_SECONDS = 60.0
"""A log directory with no segment is removed by :func:`recover` only this long after it changed."""

CAPTURE_PREFIX = "capture-"
"""How a capture process's log directory under the log root is named (the receiver's are named by instance)."""

SEAL_SECONDS = 5.0
"""How old the active segment gets before it is sealed and converted: one Parquet file per date per interval."""


def log_root(dataset: str) -> Path:
    """Where capture logs of ``dataset`` live: ``<dataset>/_wal``; for an ``s3://`` dataset, a local directory.

    The log must be local (an fsync is what makes a record durable):
    ``~/.cache/otel-replay/wal/<digest of the dataset URI>`` (``XDG_CACHE_HOME`` honoured).
    """
    location = resolve(dataset)
    if not location.remote:
        return Path(location.root) / "_wal"
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256(location.root.encode()).hexdigest()[:16]
    return Path(cache) / "otel-replay" / "wal" / digest


def _prefix(directory: Path, segment_id: str) -> str:
    return f"wal-{directory.name}-{segment_id}"


def _convert_dir(directory: Path, dataset: str, segments: Sequence[Any]) -> int:
    """Convert ``segments`` (oldest first) of the log in ``directory``; deletes each once written. Rows written.

    A segment that cannot be converted whole (damage with whole records
    after it) is salvaged as the receiver salvages a quarantined one
    (:func:`otel_replay.server.convert.salvage_segment`, same file names):
    every record that checks out lands, and what was lost is logged as an
    error. An ``OSError`` (disk full) is raised: the segment stays for the next try.
    """
    from otel_replay.server.convert import convert_segment, salvage_segment

    rows = 0
    for segment in segments:
        prefix = _prefix(directory, segment.segment_id)
        try:
            rows += convert_segment(str(segment.path), dataset, prefix)
        except OSError:
            raise
        except Exception as exc:  # noqa: BLE001 - damaged content: salvage what checks out, say what did not
            report = salvage_segment(str(segment.path), dataset, prefix)
            rows += report.rows
            _log.error(
                "otel-replay: capture write-ahead log segment %s could not be converted whole (%s); salvaged %d "
                "span(s), dropped %d span(s) and %d record(s)%s",
                segment.path,
                exc,
                report.rows,
                report.spans_dropped,
                report.records_dropped,
                f"; first: {report.reasons[0]}" if report.reasons else "",
            )
        segment.path.unlink(missing_ok=True)
    return rows


_logs: weakref.WeakSet[SpanLog] = weakref.WeakSet()


def _fresh_logs_in_child() -> None:
    """After ``fork()``, in the child: every log starts a directory of its own on its next append.

    The parent's log (its file, its lock, its converter) stays the
    parent's: the child never appends to it, seals it or converts it.
    """
    for log in list(_logs):
        log._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_logs_in_child)


@atexit.register
def _close_at_exit() -> None:
    """At interpreter exit, convert what every open log holds (a process that never called ``shutdown()``)."""
    for log in list(_logs):
        try:
            log.close()
        except Exception as exc:  # noqa: BLE001 - kept on disk: the next configure() converts it
            _log.error("otel-replay: closing the capture write-ahead log %s at exit failed: %s", log.directory, exc)


class SpanLog:
    """The write-ahead log of spans of this process for one dataset; see the module docstring.

    Nothing is created until the first :meth:`append`: a pipeline without a
    gate never touches the disk here.
    """

    def __init__(self, dataset: str, *, seal_seconds: float = SEAL_SECONDS) -> None:
        """A log for ``dataset`` in a directory of this process's own under :func:`log_root` (made on first use)."""
        self.dataset = dataset
        self.seal_seconds = seal_seconds
        self.directory = log_root(dataset) / f"{CAPTURE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        self._wal: Any = None
        self._encode: Any = None
        self._open_lock = threading.Lock()
        self._lock = threading.Lock()  # one conversion at a time
        self._stop = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.appended = 0
        self.converted_rows = 0
        self.convert_errors = 0
        _logs.add(self)

    def _forked(self) -> None:
        self._wal = None  # the parent's: left open, never closed here (closing would seal the parent's segment)
        self._thread = None
        self._open_lock = threading.Lock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.directory = self.directory.with_name(f"{CAPTURE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")

    def _opened(self) -> Any:
        wal = self._wal
        if wal is not None:
            return wal
        with self._open_lock:
            if self._wal is None:
                from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

                from otel_replay.errors import OtelReplayError
                from otel_replay.server.wal import WriteAheadLog

                if self._closed:
                    raise OtelReplayError(f"the write-ahead log {self.directory} is closed")
                self._encode = encode_spans
                self._wal = WriteAheadLog(self.directory)
                self._thread = threading.Thread(target=self._loop, name="otel-replay-capture-wal", daemon=True)
                self._thread.start()
            return self._wal

    def append(self, spans: Sequence[ReadableSpan]) -> None:
        """Append ``spans`` as one record; returns once it is fsynced (raises when it could not be)."""
        wal = self._opened()
        wal.append(self._encode(spans).SerializeToString())
        self.appended += len(spans)

    def convert(self, *, seal: bool = False) -> int:
        """Seal the active segment (``seal``: now; else once ``seal_seconds`` old), convert the sealed ones; rows."""
        with self._lock:
            if self._closed or self._wal is None:
                return 0
            self._wal.rotate(min_age_seconds=0.0 if seal else self.seal_seconds)
            return self._convert_sealed()

    def _convert_sealed(self) -> int:
        """Convert every sealed segment, oldest first, releasing each once written (caller holds ``_lock``)."""
        from otel_replay.server.convert import convert_segment

        rows = 0
        for segment in self._wal.sealed():
            rows += convert_segment(str(segment.path), self.dataset, _prefix(self.directory, segment.segment_id))
            self._wal.release(segment)
        self.converted_rows += rows
        return rows

    def _loop(self) -> None:
        interval = max(0.05, min(self.seal_seconds / 4, 1.0))
        while not self._stop.wait(interval):
            try:
                self.convert()
            except Exception as exc:  # noqa: BLE001 - the log still holds everything: retried next time
                self.convert_errors += 1
                _log.error("otel-replay: converting the capture write-ahead log %s failed: %s", self.directory, exc)

    def close(self) -> None:
        """Stop the converter, seal the log (appends fail from here) and convert all of it; remove the directory.

        A conversion that fails leaves the directory (its segments) for the
        next :func:`otel_replay.configure` on this dataset to convert.
        """
        with self._open_lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._lock:
            wal = self._wal
            if wal is None:
                return
            wal.close(unlock=False)  # still ours: no recover() takes the directory while it is converted
            try:
                self._convert_sealed()
            except Exception as exc:  # noqa: BLE001 - kept on disk: recover() converts it later
                self.convert_errors += 1
                _log.error(
                    "otel-replay: converting the capture write-ahead log %s at shutdown failed: %s; the next "
                    "configure() on this dataset converts it",
                    self.directory,
                    exc,
                )
            else:
                shutil.rmtree(self.directory, ignore_errors=True)
            finally:
                wal.unlock()


def recover(dataset: str) -> int:
    """Convert the capture logs of ``dataset`` that no live process holds (left by a crash); rows written.

    Each directory is taken under its log's own lock (so a live process's log
    and another recovering process are left alone), its segments are
    converted under the names the dead process would have used (a
    conversion it had started is rewritten, not added again), and it is
    removed. A torn last record (never acknowledged) is ignored; a failure is
    logged and the directory kept for the next try.
    """
    root = log_root(dataset)
    try:
        candidates = sorted(p for p in root.iterdir() if p.name.startswith(CAPTURE_PREFIX) and p.is_dir())
    except OSError:
        return 0
    from otel_replay.server.wal import WAL_SUFFIX, Segment

    rows = 0
    for directory in candidates:
        try:
            fd = os.open(directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live process's log
            paths = sorted(directory.glob(f"*{WAL_SUFFIX}"))
            if not paths and time.time() - directory.stat().st_mtime < _EMPTY_GRACE_SECONDS:
                continue  # nothing to convert, and maybe a log being opened right now (before its lock)
            try:
                rows += _convert_dir(directory, dataset, [Segment(p.stem, p, p.stat().st_size) for p in paths])
            except Exception as exc:  # noqa: BLE001 - kept for the next try, never dropped
                _log.error("otel-replay: recovering the capture write-ahead log %s failed: %s", directory, exc)
                continue
            shutil.rmtree(directory, ignore_errors=True)
        finally:
            os.close(fd)
    if rows:
        _log.info("otel-replay: recovered %d span(s) from capture write-ahead logs of %s", rows, dataset)
    return rows


class WriteAheadProcessor(SpanProcessor):
    """The span processor in front of the ``BatchSpanProcessor``: spans claimed for the log never reach it.

    :meth:`claim` a span (by span id) before it ends; its ended form is then
    kept here for :meth:`take` instead of being queued for the exporter.
    Every other span goes to ``inner`` as before.
    """

    def __init__(self, inner: SpanProcessor) -> None:
        """Wrap ``inner`` (the pipeline's ``BatchSpanProcessor``)."""
        self.inner = inner
        self._claimed: dict[int, ReadableSpan | None] = {}

    def claim(self, span_id: int) -> None:
        """Keep the span ``span_id`` from ``inner`` when it ends."""
        self._claimed[span_id] = None

    def take(self, span_id: int) -> ReadableSpan | None:
        """The claimed span's ended form (``None`` if it did not end), no longer claimed."""
        return self._claimed.pop(span_id, None)

    def release(self, span: ReadableSpan) -> None:
        """Hand a taken span to ``inner`` after all (it could not be logged): it is exported the usual way."""
        self.inner.on_end(span)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Forwarded to ``inner``."""
        self.inner.on_start(span, parent_context=parent_context)

    def _on_ending(self, span: Span) -> None:
        self.inner._on_ending(span)

    def on_end(self, span: ReadableSpan) -> None:
        """A claimed span is kept for :meth:`take`; any other goes to ``inner``."""
        claimed = self._claimed
        if claimed:
            ctx = span.context
            if ctx is not None and ctx.span_id in claimed:
                claimed[ctx.span_id] = span
                return
        self.inner.on_end(span)

    def shutdown(self) -> None:
        """Forwarded to ``inner``."""
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Forwarded to ``inner``."""
        return self.inner.force_flush(timeout_millis)
