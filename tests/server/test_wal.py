"""The write-ahead log: torn tails, ownership, and replay without duplicates."""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_replay.errors import OtelReplayError
from otel_replay.server import Receiver, ServerConfig
from otel_replay.storage.convert import convert_segment
from otel_replay.storage.wal import (
    SEAL_MARK,
    CorruptSegmentError,
    Gap,
    WalBusyError,
    WriteAheadLog,
    read_records,
    scan_records,
)

from .conftest import expected_rows, make_spans, parquet_rows


def test_torn_tail_record_is_ignored(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    for n in range(3):
        wal.append(f"record {n}".encode())
    crashed = tmp_path / "crashed.wal"
    shutil.copy(next((tmp_path / "wal").glob("*.wal")), crashed)  # the active segment as kill -9 leaves it
    wal.close()
    with open(crashed, "ab") as handle:
        handle.write(b"\x40\x00\x00\x00\x12\x34")  # a header cut short by a crash
    assert list(read_records(crashed)) == [b"record 0", b"record 1", b"record 2"]
    with open(crashed, "r+b") as handle:  # flip a payload byte of the last whole record: crc mismatch
        handle.seek(-7 - 6, 2)
        handle.write(b"X")
    # Held whole, so damage, not a write cut short (it may have been acknowledged): never dropped as a tail.
    with pytest.raises(CorruptSegmentError, match="holds it whole"):
        list(read_records(crashed))
    assert list(scan_records(crashed))[-1] == Gap(2 * 16, 16 + 6, tail=False)
    # A segment sealed whole ends in the seal mark: damage to its last record is corruption, not a torn tail.
    (segment,) = wal.sealed()
    assert segment.path.read_bytes().endswith(SEAL_MARK)
    assert list(read_records(segment.path)) == [b"record 0", b"record 1", b"record 2"]
    with open(segment.path, "r+b") as handle:
        handle.seek(-len(SEAL_MARK) - 3, 2)
        handle.write(b"X")
    with pytest.raises(CorruptSegmentError):
        list(read_records(segment.path))
    assert list(scan_records(segment.path))[-1] == Gap(2 * 16, 16, tail=False)


def test_one_owner_per_wal_directory(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    with pytest.raises(WalBusyError, match="in use"):
        WriteAheadLog(tmp_path / "wal")
    wal.close()
    WriteAheadLog(tmp_path / "wal").close()


def test_segments_rotate_by_size(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "wal", max_segment_bytes=100)
    for _ in range(5):
        wal.append(b"x" * 60)
    assert len(wal.sealed()) == 4 and wal.active_records == 1
    wal.close()
    assert sum(len(list(read_records(s.path))) for s in wal.sealed()) == 5


def test_a_seal_covers_the_records_queued_before_it(tmp_path: Path) -> None:
    # A flush seals the log (rotate) to make what was queued durable: a record queued, its appender not yet
    # waiting, must be in the sealed segment, fsynced, not left in memory for a new segment.
    wal = WriteAheadLog(tmp_path / "wal")
    wal.append(b"first")
    ticket = wal.enqueue(b"queued")
    assert wal.rotate()
    (segment,) = wal.sealed()
    assert list(read_records(segment.path)) == [b"first", b"queued"]
    wal.wait(ticket)  # covered by the seal's fsync
    assert wal.active_records == 0
    wal.close()


def test_replay_after_crash_between_parquet_and_release_adds_nothing(tmp_path: Path) -> None:
    dataset = tmp_path / "ds"
    spans = make_spans(40)
    wal = WriteAheadLog(dataset / "_wal" / "default")
    for start in range(0, len(spans), 16):
        wal.append(encode_spans(spans[start : start + 16]).SerializeToString())
    wal.close()
    (segment,) = wal.sealed()
    # The converter wrote the Parquet files, then the server died before deleting the segment.
    prefix = f"wal-default-{segment.segment_id}"
    assert convert_segment(str(segment.path), str(dataset), prefix) == len(spans)
    keep = tmp_path / "segment-copy"
    shutil.copy(segment.path, keep)
    receiver = Receiver(ServerConfig(dataset, grpc=None, http=None, convert_workers=0)).start()
    assert receiver.recovered_segments == 1
    receiver.stop()
    assert parquet_rows(dataset) == expected_rows(spans)
    assert not segment.path.exists()
    # Even converting the same segment yet again rewrites the same files.
    convert_segment(str(keep), str(dataset), prefix)
    assert len(parquet_rows(dataset)) == len(spans)


def test_failed_write_is_cut_off_so_later_records_survive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import os

    wal = WriteAheadLog(tmp_path / "wal")
    wal.append(b"A" * 100)
    real_write = os.write
    calls = {"n": 0}

    def short_then_full(fd: int, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data)[:10])  # a short write ...
        raise OSError(errno.ENOSPC, "No space left on device")  # ... then the disk is full

    monkeypatch.setattr(os, "write", short_then_full)
    with pytest.raises(OSError, match="No space"):
        wal.append(b"B" * 100)
    monkeypatch.setattr(os, "write", real_write)
    wal.append(b"C" * 100)
    wal.append(b"D" * 100)
    wal.close()
    (segment,) = wal.sealed()
    assert list(read_records(segment.path)) == [b"A" * 100, b"C" * 100, b"D" * 100]


def _three_record_segment(tmp_path: Path) -> tuple[Path, list[bytes], list]:
    dataset = tmp_path / "ds"
    spans = make_spans(6)
    payloads = [encode_spans(spans[i : i + 4]).SerializeToString() for i in range(0, 12, 4)]
    wal = WriteAheadLog(dataset / "_wal" / "default")
    for payload in payloads:
        wal.append(payload)
    wal.close()
    (segment,) = wal.sealed()
    return segment.path, payloads, spans


@pytest.mark.parametrize("where", ["payload", "length", "crc"])
def test_damage_before_the_end_is_corruption_not_a_torn_tail(tmp_path: Path, where: str) -> None:
    path, payloads, _ = _three_record_segment(tmp_path)
    data = bytearray(path.read_bytes())
    second = 8 + len(payloads[0])
    data[second + {"payload": 8 + 5, "length": 3, "crc": 5}[where]] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptSegmentError, match=f"corrupt at byte {second}"):
        list(read_records(path))
    items = list(scan_records(path))
    assert items[0] == payloads[0] and items[-1] == payloads[2] and len(items) == 3
    assert items[1] == Gap(second, 8 + len(payloads[1]), tail=False)


