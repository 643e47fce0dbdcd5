"""Compaction of a partition on an object store (``s3://``): the same steps as :mod:`compact`, no rename.

An object PUT is atomic, so output files are uploaded under their final
names: a reader ignores a compacted file no manifest names. The commit point
is the manifest, replaced with a conditional PUT (``If-Match`` the ETag read
at the start, or ``If-None-Match: *`` for a first compaction): if anything
else changed the manifest meanwhile the swap fails and this run's files stay
unnamed (deleted as leftovers by a later run), so two compactors can never
both swap one partition, even if a lease was misjudged. Before the swap the
lease is confirmed by a conditional write (:meth:`ObjectLease.confirm`).

Readers follow the same rule as on disk (:func:`manifest.live_files`): the
manifest is read before the listing, S3 being strongly consistent for GET,
PUT and LIST; superseded files stay for the grace period.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pyarrow as pa

from otel_replay.errors import DatasetError
from otel_replay.exporters.schema import SPANS_DIR
from otel_replay.location import Location

from . import objects
from .compact import (
    PartitionReport,
    _batches,
    _exact_duplicates,
    _order,
    _read,
    _repeated_in,
    _repeated_keys,
    _schema_groups,
    _write_file,
)
from .lease import ObjectLease
from .manifest import MANIFEST_NAME, Manifest, is_compacted_name, missing_error, parse_manifest, visible_names
from .side_index import build_index, index_bytes

__all__ = ["compact_partition", "read_partition"]


def read_partition(s3: object, location: Location, name: str) -> tuple[Manifest | None, str | None, list[str]]:
    """(manifest, its ETag, every object name directly in the partition): the manifest read first."""
    key = location.key(location.join(SPANS_DIR, name, MANIFEST_NAME))
    stored = objects.get(s3, location, key)
    manifest = None if stored is None else parse_manifest(stored.body, f"s3://{location.bucket}/{key}")
    url = location.join(SPANS_DIR, name)
    prefix = location.fs_path(url) + "/"
    names = [info.path[len(prefix) :] for info in location.files_under(url)]
    return manifest, None if stored is None else stored.etag, [n for n in names if "/" not in n]


def _swap(s3: object, location: Location, name: str, manifest: Manifest, etag: str | None) -> str:
    key = location.key(location.join(SPANS_DIR, name, MANIFEST_NAME))
    try:
        return objects.put_if(s3, location, key, manifest.to_json().encode(), etag)
    except objects.Conflict:
        raise DatasetError(
            f"s3://{location.bucket}/{key} was changed by another process during this compaction; "
            "nothing was swapped (this run's files are left for the next run to delete)"
        ) from None


def _clean(
    location: Location, name: str, manifest: Manifest, names: list[str], grace_seconds: float, now: float
) -> tuple[int, int, Manifest]:
    """Delete expired superseded objects and unnamed compaction outputs; (superseded, leftovers, manifest)."""
    s3 = objects.client(location)
    url = location.join(SPANS_DIR, name)
    expired = [n for n, at in manifest.superseded.items() if now - at >= grace_seconds]
    deleted = sum(objects.delete(s3, location, f"{url}/{n}") for n in expired)
    keep = set(manifest.files) | set(manifest.superseded) | ({manifest.index} if manifest.index else set())
    leftovers = 0
    for n in names:
        orphan = is_compacted_name(n) or (n.startswith("_index-") and n.endswith(".pq"))
        if orphan and n not in keep:
            leftovers += objects.delete(s3, location, f"{url}/{n}")
    if expired:
        manifest.superseded = {k: v for k, v in manifest.superseded.items() if k not in expired}
    return deleted, leftovers, manifest


def compact_partition(
    location: Location,
    name: str,
    lease: ObjectLease,
    report: PartitionReport,
    *,
    target_rows: int,
    row_group_rows: int,
    max_batch_rows: int,
    bloom: bool,
    grace_seconds: float,
    step: Callable[[str], None],
) -> None:
    """Compact partition ``name`` of a remote dataset under ``lease`` (held); see the module docstring."""
    s3 = objects.client(location)
    url = location.join(SPANS_DIR, name)
    now = time.time()
    found, etag, names = read_partition(s3, location, name)
    if found is not None:
        problem = missing_error(f"{url}/{MANIFEST_NAME}", found, names)
        if problem is not None:
            raise problem
    live = [f"{url}/{n}" for n in visible_names(names, found)]
    old_index = found.index if found else None
    report.superseded_deleted, report.leftovers_deleted, manifest = _clean(
        location, name, found or Manifest(), names, grace_seconds, now
    )
    if report.superseded_deleted and found is not None:
        lease.confirm()
        etag = _swap(s3, location, name, manifest, etag)  # forget what is gone
    if not live:
        report.status = "empty"
        return
    if manifest.files and all(p.rpartition("/")[2] in manifest.files for p in live):
        report.status = "current"
        return
    sizes = {info.path: info.size for info in location.files_under(url)}
    report.input_files = len(live)
    report.bytes_before = sum(int(sizes.get(location.fs_path(p)) or 0) for p in live)
    generation = manifest.generation + 1
    token = uuid.uuid4().hex[:12]
    written: list[tuple[str, pa.Table]] = []
    counter = 0
    for paths in _schema_groups(live, location):
        batches = _batches(paths, max_batch_rows, location)
        repeated = _repeated_keys(paths, location) if len(batches) > 1 else None  # see compact._compact_partition
        seen: dict[tuple[str, str], set[str]] = {}
        for batch in batches:
            table = _read(batch, location)
            step("read")
            report.input_rows += table.num_rows
            drop = _exact_duplicates(table, _repeated_in(table) if repeated is None else repeated, seen)
            report.duplicates_removed += len(drop)
            order = _order(table, drop)
            for start in range(0, len(order), target_rows):
                out = f"compact-g{generation}-{counter}-{token}.parquet"
                counter += 1
                piece = order.slice(start, target_rows)
                slim = _write_file(table, piece, f"{url}/{out}", row_group_rows, bloom, location)
                written.append((out, slim))
                step("file")
            del table
        report.conflicting_kept += sum(len(c) for c in seen.values() if len(c) > 1)
    step("written")
    step("renamed")  # nothing to rename on an object store
    index_name = f"_index-g{generation}-{token}.pq"
    _put(location, f"{url}/{index_name}", index_bytes(build_index(written)))
    step("indexed")
    superseded = dict(manifest.superseded)
    for path in live:
        superseded[path.rpartition("/")[2]] = now
    if old_index:
        superseded[old_index] = now
    new = Manifest(
        generation=generation,
        files=[n for n, _ in written],
        superseded=superseded,
        index=index_name,
        rows=sum(t.num_rows for _, t in written),
    )
    lease.confirm()  # a holder that stalled past its expiry must not swap
    etag = _swap(s3, location, name, new, etag)
    step("swapped")
    report.status = "compacted"
    report.output_files = len(written)
    report.output_rows = new.rows
    after = {info.path: info.size for info in location.files_under(url)}
    report.bytes_after = sum(int(after.get(location.fs_path(f"{url}/{n}")) or 0) for n, _ in written)
    if grace_seconds <= 0:
        deleted, _, cleaned = _clean(location, name, new, [], grace_seconds, time.time())
        report.superseded_deleted += deleted
        _swap(s3, location, name, cleaned, etag)
        step("deleted")


def _put(location: Location, path: str, data: bytes) -> None:
    try:
        with location.fs.open_output_stream(location.fs_path(path)) as out:
            out.write(data)
    except (OSError, pa.ArrowException) as exc:
        raise location.error(f"cannot write {path}", exc) from exc
