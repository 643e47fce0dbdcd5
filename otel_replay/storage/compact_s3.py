"""Compaction of a partition on an object store (``s3://``): the same steps as :mod:`compact`, no rename.

An object PUT is atomic, so output files are uploaded under their final
names: a reader ignores a compacted file no manifest names. The commit point
is the manifest, replaced with a conditional PUT (``If-Match`` the ETag read
at the start, or ``If-None-Match: *`` for a first compaction): if anything
else changed the manifest meanwhile the swap fails and this run's files stay
unnamed (deleted as leftovers by a later run), so two compactors can never
both swap one partition, even if a lease was misjudged. Before the swap the
lease is confirmed by a conditional write (:meth:`ObjectLease.confirm`).

Every manifest PUT carries a fresh random ``fence`` token, so no two writes
have the same bytes (an ETag is the MD5 of the bytes): any write makes every
ETag read before it stale. Two rules follow from that. A run that finds no
manifest creates an empty one before uploading anything, so no run ever
swaps with ``If-None-Match`` over outputs it uploaded (retention may delete a
manifest, which would let such a swap through). And an unnamed output is
deleted only after a conditional rewrite of the manifest (a *fence*): the
output may be a stalled holder's that passed its last ``confirm()`` and still
holds a current ETag; the fence makes its swap fail instead of naming
deleted objects.

Each partition's facts file (:mod:`facts`) is uploaded the same way, after
the side index and before the swap; a crash in between leaves an orphan that
no reader uses (its compacted files are unnamed) and the next run deletes.

Readers follow the same rule as on disk (:func:`manifest.live_files`): the
manifest is read before the listing, S3 being strongly consistent for GET,
PUT and LIST; superseded files stay for the grace period.

As on disk, the files of a write-ahead log segment still on this host's disk
are left out (:func:`_in_flight`): a recovery uploads them again under the same
names, and merged meanwhile they would be stored twice.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow as pa

from otel_replay.errors import DatasetError, OtelReplayError
from otel_replay.location import Location
from otel_replay.storage.log_files import in_flight

from . import objects
from .backend import ObjectBackend
from .compact_steps import (
    Options,
    PartitionReport,
    Seen,
    Workers,
    exact_duplicates,
    plan_batches,
    read_files,
    repeated_in,
    repeated_keys,
    schema_groups,
    sort_order,
    swapped_manifest,
    write_file,
)
from .facts import CurrentFacts, FactsExtractor, facts_name, facts_of_index, remote_facts_bytes
from .kinds import SPANS, FileKind
from .lease import ObjectLease
from .manifest import MANIFEST_NAME, Manifest, missing_error, output_token, read_remote_manifest, visible_names
from .side_index import file_index_rows, index_bytes, merge_index

__all__ = ["clean_partition", "compact_partition", "read_partition", "swap_manifest"]

_log = logging.getLogger("otel_replay")

REMOTE_READERS = 8
"""Objects fetched and read at once (each a GET: latency, not CPU); a batch holds at most this many beyond its rows."""


def read_partition(
    s3: object, location: Location, name: str, kind: FileKind = SPANS
) -> tuple[Manifest | None, str | None, list[str]]:
    """(manifest, its ETag, every object name directly in the partition): the manifest read first."""
    manifest, etag = read_remote_manifest(s3, location, name, kind.directory)
    url = location.join(kind.directory, name)
    prefix = location.fs_path(url) + "/"
    names = [info.path[len(prefix) :] for info in location.files_under(url)]
    return manifest, etag, [n for n in names if "/" not in n]


def _document(manifest: Manifest) -> bytes:
    """The manifest's JSON with a fresh ``fence`` token: no two writes have the same bytes, hence ETag."""
    doc = json.loads(manifest.to_json())
    doc["fence"] = uuid.uuid4().hex
    return json.dumps(doc, indent=1, sort_keys=True).encode()


PENDING_KEPT_SECONDS = 7 * 86400.0
"""How long a dead run's token stays pending on S3: objects a stalled holder uploads late stay hidden, then deleted."""

_SWAP_CONFLICT = "during this compaction; nothing was swapped (this run's files are left for the next run to delete)"


def swap_manifest(
    s3: object,
    location: Location,
    name: str,
    manifest: Manifest,
    etag: str | None,
    conflict: str = _SWAP_CONFLICT,
    kind: FileKind = SPANS,
) -> str:
    """Write ``manifest`` only if it is still as read (``etag``; absent when ``None``), with a fresh token; its ETag.

    Raises:
        DatasetError: another process changed the manifest first (``conflict`` says what was left undone).

    """
    key = location.key(location.join(kind.directory, name, MANIFEST_NAME))
    try:
        return objects.put_if(s3, location, key, _document(manifest), etag)
    except objects.Conflict:
        raise DatasetError(f"s3://{location.bucket}/{key} was changed by another process {conflict}") from None


