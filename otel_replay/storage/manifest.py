"""Per-partition manifest: which Parquet files of a partition are live.

A partition directory (``<dataset>/spans/date=YYYY-MM-DD/``) holds the
arrival-order files writers drop in, and, once compacted, the sorted files
compaction wrote. ``_manifest.json`` (replaced atomically by rename, so a
reader sees the old or the new one) says:

- ``files``: the compacted files that are live (named ``compact-g<gen>-…``),
- ``superseded``: files that compaction has replaced and that are kept on
  disk for a grace period so a reader that listed them still finds them,
  with the time they were superseded,
- ``index``: the side index file (see :mod:`side_index`) covering ``files``,
- ``pending``: the tokens of compaction runs that started (recorded before they
  write anything) and have not swapped: their outputs (``…-<token>.parquet``)
  are not live yet, or are leftovers of a crash.

The reader rule (:func:`live_files`), which is the only thing a reader needs:
read the manifest *first*, then list the directory; a visible ``*.parquet``
file is live unless it is superseded, or is a compacted file of a pending run
the manifest does not list. Reading in that order makes the swap atomic: a
manifest read before the swap names the old files (still on disk during the
grace period), one read after it names the new files (written before the
swap), and arrivals are always included. A compacted file the manifest knows
nothing of was restored or copied in: it is live like an arrival (with a
warning), once the manifest is read again after the listing and is unchanged
(every manifest write carries a fresh ``fence``), so a run that recorded its
token after the first read is never mistaken for one.
"""

from __future__ import annotations

import json
import logging
import os
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date
from functools import lru_cache
from pathlib import Path

from otel_replay._json import strict_loads
from otel_replay.errors import DatasetError, PayloadError
from otel_replay.exporters.schema import SPANS_DIR
from otel_replay.exporters.writer import write_bytes_atomic
from otel_replay.location import Location, resolve
from otel_replay.storage import objects

from .backend import backend_for

__all__ = [
    "MANIFEST_NAME",
    "Manifest",
    "is_compacted_name",
    "is_partition_name",
    "looks_like_partition",
    "not_partition_names",
    "output_token",
    "unnamed_compacted",
    "live_files",
    "partition_dirs",
    "parse_manifest",
    "partition_live_files",
    "partition_live_names",
    "partition_names",
    "read_manifest",
    "RemoteSnapshot",
    "remote_live_files",
    "remote_partitions",
    "visible_names",
    "write_manifest",
]

MANIFEST_NAME = "_manifest.json"
_COMPACTED = re.compile(r"compact-g([0-9]+)-[0-9]+-([0-9a-f]{12})\.parquet")
_OUTPUT_TOKEN = re.compile(r"_(?:index|facts)-g[0-9]+-([0-9a-f]{12})\.pq")
_PARTITION = re.compile(r"date=([0-9]{4}-[0-9]{2}-[0-9]{2})", re.ASCII)
_FORMAT = 1
_log = logging.getLogger("otel_replay")


_warned: set[tuple[object, ...]] = set()
_WARNED_MAX = 4096


def _warn_once(key: tuple[object, ...], message: str, *args: object) -> None:
    """Log ``message`` once per process for ``key`` (a listing runs at every lookup; the state rarely changes)."""
    if key in _warned:
        return
    if len(_warned) >= _WARNED_MAX:
        _warned.clear()
    _warned.add(key)
    _log.warning(message, *args)


def is_partition_name(name: str) -> bool:
    """Whether ``name`` is ``date=YYYY-MM-DD`` with ASCII digits and a real calendar date."""
    if _PARTITION.fullmatch(name) is None:
        return False
    try:
        date.fromisoformat(name[5:])
    except ValueError:
        return False
    return True


def looks_like_partition(name: str) -> bool:
    """Whether ``name`` looks like a partition (``date=`` and a date pattern) whether or not it is a real date."""
    return re.fullmatch(r"date=\d{4}-\d{2}-\d{2}", name) is not None


