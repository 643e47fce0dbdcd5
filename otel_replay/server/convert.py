"""From decoded requests to Parquet files with deterministic names.

The receiver's converter and ``otel-replay ingest`` both end here: requests go
through :func:`otel_replay.exporters.rows.request_to_table` (the one span ->
row conversion) and are written with :func:`write_atomic` under names derived
from their source (a WAL segment id, an ingested file's content hash), so
writing the same source again replaces the same files instead of adding rows.
"""

from __future__ import annotations

import fcntl
import os
import signal
import threading
import time
from pathlib import Path

import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_replay.exporters.rows import request_to_table
from otel_replay.exporters.schema import SPANS_DIR
from otel_replay.exporters.writer import write_partitions

from .wal import read_records

__all__ = ["ChunkWriter", "convert_segment", "sanitize", "worker_init"]

CHUNK_ROWS = 100_000
"""Rows per output file (per date) before a new chunk starts."""


def sanitize(request: ExportTraceServiceRequest) -> tuple[int, int, str]:
    """Drop spans that cannot become rows (bad trace/span id); returns (accepted, rejected, message).

    The request is modified in place. ``message`` explains the first rejection.
    """
    accepted = rejected = 0
    message = ""
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            spans = ss.spans
            bad = [i for i, s in enumerate(spans) if len(s.trace_id) != 16 or len(s.span_id) != 8]
            accepted += len(spans) - len(bad)
            if bad:
                if not message:
                    s = spans[bad[0]]
                    message = (
                        f"span {s.name!r}: trace_id must be 16 bytes and span_id 8 bytes "
                        f"(got {len(s.trace_id)} and {len(s.span_id)})"
                    )
                rejected += len(bad)
                for i in reversed(bad):
                    del spans[i]
    return accepted, rejected, message


class ChunkWriter:
    """Collect row tables and write them as ``<prefix>-<chunk>.parquet`` per date partition.

    Chunk boundaries depend only on the order and size of the tables added, so
    the same input always produces the same file names and contents.
    """

    def __init__(self, dataset: str | os.PathLike[str], prefix: str, *, chunk_rows: int = CHUNK_ROWS) -> None:
        """Write under ``<dataset>/spans/date=*/``, names starting with ``prefix``."""
        self.spans_dir = Path(dataset) / SPANS_DIR
        self.prefix = prefix
        self.chunk_rows = chunk_rows
        self.rows_written = 0
        self.paths: list[Path] = []
        self._tables: list[pa.Table] = []
        self._rows = 0
        self._chunk = 0

    def add(self, table: pa.Table) -> None:
        """Add rows (with their ``date`` column); writes a chunk when it is full."""
        if table.num_rows == 0:
            return
        self._tables.append(table)
        self._rows += table.num_rows
        if self._rows >= self.chunk_rows:
            self.flush()

    def add_request(self, request: ExportTraceServiceRequest) -> None:
        """Convert ``request`` with the shared row conversion and add it."""
        self.add(request_to_table(request))

    def flush(self) -> None:
        """Write the collected rows as the next chunk."""
        if not self._tables:
            return
        table = pa.concat_tables(self._tables)
        self._tables, self._rows = [], 0
        chunk = self._chunk
        self.paths += write_partitions(table, self.spans_dir, lambda date: f"{self.prefix}-{chunk:05d}.parquet")
        self.rows_written += table.num_rows
        self._chunk += 1


def convert_segment(path: str, dataset: str, prefix: str) -> int:
    """Convert one WAL segment to Parquet (idempotently); returns the rows written.

    Holds an ``flock`` on the segment while converting, so a leftover converter
    of a killed server and the restarted one never write the same files at once.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        writer = ChunkWriter(dataset, prefix)
        for payload in read_records(Path(path)):
            request = ExportTraceServiceRequest()
            request.ParseFromString(payload)
            writer.add_request(request)
        writer.flush()
        return writer.rows_written
    finally:
        os.close(fd)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)  # the server died (kill -9); its restart converts the segment again


def worker_init() -> None:
    """Converter-process initializer: ignore Ctrl-C/SIGTERM (the server drains us) and exit with the server."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), name="parent-watch", daemon=True).start()
