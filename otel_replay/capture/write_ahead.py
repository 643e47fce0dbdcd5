"""Write-ahead for records that must be durable before a call returns (a gate's intent and commit records).

:func:`otel_replay.configure` gives its pipeline a :class:`SpanLog`: the
receiver's write-ahead log (:class:`otel_replay.storage.wal.WriteAheadLog`, one
format and one recovery code: each record is an OTLP
``ExportTraceServiceRequest``) in a directory of this process's own,
``<dataset>/_wal/capture-<pid>-<random>/`` (for an ``s3://`` dataset a local
directory, see :func:`log_root`). A span handed to :meth:`SpanLog.append` is
fsynced before the call returns; concurrent appends share one fsync (group
commit). Such a span never goes through the ``BatchSpanProcessor``
(:class:`WriteAheadProcessor` keeps it from it), so it is stored once.

A thread of the log's own seals the active segment once it is
``seal_seconds`` old (or sooner, once the records held for it as spans
reach :data:`SEAL_HELD`) and converts sealed segments to Parquet with the
receiver's converter (:class:`otel_replay.storage.convert.ChunkWriter`; the
one-span records regrouped first by :func:`otel_replay.storage.regroup.regrouped`,
so a run of them converts as one batch; while this process still holds a
segment's records as spans, from the spans instead, see
:mod:`otel_replay.capture.kept_spans`), under names derived from the segment (``wal-capture-...-<segment>-NNNNN``),
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
import logging
import os
import secrets
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from otel_replay import semconv as sc
from otel_replay.capture.kept_spans import KEPT_BYTES, KeptSpans
from otel_replay.capture.log_encoding import RequestEncoder as _RequestEncoder  # the name it had here
from otel_replay.capture.log_recovery import CAPTURE_PREFIX, convert_log_segment, log_root, recover, segment_prefix
from otel_replay.errors import OtelReplayError

__all__ = [
    "CAPTURE_PREFIX",
    "HOLD_LIMIT",
    "Queued",
    "SpanLog",
    "WriteAheadProcessor",
    "convert_log_segment",
    "log_root",
    "recover",
]

_log = logging.getLogger(__name__)

_SEQ = sc.RECORD_SEQ  # a span with a chain position is a sealed record

SEAL_SECONDS = 5.0
"""How old the active segment gets before it is sealed and converted: one Parquet file per date per interval."""

SEAL_HELD = KEPT_BYTES // 4
"""Bytes of records held as spans (:mod:`otel_replay.capture.kept_spans`) past which the active segment is sealed
before it is ``seal_seconds`` old.

