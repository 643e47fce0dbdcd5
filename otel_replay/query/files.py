"""Which of a dataset's Parquet files are live and readable: listing, the cheap check at open, schema versions.

A file is listed through its partition's manifest (a glob would also list
files a compaction superseded), then checked once per (size, mtime): Parquet
magic at both ends, a footer that fits, a storage schema version this
otel-replay reads, and span columns of the expected types. The verdicts are
cached in a :class:`FileTriage`, which the query engine consults before it
points its views at a file. The same footer bytes give the keys of the ids
a file written by this otel-replay holds (:mod:`otel_replay.exporters.id_keys`),
which the engine's tail index uses instead of reading the file. On local
disk, a file the writer logged in its partition's key log
(:mod:`otel_replay.exporters.key_log`) is not even opened: its line gives
its keys once one file of the same writer schema was checked in full.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from otel_replay import semconv as sc
from otel_replay._duck import literal_paths
from otel_replay.errors import CorruptFileError, DatasetError
from otel_replay.exporters.id_keys import decode_keys, footer_keys, unpack_keys
from otel_replay.exporters.key_log import KEY_LOG_NAME, LoggedFile, footer_digest, parse_lines
from otel_replay.exporters.schema import SCHEMA_METADATA_KEY, SPANS_DIR
from otel_replay.location import Location
from otel_replay.query.keys import NATIVE_KEYS, KeyTable
from otel_replay.storage.backend import Backend, backend_for
from otel_replay.storage.manifest import RemoteSnapshot, live_files, remote_live_files, remote_partitions
from otel_replay.storage.span_columns import (
    arrow_schema_coarse,
    arrow_schema_problem,
    schema_problem,
    time_range_problem,
)

__all__ = [
    "FOOTER_KEY_BUDGET",
    "VANISHED",
    "FileTriage",
    "footer_value",
    "literal_paths",
    "note_skipped",
    "schema_version",
]

FOOTER_KEY_BUDGET = 2_000_000
"""Id keys (from footers) a :class:`FileTriage` holds at most, about 60 bytes each; past it a file is read instead."""

_log = logging.getLogger(__name__)
_MAGIC = b"PAR1"
_MAX_FOOTER = 64 * 2**20
_TAIL_READ = 64 * 1024  # bytes read from a local file's end in one call (a small span file's footer: ~8 KB)
_OURS_MAJOR = int(sc.SCHEMA_VERSION.split(".")[0])
_TYPED_OUTCOMES = 2  # the storage schema version that promoted outcome_decision_id
_ARROW_SCHEMA_KEY = b"ARROW:schema"
_KNOWN_WRITERS = 64  # footer digests (one per writer schema) a FileTriage vouches for at most
_MAX_KEY_LOG = 256 * 2**20  # a partition's key log past this size (~500,000 files) is not read: footers are


def note_skipped(problem: CorruptFileError) -> None:
    """Log that ``problem``'s file is left out as corrupt (one logger for every such notice: the CLI filters them)."""
    _log.warning("otel-replay: skipping %s", problem)


def _read_footer(path: str, size: int, backend: Backend) -> bytes | str:
    """The Thrift footer of the Parquet file ``path`` of ``backend``'s dataset, or what is wrong with its framing."""
    if size < 12:
        return f"{size} bytes, too short for Parquet"
    if backend.directory is not None:  # a file of a local directory: one pread
        return _read_local_footer(path, size)
    opened = backend.location.open_object(path, size)
    with opened as handle:
        head = handle.read(4)
        handle.seek(size - 8)
        tail = handle.read(8)
        if head != _MAGIC or tail[4:] != _MAGIC:
            return "no Parquet magic at its start or end (truncated or not Parquet)"
        length = int.from_bytes(tail[:4], "little")
        if not 0 < length <= min(size - 12, _MAX_FOOTER):
            return f"footer length {length} does not fit a {size}-byte file"
        handle.seek(size - 8 - length)
        return handle.read(length)


