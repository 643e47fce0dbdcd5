"""Where compensation claims are kept: one small interface, a directory and an object store behind it.

:class:`~otel_replay.gate.claims.CompensationClaims` decides what a claim
means (who may take it, when it is done, pending or damaged); a
:class:`ClaimStore` only keeps claims and their locks:

- :class:`FileClaimStore`: ``<dataset>/_compensations/<key>.json``, locked
  by ``flock`` on ``<key>.lock`` (never replaced, so every claimant locks
  the same inode; the kernel releases it when the claimant dies); a state
  is written to a temp file, fsynced and renamed over the claim;
- :class:`ObjectClaimStore`: the object ``<prefix>/_compensations/<key>.json``,
  locked by an :class:`~otel_replay.storage.lease.ObjectLease` (a
  conditional-PUT object renewed while held); every write is a conditional
  PUT on the ETag this claimant last saw, so of two writers on two hosts
  exactly one succeeds. A PUT refused because the object already holds
  exactly what it sent was this writer's own (stored, its response lost,
  retried by the client), and counts as written.

:func:`claim_store_for` picks one, once, from what the dataset's storage
backend can do (a directory to lock files in, or not).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from otel_replay._flock import try_lock
from otel_replay.errors import DatasetError
from otel_replay.exporters.schema import COMPENSATIONS_DIR
from otel_replay.exporters.writer import write_bytes_atomic
from otel_replay.location import Location
from otel_replay.storage import objects
from otel_replay.storage.backend import backend_for
from otel_replay.storage.lease import ObjectLease

__all__ = ["Claim", "ClaimChanged", "ClaimStore", "FileClaimStore", "ObjectClaimStore", "claim_store_for"]


@dataclass
class Claim:
    """A held claim (``fd`` or, on an object store, ``lease`` holds its lock): see :meth:`CompensationClaims.finish`."""

    key: str
    path: Path | str
    body: dict[str, Any]
    fd: int = -1
    lease: ObjectLease | None = None
    etag: str | None = None  # the claim object's ETag as last written (object store)


class ClaimChanged(Exception):
    """A claim was changed by another claimant since this one read it (its lock had lapsed)."""


class ClaimStore(Protocol):
    """Keeps the claims of one dataset and their locks (see the module docstring)."""

    directory: Path | str
    """Where the claims are: a directory, or the ``s3://`` URL of their prefix."""

    def path(self, key: str) -> Path | str:
        """Where the claim ``key`` is kept (named in messages)."""

    def read(self, key: str) -> tuple[str | None, str | None]:
        """The stored claim's text and version (an ETag, or ``None``); ``(None, None)`` when there is none."""

    def lock(self, key: str) -> Claim | None:
        """Take ``key``'s lock: a :class:`Claim` holding it, ``None`` when another claimant holds it."""

    def write(self, claim: Claim, data: bytes, *, final: bool) -> None:
        """Store ``data`` as ``claim``'s state, whole or not at all, durably.

        ``final``: the rail has answered, so the state is stored even over a
        claim changed meanwhile (the store tries once more).

        Raises:
            ClaimChanged: another claimant changed the claim since this one read it.

        """

    def release(self, claim: Claim) -> None:
        """Give back ``claim``'s lock (the stored state stays as it is)."""


