"""Retention: drop whole partitions older than a number of days, never part of one.

A partition is dropped under its lease by one ``rename`` of its directory out
of ``spans/`` (into ``<dataset>/.trash/``), so readers see all of it or none
of it, then the moved directory is deleted. What is dropped is counted. Log
record partitions (``logs/date=…``) age out by the same rule and steps, under
their own lease (:mod:`.kinds`), reported as ``logs/date=…``; they hold no
hash chain, so no checkpoint is written for them.

On an object store (``s3://``) there is no rename: under the partition's
lease the manifest is replaced, by compare-and-swap, with a tombstone that
lists no live file and marks every file superseded, so readers stop seeing
the whole partition at one instant; the objects are deleted once the grace
period is over (at once with ``grace_seconds=0``, else by a later retention
or compaction run), so a reader that listed them just before still finds them.
Unnamed compaction outputs are deleted only after a conditional rewrite of
the manifest, so a compactor that stalled past its lease can no longer swap
in a manifest naming them (see :mod:`compact_s3`).

Before a partition is dropped, a checkpoint signed with the signing key
records where it cuts each hash chain (``_retention/``, see
:mod:`.retention_marks`), so ``verify`` tells the cut from a deletion.

Outcome and compensation claims (``_outcomes/``, ``_compensations/``: one
small file per outcome or compensated receipt, or a row of the local outcome
claim store ``_outcomes/claims.sqlite3``, kept so that an outcome or a
refund happens once) last written before the cutoff are deleted too, else
they would pile up for ever. Only when every partition before the cutoff was
dropped (none busy): a claim is newer than the decision and receipt it
guards, which are then gone, so nothing is left it could protect. Lock files
are never deleted (a claimant may hold one).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from otel_replay.errors import ConfigError
from otel_replay.exporters.schema import COMPENSATIONS_DIR, OUTCOMES_DIR
from otel_replay.integrity import SigningKey, load_signing_key
from otel_replay.location import Location, PerBackend, resolve

from . import objects
from .compact_s3 import clean_partition, read_partition, swap_manifest
from .facts import facts_of_index
from .kinds import KINDS, SPANS, FileKind
from .lease import ObjectLease, PartitionLease
from .manifest import (
    MANIFEST_NAME,
    Manifest,
    not_partition_names,
    partition_date,
    partition_dirs,
    partition_live_files,
    partition_names,
    visible_names,
)
from .outcome_claims import expire_outcome_claims
from .retention_marks import dropped_links, midnight_ns, write_marks

DEFAULT_GRACE_SECONDS = 600.0
"""On an object store: how long a dropped partition's objects stay for readers that listed them."""

__all__ = ["RetentionReport", "drop_older_than"]


@dataclass
class RetentionReport:
    """Partitions dropped (with their live files and rows), partitions skipped as busy, and odd folders.

    ``not_partitions``: folders named ``date=…`` that are not a real date
    (``date=2024-13-45``, non-ASCII digits): never dropped, warned about, left as they are.
    """

    dropped: list[str] = field(default_factory=list)
    """Partitions dropped: ``date=…`` for spans, ``logs/date=…`` for log records."""
    files: int = 0
    rows: int = 0
    """Span rows dropped."""
    log_rows: int = 0
    """Log record rows dropped."""
    bytes: int = 0
    busy: list[str] = field(default_factory=list)
    not_partitions: list[str] = field(default_factory=list)
    """Folders named ``date=…`` that are not a date (under ``logs/``: ``logs/date=…``)."""
    claims_expired: int = 0
    """Outcome and compensation claim files deleted (written before the cutoff; see the module docstring)."""
    checkpoints: int = 0
    """Retention checkpoints written (one per dropped partition; see :mod:`.retention_marks`)."""
    links: int = 0
    """Chain cuts the checkpoints vouch for, so ``verify`` tells them from deletions."""
    unvouched: int = 0
    """Newest records of a run that failed their seal check or sat in unreadable files: not vouched for."""
    no_key: bool = False
    """No signing key was found: no checkpoint written, ``verify`` reports the cut chains."""


def _rows(path: Path) -> int:
    try:
        return pq.read_metadata(path).num_rows
    except (pa.ArrowException, OSError):
        return 0


