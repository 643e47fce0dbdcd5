"""Where governed sessions' states live between calls and across restarts: in memory, or in a SQLite file.

Every change to a state goes through :meth:`StateStore.update`, an atomic read-modify-write: the change runs
on the state as saved and its result is saved only if nobody saved in between. That is what makes the
limits hold across threads and processes: two processes sharing a :class:`FileStateStore` can never both
take the last allowed refund.

A saved state that cannot be read (a corrupt file or row, or one written by a newer otel-replay) raises
:class:`~otel_replay.contracts.state.SessionStateError` naming the file and the session; it is never
replaced by a fresh state, which would silently reset the session's counts and forbidden tools.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from otel_replay.contracts.state import SessionState, SessionStateError
from otel_replay.location import resolve
from otel_replay.storage.backend import backend_for

__all__ = ["STORE_FORMAT", "FileStateStore", "MemoryStateStore", "StateStore", "governance_store_path"]

STORE_FORMAT = 1
"""The layout version of a :class:`FileStateStore` file (SQLite ``user_version``); a newer one is refused."""

Change = Callable[[SessionState | None], SessionState]

_BUSY_SECONDS = 60.0
_MAX_ATTEMPTS = 1000


class StateStore(Protocol):
    """A place sessions' states are kept; every implementation makes :meth:`update` atomic."""

    def load(self, session_id: str) -> SessionState | None:
        """The saved state of ``session_id`` (a copy: changing it changes nothing saved), or ``None``."""
        ...

    def update(self, session_id: str, change: Change) -> SessionState:
        """Run ``change`` on the saved state (``None`` when there is none) and save what it returns, atomically.

        ``change`` gets a fresh copy and may mutate it; it must return the state of ``session_id``. The result
        is saved only if no other update saved in between (else ``change`` runs again on the newer state), and
        its ``state_version`` is raised to at least the saved one + 1. An exception from ``change`` saves
        nothing and propagates. Returns the state saved.
        """
        ...


def _checked(session_id: str, result: object, previous: int | None) -> SessionState:
    """``result`` of a change, checked, with a version above ``previous``."""
    if not isinstance(result, SessionState):
        raise TypeError(f"a state store's change must return a SessionState, not {type(result).__name__}")
    if result.session_id != session_id:
        raise ValueError(f"a change of session {session_id!r} returned the state of {result.session_id!r}")
    if previous is not None and result.state_version <= previous:
        result.state_version = previous + 1
    return result


class MemoryStateStore:
    """States kept in this process (lost when it exits); safe to share between threads.

    Each state is kept as a private copy (:meth:`SessionState.copy`): what a caller holds, or a change
    mutates, is never the saved state itself, and a change that raises leaves the saved state as it was.
    """

    def __init__(self) -> None:
        """An empty store."""
        self._lock = threading.Lock()
        self._saved: dict[str, SessionState] = {}

    def load(self, session_id: str) -> SessionState | None:
        """See :meth:`StateStore.load`."""
        with self._lock:
            saved = self._saved.get(session_id)
            return None if saved is None else saved.copy()

    def update(self, session_id: str, change: Change) -> SessionState:
        """See :meth:`StateStore.update`; updates of one store run one at a time."""
        with self._lock:
            saved = self._saved.get(session_id)
            current = None if saved is None else saved.copy()
            result = _checked(session_id, change(current), None if saved is None else saved.state_version)
            self._saved[session_id] = result.copy()  # the caller may go on changing what it got back
            return result

    def session_ids(self) -> list[str]:
        """The sessions saved, sorted."""
        with self._lock:
            return sorted(self._saved)


def governance_store_path(dataset: str | os.PathLike[str]) -> Path:
    """Where a dataset's session states live: ``<dataset>/_governance/sessions.sqlite3``.

    For an ``s3://`` dataset the file stays local (SQLite needs a local file to lock): beside the dataset's
    local write-ahead log, ``~/.cache/otel-replay/governance/<digest of the URI>/sessions.sqlite3``.
    """
    return backend_for(resolve(dataset)).local_dir("governance") / "sessions.sqlite3"


