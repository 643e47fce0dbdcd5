"""Compaction: rewrite a partition's small arrival-order files into large sorted files.

Per partition, under its lease (:mod:`lease`):

1. clean up: delete files superseded longer ago than the grace period, and
   leftovers of a compaction that crashed (the outputs carrying the token of a
   run the manifest records as ``pending``, temp files). A compacted file no
   manifest knows (restored, copied in) is never deleted: it is live, read
   like an arrival and compacted in;
2. group the live files (:func:`manifest.partition_live_files`) by schema
   (files of different storage schema versions are never merged) and find the
   (trace_id, span_id) pairs stored more than once (DuckDB reads only those
   two columns);
3. read each group in batches of at most ``max_batch_rows`` rows, file by
   file (each footer was parsed once in step 2; see :func:`.compact_steps.read_files`), so memory
   is bounded by the batch, not the partition nor its number of files, and
   remove exact duplicate rows (same trace id, span id and identical
   content, as an OTLP client retry stores them), across batches too,
   counting them; rows sharing ids with different content are kept, they
   are evidence for the trust checks;
4. sort each batch by (correlation_id, trace_id, start_time, span_id) (one
   sorted run per batch; the side index finds an id's runs) and write files of
   at most ``target_rows`` rows: zstd, dictionary encoding on low-cardinality
   columns, row groups of ``row_group_rows`` for point lookups, Parquet bloom
   filters on the id columns, sorting columns recorded in the footer. Each file
   is written under a dot temp name, fsynced, renamed to ``compact-g<gen>-…``
   (the run's token is recorded in the manifest's ``pending`` before any
   output is written, so readers hide them until the swap);
5. write the side index (:mod:`side_index`) the same way;
6. the swap: replace ``_manifest.json`` atomically. Its ``files`` are the new
   files, and everything read in step 2 is ``superseded`` (kept on disk, out
   of readers' view, until a later run after the grace period); the
   partition's key log (:mod:`~otel_replay.exporters.key_log`) then drops
   their lines.

Log record partitions (``logs/date=…``) go through the same steps under
their own lease (:mod:`.kinds`), sorted by time, with no duplicate removal,
side index or facts file: a log record has no id of its own.

A crash at any point leaves either the old manifest (the new files are
ignored leftovers) or the new one (complete): readers see one or the other.

Steps 3 to 5 run partly on ``threads`` worker threads (pyarrow and DuckDB
release the GIL): a batch's columns are made contiguous, its facts extracted
while it is sorted, its files written side by side, each file's side index
rows grouped as it is written, and the index merged beside the facts file.
Results are taken in submission order, so the output does not depend on the
number of threads; an error on a worker is raised once every worker has
stopped, after the run's own files are deleted.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from pathlib import Path

import pyarrow as pa

from otel_replay.errors import DatasetError
from otel_replay.exporters.key_log import rewrite_without
from otel_replay.exporters.writer import TEMP_NAME, fsync_dir
from otel_replay.location import Location, PerBackend, resolve

from .compact_s3 import compact_partition
from .compact_steps import (
    DEFAULT_GRACE_SECONDS,
    DEFAULT_THREADS,
    CompactReport,
    Options,
    PartitionReport,
    Seen,
    Workers,
    exact_duplicates,
    peak_rss,
    plan_batches,
    read_files,
    repeated_in,
    repeated_keys,
    schema_groups,
    sort_order,
    swapped_manifest,
    write_file,
)
from .facts import CurrentFacts, FactsExtractor, facts_name, facts_of_index, write_facts
from .kinds import KINDS, SPANS, FileKind
from .lease import ObjectLease, PartitionLease
from .manifest import (
    MANIFEST_NAME,
    Manifest,
    is_compacted_name,
    output_token,
    partition_date,
    partition_dirs,
    partition_live_names,
    partition_names,
    read_manifest,
    write_manifest,
)
from .outcome_log import held_files
from .side_index import file_index_rows, merge_index, write_index

__all__ = ["compact"]

_log = logging.getLogger("otel_replay")

STALE_TEMP_SECONDS = 3600.0
"""A writer's temp file (``.<name>.<pid>-<hex>.tmp``) this old (or older than the grace period) is a leftover."""


def _older_than(path: Path, seconds: float, now: float) -> bool:
    try:
        return now - path.stat().st_mtime >= seconds
    except FileNotFoundError:
        return False


