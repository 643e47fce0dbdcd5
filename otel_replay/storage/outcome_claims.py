"""Durable, exclusive claims that let a decision have one outcome across processes.

An outcome still in another process's export buffer is invisible to a check
of the dataset, so "is there an outcome already?" read from the dataset
cannot keep outcomes immutable on its own. Before it emits an outcome,
:class:`~otel_replay.DecisionTracer` therefore takes the decision's claim in
the dataset; exactly one of two racing claimants gets it, the other is
refused with :class:`~otel_replay.errors.OutcomeAlreadyRecorded` naming where
the claim is, who took it, when, and for which outcome.

On a local dataset every claim is a row of one SQLite database,
``<dataset>/_outcomes/claims.sqlite3`` (WAL journal, the decision id its
primary key), so 5,000 outcomes leave three files there, not 5,000. The
insert is the claim: of two processes inserting the same decision id, SQLite
lets exactly one commit. A claim is durable when :func:`claim_outcome`
returns, also across a crash of the machine: the insert commits into the WAL
(``synchronous=NORMAL``: SQLite syncs nothing at commit, so such a commit
alone survives the process being killed but not the machine losing power),
then the WAL file is ``fdatasync``-ed, which puts that commit and every one
before it on disk. Claimants in one process share that sync (group commit):
one syncs everything committed so far while the others insert, and a claim
whose commit a sync already covered returns without a system call. SQLite's
``synchronous=FULL`` promises the same but syncs inside each commit, under
the database's write lock, so no two claims ever share a sync. The WAL is
checkpointed into the database every 1,000 pages (~700 claims; the
checkpoint syncs both files) and then rewritten from its start, so once it
has reached its size a claim's sync overwrites blocks already allocated: a
sync of a file that grows also commits its new size and blocks to the file
system's journal, 5-10x slower on this project's test machine. Writers
wait up to :data:`BUSY_SECONDS` for one another. The database is created
under a temporary name and linked into place, so a file at its path is
always a claim store: one that cannot be read as such (not a database, no
claims table, unreadable) is an error naming it, and is never replaced.
SQLite's locks need a local file system (not NFS).

An outcome recorded through a pipeline :func:`otel_replay.configure` made on
this dataset is not written anywhere else first: ``claim_outcome(..., hold)``
seals it inside the claim's transaction and stores its span beside the claim
(:mod:`otel_replay.storage.outcome_log`: one commit, both or neither). Such a
commit is synced before the call returns only with
``OTEL_REPLAY_OUTCOME_SYNC=machine`` (:func:`sync_outcomes`, group commit as
above); by default it survives the process being killed (SQLite has written
it to the WAL file) but not the machine losing power, which may take the last
outcomes away with their claims. A claim without an outcome (below) is
synced as before.

A claim file ``_outcomes/<decision id>.json`` left by an older version
(``O_CREAT | O_EXCL``, one per outcome) still refuses a second outcome: before
its insert a claim looks for that one file (one ``stat``). Old files are not
moved into the database: they cost nothing to leave, retention expires them
as before, and a moved file would stop refusing in a process of the older
version still running. (Two versions claiming the same decision *at the same
moment* are not excluded from each other: upgrade every writer of a dataset.)

On an ``s3://`` dataset the claim is the object ``_outcomes/<decision id>.json``
put with ``If-None-Match: *``, as before. A PUT that is refused because the
object holds exactly the body it sent (its first attempt was stored, the
response lost, and the client retried) is this claimant's claim, and so is
one that failed (no answer at all) where the object holds that body. A PUT
refused by a claim given back before it could be read is tried once more.

A claim is released only by the process that took it, when emitting its
outcome raised (nothing was emitted), or when the claim could not be synced
(it is then not known to be on disk, and the caller sees an error). A
release is not synced: a machine crash right after one may bring the claim
back, which then refuses like any claim without an outcome. An
outcome held beside its claim never leaves one without the other. Otherwise
the tracer makes its outcome durable before ``record_outcome()`` returns (see
:meth:`~otel_replay.DecisionTracer.record_outcome`), so only a process that
dies inside that call, between its claim and its outcome's sync, leaves a
claim without an outcome; the refusal says where the claim is and who took
it, so it can be checked and removed by hand (the outcome is then recorded
again).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from otel_replay.errors import DatasetError
from otel_replay.exporters.schema import OUTCOMES_DIR
from otel_replay.location import resolve
from otel_replay.storage import objects
from otel_replay.storage import outcome_log as _log_of
from otel_replay.storage.backend import backend_for
from otel_replay.storage.claim_store import (
    BUSY_SECONDS,
    Hold,
    OutcomeClaim,
    OutcomeClaimStore,
    claim_body,
    claim_file_name,
    claimant,
    held_body,
    refusal_of,
    sync_outcomes,
)
from otel_replay.storage.outcome_log import CLAIMS_DB, WRITERS_DIR

__all__ = [
    "BUSY_SECONDS",
    "CLAIMS_DB",
    "OutcomeClaim",
    "claim_outcome",
    "claim_outcomes",
    "claimant",
    "close_outcomes",
    "expire_outcome_claims",
    "flush_outcomes",
    "recover_outcomes",
    "sync_outcomes",
]

_stores: dict[tuple[int, str], OutcomeClaimStore] = {}
_stores_lock = threading.Lock()


def _reset_after_fork() -> None:
    global _stores_lock
    _stores_lock = threading.Lock()  # a thread of the parent may have held it; its connections stay unused here


os.register_at_fork(after_in_child=_reset_after_fork)


def _store(root: str) -> OutcomeClaimStore:
    """The claim store of the local dataset at ``root`` in this process (a connection never crosses a fork)."""
    key = (os.getpid(), root if os.path.isabs(root) else os.path.abspath(root))
    store = _stores.get(key)
    if store is None:
        with _stores_lock:
            store = _stores.setdefault(key, OutcomeClaimStore(Path(key[1], OUTCOMES_DIR)))
    return store


def claim_outcome(
    dataset: str | os.PathLike[str],
    decision_id: str,
    outcome_id: str,
    outcome_correct: bool,
    hold: Hold | None = None,
) -> OutcomeClaim:
    """Take the one claim ``dataset`` holds for ``decision_id``'s outcome.

    ``hold`` (a local dataset only): called once the claim is taken, inside
    its transaction, it seals the outcome; the span it returns is stored with
    the claim (one commit) and written to Parquet by this process
    (:mod:`otel_replay.storage.outcome_log`). When it raises, nothing is claimed.

    Raises:
        OutcomeAlreadyRecorded: another claimant (this process or another, or a
            claim file of an older version) took it first.
        DatasetError: the claim could not be written, or the claim store is
            damaged (nothing is claimed then).

    """
    root = os.fspath(dataset)
    if not isinstance(root, str) or "://" in root:  # a plain local path skips resolve() (this is per outcome)
        location = resolve(dataset)
        if backend_for(location).directory is None:
            if hold is not None:
                raise ValueError(f"an outcome is held beside its claim only in a local dataset, not {root}")
            body = claim_body(decision_id, outcome_id, outcome_correct)
            return _claim_remote(location, decision_id, claim_file_name(decision_id), body)
        root = location.root
    return _store(root).claim(decision_id, outcome_id, outcome_correct, hold)


def claim_outcomes(
    dataset: str | os.PathLike[str], items: list[tuple[str, str, bool, Hold]]
) -> list[OutcomeClaim | BaseException]:
    """:func:`claim_outcome` with ``hold`` for many decisions at once: ``(decision, outcome, correct, hold)`` each.

    A local dataset only. Claims and held outcomes go in shared transactions
    (a refusal or a failed seal is its decision's alone), so one commit writes
    the pages of many; each item gets its :class:`OutcomeClaim` or the exception
    :func:`claim_outcome` would have raised for it (nothing claimed for it then).
    """
    root = os.fspath(dataset)
    location = resolve(root)
    if backend_for(location).directory is None:
        raise ValueError(f"an outcome is held beside its claim only in a local dataset, not {root}")
    return _store(location.root).claim_many(items)


def _open_store(dataset: str | os.PathLike[str]) -> OutcomeClaimStore | None:
    """The claim store of a local ``dataset`` in this process, if the dataset has one (none is created)."""
    location = resolve(dataset)
    if backend_for(location).directory is None:
        return None
    key = (os.getpid(), os.path.abspath(location.root))
    store = _stores.get(key)
    if store is None and not os.path.lexists(os.path.join(location.root, OUTCOMES_DIR, CLAIMS_DB)):
        return None
    return store if store is not None else _store(location.root)


def _open_store_of(dataset: str | os.PathLike[str]) -> OutcomeClaimStore | None:
    """The claim store this process has open for the local ``dataset``; ``None``: none open (or an object store)."""
    location = resolve(dataset)
    local = backend_for(location).directory is not None
    return _stores.get((os.getpid(), os.path.abspath(location.root))) if local else None


def flush_outcomes(dataset: str | os.PathLike[str]) -> int:
    """Write the outcomes this process holds in ``dataset``'s claim store to Parquet now; how many.

    Raises:
        OSError: writing Parquet failed (they stay held, for the next try).
        DatasetError: the claim store could not be read or written.

    """
    store = _open_store_of(dataset)
    if store is None or store.pending is None:
        return 0
    return store.pending.convert()


def close_outcomes(dataset: str | os.PathLike[str]) -> None:
    """:func:`flush_outcomes`, then stop this process's converter of ``dataset`` (errors logged, rows kept)."""
    store = _open_store_of(dataset)
    if store is not None and store.pending is not None:
        store.pending.close()


def recover_outcomes(dataset: str | os.PathLike[str]) -> int:
    """Write to Parquet the outcomes that processes now gone held in ``dataset``'s claim store; how many.

    A local dataset without a claim store (and an ``s3://`` one) has none.

    Raises:
        OSError: writing Parquet failed (they stay held, for the next try).
        DatasetError: the claim store is damaged or cannot be opened.

    """
    location = resolve(dataset)
    if backend_for(location).directory is None:
        return 0
    try:  # a process that held outcomes here left its lock file: none, nothing to recover (the store stays shut)
        if not os.listdir(os.path.join(location.root, OUTCOMES_DIR, WRITERS_DIR)):
            return 0
    except OSError:
        return 0
    store = _open_store(location.root)
    if store is None or not os.access(store.directory, os.W_OK):  # a read-only copy: nothing can be written
        return 0
    return _log_of.recover(store)


def expire_outcome_claims(dataset: Any, before_ns: int) -> int:
    """Delete the claim store's claims taken before ``before_ns`` (ns since the epoch); how many.

    Only for a local dataset that has a claim store (0 otherwise); claim files
    (older versions', and ``s3://`` claim objects) are expired by retention itself.
    """
    store = _open_store(dataset)
    return 0 if store is None else store.expire(before_ns)


def _claim_remote(location: Any, decision_id: str, name: str, body: bytes) -> OutcomeClaim:
    where = location.join(OUTCOMES_DIR, name)
    s3 = objects.client(location)
    for attempt in range(2):
        try:
            etag = objects.put_if(s3, location, location.key(where), body, None)
        except DatasetError:
            # The PUT may have been stored with no answer back: raised then, the claim would stay without its
            # outcome and refuse the caller's next try. Read back, and ours, it is claimed; else nothing is (raised).
            try:
                stored = objects.get(s3, location, location.key(where))
            except DatasetError:
                stored = None
            if stored is None or stored.body != body:
                raise
            return OutcomeClaim(where, stored.etag, location)
        except objects.Conflict:
            held = objects.get(s3, location, location.key(where))
            if held is not None and held.body == body:
                # Our own PUT: it was stored, its response lost and the PUT retried (the body names this claim's
                # outcome id, which no other claimant has). Refused, it would stay a claim without an outcome.
                return OutcomeClaim(where, held.etag, location)
            if held is None and attempt == 0:
                continue  # given back since (its outcome was never emitted): the decision is free, claim it
            raise refusal_of(decision_id, where, held_body(held.body if held is not None else None)) from None
        return OutcomeClaim(where, etag, location)
    raise AssertionError("unreachable")  # the second attempt returns or raises