def output_token(name: str) -> str | None:
    """The run token of a compaction output (compacted file, side index or facts file), ``None`` for other names."""
    match = _COMPACTED.fullmatch(name) or _OUTPUT_TOKEN.fullmatch(name)
    return match.group(match.re.groups) if match else None


def is_compacted_name(name: str) -> bool:
    """Whether ``name`` is a file name compaction writes (``compact-g<gen>-<n>-<hex>.parquet``)."""
    return _COMPACTED.fullmatch(name) is not None


@dataclass
class Manifest:
    """What ``_manifest.json`` says about one partition (see the module docstring)."""

    generation: int = 0
    files: list[str] = field(default_factory=list)
    superseded: dict[str, float] = field(default_factory=dict)
    index: str | None = None
    rows: int = 0
    pending: dict[str, float] = field(default_factory=dict)
    fence: str | None = None

    def to_json(self, fence: str | None = None) -> str:
        """The manifest as the JSON document written to disk (with ``fence``, a token making each write unique)."""
        doc: dict[str, object] = {
            "format": _FORMAT,
            "generation": self.generation,
            "files": self.files,
            "superseded": self.superseded,
            "index": self.index,
            "rows": self.rows,
            "pending": self.pending,
        }
        if fence is not None:
            doc["fence"] = fence
        return json.dumps(doc, indent=1, sort_keys=True)

    def copy(self) -> Manifest:
        """A copy whose lists and maps may be changed without changing this one."""
        return Manifest(
            self.generation,
            list(self.files),
            dict(self.superseded),
            self.index,
            self.rows,
            dict(self.pending),
            self.fence,
        )


def _names(value: object, where: str, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and "/" not in v for v in value):
        raise DatasetError(f"{where}: {what} must be a list of file names")
    return list(value)


def read_manifest(partition: Path) -> Manifest | None:
    """The manifest of ``partition``, or ``None`` when it has none (never compacted).

    Parsed manifests are cached by the file's inode, size and mtime (a swap
    is a rename, so a new manifest is a new inode); each call gets its own copy.

    Raises:
        DatasetError: the manifest exists but is not a valid manifest (names the file and field).

    """
    path = partition / MANIFEST_NAME
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return _parsed(str(path), (st.st_ino, st.st_size, st.st_mtime_ns)).copy()


@lru_cache(maxsize=1024)
def _parsed(where: str, stamp: tuple[int, int, int]) -> Manifest:
    try:
        data = Path(where).read_bytes()
    except OSError as exc:
        raise DatasetError(f"cannot read {where}: {exc.strerror or exc}") from exc
    return parse_manifest(data, where)


def parse_manifest(data: bytes, where: str) -> Manifest:
    """Parse and check a manifest document read from ``where``.

    Raises:
        DatasetError: not a valid manifest (names ``where`` and the field).

    """
    try:
        doc = strict_loads(data, where=where)
    except PayloadError as exc:
        raise DatasetError(str(exc)) from exc
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        raise DatasetError(f"{where}: not an otel-replay manifest (format {_FORMAT} expected)")
    generation, rows, index = doc.get("generation"), doc.get("rows", 0), doc.get("index")
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
        raise DatasetError(f"{where}: generation must be a non-negative integer")
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
        raise DatasetError(f"{where}: rows must be a non-negative integer")
    if index is not None and (not isinstance(index, str) or "/" in index):
        raise DatasetError(f"{where}: index must be a file name or null")
    superseded = doc.get("superseded", {})
    if not isinstance(superseded, dict) or not all(
        isinstance(k, str) and "/" not in k and isinstance(v, (int, float)) and not isinstance(v, bool)
        for k, v in superseded.items()
    ):
        raise DatasetError(f"{where}: superseded must map file names to times")
    pending = doc.get("pending", {})
    if not isinstance(pending, dict) or not all(
        isinstance(k, str)
        and re.fullmatch("[0-9a-f]{12}", k)
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
        for k, v in pending.items()
    ):
        raise DatasetError(f"{where}: pending must map run tokens to times")
    fence = doc.get("fence")
    files = _names(doc.get("files", []), where, "files")
    return Manifest(
        generation,
        files,
        {k: float(v) for k, v in superseded.items()},
        index,
        rows,
        {k: float(v) for k, v in pending.items()},
        fence if isinstance(fence, str) else None,
    )


