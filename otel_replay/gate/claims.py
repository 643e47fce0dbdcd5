"""Durable, cross-process claims that make compensation happen at most once.

Before the gate asks a rail to compensate a receipt it takes a *claim*: a
small JSON file under ``<dataset>/_compensations/`` named after the receipt's
idempotency key. Claimants first ``flock`` the key's lock file (``<key>.lock``, never
replaced), so only one at a time looks at or changes a claim, and the lock is
held while the rail runs and released by the kernel if the claimant dies. So:

* a second claimant, in this process or another, finds the file and gets
  :class:`~otel_replay.errors.CompensationInProgress` ("being compensated by …",
  not done yet) while the lock is held, or
  :class:`~otel_replay.errors.AlreadyCompensated` ("already compensated by … at …") once done;
* a claimant that crashed between its claim and the rail's answer leaves an
  unlocked claim in state ``claimed``: the next claimant gets
  :class:`~otel_replay.errors.CompensationPending` naming the crash, and may
  resume it explicitly (``resume=True``) with the same idempotency key, which
  a rail that honours idempotency keys deduplicates;
* a rail that raised leaves state ``failed`` with the error, resumable the same way.

Every state is written to a temporary file, fsynced and renamed over the
claim, so a reader sees the old state or the new one, never a torn file. A
claim file that cannot be read (damaged) may record a refund already made, so
it is never retried, not even with ``resume=True``: the error names the file.

On an object store (an ``s3://`` dataset) the claim is the object
``<prefix>/_compensations/<key>.json`` and the lock is an
:class:`~otel_replay.storage.lease.ObjectLease` (``<prefix>/.locks/compensation-<key>.lease``):
created with a conditional PUT (``If-None-Match: *``), renewed while the rail
runs, taken over only once its holder stopped renewing it for ``ttl_seconds``
(so a crashed claimant blocks its receipt for that long before the claim
shows as pending). Every change of the claim object is itself conditional
(``If-None-Match`` / ``If-Match`` on the ETag read), so of two processes on
two hosts exactly one takes a claim.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import hashlib
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from otel_replay._json import strict_loads
from otel_replay.errors import (
    AlreadyCompensated,
    CompensationInProgress,
    CompensationPending,
    DatasetError,
    GateError,
    PayloadError,
)
from otel_replay.exporters.schema import COMPENSATIONS_DIR
from otel_replay.exporters.writer import write_bytes_atomic
from otel_replay.location import Location, resolve
from otel_replay.storage import objects
from otel_replay.storage.lease import ObjectLease
from otel_replay.storage.outcome_claims import claimant

__all__ = ["CLAIMS_DIR", "Claim", "ClaimState", "CompensationClaims", "idempotency_key"]

CLAIMS_DIR = COMPENSATIONS_DIR


class ClaimState(enum.StrEnum):
    """Where a compensation stands."""

    CLAIMED = "claimed"
    DONE = "done"
    FAILED = "failed"


def idempotency_key(decision_id: str | None, receipt_id: str) -> str:
    """The key passed to ``rail.compensate``: stable for one receipt of one decision, 32 hex."""
    text = json.dumps(["otel-replay-compensation", decision_id or "", receipt_id])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass
class Claim:
    """A held claim (``fd`` or, on an object store, ``lease`` holds its lock): see :meth:`CompensationClaims.finish`."""

    key: str
    path: Path | str
    body: dict[str, Any]
    fd: int = -1
    lease: ObjectLease | None = None
    etag: str | None = None  # the claim object's ETag as last written (object store)


def _now() -> str:
    return datetime.now(UTC).isoformat()


LEASE_TTL_SECONDS = 60.0
"""How long an object-store claimant that stopped renewing its lock (crashed) blocks its receipt."""


class CompensationClaims:
    """The claims of one dataset (see the module docstring): files locally, objects on S3.

    Args:
        dataset: the dataset (a local path, ``file://`` or ``s3://`` URI); a
            relative local path is made absolute now, so a later ``chdir``
            does not move the claims.
        ttl_seconds: object store only: how long a claimant's lock outlives
            its last renewal (see :data:`LEASE_TTL_SECONDS`).

    """

    def __init__(self, dataset: str | os.PathLike[str] | Location, *, ttl_seconds: float = LEASE_TTL_SECONDS) -> None:
        """Claims live under ``<dataset>/_compensations/`` (created on first claim)."""
        self.location = resolve(dataset)
        self.ttl_seconds = ttl_seconds
        self._s3: Any = None
        self.directory: Path | str
        if self.location.remote:
            self.directory = f"{self.location.root.rstrip('/')}/{CLAIMS_DIR}"
            self._prefix = "/".join(p for p in (self.location.prefix, CLAIMS_DIR) if p)
        else:
            self.directory = Path(os.path.abspath(self.location.root)) / CLAIMS_DIR

    def _path(self, key: str) -> Path | str:
        if isinstance(self.directory, str):
            return f"{self.directory}/{key}.json"
        return self.directory / f"{key}.json"

    # --- storage: a file per claim locally, an object per claim on S3 ------------------

    def _client(self) -> Any:
        if self._s3 is None:
            self._s3 = objects.client(self.location)
        return self._s3

    def _object_key(self, key: str) -> str:
        return f"{self._prefix}/{key}.json"

    def _read(self, key: str) -> tuple[str | None, str | None]:
        """The stored claim's text and (object store) ETag; ``(None, None)`` when there is none."""
        if self.location.remote:
            stored = objects.get(self._client(), self.location, self._object_key(key))
            if stored is None:
                return None, None
            return stored.body.decode("utf-8", "replace"), stored.etag
        try:
            return Path(self._path(key)).read_text(encoding="utf-8", errors="replace"), None
        except FileNotFoundError:
            return None, None

    def _parse(self, key: str, text: str) -> dict[str, Any]:
        try:
            body = strict_loads(text, where=f"compensation claim {self._path(key)}")
        except PayloadError:
            return {"state": "unreadable", "key": key}
        return body if isinstance(body, dict) else {"state": "unreadable", "key": key}

    def state(self, key: str) -> dict[str, Any] | None:
        """The stored claim for ``key``, or ``None``; a damaged one has state ``unreadable``."""
        text, _ = self._read(key)
        return None if text is None else self._parse(key, text)

    def _lock(self, key: str) -> Claim | None:
        """Take ``key``'s lock; ``None`` when another claimant holds it."""
        if self.location.remote:
            lease = ObjectLease(self.location, f"compensation-{key}", ttl_seconds=self.ttl_seconds)
            if not lease.acquire():
                return None
            return Claim(key, self._path(key), {}, lease=lease)
        assert isinstance(self.directory, Path)
        self.directory.mkdir(parents=True, exist_ok=True)
        # The lock file is never replaced, so every claimant (thread or process) locks the same inode.
        fd = os.open(self.directory / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return Claim(key, self._path(key), {}, fd)

    def claim(self, key: str, *, decision_id: str | None, receipt_id: str, resume: bool = False) -> Claim:
        """Take the claim for ``key`` before calling the rail.

        Raises:
            AlreadyCompensated: it is done.
            CompensationInProgress: another claimant holds it right now (a
                subclass of ``AlreadyCompensated``; not done yet).
            CompensationPending: an earlier claimant crashed or its rail raised;
                pass ``resume=True`` to take it over (same idempotency key).
            GateError: the stored claim is damaged (it may record a refund
                already made, so it is not retried, even with ``resume``).

        """
        claim = self._lock(key)
        if claim is None:
            holder = self.state(key)
            # The holder may not have written its claim yet: it holds the lock, which is what counts.
            who = "another claimant right now" if holder is None else (
                f"{holder.get('claimant', 'another claimant')} since {holder.get('claimed_at', '?')}"
            )
            raise CompensationInProgress(
                f"receipt {receipt_id} is being compensated by {who} (not done yet: run again once it "
                "finished to see how it ended); not compensating it again"
            ) from None
        try:
            text, claim.etag = self._read(key)
            held = None if text is None else self._parse(key, text)
            body: dict[str, Any] = {
                "state": ClaimState.CLAIMED.value,
                "key": key,
                "decision_id": decision_id,
                "receipt_id": receipt_id,
                "claimant": claimant(),
                "claimed_at": _now(),
            }
            if held is not None:
                self._refuse(held, key, receipt_id, resume=resume, path=claim.path)
                body["resumed_from"] = {k: held.get(k) for k in ("claimant", "claimed_at", "state", "error")}
            claim.body = body
            self._write(claim, body, receipt_id=receipt_id)
            return claim
        except BaseException:
            self.release(claim)
            raise

    @staticmethod
    def _refuse(held: dict[str, Any], key: str, receipt_id: str, *, resume: bool, path: Path | str) -> None:
        state = held.get("state")
        if state == ClaimState.DONE.value:
            raise AlreadyCompensated(
                f"receipt {receipt_id} was already compensated by {held.get('claimant', '?')} "
                f"at {held.get('finished_at', '?')} ({held.get('executed', 'done')}); not compensating it again"
            )
        if state not in (ClaimState.CLAIMED.value, ClaimState.FAILED.value):
            raise GateError(
                f"compensation claim {path} for receipt {receipt_id} is unreadable (state {state!r}); it may "
                f"record a refund already made, so it is not retried: check the rail for idempotency key {key}, "
                "then move the claim away to compensate again"
            )
        if resume:
            return
        why = (
            f"its rail call failed: {held.get('error')}"
            if state == ClaimState.FAILED.value
            else "the claimant stopped before the rail answered (crashed?)"
        )
        raise CompensationPending(
            f"receipt {receipt_id} was claimed for compensation by {held.get('claimant', '?')} "
            f"at {held.get('claimed_at', '?')} but never finished: {why}. Check the rail for idempotency "
            f"key {key}, then resume (--resume / resume=True) to retry with the same key"
        )

    def _write(self, claim: Claim, body: dict[str, Any], *, receipt_id: str, final: bool = False) -> None:
        text = json.dumps(body, sort_keys=True)
        if self.location.remote:
            self._put(claim, text.encode(), receipt_id=receipt_id, final=final)
            return
        assert isinstance(self.directory, Path) and isinstance(claim.path, Path)
        write_bytes_atomic(text.encode(), claim.path)

    def _put(self, claim: Claim, data: bytes, *, receipt_id: str, final: bool = False) -> None:
        """Write the claim object only if it is as this claimant last saw it (compare-and-swap on its ETag).

        ``final``: the rail has answered, so how it ended is recorded even over
        a claim changed meanwhile (once, on the ETag read again).
        """
        s3, key = self._client(), self._object_key(claim.key)
        try:
            claim.etag = objects.put_if(s3, self.location, key, data, claim.etag)
            return
        except objects.Conflict:
            if final:
                seen = objects.get(s3, self.location, key)
                try:
                    claim.etag = objects.put_if(s3, self.location, key, data, seen.etag if seen else None)
                    return
                except objects.Conflict:
                    raise DatasetError(
                        f"compensation claim {claim.path} kept changing; could not record that receipt {receipt_id} "
                        f"ended {json.loads(data).get('state')}"
                    ) from None
            # Changed under us: our lock expired (no renewal for ttl_seconds) and another claimant took over.
            current = self.state(claim.key) or {}
            done = current.get("state") == ClaimState.DONE.value
            raise (AlreadyCompensated if done else CompensationInProgress)(
                f"receipt {receipt_id}: its compensation claim {claim.path} was changed by "
                f"{current.get('claimant', 'another claimant')} (state {current.get('state', '?')}) while this "
                "claimant's lock had lapsed; not compensating it again"
            ) from None

    def finish(self, claim: Claim, state: ClaimState, **details: Any) -> None:
        """Record how the compensation ended (durably), then release the claim."""
        body = {**claim.body, **details, "state": state.value, "finished_at": _now()}
        try:
            self._write(claim, body, receipt_id=str(claim.body.get("receipt_id")), final=True)
        finally:
            self.release(claim)

    def release(self, claim: Claim) -> None:
        """Drop the lock without changing the stored state (an interrupted claim stays ``claimed``)."""
        if claim.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(claim.fd)
            claim.fd = -1
        if claim.lease is not None:
            lease, claim.lease = claim.lease, None
            with contextlib.suppress(DatasetError):
                lease.release()  # a lease that could not be deleted expires after ttl_seconds
