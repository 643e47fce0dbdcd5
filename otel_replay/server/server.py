"""The receiver: admission control, the write-ahead log, the Parquet converter and both services.

Ack path (any service): decode -> :func:`sanitize` (drop spans without valid
ids, reported as partial success) -> admission (bounded in-flight bytes and a
bounded WAL backlog; otherwise :class:`Overloaded`, i.e. 429 /
RESOURCE_EXHAUSTED) -> WAL append + fsync -> acknowledge.

Background: the active WAL segment is sealed every ``flush_seconds`` (or when
full); sealed segments are converted to Parquet (in a converter process by
default) under names derived from the segment id, then deleted. On start,
segments left by a crash are converted the same way, so replay never adds rows
twice: it rewrites the same files.
"""

from __future__ import annotations

import logging
import multiprocessing
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_replay.errors import ConfigError, Overloaded

from .convert import convert_segment, sanitize, worker_init
from .wal import Segment, WriteAheadLog

__all__ = ["Metrics", "Overloaded", "Receiver", "ServerConfig", "parse_address"]

_log = logging.getLogger("otel_replay.server")
_INSTANCE = re.compile(r"[A-Za-z0-9_.-]+")
MiB = 1024 * 1024


def parse_address(text: str, what: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[::1]:PORT`` for IPv6); raises :class:`ConfigError`."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{what} address {text!r} must look like HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


@dataclass
class ServerConfig:
    """Settings of one receiver (``otel-replay serve`` flags map onto these)."""

    dataset: Path
    grpc: str | None = "127.0.0.1:4317"
    http: str | None = "127.0.0.1:4318"
    instance: str = "default"
    wal_dir: Path | None = None
    max_request_bytes: int = 32 * MiB
    max_inflight_bytes: int = 128 * MiB
    max_wal_backlog_bytes: int = 1024 * MiB
    segment_bytes: int = 64 * MiB
    flush_seconds: float = 5.0
    convert_workers: int = 1
    grpc_workers: int = 16
    retry_after_seconds: int = 1
    drain_seconds: float = 30.0

    def __post_init__(self) -> None:
        """Validate the settings."""
        self.dataset = Path(self.dataset)
        if not _INSTANCE.fullmatch(self.instance):
            raise ConfigError(f"instance name {self.instance!r} may use only letters, digits, '_', '.', '-'")
        for name in ("max_request_bytes", "max_inflight_bytes", "max_wal_backlog_bytes", "segment_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if self.flush_seconds <= 0 or self.convert_workers < 0 or self.grpc_workers <= 0:
            raise ConfigError("flush_seconds and grpc_workers must be positive, convert_workers >= 0")
        for address, what in ((self.grpc, "gRPC"), (self.http, "HTTP")):
            if address is not None:
                parse_address(address, what)
        if self.wal_dir is None:
            self.wal_dir = self.dataset / "_wal" / self.instance



@dataclass
class Metrics:
    """Counters exposed at ``/metrics`` (Prometheus text format)."""

    requests: int = 0
    spans_received: int = 0
    spans_accepted: int = 0
    spans_written: int = 0
    spans_rejected: int = 0
    requests_rejected: int = 0
    requests_shed: int = 0
    segments_converted: int = 0
    convert_errors: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **deltas: int) -> None:
        """Add to counters atomically."""
        with self.lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def snapshot(self) -> dict[str, int]:
        """The counters as a dict."""
        with self.lock:
            return {k: v for k, v in vars(self).items() if isinstance(v, int)}


