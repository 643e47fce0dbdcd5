"""The receiver: admission control (see :mod:`.admission`), the write-ahead log, the Parquet converter, both services.

Ack path (any service): admission (a bounded in-flight memory reservation that
grows with the bytes actually read and decoded, and a bounded WAL backlog;
otherwise :class:`Overloaded`, i.e. 429 / RESOURCE_EXHAUSTED) -> decode ->
:func:`~.convert.admit_spans` (drop spans with invalid ids or times that
cannot be stored, reported as partial success) -> WAL append + fsync ->
acknowledge. Log requests take the same path (:meth:`Receiver.accept_logs`,
:func:`~otel_replay.storage.logs.admit_logs`) into the same WAL, wrapped so
the converter writes them to ``<dataset>/logs/``.

Background: the active WAL segment is sealed every ``flush_seconds`` (or when
full, or when the converters are idle and it holds ``EARLY_SEAL_BYTES``);
sealed segments are converted to Parquet (in a converter process by
default) under names derived from the segment id, then deleted. On start,
segments left by a crash are converted the same way, so replay never adds rows
twice: it rewrites the same files. A segment whose conversion fails for a
reason other than I/O (or that kills the converter three times) is moved to
``<wal>/quarantine/`` and converted record by record, span by span
(:func:`~.convert.salvage_segment`): every good span lands, the rest are
counted and named in ``<segment>.report.json``; the segments behind it never wait.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_replay._flock import held_elsewhere
from otel_replay.capture.write_ahead import CAPTURE_PREFIX
from otel_replay.capture.write_ahead import recover as recover_capture_logs
from otel_replay.errors import DatasetError
from otel_replay.exporters.writer import fsync_dir
from otel_replay.location import resolve
from otel_replay.storage.backend import backend_for
from otel_replay.storage.background import BackgroundCompactor
from otel_replay.storage.convert import (
    MAX_DATES_PER_REQUEST,
    MAX_SHARED_BYTES_PER_REQUEST,
    Converted,
    Salvage,
    admit_spans,
    convert_segment_rows,
    salvage_segment,
    worker_init,
)
from otel_replay.storage.logs import admit_logs, wrap_logs
from otel_replay.storage.wal import LOCK_NAME, WAL_SUFFIX, Segment, WriteAheadLog

from .admission import Overloaded, Reservation, release_free_memory
from .config import Metrics, MiB, ServerConfig, parse_address
from .grpc_service import GrpcService
from .http_service import HttpService

__all__ = ["MAX_DATES_PER_SEGMENT", "Receiver", "stranded_wal_dirs"]

_log = logging.getLogger("otel_replay.server")
QUARANTINE_DIR = "quarantine"
MAX_DATES_PER_SEGMENT = 64
"""Distinct start dates (UTC days, other than yesterday, today and tomorrow) one WAL segment takes; more: 429.

Each date of a segment becomes a Parquet file (and maybe a new partition
directory) when it is converted. The per-request cap alone
(:data:`~.convert.MAX_DATES_PER_REQUEST`) let 250 small requests fan out into
8,001 partitions and stall conversion for 52 s. Shed, not refused: the
client retries once the segment is sealed (every ``flush_seconds``), so a
backfill across many days slows down to this many new dates per segment,
and loses nothing. A request alone in an empty segment is always taken.
"""

EARLY_SEAL_BYTES = 16 * MiB
"""An idle converter gets the active WAL segment as soon as it holds this much (about 100k SDK spans).