class FileClaimStore:
    """Claims as files in a directory, locked with ``flock``."""

    def __init__(self, directory: Path) -> None:
        """Claims under ``directory`` (made on the first lock)."""
        self.directory: Path | str = directory
        self._directory = directory

    def path(self, key: str) -> Path:
        """``<directory>/<key>.json``."""
        return self._directory / f"{key}.json"

    def read(self, key: str) -> tuple[str | None, str | None]:
        """The claim file's text (no version: the lock orders writers)."""
        try:
            return self.path(key).read_text(encoding="utf-8", errors="replace"), None
        except FileNotFoundError:
            return None, None

    def lock(self, key: str) -> Claim | None:
        """``flock`` on ``<key>.lock``, without waiting."""
        self._directory.mkdir(parents=True, exist_ok=True)
        # The lock file is never replaced, so every claimant (thread or process) locks the same inode.
        fd = try_lock(self._directory / f"{key}.lock")
        return None if fd is None else Claim(key, self.path(key), {}, fd)

    def write(self, claim: Claim, data: bytes, *, final: bool) -> None:
        """Temp file, fsync, rename over the claim (the held lock means nobody else writes it)."""
        write_bytes_atomic(data, Path(claim.path))

    def release(self, claim: Claim) -> None:
        """Close the lock's descriptor (which drops the ``flock``)."""
        if claim.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(claim.fd)
            claim.fd = -1


class ObjectClaimStore:
    """Claims as objects, locked with a lease object; every write a compare-and-swap on the ETag."""

    def __init__(self, location: Location, *, ttl_seconds: float) -> None:
        """Claims under ``<location>/_compensations/``; a lock outlives its last renewal by ``ttl_seconds``."""
        self.location = location
        self.ttl_seconds = ttl_seconds
        self.directory: Path | str = f"{location.root.rstrip('/')}/{COMPENSATIONS_DIR}"
        self._prefix = "/".join(p for p in (location.prefix, COMPENSATIONS_DIR) if p)
        self._s3: Any = None

    def _client(self) -> Any:
        if self._s3 is None:
            self._s3 = objects.client(self.location)
        return self._s3

    def _key(self, key: str) -> str:
        return f"{self._prefix}/{key}.json"

    def path(self, key: str) -> str:
        """The claim object's ``s3://`` URL."""
        return f"{self.directory}/{key}.json"

    def read(self, key: str) -> tuple[str | None, str | None]:
        """The claim object's text and ETag, in one GET."""
        stored = objects.get(self._client(), self.location, self._key(key))
        if stored is None:
            return None, None
        return stored.body.decode("utf-8", "replace"), stored.etag

    def lock(self, key: str) -> Claim | None:
        """Take the lease ``compensation-<key>`` (a conditional PUT)."""
        lease = ObjectLease(self.location, f"compensation-{key}", ttl_seconds=self.ttl_seconds)
        if not lease.acquire():
            return None
        return Claim(key, self.path(key), {}, lease=lease)

    def write(self, claim: Claim, data: bytes, *, final: bool) -> None:
        """A PUT only if the object is as this claimant last saw it (``If-Match`` / ``If-None-Match``)."""
        s3, key = self._client(), self._key(claim.key)
        try:
            claim.etag = objects.put_if(s3, self.location, key, data, claim.etag)
            return
        except objects.Conflict:
            seen = objects.get(s3, self.location, key)
            if seen is not None and seen.body == data:
                # Changed by this write itself: stored, its response lost, and the PUT retried by the client.
                claim.etag = seen.etag
                return
            if not final:
                raise ClaimChanged(claim.key) from None
        # final: once more, on the ETag read again
        try:
            claim.etag = objects.put_if(s3, self.location, key, data, seen.etag if seen else None)
        except objects.Conflict:
            raise ClaimChanged(claim.key) from None

    def release(self, claim: Claim) -> None:
        """Delete the lease (one that cannot be deleted expires after ``ttl_seconds``)."""
        if claim.lease is not None:
            lease, claim.lease = claim.lease, None
            with contextlib.suppress(DatasetError):
                lease.release()


def claim_store_for(location: Location, *, ttl_seconds: float) -> ClaimStore:
    """The claim store of ``location``: files locked with ``flock`` in a directory, else lease-locked objects.

    A relative local path is made absolute now, so a later ``chdir`` does not move the claims.
    """
    directory = backend_for(location).directory
    if directory is not None:
        return FileClaimStore(Path(os.path.abspath(directory)) / COMPENSATIONS_DIR)
    return ObjectClaimStore(location, ttl_seconds=ttl_seconds)
