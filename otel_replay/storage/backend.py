"""The storage backend seam: file operations on a dataset, local or on an object store, behind one interface.

Storage code asks a :class:`Backend` (from :func:`backend_for`) to list,
read, write or delete a file, and never asks where the dataset lives:

- :class:`LocalBackend`: a directory. A write goes to a temp file that is
  fsynced, renamed over the target, and the directory fsynced (the
  directory above as well, for a directory the write just made);
- :class:`ObjectBackend`: ``s3://bucket/prefix``, through pyarrow's S3
  filesystem (one ``PUT`` writes an object whole: there is nothing to
  rename) and boto3 for deletes (pyarrow leaves directory markers behind).
  Conditional writes, the compare-and-swap of manifests and leases, stay in
  :mod:`.objects`: they have no local counterpart but ``flock`` and ``rename``.

Paths are in the location's form: a local path, or an ``s3://`` URL.

Where the two differ in what they can do, a backend says so by name, and
callers ask that, not where the data is: :attr:`Backend.directory` (a
directory of this machine: files can be locked, checked and renamed in
place), :attr:`Backend.keeps_local_log` (the dataset can hold its own
write-ahead log), :attr:`Backend.immutable_files` (a name is written once,
so what was read of a file stands), :attr:`Backend.snapshots_listing` (a
listing costs requests: take one per refresh and reuse it), and
:meth:`Backend.local_dir` (where state that needs a local disk lives).

An operation that works differently as a whole on the two (compaction,
retention, the write of a finished Parquet table) has one implementation
per backend, named side by side in a :class:`~otel_replay.location.PerBackend`
and picked from the location where it starts.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Protocol

import pyarrow.fs as pafs

from otel_replay.errors import DatasetError
from otel_replay.exporters.writer import fsync_dir, write_bytes_atomic
from otel_replay.location import Location, PerBackend

from . import objects

__all__ = ["Backend", "LocalBackend", "ObjectBackend", "backend_for", "local_size"]


def local_size(path: str) -> int | None:
    """The size of the local file ``path``, ``None`` when it cannot be found or read."""
    try:
        return os.stat(path).st_size
    except OSError:
        return None


class Backend(Protocol):
    """File operations on one dataset (see the module docstring)."""

    location: Location
    directory: Path | None
    """The dataset as a directory of this machine (files locked, checked, renamed in place); ``None``: not one."""
    keeps_local_log: bool
    """Whether the dataset can hold its own write-ahead log (``<dataset>/_wal``: an fsync there makes it durable)."""
    immutable_files: bool
    """Whether a file is written once under its name and never rewritten, so what was read of it stands."""
    snapshots_listing: bool
    """Whether a listing costs requests, so a reader takes one per refresh and answers lookups from it."""

    def local_dir(self, name: str) -> Path:
        """Where this dataset's ``name`` state that needs a local disk (an fsync, a lock, SQLite) lives."""

    def stamp(self, path: str) -> tuple[int, int]:
        """(size, mtime in ns) of ``path`` asked now; raises ``FileNotFoundError`` when it does not exist."""

    def listed_stamp(self, path: str) -> tuple[int, int]:
        """:meth:`stamp`, from the last listing that saw ``path`` when the backend keeps one (no request)."""

    def files_under(self, path: str) -> list[pafs.FileInfo]:
        """Every file below ``path``, recursively; ``[]`` when nothing is there."""

    def path_of(self, info: pafs.FileInfo) -> str:
        """The path, in the location's form, of a file :meth:`files_under` listed."""

    def subdirectories(self, path: str) -> set[str]:
        """The names of the directories right below ``path`` (on an object store: the prefixes holding objects)."""

    def source(self, path: str) -> Any:
        """What pyarrow's Parquet readers take for ``path``: the path itself, or a file over the cached object.

        Raises ``FileNotFoundError`` (an ``OSError``) when ``path`` does not exist.
        """

    def open_input(self, path: str) -> Any:
        """``path`` opened for random access, uncached (for a file read once, whole)."""

    def read_bytes(self, path: str) -> bytes | None:
        """The content of ``path``, ``None`` when it does not exist."""

    def size(self, path: str) -> int | None:
        """The size of ``path`` in bytes (on an object store, from the last listing if any); ``None``: not found."""

    def write_atomic(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` so that readers see the old content or the new, never part of it; durable.

        Raises ``OSError`` or ``pyarrow.ArrowException`` when the write fails.
        """

    def delete(self, path: str) -> bool:
        """Delete the file at ``path``; ``True`` when it was there."""


class LocalBackend:
    """A dataset in a local directory."""

    keeps_local_log = True
    immutable_files = False  # a file may be replaced under its name: a verdict holds for one (size, mtime)
    snapshots_listing = False

    def __init__(self, location: Location) -> None:
        """The backend of the local ``location``."""
        self.location = location
        self.directory: Path | None = Path(location.root)

    def local_dir(self, name: str) -> Path:
        """``<dataset>/_<name>``."""
        return Path(self.location.root) / f"_{name}"

    def stamp(self, path: str) -> tuple[int, int]:
        """(size, mtime in ns) from ``stat``; an unreadable path raises its ``OSError``."""
        st = os.stat(path)
        return st.st_size, st.st_mtime_ns

    def listed_stamp(self, path: str) -> tuple[int, int]:
        """:meth:`stamp` (a directory listing keeps nothing)."""
        return self.stamp(path)

    def files_under(self, path: str) -> list[pafs.FileInfo]:
        """Every file below ``path``, recursively; ``[]`` when nothing is there."""
        return self.location.files_under(path)

    def path_of(self, info: pafs.FileInfo) -> str:
        """The local path of a listed file."""
        return str(info.path)

    def subdirectories(self, path: str) -> set[str]:
        """The names of the directories right below ``path`` (none when it is not a directory)."""
        root = Path(path)
        if not root.is_dir():
            return set()
        return {p.name for p in root.iterdir() if p.is_dir()}

    def source(self, path: str) -> Any:
        """The path itself (pyarrow opens and memory-maps local files on its own)."""
        return path

    def open_input(self, path: str) -> Any:
        """The path itself."""
        return path

    def read_bytes(self, path: str) -> bytes | None:
        """The content of ``path``, ``None`` when it does not exist."""
        return self.location.read_bytes(path)

    def size(self, path: str) -> int | None:
        """The size of ``path``, ``None`` when it cannot be found or read."""
        return local_size(path)

    def write_atomic(self, path: str, data: bytes) -> None:
        """Temp file, fsync, rename, fsync of the directory and of the one above (it may have just been made)."""
        target = Path(path)
        write_bytes_atomic(data, target)
        fsync_dir(target.parent.parent)

    def delete(self, path: str) -> bool:
        """Unlink ``path``; ``True`` when it was there."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        return True


class ObjectBackend:
    """A dataset on an S3-compatible object store."""

    keeps_local_log = False  # a write-ahead log is made durable by fsync, which needs a local disk
    immutable_files = True  # objects are written once under unique names
    snapshots_listing = True  # a listing is a request per page

    def __init__(self, location: Location) -> None:
        """The backend of the remote ``location``."""
        self.location = location
        self.directory: Path | None = None

    def local_dir(self, name: str) -> Path:
        """``~/.cache/otel-replay/<name>/<digest of the dataset URI>`` (``XDG_CACHE_HOME`` honoured)."""
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        digest = hashlib.sha256(self.location.root.encode()).hexdigest()[:16]
        return Path(cache) / "otel-replay" / name / digest

    def stamp(self, path: str) -> tuple[int, int]:
        """(size, mtime in ns) from one request; raises ``DatasetError`` when the store cannot be asked."""
        found = self.location.stat(path)
        if found is None:
            raise FileNotFoundError(path)
        return found

    def listed_stamp(self, path: str) -> tuple[int, int]:
        """From the last listing that saw the object (an object keeps its size while it exists), else :meth:`stamp`."""
        found = self.location.listed_stat(path)
        if found is None:
            raise FileNotFoundError(path)
        return found

    def files_under(self, path: str) -> list[pafs.FileInfo]:
        """Every object below ``path`` (one paginated listing, remembered for :meth:`source`)."""
        return self.location.files_under(path)

    def path_of(self, info: pafs.FileInfo) -> str:
        """The ``s3://`` URL of a listed object."""
        return f"s3://{info.path}"

    def subdirectories(self, path: str) -> set[str]:
        """The first path segment of every object below ``path``, when it has more than one."""
        prefix = self.location.fs_path(path) + "/"
        heads = (info.path[len(prefix) :].split("/", 1) for info in self.location.files_under(path))
        return {parts[0] for parts in heads if len(parts) > 1}

    def source(self, path: str) -> Any:
        """A file over the object read through the process cache (its size from the last listing, if any)."""
        stamp = self.location.listed_stat(path)
        if stamp is None:
            raise FileNotFoundError(path)
        return self.location.open_object(path, stamp[0])

    def open_input(self, path: str) -> Any:
        """The object opened for random access through pyarrow's S3 filesystem."""
        return self.location.fs.open_input_file(self.location.fs_path(path))

    def read_bytes(self, path: str) -> bytes | None:
        """The object's content, ``None`` when it does not exist."""
        return self.location.read_bytes(path)

    def size(self, path: str) -> int | None:
        """The object's size from the last listing that saw it (else one request); ``None`` when not found."""
        try:
            stamp = self.location.listed_stat(path)
        except DatasetError:
            return None
        return stamp[0] if stamp else None

    def write_atomic(self, path: str, data: bytes) -> None:
        """One ``PUT``: an object is replaced whole or not at all."""
        with self.location.fs.open_output_stream(self.location.fs_path(path)) as out:
            out.write(data)

    def delete(self, path: str) -> bool:
        """Delete the object (through boto3: no directory marker left); ``True`` when it was there."""
        return objects.delete(objects.client(self.location), self.location, path)


_BACKENDS: PerBackend[type[LocalBackend] | type[ObjectBackend]] = PerBackend(local=LocalBackend, objects=ObjectBackend)


def backend_for(location: Location) -> Backend:
    """The backend of ``location`` (see the module docstring)."""
    return _BACKENDS.of(location)(location)