def drop_older_than(
    dataset: str | os.PathLike[str],
    days: int,
    *,
    today: dt.date | None = None,
    lease_wait: float = 0.0,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    key: SigningKey | None = None,
    older_keys: Sequence[SigningKey] = (),
) -> RetentionReport:
    """Drop every partition whose date is more than ``days`` days before ``today`` (UTC).

    ``days=0`` keeps only today's (and future) partitions. A partition whose
    lease another process holds (a compaction in progress) is left and listed
    in ``busy``. ``dataset`` may be an ``s3://`` URI (see the module
    docstring; ``grace_seconds`` applies there only). Before a partition is
    dropped, a checkpoint signed with ``key`` (default: the signing key from
    the environment or key file, if there is one) records where it cuts each
    hash chain (:mod:`.retention_marks`); records signed with one of
    ``older_keys`` (keys rotated out, still verification keys) are vouched
    for too.

    Raises:
        ConfigError: ``days`` is not a whole number from 0 to 999999.

    """
    if isinstance(days, bool) or not isinstance(days, int) or not 0 <= days < 1_000_000:
        raise ConfigError(f"older than {days!r} days: give a whole number of days from 0 to 999999")
    if not grace_seconds >= 0 or grace_seconds == float("inf"):
        raise ConfigError(f"grace_seconds={grace_seconds!r} must be a finite number >= 0")
    today = today or dt.datetime.now(dt.UTC).date()
    # DAYS past year 1 keeps every partition (the subtraction would overflow)
    cutoff = today - dt.timedelta(days=days) if days < (today - dt.date.min).days else dt.date.min
    location = resolve(dataset)
    signing = key if key is not None else load_signing_key(create=False)
    checkpoint = _Checkpoint(location, signing, older_keys, cutoff)
    report = _DROP.of(location)(location, cutoff, lease_wait, grace_seconds, checkpoint)
    report.checkpoints, report.links, report.unvouched = checkpoint.written, checkpoint.links, checkpoint.unvouched
    report.no_key = checkpoint.key is None
    if not report.busy:
        report.claims_expired = _expire_claims(location, cutoff)
    return report


class _Checkpoint:
    """Writes each dropped partition's retention checkpoint(s), and counts what they vouch for."""

    def __init__(
        self, location: Location, key: SigningKey | None, older_keys: Sequence[SigningKey], cutoff: dt.date
    ) -> None:
        self.location, self.key = location, key
        self.keys = [key, *older_keys] if key is not None else []  # records signed before a key rotation pass too
        self.before_ns = midnight_ns(cutoff)
        self.written = self.links = self.unvouched = 0

    def before_dropping(self, partition: str, files: list[str]) -> None:
        """Record where ``partition`` (its live ``files``) cuts each chain; durable before the drop."""
        if self.key is None:
            return
        day = dt.date.fromisoformat(partition.removeprefix("date="))
        found = dropped_links(self.location, files, self.keys, day, self.before_ns)
        self.unvouched += found.failed + len(found.unreadable)
        if found.links:
            self.written += len(write_marks(self.location, partition, found.links, self.key, found.voided))
            self.links += len(found.links)


def _not_partitions(location: Location) -> list[str]:
    """Folders named like a partition that are not one, under every kind's directory (see :class:`RetentionReport`)."""
    return [kind.label(name) for kind in KINDS for name in not_partition_names(location, kind.directory)]


def _counted(report: RetentionReport, kind: FileKind, name: str, files: int, rows: int, size: int) -> None:
    """Count a dropped partition of ``kind`` in ``report``."""
    report.dropped.append(kind.label(name))
    report.files += files
    report.bytes += size
    if kind.derived:
        report.rows += rows
    else:
        report.log_rows += rows


def _drop_local(
    location: Location, cutoff: dt.date, lease_wait: float, grace_seconds: float, checkpoint: _Checkpoint
) -> RetentionReport:
    """:func:`drop_older_than` on a local dataset: each partition renamed out of its kind's folder, then deleted.

    ``grace_seconds`` applies on an object store only: here a partition leaves readers' view by one rename.
    """
    root = Path(location.root)
    report = RetentionReport(not_partitions=_not_partitions(location))
    for kind in KINDS:
        for partition in partition_dirs(root, kind.directory):
            if dt.date.fromisoformat(partition_date(partition)) >= cutoff:
                continue
            lease = PartitionLease(root, kind.lease_name(partition.name))
            if not lease.acquire(wait=lease_wait):
                report.busy.append(kind.label(partition.name))
                continue
            try:
                _, live = partition_live_files(partition)
                rows, size = sum(_rows(p) for p in live), sum(p.stat().st_size for p in live)
                if kind is SPANS:  # log records hold no hash chain
                    checkpoint.before_dropping(partition.name, [str(p) for p in live])
                trash = root / ".trash" / f"{kind.lease_name(partition.name)}-{uuid.uuid4().hex[:8]}"
                trash.parent.mkdir(exist_ok=True)
                os.rename(partition, trash)
                shutil.rmtree(trash, ignore_errors=True)
            finally:
                lease.release()
            _counted(report, kind, partition.name, len(live), rows, size)
    return report


