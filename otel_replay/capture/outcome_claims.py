"""Durable, exclusive claims that let a decision have one outcome across processes.

An outcome still in another process's export buffer is invisible to a check
of the dataset, so "is there an outcome already?" read from the dataset
cannot keep outcomes immutable on its own. Before it emits an outcome,
:class:`~otel_replay.DecisionTracer` therefore takes the decision's claim in
the dataset: ``<dataset>/_outcomes/<decision id>.json``, created with
``O_CREAT | O_EXCL`` and fsynced (file and directory) on a local dataset, or
put with ``If-None-Match: *`` on an ``s3://`` one. Exactly one of two racing
claimants creates it; the other is refused with
:class:`~otel_replay.errors.OutcomeAlreadyRecorded` naming the claim.

A claim is released only by the process that took it, when emitting its
outcome raised (nothing was emitted). A process that dies between its claim
and the flush of its outcome leaves the claim and may leave no outcome; the
refusal says where the claim is and who took it, so it can be checked and
removed by hand (the outcome is then recorded again).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from otel_replay.errors import OutcomeAlreadyRecorded
from otel_replay.exporters.writer import fsync_dir

__all__ = ["OUTCOMES_DIR", "OutcomeClaim", "claim_outcome"]

OUTCOMES_DIR = "_outcomes"
_SAFE = re.compile(r"[0-9A-Za-z_-]{1,128}")


def _name(decision_id: str) -> str:
    """The claim's file name: the decision id itself when it is a safe file name, else a hash of it."""
    if _SAFE.fullmatch(decision_id):
        return f"{decision_id}.json"
    return f"sha256-{hashlib.sha256(decision_id.encode('utf-8', 'surrogatepass')).hexdigest()[:40]}.json"


@dataclass
class OutcomeClaim:
    """A claim this process holds; :meth:`release` gives it back (only when its outcome was never emitted)."""

    where: str
    _etag: str | None = None
    _location: Any = None

    def release(self) -> None:
        """Remove the claim: the outcome it stood for was not emitted, so the decision may get one later."""
        if self._location is None:
            try:
                os.unlink(self.where)
            except FileNotFoundError:
                pass
            return
        from otel_replay.storage import objects

        assert self._etag is not None
        location = self._location
        objects.delete_if(objects.client(location), location, location.key(self.where), self._etag)


def _body(decision_id: str, outcome_id: str, outcome_correct: bool) -> bytes:
    return json.dumps(
        {
            "decision_id": decision_id,
            "outcome_id": outcome_id,
            "outcome_correct": outcome_correct,
            "claimant": f"pid {os.getpid()} on {socket.gethostname()}",
            "claimed_at": datetime.now(UTC).isoformat(),
        },
        sort_keys=True,
    ).encode()


def _refusal(decision_id: str, where: str, held: bytes | None) -> OutcomeAlreadyRecorded:
    try:
        body = json.loads(held) if held else {}
    except ValueError:
        body = {}
    body = body if isinstance(body, dict) else {}
    who = f" by {body.get('claimant', '?')} at {body.get('claimed_at', '?')} (outcome {body.get('outcome_id', '?')})"
    return OutcomeAlreadyRecorded(
        f"decision {decision_id} already has an outcome: claimed{who if body else ''} in {where}; outcomes are "
        "immutable (if that claimant died before its outcome reached the dataset, remove the claim to record one)"
    )


def claim_outcome(
    dataset: str | os.PathLike[str], decision_id: str, outcome_id: str, outcome_correct: bool
) -> OutcomeClaim:
    """Take the one claim ``dataset`` holds for ``decision_id``'s outcome.

    Raises:
        OutcomeAlreadyRecorded: another claimant (this process or another) took it first.
        OSError, DatasetError: the claim could not be written (nothing is claimed then).

    """
    from otel_replay.location import resolve

    location = resolve(dataset)
    name = _name(decision_id)
    body = _body(decision_id, outcome_id, outcome_correct)
    if location.remote:
        return _claim_remote(location, decision_id, name, body)
    directory = Path(location.root) / OUTCOMES_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        try:
            held = path.read_bytes()
        except OSError:
            held = None
        raise _refusal(decision_id, str(path), held) from None
    try:
        os.write(fd, body)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    fsync_dir(directory)  # the claim's name must survive a crash too, or a second claimant could take it
    return OutcomeClaim(str(path))


def _claim_remote(location: Any, decision_id: str, name: str, body: bytes) -> OutcomeClaim:
    from otel_replay.storage import objects

    where = location.join(OUTCOMES_DIR, name)
    s3 = objects.client(location)
    try:
        etag = objects.put_if(s3, location, location.key(where), body, None)
    except objects.Conflict:
        held = objects.get(s3, location, location.key(where))
        raise _refusal(decision_id, where, held.body if held is not None else None) from None
    return OutcomeClaim(where, etag, location)
