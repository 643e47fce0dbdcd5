"""Converting a capture write-ahead log's segments to Parquet, and recovering the logs dead processes left.

What :func:`otel_replay.open`, ``otel-replay compact``, ``serve`` and
:func:`otel_replay.configure` run on a dataset before they read or write it
(:func:`recover`), and what a live log converts its sealed segments with
(:func:`convert_log_segment`). The log itself, its span encoder and its span
processor are :mod:`otel_replay.capture.write_ahead`'s, which re-exports these
names; they live here so that a reader opening a dataset does not import the
OpenTelemetry SDK and the OTLP classes the log's writer runs on. Nothing is
converted (and the converter not imported) unless a log or an outcome is left.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from otel_replay._flock import try_lock
from otel_replay.location import resolve
from otel_replay.storage.backend import backend_for
from otel_replay.storage.outcome_claims import recover_outcomes

__all__ = ["CAPTURE_PREFIX", "convert_log_segment", "log_root", "quarantined", "recover", "segment_prefix"]

_log = logging.getLogger(__name__)

_EMPTY_GRACE_SECONDS = 60.0
"""A log directory with no segment is removed by :func:`recover` only this long after it changed."""

CAPTURE_PREFIX = "capture-"
"""How a capture process's log directory under the log root is named (the receiver's are named by instance)."""


def log_root(dataset: str) -> Path:
    """Where capture logs of ``dataset`` live: ``<dataset>/_wal``; for an ``s3://`` dataset, a local directory.

    The log must be local (an fsync is what makes a record durable):
    ``~/.cache/otel-replay/wal/<digest of the dataset URI>`` (``XDG_CACHE_HOME`` honoured).
    """
    return backend_for(resolve(dataset)).local_dir("wal")


def segment_prefix(directory: Path, segment_id: str) -> str:
    """How the Parquet files converted from segment ``segment_id`` of the log in ``directory`` are named."""
    return f"wal-{directory.name}-{segment_id}"


def convert_log_segment(path: Path, dataset: str, prefix: str, damaged: list[Any] | None = None) -> int:
    """Convert one segment of a capture log to Parquet files named ``<prefix>-NNNNN`` (idempotently); rows written.

    As :func:`otel_replay.storage.convert.convert_segment` (the segment is
    ``flock``-ed while converting; a record that cannot be decoded or
    converted, or damage before the end, fails the whole segment), with the
    log's one-span records regrouped by resource and scope first: the same
    rows, in the same order, at a fraction of the conversion's CPU. With
    ``damaged``, a last record the file holds whole but whose checksum fails
    (damage, not a write a crash cut short) ends the conversion instead of
    failing it: its :class:`~otel_replay.storage.wal.Gap` is appended there.
    """
    # start-up cost: the receiver's converter loads only when a gate's log is converted
    from otel_replay.storage.convert import BATCH_BYTES, ChunkWriter
    from otel_replay.storage.regroup import regrouped
    from otel_replay.storage.wal import read_records

    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        writer = ChunkWriter(dataset, prefix)
        records = read_records(path) if damaged is None else _records_to_damaged_end(path, damaged)
        for payload in regrouped(records, BATCH_BYTES):
            writer.add_payload(payload)
        writer.flush()
        return writer.rows_written
    finally:
        os.close(fd)


def _records_to_damaged_end(path: Path, damaged: list[Any]) -> Iterator[bytes]:
    """As :func:`~otel_replay.storage.wal.read_records`, but damage to the last record ends it, kept in ``damaged``.

    In a capture log that last record is often an intent, the one record
    that says a payment may have gone through: the segment is converted up
    to it (the names a whole conversion uses) and kept in quarantine.
    """
    # start-up cost: the log's format loads only when a log is left to recover
    from otel_replay.storage.wal import CorruptSegmentError, Gap, scan_records

    end: Any = None
    for item in scan_records(path):
        if end is not None:  # whole records follow the damage: it fails the segment, as in read_records
            raise CorruptSegmentError(f"WAL segment {path} is corrupt at byte {end.offset}: whole records follow")
        if isinstance(item, Gap) and item.gave_up:
            raise CorruptSegmentError(f"WAL segment {path} is corrupt at byte {item.offset}: the search gave up")
        if not isinstance(item, Gap):
            yield item
        elif item.tail:
            _log.warning(
                "otel-replay: capture log segment %s ends in a torn record (%d bytes); ignored", path, item.size
            )
        else:
            end = item
    if end is not None:
        damaged.append(end)


def _convert_dir(directory: Path, dataset: str, segments: Sequence[Any]) -> int:
    """Convert ``segments`` (oldest first) of the log in ``directory``; deletes each once written. Rows written.

    A segment that cannot be converted whole (damage with whole records
    after it) is salvaged as the receiver salvages a quarantined one
    (:func:`otel_replay.storage.convert.salvage_segment`, same file names):
    every record that checks out lands, and what was lost is logged as an
    error. A segment that lost records or spans is kept, as the receiver
    keeps one, in ``<directory>/quarantine/`` with a ``<segment>.report.json``
    (the bytes of an acknowledged record, e.g. an intent, are never deleted);
    any other is deleted. An ``OSError`` (disk full) is raised: the segment
    stays for the next try.
    """
    # start-up cost: the receiver's converter loads only when a gate's log is converted
    from otel_replay.storage.convert import Salvage, salvage_segment

    rows = 0
    for segment in segments:
        prefix = segment_prefix(directory, segment.segment_id)
        try:
            damaged: list[Any] = []
            written = convert_log_segment(segment.path, dataset, prefix, damaged)
            rows += written
            if damaged:
                (tail,) = damaged
                report = Salvage(rows=written, records_dropped=1, bytes_skipped=tail.size)
                report.note(f"bytes {tail.offset}-{tail.offset + tail.size}: a whole record that fails its checksum")
                _log.error(
                    "otel-replay: capture write-ahead log segment %s ends in a record that is whole but fails its "
                    "checksum (damage, not a write a crash cut short: it may be an acknowledged intent); converted "
                    "%d span(s) before it; the segment is kept in %s",
                    segment.path,
                    written,
                    _quarantine(segment.path, report),
                )
        except OSError:
            raise
        except Exception as exc:  # noqa: BLE001 - damaged content: salvage what checks out, say what did not
            report = salvage_segment(str(segment.path), dataset, prefix)
            rows += report.rows
            kept = _quarantine(segment.path, report) if report.records_dropped or report.spans_dropped else None
            _log.error(
                "otel-replay: capture write-ahead log segment %s could not be converted whole (%s); salvaged %d "
                "span(s), dropped %d span(s) and %d record(s)%s%s",
                segment.path,
                exc,
                report.rows,
                report.spans_dropped,
                report.records_dropped,
                f"; first: {report.reasons[0]}" if report.reasons else "",
                f"; the segment is kept in {kept}" if kept is not None else "",
            )
        segment.path.unlink(missing_ok=True)
    return rows


def quarantined(dataset: str) -> list[str]:
    """The capture log segments of ``dataset`` kept in quarantine (they lost records to damage), oldest first.

    :func:`otel_replay.query.verify.verify` lists them as files that could
    not be read: what they held was not checked, and may be a commit.
    """
    try:
        found = log_root(dataset).glob(f"{CAPTURE_PREFIX}*/{QUARANTINE}/*.wal")
        return [str(path) for path in sorted(found, key=lambda p: p.name)]
    except OSError:
        return []


QUARANTINE = "quarantine"
"""Where, in a capture log's directory, a segment that lost records to damage is kept (as the receiver keeps one)."""