Conversion then runs alongside acknowledgement instead of after each
``flush_seconds``; below this, segments are sealed by age only, so a quiet
receiver does not write more, smaller files.
"""
_EARLY_SEALS_PER_PASS = 8
"""Segments sealed early, one after another, before a pass ends (quarantined segments are salvaged between passes)."""
MAX_REPLY_MESSAGE = 1024
"""Characters of a ``partial_success`` message sent back; the rest is cut."""
_MAX_CONVERT_ATTEMPTS = 3
_TRIM_AFTER_BYTES = 64 * MiB
_DAY_NS = 86_400 * 1_000_000_000


def stranded_wal_dirs(config: ServerConfig) -> list[tuple[Path, int]]:
    """Other instances' WAL directories under ``<dataset>/_wal/`` holding segments while no serve owns them.

    Acknowledged spans wait there until a serve runs with that instance name
    (a restart under another ``--instance`` or ``--wal-dir`` leaves them).
    A directory whose lock (:data:`~otel_replay.storage.wal.LOCK_NAME`) is held belongs to a running serve: not listed;
    nor are the capture logs of agents' processes (``capture-*``), which the
    receiver converts itself when it starts (see :class:`Receiver`).
    """
    backend = backend_for(resolve(config.dataset))
    if not backend.keeps_local_log:
        return []
    root = backend.local_dir("wal")
    own = Path(config.wal_dir or "").resolve()
    found: list[tuple[Path, int]] = []
    try:
        candidates = sorted(
            p for p in root.iterdir() if p.is_dir() and p.resolve() != own and not p.name.startswith(CAPTURE_PREFIX)
        )
    except OSError:  # no _wal yet, or unreadable: nothing to say
        return []
    for directory in candidates:
        count = len(list(directory.glob(f"*{WAL_SUFFIX}")))
        if count and not held_elsewhere(directory / LOCK_NAME):
            found.append((directory, count))
    return found


class Receiver:
    """One ``otel-replay serve`` instance. ``start()``, then ``stop()`` (drains and flushes)."""

    def __init__(self, config: ServerConfig) -> None:
        """Open the WAL (recovering what a crash left); services start with :meth:`start`."""
        self.config = config
        self.metrics = Metrics()
        assert config.wal_dir is not None
        resolve(config.dataset).check()  # an object store: credentials, endpoint and bucket, in one line
        try:
            self.wal = WriteAheadLog(config.wal_dir, max_segment_bytes=config.segment_bytes)
        except OSError as exc:
            where = exc.filename or config.wal_dir
            raise DatasetError(
                f"cannot use dataset {config.dataset}: cannot create its write-ahead log at {where}: "
                f"{exc.strerror or exc}"
            ) from None
        self.recovered_segments = len(self.wal.sealed())
        # What agents' processes that died left in their own write-ahead logs on this dataset (gate records).
        self.recovered_capture_spans = recover_capture_logs(str(config.dataset))
        self.stranded = stranded_wal_dirs(config)
        for directory, count in self.stranded:
            _log.warning(
                "otel-replay serve: WAL directory %s holds %d unconverted segment(s) of another instance that no "
                "serve is running; they reach Parquet only when a serve uses that directory (--instance %s, or "
                "--wal-dir %s)",
                directory,
                count,
                directory.name,
                directory,
            )
        self.quarantine_dir = config.wal_dir / QUARANTINE_DIR
        self.quarantined: dict[str, str] = {}  # segment file -> "pending" | "salvaged"
        self._to_salvage: list[Path] = []
        for path in sorted(self.quarantine_dir.glob(f"*{WAL_SUFFIX}")):
            done = path.with_name(path.stem + ".report.json").exists()
            self.quarantined[str(path)] = "salvaged" if done else "pending"
            if not done:
                self._to_salvage.append(path)
        self.grpc_address: tuple[str, int] | None = None
        self.http_address: tuple[str, int] | None = None
        self._inflight = 0
        self._inflight_peak = 0
        self._admit_lock = threading.Lock()
        self._dates_lock = threading.Lock()
        self._dates_segment = ""
        self._segment_dates: set[int] = set()
        self._draining = False
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._failures: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}
        self._pool: Executor | None = None
        self._services: list[Any] = []
        self._converter = threading.Thread(target=self._convert_loop, name="otel-replay-convert", daemon=True)
        self._compactor: BackgroundCompactor | None = None
        if self.config.compact_every_seconds:
            self._compactor = BackgroundCompactor(
                self.config.dataset, self.config.compact_every_seconds, self.config.compact_max_batch_rows, self.metrics
            )

    # --- lifecycle ------------------------------------------------------------
    def start(self) -> Receiver:
        """Start the converter and the gRPC/HTTP services."""
        self._new_pool()
        self._converter.start()
        if self._compactor is not None:
            self._compactor.start()
        try:
            if self.config.grpc:
                service = GrpcService(self, *parse_address(self.config.grpc, "gRPC"))
                self._services.append(service)
                self.grpc_address = service.address
            if self.config.http:
                http = HttpService(self, *parse_address(self.config.http, "HTTP"))
                self._services.append(http)
                self.http_address = http.address
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Refuse new requests, finish in-flight ones, seal the WAL and convert all of it."""
        if self._stopped.is_set():
            return
        self._draining = True
        if self._compactor is not None:
            self._compactor.stop()
        for service in reversed(self._services):
            service.stop(self.config.drain_seconds)
        self._stop.set()
        if self._converter.is_alive():
            self._converter.join()
        try:
            self.wal.close()
            self._convert_pending(final=True)
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self._stopped.set()

    def _new_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self.config.convert_workers:
            ctx = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(
                self.config.convert_workers, mp_context=ctx, initializer=worker_init, initargs=(os.getpid(),)
            )
            self._pool.submit(os.getpid)  # start a converter (its imports) now, not when the first segment is due

    def wait(self, timeout: float | None = None) -> bool:
        """Block until stopped."""
        return self._stopped.wait(timeout)

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def draining(self) -> bool:
        """Whether :meth:`stop` has begun: new requests are refused (503 / ``UNAVAILABLE``)."""
        return self._draining

    # --- ack path -------------------------------------------------------------
    @contextmanager
    def admit(self, nbytes: int = 0) -> Iterator[Reservation]:
        """Open a reservation of ``nbytes`` in-flight bytes (grown later as data is read) or raise :class:`Overloaded`.

        A request is refused when the budget would be exceeded by what it has
        *actually* read or decoded so far; a request holding nothing else is
        always let through, so one request as large as the limit can proceed.
        """
        retry = self.config.retry_after_seconds
        if self._draining:
            self.metrics.add(requests_shed=1)
            raise Overloaded("otel-replay serve is shutting down", retry, unavailable=True)
        if self.wal.pending_bytes > self.config.max_wal_backlog_bytes:
            self.metrics.add(requests_shed=1)
            raise Overloaded("write-ahead log backlog is full; retry later", retry)
        reservation = Reservation(self._grow)
        try:
            if nbytes:
                reservation.grow(nbytes)
            yield reservation
        finally:
            with self._admit_lock:
                self._inflight -= reservation.held
                large = reservation.held >= _TRIM_AFTER_BYTES
                reservation.held = 0
            if large:
                release_free_memory()

    def _grow(self, reservation: Reservation, nbytes: int) -> None:
        with self._admit_lock:
            others = self._inflight - reservation.held
            if others and self._inflight + nbytes > self.config.max_inflight_bytes:
                self.metrics.add(requests_shed=1)
                raise Overloaded("too many request bytes in flight; retry later", self.config.retry_after_seconds)
            self._inflight += nbytes
            reservation.held += nbytes
            self._inflight_peak = max(self._inflight_peak, self._inflight)

    def accept(self, request: ExportTraceServiceRequest) -> tuple[int, str]:
        """Make ``request``'s storable spans durable; returns (rejected spans, message) for a partial success.

        Raises :class:`Overloaded` (retryable) when its spans would take the
        active WAL segment past :data:`MAX_DATES_PER_SEGMENT` start dates.
        """
        result = admit_spans(
            request, max_dates=MAX_DATES_PER_REQUEST, max_shared_bytes=MAX_SHARED_BYTES_PER_REQUEST
        )
        self._claim_dates(result.days)
        self.metrics.add(
            requests=1,
            spans_received=result.accepted + result.rejected,
            spans_rejected=result.rejected,
            spans_rejected_bad_time=result.bad_times,
            spans_rejected_bad_id=result.bad_ids,
            spans_rejected_bad_count=result.bad_counts,
            spans_rejected_too_many_dates=result.too_many_dates,
            spans_rejected_resource_too_large=result.too_much_shared,
        )
        if result.accepted:
            self.wal.append(request.SerializeToString())
            self.metrics.add(spans_accepted=result.accepted)
        message = result.message
        if len(message) > MAX_REPLY_MESSAGE:  # it quotes span names: a reply must not outgrow its request
            message = message[:MAX_REPLY_MESSAGE] + f"... ({len(message) - MAX_REPLY_MESSAGE} more characters)"
        return result.rejected, message

    def accept_logs(self, request: ExportLogsServiceRequest) -> tuple[int, str]:
        """Make ``request``'s storable log records durable (in the same WAL as spans); returns (rejected, message).

        Bounds as for spans: :func:`~otel_replay.storage.logs.admit_logs` drops what cannot be stored (partial
        success), and a request whose dates would take the segment past :data:`MAX_DATES_PER_SEGMENT` is shed.
        """
        result = admit_logs(request, max_dates=MAX_DATES_PER_REQUEST, max_shared_bytes=MAX_SHARED_BYTES_PER_REQUEST)
        self._claim_dates(result.days)
        self.metrics.add(
            requests=1,
            log_records_received=result.accepted + result.rejected,
            log_records_rejected=result.rejected,
        )
        if result.accepted:
            self.wal.append(wrap_logs(request.SerializeToString()))
            self.metrics.add(log_records_accepted=result.accepted)
        message = result.message
        if len(message) > MAX_REPLY_MESSAGE:
            message = message[:MAX_REPLY_MESSAGE] + f"... ({len(message) - MAX_REPLY_MESSAGE} more characters)"
        return result.rejected, message

    def _claim_dates(self, days: set[int]) -> None:
        """Count ``days`` against the active segment's dates, or shed the request (429) when they do not fit.

        Yesterday, today and tomorrow (UTC, by this host's clock) are free:
        whatever another client sends, live spans are never shed for their dates.
        """
        today = time.time_ns() // _DAY_NS
        days = {day for day in days if abs(day - today) > 1}  # live traffic is never shed for its dates
        if not days:
            return
        segment = self.wal.active_segment
        with self._dates_lock:
            if segment != self._dates_segment:
                self._dates_segment, self._segment_dates = segment, set()
            new = days - self._segment_dates
            if new and self._segment_dates and len(self._segment_dates) + len(new) > MAX_DATES_PER_SEGMENT:
                self.metrics.add(requests_shed=1)
                raise Overloaded(
                    f"spans on more than {MAX_DATES_PER_SEGMENT} distinct start dates arrived within one "
                    "write-ahead log segment; retry later",
                    self.config.retry_after_seconds,
                )
            self._segment_dates |= new

    def reject(self, spans: int = 0, *, too_large: bool = False) -> None:
        """Count a request refused as malformed (or, with ``too_large``, over a size limit)."""
        self.metrics.add(requests_rejected=1, spans_rejected=spans, requests_too_large=int(too_large))

    def metrics_text(self) -> str:
        """Prometheus text exposition of the counters and gauges."""
        lines = []
        for name, value in self.metrics.snapshot().items():
            lines.append(f"# TYPE otel_replay_{name}_total counter")
            lines.append(f"otel_replay_{name}_total {value}")
        gauges = {
            "wal_bytes": self.wal.pending_bytes,
            "wal_segments": len(self.wal.sealed()),
            "inflight_bytes": self._inflight,
            "inflight_bytes_peak": self._inflight_peak,
            "inflight_budget_bytes": self.config.max_inflight_bytes,
            "quarantined_segments": len(self.quarantined),
        }
        for name, value in gauges.items():
            lines.append(f"# TYPE otel_replay_{name} gauge")
            lines.append(f"otel_replay_{name} {value}")
        if self.quarantined:
            lines.append("# TYPE otel_replay_quarantined_segment gauge")
            for path, state in sorted(self.quarantined.items()):
                quoted = path.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
                lines.append(f'otel_replay_quarantined_segment{{path="{quoted}",state="{state}"}} 1')
        return "\n".join(lines) + "\n"

    def metrics_line(self) -> str:
        """One human-readable line of the main figures."""
        m = self.metrics.snapshot()
        quarantine = f" quarantined_segments={len(self.quarantined)}" if self.quarantined else ""
        logs = ""
        if m["log_records_received"]:  # only once logs arrive: a traces-only receiver's line stays as it was
            logs = (
                f" logs_received={m['log_records_received']} logs_durable={m['log_records_accepted']} "
                f"logs_written={m['log_rows_written']} logs_rejected={m['log_records_rejected']}"
            )
        return (
            f"received={m['spans_received']} durable={m['spans_accepted']} written={m['spans_written']} "
            f"rejected={m['spans_rejected']} shed_requests={m['requests_shed']} wal_bytes={self.wal.pending_bytes}"
            f"{logs}{quarantine}"
        )

    # --- converter ------------------------------------------------------------
    def _convert_loop(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self.wal.rotate(min_age_seconds=self.config.flush_seconds)
                if not self.wal.sealed():  # the converters are idle: hand them a chunk's worth without waiting
                    self.wal.rotate(min_bytes=EARLY_SEAL_BYTES)
                self._convert_pending(final=False)
            except Exception as exc:  # keep converting later; the WAL still holds everything
                _log.error("otel-replay serve: converter error: %s: %s", type(exc).__name__, exc)

    def _convert_pending(self, *, final: bool) -> None:
        """Convert sealed segments (skipping ones backing off after an I/O error), then salvage quarantined ones.

        With ``final`` every segment is tried once more, backoff or not.
        """
        tried: set[str] = set()
        early = 0  # chunks sealed early in this pass: bounded, so a steady stream never keeps salvage waiting
        while True:
            now = time.monotonic()
            ready = [
                s
                for s in self.wal.sealed()
                if s.segment_id not in tried and (final or self._retry_at.get(s.segment_id, 0.0) <= now)
            ]
            if not ready and not final and tried and not self._stop.is_set():
                # A conversion just finished and nothing waits: seal what arrived meanwhile now, rather
                # than leave the converters idle until the next tick of the loop.
                if early < _EARLY_SEALS_PER_PASS and self.wal.rotate(min_bytes=EARLY_SEAL_BYTES):
                    early += 1
                    continue
            batch = ready[: max(1, self.config.convert_workers)]
            if not batch:
                break
            tried.update(s.segment_id for s in batch)
            jobs: list[tuple[Segment, Future[Converted]]] = []
            for segment in batch:
                args = (str(segment.path), str(self.config.dataset), self._prefix(segment.segment_id))
                if self._pool is None:
                    self._finish(segment, lambda a=args: convert_segment_rows(*a))
                    continue
                try:
                    jobs.append((segment, self._pool.submit(convert_segment_rows, *args)))
                except BrokenProcessPool:
                    self._new_pool()
                    tried.discard(segment.segment_id)
                    break
            for segment, future in jobs:
                self._finish(segment, future.result)
            if not final and self._stop.is_set():
                return
        self._salvage_pending(final=final)

    def _prefix(self, segment_id: str) -> str:
        return f"wal-{self.config.instance}-{segment_id}"

    def _finish(self, segment: Segment, result: Any) -> None:
        try:
            rows = result()
        except BrokenProcessPool as exc:
            _log.error("otel-replay serve: converter process died on %s (%s); starting a new one", segment.path, exc)
            self._new_pool()
            self._failed(segment, f"the converter process died ({exc})", quarantine=False)
            return
        except OSError as exc:  # disk full, permissions: the data is fine, retry later (never quarantined)
            self._failed(segment, f"{type(exc).__name__}: {exc}", quarantine=False, io=True)
            return
        except Exception as exc:  # the segment's content cannot be converted as a whole
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            self._failed(segment, reason, quarantine=True)
            return
        self._failures.pop(segment.segment_id, None)
        self._retry_at.pop(segment.segment_id, None)
        self.metrics.add(spans_written=rows.spans, log_rows_written=rows.logs, segments_converted=1)
        try:
            self.wal.release(segment)
        except OSError as exc:  # the rows are in Parquet; a segment left behind is converted again, idempotently
            _log.error("otel-replay serve: releasing converted WAL segment %s failed: %s", segment.path, exc)

    def _failed(self, segment: Segment, reason: str, *, quarantine: bool, io: bool = False) -> None:
        count = self._failures[segment.segment_id] = self._failures.get(segment.segment_id, 0) + 1
        self.metrics.add(convert_errors=1)
        if quarantine or (count >= _MAX_CONVERT_ATTEMPTS and not io):  # I/O errors: backoff only
            try:
                self._quarantine(segment, reason)
                return
            except OSError as exc:  # cannot even move it aside: keep it queued, retry later
                reason = f"{reason}; quarantining it failed: {exc}"
        delay = min(60.0, 0.5 * 2**count)
        self._retry_at[segment.segment_id] = time.monotonic() + delay
        _log.error(
            "otel-replay serve: converting WAL segment %s failed (attempt %d): %s; retrying in %.0fs",
            segment.path,
            count,
            reason,
            delay,
        )

    def _quarantine(self, segment: Segment, reason: str) -> None:
        """Move ``segment`` out of the conversion queue into ``quarantine/``, then salvage it."""
        self.quarantine_dir.mkdir(parents=True, exist_ok=True)
        target = self.quarantine_dir / segment.path.name
        os.replace(segment.path, target)
        fsync_dir(self.quarantine_dir)
        self.wal.forget(segment)
        self._failures.pop(segment.segment_id, None)
        self._retry_at.pop(segment.segment_id, None)
        self.quarantined[str(target)] = "pending"
        self._to_salvage.append(target)
        self.metrics.add(segments_quarantined=1)
        _log.error(
            "otel-replay serve: WAL segment %s cannot be converted (%s); quarantined as %s, converting it span by span",
            segment.path.name,
            reason,
            target,
        )

    def _salvage_pending(self, *, final: bool) -> None:
        now = time.monotonic()
        for path in list(self._to_salvage):
            if not final and self._retry_at.get(str(path), 0.0) > now:
                continue
            args = (str(path), str(self.config.dataset), self._prefix(path.stem))
            try:
                if self._pool is None:
                    report = salvage_segment(*args)
                else:
                    report = self._pool.submit(salvage_segment, *args).result()
            except Exception as exc:  # I/O, or the converter died: keep it in quarantine, retry later
                if isinstance(exc, BrokenProcessPool):
                    self._new_pool()
                count = self._failures[str(path)] = self._failures.get(str(path), 0) + 1
                self._retry_at[str(path)] = time.monotonic() + min(300.0, 2.0**count)
                self.metrics.add(convert_errors=1)
                _log.error("otel-replay serve: salvaging quarantined %s failed: %s: %s", path, type(exc).__name__, exc)
                continue
            self._salvaged(path, report)

    def _salvaged(self, path: Path, report: Salvage) -> None:
        report_path = path.with_name(path.stem + ".report.json")
        temp = report_path.with_name("." + report_path.name + ".tmp")
        text = json.dumps(
            {
                "segment": path.name,
                "spans_written": report.rows,
                "log_rows_written": report.log_rows,
                "spans_dropped": report.spans_dropped,
                "records_dropped": report.records_dropped,
                "bytes_skipped": report.bytes_skipped,
                "reasons": report.reasons,
            },
            indent=1,
        )
        with open(temp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, report_path)
        fsync_dir(path.parent)
        self._to_salvage.remove(path)
        self._failures.pop(str(path), None)
        self._retry_at.pop(str(path), None)
        self.quarantined[str(path)] = "salvaged"
        self.metrics.add(
            spans_written=report.rows,
            log_rows_written=report.log_rows,
            quarantine_spans_written=report.rows,
            quarantine_spans_dropped=report.spans_dropped,
            quarantine_records_dropped=report.records_dropped,
        )
        first = f"; first: {report.reasons[0]}" if report.reasons else ""
        _log.error(
            "otel-replay serve: quarantined %s: wrote %d span(s), dropped %d span(s) and %d record(s)%s (see %s)",
            path,
            report.rows,
            report.spans_dropped,
            report.records_dropped,
            first,
            report_path.name,
        )
