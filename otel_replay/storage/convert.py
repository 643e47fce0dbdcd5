"""From decoded requests to Parquet files with deterministic names.

The receiver's converter and ``otel-replay ingest`` both end here: requests go
through :func:`otel_replay.exporters.rows.request_to_table` (the one span ->
row conversion) and are written with :func:`write_atomic` under names derived
from their source (a WAL segment id, an ingested file's content hash), so
writing the same source again replaces the same files instead of adding rows.
"""

from __future__ import annotations

import atexit
import fcntl
import gc
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from otel_replay.exporters.rows import (
    COUNT_LIMIT,
    TIME_LIMIT_NS,
    payload_to_table,
    request_to_table,
    span_count_error,
    span_time_error,
)
from otel_replay.exporters.schema import SPANS_DIR
from otel_replay.exporters.writer import write_partitions
from otel_replay.location import resolve
from otel_replay.storage.admitted import Admission
from otel_replay.storage.logs import LogWriter, logs_payload
from otel_replay.storage.wal import Gap, read_records, scan_records

__all__ = [
    "MAX_DATES_PER_REQUEST",
    "MAX_SHARED_BYTES_PER_REQUEST",
    "Admission",
    "ChunkWriter",
    "Salvage",
    "admit_spans",
    "Converted",
    "convert_segment",
    "convert_segment_rows",
    "salvage_segment",
    "sanitize",
    "split_request",
    "worker_init",
]

_DAY_NS = 86_400 * 1_000_000_000
CHUNK_ROWS = 100_000
"""Rows per output file (per date) before a new chunk starts."""
CHUNK_BYTES = 128 * 1024 * 1024
"""Arrow bytes collected before a new chunk starts (whichever of rows and bytes comes first)."""
BATCH_BYTES = 256 * 1024
"""WAL records converted together: consecutive records up to this many bytes are joined into one request.

Serialized ``ExportTraceServiceRequest`` messages concatenate into one valid
message (``resource_spans`` repeats), so a run of tiny requests (one span
each, as a ``SimpleSpanProcessor`` sends them) costs one row conversion, not
one Arrow table of some 40 columns per record (40k one-span records took
28 s CPU and 1.8 GB before). Small, because the row conversion holds about 30x
a run's bytes in Python objects while it builds the columns: runs of 8 MiB made
a converter peak at 560 MiB (256 KiB: 270 MiB, and faster).
"""
COALESCE_TABLES = 256
"""Tables a :class:`ChunkWriter` holds before it concatenates them into one (each small table has a fixed cost)."""


MAX_DATES_PER_REQUEST = 32
"""Distinct start dates (UTC days) the receiver takes from one request; spans on further dates are refused.

Each date is a partition: one Parquet file (and directory) per date and
segment chunk. Without a bound, one small request with a span on each of
thousands of days fans out into thousands of files and stalls conversion.
"""

MAX_SHARED_BYTES_PER_REQUEST = 32 * 1024 * 1024
"""Resource and scope bytes, counted once per span, the receiver takes from one request; further spans are refused.

Every row carries its resource's attributes (JSON) and scope name and
version, so a request's rows hold those bytes once per span: a 256 KiB
resource over 6,000 spans is a 0.5 MiB request but 1.5 GB of rows. The
bound keeps the converter's memory and work proportional to what it was sent
(a 512-span batch may carry 64 KiB of resource and scope).
"""

_ZERO_TRACE_ID = bytes(16)
_ZERO_SPAN_ID = bytes(8)


def _time_problem(span: Span) -> str | None:
    return span_time_error(
        span.start_time_unix_nano, span.end_time_unix_nano, (e.time_unix_nano for e in span.events), otlp=True
    )


def _id_problem(trace_id: bytes, span_id: bytes) -> str | None:
    if len(trace_id) != 16 or len(span_id) != 8:
        return f"trace_id must be 16 bytes and span_id 8 bytes (got {len(trace_id)} and {len(span_id)})"
    if trace_id == _ZERO_TRACE_ID or span_id == _ZERO_SPAN_ID:
        return "an all-zero trace_id or span_id is invalid (OTLP)"
    return None


_COUNTERS = {
    "id": "bad_ids",
    "time": "bad_times",
    "count": "bad_counts",
    "dates": "too_many_dates",
    "shared": "too_much_shared",
}