def _quarantine(path: Path, report: Any) -> Path:
    """Keep the damaged segment ``path`` in ``quarantine/`` beside it, with the salvage's report; the kept path."""
    # start-up cost: the writer's helpers load only when a damaged log is found
    from otel_replay.exporters.writer import fsync_dir

    folder = path.parent / QUARANTINE
    folder.mkdir(exist_ok=True)
    kept = folder / path.name
    text = json.dumps(
        {
            "segment": path.name,
            "spans_written": report.rows,
            "spans_dropped": report.spans_dropped,
            "records_dropped": report.records_dropped,
            "bytes_skipped": report.bytes_skipped,
            "reasons": report.reasons,
        },
        indent=1,
    )
    report_path = folder / f"{path.stem}.report.json"
    temp = folder / f".{report_path.name}.tmp"
    with open(temp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, report_path)
    os.replace(path, kept)  # the report first: a segment in quarantine always has one
    fsync_dir(folder)
    fsync_dir(path.parent)
    return kept


def _recover_outcomes(dataset: str) -> int:
    """The outcomes dead processes held in the claim store (:mod:`otel_replay.storage.outcome_log`); rows written."""
    try:
        return recover_outcomes(dataset)
    except Exception as exc:  # noqa: BLE001 - kept in the claim store for the next try, never dropped
        _log.error("otel-replay: recovering the outcomes held in the claim store of %s failed: %s", dataset, exc)
        return 0


def recover(dataset: str) -> int:
    """Convert the capture logs of ``dataset`` that no live process holds (left by a crash); rows written.

    Each directory is taken under its log's own lock (so a live process's log
    and another recovering process are left alone), its segments are
    converted under the names the dead process would have used (a
    conversion it had started is rewritten, not added again), and it is
    removed. A torn last record (never acknowledged) is ignored; a failure is
    logged and the directory kept for the next try.
    """
    rows = _recover_outcomes(dataset)
    root = log_root(dataset)
    try:
        candidates = sorted(p for p in root.iterdir() if p.name.startswith(CAPTURE_PREFIX) and p.is_dir())
    except OSError:
        return rows
    # start-up cost: the log's format loads only when a log is left to recover
    from otel_replay.storage.wal import LOCK_NAME, WAL_SUFFIX, Segment

    for directory in candidates:
        try:
            fd = try_lock(directory / LOCK_NAME)
        except OSError:
            continue
        if fd is None:
            continue  # a live process's log
        try:
            paths = sorted(directory.glob(f"*{WAL_SUFFIX}"))
            if not paths and time.time() - directory.stat().st_mtime < _EMPTY_GRACE_SECONDS:
                continue  # nothing to convert, and maybe a log being opened right now (before its lock)
            try:
                rows += _convert_dir(directory, dataset, [Segment(p.stem, p, p.stat().st_size) for p in paths])
            except Exception as exc:  # noqa: BLE001 - kept for the next try, never dropped
                _log.error("otel-replay: recovering the capture write-ahead log %s failed: %s", directory, exc)
                continue
            if (directory / QUARANTINE).is_dir():  # kept for inspection: the rest of the directory is converted
                for leftover in directory.glob(f"*{WAL_SUFFIX}"):
                    leftover.unlink(missing_ok=True)
            else:
                shutil.rmtree(directory, ignore_errors=True)
        finally:
            os.close(fd)
    if rows:
        _log.info("otel-replay: recovered %d span(s) from capture write-ahead logs of %s", rows, dataset)
    return rows
