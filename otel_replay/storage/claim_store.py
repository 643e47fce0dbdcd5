"""One dataset's outcome claims as a local SQLite database (``_outcomes/claims.sqlite3``), as one process has it open.

A claim is one row keyed by its decision id; the outcome it stands for can be
held beside it in the same transaction (:mod:`otel_replay.storage.outcome_log`).
Inserts go one transaction at a time through the process's connection, held
outcomes of many callers share transactions, and syncs are shared (group
commit). :mod:`otel_replay.storage.outcome_claims` is the API over it (and
the object-store claims); what is durable when is said there.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from otel_replay import settings
from otel_replay.errors import ConfigError, DatasetError, OutcomeAlreadyRecorded
from otel_replay.exporters.writer import fsync_dir
from otel_replay.storage import objects
from otel_replay.storage import outcome_log as _log_of
from otel_replay.storage.outcome_log import CLAIMS_DB, INSERT_PENDING, PENDING_TABLE, PendingOutcomes

__all__ = [
    "BUSY_SECONDS",
    "Hold",
    "OutcomeClaim",
    "OutcomeClaimStore",
    "claim_body",
    "claim_file_name",
    "claimant",
    "held_body",
    "refusal_of",
    "shown_id",
    "sync_outcomes",
]

_log = logging.getLogger(__name__)


BUSY_SECONDS = 60.0
"""How long a claim waits for other writers of the claim store before it fails (naming the store)."""

_CHECKPOINT_PAGES = 1_000
"""WAL pages (4 KiB, one or two per claim) between checkpoints (SQLite's default). A checkpoint syncs the WAL and
the database (a few ms; 20-40 ms under load), once per ~700 claims. Once the WAL has reached its size (~4 MB) it is
rewritten in place, so each claim's ``fdatasync`` allocates nothing; a larger WAL (10,000 pages were tried) spends
its first ~7,000 claims on a growing file, where each sync costs 5-10x more."""
_CHUNK = 1_000
"""Held outcomes of one :func:`claim_outcomes` call per transaction (the claim store's lock is held for one)."""
_KEYS_PER_SELECT = 500
"""Decision ids per look-up of claims already taken (SQLite takes at least 999 parameters per statement)."""
_SETTLED_NS = 2_000_000_000
"""How old a directory's mtime must be before an unchanged mtime is taken to mean an unchanged directory (file
systems stamp with a coarse clock: a change in the same tick as the last leaves the mtime as it was)."""
_ALONE = 8
"""Below this many requests in a transaction, each claim is inserted alone rather than looked up first."""
class Hold(Protocol):
    """An outcome to seal once its claim is taken (``capture.recorder.HeldRecord``), stored beside the claim."""

    def __call__(self) -> tuple[list[Any], bytes]:
        """Seal it now: the ended spans to store and their OTLP bytes.

        The spans are the records sealed before it that were not durable yet, then the outcome's.
        """

    def committed(self, sync: Callable[[], None]) -> None:
        """Its spans are committed (the write orders still held): ``sync()`` returns once that commit is on disk."""

    def give_back(self) -> None:
        """The store did not keep its spans: the records sealed before it go on to Parquet the usual way."""


def sync_outcomes() -> bool:
    """Whether a held outcome's commit is ``fdatasync``-ed before :func:`claim_outcome` returns (group commit).

    ``OTEL_REPLAY_OUTCOME_SYNC=machine``: it survives a machine crash when the
    call returns. ``process`` (the default): it survives the process being
    killed (the commit is in the operating system's page cache); a machine
    crash may lose the last outcomes, each with its claim (never one without
    the other), which can then be recorded again. Read when a process first
    claims in a dataset; see docs/operations/durability.md for the figures.

    Raises:
        ConfigError: the variable is neither ``process`` nor ``machine``.

    """
    value = settings.env_text(settings.OUTCOME_SYNC, "process")
    if value not in ("process", "machine"):
        raise ConfigError(f"{settings.OUTCOME_SYNC}={value!r} must be 'process' or 'machine'")
    return value == "machine"


_SAFE = re.compile(r"[0-9A-Za-z_-]{1,128}")
_TABLE = "outcome_claims"
_SCHEMA = (
    f"CREATE TABLE {_TABLE} ("
    "decision_id PRIMARY KEY NOT NULL, "  # TEXT, or the id's UTF-8 (surrogatepass) BLOB when it holds lone surrogates
    "outcome_id TEXT NOT NULL, outcome_correct INTEGER NOT NULL, "
    "claimant TEXT NOT NULL, claimed_ns INTEGER NOT NULL) WITHOUT ROWID"  # ns since the epoch, UTC
)
_INSERT = f"INSERT INTO {_TABLE} VALUES (?, ?, ?, ?, ?)"


def claim_file_name(decision_id: str) -> str:
    """The claim's file name: the decision id itself when it is a safe file name, else a hash of it."""
    if _SAFE.fullmatch(decision_id):
        return f"{decision_id}.json"
    return f"sha256-{hashlib.sha256(decision_id.encode('utf-8', 'surrogatepass')).hexdigest()[:40]}.json"


def _key(decision_id: str) -> str | bytes:
    """The decision id as the claim store's key: itself, or its bytes when SQLite cannot take it as text."""
    try:
        decision_id.encode("utf-8")
    except UnicodeEncodeError:
        return decision_id.encode("utf-8", "surrogatepass")
    return decision_id


@dataclass
class OutcomeClaim:
    """A claim this process holds; :meth:`release` gives it back (only when its outcome was never emitted)."""

    where: str
    _etag: str | None = None
    _location: Any = None
    _store: OutcomeClaimStore | None = None
    _key: str | bytes | None = None
    _outcome_id: str | None = None

    def release(self) -> None:
        """Remove the claim: the outcome it stood for was not emitted, so the decision may get one later."""
        if self._store is not None:
            assert self._key is not None and self._outcome_id is not None
            self._store.release(self._key, self._outcome_id)
            return
        if self._location is None:
            try:
                os.unlink(self.where)
            except FileNotFoundError:
                pass
            return

        assert self._etag is not None
        location = self._location
        objects.delete_if(objects.client(location), location, location.key(self.where), self._etag)


_claimant_of: tuple[int, str] = (-1, "")


def claimant() -> str:
    """``pid N on HOST``: who holds a claim (outcome or compensation); the host name is asked once per process."""
    global _claimant_of
    pid = os.getpid()
    if _claimant_of[0] != pid:
        _claimant_of = (pid, f"pid {pid} on {socket.gethostname()}")
    return _claimant_of[1]


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat()


def claim_body(decision_id: str, outcome_id: str, outcome_correct: bool) -> bytes:
    """A claim's JSON record: the decision, its outcome, who claimed it and when (an older version's claim file)."""
    return json.dumps(
        {
            "decision_id": decision_id,
            "outcome_id": outcome_id,
            "outcome_correct": outcome_correct,
            "claimant": claimant(),
            "claimed_at": _iso(time.time_ns()),
        },
        sort_keys=True,
    ).encode()


def shown_id(decision_id: object) -> str:
    """A decision id as a one-line message shows it: itself when printable, else quoted; cut after 200 characters.

    A newline, NUL or escape in an id would otherwise split or garble the log line, and a lone surrogate make the
    message unencodable.
    """
    text = decision_id if isinstance(decision_id, str) and decision_id.isprintable() else repr(decision_id)
    return text if len(text) <= 200 else text[:200] + "..."


def refusal_of(
    decision_id: str, where: str, body: dict[str, Any], remedy: str = "remove the claim"
) -> OutcomeAlreadyRecorded:
    """The refusal of a second outcome for ``decision_id``: who holds the claim, where, and how to clear it."""
    who = f" by {body.get('claimant', '?')} at {body.get('claimed_at', '?')} (outcome {body.get('outcome_id', '?')})"
    return OutcomeAlreadyRecorded(
        f"decision {shown_id(decision_id)} already has an outcome: claimed{who if body else ''} in {where}; outcomes "
        f"are immutable (if that claimant died before its outcome reached the dataset, {remedy} to record one)"
    )


def held_body(held: bytes | None) -> dict[str, Any]:
    """A claim record's JSON as a dict (empty when torn or not an object)."""
    try:
        body = json.loads(held) if held else {}
    except ValueError:
        body = {}
    return body if isinstance(body, dict) else {}


def _legacy_refusal(decision_id: str, path: str) -> OutcomeAlreadyRecorded:
    """The refusal a claim file an older version wrote at ``path`` makes (what it says of its claimant, if readable)."""
    try:
        written: bytes | None = Path(path).read_bytes()
    except OSError:
        written = None
    return refusal_of(decision_id, path, held_body(written))


def _held_by(row: tuple[Any, ...]) -> dict[str, Any]:
    """Who holds a claim, from its row (as :data:`_INSERT` takes it): for the refusal's message."""
    at = _iso(row[4]) if isinstance(row[4], int) else row[4]
    return {"claimant": row[3], "claimed_at": at, "outcome_id": row[1]}


@dataclass(eq=False)
class _Request:
    """One held outcome waiting to be committed: ``ticket`` once committed, else ``failure`` to raise."""

    decision_id: str
    key: str | bytes
    row: tuple[Any, ...]
    hold: Hold
    settled: bool = False  # the claimant found ``_outcomes/`` unchanged (see OutcomeClaimStore.looked)
    spans: list[Any] | None = None  # the spans its hold sealed (see Hold)
    body: bytes = b""  # the sealed spans' OTLP bytes, until its row is inserted
    ticket: int = 0
    closes: int = 0  # how many times its store's pending outcomes were closed when it committed
    failure: BaseException | None = None


class OutcomeClaimStore:
    """One dataset's claim database as this process has it open: one insert at a time, syncs shared (group commit)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / CLAIMS_DB
        self.legacy = f"{directory}{os.sep}"  # + a claim file's name: where an older version put that claim
        self.lock = threading.Lock()  # one insert at a time through the connection
        self._con: sqlite3.Connection | None = None
        self._ident: tuple[int, int] | None = None
        # Group commit: ``_committed`` counts commits (under ``lock``). One claimant at a time syncs the WAL
        # (``_syncing``), outside every lock, for all commits counted when it began, then moves ``_synced`` up
        # and wakes the others waiting on ``_synced``: those it covered return, one of the rest syncs next.
        self._synced_changed = threading.Condition(threading.Lock())
        self._syncing = False
        self._wal_fd: int | None = None  # the open connection's WAL file
        self._committed = 0
        self._synced = 0
        self.pending: PendingOutcomes | None = None  # outcomes this process holds here until they are in Parquet
        self._queue: list[_Request] = []  # held outcomes waiting for a transaction (see _claim_held)
        self._queue_lock = threading.Lock()
        self.sync_outcomes = sync_outcomes()
        # What a claim looks for before its insert (a claim file of an older version, a store replaced by hand) is
        # looked for again only when ``_outcomes/`` changed: both change the directory's mtime (see looked()).
        self._listed: tuple[tuple[int, int], bool, bool] | None = None  # (inode, mtime); claim files?; settled?

    def error(self, doing: str, exc: BaseException) -> DatasetError:
        """A one-line error naming the store and what could not be done (damage said as such)."""
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        damaged = isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError)
        if damaged or "malformed" in first or "not a database" in first:
            return DatasetError(
                f"outcome claim store {self.path} is damaged ({first}); it is never replaced "
                "automatically, as it holds the claims that keep outcomes once: restore it, or move it aside "
                "(with its -wal and -shm files) to start an empty one"
            )
        if "locked" in first or "busy" in first:
            first += f": other processes kept it busy for {BUSY_SECONDS:g} s"
        return DatasetError(f"outcome claim store {self.path}: cannot {doing} ({first})")

    def _create(self) -> None:
        """Create the database under a temporary name and link it into place (an existing one wins)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self.error("create its directory", exc) from exc
        temp = self.directory / f".{CLAIMS_DB}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
        try:
            con = sqlite3.connect(temp, isolation_level=None)
            try:
                con.execute("PRAGMA journal_mode=WAL")
                con.execute(_SCHEMA)
            finally:
                con.close()  # the last connection: its WAL is checkpointed and removed
            fd = os.open(temp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            with contextlib.suppress(FileExistsError):  # another process created it first: use that one
                os.link(temp, self.path)
            fsync_dir(self.directory)
        except (OSError, sqlite3.Error) as exc:
            raise self.error("create it", exc) from exc
        finally:
            for leftover in (temp, Path(f"{temp}-wal"), Path(f"{temp}-shm")):
                with contextlib.suppress(OSError):
                    leftover.unlink()

    def looked(self, *, listing: bool = False) -> tuple[bool, bool]:
        """Whether ``_outcomes/`` is as this process last listed it, settled (one ``stat``), and may hold claim files.

        First: no file was added, removed or renamed there since it was last
        listed, so neither a claim file of an older version nor a store put
        in place by hand appeared (each changes the directory's mtime). A
        directory whose mtime is within :data:`_SETTLED_NS` of the clock is
        never taken as unchanged (a change in the same tick of the file
        system's clock leaves the mtime as it was), and it is listed again
        only with ``listing``. Second: whether the directory holds a claim
        file of an older version (``True`` when not known).
        """
        try:
            st = os.stat(self.directory)
        except OSError:
            return False, True
        seen = (st.st_ino, st.st_mtime_ns)
        settled = st.st_mtime_ns < time.time_ns() - _SETTLED_NS
        listed = self._listed  # one read: a listing and the state it was taken in go together
        if listed is not None and listed[0] == seen:
            if listed[2]:
                return True, listed[1]
            if not settled and not listing:
                return False, True
        try:  # listed after the stat: it shows at least the state the stat saw
            legacy = any(name.endswith(".json") for name in os.listdir(self.directory))
        except OSError:
            return False, True
        self._listed = (seen, legacy, settled)
        return False, legacy

    def connection(self, settled: bool = False) -> sqlite3.Connection:
        """The open connection, (re)opened when the file at :attr:`path` is not the one it has open.

        ``settled``: :meth:`looked` said the directory did not change, so the open one is still the file there.
        """
        if settled and self._con is not None:
            return self._con
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise self.error("open it", exc) from exc
        if self._con is not None and st is not None and (st.st_dev, st.st_ino) == self._ident:
            return self._con
        if self._con is not None:
            # SQLite neither checkpoints a moved or unlinked database on close nor deletes its "-wal" by name
            # (now the WAL of the store that replaced it); a test holds it to that.
            self._con.close()
            self._con = None
            self._swap_wal(None)
        if st is None:
            self._create()
            try:
                st = os.stat(self.path)
            except OSError as exc:
                raise self.error("open it", exc) from exc
        try:
            con = sqlite3.connect(
                self.path.as_uri() + "?mode=rw",
                uri=True,
                timeout=BUSY_SECONDS,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise self.error("open it", exc) from exc
        try:
            con.execute("PRAGMA synchronous=NORMAL")
            con.execute(f"PRAGMA wal_autocheckpoint={_CHECKPOINT_PAGES}")
            tables = dict(con.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall())
        except sqlite3.Error as exc:
            con.close()
            raise self.error("open it", exc) from exc
        if _TABLE not in tables:
            con.close()
            raise self.error("open it", sqlite3.DatabaseError(f"no {_TABLE} table in it"))
        # A store an older version made: outcomes are held beside claims now, in a rowid table (see PENDING_SCHEMA).
        change: tuple[str, ...] = _log_of.PENDING_SCHEMA if PENDING_TABLE not in tables else ()
        if "WITHOUT ROWID" in str(tables.get(PENDING_TABLE, "")).upper():  # as made at first: rows kept
            change = ("BEGIN IMMEDIATE", *_log_of.PENDING_MIGRATION, "COMMIT")
        try:
            for statement in change:
                con.execute(statement)
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                con.execute("ROLLBACK")
            con.close()
            raise self.error("add its table of pending outcomes", exc) from exc
        try:
            # Reading the schema opened (or made) the WAL, and this open connection keeps SQLite from deleting it.
            wal = os.open(f"{self.path}-wal", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            con.close()
            raise self.error("open its WAL", exc) from exc
        self._swap_wal(wal)
        self._con, self._ident = con, (st.st_dev, st.st_ino)
        return con

    def _swap_wal(self, fd: int | None) -> None:
        """Sync and close the WAL file the claims so far went to; ``fd`` is the one to sync from now on."""
        with self._synced_changed:
            while self._syncing:  # not while a sync uses it
                self._synced_changed.wait()
            old, self._wal_fd = self._wal_fd, fd
            if old is not None:
                with contextlib.suppress(OSError):
                    os.fdatasync(old)  # the last claims through the old connection: as durable as the rest
                os.close(old)
            self._synced = self._committed
            self._synced_changed.notify_all()

    def _sync(self, ticket: int) -> None:
        """Return once commit number ``ticket`` is on disk: synced by this thread, or by one syncing meanwhile."""
        with self._synced_changed:
            while self._synced < ticket and self._syncing:
                self._synced_changed.wait()
            if self._synced >= ticket:
                return  # a sync that began after this commit covered it
            self._syncing = True
            upto = self._committed  # every commit counted so far is in the WAL file already
            fd = self._wal_fd
        synced = False
        try:
            assert fd is not None
            os.fdatasync(fd)
            synced = True
        finally:
            with self._synced_changed:
                self._syncing = False
                if synced:
                    self._synced = max(self._synced, upto)
                self._synced_changed.notify_all()

    def _sync_here(self, pid: int, ticket: int) -> None:
        """:meth:`_sync` of ``ticket`` in process ``pid``; nothing in a forked child (its chains are new)."""
        # The child has the store as the fork left it: maybe mid-sync, with no thread left to finish that sync.
        if os.getpid() == pid:
            self._sync(ticket)

    def sync_all(self) -> None:
        """Return once every commit so far through this process's connection is on disk."""
        with self.lock:
            self._committed += 1
            ticket = self._committed
        try:
            self._sync(ticket)
        except OSError as exc:
            raise self.error("sync it", exc) from exc

    def claim(self, decision_id: str, outcome_id: str, outcome_correct: bool, hold: Hold | None = None) -> OutcomeClaim:
        """Take ``decision_id``'s claim in a transaction of its own (its outcome held beside it when ``hold``)."""
        settled, legacy_files = self.looked()
        legacy = self.legacy + claim_file_name(decision_id)
        if (legacy_files or not settled) and os.path.lexists(legacy):  # a claim file an older version wrote
            raise _legacy_refusal(decision_id, legacy)
        key = _key(decision_id)
        row = (key, outcome_id, int(outcome_correct), claimant(), time.time_ns())
        if hold is not None:
            return self._claim_held(decision_id, key, row, hold, settled)
        with self.lock:
            con = self.connection(settled)
            try:
                con.execute(_INSERT, row)
            except sqlite3.IntegrityError:
                held = self._held(con, key)
                raise refusal_of(decision_id, str(self.path), held, f"delete its row from {_TABLE}") from None
            except sqlite3.Error as exc:
                raise self.error(f"record the claim for decision {decision_id[:200]!r}", exc) from exc
            self._committed += 1
            ticket = self._committed
        claim = OutcomeClaim(str(self.path), _store=self, _key=key, _outcome_id=outcome_id)
        try:
            self._sync(ticket)
        except OSError as exc:
            # Not known to be on disk: given back (as far as that goes), so the caller's retry is not refused.
            with contextlib.suppress(DatasetError):
                claim.release()
            raise self.error(f"make the claim for decision {decision_id[:200]!r} durable", exc) from exc
        return claim

    def _claim_held(
        self, decision_id: str, key: str | bytes, row: tuple[Any, ...], hold: Hold, settled: bool = False
    ) -> OutcomeClaim:
        """Claim and store the outcome ``hold`` seals, in one transaction (see :mod:`.outcome_log`).

        Concurrent calls share a transaction: each queues its request, and
        whichever thread takes the connection commits every request queued
        so far in one transaction (a commit writes its pages once for all
        of them); a refused claim or a record that cannot be sealed is its
        own request's failure (see :meth:`_commit`), the others are stored.
        """
        request = _Request(decision_id, key, row, hold, settled=settled)
        with self._queue_lock:
            self._queue.append(request)
        with self.lock:
            if request.ticket == 0 and request.failure is None:  # not committed by another thread: lead
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                self._commit(batch)
        if request.failure is not None:
            raise request.failure
        claim = OutcomeClaim(str(self.path), _store=self, _key=key, _outcome_id=row[1])
        if self.sync_outcomes:
            try:
                self._sync(request.ticket)
            except OSError as exc:
                with contextlib.suppress(DatasetError):
                    claim.release()  # not known to be on disk, and never handed on: given back whole
                    request.hold.give_back()
                raise self.error(f"make the outcome of decision {decision_id[:200]!r} durable", exc) from exc
            with self.lock:
                assert self.pending is not None and request.spans is not None
                late = self.pending.added(row[1], request.spans, committed_at=request.closes)
            if late:
                self.pending.convert_late()
        return claim

    def claim_many(self, items: list[tuple[str, str, bool, Hold]]) -> list[OutcomeClaim | BaseException]:
        """Claim and store held outcomes ``(decision, outcome, correct, hold)``, :data:`_CHUNK` per transaction."""
        settled, legacy = self.looked(listing=True)  # older claim files are looked for one by one only when any are
        legacy = legacy and os.path.isdir(self.directory)
        answers: list[_Request | BaseException] = []
        for decision_id, outcome_id, correct, hold in items:
            try:
                if legacy and os.path.lexists(self.legacy + claim_file_name(decision_id)):
                    # Refused here, not through claim(): that looks again, and a file expired meanwhile would let it
                    # claim the decision without its outcome, which this batch's own insert would then be refused by.
                    raise _legacy_refusal(decision_id, self.legacy + claim_file_name(decision_id))
                key = _key(decision_id)
                row = (key, outcome_id, int(correct), claimant(), time.time_ns())
                answers.append(_Request(decision_id, key, row, hold, settled=settled))
            except Exception as exc:  # noqa: BLE001 - this decision's answer
                answers.append(exc)
        requests = [r for r in answers if isinstance(r, _Request)]
        for at in range(0, len(requests), _CHUNK):
            with self.lock:
                self._commit(requests[at : at + _CHUNK])  # each request gets its ticket or its failure
        stored = [r for r in requests if r.failure is None]
        if self.sync_outcomes and stored:
            try:
                self._sync(max(r.ticket for r in stored))
            except OSError as exc:
                for r in stored:  # not known to be on disk, and never handed on: given back whole
                    with contextlib.suppress(DatasetError):
                        self.release(r.key, r.row[1])
                        r.hold.give_back()
                    r.failure = self.error(f"make the outcome of decision {r.decision_id[:200]!r} durable", exc)
            else:
                late = False
                with self.lock:
                    assert self.pending is not None
                    for r in stored:
                        assert r.spans is not None
                        late = self.pending.added(r.row[1], r.spans, committed_at=r.closes) or late
                if late:
                    self.pending.convert_late()
        where = str(self.path)
        return [
            r if isinstance(r, BaseException) else r.failure or OutcomeClaim(where, None, None, self, r.key, r.row[1])
            for r in answers
        ]

    def _commit(self, batch: list[_Request]) -> None:
        """Commit ``batch`` in one transaction (caller holds :attr:`lock`); each request gets a ticket or a failure.

        Interrupted (an exception no handler below takes, such as ``KeyboardInterrupt``) before its ``COMMIT``, the
        transaction is rolled back and every request still unanswered fails saying so, nothing claimed (the other
        threads' requests are in this thread's hands); right after it, they are answered as committed and it is raised.
        """
        try:
            self._commit_batch(batch)
        except BaseException as exc:
            con = self._con
            if con is not None and con.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    con.execute("ROLLBACK")
            for request in batch:
                if request.ticket == 0 and request.failure is None:
                    request.failure = DatasetError(
                        f"outcome claim store {self.path}: the transaction holding the outcome of decision "
                        f"{request.decision_id[:200]!r} was interrupted ({type(exc).__name__}); nothing was claimed"
                    )
            raise

    def _commit_batch(self, batch: list[_Request]) -> None:
        """:meth:`_commit` itself."""

        def fail_all(failure: BaseException | Callable[[_Request], BaseException]) -> None:
            """Every unanswered request fails: with ``failure``, or the one it makes for that request."""
            for request in batch:
                if request.failure is None:
                    request.failure = failure if isinstance(failure, BaseException) else failure(request)

        def doing(request: _Request) -> str:  # each failure names its own decision, not the batch's first
            return f"record the outcome of decision {request.decision_id[:200]!r}"

        try:
            con = self.connection(all(request.settled for request in batch))
        except DatasetError as exc:
            fail_all(exc)
            return
        pending = self.pending
        if pending is None:
            pending = self.pending = PendingOutcomes(self)
            pending.interval = getattr(batch[0].hold, "convert_seconds", None) or pending.interval
        try:
            instance = pending.instance_for_insert()
            con.execute("BEGIN IMMEDIATE")
        except OSError as exc:
            lock, unlocked = pending.lock_path.parent, exc
            fail_all(lambda request: self.error(f"{doing(request)} (its lock in {lock})", unlocked))
            return
        except sqlite3.Error as exc:
            unbegun = exc
            fail_all(lambda request: self.error(doing(request), unbegun))
            return
        orders = _write_orders(batch)  # no gate record sealed after these is queued in a log before they commit
        try:
            stored: list[_Request] = []
            called: list[_Request] = []  # whose hold was called: sealed, or given back by itself (see Hold)
            committing = False
            interrupted: BaseException | None = None  # raised once the committed ones are answered
            try:
                # A refused request takes no link of the chain: its claim is known to be ours before it is sealed.
                # For a few requests each claim is inserted alone (a refusal aborts that statement only, the
                # transaction goes on); for more, who holds a claim already is read first, inside the transaction
                # (its write lock keeps others from claiming meanwhile), and the rows go in one statement per table
                # (a savepoint and a statement per request cost more than the rows themselves).
                alone = len(batch) < _ALONE
                taken = set() if alone else self._taken(con, batch)
                mine: dict[str | bytes, _Request] = {}  # claimed in this transaction, by key
                for request in batch:
                    key = request.key
                    try:
                        if key in taken or key in mine:
                            raise sqlite3.IntegrityError(key)
                        if alone:
                            con.execute(_INSERT, request.row)
                    except sqlite3.IntegrityError:
                        first = mine.get(key)
                        held = self._held(con, key) if first is None else _held_by(first.row)
                        remedy = f"delete its row from {_TABLE}"
                        request.failure = refusal_of(request.decision_id, str(self.path), held, remedy)
                        continue
                    called.append(request)  # before the call: an interrupt right after the seal still gives it back
                    try:
                        request.spans, request.body = request.hold()  # sealed once the claim is known to be ours
                    except Exception as exc:  # noqa: BLE001 - this request's failure, raised in its own thread
                        if alone:
                            con.execute(f"DELETE FROM {_TABLE} WHERE decision_id = ?", (key,))  # its claim goes back
                        request.failure = exc
                        continue
                    mine[key] = request
                    stored.append(request)
                if stored:
                    if not alone:
                        con.executemany(_INSERT, [r.row for r in stored])
                    batch_name = pending.batch
                    con.executemany(INSERT_PENDING, [(r.row[1], r.key, instance, batch_name, r.body) for r in stored])
                committing = True
                con.execute("COMMIT")
            except BaseException as exc:
                interrupted = exc  # when it landed right after the COMMIT: raised once they are answered as kept
                if not committing or isinstance(exc, sqlite3.Error) or con.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        con.execute("ROLLBACK")
                    for request in [r for r in called if r.failure is None]:  # (a hold that raised gave itself back)
                        request.hold.give_back()  # sealed, not kept (voided): the records sealed before it go on
                    if isinstance(exc, sqlite3.Error):  # none of them claimed
                        error = exc
                        fail_all(lambda request: self.error(doing(request), error))
                    else:
                        fail_all(exc)
                    return
            self._committed += 1  # committed: kept from here on, whatever is raised (never given back)
            ticket = self._committed
            for request in stored:
                request.ticket, request.closes, request.body = ticket, pending.closes, b""
                if not self.sync_outcomes:
                    assert request.spans is not None
                    pending.added(request.row[1], request.spans)
            # Still holding the write orders: a record sealed after these must not reach the disk's durable
            # side (a gate record's fsync) before this commit does; each hold tells its pipeline how to sync it.
            sync = functools.partial(self._sync_here, os.getpid(), ticket)
            for request in stored:
                request.hold.committed(sync)
        finally:
            for order in orders:
                order.release()
        if interrupted is not None:
            raise interrupted

    def _taken(self, con: sqlite3.Connection, batch: list[_Request]) -> set[Any]:
        """Which of ``batch``'s decisions are claimed in the store already (caller is in a write transaction)."""
        taken: set[Any] = set()
        for at in range(0, len(batch), _KEYS_PER_SELECT):
            keys = [request.key for request in batch[at : at + _KEYS_PER_SELECT]]
            marks = ",".join("?" * len(keys))
            found = con.execute(f"SELECT decision_id FROM {_TABLE} WHERE decision_id IN ({marks})", keys)
            taken.update(key for (key,) in found)
        return taken

    def _held(self, con: sqlite3.Connection, key: str | bytes) -> dict[str, Any]:
        try:
            row = con.execute(
                f"SELECT claimant, claimed_ns, outcome_id FROM {_TABLE} WHERE decision_id = ?", (key,)
            ).fetchone()
        except sqlite3.Error as exc:
            raise self.error("read a claim", exc) from exc
        return {} if row is None else _held_by((None, row[2], None, row[0], row[1]))

    def release(self, key: str | bytes, outcome_id: str) -> None:
        """Delete the claim of ``key`` if it still stands for ``outcome_id`` (its outcome was never emitted)."""
        with self.lock:
            con = self.connection()
            try:
                con.execute("BEGIN IMMEDIATE")
                deleted = con.execute(
                    f"DELETE FROM {_TABLE} WHERE decision_id = ? AND outcome_id = ?", (key, outcome_id)
                ).rowcount
                if deleted:  # its outcome, if it was held here, goes with it (never handed on when released)
                    con.execute(
                        f"DELETE FROM {PENDING_TABLE} WHERE outcome_id = ? AND decision_id = ?", (outcome_id, key)
                    )
                con.execute("COMMIT")
            except sqlite3.Error as exc:
                with contextlib.suppress(sqlite3.Error):
                    con.execute("ROLLBACK")
                raise self.error("release a claim", exc) from exc

    def expire(self, before_ns: int) -> int:
        """Delete the claims taken before ``before_ns`` (retention); how many were deleted."""
        with self.lock:
            con = self.connection()
            try:
                return con.execute(f"DELETE FROM {_TABLE} WHERE claimed_ns < ?", (before_ns,)).rowcount
            except sqlite3.Error as exc:
                raise self.error("delete expired claims", exc) from exc


_ORDER_WAIT = 10.0
"""Seconds a store waits at most for a pipeline's write order before sealing outcomes without it (logged)."""


def _write_orders(batch: list[_Request]) -> list[Any]:
    """The write orders of the pipelines ``batch``'s records are sealed for, taken (release each when done).

    An outcome takes its chain position when sealed here and is durable once
    the transaction commits; a gate record sealed on another thread in
    between and made durable first would leave, after a crash, a chain in
    which the outcome reads as deleted. So the records are sealed and
    committed holding each pipeline's write order (see
    :class:`~otel_replay.capture.write_ahead.WriteAheadProcessor`), as gate
    records are sealed and queued. A write order held for longer than
    :data:`_ORDER_WAIT` (a span processor of the user's that records an
    outcome as a commit's span ends, waiting on this thread) is passed by,
    logged, rather than waited on for good.
    """
    found: dict[int, Any] = {}
    for request in batch:
        order = getattr(request.hold, "write_order", None)
        if order is not None:
            found.setdefault(id(order), order)
    taken = []
    for _, order in sorted(found.items()):
        if order.acquire(timeout=_ORDER_WAIT):
            taken.append(order)
        else:
            _log.warning(
                "otel-replay: outcomes sealed without their pipeline's write order (held over %.0f s): a crash "
                "before they commit could make verify read them as deleted",
                _ORDER_WAIT,
            )
    return taken
