"""A receiver's settings (:class:`ServerConfig`) and counters (:class:`Metrics`), shared with its services."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from otel_replay import settings
from otel_replay._counters import CompactionCounters
from otel_replay.errors import ConfigError
from otel_replay.location import resolve
from otel_replay.storage.backend import backend_for

__all__ = ["MiB", "Metrics", "ServerConfig", "parse_address"]

_INSTANCE = re.compile(r"[A-Za-z0-9_.-]+")
MiB = 1024 * 1024
"""One mebibyte: the unit of the receiver's byte limits."""


def parse_address(text: str, what: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[::1]:PORT`` for IPv6); raises :class:`ConfigError`."""
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or int(port) > 65535:  # int() reads '١٢' as 12
        raise ConfigError(f"{what} address {text!r} must look like HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


@dataclass
class ServerConfig:
    """Settings of one receiver (``otel-replay serve`` flags map onto these).

    Against hostile clients: ``read_timeout_seconds`` (a whole HTTP request,
    headers and body, must arrive within it; idle connections close after it;
    a gRPC connection gets GOAWAY at this age and is closed, cancelling what is
    still open on it, this much later),
    ``max_connections`` (HTTP connections served at once; the next gets 503),
    ``max_inflate_ratio`` (a gzip body inflating more than this, 0: no limit,
    is a 413) and ``bomb_delay_seconds`` (how late that 413 is sent).
    """

    dataset: Path | str
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
    read_timeout_seconds: float = 30.0
    max_connections: int = 128
    max_inflate_ratio: int = 200
    bomb_delay_seconds: float = 3.0
    compact_every_seconds: float = 0.0
    compact_max_batch_rows: int = 200_000

    def __post_init__(self) -> None:
        """Validate the settings."""
        location = resolve(self.dataset)  # a directory, or s3://bucket/prefix (a bad URI: ConfigError)
        self.dataset = location.native(location.root)  # file:///abs -> /abs
        if self.wal_dir is None and not backend_for(location).keeps_local_log:
            raise ConfigError(
                f"dataset {location.uri}: give a local WAL directory (--wal-dir): the write-ahead log stays on "
                "local disk, only Parquet files go to the object store"
            )
        if not _INSTANCE.fullmatch(self.instance):
            raise ConfigError(f"instance name {self.instance!r} may use only letters, digits, '_', '.', '-'")
        for name in ("max_request_bytes", "max_inflight_bytes", "max_wal_backlog_bytes", "segment_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if self.flush_seconds <= 0 or self.convert_workers < 0 or self.grpc_workers <= 0:
            raise ConfigError("flush_seconds and grpc_workers must be positive, convert_workers >= 0")
        if self.read_timeout_seconds <= 0 or self.max_connections <= 0:
            raise ConfigError("read_timeout_seconds and max_connections must be positive")
        if not 0 <= self.compact_every_seconds < float("inf") or self.compact_max_batch_rows < 1:
            raise ConfigError("compact_every_seconds must be >= 0 (0: off) and compact_max_batch_rows positive")
        if self.max_inflate_ratio < 0 or self.bomb_delay_seconds < 0:
            raise ConfigError("max_inflate_ratio and bomb_delay_seconds must be >= 0")
        for name in ("flush_seconds", "drain_seconds", "read_timeout_seconds", "bomb_delay_seconds"):
            if not getattr(self, name) <= settings.MAX_WAIT_SECONDS:  # past it a wait or deadline overflows
                raise ConfigError(f"{name}={getattr(self, name)!r} must be at most {settings.MAX_WAIT_SECONDS:g}")
        if self.compact_every_seconds > settings.MAX_WAIT_SECONDS:
            raise ConfigError(f"compact_every_seconds must be at most {settings.MAX_WAIT_SECONDS:g} (0: off)")
        for address, what in ((self.grpc, "gRPC"), (self.http, "HTTP")):
            if address is not None:
                parse_address(address, what)
        if self.wal_dir is None:
            self.wal_dir = Path(self.dataset) / "_wal" / self.instance
        self.wal_dir = Path(self.wal_dir)



@dataclass
class Metrics(CompactionCounters):
    """Counters exposed at ``/metrics`` (Prometheus text format); the compaction ones and ``add`` are inherited."""

    requests: int = 0
    spans_received: int = 0
    spans_accepted: int = 0
    spans_written: int = 0
    spans_rejected: int = 0
    spans_rejected_bad_time: int = 0
    spans_rejected_bad_id: int = 0
    spans_rejected_bad_count: int = 0
    spans_rejected_too_many_dates: int = 0
    spans_rejected_resource_too_large: int = 0
    log_records_received: int = 0
    log_records_accepted: int = 0
    log_records_rejected: int = 0
    log_rows_written: int = 0
    requests_rejected: int = 0
    requests_too_large: int = 0
    requests_shed: int = 0
    connections_timed_out: int = 0
    connections_refused: int = 0
    segments_converted: int = 0
    convert_errors: int = 0
    segments_quarantined: int = 0
    quarantine_spans_written: int = 0
    quarantine_spans_dropped: int = 0
    quarantine_records_dropped: int = 0

    def snapshot(self) -> dict[str, int]:
        """The counters as a dict."""
        with self.lock:
            return {k: v for k, v in vars(self).items() if isinstance(v, int)}

