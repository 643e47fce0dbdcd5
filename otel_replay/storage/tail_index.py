"""The ids of the files a side index does not cover yet, read once per file and kept in memory.

A partition's side index (written by compaction) names the compacted files
holding an id; every file that arrived since is searched by every lookup
(:func:`~.side_index.files_for`), so between two compactions a point lookup
grows slower with each arrival: 240 five-second exporter files made a trade
chain 20× slower in ``benchmarks/bench_fresh.py``. :class:`TailIndex` reads the
id columns of each such file once (a few hundred microseconds for an
exporter's file), keeps a hash of each of a file's distinct ids in a set, and tells a lookup
which of those files can hold its ids; the query then opens only those.

It never narrows wrongly: a file whose ids cannot be read (damaged, foreign
column types) or that arrives once the key budget is spent is always kept, so
the answer is as complete as searching every file, and the query that reads a
damaged file still names it. Such a file is not read again until it changes
or :meth:`TailIndex.keep_only` makes room. Entries are keyed by the file's (size, mtime) and
dropped with :meth:`TailIndex.keep_only` when compaction retires a file.

A file written by this otel-replay carries its ids' keys in its footer
(:mod:`otel_replay.exporters.id_keys`), which the reader's check at open has
already read: such a file is never read here (``known`` of :meth:`TailIndex.holding`).
Keys are those of :func:`~otel_replay.exporters.id_keys.id_key`, so both agree.
A file read here cannot be searched by a gate record's decision id (it lives in
the attributes JSON): it is kept for every such lookup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from otel_replay.exporters.id_keys import GATE_KIND, absent_key, id_key
from otel_replay.location import Location

from .backend import backend_for
from .side_index import INDEX_KINDS

__all__ = ["DEFAULT_KEY_BUDGET", "TailIndex"]

DEFAULT_KEY_BUDGET = 1_000_000
"""Distinct (kind, id) pairs a :class:`TailIndex` holds at most (each as a hash in a set, about 80 bytes)."""

_JSON_IN_OLDER_FILES = ("outcome_decision_id",)  # kinds a version 1 file keeps only in the attributes JSON
_NOT_READ = (GATE_KIND,)  # kinds this index does not read from a file (kept in JSON): such a file is kept


class TailIndex:
    """Which not-yet-indexed files hold an id; see the module docstring.

    Not thread-safe on its own: the :class:`~otel_replay.query.store.Store` calls it
    under its lock.
    """

    def __init__(self, location: Location, *, key_budget: int = DEFAULT_KEY_BUDGET) -> None:
        """An empty tail index over ``location``'s files, holding at most ``key_budget`` keys."""
        if key_budget < 0:
            raise ValueError(f"key_budget must be >= 0, got {key_budget}")
        self.location = location
        self.key_budget = key_budget
        self._files: dict[str, tuple[tuple[int, int], frozenset[int]]] = {}
        self._passed: dict[str, tuple[int, int]] = {}  # files kept unread (over budget, unreadable), by stamp
        self._keys = 0
        self.files_read = 0
        """Files whose ids were read (a counter for tests and benchmarks)."""

    @property
    def keys(self) -> int:
        """Distinct (kind, id) pairs held now."""
        return self._keys

    def holding(
        self,
        paths: Sequence[str],
        wanted: Sequence[tuple[str, str]],
        stamps: Mapping[str, tuple[int, int]],
        known: Mapping[str, tuple[tuple[int, int], frozenset[int]]] | None = None,
    ) -> list[str]:
        """The files of ``paths`` that may hold any of ``wanted`` ((kind, id) pairs), in their order.

        ``stamps`` gives each path's (size, mtime); a path without one, or
        whose ids cannot be read or held, is kept. ``known``: keys already
        found for a path (its footer's), by the stamp they were found at; such
        a file is not read.
        """
        probes = frozenset(id_key(kind, key) for kind, key in wanted).union(
            absent_key(kind) for kind, _ in wanted if kind in _JSON_IN_OLDER_FILES or kind in _NOT_READ
        )
        kept = []
        files = self._files
        known = known or {}
        for path in paths:  # every file newer than the index, at every lookup: kept to a few dict operations
            stamp = stamps.get(path)
            cached = known.get(path) or files.get(path)
            fresh = cached is not None and stamp is not None and cached[0] == stamp
            ids = cached[1] if fresh and cached is not None else self._ids(path, stamp)
            if ids is None or not probes.isdisjoint(ids):
                kept.append(path)
        return kept

    def keep_only(self, live: Sequence[str]) -> None:
        """Forget every file not in ``live`` (a compaction retired it)."""
        alive = set(live)
        for path in [p for p in self._files if p not in alive]:
            self._keys -= len(self._files.pop(path)[1])
        self._passed.clear()  # room may have been made: try the files kept unread again

    def _ids(self, path: str, stamp: tuple[int, int] | None) -> frozenset[int] | None:
        if stamp is None or self._passed.get(path) == stamp:
            return None
        cached = self._files.get(path)
        if cached is not None:
            if cached[0] == stamp:
                return cached[1]
            self._keys -= len(self._files.pop(path)[1])
        ids = self._read(path) if self._keys < self.key_budget else None
        if ids is None or self._keys + len(ids) > self.key_budget:
            self._passed[path] = stamp  # not read again until it changes or keep_only() makes room
            return None
        self._files[path] = (stamp, ids)
        self._keys += len(ids)
        return ids

    def _read(self, path: str) -> frozenset[int] | None:
        """Hashes of the distinct (kind, id) keys of one file; ``None`` when they cannot be read as strings.

        A hash shared by two keys only keeps a file that need not be read; it never leaves one out.
        """
        try:
            handle = pq.ParquetFile(backend_for(self.location).open_input(path))
            names = set(handle.schema_arrow.names)
            columns = [kind for kind in INDEX_KINDS if kind in names]
            table = handle.read(columns=columns)
            self.files_read += 1
            # A file without the outcome decision id column (an older writer's: version 1 files keep that id
            # only in the JSON) cannot be narrowed by it: its marker keeps it for every such lookup. (Another
            # kind's missing column reads as NULL, which matches no id.)
            keys: set[int] = {absent_key(kind) for kind in _JSON_IN_OLDER_FILES if kind not in names}
            keys.update(absent_key(kind) for kind in _NOT_READ)
            for kind in columns:
                values = pc.unique(table.column(kind).cast(pa.string())).drop_null()
                keys.update(id_key(kind, value) for value in values.to_pylist())
            return frozenset(keys)
        except (OSError, pa.ArrowException, ValueError):
            return None