def write_manifest(partition: Path, manifest: Manifest) -> None:
    """Replace ``partition``'s manifest atomically (temp file, fsync, rename, fsync the directory)."""
    write_bytes_atomic(manifest.to_json(fence=uuid.uuid4().hex).encode(), partition / MANIFEST_NAME)


def partition_dirs(dataset: str | os.PathLike[str], directory: str = SPANS_DIR) -> list[Path]:
    """The dataset's partition directories (``spans/date=YYYY-MM-DD``, or under ``directory``), oldest first.

    A directory named like a partition but not a real date (``date=2024-13-45``,
    non-ASCII digits) is left out with a warning: it is not a partition.
    """
    root = Path(dataset) / directory
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if not p.is_dir():
            continue
        if is_partition_name(p.name):
            found.append(p)
        elif _PARTITION.fullmatch(p.name) or looks_like_partition(p.name):
            _warn_not_partition(str(p))
    return sorted(found)


def _warn_not_partition(where: str) -> None:
    message = "otel-replay: %s is not a partition (no such date): skipped, its files are not read"
    _warn_once(("odd", where), message, where)


def partition_names(dataset: str | os.PathLike[str] | Location, directory: str = SPANS_DIR) -> list[str]:
    """The names (``date=YYYY-MM-DD``) of ``dataset``'s partitions (of ``directory``), oldest first; a path or URI."""
    location = resolve(dataset)
    heads = backend_for(location).subdirectories(location.join(directory))  # on a store: prefixes holding objects
    for head in sorted(h for h in heads if looks_like_partition(h) and not is_partition_name(h)):
        _warn_not_partition(location.join(directory, head))
    return sorted(h for h in heads if is_partition_name(h))


def not_partition_names(dataset: str | os.PathLike[str] | Location, directory: str = SPANS_DIR) -> list[str]:
    """Folders under ``spans/`` (or ``directory``) named like a partition that are not one (no such date), sorted."""
    location = resolve(dataset)
    heads = backend_for(location).subdirectories(location.join(directory))
    return sorted(h for h in heads if looks_like_partition(h) and not is_partition_name(h))


def partition_date(partition: Path) -> str:
    """The ``YYYY-MM-DD`` of a partition directory."""
    match = _PARTITION.fullmatch(partition.name)
    if match is None:
        raise DatasetError(f"{partition} is not a date=YYYY-MM-DD partition")
    return match.group(1)


def _known(manifest: Manifest | None) -> tuple[set[str], dict[str, float], dict[str, float]]:
    """What ``manifest`` knows of its partition's files: (listed, superseded, pending run tokens)."""
    if manifest is None:
        return set(), {}, {}
    return set(manifest.files), manifest.superseded, manifest.pending


def _visible(names: Iterable[str], manifest: Manifest | None) -> list[str]:
    listed, superseded, pending = _known(manifest)
    return sorted(
        name
        for name in names
        if name.endswith(".parquet")
        and not name.startswith(".")
        and name not in superseded
        # no run pending (the usual case): no name to parse for a run's token (every lookup lists every name)
        and (not pending or name in listed or output_token(name) not in pending)
    )