def _fence(
    s3: object,
    location: Location,
    name: str,
    lease: ObjectLease,
    manifest: Manifest,
    etag: str | None,
    kind: FileKind = SPANS,
) -> str:
    """Rewrite the manifest as read (``etag``; create it when ``None``) with a new token; its new ETag.

    Every ETag read before is then stale, so no other run (a stalled holder
    whose lease was taken over) can swap any more.

    Raises:
        DatasetError: the lease was lost, or the manifest changed since it was read (nothing was written).

    """
    lease.confirm()
    conflict = "since this run read it; nothing was deleted or swapped"
    return swap_manifest(s3, location, name, manifest, etag, conflict, kind)


def clean_partition(
    s3: object,
    location: Location,
    name: str,
    lease: ObjectLease,
    manifest: Manifest,
    etag: str | None,
    names: list[str],
    grace_seconds: float,
    now: float,
    kind: FileKind = SPANS,
    present: Sequence[str] | None = None,
) -> tuple[int, int, Manifest, str | None]:
    """Delete expired superseded objects and unnamed compaction outputs; (superseded, leftovers, manifest, ETag).

    ``manifest`` and ``etag`` are as read before listing ``names``. Before an
    unnamed output is deleted the manifest is fenced (:func:`_fence`; the
    returned ETag is the fence's): the output may belong to a holder that
    stalled past its lease and could otherwise still swap a manifest naming
    it. Expired superseded objects are dropped from the returned manifest;
    the caller swaps it to forget them. Deletes go 1,000 keys a request
    (:func:`~.objects.delete_many`); only objects of the listing (``present``,
    else ``names``) count as deleted. An expired object S3 failed to delete
    twice stays superseded, named in a warning, for the next run; a leftover
    that cannot be deleted fails the run (its token must stay pending).
    """
    url = location.join(kind.directory, name)
    expired = [n for n, at in manifest.superseded.items() if now - at >= grace_seconds]
    keep = set(manifest.files) | set(manifest.superseded) | ({manifest.index} if manifest.index else set())
    keep.add(facts_of_index(manifest.index) or "")  # facts: the current generation's object stays
    # Only a pending (dead) run's outputs: a compacted object no manifest knows was restored or copied in, and is live.
    orphans = [n for n in names if output_token(n) in manifest.pending and n not in keep]
    if orphans:
        etag = _fence(s3, location, name, lease, manifest, etag, kind)
    # One DeleteObjects request per 1,000 keys; an expired object the listing does not hold is gone already.
    there = set(names if present is None else present)
    done, failed = objects.delete_many(s3, location, url, [n for n in expired if n in there])
    if failed:  # kept as superseded (out of readers' view): the next run deletes them
        _log.warning(
            "otel-replay: %s: %d superseded object(s) could not be deleted and are kept for the next run: %s",
            url,
            len(failed),
            ", ".join(f"{n} ({code})" for n, code in sorted(failed.items())[:20]),
        )
    left, stuck = objects.delete_many(s3, location, url, orphans)
    if stuck:  # their run's token must stay pending, or a later run would read them as live
        codes = ", ".join(f"{n} ({code})" for n, code in sorted(stuck.items())[:5])
        raise DatasetError(f"dataset {location.uri}: cannot delete {len(stuck)} leftover(s) under {url}: {codes}")
    deleted, leftovers = len(done), len(left)
    expired = [n for n in expired if n not in failed]
    if expired:
        gone = set(expired)  # a set: a partition of 20,000 arrivals made this a quadratic minute
        manifest.superseded = {k: v for k, v in manifest.superseded.items() if k not in gone}
    # A stalled holder of a dead run may still upload after this: its token stays pending (hidden) for a while.
    manifest.pending = {k: at for k, at in manifest.pending.items() if now - at < PENDING_KEPT_SECONDS}
    return deleted, leftovers, manifest, etag


