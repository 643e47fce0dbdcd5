"""Outcomes held in the claim store until they are in Parquet: the claim and the outcome are one insert.

:meth:`otel_replay.DecisionTracer.record_outcome` on a dataset that
:func:`otel_replay.configure` writes to seals the outcome inside the claim's
own transaction and stores it beside the claim, in the table
``outcome_pending`` of ``<dataset>/_outcomes/claims.sqlite3``: the row's
``body`` is the outcome's span as an OTLP ``ExportTraceServiceRequest`` (the
bytes a write-ahead log record of it would hold), after the spans of the
records the process sealed before it and had not made durable yet (held for
it, as a gate's write-ahead takes them: see
:meth:`otel_replay.Telemetry.take_sealed_before`), so a crash never leaves the
outcome after a lost record in its chain. One commit makes the decision
claimed and its outcome stored, so neither exists without the other, and no
separate write-ahead log is written.

A row is *pending* until its outcome is in Parquet. The process that wrote
it keeps the ended spans in memory and converts (:meth:`PendingOutcomes.convert`,
on a thread of its own every :data:`CONVERT_SECONDS`, at ``force_flush()``,
at shutdown and at interpreter exit) in three steps, each safe to crash in:

1. the rows about to be written have a batch name, and the store's WAL is
   synced, so the name is on disk before any Parquet file is. A row is
   inserted with the name of the batch open at the time (a conversion closes
   it, and the rows after it go to the next), so naming costs no write; with
   ``OTEL_REPLAY_OUTCOME_SYNC=machine`` a row is inserted without one and
   named by the conversion (its span is handed over only once its commit is
   synced, after the insert);
2. they are written as ``spans/date=…/outcomes-<instance>-<batch>.parquet``
   (one file per date, written to a temporary name, fsynced, renamed);
3. the batch's rows are deleted.

Every process that holds pending rows holds an ``flock`` on
``_outcomes/writers/<instance>.lock``. :func:`recover` (run with the
recovery of capture write-ahead logs: the next ``configure()``,
``otel_replay.open()``, ``compact``, ``serve``) converts the rows of every
instance whose lock is free (its process is gone; the file it locked must
still be the one at that path, as a process that let its lock go unlinks it
and, still alive, may lock a new one there): a batch that already has a
name is written again under that name (replacing whatever the dead process
wrote of it, so nothing lands twice), the rows without one get a new name
first. A body that does not decode is left in place and named in an error
(never dropped silently); the rest of its batch lands. Compaction leaves a
held batch's files out (:func:`held_files`): merged into a compacted file and
deleted, a file a recovery then wrote again would store its outcomes twice.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import secrets
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from otel_replay._flock import try_lock
from otel_replay.exporters.schema import OUTCOMES_DIR, SPANS_DIR
from otel_replay.exporters.writer import write_partitions
from otel_replay.storage.log_files import in_flight

__all__ = [
    "CLAIMS_DB",
    "CONVERT_SECONDS",
    "FILE_PREFIX",
    "PENDING_MIGRATION",
    "PENDING_SCHEMA",
    "PENDING_TABLE",
    "WRITERS_DIR",
    "PendingOutcomes",
    "held_files",
    "recover",
]

_log = logging.getLogger(__name__)

PENDING_TABLE = "outcome_pending"
"""The claim store's table of outcomes not yet in Parquet (older versions never read it)."""
_PENDING_COLUMNS = (
    "outcome_id TEXT NOT NULL UNIQUE, "  # the outcome's record id (its claim's outcome_id)
    "decision_id NOT NULL, "  # the claim's key (TEXT, or BLOB for ids with lone surrogates)
    "instance TEXT NOT NULL, "  # the writing process's instance: its lock is writers/<instance>.lock
    "batch TEXT, "  # the batch the row is written in; NULL until a conversion names it (machine sync, older versions)
    "body BLOB NOT NULL)"
)
PENDING_SCHEMA = (f"CREATE TABLE IF NOT EXISTS {PENDING_TABLE} ({_PENDING_COLUMNS}",)
"""Statements that add the table to a store that has none. A rowid table: a row is appended at the end of the
table's b-tree, where keyed by the outcome's random id (a table ``WITHOUT ROWID``, as it was made at first) each
1.2 KB row went to a random page of about three rows, splitting and rebalancing pages: 113 against 25 us of CPU
per outcome in shared transactions. No index on (instance, batch): the table holds only what is not in Parquet yet."""
PENDING_MIGRATION = (
    f"CREATE TABLE {PENDING_TABLE}_new ({_PENDING_COLUMNS}",
    f"INSERT INTO {PENDING_TABLE}_new SELECT outcome_id, decision_id, instance, batch, body FROM {PENDING_TABLE}",
    f"DROP TABLE {PENDING_TABLE}",
    f"ALTER TABLE {PENDING_TABLE}_new RENAME TO {PENDING_TABLE}",
)
"""Statements (one transaction) that turn the table as first made (``WITHOUT ROWID``) into a rowid table, rows kept.
Same name and columns: a process of the version before keeps reading and writing it (SQLite prepares its
statements again when the schema changed)."""
INSERT_PENDING = f"INSERT INTO {PENDING_TABLE} VALUES (?, ?, ?, ?, ?)"
"""A held outcome's row: outcome id, decision (the claim's key), instance, batch (or ``None``), body."""
WRITERS_DIR = "writers"
"""Under ``_outcomes/``: one lock file per live process holding pending outcomes."""
FILE_PREFIX = "outcomes-"
"""How the Parquet files of converted outcomes are named: ``outcomes-<instance>-<batch>.parquet``."""
_SAFE = re.compile(r"[0-9A-Za-z_-]{1,64}")  # the instance and batch names this module gives (file name parts)
CLAIMS_DB = "claims.sqlite3"
"""The local claim store's file name in ``_outcomes/`` (beside it SQLite keeps ``-wal`` and ``-shm``)."""
CONVERT_SECONDS = 5.0
"""How old a process's oldest pending outcome gets before it converts them (unless its pipeline's file age is given)."""