def _span_problem(span: Span) -> tuple[str | None, str]:
    """Why ``span`` cannot become a row (and which counter says so), or ``(None, "")``."""
    problem = _id_problem(span.trace_id, span.span_id)
    if problem is not None:
        return problem, "id"
    problem = _time_problem(span)
    if problem is not None:
        return problem, "time"
    dropped = (span.dropped_attributes_count, span.dropped_events_count, span.dropped_links_count)
    return span_count_error(dropped), "count"


def admit_spans(
    request: ExportTraceServiceRequest, *, max_dates: int | None = None, max_shared_bytes: int | None = None
) -> Admission:
    """Drop, in place, spans that cannot become rows; count them by reason.

    Refused: a trace id that is not 16 bytes or a span id that is not 8 (or
    either all zero), a start, end or event time the dataset cannot store
    (:func:`otel_replay.exporters.rows.span_time_error`), dropped counts past
    the int32 columns (:func:`~otel_replay.exporters.rows.span_count_error`)
    and, with ``max_dates``, a span starting on a date (UTC day) beyond the
    first ``max_dates`` distinct ones of the request. The first four are
    exactly the spans the row conversion would refuse, so every span admitted
    converts. With ``max_shared_bytes``, spans are refused once their
    resources and scopes (serialized size, counted once per span: each row
    repeats them) add up to more (see :data:`MAX_SHARED_BYTES_PER_REQUEST`).
    ``message`` names the first refused span and why. The cost is linear in
    the request: refused spans are removed by rebuilding each list once.
    """
    result = Admission()
    days: set[int] = set()
    shared = 0
    for rs in request.resource_spans:
        resource_bytes = rs.resource.ByteSize() if max_shared_bytes is not None else 0
        for ss in rs.scope_spans:
            spans = ss.spans
            per_span = resource_bytes + ss.scope.ByteSize() if max_shared_bytes is not None else 0
            # Checked per span only when this list may not fit whole (the common case adds it at once below).
            room = None
            if max_shared_bytes is not None and shared + per_span * len(spans) > max_shared_bytes:
                room = max_shared_bytes
            bad: set[int] = set()
            for i, span in enumerate(spans):
                trace_id, span_id = span.trace_id, span.span_id
                # The common case inline (one call per span, as before); _span_problem says why when it fails.
                if (
                    len(trace_id) == 16
                    and len(span_id) == 8
                    and trace_id != _ZERO_TRACE_ID
                    and span_id != _ZERO_SPAN_ID
                    and (span.dropped_attributes_count | span.dropped_events_count | span.dropped_links_count)
                    <= COUNT_LIMIT
                    and span.start_time_unix_nano < TIME_LIMIT_NS  # unsigned: never below 0
                    and span.end_time_unix_nano < TIME_LIMIT_NS
                    and (not span.events or _time_problem(span) is None)
                ):
                    problem, reason = None, ""
                else:
                    problem, reason = _span_problem(span)
                if problem is None and max_dates is not None:
                    day = span.start_time_unix_nano // _DAY_NS
                    if day not in days:
                        if len(days) < max_dates:
                            days.add(day)
                        else:
                            problem, reason = f"more than {max_dates} distinct start dates in one request", "dates"
                if problem is None and room is not None:
                    if shared + per_span > room:
                        problem = (
                            f"its resource and scope ({per_span} bytes) would take the request past "
                            f"{max_shared_bytes} bytes of resource and scope repeated per span"
                        )
                        reason = "shared"
                    else:
                        shared += per_span
                if problem is None:
                    continue
                setattr(result, _COUNTERS[reason], getattr(result, _COUNTERS[reason]) + 1)
                bad.add(i)
                if not result.message:
                    result.message = f"span {span.name[:100]!r} (span_id {span.span_id.hex()[:16] or '-'}): {problem}"
            result.accepted += len(spans) - len(bad)
            result.rejected += len(bad)
            if room is None:
                shared += per_span * (len(spans) - len(bad))
            if bad:  # one rebuild: deleting one at a time shifts the rest each time (quadratic)
                good = [span for i, span in enumerate(spans) if i not in bad]
                ss.ClearField("spans")
                ss.spans.extend(good)
    result.days = days
    return result


