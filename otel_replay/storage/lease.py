"""A per-partition lease: an exclusive ``flock`` so two compactors never rewrite one partition at once.

The lock files live in ``<dataset>/.locks/`` (outside ``spans/``, so dropping
a partition never removes a lock another process holds). The kernel releases
a ``flock`` when its holder exits, crashed or not, so a lease is never left
stuck. That holds on a local filesystem only: on an object store
(``s3://``) :class:`ObjectLease` is a lease object created with a conditional
PUT (``If-None-Match: *``), renewed while held, and taken over (``If-Match``
on the expired object) once its holder stopped renewing it for
``ttl_seconds``; :func:`lease_for` picks the right one.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from otel_replay import _seam
from otel_replay.errors import DatasetError, LeaseLost
from otel_replay.location import Location, resolve

from . import objects
from .backend import backend_for

__all__ = ["DEFAULT_TTL_SECONDS", "LeaseLost", "ObjectLease", "PartitionLease", "lease_for"]

DEFAULT_TTL_SECONDS = 60.0
"""How long an object-store lease lasts without renewal (its holder renews it every third of that)."""


class _Held:
    """``with lease:`` takes it (``DatasetError`` when another process holds it) and gives it back on the way out."""

    def acquire(self, wait: float = 0.0) -> bool:
        """Take the lease; ``False`` when another process holds it (each lease kind says how)."""
        raise NotImplementedError

    def release(self) -> None:
        """Give the lease back."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        if not self.acquire():
            raise DatasetError(f"partition lease {getattr(self, 'path', '')} is held by another process")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class PartitionLease(_Held):
    """Exclusive lease on partition ``name`` (e.g. ``date=2026-01-31``) of ``dataset``.

    ``acquire(wait=0)`` returns ``False`` at once when another process holds
    it; ``wait`` seconds keeps trying. Use as a context manager after a
    successful ``acquire``, or call :meth:`release`.
    """

    def __init__(self, dataset: str | os.PathLike[str], name: str) -> None:
        """Prepare (not take) the lease; see the class docstring."""
        if "/" in name or name.startswith("."):
            raise DatasetError(f"bad partition name {name!r} for a lease")
        self.path = Path(dataset) / ".locks" / f"{name}.lock"
        self._fd: int | None = None

    def confirm(self) -> None:
        """Nothing to re-assert: the kernel holds an ``flock`` until release or exit."""

    @property
    def held(self) -> bool:
        """Whether this object holds the lease."""
        return self._fd is not None

    def acquire(self, wait: float = 0.0) -> bool:
        """Take the lease; ``False`` when another holder kept it for ``wait`` seconds."""
        if self._fd is not None:
            return True
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise DatasetError(f"cannot open the lease file {self.path}: {exc.strerror or exc}") from exc
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.05)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            self._fd = fd
            return True

    def release(self) -> None:
        """Give the lease back (no-op when not held)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)



class ObjectLease(_Held):
    """Exclusive lease on partition ``name`` of a dataset on S3: the object ``<prefix>/.locks/<name>.lease``.

    ``acquire`` creates the object with ``If-None-Match: *``: of two racing
    compactors exactly one succeeds. The holder renews it (``If-Match`` its
    own ETag) every ``ttl_seconds / 3`` on a thread; a holder that crashed
    stops renewing, and once the object is older than ``ttl_seconds`` by the
    *server's* clock (its ``Last-Modified`` against the ``Date`` of the read,
    so client clocks do not matter) another process takes it over with
    ``If-Match`` on the expired ETag: again exactly one wins. :meth:`confirm`
    re-asserts the lease with a conditional write and fails when it was lost,
    so a holder that stalled past its expiry never commits a swap.
    """

    def __init__(
        self, dataset: str | os.PathLike[str] | Location, name: str, *, ttl_seconds: float = DEFAULT_TTL_SECONDS
    ) -> None:
        """Prepare (not take) the lease; see the class docstring."""
        if "/" in name or name.startswith("."):
            raise DatasetError(f"bad partition name {name!r} for a lease")
        if not 0 < ttl_seconds < 10**7:
            raise DatasetError(f"lease ttl_seconds={ttl_seconds!r} must be positive")
        self.location = resolve(dataset)
        self.key = "/".join(p for p in (self.location.prefix, ".locks", f"{name}.lease") if p)
        self.ttl_seconds = ttl_seconds
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.took_over: str | None = None  # the owner of the expired lease this one replaced
        self._s3: Any = None
        self._etag: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def path(self) -> str:
        """The lease object's URL."""
        return f"s3://{self.location.bucket}/{self.key}"

    @property
    def held(self) -> bool:
        """Whether this object holds the lease (as far as its last write knows)."""
        return self._etag is not None

    def _body(self) -> bytes:
        return json.dumps({"owner": self.owner, "ttl_seconds": self.ttl_seconds, "at": time.time()}).encode()

    def acquire(self, wait: float = 0.0) -> bool:
        """Take the lease; ``False`` when a live holder kept it for ``wait`` seconds."""
        if self._etag is not None:
            return True
        if self._s3 is None:
            self._s3 = objects.client(self.location)
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            try:
                self._etag = objects.put_if(self._s3, self.location, self.key, self._body(), None)
                break
            except objects.Conflict:
                pass
            current = objects.get(self._s3, self.location, self.key)
            if current is not None and self._expired(current):
                try:
                    self._etag = objects.put_if(self._s3, self.location, self.key, self._body(), current.etag)
                    self.took_over = _owner(current.body)
                    break
                except objects.Conflict:
                    pass  # another process took it over first
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="otel-replay-lease", daemon=True)
        self._thread.start()
        return True

    def _expired(self, current: objects.Stored) -> bool:
        try:
            ttl = float(json.loads(current.body).get("ttl_seconds", self.ttl_seconds))
        except (ValueError, AttributeError, TypeError):
            ttl = self.ttl_seconds  # an unreadable lease object expires like a default one
        return (current.server_now - current.modified).total_seconds() > ttl

    def confirm(self) -> None:
        """Re-assert the lease now (a conditional write); raise when it was lost (expired and taken over).

        A write that failed ambiguously (it reached S3 but the answer did not
        come back) leaves a stale ETag: when the condition fails, the lease
        object is read, and if it still names this holder its ETag is adopted
        and the write retried, so only a real takeover counts as lost.

        Raises:
            LeaseLost: the lease is no longer held by this process.
            DatasetError: the request failed (the lease may still be held; try again).

        """
        with self._lock:
            if self._etag is None:
                raise LeaseLost(f"partition lease {self.path} is not held (it expired and was taken over)")
            try:
                self._etag = objects.put_if(self._s3, self.location, self.key, self._body(), self._etag)
                return
            except objects.Conflict:
                pass
            current = objects.get(self._s3, self.location, self.key)
            if current is not None and _owner(current.body) == self.owner:
                try:
                    self._etag = objects.put_if(self._s3, self.location, self.key, self._body(), current.etag)
                    return
                except objects.Conflict:
                    pass
            self._etag = None
            raise LeaseLost(f"partition lease {self.path} was lost: it expired and another process took it")

    def _renew_loop(self) -> None:
        """Renew every ``ttl_seconds / 3`` until released or lost; a failed request is retried sooner."""
        with _seam.active(_seam.DIRECT):  # its requests are never the agent's (see _seam.DIRECT)
            self._renew_until_stopped()

    def _renew_until_stopped(self) -> None:
        delay = self.ttl_seconds / 3
        while not self._stop.wait(delay):
            try:
                self.confirm()
            except LeaseLost:
                return
            except Exception:  # a network hiccup or a 5xx: the lease may still be held, so keep trying
                delay = max(0.05, self.ttl_seconds / 12)
            else:
                delay = self.ttl_seconds / 3

    def release(self) -> None:
        """Give the lease back (no-op when not held)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._thread = None
        with self._lock:
            etag, self._etag = self._etag, None
        if etag is not None and not objects.delete_if(self._s3, self.location, self.key, etag):
            try:  # the ETag may be stale (a renewal whose answer was lost): delete it if it is still ours
                current = objects.get(self._s3, self.location, self.key)
                if current is not None and _owner(current.body) == self.owner:
                    objects.delete_if(self._s3, self.location, self.key, current.etag)
            except DatasetError:
                pass  # it expires after ttl_seconds



def _owner(body: bytes) -> str:
    try:
        return str(json.loads(body).get("owner", "?"))
    except (ValueError, AttributeError):
        return "?"


def lease_for(
    dataset: str | os.PathLike[str] | Location, name: str, *, ttl_seconds: float = DEFAULT_TTL_SECONDS
) -> PartitionLease | ObjectLease:
    """The lease for partition ``name`` of ``dataset``: an ``flock`` locally, a conditional-PUT object on S3."""
    location = resolve(dataset)
    if backend_for(location).directory is None:  # no directory to flock a file in
        return ObjectLease(location, name, ttl_seconds=ttl_seconds)
    return PartitionLease(location.root, name)