def _file_name(instance: str, batch: str) -> Callable[[str], str]:
    name = f"{FILE_PREFIX}{instance}-{batch}.parquet"
    return lambda _date: name


def _write(dataset: Path, table: pa.Table, instance: str, batch: str) -> int:
    """Write ``table`` as the batch's files (one per date); rows written."""
    if table.num_rows:
        write_partitions(table, dataset / SPANS_DIR, _file_name(instance, batch))
    return int(table.num_rows)


def _note_rejected(rejected: list[str], where: Path) -> None:
    for line in rejected[:10]:
        _log.error("otel-replay: outcome held in %s could not be stored: %s", where, line)


class PendingOutcomes:
    """The pending outcomes of this process in one claim store: its instance lock, its spans, their conversion.

    ``store`` is the claim store (:class:`otel_replay.storage.outcome_claims`):
    its ``lock`` guards the connection and :attr:`spans` together, so a row
    and its span are always in the same state.
    """

    def __init__(self, store: Any) -> None:
        """Pending outcomes of ``store`` (nothing on disk until :meth:`instance_for_insert`)."""
        self.store = store
        self.dataset = store.directory.parent
        self.instance = f"{os.getpid()}-{secrets.token_hex(4)}"
        self.spans: list[tuple[str, list[Any]]] = []  # (outcome id, its row's spans): rows in no closed batch
        # Rows are inserted already named (see :attr:`batch`), except with a machine sync, where a row's span is
        # handed over (:meth:`added`) only after its commit is synced: a conversion meanwhile must not close the
        # batch the row names without its span, so such rows are named by the conversion, as they always were.
        self.named_on_insert = not store.sync_outcomes
        self._unwritten: list[tuple[str, list[Any]]] = []  # named batches not yet written (a write failed)
        self._batches = 0
        self._oldest = 0.0  # when the oldest of ``spans`` was added (monotonic)
        self.interval = CONVERT_SECONDS  # how old the oldest span gets before the thread converts
        self._lock_fd: int | None = None
        self._convert_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._restart = False  # a row was added while a close converted: that close starts the thread again
        self.converted = 0
        self.convert_errors = 0
        self.closes = 0
        """How many times :meth:`close` began (under the store's lock): see :meth:`added`."""
        _all.add(self)

    @property
    def lock_path(self) -> Path:
        """The lock file of this instance."""
        return self.store.directory / WRITERS_DIR / f"{self.instance}.lock"

    @property
    def batch(self) -> str | None:
        """The batch a row inserted now is named for (the one the next conversion writes); ``None``: named later."""
        return str(self._batches + 1) if self.named_on_insert else None

    def instance_for_insert(self) -> str:
        """The name of this instance, its lock taken first (caller holds the store's lock). Raises ``OSError``."""
        if self._lock_fd is None:
            self.lock_path.parent.mkdir(exist_ok=True)
            fd = try_lock(self.lock_path)
            if fd is None:
                raise BlockingIOError(f"the writer lock {self.lock_path} is held by another descriptor")
            self._lock_fd = fd
        return self.instance

    def added(self, outcome_id: str, spans: list[Any], *, committed_at: int | None = None) -> bool:
        """The row of ``outcome_id`` is committed (synced where the store syncs): its ``spans`` go in the next batch.

        ``spans``: the outcome's ended span, last, after those of the records
        sealed before it that its row holds too (see ``claim_store.Hold``).
        ``committed_at``: :attr:`closes` when the row was committed, for a row
        handed over only once synced. ``True`` when a :meth:`close` began
        since: the caller converts now (no thread is started past a shutdown).
        """
        if not self.spans:
            self._oldest = time.monotonic()
        self.spans.append((outcome_id, spans))
        if committed_at is not None and committed_at != self.closes:
            return True
        if self._thread is None or not self._thread.is_alive():
            if self._stop.is_set():  # a close is converting (another pipeline on this dataset is open): it restarts
                self._restart = True
            else:
                self._start()
        return False

    def _start(self) -> None:
        """Start the converter thread (caller holds the store's lock)."""
        self._thread = threading.Thread(target=self._loop, name="otel-replay-outcomes", daemon=True)
        self._thread.start()

    def convert_late(self) -> None:
        """Outcomes :meth:`added` after a :meth:`close` began: to Parquet now, on the caller's thread.

        Their row was committed before that shutdown converted, their span
        handed over after it: written here, the caller returns with them in
        Parquet, and no converter thread is started past the shutdown. When
        this fails they stay in the claim store, for the exit or the next
        recovery to write (logged).
        """
        try:
            self.convert()
        except Exception as exc:  # noqa: BLE001 - durable in the claim store already: converted later
            self.convert_errors += 1
            _log.error("otel-replay: converting outcomes held in %s after shutdown failed: %s", self.store.path, exc)

    def _loop(self) -> None:
        while not self._stop.wait(max(0.05, min(self.interval / 4, 1.0))):
            if not self.spans or time.monotonic() - self._oldest < self.interval:
                continue  # one Parquet file per interval, as the exporter writes them
            try:
                self.convert()
            except Exception as exc:  # noqa: BLE001 - the rows stay in the claim store: retried next time
                self.convert_errors += 1
                _log.error("otel-replay: converting outcomes held in %s failed: %s", self.store.path, exc)

    def convert(self) -> int:
        """Write every outcome added so far to Parquet and delete its row; rows written. Raises what writing raises."""
        with self._convert_lock:
            store = self.store
            with store.lock:
                spans, self.spans = self.spans, []
                if spans:
                    batch = str(self._batches + 1)
                    if not self.named_on_insert:
                        try:
                            store.connection().executemany(
                                f"UPDATE {PENDING_TABLE} SET batch = ? WHERE outcome_id = ?",
                                [(batch, key) for key, _ in spans],
                            )
                        except sqlite3.Error as exc:
                            self.spans[:0] = spans
                            raise store.error("name a batch of outcomes", exc) from exc
                    self._batches += 1  # closed: the rows inserted from now on are named for the next batch
                    self._unwritten.append((batch, [span for _, row_spans in spans for span in row_spans]))
            if spans:
                store.sync_all()  # the batch's name on disk before any of its files is
            rows = 0
            if self._unwritten:
                # Imported here for start-up cost: the span conversion loads the OpenTelemetry SDK and the OTLP
                # classes, which a reader that only opens the claim store (to find nothing to recover) never uses.
                from otel_replay.exporters.rows import spans_to_table
            while self._unwritten:
                batch, batch_spans = self._unwritten[0]
                rejected: list[str] = []
                rows += _write(self.dataset, spans_to_table(batch_spans, rejected), self.instance, batch)
                _note_rejected(rejected, store.path)
                with store.lock:
                    try:
                        store.connection().execute(
                            f"DELETE FROM {PENDING_TABLE} WHERE instance = ? AND batch = ?", (self.instance, batch)
                        )
                    except sqlite3.Error as exc:  # written: a recovery rewrites the same files, adds nothing
                        raise store.error("forget a converted batch of outcomes", exc) from exc
                self._unwritten.pop(0)
            self.converted += rows
            return rows

    def close(self) -> None:
        """Stop the thread, convert the rest; with no row of this instance left, drop the lock file.

        A row left (a write failed, or another thread recorded an outcome since the conversion) keeps the lock while
        this process lives: its converter or its exit writes it; after a crash a recovery does.
        """
        with self.store.lock:
            self.closes += 1
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._thread = None
        try:
            self.convert()
        except Exception as exc:  # noqa: BLE001 - kept in the claim store for the next recovery
            self.convert_errors += 1
            _log.error(
                "otel-replay: converting outcomes held in %s at exit failed: %s; the next configure() on this "
                "dataset converts them",
                self.store.path,
                exc,
            )
            return
        finally:
            with self.store.lock:
                self._stop = threading.Event()
                restart, self._restart = self._restart, False
                if restart and self.spans:  # added meanwhile, after the conversion took the rows
                    self._start()
        store = self.store
        if self._lock_fd is None:
            return
        with store.lock:  # no row of this instance can be inserted meanwhile (an insert takes this lock)
            try:
                # A thread may have recorded an outcome since the conversion (another pipeline on this dataset is
                # still open): its row is this live process's to write, so the lock stays, else another process
                # would recover the row while this one writes it too.
                held = store.connection(settled=True).execute(  # the open one: never a store made at exit
                    f"SELECT 1 FROM {PENDING_TABLE} WHERE instance = ? LIMIT 1", (self.instance,)
                ).fetchone()
            except Exception as exc:  # noqa: BLE001 - kept locked: converted later by this process, never twice
                _log.error("otel-replay: cannot read the outcomes held in %s at close: %s", store.path, exc)
                return
            if held is not None:
                return
            fd, self._lock_fd = self._lock_fd, None
            if fd is not None:
                with contextlib.suppress(OSError):
                    self.lock_path.unlink()
                os.close(fd)


