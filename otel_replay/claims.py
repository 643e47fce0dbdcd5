"""Durable, cross-process claims that make compensation happen at most once.

Before the gate asks a rail to compensate a receipt it takes a *claim*: a
small JSON file under ``<dataset>/_compensations/`` named after the receipt's
idempotency key. Claimants first ``flock`` the key's lock file (``<key>.lock``, never
replaced), so only one at a time looks at or changes a claim, and the lock is
held while the rail runs and released by the kernel if the claimant dies. So:

* a second claimant, in this process or another, finds the file and gets
  :class:`~otel_replay.errors.AlreadyCompensated` ("being compensated by …"
  while the lock is held, "already compensated by … at …" once done);
* a claimant that crashed between its claim and the rail's answer leaves an
  unlocked claim in state ``claimed``: the next claimant gets
  :class:`~otel_replay.errors.CompensationPending` naming the crash, and may
  resume it explicitly (``resume=True``) with the same idempotency key, which
  a rail that honours idempotency keys deduplicates;
* a rail that raised leaves state ``failed`` with the error, resumable the same way.

Every state is written to a temporary file, fsynced and renamed over the
claim, so a reader sees the old state or the new one, never a torn file.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import hashlib
import json
import os
import socket
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from otel_replay._json import strict_loads
from otel_replay.errors import AlreadyCompensated, CompensationPending, PayloadError
from otel_replay.exporters.writer import fsync_dir

__all__ = ["CLAIMS_DIR", "Claim", "ClaimState", "CompensationClaims", "idempotency_key"]

CLAIMS_DIR = "_compensations"


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
    """A held claim (``fd`` holds its lock): finish it with :meth:`CompensationClaims.finish`."""

    key: str
    path: Path
    body: dict[str, Any]
    fd: int = -1


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _claimant() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}"


class CompensationClaims:
    """The claim files of one dataset (see the module docstring)."""

    def __init__(self, dataset: str | os.PathLike[str]) -> None:
        """Claims live under ``<dataset>/_compensations/`` (created on first claim)."""
        self.directory = Path(dataset) / CLAIMS_DIR

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def state(self, key: str) -> dict[str, Any] | None:
        """The stored claim for ``key``, or ``None``."""
        try:
            text = self._path(key).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            body = strict_loads(text, where=f"compensation claim {self._path(key)}")
        except PayloadError:
            return {"state": "unreadable", "key": key}
        return body if isinstance(body, dict) else {"state": "unreadable", "key": key}

    def claim(self, key: str, *, decision_id: str | None, receipt_id: str, resume: bool = False) -> Claim:
        """Take the claim for ``key`` before calling the rail.

        Raises:
            AlreadyCompensated: it is done, or another claimant holds it right now.
            CompensationPending: an earlier claimant crashed or its rail raised;
                pass ``resume=True`` to take it over (same idempotency key).

        """
        self.directory.mkdir(parents=True, exist_ok=True)
        # The lock file is never replaced, so every claimant (thread or process) locks the same inode.
        fd = os.open(self.directory / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = self.state(key)
            # The holder may not have written its claim yet: it holds the lock, which is what counts.
            who = "another claimant right now" if holder is None else (
                f"{holder.get('claimant', 'another claimant')} since {holder.get('claimed_at', '?')}"
            )
            raise AlreadyCompensated(
                f"receipt {receipt_id} is being compensated by {who}; not compensating it again"
            ) from None
        try:
            held = self.state(key)
            body: dict[str, Any] = {
                "state": ClaimState.CLAIMED.value,
                "key": key,
                "decision_id": decision_id,
                "receipt_id": receipt_id,
                "claimant": _claimant(),
                "claimed_at": _now(),
            }
            if held is not None:
                self._refuse(held, key, receipt_id, resume=resume)
                body["resumed_from"] = {k: held.get(k) for k in ("claimant", "claimed_at", "state", "error")}
            claim = Claim(key, self._path(key), body, fd)
            self._write(claim, body)
            return claim
        except BaseException:
            os.close(fd)
            raise

    @staticmethod
    def _refuse(held: dict[str, Any], key: str, receipt_id: str, *, resume: bool) -> None:
        state = held.get("state")
        if state == ClaimState.DONE.value:
            raise AlreadyCompensated(
                f"receipt {receipt_id} was already compensated by {held.get('claimant', '?')} "
                f"at {held.get('finished_at', '?')} ({held.get('executed', 'done')}); not compensating it again"
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

    def _write(self, claim: Claim, body: dict[str, Any]) -> None:
        tmp = self.directory / f".{claim.key}.{uuid.uuid4().hex[:8]}.tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(body, sort_keys=True))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, claim.path)
        fsync_dir(self.directory)

    def finish(self, claim: Claim, state: ClaimState, **details: Any) -> None:
        """Record how the compensation ended (durably), then release the claim."""
        body = {**claim.body, **details, "state": state.value, "finished_at": _now()}
        try:
            self._write(claim, body)
        finally:
            self.release(claim)

    def release(self, claim: Claim) -> None:
        """Drop the lock without changing the stored state (an interrupted claim stays ``claimed``)."""
        if claim.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(claim.fd)
            claim.fd = -1
