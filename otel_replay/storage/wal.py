"""Write-ahead log: OTLP requests are appended and fsynced here before they are acknowledged.

Layout: ``<wal_dir>/<segment id>.wal``, and ``<wal_dir>/LOCK`` (:data:`LOCK_NAME`), whose
``flock`` its owner holds while the log is open. A segment is a sequence of records,
each ``<u32 length><u32 crc32>`` followed by the serialized
``ExportTraceServiceRequest`` (or a log request wrapped as field 2, see
:mod:`otel_replay.storage.logs`). Segment ids are unique across restarts (time
plus random suffix), so a segment's Parquet output can be named after it and
rewritten idempotently. Only the active segment is appended to; after a crash
every segment on disk is "sealed" and a torn tail record (never acknowledged,
because its fsync never completed: a write cut short, its header claiming more
bytes than the file holds) is ignored when reading. A last record held whole
whose checksum fails is damage (it may have been acknowledged). Damage with whole
records after it is not a torn tail: :func:`read_records` raises
:class:`CorruptSegmentError` (the receiver quarantines the segment), and
:func:`scan_records` resumes at the next whole record, reporting the gap.

A sealed segment ends with :data:`SEAL_MARK`, an empty record that ends the
chain of records read from offset 0; damage in its last record is then
corruption too. (The mark is 8 zero bytes, which a request may also end in:
a segment is read to its end either way, so such a request is never cut.)

Appends use group commit: records are queued, and one thread writes all that
is queued with one ``write`` and fsyncs them with one ``fdatasync``.
"""

from __future__ import annotations

import logging
import mmap
import os
import secrets
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_replay._flock import try_lock
from otel_replay._wire import read_varint
from otel_replay.errors import OtelReplayError, WalBusyError
from otel_replay.exporters.writer import fsync_dir

__all__ = [
    "LOCK_NAME",
    "WAL_SUFFIX",
    "CorruptSegmentError",
    "Gap",
    "SEAL_MARK",
    "Segment",
    "WalBusyError",
    "WriteAheadLog",
    "read_records",
    "scan_records",
]

WAL_SUFFIX = ".wal"
LOCK_NAME = "LOCK"
"""The lock file in a log's directory: held (``flock``) by the process that owns the log, while it lives.

Every reader that must leave a live log alone (:func:`otel_replay.capture.log_recovery.recover`, the receiver's
stranded-log check, ``verify``) probes this file.
"""
_HEADER = struct.Struct("<II")
_log = logging.getLogger("otel_replay.server")
_MAX_RECORD = 1 << 31
_ONE_WRITE = 64 * 1024
"""Records (and batches) up to this size are written as one buffer; a larger payload is never copied."""


@dataclass(frozen=True)
class Segment:
    """A sealed segment file waiting to be converted to Parquet."""

    segment_id: str
    path: Path
    size: int


class CorruptSegmentError(OtelReplayError, ValueError):
    """A WAL segment is damaged before its end: whole records follow the damage (not a torn tail)."""


@dataclass(frozen=True)
class Gap:
    """Bytes of a segment that hold no whole, checksummed record.

    ``tail``: nothing valid follows and the bad record claims more bytes than
    the file holds, in a segment never sealed (a write a crash cut short, never
    acknowledged); otherwise the reader resumed
    at ``offset + size``, the next offset where a whole record checks out, or
    (``gave_up``) the search stopped and the gap runs to the end: whole
    records may be in it, so it is never called a tail.
    """

    offset: int
    size: int
    tail: bool
    gave_up: bool = False
    """The search for the next whole record stopped at its work bound (:data:`_RESYNC_BUDGET_FACTOR`)."""