_all: weakref.WeakSet[PendingOutcomes] = weakref.WeakSet()


def _close_at_exit() -> None:
    for pending in list(_all):
        if pending.instance.startswith(f"{os.getpid()}-"):  # a forked child leaves its parent's to the parent
            pending.close()


atexit.register(_close_at_exit)


def held_files(dataset: Path, names: Sequence[str]) -> set[str]:
    """Which of a partition's file ``names`` belong to batches of outcomes the claim store still holds.

    Compaction leaves them out (they are compacted once their rows are
    forgotten): a batch is held until its rows are deleted after its files
    were written, and a recovery writes a held batch again under its name. A
    file merged into a compacted one and then deleted would be written again,
    and its outcomes stored twice. Race-free with the listing ``names`` came
    from, taken first: a batch's file exists only once its name is in the
    store, and a batch whose rows are deleted is never held again. A store
    that cannot be read holds every outcomes file (said in the log); a dataset
    without one holds none, and nothing is opened unless a name is an outcomes file.

    The files of a write-ahead log segment still on disk are held the same
    way (:func:`_log_held`).
    """
    logs = _log_held(dataset, names)
    candidates = [name for name in names if name.startswith(FILE_PREFIX)]
    if not candidates:
        return logs
    path = dataset / OUTCOMES_DIR / CLAIMS_DB
    if not path.exists():
        return logs
    try:
        with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=60.0)) as con:
            held = con.execute(f"SELECT DISTINCT instance, batch FROM {PENDING_TABLE} WHERE batch IS NOT NULL")
            names_held = {f"{FILE_PREFIX}{instance}-{batch}.parquet" for instance, batch in held}
    except sqlite3.Error as exc:
        if "no such table" in str(exc):  # a store an older version made holds no outcomes
            return set()
        _log.warning(
            "otel-replay: the outcome claim store %s cannot be read (%s): the %d outcomes file(s) here are "
            "left out of this compaction, as they may still be held",
            path,
            str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            len(candidates),
        )
        return logs | set(candidates)
    return logs | {name for name in candidates if name in names_held}