def compact_partition(
    location: Location,
    name: str,
    lease: ObjectLease,
    report: PartitionReport,
    options: Options,
    *,
    step: Callable[[str], None],
    current: CurrentFacts | None = None,
    kind: FileKind = SPANS,
) -> None:
    """Compact partition ``name`` of a remote dataset under ``lease`` (held); see the module docstring.

    ``options.threads`` is not used: a remote partition is sorted and written on one thread; its objects are
    fetched and read :data:`REMOTE_READERS` at a time, one by one into the batch (memory does not grow per object).
    ``current``: the run's view of the other partitions' facts (found now when not given). ``kind``: spans, or
    log records (every row kept; no side index or facts, see :mod:`.kinds`).
    """
    current = current or CurrentFacts(location)
    s3 = objects.client(location)
    url = location.join(kind.directory, name)
    now = time.time()
    found, etag, names = read_partition(s3, location, name, kind)
    gone: list[str] = []
    if found is not None:
        gone = sorted(set(found.files) - set(names))
        problem = missing_error(f"{url}/{MANIFEST_NAME}", found, names)
        if problem is not None and not options.drop_missing:
            raise problem
    if gone:
        report.dropped_missing = gone
        _log.warning(
            "otel-replay: %s: dropping %d compacted file(s) its manifest lists but that are missing (%s): "
            "their %s are lost",
            url,
            len(gone),
            ", ".join(gone),
            kind.rows,
        )
    visible = visible_names(names, found)
    held = _in_flight(ObjectBackend(location).local_dir("wal"), visible)  # compacted once their segment is gone
    live = [f"{url}/{n}" for n in visible if n not in held]
    old_index = found.index if found else None
    report.superseded_deleted, report.leftovers_deleted, manifest, fenced = clean_partition(
        s3, location, name, lease, found or Manifest(), etag, names, options.grace_seconds, now, kind
    )
    if fenced != etag:  # the manifest exists now (the fence created it when there was none)
        found, etag = manifest, fenced
    if report.superseded_deleted and found is not None:
        lease.confirm()
        etag = swap_manifest(s3, location, name, manifest, etag, kind=kind)  # forget what is gone
    if not live:
        if gone:  # nothing left: the manifest must stop naming the missing files
            manifest.files, manifest.index, manifest.rows = [], None, 0
            lease.confirm()
            swap_manifest(s3, location, name, manifest, etag, kind=kind)
        report.status = "empty"
        return
    if manifest.files and set(manifest.files).issuperset(p.rpartition("/")[2] for p in live) and not gone:
        report.status = "current"
        return
    # Every file's schema is checked first: a partition holding a file this version refuses (a newer schema
    # version, a foreign file) is left exactly as it was, its manifest included.
    counts: dict[str, int] = {}
    inspecting = Workers(REMOTE_READERS)  # footers fetched side by side (each GET waits on the network)
    try:
        groups = schema_groups(live, location, rows=counts, workers=inspecting, problem=kind.schema_problem)
    finally:
        inspecting.close(cancel=True)
    generation = manifest.generation + 1
    token = uuid.uuid4().hex[:12]
    # Record the run before uploading (creating the manifest when there is none, see the module docstring):
    # readers hide its outputs until the swap, and only a recorded run's outputs are ever deleted as leftovers.
    manifest.pending[token] = now
    etag = _fence(s3, location, name, lease, manifest, etag, kind)
    sizes = {info.path: info.size for info in location.files_under(url)}
    report.input_files = len(live)
    report.bytes_before = sum(int(sizes.get(location.fs_path(p)) or 0) for p in live)
    written: list[tuple[str, int]] = []
    index_parts: list[tuple[str, list[str], dict[str, pa.Table]]] = []  # each file's side index rows (see compact.py)
    # decision/outcome facts per batch (storage/facts.py), spilled to a local temp directory between batches
    with tempfile.TemporaryDirectory(prefix="otel-replay-facts-") as spill_dir:
        facts: list[pa.Table | Path | None] = []
        counter = 0
        readers = Workers(REMOTE_READERS)
        extractor = FactsExtractor()  # one DuckDB connection for the facts of every batch, its views defined once
        try:
            for paths in groups:
                batches = plan_batches(paths, options.max_batch_rows, location, rows=counts)
                # as in compact._compact_partition
                repeated = repeated_keys(paths, location) if len(batches) > 1 and kind.derived else None
                seen = Seen()
                for batch in batches:
                    table = read_files(batch, location, readers)
                    step("read")
                    report.input_rows += table.num_rows
                    drop: list[int] = []
                    if kind.derived:
                        drop = exact_duplicates(table, repeated_in(table) if repeated is None else repeated, seen)
                        # the batch as read, as compact.py extracts it (the facts SQL deduplicates like the views)
                        facts.append(extractor.extract(table, Path(spill_dir) / f"{len(facts)}.pq"))
                    report.duplicates_removed += len(drop)
                    order = sort_order(table, drop, kind.sort_key)
                    for start in range(0, len(order), options.target_rows):
                        out = f"compact-g{generation}-{counter}-{token}.parquet"
                        counter += 1
                        piece = order.slice(start, options.target_rows)
                        where = f"{url}/{out}"
                        groups_of, bloom = options.row_group_rows, options.bloom
                        slim = write_file(table, piece, where, groups_of, bloom, location, kind.sort_key)
                        written.append((out, slim.num_rows))
                        if kind.derived:
                            index_parts.append((out, table.column_names, file_index_rows(slim)))
                        del slim
                        step("file")
                    del table
                report.conflicting_kept += seen.conflicting_kept()
        except BaseException:
            readers.close(cancel=True)
            extractor.close()
            if not written:  # nothing uploaded: the run's token is taken back (later runs' tokens pile up otherwise)
                _take_back(s3, location, name, lease, token, kind)
            raise
        readers.close()
        extractor.close()
        step("written")
        step("renamed")  # nothing to rename on an object store
        index_name: str | None = None
        data: bytes | None = None
        if kind.derived:
            index_name = f"_index-g{generation}-{token}.pq"
            _put(location, f"{url}/{index_name}", index_bytes(merge_index(index_parts)))
            # The facts object, under its final name before the swap: its generation and token tie it to the files
            # it covers, which no reader uses until the manifest names them (a crash here leaves an orphan, cleaned
            # later).
            listed = {info.path: int(info.size or 0) for info in location.files_under(url)}
            covered = [(n, listed.get(location.fs_path(f"{url}/{n}"), -1)) for n, _ in written]
            data = remote_facts_bytes(location, name, facts, covered, current.others(name))
    if data is not None:
        _put(location, f"{url}/{facts_name(generation, token)}", data)
    step("indexed")
    replaced = [path.rpartition("/")[2] for path in live]
    new = swapped_manifest(manifest, generation, replaced, old_index, written, index_name, token, now)
    lease.confirm()  # a holder that stalled past its expiry must not swap
    etag = swap_manifest(s3, location, name, new, etag, kind=kind)
    step("swapped")
    if kind.derived:
        current.made_current(name, facts_name(generation, token) if data is not None else None)
    report.status = "compacted"
    report.output_files = len(written)
    report.output_rows = new.rows
    after = {info.path: info.size for info in location.files_under(url)}
    report.bytes_after = sum(int(after.get(location.fs_path(f"{url}/{n}")) or 0) for n, _ in written)
    if options.grace_seconds <= 0:
        grace = options.grace_seconds
        now = time.time()
        there = [path.rpartition("/")[2] for path in after]  # what is there to delete, from the listing above
        deleted, _, cleaned, _ = clean_partition(s3, location, name, lease, new, etag, [], grace, now, kind, there)
        report.superseded_deleted += deleted
        swap_manifest(s3, location, name, cleaned, etag, kind=kind)
        step("deleted")