def _clean(partition: Path, manifest: Manifest | None, grace_seconds: float, now: float) -> tuple[int, int, Manifest]:
    """Delete expired superseded files and crash leftovers; (superseded deleted, leftovers deleted, manifest).

    A leftover is an output (compacted file, side index, facts file) carrying
    the token of a run the manifest records as pending: that run crashed (the
    lease is held, so it is not running). Its token is then forgotten. A
    writer's temp file older than the grace period and
    :data:`STALE_TEMP_SECONDS` (a failed write's) is a leftover too. A
    compacted file no manifest knows is never deleted here: it was restored or
    copied in, and is read and compacted like an arrival.
    """
    manifest = manifest or Manifest()
    expired = [name for name, at in manifest.superseded.items() if now - at >= grace_seconds]
    deleted = 0
    for name in expired:
        try:
            os.unlink(partition / name)
            deleted += 1
        except FileNotFoundError:
            pass
    keep = set(manifest.files) | set(manifest.superseded) | ({manifest.index} if manifest.index else set())
    keep.add(facts_of_index(manifest.index) or "")  # facts: the current generation's file stays
    leftovers = 0
    for name in os.listdir(partition):
        orphan_output = output_token(name) in manifest.pending and name not in keep
        temp = (".compact-", "._index-", "._facts-", f".{MANIFEST_NAME}.")
        orphan_tmp = name.startswith(temp) and name.endswith(".tmp")
        if not (orphan_output or orphan_tmp) and TEMP_NAME.fullmatch(name):
            # A writer's temp file (exporter, receiver, ingest): one may be in flight now, so only a stale one,
            # left by a failed write or a crash, is removed.
            orphan_tmp = _older_than(partition / name, max(grace_seconds, STALE_TEMP_SECONDS), now)
        if orphan_output or orphan_tmp:
            try:
                os.unlink(partition / name)
                leftovers += 1
            except FileNotFoundError:
                pass
    if expired:
        gone = set(expired)  # a set: a partition of 20,000 arrivals made this a quadratic minute
        manifest.superseded = {k: v for k, v in manifest.superseded.items() if k not in gone}
        rewrite_without(partition, gone)  # key log lines a crash after the swap left behind
    manifest.pending = {}  # every pending run's outputs are gone now
    return deleted, leftovers, manifest


def _write_indexed(
    table: pa.Table,
    order: pa.Array,
    tmp: Path,
    row_group_rows: int,
    bloom: bool,
    step: Callable[[str], None],
    kind: FileKind = SPANS,
) -> tuple[int, dict[str, pa.Table]]:
    """Write one compacted file (a worker's task): (rows written, its side index rows per kind; none for logs)."""
    step("writing")
    slim = write_file(table, order, tmp, row_group_rows, bloom, sort_key=kind.sort_key)
    return slim.num_rows, file_index_rows(slim) if kind.derived else {}


def _index_and_facts(
    partition: Path,
    workers: Workers,
    written: list[tuple[str, int]],
    index_parts: list[tuple[str, list[str], dict[str, pa.Table]]],
    facts: list[pa.Table | Path | None],
    generation: int,
    token: str,
    current: CurrentFacts,
) -> tuple[str, bool]:
    """Write the side index and the facts file of the renamed ``written`` files, side by side.

    Returns the index's name and whether a facts file was written.
    """
    index_name = f"_index-g{generation}-{token}.pq"

    def index() -> None:
        index_tmp = partition / f".{index_name}.tmp"
        write_index(merge_index(index_parts, workers.map), index_tmp)
        os.replace(index_tmp, partition / index_name)

    names = [name for name, _ in written]
    others = current.others(partition.name)  # here, not in the worker: the first call lists the dataset
    facts_written = workers.submit(write_facts, partition, facts_name(generation, token), facts, names, others)
    index()  # here: its per-kind sorts go to the workers beside the facts
    return index_name, facts_written.result()


def _discard_outputs(partition: Path, token: str) -> None:
    """Delete what a failed compaction wrote (its files carry ``token``; no manifest names them)."""
    for name in os.listdir(partition):
        if token in name and (name.endswith(".tmp") or is_compacted_name(name) or name.endswith(".pq")):
            try:
                os.unlink(partition / name)
            except FileNotFoundError:
                pass


def _forget_run(partition: Path, token: str) -> None:
    """Take a failed run's token out of the manifest once its outputs are deleted.

    The manifest is rewritten, never removed, even when this run created it:
    a reader that read "no manifest" before the run and lists its outputs
    must find the manifest changed and list again, rather than take the
    outputs (deleted by now) for copied-in files. Best effort: a token left
    pending only makes the next run look for its outputs.
    """
    try:
        current = read_manifest(partition)
        if current is None or token not in current.pending:
            return
        current.pending.pop(token)
        write_manifest(partition, current)
    except (OSError, DatasetError):
        pass