def _log_held(dataset: Path, names: Sequence[str]) -> set[str]:
    """The ``names`` converted from write-ahead log segments under ``<dataset>/_wal/`` that are still on disk.

    A segment is deleted only after its files are written: one still there
    (its process died in between, or is converting it now) is converted
    again under the same names by a recovery, a receiver's restart or its
    live owner. Merged into a compacted file and deleted meanwhile, such a
    file would come back beside it and its rows be stored twice; so
    compaction leaves it out until the segment is gone. A receiver's
    quarantined segment not yet salvaged (no report) counts too. Race-free
    with the listing ``names`` came from, taken first: a segment released
    after it is simply not held.
    """
    return in_flight(dataset / "_wal", names)


def _bodies_table(rows: Sequence[tuple[Any, Any, Any]], where: Path) -> tuple[pa.Table | None, list[Any], list[Any]]:
    """The rows of the bodies that decode, the outcome ids converted and those whose bodies do not decode."""
    # Imported here for start-up cost: the OTLP classes and the span conversion load only when there is a body to
    # convert, not in every reader that opens the claim store to find nothing to recover.
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from otel_replay.exporters.rows import payload_to_table

    good: list[bytes] = []
    keys: list[Any] = []
    bad: list[Any] = []
    for key, decision, body in rows:
        try:
            if not isinstance(body, bytes):
                raise TypeError(f"a {type(body).__name__}, not bytes")
            ExportTraceServiceRequest.FromString(body)
        except Exception as exc:  # noqa: BLE001 - a damaged row is named and kept, the others land
            bad.append(key)
            shown = decision.decode("utf-8", "backslashreplace") if isinstance(decision, bytes) else str(decision)
            _log.error(
                "otel-replay: outcome %r of decision %r held in %s does not decode (%s); it is left there",
                str(key)[:200],
                shown[:200],
                where,
                exc,
            )
            continue
        good.append(body)
        keys.append(key)
    if not good:
        return None, keys, bad
    rejected: list[str] = []
    table = payload_to_table(b"".join(good), rejected)
    _note_rejected(rejected, where)
    return table, keys, bad