SEAL_MARK = _HEADER.pack(0, zlib.crc32(b""))
"""An empty record, written last when a segment is sealed: only a segment without it can end in a torn tail.

A reader that does not know it sees one empty request (no spans).
"""
_REQUEST_TAG = 0x0A  # every record is an ExportTraceServiceRequest with spans: field 1, length-delimited, first
_LOGS_TAG = 0x12  # ... or a log request wrapped as field 2 (otel_replay.storage.logs.wrap_logs): one field, whole
_MAX_WALK = 16
_CANDIDATE_COST = 64
"""Resync work charged per candidate offset examined (a ``find``, a header, up to :data:`_MAX_WALK` field steps)."""
_RESYNC_BUDGET_FACTOR = 8
"""A resync may spend this many work units (checksummed bytes, :data:`_CANDIDATE_COST` per candidate) per byte
it searches, plus :data:`_RESYNC_BUDGET_FLOOR`: past that it stops, as if nothing whole followed.

Without a bound, a region dense in request tags whose headers claim long
records (1M empty ``ResourceSpans``, torn by a crash) costs a checksum of
hundreds of KiB per byte: minutes of CPU per MiB.
"""
_RESYNC_BUDGET_FLOOR = 1 << 20


def _requests_fill(data: bytes | mmap.mmap, at: int, end: int) -> bool:
    """Whether ``data[at:end]`` starts as a run of ``resource_spans`` fields (tag, length, bytes) ending at ``end``.

    A cheap pre-check before a candidate's checksum: a request holds nothing
    else at its top level (past ``_MAX_WALK`` of them the checksum decides).
    """
    if at < end and data[at] == _LOGS_TAG:  # a wrapped log request: one field that ends where the record does
        length, inner = read_varint(data, at + 1, end)
        return inner >= 0 and inner + length == end
    for _ in range(_MAX_WALK):
        if at == end:
            return True
        if at > end or data[at] != _REQUEST_TAG:
            return False
        length, at = read_varint(data, at + 1, end)
        if at < 0:  # ran past the end: the walk fails
            return False
        at += length
    return True


def _record_end(data: bytes | mmap.mmap, offset: int, size: int, *, strict: bool) -> int | None:
    """End of the whole, checksummed record at ``offset``, or ``None``.

    ``strict`` (used while resynchronising, where any offset is a candidate)
    also wants a non-empty run of ``resource_spans`` fields before the
    checksum is computed, so a scan of a damaged region stays cheap (a record
    whose request carries unknown top-level fields is not found this way: it
    is counted in the gap).
    """
    if offset + _HEADER.size > size:
        return None
    length, crc = _HEADER.unpack_from(data, offset)
    start = offset + _HEADER.size
    end = start + length
    if length > _MAX_RECORD or end > size:
        return None
    if strict and (length == 0 or not _requests_fill(data, start, end)):
        return None
    if zlib.crc32(data[start:end]) != crc:
        return None
    return end


def _runs_past_end(data: bytes | mmap.mmap, offset: int, size: int) -> bool:
    """Whether the record at ``offset`` claims more bytes than the file holds (a header cut short counts)."""
    if offset + _HEADER.size > size:
        return True
    length, _ = _HEADER.unpack_from(data, offset)
    return offset + _HEADER.size + length > size


def _next_record(data: bytes | mmap.mmap, offset: int, size: int) -> int | None:
    """The first offset after ``offset`` where a whole record checks out, ``None`` if none, -1 if the search gave up.

    It gives up once it has spent its budget (see :data:`_RESYNC_BUDGET_FACTOR`).
    """
    budget = _RESYNC_BUDGET_FACTOR * (size - offset) + _RESYNC_BUDGET_FLOOR
    tags = (bytes((_REQUEST_TAG,)), bytes((_LOGS_TAG,)))
    at = offset + 1 + _HEADER.size  # a candidate's payload starts 8 bytes after it, with the request tag
    found = [data.find(tag, at) for tag in tags]  # the next offset of each tag (-1: none left)
    while budget > 0:
        for i, tag in enumerate(tags):
            if 0 <= found[i] < at:  # consumed: look again from here (each tag's search moves forward only)
                found[i] = data.find(tag, at)
        ahead = [f for f in found if f >= 0]
        if not ahead:
            return None
        at = min(ahead)
        budget -= _CANDIDATE_COST
        candidate = at - _HEADER.size
        length, _ = _HEADER.unpack_from(data, candidate)
        if 0 < length and at + length <= size and _requests_fill(data, at, at + length):
            budget -= length  # the checksum
            if _record_end(data, candidate, size, strict=False) is not None:
                return candidate
        at += 1
    return -1