def _compact_partition(
    partition: Path,
    report: PartitionReport,
    options: Options,
    *,
    step: Callable[[str], None],
    current: CurrentFacts,
    kind: FileKind = SPANS,
) -> None:
    now = time.time()
    gone: list[str] | None = [] if options.drop_missing else None
    found, names = partition_live_names(partition, missing=gone)
    held = held_files(partition.parent.parent, names)  # a later run compacts them, once the store forgets them
    live = [partition / name for name in names if name not in held]
    old_index = found.index if found else None
    grace = options.grace_seconds
    before = found.copy() if found else None
    report.superseded_deleted, report.leftovers_deleted, manifest = _clean(partition, before, grace, now)
    if found is not None and (report.superseded_deleted or found.pending):
        write_manifest(partition, manifest)  # forget what is gone
    if gone:
        report.dropped_missing = [Path(path).name for path in gone]
        _log.warning(
            "otel-replay: %s: dropping %d compacted file(s) its manifest lists but that are missing (%s): "
            "their %s are lost",
            partition,
            len(gone),
            ", ".join(report.dropped_missing),
            kind.rows,
        )
    if not live:
        if gone:  # nothing left: the manifest must stop naming the missing files
            manifest.files, manifest.index, manifest.rows = [], None, 0
            write_manifest(partition, manifest)
        report.status = "empty"
        return
    if manifest.files and set(manifest.files).issuperset(p.name for p in live) and not gone:
        report.status = "current"
        return
    report.input_files = len(live)
    report.bytes_before = sum(p.stat().st_size for p in live)
    counts: dict[Path, int] = {}
    # on this thread: parsing a footer holds the GIL most of the time
    groups = schema_groups(live, rows=counts, problem=kind.schema_problem)
    generation = manifest.generation + 1
    token = uuid.uuid4().hex[:12]
    # Recorded before any output is written: a crash leaves files only a pending run's token marks as leftovers.
    manifest.pending[token] = now
    write_manifest(partition, manifest)
    workers = Workers(options.threads)
    extractor = FactsExtractor()  # one DuckDB connection for the facts of every batch, its views defined once
    swapping = False
    try:
        written, index_parts, facts = _write_groups(
            partition,
            groups,
            report,
            workers,
            options,
            extractor=extractor,
            counts=counts,
            generation=generation,
            token=token,
            step=step,
            kind=kind,
        )
        step("written")
        for name, _ in written:
            os.replace(partition / f".{name}.tmp", partition / name)
        fsync_dir(partition)
        step("renamed")
        index_name: str | None = None
        has_facts = False
        if kind.derived:
            index_name, has_facts = _index_and_facts(
                partition, workers, written, index_parts, facts, generation, token, current
            )
        step("indexed")
        swapping = True  # from here the new files may be live: never discarded
        replaced = [path.name for path in live]
        new = swapped_manifest(manifest, generation, replaced, old_index, written, index_name, token, now)
        write_manifest(partition, new)
    except BaseException:
        workers.close(cancel=True)  # no worker may still be writing once the error is raised
        if not swapping:
            _discard_outputs(partition, token)
            _forget_run(partition, token)
        raise
    finally:
        workers.close()
        extractor.close()
    step("swapped")
    if kind.derived:
        current.made_current(partition.name, facts_name(generation, token) if has_facts else None)
        rewrite_without(partition, replaced)  # the key log's lines of the replaced files are of no use now
    report.status = "compacted"
    report.output_files = len(written)
    report.output_rows = sum(rows for _, rows in written)
    report.bytes_after = sum((partition / name).stat().st_size for name, _ in written)
    if options.grace_seconds <= 0:
        deleted, _, cleaned = _clean(partition, read_manifest(partition), options.grace_seconds, time.time())
        report.superseded_deleted += deleted
        write_manifest(partition, cleaned)
        step("deleted")