def unnamed_compacted(names: Iterable[str], manifest: Manifest | None) -> list[str]:
    """Compacted-named files that ``manifest`` neither lists, supersedes nor knows as a pending run's output.

    No compaction of this partition wrote them while it had this manifest: they
    were restored or copied in (or left by a crash of a version that did not
    record its runs). They are read like arrivals and compacted in normally.
    """
    listed, superseded, pending = _known(manifest)
    return sorted(
        name
        for name in names
        if name.startswith("compact-g")  # what the pattern starts with: most names are arrivals, never matched
        and is_compacted_name(name)
        and name not in listed
        and name not in superseded
        and output_token(name) not in pending
    )


def _same(a: Manifest | None, b: Manifest | None) -> bool:
    """Whether two reads of a manifest saw the same write (each write carries a fresh fence)."""
    if a is None or b is None:
        return a is None and b is None
    return a.fence == b.fence and a.to_json() == b.to_json()


_SETTLE_ATTEMPTS = 8


def partition_live_files(partition: Path) -> tuple[Manifest | None, list[Path]]:
    """``partition``'s manifest (read first) and its live files, per the reader rule.

    Raises:
        DatasetError: the manifest is invalid, or names a compacted file that is missing.

    """
    manifest, live = partition_live_names(partition)
    return manifest, [partition / name for name in live]


def partition_live_names(partition: Path, *, missing: list[str] | None = None) -> tuple[Manifest | None, list[str]]:
    """Like :func:`partition_live_files`, the live files' names (no path objects: a lookup lists every partition).

    Raises:
        DatasetError: the manifest is invalid, or names a compacted file that is missing.

    """
    for _ in range(_SETTLE_ATTEMPTS):
        manifest = read_manifest(partition)
        try:
            names = os.listdir(partition)
        except FileNotFoundError:  # dropped by retention meanwhile
            return manifest, []
        gone = sorted(set(manifest.files) - set(names)) if manifest is not None else []
        unnamed = unnamed_compacted(names, manifest)
        # A compaction records its run in the manifest before writing and swaps it before deleting: if the
        # manifest is unchanged after the listing, no run of this partition wrote these files or deleted the
        # named ones since it was read. Otherwise the listing is of another moment: list again.
        if (gone or unnamed) and not _same(manifest, read_manifest(partition)):
            continue
        if gone and missing is not None:  # skip_corrupt: the reader counts them, the rest stays readable
            missing.extend(str(partition / name) for name in gone)
        elif gone:
            assert manifest is not None
            problem = missing_error(str(partition / MANIFEST_NAME), manifest, names)
            assert problem is not None
            raise problem
        if unnamed:
            _warn_unnamed(str(partition), unnamed)
        return manifest, _visible(names, manifest)
    raise DatasetError(f"{partition}: its manifest kept changing while it was being listed; retry")


def _warn_unnamed(where: str, unnamed: list[str]) -> None:
    _warn_once(
        ("unnamed", where, tuple(unnamed)),
        "otel-replay: %s holds %d compacted file(s) no manifest names (restored or copied in), e.g. %s: "
        "read like arrivals, the next compaction merges them",
        where,
        len(unnamed),
        unnamed[0],
    )


def missing_error(where: str, manifest: Manifest, names: Iterable[str]) -> DatasetError | None:
    """The error for a manifest naming compacted files that are not there (``None`` when all are)."""
    missing = sorted(set(manifest.files) - set(names))
    if not missing:
        return None
    return DatasetError(
        f"{where} lists {len(missing)} compacted file(s) that are missing, e.g. {missing[0]}: spans in them are lost "
        "(open with skip_corrupt to read the rest; `otel-replay compact --drop-missing` drops them from the manifest)"
    )


def visible_names(names: Iterable[str], manifest: Manifest | None) -> list[str]:
    """The reader rule over one partition's file ``names`` and its manifest (read before listing)."""
    return _visible(names, manifest)