def split_request(
    request: ExportTraceServiceRequest, max_shared_bytes: int = MAX_SHARED_BYTES_PER_REQUEST
) -> Iterator[ExportTraceServiceRequest]:
    """``request`` itself, or pieces of it whose rows each repeat at most ``max_shared_bytes`` of resource and scope.

    Every row carries its resource's attributes and its scope: a 192 KiB
    resource over 4,000 spans is 750 MiB of rows from a 0.8 MiB request.
    Converting piece by piece keeps what is held at once near
    ``max_shared_bytes`` plus one chunk, and keeps every span (``ingest``
    takes the user's own files: nothing is refused for this). A single span
    whose resource and scope alone exceed the bound is a piece of its own.
    """
    sizes = [
        (rs, ss, rs.resource.ByteSize() + ss.scope.ByteSize()) for rs in request.resource_spans for ss in rs.scope_spans
    ]
    if sum(per_span * len(ss.spans) for _, ss, per_span in sizes) <= max_shared_bytes:
        yield request
        return
    piece, shared = ExportTraceServiceRequest(), 0
    for rs, ss, per_span in sizes:
        target = None
        for span in ss.spans:
            if shared and shared + per_span > max_shared_bytes:
                yield piece
                piece, shared, target = ExportTraceServiceRequest(), 0, None
            if target is None:
                target = _scope_in(piece, rs, ss)
            target.spans.add().CopyFrom(span)
            shared += per_span
    if piece.resource_spans:
        yield piece


def sanitize(request: ExportTraceServiceRequest) -> tuple[int, int, str]:
    """:func:`admit_spans` as (accepted, rejected, message); ``request`` is modified in place."""
    result = admit_spans(request)
    return result.accepted, result.rejected, result.message


