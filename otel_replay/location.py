"""Where a dataset lives: a local directory or an object-store URI, resolved to (pyarrow filesystem, path).

Accepted: a local path (``./traces``, ``/data/traces``), ``file:///abs/path``,
and ``s3://bucket/prefix`` (pyarrow's ``S3FileSystem``). The S3 endpoint,
region and credentials come from the standard AWS variables:
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (an S3-compatible server such as
MinIO), ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN`` or ``AWS_PROFILE``.

Paths of a remote dataset are kept in URL form (``s3://bucket/key``): that
string is what DuckDB reads (through :func:`register_with`), what messages
name, and what :meth:`Location.fs_path` turns into a pyarrow path.

A bad location fails at once with one line naming the URI: an unknown scheme,
a missing bucket, no credentials, an unreachable endpoint.
"""

from __future__ import annotations

import collections
import io
import os
import re
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Generic, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from otel_replay.errors import ConfigError, DatasetError

__all__ = ["Location", "PerBackend", "is_remote", "local_root_problem", "register_with", "resolve", "s3_endpoint"]

SUPPORTED = "a local path, file:///absolute/path or s3://bucket/prefix"
_listed: dict[str, tuple[int, int]] = {}  # remote object -> (size, mtime ns) from the latest listing
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)", re.DOTALL)
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
_T = TypeVar("_T")


def s3_endpoint() -> str | None:
    """The S3 endpoint from ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (``None``: AWS itself).

    A blank value is unset, as the AWS SDKs read it.

    Raises:
        ConfigError: the value holds whitespace or names a scheme other than
            ``http://`` / ``https://`` (one line naming the variable; pyarrow
            would say only "Invalid DNS Label found in URI host").

    """
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        raw = os.environ.get(name, "")
        value = raw.strip()
        if not value:
            continue
        scheme = _SCHEME.match(value)
        if any(c.isspace() for c in value) or (scheme is not None and scheme.group(1).lower() not in ("http", "https")):
            raise ConfigError(f"{name}={raw!r} must be an http:// or https:// URL (an S3-compatible server)")
        return value
    return None


def _region() -> str | None:
    region = os.environ.get("AWS_REGION", "").strip() or os.environ.get("AWS_DEFAULT_REGION", "").strip()
    return region or None


@lru_cache(maxsize=8)
def _s3(endpoint: str | None, region: str | None, key: str | None, secret: str | None) -> pafs.S3FileSystem:
    """One pyarrow S3 filesystem per (endpoint, region, key) seen in the environment."""
    options: dict[str, Any] = {
        "connect_timeout": 5.0,
        "request_timeout": 60.0,
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=3),
    }
    if endpoint:
        options["endpoint_override"] = endpoint
        if endpoint.startswith("http://"):
            options["scheme"] = "http"
    if region:
        options["region"] = region
    return pafs.S3FileSystem(**options)


