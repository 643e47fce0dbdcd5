"""The id keys of many small files held as one array per partition: a lookup searches them in one call.

A day of small files no compaction has indexed yet is narrowed, at every
lookup, by the id keys each file carries (its footer's, or its line in the
partition's key log: :mod:`otel_replay.exporters.key_log`). Held as a set per
file, those keys cost a set built per file at open (about 20 µs of Python a
file) and a membership test per file at each lookup. A :class:`KeyTable`
holds the keys of all the files of one partition that the check at open took
from the key log as one ``uint64`` Arrow array (the lines' keys decoded and
joined once), so a lookup's search is one ``is_in`` over the array, and only
the few matching positions are mapped back to their files.

The table never decides what a file holds beyond what its line (vouched for
as :class:`~otel_replay.query.files.FileTriage` does) says: a file is in a
table at the (size, mtime) it was checked at, and :class:`FileTriage` drops it
from the table the moment it checks that file again.
"""

from __future__ import annotations

import struct
import sys
from bisect import bisect_right
from collections.abc import Iterable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from otel_replay.exporters.id_keys import id_key

__all__ = ["NATIVE_KEYS", "KeyTable", "probe_array"]

NATIVE_KEYS = sys.byteorder == "little" and struct.calcsize("Q") == 8
"""Whether the stored key layout (little-endian uint64) is this machine's: only then are keys read in place."""


def probe_array(wanted: Iterable[tuple[str, str]], extra: Iterable[int] = ()) -> pa.Array:
    """The keys of ``wanted`` ((kind, id) pairs) and of ``extra`` as a ``uint64`` array to search tables with."""
    return pa.array(sorted({id_key(kind, value) for kind, value in wanted}.union(extra)), pa.uint64())


class KeyTable:
    """The keys of several files of one partition, in one array; see the module docstring.

    ``paths`` and ``packed`` go together: each file's keys as packed 8-byte
    little-endian integers (its key log line's base64, decoded). :attr:`held` counts the
    files :class:`~otel_replay.query.files.FileTriage` still answers from this table.
    """

    __slots__ = ("held", "keys", "paths", "starts")

    def __init__(self, paths: Sequence[str], packed: Sequence[bytes]) -> None:
        """Join the keys of ``paths`` (``packed[i]`` the keys of ``paths[i]``)."""
        if not NATIVE_KEYS:  # the array is the packed bytes read in place
            raise ValueError("key tables need little-endian 64-bit integers")
        starts = []
        at = 0
        for keys in packed:
            starts.append(at)
            at += len(keys) >> 3
        self.paths = list(paths)
        self.starts = starts
        self.keys = pa.Array.from_buffers(pa.uint64(), at, [None, pa.py_buffer(b"".join(packed))])
        self.held = len(self.paths)

    def __len__(self) -> int:
        """How many keys the table holds (the files' keys added up)."""
        return len(self.keys)

    def holding(self, probes: pa.Array) -> set[str]:
        """The files of this table holding any of ``probes`` (a ``uint64`` array, see :func:`probe_array`)."""
        if not len(self.keys) or not len(probes):
            return set()
        found = pc.indices_nonzero(pc.is_in(self.keys, value_set=probes)).to_pylist()
        return {self.paths[bisect_right(self.starts, at) - 1] for at in found}

    def keys_of(self, path: str) -> frozenset[int]:
        """The keys of ``path`` (one of :attr:`paths`) as a set."""
        index = self.paths.index(path)
        end = self.starts[index + 1] if index + 1 < len(self.starts) else len(self.keys)
        return frozenset(self.keys.slice(self.starts[index], end - self.starts[index]).to_pylist())