class ChunkWriter:
    """Collect row tables and write them as ``<prefix>-<chunk>.parquet`` per date partition.

    Chunk boundaries depend only on the order and size (rows, Arrow bytes) of
    the tables added, so the same input always produces the same file names
    and contents.
    """

    def __init__(
        self,
        dataset: str | os.PathLike[str],
        prefix: str,
        *,
        chunk_rows: int = CHUNK_ROWS,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        """Write under ``<dataset>/spans/date=*/``, names starting with ``prefix``."""
        location = resolve(dataset)  # a local directory or s3://bucket/prefix
        self.spans_dir: Path | str = location.native(location.join(SPANS_DIR))
        self.prefix = prefix
        self.chunk_rows = chunk_rows
        self.chunk_bytes = chunk_bytes
        self.rows_written = 0
        self.paths: list[Path | str] = []
        self._tables: list[pa.Table] = []
        self._merged = 0  # self._tables[:_merged] are runs of COALESCE_TABLES tables, each concatenated
        self._rows = 0
        self._bytes = 0
        self._chunk = 0

    def add(self, table: pa.Table) -> None:
        """Add rows (with their ``date`` column); writes a chunk when it is full."""
        if table.num_rows == 0:
            return
        self._tables.append(table)
        self._rows += table.num_rows
        self._bytes += table.nbytes
        if self._rows >= self.chunk_rows or self._bytes >= self.chunk_bytes:
            self.flush()
        elif len(self._tables) - self._merged >= COALESCE_TABLES:  # many small tables (ingest of one-span lines)
            merged = pa.concat_tables(self._tables[self._merged :]).combine_chunks()
            self._tables[self._merged :] = [merged]
            self._merged += 1

    def add_request(self, request: ExportTraceServiceRequest) -> None:
        """Convert ``request`` with the shared row conversion and add it."""
        self.add(request_to_table(request))

    def add_payload(self, payload: bytes) -> None:
        """Decode a serialized ``ExportTraceServiceRequest`` (raising what the parser raises), convert it, add it.

        The decode only checks: the rows are read from ``payload`` itself
        (:func:`~otel_replay.exporters.rows.payload_to_table`), which gives
        the rows :meth:`add_request` would and skips re-encoding the message.
        """
        ExportTraceServiceRequest.FromString(payload)
        self.add(payload_to_table(payload))

    def flush(self) -> None:
        """Write the collected rows as the next chunk."""
        if not self._tables:
            return
        table = pa.concat_tables(self._tables)
        chunk = self._chunk
        self.paths += write_partitions(table, self.spans_dir, lambda date: f"{self.prefix}-{chunk:05d}.parquet")
        # Emptied only once written: a write that fails leaves the rows here, never silently gone.
        self._tables, self._merged, self._rows, self._bytes = [], 0, 0, 0
        self.rows_written += table.num_rows
        self._chunk += 1


def _batches(records: Iterator[bytes], limit: int = BATCH_BYTES) -> Iterator[bytes]:
    """Runs of consecutive records joined into one serialized request each, up to ``limit`` bytes (or one record)."""
    run: list[bytes] = []
    size = 0
    for record in records:
        if run and size + len(record) > limit:
            yield b"".join(run)
            run, size = [], 0
        run.append(record)
        size += len(record)
    if run:
        yield b"".join(run)


class Converted(NamedTuple):
    """The rows one converted segment wrote: span rows (``spans/``) and log record rows (``logs/``)."""

    spans: int
    logs: int


def convert_segment(path: str, dataset: str, prefix: str) -> int:
    """Convert one WAL segment to Parquet (idempotently); returns the span rows written (log records go to ``logs/``).

    See :func:`convert_segment_rows`, which counts the log record rows too.
    """
    return convert_segment_rows(path, dataset, prefix).spans


def convert_segment_rows(path: str, dataset: str, prefix: str) -> Converted:
    """Convert one WAL segment to Parquet (idempotently); returns the span and log record rows written.

    Holds an ``flock`` on the segment while converting, so a leftover converter
    of a killed server and the restarted one never write the same files at once.
    Any record that cannot be decoded or converted, or damage before the end
    of the file (:class:`~.wal.CorruptSegmentError`), fails the whole segment:
    the receiver then quarantines it and calls :func:`salvage_segment`.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        writer = ChunkWriter(dataset, prefix)
        logs = LogWriter(dataset, prefix)
        for payload in _batches(_span_records(read_records(Path(path)), logs)):
            writer.add_payload(payload)
        writer.flush()
        logs.flush()
        return Converted(writer.rows_written, logs.rows_written)
    finally:
        os.close(fd)


def _span_records(records: Iterator[bytes], logs: LogWriter) -> Iterator[bytes]:
    """The span records of a segment; its log records (see :mod:`.logs`) go to ``logs`` on the way."""
    for record in records:
        inner = logs_payload(record)
        if inner is None:
            yield record
        else:
            logs.add_payload(inner)


@dataclass
class Salvage:
    """What :func:`salvage_segment` wrote and what it had to leave out."""

    rows: int = 0
    log_rows: int = 0
    """Log record rows written."""
    spans_dropped: int = 0
    records_dropped: int = 0
    bytes_skipped: int = 0
    reasons: list[str] = field(default_factory=list)

    def note(self, reason: str) -> None:
        """Keep the first few reasons (the counts carry the rest)."""
        if len(self.reasons) < _MAX_REASONS:
            self.reasons.append(reason)


_MAX_REASONS = 20


def _one_span_request(rs: ResourceSpans, ss: ScopeSpans, span: Span) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    _scope_in(request, rs, ss).spans.add().CopyFrom(span)
    return request


def _scope_in(request: ExportTraceServiceRequest, rs: ResourceSpans, ss: ScopeSpans) -> ScopeSpans:
    """A new, empty copy of ``ss`` (its scope and schema) under a new copy of ``rs``'s resource in ``request``."""
    resource_spans = request.resource_spans.add()
    resource_spans.resource.CopyFrom(rs.resource)
    resource_spans.schema_url = rs.schema_url
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.CopyFrom(ss.scope)
    scope_spans.schema_url = ss.schema_url
    return scope_spans


def _span_count(request: ExportTraceServiceRequest) -> int:
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


def _salvage_request(request: ExportTraceServiceRequest, record: int, report: Salvage) -> pa.Table | None:
    try:
        return request_to_table(request)
    except Exception:  # noqa: BLE001 - any failure: fall back to one span at a time
        pass
    tables = []
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                try:
                    tables.append(request_to_table(_one_span_request(rs, ss, span)))
                except Exception as exc:  # noqa: BLE001 - the span is dropped, counted and named
                    reason = str(exc).splitlines()[0] if str(exc) else ""
                    report.note(f"record {record} span {span.span_id.hex() or '-'}: {type(exc).__name__}: {reason}")
    return pa.concat_tables(tables) if tables else None


def _salvage_record(payload: bytes, record: int, writer: ChunkWriter, report: Salvage) -> None:
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(payload)
    except DecodeError as exc:
        report.records_dropped += 1
        report.note(f"record {record}: not an ExportTraceServiceRequest ({exc})")
        return
    table = _salvage_request(request, record, report)
    rows = 0 if table is None else table.num_rows
    report.spans_dropped += max(0, _span_count(request) - rows)
    if table is not None:
        writer.add(table)


def _salvage_logs(inner: bytes, record: int, logs: LogWriter, report: Salvage) -> None:
    try:
        logs.add_payload(inner)
    except Exception as exc:  # noqa: BLE001 - the record is dropped, counted and named
        report.records_dropped += 1
        report.note(f"record {record}: log records cannot be stored ({type(exc).__name__}: {exc})")


def salvage_segment(path: str, dataset: str, prefix: str) -> Salvage:
    """Convert a quarantined segment in convert_segment's runs; a run that fails: record by record, span by span.

    Every span that converts lands under the same file names
    :func:`convert_segment` would have used: up to the first run that fails,
    the same runs give the same chunks, so what a failed conversion (or a
    partial earlier salvage) wrote is replaced, never added twice.
    Undecodable records and unconvertible spans are counted and named in the
    result. Damaged bytes are skipped up to the next whole record
    (:func:`~.wal.scan_records`); each damaged stretch before the end counts
    as one dropped record.
    """
    fd = os.open(path, os.O_RDONLY)
    report = Salvage()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        writer = ChunkWriter(dataset, prefix)
        logs = LogWriter(dataset, prefix)
        run: list[bytes] = []
        size = 0
        record = 0  # number of the run's first record

        def take_run() -> None:
            nonlocal record, size
            if not run:
                return
            joined = b"".join(run)
            try:
                ExportTraceServiceRequest.FromString(joined)
                table = payload_to_table(joined)
            except Exception:  # noqa: BLE001 - one record or span spoils it: record by record, span by span
                for n, payload in enumerate(run):
                    _salvage_record(payload, record + n, writer, report)
            else:
                writer.add(table)  # outside the try: a failed write escapes (salvage is retried), never "bad spans"
            record += len(run)
            run.clear()
            size = 0

        for payload in scan_records(Path(path)):
            if isinstance(payload, Gap):
                take_run()
                report.bytes_skipped += payload.size
                if payload.tail:  # a torn tail: never acknowledged, so nothing is lost; still reported
                    report.note(f"bytes {payload.offset}-{payload.offset + payload.size}: torn tail, ignored")
                else:  # acknowledged records were there: at least one is lost
                    report.records_dropped += 1
                    then = (
                        "the search for a whole record after them gave up (too costly), so records in them are lost"
                        if payload.gave_up
                        else "skipped to the next whole record"
                    )
                    report.note(f"bytes {payload.offset}-{payload.offset + payload.size}: damaged, {then}")
                continue
            inner = logs_payload(payload)
            if inner is not None:  # log records: apart from the span runs, as convert_segment takes them
                _salvage_logs(inner, record + len(run), logs, report)
                continue
            if run and size + len(payload) > BATCH_BYTES:  # the runs _batches makes
                take_run()
            run.append(payload)
            size += len(payload)
        take_run()
        writer.flush()
        logs.flush()
        report.rows = writer.rows_written
        report.log_rows = logs.rows_written
        return report
    finally:
        os.close(fd)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)  # the server died (kill -9); its restart converts the segment again


def worker_init(server_pid: int | None = None) -> None:
    """Converter-process initializer: ignore Ctrl-C/SIGTERM (the server drains us) and exit with the server.

    ``server_pid`` is the server's pid, passed in by the server: a server that
    died while this process was still starting has already handed it to init,
    so ``os.getppid()`` here would name init and the watch would never end.

    It also freezes what the imports allocated out of the garbage collector's
    sight: conversion keeps a request's rows alive while it builds them, and
    every collection that promotes them would otherwise walk every module
    object of pyarrow and protobuf again (about 15% of the converter's CPU).
    Unfrozen at exit, so the interpreter's final collection still sees everything.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parent = os.getppid() if server_pid is None else server_pid
    if os.getppid() != parent:
        os._exit(1)  # the server is already gone
    threading.Thread(target=_watch_parent, args=(parent,), name="parent-watch", daemon=True).start()
    gc.freeze()
    atexit.register(gc.unfreeze)