def _take_back(
    s3: object, location: Location, name: str, lease: ObjectLease, token: str, kind: FileKind = SPANS
) -> None:
    """Best effort: remove this run's pending ``token`` from the manifest (it uploaded nothing); logged if it fails.

    A token left behind is harmless (it expires after the pending period), only clutter every reader fetches.
    """
    try:
        manifest, etag, _ = read_partition(s3, location, name, kind)
        if manifest is None or token not in manifest.pending:
            return
        del manifest.pending[token]
        lease.confirm()
        swap_manifest(s3, location, name, manifest, etag, kind=kind)
    except (OtelReplayError, OSError) as exc:
        _log.warning("otel-replay: %s: could not take back the failed run's token %s: %s", name, token, exc)


def _put(location: Location, path: str, data: bytes) -> None:
    try:
        ObjectBackend(location).write_atomic(path, data)
    except (OSError, pa.ArrowException) as exc:
        raise location.error(f"cannot write {path}", exc) from exc


def _in_flight(root: Path, names: Sequence[str]) -> set[str]:
    """The ``names`` converted from write-ahead log segments under ``root`` that are still on disk.

    An ``s3://`` dataset's logs stay on the local disk (``root``: the
    backend's ``local_dir("wal")``: the capture logs of this host's
    processes) while their Parquet files are uploaded. A segment is deleted
    only after its files are written: one still there (its process died in
    between, or is converting it now) is converted again under the same
    names by a recovery or its live owner; merged into a compacted object
    and deleted meanwhile, such a file would be uploaded again beside it and
    its rows stored twice. So compaction leaves it out until the segment is
    gone (as :func:`otel_replay.storage.outcome_log.held_files` does on
    disk). A quarantined segment not yet salvaged (no report) counts too.
    Race-free with the listing ``names`` came from, taken first. Logs on
    another host's disk are not seen.
    """
    return in_flight(root, names)