def read_remote_manifest(
    s3: object, location: Location, partition: str, directory: str = SPANS_DIR
) -> tuple[Manifest | None, str | None]:
    """A remote partition's manifest and its ETag (``(None, None)``: none), read in one GET.

    One GET returns one whole version of the object. pyarrow's own read is a
    HEAD for the size, then ranged GETs, so a manifest rewritten in between (a
    compaction's fence or swap) would come back cut at the old size.
    """
    key = location.key(location.join(directory, partition, MANIFEST_NAME))
    stored = objects.get(s3, location, key)
    if stored is None:
        return None, None
    return parse_manifest(stored.body, f"s3://{location.bucket}/{key}"), stored.etag


def remote_partitions(
    location: Location, *, missing: list[str] | None = None, directory: str = SPANS_DIR
) -> tuple[list[tuple[str, Manifest | None, list[str]]], list[str]]:
    """A remote dataset's partitions as (name, manifest, file names), and its files outside partitions.

    S3 is strongly consistent for GET, PUT and LIST. A first listing finds the
    partitions and their manifests; every manifest is read; a second listing
    gives the files. Each partition is then seen through a manifest read
    before its files were listed, which is the reader rule: an old manifest
    names old files (still there for the grace period), a new one names files
    written before it. A partition whose manifest appeared between the
    listings is read without one: its arrival-order files (kept for the grace
    period) and none of its compacted ones, i.e. the old state. A partition
    holding compacted files its manifest does not know is read again (manifest,
    then listing) until the manifest stays the same across its listing.
    ``missing``: collect the URLs of compacted files a manifest lists but that
    are gone instead of raising (``skip_corrupt``). ``directory``: the file kind's folder (``spans``, ``logs``).
    """
    spans = location.join(directory)
    prefix = location.fs_path(spans) + "/"

    def split(path: str) -> tuple[str, str]:  # (directory below spans/, file name)
        head, _, name = path[len(prefix) :].rpartition("/")
        return head, name

    s3 = objects.client(location)
    manifests: dict[str, Manifest | None] = {}
    for info in location.files_under(spans):
        head, name = split(info.path)
        if name == MANIFEST_NAME and is_partition_name(head):
            manifests[head] = read_remote_manifest(s3, location, head, directory)[0]
    by_partition: dict[str, list[str]] = {}
    loose: list[str] = []
    nested: list[str] = []
    for info in location.files_under(spans):
        head, name = split(info.path)
        if is_partition_name(head):
            by_partition.setdefault(head, []).append(name)
        elif name.endswith(".parquet") and not name.startswith("."):
            if not looks_like_partition(head.split("/")[-1]):
                loose.append(location.join(directory, head, name))  # hand-placed, outside date= directories
            elif "/" in head:
                nested.append(location.join(directory, head, name))
    _warn_nested(nested)
    found = []
    for head in sorted(by_partition):
        names, manifest = by_partition[head], manifests.get(head)
        for _ in range(_SETTLE_ATTEMPTS):
            unnamed = unnamed_compacted(names, manifest)
            if not unnamed or _same(manifest, read_remote_manifest(s3, location, head, directory)[0]):
                break
            manifest = read_remote_manifest(s3, location, head, directory)[0]
            names = _remote_names(location, head, directory)
        else:
            raise DatasetError(f"{location.join(directory, head)}: its manifest kept changing while listed; retry")
        if unnamed:
            _warn_unnamed(location.join(directory, head), unnamed)
        if manifest is not None:
            gone = sorted(set(manifest.files) - set(names))
            if gone and missing is not None:
                missing.extend(location.join(directory, head, n) for n in gone)
                manifest = manifest.copy()
                manifest.files = [n for n in manifest.files if n not in gone]
            elif gone:
                problem = missing_error(location.join(directory, head, MANIFEST_NAME), manifest, names)
                assert problem is not None
                raise problem
        found.append((head, manifest, names))
    return found, loose


def _remote_names(location: Location, partition: str, directory: str = SPANS_DIR) -> list[str]:
    """The object names directly in a remote partition (one listing)."""
    url = location.join(directory, partition)
    prefix = location.fs_path(url) + "/"
    names = [info.path[len(prefix) :] for info in location.files_under(url)]
    return [n for n in names if "/" not in n]