def _drop_remote(
    location: Location, cutoff: dt.date, lease_wait: float, grace_seconds: float, checkpoint: _Checkpoint
) -> RetentionReport:
    """:func:`drop_older_than` on an object store: a tombstone manifest, then deletion after the grace period."""
    location.check()
    s3 = objects.client(location)
    report = RetentionReport(not_partitions=_not_partitions(location))
    for kind in KINDS:
        for name in partition_names(location, kind.directory):
            if dt.date.fromisoformat(name.removeprefix("date=")) >= cutoff:
                continue
            lease = ObjectLease(location, kind.lease_name(name))
            if not lease.acquire(wait=lease_wait):
                report.busy.append(kind.label(name))
                continue
            try:
                _drop_remote_partition(s3, location, kind, name, lease, grace_seconds, checkpoint, report)
            finally:
                lease.release()
    return report


_DROP = PerBackend(local=_drop_local, objects=_drop_remote)
"""Dropping a dataset's old partitions, one implementation per backend (same arguments, same report)."""


def _drop_remote_partition(
    s3: object,
    location: Location,
    kind: FileKind,
    name: str,
    lease: ObjectLease,
    grace_seconds: float,
    checkpoint: _Checkpoint,
    report: RetentionReport,
) -> None:
    """Drop one remote partition under its held ``lease``: a tombstone manifest, then deletion after the grace."""
    found, etag, names = read_partition(s3, location, name, kind)
    url = location.join(kind.directory, name)
    live = visible_names(names, found)
    now = time.time()
    if live:
        sizes = {info.path: int(info.size or 0) for info in location.files_under(url)}
        size = sum(sizes.get(location.fs_path(f"{url}/{n}"), 0) for n in live)
        rows = sum(_remote_rows(location, f"{url}/{n}") for n in live)
        _counted(report, kind, name, len(live), rows, size)
        superseded = dict(found.superseded) if found else {}
        superseded.update(dict.fromkeys(live, now))
        if found is not None and found.index:
            superseded[found.index] = now
            superseded[facts_of_index(found.index) or found.index] = now  # kept for the grace period too
        if kind is SPANS:  # log records hold no hash chain
            checkpoint.before_dropping(name, [f"{url}/{n}" for n in live])
        tombstone = Manifest((found.generation if found else 0) + 1, [], superseded, None, 0)
        tombstone.pending = dict(found.pending) if found else {}  # a dead run's outputs stay hidden
        lease.confirm()
        etag = swap_manifest(s3, location, name, tombstone, etag, kind=kind)  # readers stop seeing it here
        found, names = tombstone, [*names, MANIFEST_NAME]
    if found is None:
        return
    before = dict(found.superseded)
    # unnamed compaction outputs are deleted only behind a fence (see compact_s3.clean_partition)
    now = time.time()
    _, _, cleaned, etag = clean_partition(s3, location, name, lease, found, etag, names, grace_seconds, now, kind)
    remaining = [n for n in _names(location, url) if n != MANIFEST_NAME]
    if remaining or cleaned.superseded:
        if cleaned.superseded != before:
            swap_manifest(s3, location, name, cleaned, etag, kind=kind)  # forget what was deleted
        return
    if etag is not None:  # nothing left but the tombstone: the partition is gone
        objects.delete_if(s3, location, location.key(f"{url}/{MANIFEST_NAME}"), etag)


def _expire_claims(location: Location, cutoff: dt.date) -> int:
    """Delete the outcome and compensation claims last written before ``cutoff`` (midnight UTC); how many."""
    before_ns = midnight_ns(cutoff)
    expired = expire_outcome_claims(location, before_ns)  # the rows of a local claim store
    for directory in (OUTCOMES_DIR, COMPENSATIONS_DIR):
        for info in location.files_under(location.join(directory)):
            written = info.mtime_ns
            if not info.base_name.endswith(".json") or written is None or written >= before_ns:
                continue
            try:
                location.fs.delete_file(info.path)
            except FileNotFoundError:
                continue  # another retention run took it
            except (OSError, pa.ArrowException) as exc:
                raise location.error(f"cannot delete the expired claim {info.path}", exc) from exc
            expired += 1
    return expired


def _names(location: Location, url: str) -> list[str]:
    prefix = location.fs_path(url) + "/"
    return [info.path[len(prefix) :] for info in location.files_under(url)]


def _remote_rows(location: Location, path: str) -> int:
    try:
        return pq.read_metadata(location.fs_path(path), filesystem=location.fs).num_rows
    except (pa.ArrowException, OSError):
        return 0