class FileStateStore:
    """States in a SQLite file shared by every thread and process that opens it.

    :meth:`update` takes the file's write lock first (``BEGIN IMMEDIATE``), reads, changes, and saves with a
    ``state_version`` compare-and-swap, so two processes racing for the last allowed call cannot both get it.
    A writer waits up to 60 seconds for another's lock. Open one per process; it keeps one connection per
    thread (and opens new ones in a forked child).

    The file is in SQLite's write-ahead-log mode (it needs a local file system, as every SQLite lock does).
    ``fsync=True`` (the default) makes each update durable before it returns, one ``fsync`` per update (a
    power cut never forgets a refund taken); ``fsync=False`` leaves that to the operating system: an update
    survives the process crashing, the last ones may be lost if the machine does, for far less time per update.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = True) -> None:
        """Open (creating it and its directory if needed) the store at ``path``.

        Raises:
            SessionStateError: ``path`` is not a session store, is corrupt, or was written by a newer version.

        """
        self.path = Path(path)
        self.fsync = fsync
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SessionStateError(f"session store {self.path}: cannot create its directory: {exc}") from None
        self._prepare(self._connection())

    @classmethod
    def for_dataset(cls, dataset: str | os.PathLike[str], *, fsync: bool = True) -> FileStateStore:
        """The store of ``dataset`` (see :func:`governance_store_path`)."""
        return cls(governance_store_path(dataset), fsync=fsync)

    def _error(self, what: str, exc: BaseException | None = None) -> SessionStateError:
        tail = f": {exc}" if exc is not None else ""
        return SessionStateError(f"session store {self.path}: {what}{tail}")

    def _connection(self) -> sqlite3.Connection:
        local = self._local
        if getattr(local, "pid", None) != os.getpid() or getattr(local, "conn", None) is None:
            try:
                conn = sqlite3.connect(self.path, timeout=_BUSY_SECONDS, isolation_level=None, check_same_thread=False)
            except sqlite3.Error as exc:
                raise self._error("cannot open", exc) from None
            try:
                conn.execute(f"PRAGMA synchronous = {'FULL' if self.fsync else 'NORMAL'}")
            except sqlite3.Error as exc:
                conn.close()
                raise self._error("not a readable SQLite session store", exc) from None
            local.conn, local.pid = conn, os.getpid()
            with self._lock:
                self._connections.append(conn)
        opened: sqlite3.Connection = local.conn
        return opened

    def _prepare(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                if version > STORE_FORMAT:
                    raise self._error(
                        f"layout version {version} was written by a newer otel-replay (this one reads up to "
                        f"{STORE_FORMAT}); upgrade otel-replay"
                    )
                if version == 0 and tables:
                    raise self._error(f"not a session store (it holds tables {', '.join(sorted(tables))})")
                if version == 0:
                    conn.execute(
                        "CREATE TABLE sessions (session_id TEXT PRIMARY KEY, state_version INTEGER NOT NULL, "
                        "state TEXT NOT NULL, updated_at REAL NOT NULL)"
                    )
                    conn.execute(f"PRAGMA user_version = {STORE_FORMAT}")
                elif "sessions" not in tables:
                    raise self._error("corrupt: no sessions table")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("PRAGMA journal_mode = WAL")  # outside a transaction; kept in the file from now on
        except sqlite3.DatabaseError as exc:
            raise self._error("not a readable SQLite session store", exc) from None

    def _where(self, session_id: str) -> str:
        return f"session store {self.path} session {session_id!r}"

    def _key(self, session_id: str) -> str:
        """``session_id`` as SQLite can store it (UTF-8 text), else a clear error."""
        if not isinstance(session_id, str):
            raise SessionStateError(f"session store {self.path}: a session id is text, not {type(session_id).__name__}")
        try:
            session_id.encode("utf-8")
        except UnicodeEncodeError:
            raise SessionStateError(f"{self._where(session_id)}: the id is not valid Unicode text") from None
        return session_id

    def _read(self, conn: sqlite3.Connection, session_id: str) -> tuple[int, SessionState] | None:
        row = conn.execute("SELECT state_version, state FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        if row is None:
            return None
        version, text = row
        if not isinstance(text, str):
            raise SessionStateError(f"{self._where(session_id)}: corrupt state: not text")
        if type(version) is not int:
            raise SessionStateError(f"{self._where(session_id)}: corrupt state: its row's version is not an integer")
        state = SessionState.from_json(text, where=self._where(session_id))
        if state.session_id != session_id or state.state_version != version:
            raise SessionStateError(
                f"{self._where(session_id)}: corrupt state: its id or version disagrees with its row"
            )
        return version, state

    def load(self, session_id: str) -> SessionState | None:
        """See :meth:`StateStore.load`."""
        self._key(session_id)
        conn = self._connection()
        try:
            found = self._read(conn, session_id)
        except sqlite3.DatabaseError as exc:
            raise self._error(f"cannot read session {session_id!r}", exc) from None
        return None if found is None else found[1]

    def update(self, session_id: str, change: Change) -> SessionState:
        """See :meth:`StateStore.update`: the whole read-change-save holds the file's write lock."""
        self._key(session_id)
        conn = self._connection()
        for _attempt in range(_MAX_ATTEMPTS):
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise self._error(f"cannot lock for session {session_id!r}", exc) from None
            try:
                found = self._read(conn, session_id)
                previous = None if found is None else found[0]
                result = _checked(session_id, change(None if found is None else found[1]), previous)
                text = result.to_json()
                if previous is None:
                    saved = conn.execute(
                        "INSERT OR IGNORE INTO sessions VALUES (?, ?, ?, ?)",
                        (session_id, result.state_version, text, time.time()),
                    ).rowcount
                else:
                    saved = conn.execute(
                        "UPDATE sessions SET state_version = ?, state = ?, updated_at = ? "
                        "WHERE session_id = ? AND state_version = ?",
                        (result.state_version, text, time.time(), session_id, previous),
                    ).rowcount
                if saved != 1:  # someone saved in between (cannot happen under the lock; kept as the guarantee)
                    conn.execute("ROLLBACK")
                    continue
                conn.execute("COMMIT")
                return result
            except sqlite3.DatabaseError as exc:
                _rollback(conn)
                raise self._error(f"cannot update session {session_id!r}", exc) from None
            except BaseException:
                _rollback(conn)
                raise
        raise self._error(f"session {session_id!r}: {_MAX_ATTEMPTS} updates lost the race in a row")

    def session_ids(self) -> list[str]:
        """The sessions saved, sorted."""
        return [row[0] for row in self._connection().execute("SELECT session_id FROM sessions ORDER BY 1")]

    def close(self) -> None:
        """Close every connection this store opened (a later call opens a new one)."""
        with self._lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            try:
                conn.close()
            except sqlite3.Error:  # closing is best effort: the file is consistent after every commit
                continue
        self._local = threading.local()


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back if a transaction is open (a failed statement may already have ended it)."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")