class Receiver:
    """One ``otel-replay serve`` instance. ``start()``, then ``stop()`` (drains and flushes)."""

    def __init__(self, config: ServerConfig) -> None:
        """Open the WAL (recovering what a crash left); services start with :meth:`start`."""
        self.config = config
        self.metrics = Metrics()
        assert config.wal_dir is not None
        self.wal = WriteAheadLog(config.wal_dir, max_segment_bytes=config.segment_bytes)
        self.recovered_segments = len(self.wal.sealed())
        self.grpc_address: tuple[str, int] | None = None
        self.http_address: tuple[str, int] | None = None
        self._inflight = 0
        self._admit_lock = threading.Lock()
        self._draining = False
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._failures: dict[str, int] = {}
        self._pool: Executor | None = None
        self._services: list[Any] = []
        self._converter = threading.Thread(target=self._convert_loop, name="otel-replay-convert", daemon=True)

    # --- lifecycle ------------------------------------------------------------
    def start(self) -> Receiver:
        """Start the converter and the gRPC/HTTP services."""
        from .grpc_service import GrpcService
        from .http_service import HttpService

        self._new_pool()
        self._converter.start()
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
            self._pool = ProcessPoolExecutor(self.config.convert_workers, mp_context=ctx, initializer=worker_init)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until stopped."""
        return self._stopped.wait(timeout)

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- ack path -------------------------------------------------------------
    @contextmanager
    def admit(self, nbytes: int) -> Iterator[None]:
        """Reserve ``nbytes`` of in-flight memory or raise :class:`Overloaded`."""
        retry = self.config.retry_after_seconds
        if self._draining:
            self.metrics.add(requests_shed=1)
            raise Overloaded("otel-replay serve is shutting down", retry, unavailable=True)
        with self._admit_lock:
            if self._inflight and self._inflight + nbytes > self.config.max_inflight_bytes:
                self.metrics.add(requests_shed=1)
                raise Overloaded("too many requests in flight; retry later", retry)
            if self.wal.pending_bytes > self.config.max_wal_backlog_bytes:
                self.metrics.add(requests_shed=1)
                raise Overloaded("write-ahead log backlog is full; retry later", retry)
            self._inflight += nbytes
        try:
            yield
        finally:
            with self._admit_lock:
                self._inflight -= nbytes

    def accept(self, request: ExportTraceServiceRequest) -> tuple[int, str]:
        """Make ``request`` durable; returns (rejected spans, message) for a partial success."""
        accepted, rejected, message = sanitize(request)
        self.metrics.add(requests=1, spans_received=accepted + rejected, spans_rejected=rejected)
        if accepted:
            self.wal.append(request.SerializeToString())
            self.metrics.add(spans_accepted=accepted)
        return rejected, message

    def reject(self, spans: int = 0) -> None:
        """Count a request refused as malformed."""
        self.metrics.add(requests_rejected=1, spans_rejected=spans)

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
        }
        for name, value in gauges.items():
            lines.append(f"# TYPE otel_replay_{name} gauge")
            lines.append(f"otel_replay_{name} {value}")
        return "\n".join(lines) + "\n"

    def metrics_line(self) -> str:
        """One human-readable line of the main figures."""
        m = self.metrics.snapshot()
        return (
            f"received={m['spans_received']} durable={m['spans_accepted']} written={m['spans_written']} "
            f"rejected={m['spans_rejected']} shed_requests={m['requests_shed']} wal_bytes={self.wal.pending_bytes}"
        )

    # --- converter ------------------------------------------------------------
    def _convert_loop(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self.wal.rotate(min_age_seconds=self.config.flush_seconds)
                self._convert_pending(final=False)
            except Exception:  # keep converting later; the WAL still holds everything
                _log.exception("otel-replay serve: converter error")

    def _convert_pending(self, *, final: bool) -> None:
        while True:
            batch = self.wal.sealed()[: max(1, self.config.convert_workers)]
            batch = [s for s in batch if self._failures.get(s.segment_id, 0) < 3]
            if not batch:
                return
            jobs: list[tuple[Segment, Future[int]]] = []
            for segment in batch:
                args = (str(segment.path), str(self.config.dataset), f"wal-{self.config.instance}-{segment.segment_id}")
                if self._pool is None:
                    self._finish(segment, lambda a=args: convert_segment(*a))
                    continue
                try:
                    jobs.append((segment, self._pool.submit(convert_segment, *args)))
                except BrokenProcessPool:
                    self._new_pool()
                    break
            for segment, future in jobs:
                self._finish(segment, future.result)
            if not final and self._stop.is_set():
                return

    def _finish(self, segment: Segment, result: Any) -> None:
        try:
            rows = result()
        except BrokenProcessPool as exc:
            _log.error("otel-replay serve: converter process died (%s); starting a new one", exc)
            self._new_pool()
            return
        except Exception as exc:
            count = self._failures[segment.segment_id] = self._failures.get(segment.segment_id, 0) + 1
            self.metrics.add(convert_errors=1)
            _log.error("otel-replay serve: converting WAL segment %s failed (%d/3): %s", segment.path, count, exc)
            if count >= 3:
                _log.error("otel-replay serve: leaving %s in the WAL; restart to retry", segment.path)
            time.sleep(0.1)
            return
        self.wal.release(segment)
        self.metrics.add(spans_written=rows, segments_converted=1)