def _read_local_footer(path: str, size: int) -> bytes | str:
    """:func:`_read_footer` of a local file: one read of its last :data:`_TAIL_READ` bytes (a small file: all of it).

    A day of small files is checked file by file at open, so the system
    calls count: one ``pread`` takes the magic at both ends and the footer
    of a file up to that size, where seeks and three reads did before.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        start = max(0, size - _TAIL_READ)
        data = os.pread(fd, size - start, start)
        head = data[:4] if start == 0 else os.pread(fd, 4, 0)
        if len(data) != size - start or head != _MAGIC or data[-4:] != _MAGIC:
            return "no Parquet magic at its start or end (truncated or not Parquet)"
        length = int.from_bytes(data[-8:-4], "little")
        if not 0 < length <= min(size - 12, _MAX_FOOTER):
            return f"footer length {length} does not fit a {size}-byte file"
        if length + 8 <= len(data):
            return data[len(data) - 8 - length : len(data) - 8]
        footer = os.pread(fd, length, size - 8 - length)
        return footer if len(footer) == length else "the file ends inside its footer (it changed while read)"
    finally:
        os.close(fd)


def footer_value(footer: bytes, key: bytes) -> bytes | None:
    """The value of ``key`` in a Parquet footer's key-value metadata (``None`` when absent).

    A key-value pair in the footer's Thrift compact encoding is field 1
    (header 0x18, varint length, key) then field 2 (0x18, varint length,
    value). The key-value metadata is the footer's field 5, after the row
    groups and their statistics, so the last match is the writer's: a span
    value that happens to hold the same bytes can only sit before it.
    """
    pattern = b"\x18" + bytes([len(key)]) + key + b"\x18"
    at = footer.rfind(pattern)
    if at < 0:
        return None
    at += len(pattern)
    length, shift = 0, 0
    while at < len(footer) and shift < 35:  # varint
        byte = footer[at]
        at += 1
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return footer[at : at + length]


def schema_version(footer: bytes) -> str | None:
    """The storage schema version in a Parquet footer (``None`` when the writer recorded none)."""
    raw = footer_value(footer, SCHEMA_METADATA_KEY)
    return None if raw is None else raw[:64].decode("ascii", "replace")


def _check_version(path: str, footer: bytes) -> int | None:
    """The file's major storage schema version (``None``: not recorded).

    Raises:
        DatasetError: the version is unreadable, or newer than this otel-replay reads.

    """
    version = schema_version(footer)
    if version is None:
        return None
    major = version.split(".")[0]
    if not major.isdigit() or len(major) > 6:
        raise DatasetError(f"{path}: unreadable storage schema version {version!r}")
    if int(major) > _OURS_MAJOR:
        raise DatasetError(
            f"{path}: written with storage schema version {version}, newer than this otel-replay reads "
            f"({sc.SCHEMA_VERSION}); upgrade otel-replay to read it"
        )
    return int(major)


VANISHED = CorruptFileError("", "vanished")
"""What :meth:`FileTriage.check` returns for a listed file that is gone: not live (never reported as corrupt)."""


class FileTriage:
    """The live files of one dataset and the verdict on each: readable, corrupt, or gone.

    Not thread-safe on its own: the query engine calls it under its lock.
    """

    def __init__(self, location: Location) -> None:
        """Triage the files of the dataset at ``location``."""
        self.location = location
        self.backend = backend_for(location)
        self.checked: dict[str, tuple[int, int]] = {}  # files that passed the check, by the stamp they had
        self.arrow_schema: dict[str, bytes | None] = {}  # the writer's Arrow schema, to skip union_by_name
        self.major: dict[str, int | None] = {}  # each file's major storage schema version (None: not recorded)
        self._legacy: set[str] = set()  # the files of major, by major version, older than typed outcome ids
        self.decoded: dict[str, tuple[int, int]] = {}  # files decoded whole without error, by stamp
        self.bad: dict[str, tuple[tuple[int, int], CorruptFileError]] = {}
        self.snapshot: RemoteSnapshot | None = None  # a remote dataset's listing at the last scan
        self.times_read: dict[str, tuple[int, int]] = {}  # files whose span times were read and fit in nanoseconds
        self.footer_keys: dict[str, tuple[tuple[int, int], frozenset[int]]] = {}
        """The id keys a checked file's footer carries, by the stamp it was checked at (for the tail index)."""
        self.key_tables: dict[str, KeyTable] = {}
        """The table holding the keys of a file vouched for by its key log line, by file (see :meth:`narrow`)."""
        self._tables: dict[int, KeyTable] = {}  # each table held, by id()
        self._footer_key_count = 0
        self._logs: dict[str, tuple[tuple[int, int], int, dict[str, LoggedFile]]] = {}
        """Each local partition's key log (:mod:`~otel_replay.exporters.key_log`): (device and inode, bytes
        read, its whole lines by file name)."""
        self._logs_read: set[str] = set()  # partitions whose log was read since the listing
        self._writers: dict[bytes, tuple[int | None, bytes]] = {}
        """(major version, Arrow schema) of a footer digest, from a file checked in full that had it."""

    def scan(self, missing: list[str] | None = None) -> list[str]:
        """The live files; ``missing`` (skip_corrupt) collects compacted files a manifest lists that are gone."""
        try:
            # Through the partition manifests: a glob would also list files a compaction superseded.
            if self.backend.snapshots_listing:  # one listing per refresh; lookups reuse it (see _narrow)
                self.snapshot = remote_partitions(self.location, missing=missing)
                return remote_live_files(self.location, self.snapshot)
            return live_files(self.location, missing=missing)
        except OSError as exc:
            root = self.location.join(SPANS_DIR)
            raise DatasetError(f"cannot list the files of {root}: {exc.strerror or exc}") from exc

    def stamp(self, path: str) -> tuple[int, int] | None:
        """(size, mtime) of ``path``; ``None`` when it is gone or cannot be stat'ed (a symlink loop, no permission)."""
        try:
            return self.backend.stamp(path)
        except OSError:
            return None

    def check(self, path: str) -> CorruptFileError | None:
        """The cheap check at open: Parquet magic at both ends, a footer that fits, a schema version we read.

        Reads a file's first 4 bytes and its footer, about 20 µs a file; the
        span columns' types are checked from the footer's Arrow schema (decoded
        once per distinct writer schema). Cached by (size, mtime). A file
        damaged past its footer is named by the query that reads it
        (``Engine._attempt`` in :mod:`otel_replay.query.engine`). A file that is gone is :data:`VANISHED` (not live,
        not corrupt: retention or compaction removed it after the listing). A local file whose key log line
        records its current (size, mtime), of a writer schema already checked here, is judged by that line
        alone (:mod:`otel_replay.exporters.key_log`): its damage, if any, is named by the query that reads it.

        Raises:
            DatasetError: the file was written with a newer major storage schema version.

        """
        if self.backend.immutable_files:  # a file is never rewritten under its name: a verdict on one stands
            bad_file = self.bad.get(path)
            if bad_file is not None:
                return bad_file[1]
            if path in self.checked:
                return None
        try:
            stamp = self.backend.listed_stamp(path)
        except FileNotFoundError:
            return VANISHED
        except OSError as exc:  # a symlink loop, no permission: a bad file, named
            return CorruptFileError(path, exc.strerror or str(exc))
        bad = self.bad.get(path)
        if bad is not None and bad[0] == stamp:
            return bad[1]
        if self.checked.get(path) == stamp:
            return None
        self._forget_keys(path)  # a file checked anew: keys held for it before (another stamp) say nothing now
        logged = self._logged(path) if self.backend.directory is not None else None
        if logged is not None and logged.stamp == stamp and self._vouched(path, stamp, logged):
            return None
        try:
            footer = _read_footer(path, stamp[0], self.backend)
        except FileNotFoundError:
            return VANISHED
        except OSError as exc:
            return CorruptFileError(path, exc.strerror or str(exc))
        if isinstance(footer, str):
            return CorruptFileError(path, footer)
        major = _check_version(path, footer)
        arrow = footer_value(footer, _ARROW_SCHEMA_KEY)
        coarse = False
        if arrow is None:
            problem = self._schema_problem(path)
        else:
            problem = arrow_schema_problem(arrow)
            coarse = problem is None and arrow_schema_coarse(arrow)
            if coarse:  # not nanoseconds (never ours): check the range
                problem = self.time_problem(path)
        if problem is not None:
            self.bad[path] = (stamp, CorruptFileError(path, problem))
            return self.bad[path][1]
        self._set_major([path], major)
        self.checked[path] = stamp
        self.arrow_schema[path] = arrow
        self._keep_keys(path, stamp, footer_keys(footer))
        if logged is not None and arrow is not None and len(self._writers) < _KNOWN_WRITERS and not coarse:
            digest = footer_digest(footer)  # its writer's files that share this footer tail need no read
            if digest is not None:
                self._writers.setdefault(digest, (major, arrow))
        return None

    def _logged(self, path: str) -> LoggedFile | None:
        """The line of its partition's key log for the local file ``path`` (``None``: none, or no log).

        Each partition's log is read once per listing (:meth:`live`), from
        where the last read stopped while it is the same file.
        """
        partition, _, name = path.rpartition(os.sep)
        held = self._logs.get(partition)
        if partition not in self._logs_read:
            self._logs_read.add(partition)
            held = self._read_log(partition, held)
        return None if held is None else held[2].get(name)

    def _read_log(
        self, partition: str, held: tuple[tuple[int, int], int, dict[str, LoggedFile]] | None
    ) -> tuple[tuple[int, int], int, dict[str, LoggedFile]] | None:
        try:
            # O_NONBLOCK: a FIFO put in its place must not hang the reader; only a regular file is read.
            fd = os.open(os.path.join(partition, KEY_LOG_NAME), os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            self._logs.pop(partition, None)
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_KEY_LOG:
                self._logs.pop(partition, None)
                return None
            same = held is not None and held[0] == (st.st_dev, st.st_ino) and held[1] <= st.st_size
            start = held[1] if same and held is not None else 0
            data = os.pread(fd, st.st_size - start, start)
        except OSError:
            self._logs.pop(partition, None)
            return None
        finally:
            os.close(fd)
        found, used = parse_lines(data)
        if same and held is not None:
            held[2].update(found)
            found = held[2]
        made = ((st.st_dev, st.st_ino), start + used, found)
        self._logs[partition] = made
        return made

    def _vouched(self, path: str, stamp: tuple[int, int], logged: LoggedFile) -> bool:
        """Take ``path``'s keys from its log line when a file of the same writer schema was checked in full."""
        writer = self._writers.get(logged.digest)
        keys = decode_keys(logged.keys) if writer is not None else None
        if writer is None or keys is None:
            return False
        self._set_major([path], writer[0])
        self.arrow_schema[path] = writer[1]
        self.checked[path] = stamp
        self._keep_keys(path, stamp, keys)
        return True

    def _keep_keys(self, path: str, stamp: tuple[int, int], keys: frozenset[int] | None) -> None:
        """Hold the id ``keys`` of ``path`` (within :data:`FOOTER_KEY_BUDGET`)."""
        self._forget_keys(path)
        if keys is not None and self._footer_key_count + len(keys) <= FOOTER_KEY_BUDGET:
            self.footer_keys[path] = (stamp, keys)
            self._footer_key_count += len(keys)

    def _forget_keys(self, path: str) -> None:
        """Drop the keys held for ``path`` (a footer's set, or its place in a partition's table)."""
        previous = self.footer_keys.pop(path, None)
        if previous is not None:
            self._footer_key_count -= len(previous[1])
        table = self.key_tables.pop(path, None)
        if table is not None:
            table.held -= 1
            if not table.held:  # no file answers from it any more: its keys go
                self._footer_key_count -= len(table)
                self._tables.pop(id(table), None)

    def keys_of(self, path: str) -> frozenset[int] | None:
        """The id keys held for ``path`` as of its last check (``None``: none held, its ids are read when needed)."""
        table = self.key_tables.get(path)
        if table is not None:
            return table.keys_of(path)
        held = self.footer_keys.get(path)
        return None if held is None else held[1]

    def narrow(self, paths: Sequence[str], probes: pa.Array) -> tuple[list[str], list[str]]:
        """(the files of ``paths`` whose key table holds one of ``probes``, the files no key table answers for).

        ``probes``: :func:`~otel_replay.query.keys.probe_array` of the ids looked up. One search per table,
        whatever its files; a file checked again since it was vouched for is answered elsewhere (its footer).
        """
        tables = self.key_tables
        if not tables:
            return [], list(paths)
        rest = [path for path in paths if path not in tables]
        if len(rest) == len(paths):
            return [], rest
        found: set[str] = set()
        for table in self._tables.values():
            found.update(table.holding(probes))
        asked = set(paths)
        return [path for path in found if path in asked and tables.get(path) is not None], rest

    def _vouch_logged(self, listed: Sequence[str]) -> dict[str, CorruptFileError | None]:
        """Verdicts on the files of ``listed`` judged here in bulk (``None``: readable), as :meth:`check` gives them.

        What :meth:`check` does file by file, for a local day of many small
        files at a few microseconds a file: one ``stat`` each; a file already
        checked at that (size, mtime) passes; a file whose key log line
        records that stamp, of a writer schema a full check vouched for, passes
        with its keys joined into its partition's :class:`KeyTable`. The first
        file of an unknown writer schema is checked in full here; anything
        else (no line, another stamp, keys that are not the writer's, a
        verdict of corrupt) is left to :meth:`check`.
        """
        passed: dict[str, CorruptFileError | None] = {}
        if self.backend.directory is None or not NATIVE_KEYS:
            return passed
        checked, bad, writers = self.checked, self.bad, self._writers
        start = 0
        while start < len(listed):  # the listing is sorted: each partition's files come together
            partition = listed[start].rpartition(os.sep)[0]
            prefix = partition + os.sep
            cut = len(prefix)
            end = start + 1
            while end < len(listed) and listed[end].startswith(prefix) and os.sep not in listed[end][cut:]:
                end += 1
            held = self._logs.get(partition)
            if partition not in self._logs_read:
                self._logs_read.add(partition)
                held = self._read_log(partition, held)
            lines = {} if held is None else held[2]
            vouched: dict[bytes, tuple[list[str], list[tuple[int, int]], list[bytes]]] = {}
            group = listed[start:end]
            for path, line in zip(group, map(lines.get, [path[cut:] for path in group]), strict=True):
                if line is None:
                    continue  # no line (an older writer's file, a lost line): check() reads its footer
                try:
                    info = os.stat(path)
                except OSError:
                    continue  # check() names it (or finds it gone)
                stamp = (info.st_size, info.st_mtime_ns)
                if stamp != line.stamp or (bad and path in bad):
                    continue
                if checked and checked.get(path) == stamp:
                    passed[path] = None
                    continue
                digest = line.digest
                if digest not in writers:  # the first file of its writer schema: checked through its footer
                    passed[path] = self.check(path)  # (its verdict stands for this listing, whatever follows)
                    continue
                same = vouched.get(digest)
                if same is None:
                    same = vouched[digest] = ([], [], [])
                same[0].append(path)
                same[1].append(stamp)
                same[2].append(line.keys)
            for digest, (paths, stamps, keys) in vouched.items():
                passed.update(dict.fromkeys(self._vouch_all(digest, paths, stamps, keys)))
            start = end
        return passed

    def _vouch_all(
        self, digest: bytes, paths: list[str], stamps: list[tuple[int, int]], keys: list[bytes]
    ) -> list[str]:
        """Record ``paths`` (of one writer schema) as checked at ``stamps``, their keys in one new table.

        ``keys``: each file's base64 keys, from its line. A file whose keys are not what the writer encodes is
        left out (its footer is read). Returns the files recorded.
        """
        unpacked = list(map(unpack_keys, keys))  # as a footer's keys are judged (decode_keys)
        if None in unpacked:
            kept = [i for i, one in enumerate(unpacked) if one is not None]
            paths, stamps = [paths[i] for i in kept], [stamps[i] for i in kept]
        packed = [one for one in unpacked if one is not None]
        for path in paths:
            if path in self.footer_keys or path in self.key_tables:
                self._forget_keys(path)
        self.checked.update(zip(paths, stamps, strict=True))
        major, arrow = self._writers[digest]
        self._set_major(paths, major)
        self.arrow_schema.update(dict.fromkeys(paths, arrow))
        table = KeyTable(paths, packed)
        if self._footer_key_count + len(table) <= FOOTER_KEY_BUDGET:  # past it, the files' ids are read instead
            self._footer_key_count += len(table)
            self.key_tables.update(dict.fromkeys(paths, table))
            self._tables[id(table)] = table
        return paths

    def _schema_problem(self, path: str) -> str | None:
        """:func:`schema_problem` and :func:`time_range_problem` of a file whose footer has no Arrow schema.

        Another writer's file: one footer parse, and a read of a time column
        only when it is coarser than nanoseconds and lacks statistics.
        """
        return self._parquet_problem(path, statistics=True, schema=True)

    def time_problem(self, path: str, *, statistics: bool = True) -> str | None:
        """:func:`time_range_problem` of ``path`` (a file whose span times are not all nanoseconds)."""
        return self._parquet_problem(path, statistics=statistics, schema=False)

    def _parquet_problem(self, path: str, *, statistics: bool, schema: bool) -> str | None:
        """What is wrong with ``path``'s span columns or times, read through pyarrow (``None``: nothing)."""
        try:
            source = self.backend.source(path)
            parquet = pq.ParquetFile(source)
            problem = schema_problem(parquet.schema_arrow) if schema else None
            return problem or time_range_problem(source, parquet.metadata, statistics=statistics)
        except FileNotFoundError:
            return None  # gone: the query that reads it re-lists
        except (OSError, pa.ArrowException, ValueError) as exc:
            return str(exc).splitlines()[0] if str(exc) else type(exc).__name__

    def union_by_name(self, files: Sequence[str]) -> bool:
        """Whether ``files`` need DuckDB's union_by_name: not when one writer schema is recorded in every footer.

        With it DuckDB reads every file's schema each time a query binds the
        views (about 0.15 ms a file); without it, only the first file's.
        """
        schemas = {self.arrow_schema.get(path) for path in files}
        return len(schemas) != 1 or None in schemas

    def legacy_outcomes(self, files: Sequence[str]) -> bool:
        """Whether any of ``files`` may keep an outcome's decision id only in its JSON (schema version 1 or unknown)."""
        # Set operations, not a loop: a lookup on a day of 20,000 small files asks this several times.
        named = set(files)
        return not named <= self.major.keys() or not self._legacy.isdisjoint(named)

    def _set_major(self, paths: Sequence[str], major: int | None) -> None:
        """Record the major storage schema version of ``paths`` (one writer's files)."""
        self.major.update(dict.fromkeys(paths, major))
        if (major or 0) < _TYPED_OUTCOMES:
            self._legacy.update(paths)
        elif self._legacy:
            self._legacy.difference_update(paths)

    def live(self, known: set[str], skip_corrupt: bool) -> tuple[list[str], list[CorruptFileError], bool]:
        """(the readable live files, the ones skipped as corrupt, whether a listed file was gone when checked).

        ``known``: the files already reported as skipped (not logged again).
        ``skip_corrupt``: leave a corrupt file out instead of raising its :class:`CorruptFileError`.
        """
        files, skipped = [], []
        vanished = False
        missing: list[str] | None = [] if skip_corrupt else None
        listed = self.scan(missing)
        self._logs_read.clear()  # each partition's key log is read again (its new lines) for this listing
        if self.footer_keys or self.key_tables:  # forget the keys of files compaction or retention removed
            alive = set(listed)
            for gone in [path for path in [*self.footer_keys, *self.key_tables] if path not in alive]:
                self._forget_keys(gone)
        decided = self._vouch_logged(listed)
        for path in listed:
            problem = decided[path] if path in decided else self.check(path)
            if problem is None:
                files.append(path)
            elif problem is VANISHED:
                vanished = True
            elif skip_corrupt:
                if path not in known:
                    note_skipped(problem)
                skipped.append(problem)
            else:
                raise problem
        for path in missing or ():
            problem = CorruptFileError(path, "listed by its partition's _manifest.json but missing (spans lost)")
            if path not in known:
                note_skipped(problem)
            skipped.append(problem)
        return files, skipped, vanished