def recover(store: Any) -> int:
    """Convert the pending outcomes of processes that are gone (their lock free); rows written.

    ``store``: the claim store (its connection, lock and sync). Raises
    ``OSError`` from writing Parquet (the rows stay for the next try).
    """
    with store.lock:
        con = store.connection()
        try:
            instances = [row[0] for row in con.execute(f"SELECT DISTINCT instance FROM {PENDING_TABLE}")]
        except sqlite3.Error as exc:
            raise store.error("read the outcomes held there", exc) from exc
    own = store.pending.instance if store.pending is not None else None
    rows = 0
    for instance in instances:
        if instance == own:
            continue
        if not isinstance(instance, str) or not _SAFE.fullmatch(instance):
            _log.error(
                "otel-replay: outcomes held in %s under the instance %r are left there: not a name this code gives",
                store.path,
                str(instance)[:200],
            )
            continue
        lock = store.directory / WRITERS_DIR / f"{instance}.lock"
        try:
            lock.parent.mkdir(exist_ok=True)
            fd = try_lock(lock)
        except OSError:
            continue
        if fd is None:
            continue  # its process is alive and converts them itself
        if not _still_at(fd, lock):
            # The file locked was unlinked since it was opened: its process let it go (or another recovery was
            # done with it), and the process may be alive under a new lock file of this name, holding new rows.
            os.close(fd)
            continue
        try:
            written, left = _recover_instance(store, instance)
            rows += written
            if not left:  # rows left (named in the log) keep the lock file: the next recovery tries them again
                with contextlib.suppress(OSError):
                    lock.unlink()
        finally:
            os.close(fd)
    if rows:
        _log.info("otel-replay: recovered %d outcome(s) held in %s by processes that died", rows, store.path)
    return rows