def scan_records(path: Path) -> Iterator[bytes | Gap]:
    """Yield ``path``'s whole, checksummed records in order, and a :class:`Gap` for each damaged stretch.

    Records are read as a chain from offset 0 to the end of the file; the
    seal mark is the chain's last, empty record. (Judging "sealed" from the
    last 8 bytes alone is ambiguous: a request can end in 8 zero bytes, e.g.
    an attribute ``doubleValue`` 0.) After a bad record the reader looks for
    the next offset where a whole record checks out and resumes there; when
    there is none the rest of the file is a :class:`Gap` and the scan ends: a
    tail one when the file does not end in :data:`SEAL_MARK` and the bad
    record claims more bytes than the file holds (a write cut short); a bad
    record the file holds whole (a flipped bit) is damage. The search is
    bounded (:func:`_next_record`'s work budget); when it gives up on a bad
    record of an unsealed file whose header claims more bytes than the file
    holds, that record is a torn tail (a crash cut its write short),
    otherwise the rest is damage, never a tail.
    """
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            return
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            sealed = size >= _HEADER.size and data[size - _HEADER.size :] == SEAL_MARK
            offset = 0
            while offset < size:
                end = _record_end(data, offset, size, strict=False)
                if end is not None:
                    if end > offset + _HEADER.size:  # an empty record holds nothing (a seal mark, or written by none)
                        yield data[offset + _HEADER.size : end]
                    offset = end
                    continue
                body = size - _HEADER.size if sealed and offset <= size - _HEADER.size else size
                # Whole records after a bad one make it damage, not a torn tail, even when its header claims
                # more bytes than the file holds (a length field flipped upward after a crash): search first.
                resume = _next_record(data, offset, size)
                if resume == -1 and not sealed and _runs_past_end(data, offset, size):
                    yield Gap(offset, size - offset, tail=True)  # the write a crash cut short, too costly to search
                    return
                if resume == -1:  # too costly to search further: whole records may follow, so not a tail
                    yield Gap(offset, body - offset, tail=False, gave_up=True)
                    return
                if resume is None:  # nothing whole follows: a torn tail only if the segment was never sealed ...
                    # ... and the crash cut the record's write short (its header claims more than the file holds).
                    # A last record held whole whose checksum fails is damage (a flipped bit): it may have been
                    # acknowledged, so it is never read as a tail and dropped.
                    torn = not sealed and _runs_past_end(data, offset, size)
                    yield Gap(offset, body - offset, tail=torn)
                    return
                yield Gap(offset, resume - offset, tail=False)
                offset = resume


def read_records(path: Path) -> Iterator[bytes]:
    """Yield the payloads of ``path``'s records; a torn tail is ignored, damage before the end raises.

    A torn tail (a write a crash cut short, nothing whole after it) was never
    acknowledged: it is logged and cut. Other damage (followed by whole
    records, or a last record the file holds whole) is corruption of
    acknowledged data: :class:`CorruptSegmentError` (the receiver then
    quarantines the segment and salvages it with :func:`scan_records`).
    """
    for item in scan_records(path):
        if not isinstance(item, Gap):
            yield item
            continue
        if item.tail:
            _log.warning(
                "otel-replay: WAL segment %s ends in %d bytes that hold no whole record (a torn tail); ignored",
                path,
                item.size,
            )
            continue
        if item.gave_up:
            follow = "the search for whole records after them gave up"
        elif item.offset + item.size < path.stat().st_size - len(SEAL_MARK):
            follow = "whole records follow"
        else:  # the last record: bad, yet the file holds it whole
            follow = "the file holds it whole (damage, not a write a crash cut short)"
        raise CorruptSegmentError(
            f"WAL segment {path} is corrupt at byte {item.offset}: {item.size} bytes hold no whole record and {follow}"
        )


_logs: set[WriteAheadLog] = set()
"""Logs holding their directory lock (until :meth:`WriteAheadLog.unlock`): held here, so a fork's child finds them."""


def _drop_inherited() -> None:
    """After ``fork()``, in the child: let go of every log the parent had open (its lock and segment descriptors).

    An ``flock`` lasts while any descriptor of it is open: a child that kept
    its copy (a pool's worker, say) would hold the parent's directory lock
    after the parent died, and recovery would take the dead process's log
    for a live one's. The parent's own descriptors, and its lock, are untouched.
    """
    for log in list(_logs):
        log._inherited()
    _logs.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_inherited)