def _write_groups(
    partition: Path,
    groups: list[list[Path]],
    report: PartitionReport,
    workers: Workers,
    options: Options,
    *,
    extractor: FactsExtractor,
    counts: Mapping[Path, int],
    generation: int,
    token: str,
    step: Callable[[str], None],
    kind: FileKind = SPANS,
) -> tuple[list[tuple[str, int]], list[tuple[str, list[str], dict[str, pa.Table]]], list[pa.Table | Path | None]]:
    """Write every schema group's rows as sorted temp files: (name and rows of each), their index rows, the facts.

    Per batch, the facts are extracted while the batch is deduplicated and
    sorted (through ``extractor``), and its files are written side by side; the batch is released
    only once they are all done, so memory stays bounded by one batch. A kind
    that derives nothing (log records) keeps every row: no duplicates, index rows or facts.
    """
    written: list[tuple[str, int]] = []
    index_parts: list[tuple[str, list[str], dict[str, pa.Table]]] = []
    facts: list[pa.Table | Path | None] = []  # decision/outcome facts per batch, spilled (storage/facts.py)
    counter = 0
    for g, paths in enumerate(groups):
        batches = plan_batches(paths, options.max_batch_rows, rows=counts)
        # One batch: the repeated ids come from the rows in memory; several: one DuckDB pass over every file.
        several = len(batches) > 1 and kind.derived
        scan = workers.submit(repeated_keys, paths) if several else None  # beside the first read
        repeated: pa.Table | None = None
        seen = Seen()
        for b, batch in enumerate(batches):
            table = read_files(batch, workers=workers, rows=counts)
            if scan is not None and repeated is None:
                repeated = scan.result()
            step("read")
            report.input_rows += table.num_rows
            # The last batch's facts stay in memory (its rows are released before write_facts reads them);
            # earlier ones are spilled, so memory stays bounded by one batch.
            last = g == len(groups) - 1 and b == len(batches) - 1
            spill = None if last else partition / f"._facts-{token}-{len(facts)}.tmp"
            extracted = workers.submit(extractor.extract, table, spill) if kind.derived else None
            drop: list[int] = []
            if kind.derived:
                drop = exact_duplicates(table, repeated_in(table) if repeated is None else repeated, seen)
            report.duplicates_removed += len(drop)
            order = sort_order(table, drop, kind.sort_key)
            files: list[tuple[str, Future[tuple[int, dict[str, pa.Table]]]]] = []
            for start in range(0, len(order), options.target_rows):
                name = f"compact-g{generation}-{counter}-{token}.parquet"
                counter += 1
                tmp = partition / f".{name}.tmp"
                piece = order.slice(start, options.target_rows)
                row_groups, bloom = options.row_group_rows, options.bloom
                task = workers.submit(_write_indexed, table, piece, tmp, row_groups, bloom, step, kind)
                files.append((name, task))
            for name, future in files:
                rows, index_rows = future.result()
                written.append((name, rows))
                index_parts.append((name, table.column_names, index_rows))
                step("file")
            if extracted is not None:
                facts.append(extracted.result())
            del table, order, files
        report.conflicting_kept += seen.conflicting_kept()
    return written, index_parts, facts


def _selected(dataset: Path, partitions: Iterable[str] | None) -> list[tuple[FileKind, Path]]:
    """The partitions to compact, each with its kind: every one, or those of the dates asked for (of any kind)."""
    every = [(kind, path) for kind in KINDS for path in partition_dirs(dataset, kind.directory)]
    if partitions is None:
        return every
    wanted: list[tuple[FileKind, Path]] = []
    for item in partitions:
        date = item.removeprefix("date=")
        found = [(kind, path) for kind, path in every if partition_date(path) == date]
        if not found:
            raise DatasetError(f"no partition date={date} in {dataset}")
        wanted.extend(found)
    return wanted


def compact(
    dataset: str | os.PathLike[str],
    *,
    partitions: Iterable[str] | None = None,
    target_rows: int = 131_072,
    row_group_rows: int = 16_384,
    max_batch_rows: int = 1_000_000,
    bloom_filters: bool = True,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    lease_wait: float = 0.0,
    threads: int = DEFAULT_THREADS,
    drop_missing: bool = False,
    progress: Callable[[str], None] | None = None,
    _on_step: Callable[[str], None] | None = None,
) -> CompactReport:
    """Compact ``dataset``'s partitions (all, or ``partitions``: ``YYYY-MM-DD`` or ``date=…``).

    See the module docstring for what one partition goes through. The log
    record partitions (``logs/date=…``) of the same dates are compacted too,
    reported as ``logs/date=…``: the same steps under their own lease, every
    row kept (see :mod:`.kinds`). A partition
    whose lease another compactor holds is skipped and reported ``busy``.
    ``max_batch_rows`` bounds the rows held in memory at once (about 1.6 KB of
    RSS per row); a bigger partition is written as several sorted runs.
    ``grace_seconds`` is how long replaced files stay on disk for readers that
    listed them before the swap (deleted by a later run; ``0`` deletes them
    at once, only safe with no concurrent reader). ``threads`` worker threads
    write a batch's files, group their index rows and extract its facts side
    by side (``1``: all in the calling thread); the output is the same for any
    number, and memory grows only by the row group each writer holds.
    ``drop_missing``: a compacted file the manifest lists but that is gone
    (moved aside because it was damaged) is dropped from the manifest, named
    in a warning and in :attr:`CompactReport.dropped_missing`, instead of
    failing: its spans are lost, the rest of the partition is compacted again.
    ``progress`` gets one line per partition.

    Raises:
        ConfigError: a size or time argument is out of range.
        DatasetError: the dataset, a partition or a manifest cannot be used.
        CorruptFileError: a live file cannot be read (nothing is changed in its partition).

    """
    options = Options(target_rows, row_group_rows, max_batch_rows, bloom_filters, grace_seconds, threads, drop_missing)
    location = resolve(dataset)
    step = _on_step or (lambda _name: None)
    return _COMPACTION.of(location)(location, partitions, options, lease_wait=lease_wait, progress=progress, step=step)