def _still_at(fd: int, path: Path) -> bool:
    """Whether the file open as ``fd`` is still the one at ``path`` (not unlinked or replaced since it was opened)."""
    try:
        held, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)


def _recover_instance(store: Any, instance: str) -> tuple[int, int]:
    """Convert the rows of the dead ``instance``: named batches under their names, the rest under a new one.

    Rows written, and rows left in the store (named in the log).
    """
    fresh = f"r{secrets.token_hex(6)}"
    with store.lock:
        con = store.connection()
        try:
            con.execute(f"UPDATE {PENDING_TABLE} SET batch = ? WHERE instance = ? AND batch IS NULL", (fresh, instance))
            batches = [
                row[0]
                for row in con.execute(
                    f"SELECT DISTINCT batch FROM {PENDING_TABLE} WHERE instance = ? ORDER BY batch", (instance,)
                )
            ]
        except sqlite3.Error as exc:
            raise store.error("name a batch of outcomes left by a process that died", exc) from exc
    store.sync_all()
    rows = left = 0
    for batch in batches:
        if not isinstance(batch, str) or not _SAFE.fullmatch(batch):
            left += 1
            _log.error(
                "otel-replay: outcomes held in %s in the batch %r are left there: not a name this code gives",
                store.path,
                str(batch)[:200],
            )
            continue
        with store.lock:
            try:
                held = (
                    store.connection()
                    .execute(
                        f"SELECT outcome_id, decision_id, body FROM {PENDING_TABLE} WHERE instance = ? AND batch = ? "
                        "ORDER BY outcome_id",
                        (instance, batch),
                    )
                    .fetchall()
                )
            except sqlite3.Error as exc:
                raise store.error("read outcomes left by a process that died", exc) from exc
        table, keys, bad = _bodies_table(held, store.path)
        left += len(bad)
        if table is not None:
            rows += _write(Path(store.directory).parent, table, instance, batch)
        with store.lock:
            try:
                store.connection().executemany(
                    f"DELETE FROM {PENDING_TABLE} WHERE outcome_id = ? AND instance = ?", [(k, instance) for k in keys]
                )
            except sqlite3.Error as exc:
                raise store.error("forget recovered outcomes", exc) from exc
    return rows, left