A segment converts from its held spans only when every one of its records is
held, and at most :data:`~otel_replay.capture.kept_spans.KEPT_BYTES` are: at
~2,000 gated commits a second (two records of ~2.1 KiB each) a segment of
five seconds holds 42 MB, so past the bound every segment was decoded from its
bytes again. Sealed at a quarter of the bound, the records appended while the
log's thread gets to it (it may be converting the segment before, sharing the
GIL with the agents) fit in the rest: at half, under load, some did not.
"""


_logs: weakref.WeakSet[SpanLog] = weakref.WeakSet()
_processors: weakref.WeakSet[WriteAheadProcessor] = weakref.WeakSet()


def _fresh_logs_in_child() -> None:
    """After ``fork()``, in the child: every log starts a directory of its own on its next append.

    The parent's log (its file, its lock, its converter) stays the
    parent's: the child never appends to it, seals it or converts it; nor
    does it write the record spans the parent held for its next write-ahead.
    """
    for log in list(_logs):
        log._forked()
    for processor in list(_processors):
        processor._forked()


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


class Queued(NamedTuple):
    """A record :meth:`SpanLog.enqueue` queued: what :meth:`SpanLog.wait` needs to see it durable."""

    wal: Any
    ticket: int
    payload: bytes
    held: KeptSpans | None
    spans: int


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
        self._wake = threading.Event()  # set by an append past SEAL_HELD: the log's thread seals and converts now
        self._closed = False
        self._thread: threading.Thread | None = None
        self._kept = KeptSpans()
        self._in_flight = 0  # records queued and not yet waited for (see wait_queued)
        self._settled = threading.Condition()
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
        self._wake = threading.Event()
        self._kept = KeptSpans()  # the parent's records are the parent's to convert
        self._in_flight = 0  # the parent's threads wait for theirs
        self._settled = threading.Condition()
        self.directory = self.directory.with_name(f"{CAPTURE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")

    def _opened(self) -> Any:
        wal = self._wal
        if wal is not None:
            return wal
        with self._open_lock:
            if self._wal is None:
                # start-up cost: the log loads when a gate first writes ahead; an agent without a gate never pays for it
                from otel_replay.storage.wal import WriteAheadLog

                if self._closed:
                    raise OtelReplayError(f"the write-ahead log {self.directory} is closed")
                self._encode = _RequestEncoder().encode
                self._wal = WriteAheadLog(self.directory)
                self._thread = threading.Thread(target=self._loop, name="otel-replay-capture-wal", daemon=True)
                self._thread.start()
            return self._wal

    def append(self, spans: Sequence[ReadableSpan]) -> None:
        """Append ``spans`` as one record; returns once it is fsynced (raises when it could not be)."""
        self.wait(self.enqueue(spans))

    def enqueue(self, spans: Sequence[ReadableSpan]) -> Queued:
        """Queue ``spans`` as one record without waiting for the disk; pass the answer to :meth:`wait`.

        Records are made durable in the order they are queued (see
        :meth:`~otel_replay.storage.wal.WriteAheadLog.enqueue`).
        """
        wal = self._opened()
        payload = self._encode(spans)
        held = self._kept
        kept = held.keep(payload, spans)
        try:
            ticket = wal.enqueue(payload)
        except BaseException:
            if kept:
                held.drop((payload,))  # never written: no segment holds it
            raise
        with self._settled:
            self._in_flight += 1
        return Queued(wal, ticket, payload, held if kept else None, len(spans))

    def wait(self, queued: Queued) -> None:
        """Return once the record ``queued`` is fsynced; raises (and forgets its spans) when it could not be."""
        try:
            queued.wal.wait(queued.ticket)
        except BaseException:
            if queued.held is not None:
                queued.held.drop((queued.payload,))  # cut off or never written: no segment holds it
            raise
        finally:
            with self._settled:
                self._in_flight -= 1
                if not self._in_flight:
                    self._settled.notify_all()
        self.appended += queued.spans
        if queued.held is not None and queued.held.held_bytes >= SEAL_HELD and not self._wake.is_set():
            self._wake.set()

    def wait_queued(self, timeout: float) -> bool:
        """Return once every record queued so far was waited for (fsynced, or its failure told); ``False``: timed out.

        For a record made durable elsewhere (an outcome beside its claim):
        called holding the pipeline's write order, so no record is queued
        meanwhile, it keeps that record from being durable before a gate
        record queued ahead of it on another thread.
        """
        if not self._in_flight:  # read without the lock: under the write order nothing is queued meanwhile
            return True
        with self._settled:
            return self._settled.wait_for(lambda: not self._in_flight, timeout)

    def convert(self, *, seal: bool = False) -> int:
        """Seal the active segment (``seal``: now; else once ``seal_seconds`` old), convert the sealed ones; rows."""
        with self._lock:
            if self._closed or self._wal is None:
                return 0
            self._wal.rotate(min_age_seconds=0.0 if seal else self.seal_seconds)
            return self._convert_sealed()

    def _convert_sealed(self) -> int:
        """Convert every sealed segment, oldest first, releasing each once written (caller holds ``_lock``).

        A segment whose every record this process still holds as spans is
        converted from them (:meth:`~otel_replay.capture.kept_spans.KeptSpans.convert`); any other from its bytes.
        """
        rows = 0
        for segment in self._wal.sealed():
            prefix = segment_prefix(self.directory, segment.segment_id)
            written = self._kept.convert(segment.path, self.dataset, prefix)
            rows += convert_log_segment(segment.path, self.dataset, prefix) if written is None else written
            self._wal.release(segment)
        self.converted_rows += rows
        return rows

    def _seal_early(self) -> bool:
        """Whether to seal the active segment before its age: its held records are past :data:`SEAL_HELD`.

        Not while a sealed segment waits (its conversion failed and is
        retried): its held records count too, and sealing each time would
        only cut the active segment into more, smaller files.
        """
        wal = self._wal
        return self._kept.held_bytes >= SEAL_HELD and wal is not None and not wal.sealed()

    def _loop(self) -> None:
        interval = max(0.05, min(self.seal_seconds / 4, 1.0))
        wake, stop = self._wake, self._stop
        while True:
            wake.wait(interval)
            if stop.is_set():
                return
            wake.clear()
            try:
                self.convert(seal=self._seal_early())
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
        self._wake.set()
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


_RETRY_RELEASE = 1.0
"""Seconds after a failed release past :data:`HOLD_LIMIT` before a record's end tries again (the ticker and flushes
try on their own turns)."""

_TICK_WAIT = 0.05
"""Seconds the ticker waits for the write order before it leaves the held spans to its next turn."""

HOLD_LIMIT = 1024
"""Record spans a :class:`WriteAheadProcessor` holds for the next write-ahead; past it they go to the batch queue.