def _new_segment_id() -> str:
    return f"{time.time_ns():020d}-{secrets.token_hex(4)}"


class WriteAheadLog:
    """An append-only, fsynced log of requests, split into segments.

    Args:
        directory: where segments live (created). One process owns it at a
            time (an ``flock`` on :data:`LOCK_NAME`); a second owner gets :class:`WalBusyError`.
        max_segment_bytes: seal the active segment once it is this large.

    """

    def __init__(self, directory: str | os.PathLike[str], *, max_segment_bytes: int = 64 * 1024 * 1024) -> None:
        """Open (creating) the log and start a fresh active segment."""
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_segment_bytes = max_segment_bytes
        lock_fd = try_lock(self.directory / LOCK_NAME)
        if lock_fd is None:
            raise WalBusyError(f"WAL directory {self.directory} is in use by another otel-replay serve")
        self._lock_fd = lock_fd
        self._write_lock = threading.Lock()
        self._sync_lock = threading.Lock()  # held by an fsync in flight, a seal and close
        self._leader = threading.Condition()  # who fsyncs next; the others wait here for its fsync to cover them
        self._leading = False
        self._sealed: list[Segment] = [
            Segment(p.stem, p, p.stat().st_size) for p in sorted(self.directory.glob(f"*{WAL_SUFFIX}"))
        ]
        self._fd = -1
        self._active_id = ""
        self._active_size = 0
        self._active_records = 0
        self._active_since = 0.0
        self._queue: list[tuple[bytes, ...]] = []  # records appended, not yet written (each as its pieces)
        self._queued = 0  # records appended (all segments): the tickets handed out, monotonically increasing
        self._written = 0  # records written or refused (tickets up to here are settled but for their fsync)
        self._synced = 0
        # Batches not written: first ticket -> [last ticket, the error, appenders yet to be told]
        self._failed: dict[int, list[Any]] = {}
        # Batches written to the active segment since its last fdatasync: (first ticket, last ticket), and the
        # segment's size and records as of that sync. A failed fdatasync cuts those batches off and fails them.
        self._unsynced: list[tuple[int, int]] = []
        self._synced_size = 0
        self._synced_records = 0
        self._closed = False
        self._open_failure_logged = -1e9
        self._open_segment()
        _logs.add(self)

    def _inherited(self) -> None:
        """In a forked child: close this process's copies of the log's descriptors; the log is closed here.

        No lock is taken: a thread of the parent may have held one at the fork.
        """
        self._closed = True
        for fd in (self._fd, self._lock_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fd = self._lock_fd = -1

    # --- segments -------------------------------------------------------------
    def _open_segment(self) -> None:
        """Start a new active segment; on failure there is none (``_fd`` -1) and the next append tries again."""
        self._fd = -1
        self._active_size = 0
        self._active_records = 0
        self._unsynced, self._synced_size, self._synced_records = [], 0, 0
        segment_id = _new_segment_id()
        path = self.directory / f"{segment_id}{WAL_SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        try:
            fsync_dir(self.directory)  # without it the segment's name may not survive a power loss
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        self._fd = fd
        self._active_id = segment_id
        self._active_since = time.monotonic()

    def _ensure_open_locked(self) -> None:
        """Reopen an active segment that an earlier failure (disk full, out of inodes or fds) left missing."""
        if self._fd < 0 and not self._closed:
            self._open_segment()

    @property
    def writable(self) -> bool:
        """Whether an append can be tried now: not closed, and an active segment is open (opening one if missing)."""
        with self._write_lock:
            try:
                self._ensure_open_locked()
            except OSError:
                return False
            return self._fd >= 0

    def rotate(self, *, min_age_seconds: float = 0.0, min_bytes: int = 0, reopen: bool = True) -> bool:
        """Seal the active segment if it holds records (at least ``min_bytes``, and is ``min_age_seconds`` old).

        With ``reopen``, a missing active segment (its opening failed earlier) is opened again. Records
        queued by then are written first, so the seal's fsync covers them (a flush that seals the log leaves
        none of them only in memory).
        """
        with self._sync_lock:
            if self._queue and self._fd >= 0:
                self._write_queued()  # their appenders wait for the seal's fsync, or the next one
            with self._write_lock:
                return self._rotate_locked(min_age_seconds, min_bytes, reopen)

    def _rotate_locked(self, min_age_seconds: float, min_bytes: int, reopen: bool) -> bool:
        """:meth:`rotate` once the queue is written (caller holds both locks)."""
        if reopen and self._fd < 0:
            try:
                self._ensure_open_locked()
            except OSError as exc:
                now = time.monotonic()
                if now - self._open_failure_logged >= 30.0:  # the converter retries every 0.2 s: log seldom
                    self._open_failure_logged = now
                    _log.error("otel-replay: cannot open a new WAL segment in %s: %s", self.directory, exc)
            return False
        if self._fd < 0 or self._active_records == 0 or self._active_size < min_bytes:
            return False
        if time.monotonic() - self._active_since < min_age_seconds:
            return False
        self._seal_locked(reopen=reopen)
        return True

    def _seal_locked(self, *, reopen: bool) -> None:
        """Seal the active segment: the seal mark, an fsync, the file closed and queued (caller holds both locks).

        A failed fsync is handled as on the append path: the records it was
        to cover (written since the last good sync, e.g. queued when the log
        closes) are cut off and each of their appenders fails; the records
        synced before stay, and the segment is queued all the same (without
        its mark, it reads as never sealed). Appends go to a new segment,
        never again to the file whose write-back failed (Linux reports that
        once; a later sync of it proves nothing). The error is then raised.
        """
        try:  # the seal mark: damage to the last record of a sealed segment is then corruption, not a torn tail
            if os.write(self._fd, SEAL_MARK) == len(SEAL_MARK):
                self._active_size += len(SEAL_MARK)
        except OSError:  # e.g. the disk is full: the segment reads as one that was never sealed
            pass
        failure: OSError | None = None
        try:
            os.fsync(self._fd)
        except OSError as exc:
            failure = exc
            self._cut_unsynced_locked(exc)
            _log.error(
                "otel-replay: fsync while sealing WAL segment %s failed: %s; the records it was to cover are cut "
                "off and refused, the ones synced before are kept",
                self._active_id,
                exc,
            )
        os.close(self._fd)
        self._fd = -1
        self._synced = self._written  # every record written is synced now, or refused above
        self._unsynced = []
        path = self.directory / f"{self._active_id}{WAL_SUFFIX}"
        self._sealed.append(Segment(self._active_id, path, self._active_size))
        self._active_size = 0
        self._active_records = 0
        if reopen:
            try:
                self._open_segment()
            except OSError:
                if failure is None:
                    raise
        if failure is not None:
            raise failure

    def sealed(self) -> list[Segment]:
        """Sealed segments not yet released, oldest first."""
        with self._write_lock:
            return list(self._sealed)

    def release(self, segment: Segment) -> None:
        """Delete a segment whose rows are safely in Parquet.

        Once the file is gone the segment leaves the queue, even if the
        directory fsync after it fails (raised): a crash may then bring the
        file back, and converting it again rewrites the same Parquet files.
        """
        segment.path.unlink(missing_ok=True)
        self.forget(segment)

    def forget(self, segment: Segment) -> None:
        """Drop a segment from the queue without deleting it (it was moved aside, e.g. quarantined)."""
        with self._write_lock:
            self._sealed = [s for s in self._sealed if s.segment_id != segment.segment_id]
        fsync_dir(self.directory)

    @property
    def pending_bytes(self) -> int:
        """Bytes in the log not yet converted (sealed segments plus the active one)."""
        with self._write_lock:
            return self._active_size + sum(s.size for s in self._sealed)

    @property
    def active_segment(self) -> str:
        """The id of the segment appends go to now ("" while none is open)."""
        with self._write_lock:
            return self._active_id if self._fd >= 0 else ""

    @property
    def active_records(self) -> int:
        """Records in the active segment."""
        return self._active_records

    # --- appending ------------------------------------------------------------
    def append(self, payload: bytes) -> None:
        """Append one record and return once it is fsynced (durable).

        Group commit: the record is queued, and one thread at a time (the
        leader) writes everything queued so far with one ``write`` and
        fsyncs it once; the other appenders wait for the fsync that covers
        their record. A record that could not be written (disk full, no
        segment could be opened) raises in its own appender; a failed fsync
        cuts every record written since the last good one off the segment
        and raises in each of their appenders; no record is reported durable
        that was not fsynced, and none that raised stays in the log.
        """
        self.wait(self.enqueue(payload))

    def enqueue(self, payload: bytes) -> int:
        """Queue one record without waiting; its ticket, for :meth:`wait`.

        Records are written and fsynced in the order they were queued, and an
        fsync covers every record queued before the last one it covers: once
        a record is durable, so is every record queued before it (or that
        record's own appender was told it failed). :meth:`append` is this and
        :meth:`wait`; a caller that must keep an order between records it
        makes on several threads queues them in that order, then waits.
        """
        header = _HEADER.pack(len(payload), zlib.crc32(payload))
        # A small record is joined to its header (one buffer for the batch's write); a large one is kept apart
        # from its header, so it is not copied.
        record = (header + payload,) if len(payload) <= _ONE_WRITE else (header, payload)
        with self._write_lock:
            if self._closed:
                raise OtelReplayError("write-ahead log is closed")
            self._queue.append(record)
            self._queued += 1
            return self._queued

    def wait(self, ticket: int) -> None:
        """Return once the record queued as ``ticket`` is fsynced; raises what kept it from being written."""
        self._sync(ticket)

    def _done(self, ticket: int) -> bool:
        """Whether record ``ticket`` is durable; raises (once) what kept it from being written.

        A failed batch is forgotten once each of its appenders was told.
        """
        if self._failed:
            with self._write_lock:
                for low, failed in self._failed.items():
                    if low <= ticket <= failed[0]:
                        failed[2] -= 1
                        if failed[2] <= 0:
                            del self._failed[low]
                        raise failed[1]
        return self._synced >= ticket

    def _sync(self, ticket: int) -> None:
        """Return once record ``ticket`` is fsynced: one thread (the leader) writes and fsyncs all that is queued.

        The others wait on a condition, not in line for the lock, so one
        fsync releases every record it covered at once (waiting in line, each
        waiter woke in turn and, in a busy process, waited for the GIL in
        turn: 17 ms per append at 8 threads against 2.4 ms per fsync); and
        they make no system call of their own (each costs a thread the GIL
        back, up to the switch interval of 5 ms while another thread
        computes). A failed fsync fails every record it was to cover (see
        :meth:`_cut_unsynced`); a waiter it did not cover becomes the next
        leader and tries again, so no record is reported durable that was
        not fsynced.
        """
        if self._done(ticket):
            return
        with self._leader:
            while self._leading:
                self._leader.wait()
                if self._done(ticket):
                    return  # another thread's write and fsync covered this record
            self._leading = True
        try:
            with self._sync_lock:
                if not self._done(ticket):
                    self._write_queued()
                    if not self._done(ticket) and self._fd >= 0 and self._synced < self._written:
                        target = self._written
                        try:
                            os.fdatasync(self._fd)
                        except OSError as exc:
                            self._cut_unsynced(exc)
                            self._done(ticket)  # raises ``exc``: this record was cut off with the others
                            raise
                        self._synced = max(self._synced, target)
                        # Under _sync_lock, as every write of the segment is: no other lock needed.
                        self._unsynced = []
                        self._synced_size, self._synced_records = self._active_size, self._active_records
                    if not self._done(ticket):  # pragma: no cover - written and fsynced above, or raised
                        raise OtelReplayError(f"write-ahead log record {ticket} was neither written nor refused")
        finally:
            with self._leader:
                self._leading = False
                self._leader.notify_all()

    def _cut_unsynced(self, exc: BaseException) -> None:
        """An fdatasync failed: cut every record written since the last one off the segment and fail each.

        A retried fdatasync can report success without the pages the failed
        one lost (Linux forgets the error once it has reported it), so no
        record it covered is reported durable; and a record whose appender
        is told it failed must not stay in the log, or it is converted
        besides being sent again (a gate record then lands twice).
        Caller holds ``_sync_lock``.
        """
        with self._write_lock:
            self._cut_unsynced_locked(exc)

    def _cut_unsynced_locked(self, exc: BaseException) -> None:
        """As :meth:`_cut_unsynced`; the caller holds ``_sync_lock`` and ``_write_lock`` (a seal)."""
        batches, self._unsynced = self._unsynced, []
        if self._fd >= 0:
            try:
                os.ftruncate(self._fd, self._synced_size)
            except OSError as cut:  # the records stay in the segment: still failed, as nothing says otherwise
                _log.error("otel-replay: cutting unsynced records off WAL segment %s failed: %s", self._active_id, cut)
            self._active_size, self._active_records = self._synced_size, self._synced_records
        for low, high in batches:
            self._fail(low, high, exc)

    def _write_queued(self) -> None:
        """Write every queued record to the active segment with one ``write`` (caller holds ``_sync_lock``).

        A segment the batch would take past ``max_segment_bytes`` is sealed
        first. When the batch cannot be written whole, what was written of
        it is cut off (records appended after it stay readable) and each of
        its records fails with that error.
        """
        with self._write_lock:
            batch, self._queue = self._queue, []
            if not batch:
                return
            high = self._queued
            low = high - len(batch) + 1
            pieces = [piece for record in batch for piece in record]
            size = sum(len(piece) for piece in pieces)
            try:
                if self._fd >= 0 and self._active_size and self._active_size + size > self.max_segment_bytes:
                    self._seal_locked(reopen=True)
                self._ensure_open_locked()  # an OSError here is the request's 503; the next one tries again
            except OSError as exc:
                self._fail(low, high, exc)
                return
            if self._fd < 0:  # closed meanwhile
                self._fail(low, high, OtelReplayError("write-ahead log is closed"))
                return
            fd, start = self._fd, self._active_size
        if len(pieces) > 1 and size <= _ONE_WRITE:
            pieces = [b"".join(pieces)]
        try:
            for piece in pieces:
                view = memoryview(piece)
                written = 0
                while written < len(view):
                    written += os.write(fd, view[written:])
        except OSError as exc:
            error: BaseException = exc
            try:
                os.ftruncate(fd, start)  # cut the partial batch off, so records appended after it stay readable
            except OSError as cut:
                error = cut
            with self._write_lock:
                self._fail(low, high, error)
            return
        with self._write_lock:
            self._active_size = start + size
            self._active_records += len(batch)
            self._written = high
            self._unsynced.append((low, high))

    def _fail(self, low: int, high: int, exc: BaseException) -> None:
        """Records ``low`` to ``high`` were not written: each appender raises ``exc`` (caller holds ``_write_lock``)."""
        self._failed[low] = [high, exc, high - low + 1]
        self._written = high  # their tickets are settled: a later record's fsync does not wait for them

    def close(self, *, unlock: bool = True) -> None:
        """Seal the active segment (an empty one is removed) and release the directory lock.

        With ``unlock=False`` the lock is kept (appends are refused all the
        same) until :meth:`unlock`: the owner converts the sealed segments first.
        A failed fsync of the seal is raised, after the records it was to cover
        are refused and the segment is queued (see :meth:`_seal_locked`).
        """
        with self._sync_lock:
            with self._write_lock:
                if self._closed:
                    return
                self._closed = True  # no record is queued from here
            self._write_queued()  # what was queued before: its appenders wait for the seal's fsync
            try:
                with self._write_lock:
                    if self._fd >= 0:
                        if self._active_records:
                            self._seal_locked(reopen=False)  # a failed fsync fails the records it was to cover
                        else:
                            os.close(self._fd)
                            self._fd = -1
                            (self.directory / f"{self._active_id}{WAL_SUFFIX}").unlink(missing_ok=True)
            finally:
                if unlock:
                    self.unlock()

    def unlock(self) -> None:
        """Release the directory lock of a closed log (once)."""
        with self._write_lock:
            if not self._closed or self._lock_fd < 0:
                return
            fd, self._lock_fd = self._lock_fd, -1
        _logs.discard(self)
        os.close(fd)