def _compact_local(
    location: Location,
    partitions: Iterable[str] | None,
    options: Options,
    *,
    lease_wait: float,
    progress: Callable[[str], None] | None,
    step: Callable[[str], None],
) -> CompactReport:
    """:func:`compact` on a local directory."""
    root = Path(location.root)
    if not root.is_dir():
        raise DatasetError(f"dataset {root} does not exist or is not a directory")
    started = time.perf_counter()
    report = CompactReport()
    current = CurrentFacts(root)  # the other partitions' facts, found once for the run
    for kind, partition in _selected(root, partitions):
        part = PartitionReport(kind.label(partition.name), "busy", rows=kind.rows)
        lease = PartitionLease(root, kind.lease_name(partition.name))
        t0 = time.perf_counter()
        if lease.acquire(wait=lease_wait):
            try:
                if partition.is_dir():  # retention may have dropped it since the partitions were listed
                    _compact_partition(partition, part, options, step=step, current=current, kind=kind)
                else:
                    part.status = "empty"
            finally:
                lease.release()
        part.seconds = time.perf_counter() - t0
        report.partitions.append(part)
        _say(progress, part)
    report.seconds = time.perf_counter() - started
    report.peak_rss_bytes = peak_rss()
    return report


def _say(progress: Callable[[str], None] | None, part: PartitionReport) -> None:
    if progress is None:
        return
    progress(
        f"{part.partition}: {part.status}"
        + (
            f", {part.input_rows} {part.rows} in {part.input_files} files -> {part.output_rows} in "
            f"{part.output_files} files, {part.duplicates_removed} exact duplicates removed, "
            f"{part.conflicting_kept} same-id rows with different content kept ({part.seconds:.2f} s)"
            if part.status == "compacted"
            else ""
        )
    )


def _compact_remote(
    location: Location,
    partitions: Iterable[str] | None,
    options: Options,
    *,
    lease_wait: float,
    progress: Callable[[str], None] | None,
    step: Callable[[str], None],
) -> CompactReport:
    """:func:`compact` on an object store (see :mod:`compact_s3`)."""
    location.check()
    started = time.perf_counter()
    every = [(kind, name) for kind in KINDS for name in partition_names(location, kind.directory)]
    if partitions is None:
        selected = every
    else:
        selected = []
        for item in partitions:
            name = f"date={item.removeprefix('date=')}"
            found = [(kind, n) for kind, n in every if n == name]
            if not found:
                raise DatasetError(f"no partition {name} in {location.uri}")
            selected.extend(found)
    report = CompactReport()
    current = CurrentFacts(location)  # the other partitions' facts, found once for the run
    for kind, name in selected:
        part = PartitionReport(kind.label(name), "busy", rows=kind.rows)
        lease = ObjectLease(location, kind.lease_name(name))
        t0 = time.perf_counter()
        if lease.acquire(wait=lease_wait):
            try:
                compact_partition(location, name, lease, part, options, step=step, current=current, kind=kind)
            finally:
                lease.release()
        part.seconds = time.perf_counter() - t0
        report.partitions.append(part)
        _say(progress, part)
    report.seconds = time.perf_counter() - started
    report.peak_rss_bytes = peak_rss()
    return report


_COMPACTION = PerBackend(local=_compact_local, objects=_compact_remote)
"""Compaction of a whole dataset, one implementation per backend (same arguments, same report)."""