def test_damaged_middle_record_quarantines_the_segment_and_keeps_the_records_after_it(tmp_path: Path) -> None:
    path, payloads, _ = _three_record_segment(tmp_path)
    data = bytearray(path.read_bytes())
    data[8 + len(payloads[0]) + 8 + 5] ^= 0x01  # one flipped bit in the second record's payload
    path.write_bytes(bytes(data))
    dataset = tmp_path / "ds"
    receiver = Receiver(ServerConfig(dataset, grpc=None, http=None, convert_workers=0)).start()
    receiver.stop()
    metrics = receiver.metrics.snapshot()
    assert metrics["segments_quarantined"] == 1 and metrics["quarantine_records_dropped"] == 1
    stored = {row["span_id"] for row in parquet_rows(dataset)}
    intact: set[str] = set()
    for payload in (payloads[0], payloads[2]):
        request = ExportTraceServiceRequest.FromString(payload)
        intact |= {s.span_id.hex() for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans}
    assert stored == intact and len(stored) == metrics["spans_written"] == 8
    report = json.loads(next((dataset / "_wal" / "default" / "quarantine").glob("*.report.json")).read_text())
    assert report["records_dropped"] == 1 and report["bytes_skipped"] == 8 + len(payloads[1])


def test_resync_scan_of_a_large_damaged_region_finds_the_next_record(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    big = encode_spans(make_spans(2000)).SerializeToString()
    wal.append(big)
    wal.append(encode_spans(make_spans(1)).SerializeToString())
    wal.close()
    (segment,) = wal.sealed()
    with open(segment.path, "r+b") as handle:
        handle.seek(4)
        crc = handle.read(1)[0]
        handle.seek(4)
        # the first record's crc: its whole payload becomes a damaged stretch (flipped, never written back
        # unchanged: writing 0xff left the byte as it was once in 256 runs, when the crc already held it)
        handle.write(bytes([crc ^ 0xFF]))
    items = list(scan_records(segment.path))
    assert isinstance(items[0], Gap) and not items[0].tail and items[0].size == 8 + len(big)
    assert len(items) == 2 and not isinstance(items[1], Gap)


def test_a_record_ending_in_eight_zero_bytes_is_not_taken_for_the_seal_mark(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    wal.append(b"first")
    wal.append(b"ends in zeros" + bytes(8))
    crashed = tmp_path / "crashed.wal"
    shutil.copy(next((tmp_path / "wal").glob("*.wal")), crashed)  # the active segment as kill -9 leaves it
    wal.close()
    assert list(scan_records(crashed)) == [b"first", b"ends in zeros" + bytes(8)]
    (segment,) = wal.sealed()  # sealed: the same records, then the mark
    assert list(read_records(segment.path)) == [b"first", b"ends in zeros" + bytes(8)]


def _tag_dense_request() -> bytes:
    """A valid request of one span plus 1M empty ResourceSpans: every other byte is a request tag."""
    return encode_spans(make_spans(1)).SerializeToString() + b"\x0a\x00" * 1_000_000


def test_a_record_torn_mid_write_is_a_torn_tail_without_a_scan(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    wal.append(b"\x0a\x00whole")
    payload = _tag_dense_request()
    ExportTraceServiceRequest.FromString(payload)
    wal.append(payload)
    crashed = tmp_path / "crashed.wal"
    shutil.copy(next((tmp_path / "wal").glob("*.wal")), crashed)
    wal.close()
    with open(crashed, "r+b") as handle:  # the crash cut the write in the record's middle
        handle.truncate(crashed.stat().st_size - len(payload) // 2)
    items = list(scan_records(crashed))
    assert items[0] == b"\x0a\x00whole"
    assert items[1] == Gap(15, crashed.stat().st_size - 15, tail=True)


def test_a_resync_gives_up_within_its_budget_and_never_calls_what_it_skipped_a_tail(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    wal.append(b"\x0a\x00first")
    wal.append(_tag_dense_request())
    wal.append(b"\x0a\x00last")
    wal.close()
    (segment,) = wal.sealed()
    with open(segment.path, "r+b") as handle:  # damage the dense record's checksum: a resync starts there
        handle.seek(15 + 4)
        crc = handle.read(1)[0]
        handle.seek(15 + 4)
        handle.write(bytes([crc ^ 0xFF]))
    items = list(scan_records(segment.path))
    # Every tag in the dense record is a candidate claiming ~640 KiB: checking them all costs minutes of CPU.
    assert items[0] == b"\x0a\x00first"
    assert items[1] == Gap(15, segment.size - 8 - 15, tail=False, gave_up=True)
    with pytest.raises(CorruptSegmentError, match="gave up"):
        list(read_records(segment.path))


@contextmanager
def _no_free_fds() -> Iterator[None]:
    """Every file descriptor in use (EMFILE for the next open) until the block ends; then the limit is restored."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16, hard))
    fillers = []
    try:
        while True:
            try:
                fillers.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as exc:
                assert exc.errno == errno.EMFILE
                break
        yield
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_failed_segment_open_is_retried_by_the_next_append(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    wal.append(b"\x0a\x00first")
    with _no_free_fds():
        with pytest.raises(OSError):  # sealing frees the old fd; the new segment's directory fsync finds none
            wal.rotate()
        assert not wal.writable
        with pytest.raises(OSError):
            wal.append(b"\x0a\x00refused")
    assert wal.writable  # once fds are free again, without a restart
    wal.append(b"\x0a\x00second")
    wal.close()
    segments = wal.sealed()
    assert [list(read_records(s.path)) for s in segments] == [[b"\x0a\x00first"], [b"\x0a\x00second"]]
    assert sorted(p.name for p in (tmp_path / "wal").glob("*.wal")) == [s.path.name for s in segments]


def test_a_failed_directory_fsync_on_release_leaves_no_phantom_segment(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    wal.append(b"\x0a\x00first")
    wal.rotate()
    (segment,) = wal.sealed()
    with _no_free_fds(), pytest.raises(OSError):
        wal.release(segment)
    assert not segment.path.exists()
    assert wal.sealed() == [] and wal.pending_bytes == 0  # nothing left to convert, nothing counted
    wal.close()


def test_a_start_under_another_instance_warns_about_the_stranded_wal(tmp_path: Path, caplog) -> None:
    dataset = tmp_path / "ds"
    old = WriteAheadLog(dataset / "_wal" / "default")  # a serve killed with unconverted segments
    old.append(encode_spans(make_spans(2)).SerializeToString())
    old.close()
    busy = WriteAheadLog(dataset / "_wal" / "running")  # another serve, alive: its WAL is its own business
    busy.append(encode_spans(make_spans(1)).SerializeToString())
    try:
        with caplog.at_level("WARNING", logger="otel_replay.server"):
            receiver = Receiver(ServerConfig(dataset, grpc=None, http=None, convert_workers=0, instance="other"))
    finally:
        busy.close()
    try:
        assert receiver.stranded == [(dataset / "_wal" / "default", 1)]
        (warning,) = [r.getMessage() for r in caplog.records if "another instance" in r.getMessage()]
        assert str(dataset / "_wal" / "default") in warning and "--instance default" in warning
    finally:
        receiver.start().stop()


def test_a_length_flipped_upward_in_an_unsealed_segment_is_damage_not_a_torn_tail(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    bodies = [encode_spans(make_spans(2)).SerializeToString() for _ in range(3)]
    for body in bodies:
        wal.append(body)
    crashed = tmp_path / "crashed.wal"  # copied before close: unsealed, as kill -9 leaves the active segment
    shutil.copy(next((tmp_path / "wal").glob("*.wal")), crashed)
    wal.close()
    with open(crashed, "r+b") as handle:  # one bit of the first record's length flipped: it now claims ~16 MiB
        handle.seek(2)
        handle.write(bytes([handle.read(1)[0] ^ 0x01]))
    items = list(scan_records(crashed))
    # The acknowledged records after it are still read; the damaged one is a gap that is not a tail.
    assert items[1:] == bodies[1:]
    assert isinstance(items[0], Gap) and not items[0].tail


def _slow_first_fsync(monkeypatch: pytest.MonkeyPatch, until: Callable[[], bool]) -> list[int]:
    """Make the first ``os.fdatasync`` wait until ``until()`` holds (others queue meanwhile); count the calls."""
    real = os.fdatasync
    calls: list[int] = []

    def held(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            deadline = time.monotonic() + 30
            while not until() and time.monotonic() < deadline:
                time.sleep(0.005)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", held)
    return calls


def test_appends_queued_during_an_fsync_share_one_write_and_one_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    fsyncs = _slow_first_fsync(monkeypatch, lambda: wal._queued == 9)  # the first record's fsync waits for 8 more
    real_write = os.write
    writes: list[int] = []

    def counted(fd: int, data: bytes) -> int:
        writes.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", counted)
    first = threading.Thread(target=wal.append, args=(b"\x0afirst",))
    first.start()
    while not fsyncs:
        time.sleep(0.001)
    records = [b"\x0a" + f"r{i}-\u00e9".encode() * (i + 1) for i in range(8)]
    threads = [threading.Thread(target=wal.append, args=(record,)) for record in records]
    for thread in threads:
        thread.start()
    for thread in [first, *threads]:
        thread.join(30)
    assert len(writes) == 2 and len(fsyncs) == 2  # the 8 queued records: one write, one fsync
    wal.close()
    (segment,) = wal.sealed()
    stored = list(read_records(segment.path))
    assert stored[0] == b"\x0afirst" and sorted(stored[1:]) == sorted(records)


def _appender(wal: WriteAheadLog, outcome: dict[bytes, str]) -> Callable[[bytes], None]:
    """A function appending a record to ``wal`` that notes in ``outcome`` whether it was durable or the error."""

    def append(record: bytes) -> None:
        try:
            wal.append(record)
            outcome[record] = "durable"
        except OSError as exc:
            outcome[record] = exc.strerror or ""

    return append


def _append_while_the_first_syncs(
    wal: WriteAheadLog, batch: list[bytes], started: Callable[[], bool]
) -> dict[bytes, str]:
    """Append a first record on a thread, then ``batch`` a thread each once ``started()``; each one's outcome."""
    outcome: dict[bytes, str] = {}

    append = _appender(wal, outcome)

    first = threading.Thread(target=append, args=(b"\x0afirst",))
    first.start()
    while not started():
        time.sleep(0.001)
    threads = [threading.Thread(target=append, args=(record,)) for record in batch]
    for thread in threads:
        thread.start()
    for thread in [first, *threads]:
        thread.join(30)
    return outcome


def _assert_the_batch_was_cut_off(wal: WriteAheadLog) -> None:
    """Each failed appender was told (the failure forgotten), and the segment holds the first record and a later one."""
    assert wal._failed == {}
    wal.append(b"\x0aafter")
    wal.close()
    (segment,) = wal.sealed()
    assert list(read_records(segment.path)) == [b"\x0afirst", b"\x0aafter"]


def test_a_batch_that_cannot_be_written_fails_each_of_its_appenders_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    _slow_first_fsync(monkeypatch, lambda: wal._queued == 4)
    real_write = os.write
    state = {"calls": 0}

    def full_on_the_batch(fd: int, data: bytes) -> int:
        state["calls"] += 1
        if state["calls"] == 2:  # the batch of the three records queued during the first fsync
            real_write(fd, bytes(data)[:5])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_on_the_batch)
    batch = [b"\x0ab1", b"\x0ab2", b"\x0ab3"]
    outcome = _append_while_the_first_syncs(wal, batch, lambda: state["calls"] > 0)
    assert outcome == {b"\x0afirst": "durable", **{record: "No space left on device" for record in batch}}
    _assert_the_batch_was_cut_off(wal)


def test_a_batch_whose_fdatasync_failed_is_cut_off_and_no_appender_of_it_is_told_it_is_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    real = os.fdatasync
    calls: list[int] = []

    def eio_on_the_batch(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:  # the first record's fsync waits for the two others to queue
            deadline = time.monotonic() + 30
            while wal._queued < 3 and time.monotonic() < deadline:
                time.sleep(0.005)
        elif len(calls) == 2:  # the batch of the two: the disk reports an I/O error
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", eio_on_the_batch)
    batch = [b"\x0ab1", b"\x0ab2"]
    outcome = _append_while_the_first_syncs(wal, batch, lambda: bool(calls))
    # Was: the appender whose fdatasync failed raised, and the other, waking as the next leader, fdatasynced again
    # and was told "durable" (Linux reports a lost write-back once), while both records stayed in the segment.
    assert outcome == {b"\x0afirst": "durable", **{record: "Input/output error" for record in batch}}
    _assert_the_batch_was_cut_off(wal)


_APPENDER = """
import sys, threading
from otel_replay.storage.wal import WriteAheadLog

wal = WriteAheadLog(sys.argv[1])
lock = threading.Lock()

def run(t):
    for i in range(100_000):
        record = b"\\x0a" + f"{t}-{i}|".encode() * (1 + i % 7)
        wal.append(record)
        with lock:  # acknowledged: the append returned
            sys.stdout.write(f"{t}-{i}\\n")
            sys.stdout.flush()

for t in range(8):
    threading.Thread(target=run, args=(t,)).start()
"""


def test_every_acknowledged_record_of_eight_threads_survives_a_kill_once(tmp_path: Path) -> None:
    directory = tmp_path / "wal"
    acknowledged = []
    with subprocess.Popen(
        [sys.executable, "-c", _APPENDER, str(directory)], stdout=subprocess.PIPE, text=True, bufsize=1
    ) as child:
        assert child.stdout is not None
        for line in child.stdout:
            acknowledged.append(line.strip())
            if len(acknowledged) == 400:
                break
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        acknowledged += [line.strip() for line in child.stdout.read().splitlines() if line.strip()]
    assert len(acknowledged) >= 400
    stored = []
    for path in sorted(directory.glob("*.wal")):
        for record in read_records(path):
            name, *rest = record[1:].decode().split("|")[:-1]
            assert set(rest) <= {name}  # whole
            stored.append(name)
    assert len(stored) == len(set(stored))  # no record twice
    assert set(acknowledged) <= set(stored)  # no acknowledged record lost


QUEUED = b"\x0aqueued " + "\u00e9".encode()


def test_a_record_queued_when_the_log_closes_is_sealed_in_it_and_acknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    _slow_first_fsync(monkeypatch, lambda: wal._queued == 2)
    outcome: dict[bytes, str] = {}

    def append(record: bytes) -> None:
        try:
            wal.append(record)
            outcome[record] = "durable"
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            outcome[record] = repr(exc)

    threads = [threading.Thread(target=append, args=(b"\x0afirst",))]
    threads[0].start()
    while wal._queued < 1:
        time.sleep(0.001)
    threads.append(threading.Thread(target=append, args=(QUEUED,)))
    threads[1].start()
    while wal._queued < 2:
        time.sleep(0.001)
    wal.close()  # while the second record waits in the queue (or its own write)
    for thread in threads:
        thread.join(30)
    with pytest.raises(OtelReplayError, match="closed"):
        wal.append(b"\x0alate")
    assert outcome == {b"\x0afirst": "durable", QUEUED: "durable"}
    (segment,) = wal.sealed()
    assert list(read_records(segment.path)) == [b"\x0afirst", QUEUED]


def _unsealed_three_record_segment(tmp_path: Path) -> tuple[Path, list[bytes]]:
    """A receiver's WAL as kill -9 leaves it: its active segment holds three acknowledged records, no seal mark."""
    path, payloads, _ = _three_record_segment(tmp_path)
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size - len(SEAL_MARK))
    return path, payloads


def _span_ids(*payloads: bytes) -> set[str]:
    requests = [ExportTraceServiceRequest.FromString(payload) for payload in payloads]
    return {s.span_id.hex() for r in requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans}


def test_a_flipped_bit_in_the_last_record_of_a_crashed_segment_is_quarantined_and_reported_not_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Was: the whole last record with a bad checksum was read as a torn tail, so an acknowledged batch was
    # dropped at recovery with a warning and the segment deleted (nothing counted, nothing kept).
    path, payloads = _unsealed_three_record_segment(tmp_path)
    data = bytearray(path.read_bytes())
    last = len(data) - 8 - len(payloads[2])
    data[last + 8 + 5] ^= 0x01  # length intact, checksum now wrong: what a flipped bit gives
    path.write_bytes(bytes(data))
    assert list(scan_records(path))[-1] == Gap(last, 8 + len(payloads[2]), tail=False)
    with pytest.raises(CorruptSegmentError, match=f"corrupt at byte {last}"):
        list(read_records(path))
    dataset = tmp_path / "ds"
    receiver = Receiver(ServerConfig(dataset, grpc=None, http=None, convert_workers=0)).start()
    receiver.stop()
    metrics = receiver.metrics.snapshot()
    assert metrics["segments_quarantined"] == 1 and metrics["quarantine_records_dropped"] == 1
    assert {row["span_id"] for row in parquet_rows(dataset)} == _span_ids(payloads[0], payloads[1])
    kept = dataset / "_wal" / "default" / "quarantine" / path.name
    assert kept.read_bytes() == bytes(data)  # kept for inspection, never deleted
    report = json.loads(kept.with_name(kept.stem + ".report.json").read_text())
    assert report["records_dropped"] == 1 and report["bytes_skipped"] == 8 + len(payloads[2])
    assert path.name in caplog.text and "quarantined" in caplog.text


def test_a_last_record_a_crash_cut_short_stays_a_torn_tail(tmp_path: Path) -> None:
    path, payloads = _unsealed_three_record_segment(tmp_path)
    last = path.stat().st_size - 8 - len(payloads[2])
    with open(path, "r+b") as handle:  # the crash cut the last write short: never acknowledged
        handle.truncate(path.stat().st_size - 3)
    assert list(scan_records(path))[-1] == Gap(last, 8 + len(payloads[2]) - 3, tail=True)
    dataset = tmp_path / "ds"
    receiver = Receiver(ServerConfig(dataset, grpc=None, http=None, convert_workers=0)).start()
    receiver.stop()
    assert receiver.metrics.snapshot()["segments_quarantined"] == 0
    assert {row["span_id"] for row in parquet_rows(dataset)} == _span_ids(payloads[0], payloads[1])
    assert not path.exists() and not (dataset / "_wal" / "default" / "quarantine").exists()


def _eio_on_the_seal(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make the seal's ``os.fsync`` fail once with EIO (Linux then forgets the error: a retried sync "succeeds")."""
    real = os.fsync
    failed: list[int] = []

    def eio_once(fd: int) -> None:
        if not failed:
            failed.append(fd)
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", eio_once)
    return failed


class _CloserFirst:
    """The log's ``_sync_lock``, instrumented: once the thread named ``closer`` waits for it, it gets it before
    the thread named ``queued`` (so that record is still queued when the log closes, as it can be)."""

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock
        self.closer_waits = threading.Event()
        self.closer_has_it = threading.Event()

    def __enter__(self) -> _CloserFirst:
        name = threading.current_thread().name
        if name == "closer":
            self.closer_waits.set()
        elif name == "queued":
            self.closer_has_it.wait(30)
        self.lock.acquire()
        if name == "closer":
            self.closer_has_it.set()
        return self

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_a_failed_fsync_while_closing_fails_the_records_it_was_to_cover_and_keeps_them_out_of_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    order = _CloserFirst(wal._sync_lock)
    monkeypatch.setattr(wal, "_sync_lock", order)
    _slow_first_fsync(monkeypatch, lambda: wal._queued == 2 and order.closer_waits.is_set())
    failed = _eio_on_the_seal(monkeypatch)
    outcome: dict[bytes, str] = {}

    append = _appender(wal, outcome)

    def close() -> None:
        try:
            wal.close()  # writes the queued record; the seal's fsync, which was to cover it, fails
        except OSError as exc:
            outcome[b"close"] = exc.strerror or ""

    threads = [threading.Thread(target=append, args=(b"\x0afirst",), name="first")]
    threads[0].start()
    while wal._queued < 1:
        time.sleep(0.001)
    threads.append(threading.Thread(target=append, args=(QUEUED,), name="queued"))
    threads[1].start()
    while wal._queued < 2:
        time.sleep(0.001)
    threads.append(threading.Thread(target=close, name="closer"))
    threads[2].start()
    for thread in threads:
        thread.join(30)
    assert failed
    # Was: the queued record's appender, waking as the next leader, fdatasynced the same file again (Linux had
    # reported the lost write-back once) and was told "durable"; its record stayed in the segment.
    assert outcome == {b"\x0afirst": "durable", QUEUED: "Input/output error", b"close": "Input/output error"}
    (segment,) = wal.sealed()  # the records synced before are still the owner's to convert
    assert list(read_records(segment.path)) == [b"\x0afirst"]
    assert wal._lock_fd < 0  # the lock is released all the same


def test_a_failed_fsync_while_sealing_moves_on_to_a_new_segment_and_reports_nothing_durable_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    wal.append(b"\x0afirst")
    first = wal.active_segment
    _eio_on_the_seal(monkeypatch)
    with pytest.raises(OSError, match="Input/output"):
        wal.rotate()
    # The file whose write-back failed takes no more records (a later sync of it would prove nothing).
    assert wal.active_segment not in ("", first)
    wal.append(b"\x0asecond")
    wal.close()
    segments = wal.sealed()
    assert [s.segment_id for s in segments][0] == first
    assert [list(read_records(s.path)) for s in segments] == [[b"\x0afirst"], [b"\x0asecond"]]