@dataclass(frozen=True)
class Location:
    """A resolved dataset location: ``uri`` as given, the pyarrow ``fs``, and ``root`` in URL form.

    ``root`` is a local path string for a local dataset, ``s3://bucket/prefix``
    for a remote one. Every path this class hands out is in the same form.
    """

    uri: str
    fs: pafs.FileSystem
    root: str
    remote: bool

    def __str__(self) -> str:
        return self.uri

    @property
    def bucket(self) -> str:
        """The bucket of a remote dataset (``""`` for a local one)."""
        return self.root[len("s3://") :].split("/", 1)[0] if self.remote else ""

    @property
    def prefix(self) -> str:
        """The key prefix of a remote dataset inside its bucket (no slashes at either end; may be ``""``)."""
        if not self.remote:
            return ""
        parts = self.root[len("s3://") :].split("/", 1)
        return parts[1] if len(parts) > 1 else ""

    def join(self, *parts: str) -> str:
        """``root`` joined with ``parts`` (``/``-separated, in the location's URL form)."""
        if not self.remote:
            return os.path.join(self.root, *parts)
        return "/".join([self.root, *(p.strip("/") for p in parts if p)])

    def fs_path(self, path: str) -> str:
        """The pyarrow path of ``path`` (``bucket/key`` for S3; the path itself for local files)."""
        return path[len("s3://") :] if self.remote and path.startswith("s3://") else path

    def key(self, path: str) -> str:
        """The object key of the remote ``path`` (without the bucket)."""
        return self.fs_path(path).split("/", 1)[1]

    def open_object(self, path: str, size: int | None = None) -> Any:
        """A file object (``read``, ``seek``) over the remote object ``path``, read through the process cache."""
        return _PositionalFile(_cached_object(self.fs, self.fs_path(path), size))

    def native(self, path: str) -> Path | str:
        """``path`` as the package hands paths around: a :class:`~pathlib.Path` locally, the ``s3://`` URL remotely."""
        return path if self.remote else Path(path)

    def make_dirs(self, path: str | os.PathLike[str]) -> None:
        """Make the directory ``path`` and those above it (nothing on an object store: it has no directories).

        Raises:
            OSError: a local directory cannot be made.

        """
        if not self.remote:
            os.makedirs(path, exist_ok=True)

    def local_root(self) -> Path:
        """The root of a local dataset as a :class:`~pathlib.Path`."""
        if self.remote:
            raise DatasetError(f"dataset {self.uri} is not a local directory")
        return Path(self.root)

    # --- object operations (remote datasets) -----------------------------------
    def files_under(self, path: str) -> list[pafs.FileInfo]:
        """Every file below ``path``, recursively (one paginated listing); ``[]`` when nothing is there."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.fs_path(path), recursive=True, allow_not_found=True))
        except (OSError, pa.ArrowException) as exc:
            raise self.error(f"cannot list {path}", exc) from exc
        files = [info for info in infos if info.type == pafs.FileType.File]
        if self.remote:
            if len(_listed) > 500_000:
                _listed.clear()
            _listed.update({info.path: (int(info.size or 0), int(info.mtime_ns or 0)) for info in files})
        return files

    def listed_stat(self, path: str) -> tuple[int, int] | None:
        """Like :meth:`stat`, from the last listing that saw the object when there is one (no request).

        For a remote object only: objects are immutable, so a listed size is
        its size for as long as it exists (a deleted one fails when read).
        """
        found = _listed.get(self.fs_path(path)) if self.remote else None
        return found if found is not None else self.stat(path)

    def stat(self, path: str) -> tuple[int, int] | None:
        """(size, mtime in ns) of the file at ``path``, ``None`` when it does not exist."""
        try:
            info = self.fs.get_file_info(self.fs_path(path))
        except (OSError, pa.ArrowException) as exc:
            raise self.error(f"cannot stat {path}", exc) from exc
        if info.type != pafs.FileType.File:
            return None
        return int(info.size or 0), int(info.mtime_ns or 0)

    def read_bytes(self, path: str) -> bytes | None:
        """The content of ``path``, ``None`` when it does not exist."""
        try:
            with self.fs.open_input_stream(self.fs_path(path)) as stream:
                return bytes(stream.read())
        except FileNotFoundError:
            return None
        except (OSError, pa.ArrowException) as exc:
            if "NO_SUCH_KEY" in str(exc) or "does not exist" in str(exc):
                return None
            raise self.error(f"cannot read {path}", exc) from exc

    def error(self, what: str, exc: BaseException) -> DatasetError:
        """A one-line :class:`DatasetError` for a failed storage call, saying why in plain words."""
        return DatasetError(f"dataset {self.uri}: {what}: {_why(str(exc), self)}")

    def check(self) -> None:
        """Fail now, in one line, when the dataset cannot be reached (remote: credentials, endpoint, bucket).

        Raises:
            DatasetError: no credentials, the endpoint does not answer, or the bucket does not exist.

        """
        if not self.remote:
            return
        _check_credentials(self)
        try:
            info = self.fs.get_file_info(self.bucket)
        except (OSError, pa.ArrowException) as exc:
            raise DatasetError(f"dataset {self.uri}: {_why(str(exc), self)}") from exc
        if info.type == pafs.FileType.NotFound:
            raise DatasetError(
                f"dataset {self.uri}: bucket {self.bucket!r} does not exist at {s3_endpoint() or 'AWS S3'}"
            )


@dataclass(frozen=True)
class PerBackend(Generic[_T]):
    """One operation's two implementations, for a local directory and for an object store, chosen from a location.

    Storage code that must work differently on the two (compaction,
    retention, the write of a finished table) names both implementations
    once, beside each other, and calls ``impl.of(location)(...)``: whether
    a dataset is local is asked here, not across the package.
    """

    local: _T
    """The implementation for a dataset in a local directory (``file://`` URIs included)."""
    objects: _T
    """The implementation for a dataset on an object store (``s3://``)."""

    def of(self, location: Location) -> _T:
        """The implementation for ``location``."""
        return self.objects if location.remote else self.local


def _why(message: str, location: Location) -> str:
    first = message.splitlines()[0] if message else "unknown error"
    where = s3_endpoint() or "AWS S3"
    if "NETWORK_CONNECTION" in first or "Could not connect" in first or "resolve host" in first:
        return f"cannot reach the S3 endpoint {where} (set AWS_ENDPOINT_URL for an S3-compatible server): {first}"
    if "ACCESS_DENIED" in first or "InvalidAccessKeyId" in first or "SignatureDoesNotMatch" in first:
        return f"access denied by {where} (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_PROFILE): {first}"
    if "NO_SUCH_BUCKET" in first:
        return f"bucket {location.bucket!r} does not exist at {where}"
    return first


def _check_credentials(location: Location) -> None:
    """Refuse at once when the AWS credential chain finds nothing (boto3's chain, when boto3 is installed)."""
    if os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"):
        return
    try:
        # optional dependency: boto3 (the `s3` extra)
        import boto3
    except ImportError:  # pyarrow's own chain decides; its error is translated by _why
        return
    if boto3.Session().get_credentials() is None:
        raise DatasetError(
            f"dataset {location.uri}: no AWS credentials found "
            "(set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
        )


_NOT_YET_CONVERTED = ("_wal", "_ingest", "logs")
"""A dataset root holding one of these is one whose spans are not written yet (or that holds log records only)."""


def local_root_problem(dataset: str | os.PathLike[str], path: Path) -> str | None:
    """Why the local directory ``path`` (given as ``dataset``) is not a dataset root a command may use, or ``None``.

    ``DATASET/spans``, a ``date=`` folder or an unrelated directory would
    read as an empty dataset ("OK, 0 records") and compact as one ("dropped
    0 partitions"): a root has ``spans/``, or ``_wal``/``_ingest`` while its
    spans are not written yet.
    """
    if not path.exists():
        return f"dataset {dataset} does not exist (write spans there first, or pass --dataset)"
    if not path.is_dir():
        return f"dataset {dataset} is a file, not a directory"
    if not os.access(path, os.R_OK | os.X_OK):
        return f"dataset {dataset} is not readable (permission denied)"
    if not (path / "spans").is_dir() and not any((path / marker).is_dir() for marker in _NOT_YET_CONVERTED):
        return f"dataset {dataset} has no spans/ directory (is this the dataset root?)"
    return None


def is_remote(dataset: str | os.PathLike[str] | Location) -> bool:
    """Whether ``dataset`` names an object-store location (cheap: no filesystem is created)."""
    if isinstance(dataset, Location):
        return dataset.remote
    if not isinstance(dataset, str):
        return False
    match = _SCHEME.fullmatch(dataset)
    return match is not None and match.group(1).lower() != "file"


def resolve(dataset: str | os.PathLike[str] | Location) -> Location:
    """Resolve a dataset path or URI (see the module docstring); nothing is contacted yet (see :meth:`Location.check`).

    Raises:
        ConfigError: an unknown scheme, an ``s3://`` URI without a valid bucket,
            or a ``file://`` URI that is not absolute.

    """
    if isinstance(dataset, Location):
        return dataset
    if not isinstance(dataset, str):
        path = os.fspath(dataset)
        return Location(path, pafs.LocalFileSystem(), path, False)
    match = _SCHEME.fullmatch(dataset)
    if match is None:
        return Location(dataset, pafs.LocalFileSystem(), dataset, False)
    scheme, rest = match.group(1).lower(), match.group(2)
    if scheme == "file":
        if not rest.startswith("/"):
            raise ConfigError(f"dataset URI {dataset}: a file:// URI needs an absolute path (file:///data/traces)")
        return Location(dataset, pafs.LocalFileSystem(), rest, False)
    if scheme != "s3":
        raise ConfigError(f"dataset URI {dataset}: unsupported scheme {scheme!r}; give {SUPPORTED}")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ConfigError(f"dataset URI {dataset}: no bucket; expected s3://bucket/prefix")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise ConfigError(f"dataset URI {dataset}: {bucket!r} is not a valid S3 bucket name")
    segments = [s for s in prefix.split("/") if s]
    if any(s in (".", "..") or s.startswith(".") for s in segments) or "?" in prefix or "#" in prefix:
        raise ConfigError(f"dataset URI {dataset}: the prefix may not hold '.', '..', dot-names, '?' or '#'")
    root = "/".join(["s3:/", bucket, *segments])
    fs = _s3(s3_endpoint(), _region(), os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY"))
    return Location(dataset, fs, root, True)


class _PositionalFile(io.RawIOBase):
    """A read-only file over a pyarrow random-access file, safe for DuckDB's threads.

    DuckDB reads a file registered through a Python filesystem as ``seek``
    then ``read`` on one shared handle from several threads at once; with one
    shared position, two threads reading two row groups interleave and one of
    them decodes the other's bytes (DuckDB then fails with a Thrift error such
    as "don't know what type"). Here each thread keeps its own position and
    every read is a positional ``read_at``, which pyarrow makes thread-safe.
    """

    def __init__(self, native: Any) -> None:
        super().__init__()
        self._native = native
        self._size = int(native.size())
        self._where = threading.local()

    def _pos(self) -> int:
        return int(getattr(self._where, "pos", 0))

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    @property
    def size(self) -> int:
        """The file's size in bytes."""
        return self._size

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos(), io.SEEK_END: self._size}[whence]
        self._where.pos = max(0, base + offset)
        return int(self._where.pos)

    def tell(self) -> int:
        return self._pos()

    def read(self, size: int | None = -1) -> bytes:
        pos = self._pos()
        if size is None or size < 0:
            size = max(0, self._size - pos)
        data = self._native.read_at(size, pos)
        self._where.pos = pos + len(data)
        return bytes(data)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._native.close()
        super().close()


OBJECT_CACHE_BYTES = 256 * 2**20
"""Bytes of object data a process keeps in memory for reads through DuckDB (an LRU of whole objects and blocks)."""
WHOLE_OBJECT_BYTES = 8 * 2**20
"""An object up to this size is fetched whole in one GET (arrival-order files); a bigger one by blocks."""
BLOCK_BYTES = 2**20
"""The block a bigger object is fetched in: a lookup reads its footer and one row group, not the whole object."""

_cache: collections.OrderedDict[tuple[str, int, int], pa.Buffer] = collections.OrderedDict()
_cache_bytes = 0
_cache_lock = threading.Lock()


def _cached(key: tuple[str, int, int], fetch: Any) -> pa.Buffer:
    """The cached buffer under ``key`` (path, size, block; -1: the whole object), fetched on a miss."""
    global _cache_bytes
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    data: pa.Buffer = fetch()
    with _cache_lock:
        if key not in _cache and data.size <= OBJECT_CACHE_BYTES:
            _cache[key] = data
            _cache_bytes += data.size
            while _cache_bytes > OBJECT_CACHE_BYTES and _cache:
                _, dropped = _cache.popitem(last=False)
                _cache_bytes -= dropped.size
    return data


class _Blocks:
    """Random access to a big object through cached blocks (``read_at`` only; safe across threads)."""

    def __init__(self, fs: pafs.FileSystem, path: str, size: int) -> None:
        self._fs, self._path, self._size = fs, path, size
        self._native: Any = None
        self._lock = threading.Lock()

    def size(self) -> int:
        return self._size

    def _block(self, index: int, block: int) -> pa.Buffer:
        def fetch() -> pa.Buffer:
            with self._lock:
                if self._native is None:  # opened at the first block not in the cache
                    self._native = self._fs.open_input_file(self._path)
                native = self._native
            start = index * block
            return pa.py_buffer(native.read_at(min(block, self._size - start), start))

        return _cached((self._path, self._size, index), fetch)

    def read_at(self, nbytes: int, offset: int) -> bytes:
        end = min(self._size, offset + max(0, nbytes))
        if offset >= end:
            return b""
        block = BLOCK_BYTES
        parts = []
        for index in range(offset // block, (end - 1) // block + 1):
            data = memoryview(self._block(index, block))
            lo = max(offset, index * block) - index * block
            hi = min(end, (index + 1) * block) - index * block
            parts.append(data[lo:hi])
        return b"".join(parts)

    def close(self) -> None:
        if self._native is not None:
            self._native.close()


def _cached_object(fs: pafs.FileSystem, path: str, size: int | None = None) -> Any:
    """A random-access reader (``read_at``, ``size``) over the object ``path``, through the process cache.

    DuckDB reads a Parquet file in many small ranges (footer, then column
    chunks); as separate GETs each costs a round trip. Dataset objects are
    written once under unique names, so cached bytes keyed by (path, size)
    never go stale. Objects up to :data:`WHOLE_OBJECT_BYTES` are fetched whole;
    bigger ones in :data:`BLOCK_BYTES` blocks, so a point lookup in a large
    compacted file reads its footer and the row group it needs, not all of it.
    """
    if size is None:
        size = int(fs.get_file_info(path).size or 0)
    if size > WHOLE_OBJECT_BYTES:
        return _Blocks(fs, path, size)

    def fetch() -> pa.Buffer:
        with fs.open_input_file(path) as native:
            return pa.py_buffer(native.read_at(size, 0))

    return pa.BufferReader(_cached((path, size, -1), fetch))


@lru_cache(maxsize=1)
def _wrapper_class() -> Any:
    # optional dependency: fsspec (the `s3` extra)
    from fsspec.implementations.arrow import ArrowFSWrapper

    class ThreadSafeArrowFS(ArrowFSWrapper):
        """fsspec's wrapper of a pyarrow filesystem: positional reads, cached objects and object infos."""

        def __init__(self, fs: pafs.FileSystem, **kwargs: Any) -> None:
            super().__init__(fs, **kwargs)
            self._infos: dict[str, pafs.FileInfo] = {}

        def _info(self, path: str) -> pafs.FileInfo:
            # Dataset objects are immutable: one HEAD per object, not one per DuckDB call (info, exists,
            # size, modified, open). A deleted object (compaction's grace expired) fails at the read,
            # and Store then refreshes its file list.
            path = self._strip_protocol(path)
            found = self._infos.get(path)
            if found is None:
                found = self.fs.get_file_info(path)
                if found.type == pafs.FileType.File:
                    if len(self._infos) > 200_000:
                        self._infos.clear()
                    self._infos[path] = found
            return found

        def info(self, path: str, **kwargs: Any) -> Any:
            return self._make_entry(self._info(path))

        def modified(self, path: str) -> Any:
            return self._info(path).mtime

        def _open(self, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
            if mode != "rb":
                return super()._open(path, mode, *args, **kwargs)
            info = self._info(path)
            return _PositionalFile(_cached_object(self.fs, info.path, info.size))

    return ThreadSafeArrowFS


def register_with(con: Any, location: Location) -> None:
    """Let the DuckDB connection ``con`` read ``location``'s ``s3://`` paths through its pyarrow filesystem.

    DuckDB's own ``httpfs`` extension is not needed (it is downloaded at run
    time, which a closed network forbids): the pyarrow filesystem is wrapped
    for ``fsspec`` and registered. Reads are positional (DuckDB's threads
    share a handle) and go through a bounded in-memory cache
    (:data:`OBJECT_CACHE_BYTES`): small objects whole in one GET, big ones by
    blocks; each object's size is asked once: dataset objects are immutable.

    Raises:
        DatasetError: ``fsspec`` is not installed (``pip install 'otel-replay[s3]'``).

    """
    if not location.remote:
        return
    try:
        wrapper = _wrapper_class()
    except ImportError as exc:
        raise DatasetError(
            f"dataset {location.uri}: reading s3:// datasets needs fsspec (pip install 'otel-replay[s3]')"
        ) from exc
    con.register_filesystem(wrapper(location.fs))
