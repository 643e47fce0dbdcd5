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

The two ways of keeping claims are :mod:`otel_replay.gate.claim_stores`;
this module holds what a claim means, the same for both.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
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
from otel_replay.gate.claim_stores import Claim, ClaimChanged, claim_store_for
from otel_replay.location import Location, resolve
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
        self._store = claim_store_for(self.location, ttl_seconds=ttl_seconds)
        self.directory: Path | str = self._store.directory

    def _parse(self, key: str, text: str) -> dict[str, Any]:
        try:
            body = strict_loads(text, where=f"compensation claim {self._store.path(key)}")
        except PayloadError:
            return {"state": "unreadable", "key": key}
        return body if isinstance(body, dict) else {"state": "unreadable", "key": key}

    def state(self, key: str) -> dict[str, Any] | None:
        """The stored claim for ``key``, or ``None``; a damaged one has state ``unreadable``."""
        text, _ = self._store.read(key)
        return None if text is None else self._parse(key, text)

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
        claim = self._store.lock(key)
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
            text, claim.etag = self._store.read(key)
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
        """Store ``body`` as the claim's state (see :meth:`ClaimStore.write`)."""
        try:
            self._store.write(claim, json.dumps(body, sort_keys=True).encode(), final=final)
        except ClaimChanged:
            if final:
                raise DatasetError(
                    f"compensation claim {claim.path} kept changing; could not record that receipt {receipt_id} "
                    f"ended {body.get('state')}"
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
        self._store.release(claim)