def _warn_nested(nested: list[str]) -> None:
    if nested:
        _warn_once(
            ("nested", tuple(nested)),
            "otel-replay: %d Parquet file(s) sit in a date= directory inside another directory, e.g. %s: "
            "not read (a nested copy of a partition? move the files up into the partition)",
            len(nested),
            nested[0],
        )


RemoteSnapshot = tuple[list[tuple[str, "Manifest | None", list[str]]], list[str]]
"""What :func:`remote_partitions` returns: (partition name, manifest, file names) per partition, loose files."""


def _remote_live_files(
    location: Location, snapshot: RemoteSnapshot | None = None, directory: str = SPANS_DIR
) -> list[str]:
    """:func:`live_files` on an object store (see :func:`remote_partitions`), or over a snapshot of it."""
    partitions, loose = snapshot if snapshot is not None else remote_partitions(location, directory=directory)
    files = list(loose)
    for head, manifest, names in partitions:
        files.extend(location.join(directory, head, name) for name in _visible(names, manifest))
    return sorted(files)


def remote_live_files(location: Location, snapshot: RemoteSnapshot, directory: str = SPANS_DIR) -> list[str]:
    """The live files of a remote dataset as seen by ``snapshot`` (one :func:`remote_partitions` call)."""
    return _remote_live_files(location, snapshot, directory)


def live_files(
    dataset: str | os.PathLike[str] | Location, *, missing: list[str] | None = None, directory: str = SPANS_DIR
) -> list[str]:
    """Every live Parquet file of ``dataset``, sorted: what a reader should query.

    Use this instead of globbing ``spans/**/*.parquet``: a glob also returns
    the files a compaction superseded (kept for a grace period) and would
    count their spans twice. ``dataset`` may be an ``s3://bucket/prefix`` URI
    (the files are then ``s3://`` URLs). ``missing``: collect compacted files
    a manifest lists but that are gone, instead of raising (``skip_corrupt``). ``directory``: the file kind's
    folder (``spans``; ``logs`` for OTLP log records, partitioned and compacted the same way).

    Raises:
        DatasetError: a manifest is invalid, or (without ``missing``) names a compacted file that is gone.

    """
    location = resolve(dataset)
    if backend_for(location).snapshots_listing:
        snapshot = remote_partitions(location, missing=missing, directory=directory)
        return _remote_live_files(location, snapshot, directory)
    dataset = location.root
    files: list[str] = []
    root = Path(dataset) / directory
    if not root.is_dir():
        return files
    for partition in partition_dirs(dataset, directory):
        folder = str(partition)  # joined as text: a path object per file cost 6 µs each on a day of 20,000
        files.extend(os.path.join(folder, name) for name in partition_live_names(partition, missing=missing)[1])
    # Files outside date= directories (hand-placed) are read as they are, as Store always did.
    loose, nested = _loose_files(root)
    _warn_nested(nested)
    return sorted(files + loose)


def _loose_files(root: Path) -> tuple[list[str], list[str]]:
    """(Parquet files under ``root`` outside partitions, those inside a date= folder nested in another folder).

    The files of the partitions right under ``root`` are listed through their
    manifests, so they are walked past by name only (a day of 20,000 small
    files made a path object of each here); their subfolders are still walked.
    """
    top = str(root)
    loose: list[str] = []
    nested: list[str] = []
    for folder, _subfolders, names in os.walk(top):  # a folder removed while walked is skipped, not an error
        in_partition = looks_like_partition(os.path.basename(folder))
        if in_partition and os.path.dirname(folder) == top:
            continue
        for name in names:
            if name.endswith(".parquet") and not name.startswith("."):
                (nested if in_partition else loose).append(os.path.join(folder, name))
    return loose, nested