Released at once, they fit the SDK's own queue size (2,048) when a user sets ``OTEL_BSP_MAX_QUEUE_SIZE`` to it.
"""


class WriteAheadProcessor(SpanProcessor):
    """The span processor in front of the ``BatchSpanProcessor``: spans claimed for the log never reach it.

    :meth:`claim` a span (by span id) before it ends; its ended form is then
    kept here for :meth:`take` instead of being queued for the exporter.

    Once the process writes ahead (:meth:`hold_records`, at its first gate
    record, or at its first outcome stored beside its claim), the sealed
    records that end here (decisions, audit entries, outcomes: spans with a
    chain position) are held for the next write-ahead instead, which makes
    them durable with its own record (:meth:`take_held`): a durable record is
    then never preceded in its chain by a record a crash could still take,
    such as the decision a commit made after its ``audit()`` block acts on.
    Held spans go to ``inner`` after all when they are :data:`HOLD_LIMIT` or
    older than the log's file age (:meth:`release_held`, from a thread of this
    processor's), and at ``force_flush`` and ``shutdown``; :meth:`take_held`
    then says so, and the next write-ahead flushes ``inner`` first. Every
    other span goes to ``inner`` as before.

    A record takes its chain position (its seal) a moment before its span
    ends here: both happen holding :attr:`write_order`, and a write-ahead
    takes the held records holding it too, so no record sealed before the
    write-ahead's own is still on its way here when it does. A thread that
    writes ahead inside that moment (a span processor of the user's that
    commits as a record's span ends) runs after this processor has held
    the record.
    """

    def __init__(self, inner: SpanProcessor) -> None:
        """Wrap ``inner`` (the pipeline's ``BatchSpanProcessor``)."""
        self.inner = inner
        self._claimed: dict[int, Any] = {}  # span id -> None until it ends, then what on_claimed made of it
        self._holding = False
        self._held: list[ReadableSpan] = []
        self._held_at = 0.0
        self._released = True  # records went to ``inner`` since the last take: all of them, before holding starts
        self._hold_lock = threading.Lock()
        self._ticker: threading.Thread | None = None  # releases held spans grown old (started by hold_records)
        self._stop = threading.Event()
        self._shut = False
        self.write_order = threading.RLock()
        """Held from before a record's seal until its span has ended here (a durable record: until its log record
        is queued, not fsynced), and while a write-ahead takes the held records: records reach the log in the order
        of their chain positions, so a durable record never follows one a crash could take.
        Reentrant: a span processor of the user's that commits as a record's span ends runs under it."""
        self.on_claimed: Callable[[ReadableSpan], object] | None = None
        """Called with a claimed span as it ends here (the pipeline queues it in the log then, before span
        processors added after this one run: one that commits as the span ends queues a record that follows it in
        the chain after it); :meth:`take` returns its answer. ``None``: :meth:`take` returns the span."""
        self._release_failed_at = float("-inf")  # when a release past HOLD_LIMIT last failed
        self.before_release: Callable[[], None] | None = None
        """Called holding :attr:`write_order` before held record spans go to ``inner`` (the pipeline syncs a store's
        commit of the records sealed before them: an outcome beside its claim); when it raises they stay held."""
        _processors.add(self)

    def _forked(self) -> None:
        """In a forked child: the held records are the parent's to write; the child's first write-ahead flushes."""
        self._hold_lock = threading.Lock()
        self.write_order = threading.RLock()  # maybe held by a parent's thread that does not run here
        self._held = []
        self._released = True
        self._holding = False  # until the child's own first write-ahead, which starts its own ticker
        self._ticker = None
        self._stop = threading.Event()

    def claim(self, span_id: int) -> None:
        """Keep the span ``span_id`` from ``inner`` when it ends."""
        self._claimed[span_id] = None

    def take(self, span_id: int) -> Any:
        """The claimed span's ended form (``None`` if it did not end), no longer claimed."""
        return self._claimed.pop(span_id, None)

    def hold_records(self, release_after: float) -> None:
        """From now on, hold the record spans that end here for the next write-ahead (see the class docstring).

        Held spans ``release_after`` seconds old go to ``inner``, handed over
        by a thread of this processor's (started on the first call).
        """
        self._holding = True
        if self._ticker is None:
            self._start_ticker(release_after)

    def _start_ticker(self, release_after: float) -> None:
        with self._hold_lock:
            if self._ticker is not None or self._shut:
                return
            ticker = self._ticker = threading.Thread(
                target=self._tick, args=(release_after, self._stop), name="otel-replay-held", daemon=True
            )
        ticker.start()

    def _tick(self, release_after: float, stop: threading.Event) -> None:
        """The ticker's loop: held spans as old as ``release_after`` go to ``inner``, until ``stop`` is set."""
        while not stop.wait(max(0.05, min(release_after / 4, 1.0))):
            try:
                self.release_held(release_after, wait=_TICK_WAIT)
            except Exception as exc:  # noqa: BLE001 - held spans stay held: released at the next turn or flush
                _log.error("otel-replay: releasing held record spans failed: %s", exc)

    def _stop_ticker(self) -> None:
        with self._hold_lock:
            self._shut = True
            ticker, self._ticker = self._ticker, None
            stop, self._stop = self._stop, threading.Event()
        stop.set()
        if ticker is not None and ticker is not threading.current_thread():
            ticker.join()

    def take_held(self) -> tuple[list[ReadableSpan], bool]:
        """The record spans held since the last take, and whether any went to ``inner`` meanwhile instead.

        Called holding :attr:`write_order`, once the write-ahead's own record
        is sealed: every record sealed before it has ended here by then (see
        the class docstring).
        """
        with self._hold_lock:
            held, self._held = self._held, []
            released, self._released = self._released, False
        return held, released

    def give_back(self, spans: Sequence[ReadableSpan]) -> None:
        """``spans`` that a write-ahead, or an outcome's store, took and did not keep.

        While holding, they are held again (first): like every held span they
        reach ``inner`` only through :meth:`release_held`, once the outcomes
        committed before them are synced. Otherwise (before holding starts,
        or at shutdown) they go to ``inner``, and the next write-ahead flushes
        it first.
        """
        if self._holding and not self._shut:
            # the "flush first" mark is set too: a write-ahead that failed may have taken it, with nothing to give back
            self.hold_again(spans, True)
            return
        with self._hold_lock:  # handed over before a write-ahead can read "released" and flush without them
            self._released = True
            for span in spans:
                self.inner.on_end(span)

    def hold_again(self, spans: Sequence[ReadableSpan], released: bool) -> None:
        """Hold ``spans`` again, first: :meth:`take_held` gave them (and ``released``) to a write-ahead that failed."""
        with self._hold_lock:
            if not self._held:
                self._held_at = time.monotonic()
            self._held[:0] = spans
            self._released = self._released or released

    def release_held(self, older_than: float | None = None, *, wait: float = -1) -> int:
        """Hand the held record spans to ``inner`` (only when the oldest is ``older_than`` seconds); how many.

        :attr:`before_release` runs first, holding :attr:`write_order`: a
        record held here was sealed after every outcome committed so far, so
        that commit reaches the disk before a Parquet file with the record
        can (else a machine crash could keep the file and lose the outcome,
        and ``verify`` would read the gap as a deletion). When it raises, the
        spans stay held (for the next turn, flush or shutdown) and it is raised.
        ``wait``: seconds to wait for the write order (``-1``: as long as it
        takes); past it, nothing is released (the ticker's turn: a shutdown
        that holds the order joins the ticker).
        """
        if not self._due(older_than):  # read without the lock first: most turns find nothing due
            return 0
        before = self.before_release
        if before is None:
            return self._release(older_than)
        if not self.write_order.acquire(timeout=wait):
            return 0
        try:
            before()
            return self._release(older_than)
        finally:
            self.write_order.release()

    def _due(self, older_than: float | None) -> bool:
        """Whether spans are held (and the oldest is ``older_than`` seconds old, when given)."""
        return bool(self._held) and (older_than is None or time.monotonic() - self._held_at >= older_than)

    def _release(self, older_than: float | None) -> int:
        """:meth:`release_held` itself."""
        with self._hold_lock:
            if not self._due(older_than):
                return 0
            held = self._held
            self._held = []
            self._released = True
            for span in held:  # under the lock: a write-ahead that reads "released" finds them in ``inner``
                self.inner.on_end(span)
        return len(held)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Forwarded to ``inner``."""
        self.inner.on_start(span, parent_context=parent_context)

    def _on_ending(self, span: Span) -> None:
        self.inner._on_ending(span)

    def on_end(self, span: ReadableSpan) -> None:
        """A claimed span is kept for :meth:`take`, a record span held once holding; any other goes to ``inner``."""
        claimed = self._claimed
        if claimed:
            ctx = span.context
            if ctx is not None and ctx.span_id in claimed:
                hook = self.on_claimed
                claimed[ctx.span_id] = span if hook is None else hook(span)
                return
        if self._holding:
            attributes = span.attributes
            if attributes is not None and _SEQ in attributes:
                with self._hold_lock:
                    held = self._held
                    if not held:
                        self._held_at = time.monotonic()
                    held.append(span)
                    full = len(held) >= HOLD_LIMIT
                if full and time.monotonic() - self._release_failed_at >= _RETRY_RELEASE:
                    try:
                        self.release_held()
                    except Exception as exc:  # noqa: BLE001 - never into the span's end: they stay held, retried
                        self._release_failed_at = time.monotonic()  # not at every span's end while the disk fails
                        _log.error(
                            "otel-replay: releasing %d held record spans failed (retried in %.0f s, or at the next "
                            "flush): %s",
                            len(self._held),
                            _RETRY_RELEASE,
                            exc,
                        )
                return
        self.inner.on_end(span)

    def shutdown(self) -> None:
        """The ticker stopped, the held record spans to ``inner`` (also when the store's sync fails), then forwarded."""
        self._stop_ticker()
        try:
            self.release_held()
        except Exception as exc:  # noqa: BLE001 - written all the same: held here, they would be lost at exit
            _log.error(
                "otel-replay: syncing the outcomes committed before the last held records failed at shutdown (%s: "
                "%s); the records are written to Parquet all the same",
                type(exc).__name__,
                exc,
            )
            self._release(None)
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """The held record spans to ``inner``, then forwarded; ``False`` (they stay held) if the store cannot sync."""
        try:
            self.release_held()
        except Exception as exc:  # noqa: BLE001 - reported by the answer, as a flush that failed
            _log.error(
                "otel-replay: flush: syncing the outcomes committed before the held records failed (%s: %s); the "
                "records stay held for the next flush",
                type(exc).__name__,
                exc,
            )
            self.inner.force_flush(timeout_millis)
            return False
        return self.inner.force_flush(timeout_millis)
