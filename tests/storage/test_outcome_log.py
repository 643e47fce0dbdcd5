"""Outcomes held beside their claims (``_outcomes/claims.sqlite3``, table ``outcome_pending``) until in Parquet:
a crash at every step of the way keeps each outcome exactly once; racing processes get one outcome per decision; a
hostile or broken store is a clear error, and what it holds is never dropped."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sqlite3
import subprocess
import textwrap
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

import otel_replay
from otel_replay import DecisionTracer, OutcomeAlreadyRecorded
from otel_replay.errors import ConfigError, DatasetError
from otel_replay.storage import compact, outcome_claims, outcome_log

from .._support import Zygote


def _db(dataset: Path) -> contextlib.closing[sqlite3.Connection]:
    return contextlib.closing(sqlite3.connect(dataset / "_outcomes" / "claims.sqlite3", isolation_level=None))


def _pending(dataset: Path) -> list[tuple[str, str | None]]:
    with _db(dataset) as con:
        return sorted(con.execute("SELECT outcome_id, batch FROM outcome_pending").fetchall())


def _stored_outcomes(dataset: Path) -> list[str]:
    """Every outcome span's record id in the dataset's Parquet files, one per stored row (duplicates kept)."""
    with otel_replay.open(dataset) as store:
        return sorted(r["record_id"] for r in store.rows("SELECT record_id FROM spans WHERE name = 'replay.outcome'"))


def _child(zygote: Zygote, dataset: Path, body: str, *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``body`` in a process of its own (forked with the package imported) with the dataset configured
    (``telemetry``) and decisions flushed."""
    code = textwrap.dedent("""
        import os, signal, sys
        import otel_replay
        from otel_replay import DecisionTracer
        from otel_replay.storage import outcome_log
        telemetry = otel_replay.configure(DATASET, set_global=False)
        tracer = DecisionTracer()
    """).replace("DATASET", repr(str(dataset))) + textwrap.dedent(body)
    done = zygote.run(code, timeout=120)
    if check:
        assert done.returncode in (0, -signal.SIGKILL), done.stderr
    return done


# Where the process dies inside the conversion: after the batch was named but before its Parquet file; after the
# file, before the rows were deleted. (Right after record_outcome() returned: tests/capture/test_outcome_durability.py.)
_DEATHS = {
    "batch named, no Parquet yet": """
        outcome_log._write = lambda *_: os._exit(0)
        telemetry.force_flush()
    """,
    "Parquet written, rows not yet deleted": """
        real = outcome_log._write
        def write_then_die(*args):
            real(*args)
            os._exit(0)
        outcome_log._write = write_then_die
        telemetry.force_flush()
    """,
}


@pytest.mark.parametrize("death", list(_DEATHS), ids=["named", "written"])
def test_a_process_dying_at_any_step_leaves_each_acknowledged_outcome_stored_exactly_once(dataset, death, zygote):
    done = _child(
        zygote,
        dataset,
        textwrap.dedent("""
            decisions = [tracer.decision("agent", "approve", f"r{i}", correlation_id="loan-1") for i in range(3)]
            telemetry.force_flush()
            outcomes = [tracer.record_outcome(d, i != 1, f"note {i}").record_id for i, d in enumerate(decisions)]
            print(" ".join(decisions), flush=True)
            print(" ".join(outcomes), flush=True)
        """)
        + textwrap.dedent(_DEATHS[death]),
    )
    decisions, outcomes = (line.split() for line in done.stdout.splitlines()[:2])
    assert len(_pending(dataset)) == 3  # held, not yet (or not known to be) in Parquet
    assert _stored_outcomes(dataset) == sorted(outcomes)  # the reader recovered them: each once
    assert _pending(dataset) == []
    assert os.listdir(dataset / "_outcomes" / "writers") == []  # the dead process's lock went with its rows
    otel_replay.configure(dataset, set_global=False).shutdown()  # a second recovery adds nothing
    assert _stored_outcomes(dataset) == sorted(outcomes)
    with otel_replay.open(dataset) as store:
        verified = store.verified_outcomes(decisions)
        assert [verified[d]["outcome_correct"] for d in decisions] == [True, False, True]
        with pytest.raises(OutcomeAlreadyRecorded, match=f"decision {decisions[0]} already has an outcome"):
            DecisionTracer(store=store).record_outcome(decisions[0], False)


def test_a_live_process_keeps_its_held_outcomes_from_another_process_recovering_them(dataset, zygote):
    # Files roll every 10 minutes here: the outcome stays held while another process opens the dataset.
    with otel_replay.configure(dataset, set_global=False, max_file_age_seconds=600) as telemetry:
        tracer = DecisionTracer()
        decision = tracer.decision("agent", "approve", "r")
        outcome = tracer.record_outcome(decision, True).record_id
        _child(zygote, dataset, "telemetry.shutdown()")  # its configure() runs a recovery
        assert _pending(dataset) == [(outcome, "1")]  # still this process's to write, in its open batch
        assert telemetry.force_flush()
    assert _stored_outcomes(dataset) == [outcome]


def test_processes_racing_for_the_same_decisions_outcomes_each_win_once_and_store_one_outcome(dataset, zygote):
    with otel_replay.configure(dataset, set_global=False) as telemetry:
        tracer = DecisionTracer()
        decisions = [tracer.decision("agent", "approve", f"r{i}") for i in range(40)]
        telemetry.force_flush()
    go = dataset / "go"
    racer = f"""
        import time
        from otel_replay import OutcomeAlreadyRecorded
        while not os.path.exists({str(go)!r}):
            time.sleep(0.01)
        for decision in {decisions!r}:
            try:
                print("won", decision, tracer.record_outcome(decision, os.getpid() % 2 == 0).record_id, flush=True)
            except OutcomeAlreadyRecorded:
                print("lost", decision, flush=True)
        telemetry.shutdown()
    """
    code = textwrap.dedent("""
        import os
        import otel_replay
        from otel_replay import DecisionTracer
        telemetry = otel_replay.configure(DATASET, set_global=False)
        tracer = DecisionTracer()
    """).replace("DATASET", repr(str(dataset))) + textwrap.dedent(racer)
    children = [zygote.popen(code) for _ in range(2)]
    go.write_text("go")
    outputs = [child.communicate(timeout=120) for child in children]
    assert [child.returncode for child in children] == [0, 0], [err for _, err in outputs]
    won = [line.split() for out, _ in outputs for line in out.splitlines() if line.startswith("won")]
    lost = [line.split() for out, _ in outputs for line in out.splitlines() if line.startswith("lost")]
    assert sorted(w[1] for w in won) == sorted(decisions)
    assert len(lost) == len(decisions)
    assert _stored_outcomes(dataset) == sorted(w[2] for w in won)
    assert _pending(dataset) == []


def test_a_held_outcome_whose_parquet_write_fails_stays_held_and_lands_once_on_the_next_flush(dataset, caplog):
    with otel_replay.configure(dataset, set_global=False, max_file_age_seconds=600) as telemetry:
        tracer = DecisionTracer()
        decision = tracer.decision("agent", "approve", "r")
        assert telemetry.force_flush()
        outcome = tracer.record_outcome(decision, True).record_id
        store = outcome_claims._stores[(os.getpid(), str(dataset))]
        assert store.pending is not None
        # A directory where the batch's file goes: the write fails for real.
        date = datetime.now(UTC).strftime("%Y-%m-%d")
        blocker = dataset / "spans" / f"date={date}" / f"outcomes-{store.pending.instance}-1.parquet"
        blocker.mkdir(parents=True)
        (blocker / "keep").write_text("x")
        with caplog.at_level(logging.ERROR, logger="otel_replay"):
            assert telemetry.force_flush() is False
        assert any(f"writing the outcomes held in {dataset} failed" in r.getMessage() for r in caplog.records)
        assert _pending(dataset) == [(outcome, "1")]  # named, kept
        (blocker / "keep").unlink()
        blocker.rmdir()
        assert telemetry.force_flush()
        assert _pending(dataset) == []
    assert _stored_outcomes(dataset) == [outcome]


def test_a_recovered_row_that_does_not_decode_is_named_and_kept_and_the_others_land(dataset, caplog, zygote):
    done = _child(
        zygote,
        dataset,
        """
        decisions = [tracer.decision("agent", "approve", f"r{i}") for i in range(2)]
        telemetry.force_flush()
        print(" ".join(decisions), " ".join(tracer.record_outcome(d, True).record_id for d in decisions), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """,
    )
    first, second, good, bad = done.stdout.split()
    with _db(dataset) as con:
        con.execute("UPDATE outcome_pending SET body = ? WHERE outcome_id = ?", (b"\xff\x00garbage" * 10, bad))
    with caplog.at_level(logging.ERROR, logger="otel_replay"):
        assert _stored_outcomes(dataset) == [good]
    said = [r.getMessage() for r in caplog.records if "does not decode" in r.getMessage()]
    assert len(said) == 1 and f"outcome {bad!r} of decision {second!r}" in said[0] and "left there" in said[0]
    assert [row[0] for row in _pending(dataset)] == [bad]  # never dropped
    assert len(os.listdir(dataset / "_outcomes" / "writers")) == 1  # so the next recovery says so again


def test_hostile_instance_and_batch_names_in_the_store_write_nothing_outside_the_dataset(dataset, tmp_path, caplog):
    with otel_replay.configure(dataset, set_global=False) as telemetry:
        tracer = DecisionTracer()
        tracer.record_outcome(tracer.decision("agent", "approve", "r"), True)
        assert telemetry.force_flush()
    with _db(dataset) as con:
        con.execute("INSERT INTO outcome_pending VALUES ('o-1', 'd-1', '../../../escaped', NULL, x'00')")
        con.execute("INSERT INTO outcome_pending VALUES ('o-2', 'd-2', 'dead-1', '../../../escaped', x'00')")
    (dataset / "_outcomes" / "writers" / "dead-1.lock").write_text("")
    with caplog.at_level(logging.ERROR, logger="otel_replay"):
        otel_replay.configure(dataset, set_global=False).shutdown()
    assert not [p for p in tmp_path.rglob("*") if "escaped" in p.name]
    assert [row[0] for row in _pending(dataset)] == ["o-1", "o-2"]  # left as they are, and said so
    said = [r.getMessage() for r in caplog.records if "are left there" in r.getMessage()]
    assert len(said) == 2 and "'../../../escaped'" in said[0] and "'../../../escaped'" in said[1]


def test_an_outcome_whose_lock_cannot_be_taken_is_a_one_line_error_and_nothing_is_claimed(dataset):
    with otel_replay.configure(dataset, set_global=False) as telemetry:
        tracer = DecisionTracer()
        decision = tracer.decision("agent", "approve", "r")
        assert telemetry.force_flush()
        (dataset / "_outcomes").mkdir()
        (dataset / "_outcomes" / "writers").write_text("a file where the lock directory goes")
        with pytest.raises(DatasetError) as raised:
            tracer.record_outcome(decision, True)
        message = str(raised.value)
        assert message.startswith(f"outcome claim store {dataset / '_outcomes' / 'claims.sqlite3'}: cannot ")
        assert "writers" in message and "\n" not in message
        (dataset / "_outcomes" / "writers").unlink()
        outcome = tracer.record_outcome(decision, False).record_id  # nothing was claimed by the failed call
    assert _stored_outcomes(dataset) == [outcome]


def test_machine_sync_shares_fdatasyncs_between_threads_and_stores_each_outcome_once(dataset, monkeypatch):
    monkeypatch.setenv("OTEL_REPLAY_OUTCOME_SYNC", "machine")
    syncs: list[int] = []
    real = os.fdatasync

    def slow(fd: int) -> None:  # a slow disk: every sync takes 20 ms, so concurrent outcomes wait on one
        syncs.append(fd)
        time.sleep(0.02)
        real(fd)

    with otel_replay.configure(dataset, set_global=False) as telemetry:
        tracer = DecisionTracer()
        decisions = [tracer.decision("agent", "approve", f"r{i}") for i in range(160)]
        assert telemetry.force_flush()
        monkeypatch.setattr(outcome_claims.os, "fdatasync", slow)
        outcomes: list[str] = []

        def record(part: list[str]) -> None:
            for decision in part:
                outcomes.append(tracer.record_outcome(decision, True).record_id)

        threads = [threading.Thread(target=record, args=(decisions[k::8],)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert 1 <= len(syncs) <= len(decisions) // 2, len(syncs)  # synced before returning, syncs shared
        assert telemetry.force_flush()
    assert _stored_outcomes(dataset) == sorted(outcomes)


def test_an_unknown_outcome_sync_level_is_a_config_error_naming_the_variable(dataset, monkeypatch):
    refused = r"^OTEL_REPLAY_OUTCOME_SYNC='fast' must be 'process' or 'machine'$"
    monkeypatch.setenv("OTEL_REPLAY_OUTCOME_SYNC", "fast")
    with pytest.raises(ConfigError, match=refused):  # at configure(), not at the first outcome
        otel_replay.configure(dataset, set_global=False)
    monkeypatch.setenv("OTEL_REPLAY_OUTCOME_SYNC", "process")
    with otel_replay.configure(dataset, set_global=False):
        tracer = DecisionTracer()
        decision = tracer.decision("agent", "approve", "r")
        monkeypatch.setenv("OTEL_REPLAY_OUTCOME_SYNC", "fast")  # changed after configure(): read at the first claim
        with pytest.raises(ConfigError, match=refused):
            tracer.record_outcome(decision, True)
        monkeypatch.setenv("OTEL_REPLAY_OUTCOME_SYNC", "process")
        tracer.record_outcome(decision, True)  # the refused call claimed nothing


def test_threads_sharing_transactions_each_get_their_own_answer(dataset):
    # Eight threads record outcomes for the same decisions, each decision twice: the outcomes committed together
    # in one transaction still answer one by one (one stored, one refused per decision), and nothing else is held.
    with otel_replay.configure(dataset, set_global=False) as telemetry:
        tracer = DecisionTracer()
        decisions = [tracer.decision("agent", "approve", f"r{i}") for i in range(60)]
        assert telemetry.force_flush()
        won: list[str] = []
        refused: list[str] = []

        def record(part: list[str]) -> None:
            for decision in part:
                try:
                    won.append(DecisionTracer().record_outcome(decision, True).record_id)
                except OutcomeAlreadyRecorded as exc:
                    refused.append(str(exc).split()[1])

        threads = [threading.Thread(target=record, args=((decisions * 2)[k::8],)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == len(decisions) and sorted(refused) == sorted(decisions)
        assert telemetry.force_flush()
    assert _stored_outcomes(dataset) == sorted(won)
    assert _pending(dataset) == []


class _Interrupted(BaseException):
    """What a signal handler or a timeout library raises in a thread: no ``Exception``, so nothing catches it."""


def test_a_transaction_leader_interrupted_before_it_began_leaves_the_outcomes_it_held_failed_not_pending(dataset):
    # Two threads' outcomes go in one transaction, led by whichever thread takes the store first; the leader is
    # interrupted before the transaction begins. The other thread's outcome was in the leader's hands: it must fail
    # with an error saying so (nothing claimed), never be answered as recorded, nor stumble on an empty batch.
    with otel_replay.configure(dataset, set_global=False, max_file_age_seconds=600) as telemetry:
        tracer = DecisionTracer()
        decisions = [tracer.decision("agent", "approve", f"r{i}") for i in range(3)]
        assert telemetry.force_flush()
        tracer.record_outcome(decisions[0], True)  # the store and its writer lock exist
        store = outcome_claims._store(str(dataset))
        answers: dict[str, BaseException | str] = {}

        def record(decision: str) -> None:
            try:
                answers[decision] = DecisionTracer().record_outcome(decision, True).record_id
            except BaseException as exc:  # noqa: BLE001 - the answer under test
                answers[decision] = exc

        real = outcome_log.PendingOutcomes.instance_for_insert
        interrupted: list[bool] = []

        def interrupt_once(pending: outcome_log.PendingOutcomes) -> str:
            if not interrupted:
                interrupted.append(True)
                raise _Interrupted
            return real(pending)

        threads = [threading.Thread(target=record, args=(d,)) for d in decisions[1:]]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(outcome_log.PendingOutcomes, "instance_for_insert", interrupt_once)
            with store.lock:  # both requests queue before either thread leads
                for thread in threads:
                    thread.start()
                deadline = time.monotonic() + 60
                while len(store._queue) < 2 and time.monotonic() < deadline:
                    time.sleep(0.005)
            for thread in threads:
                thread.join()
        kinds = sorted(type(answers[d]).__name__ for d in decisions[1:])
        assert kinds == ["DatasetError", "_Interrupted"], answers
        said = next(str(a) for a in answers.values() if isinstance(a, DatasetError))
        assert "interrupted" in said and "\n" not in said
        with _db(dataset) as con:
            assert con.execute("SELECT decision_id FROM outcome_claims").fetchall() == [(decisions[0],)]
        again = [tracer.record_outcome(d, False).record_id for d in decisions[1:]]  # nothing was claimed for them
        assert telemetry.force_flush()
    assert len(_stored_outcomes(dataset)) == 3 and set(again) <= set(_stored_outcomes(dataset))


def test_compaction_before_recovery_never_makes_a_dead_processes_held_outcome_appear_twice(dataset, zygote):
    # The process dies after writing its batch's Parquet file and before forgetting the rows: they are still held.
    # A compaction (old files deleted at once) runs before any recovery; the recovery that follows writes the batch
    # again under its name. Merged and then written again, each outcome would be stored twice.
    done = _child(
        zygote,
        dataset,
        """
        decisions = [tracer.decision("agent", "approve", f"r{i}", correlation_id="loan-1") for i in range(3)]
        telemetry.force_flush()
        print(" ".join(tracer.record_outcome(d, True).record_id for d in decisions), flush=True)
        real = outcome_log._write
        def write_then_die(*args):
            real(*args)
            os.kill(os.getpid(), signal.SIGKILL)
        outcome_log._write = write_then_die
        telemetry.force_flush()
        """,
    )
    outcomes = done.stdout.split()
    assert [batch for _, batch in _pending(dataset)] == ["1"] * 3  # named and written, not forgotten
    report = compact(dataset, grace_seconds=0)  # what it merges is deleted at once
    assert [p.status for p in report.partitions] == ["compacted"]
    assert len(_pending(dataset)) == 3  # compaction recovers nothing itself
    assert _stored_outcomes(dataset) == sorted(outcomes)  # the reader's recovery: each outcome once
    assert _pending(dataset) == []
    compact(dataset, grace_seconds=0)  # no longer held: merged now, still once
    assert _stored_outcomes(dataset) == sorted(outcomes)
    with otel_replay.open(dataset) as store:
        assert store.rows("SELECT count(*) AS n FROM spans WHERE name = 'replay.decision'")[0]["n"] == 3


def test_compaction_with_an_unreadable_claim_store_leaves_the_outcomes_files_out_and_says_so(dataset, caplog, zygote):
    done = _child(
        zygote,
        dataset,
        """
        print(tracer.record_outcome(tracer.decision("agent", "approve", "r"), True).record_id)
        telemetry.shutdown()
        """,
    )
    outcome = done.stdout.strip()
    store = dataset / "_outcomes" / "claims.sqlite3"
    assert not store.with_name("claims.sqlite3-wal").exists()  # the process closed it: all in the one file
    store.write_bytes(b"not a database, " * 512)  # damaged: it may be holding any batch, so none is merged
    with caplog.at_level(logging.WARNING, logger="otel_replay"):
        compact(dataset, grace_seconds=0)
    said = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(said) == 1 and str(store) in said[0] and "left out of this compaction" in said[0]
    partition = next((dataset / "spans").iterdir())
    assert [p.name for p in partition.glob("outcomes-*.parquet")]  # still an arrival, read as one
    assert _stored_outcomes(dataset) == [outcome]


def test_a_store_whose_pending_table_was_made_without_rowid_is_turned_into_a_rowid_table_with_its_rows(dataset, zygote):
    done = _child(
        zygote,
        dataset,
        """
        decisions = [tracer.decision("agent", "approve", f"r{i}") for i in range(3)]
        telemetry.force_flush()
        print(" ".join(tracer.record_outcome(d, True).record_id for d in decisions), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """,
    )
    outcomes = done.stdout.split()
    with _db(dataset) as con:  # the table as the first version that held outcomes made it, with the dead one's rows
        con.execute("BEGIN IMMEDIATE")
        con.execute(
            "CREATE TABLE old (outcome_id TEXT PRIMARY KEY NOT NULL, decision_id NOT NULL, instance TEXT NOT NULL, "
            "batch TEXT, body BLOB NOT NULL) WITHOUT ROWID"
        )
        con.execute("INSERT INTO old SELECT outcome_id, decision_id, instance, batch, body FROM outcome_pending")
        con.execute("DROP TABLE outcome_pending")
        con.execute("ALTER TABLE old RENAME TO outcome_pending")
        con.execute("COMMIT")
    assert len(_pending(dataset)) == 3
    assert _stored_outcomes(dataset) == sorted(outcomes)  # recovered through the table it found, each once
    with _db(dataset) as con:
        (sql,) = con.execute("SELECT sql FROM sqlite_master WHERE name = 'outcome_pending'").fetchone()
    assert "WITHOUT ROWID" not in sql.upper() and "UNIQUE" in sql.upper()
    with otel_replay.configure(dataset, set_global=False) as telemetry:
        tracer = DecisionTracer()
        later = tracer.record_outcome(tracer.decision("agent", "approve", "later"), False).record_id
        assert telemetry.force_flush()
    assert _stored_outcomes(dataset) == sorted([*outcomes, later])


def test_an_outcome_recorded_as_another_pipeline_closes_keeps_the_writer_lock_and_is_stored_once(dataset, zygote):
    # Two pipelines on one dataset share this process's claim store. One shuts down while a thread records through
    # the other, and the outcome commits after the closing conversion, before the writer lock is dropped. The row is
    # this live process's to write: dropped, its lock lets another process's recovery write it, a compaction merge
    # that file, and this process write its batch again -- the outcome stored twice.
    closing = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=600)
    telemetry = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=600)
    try:
        tracer = DecisionTracer()
        first, second = (tracer.decision("agent", "approve", f"r{i}", correlation_id="loan-1") for i in range(2))
        assert telemetry.force_flush()
        outcomes = [tracer.record_outcome(first, True).record_id]
        real = outcome_log.PendingOutcomes.convert

        def convert_then_record(pending: outcome_log.PendingOutcomes) -> int:
            written = real(pending)
            if len(outcomes) == 1:  # the thread's outcome lands right after the closing conversion
                outcomes.append(tracer.record_outcome(second, False).record_id)
            return written

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(outcome_log.PendingOutcomes, "convert", convert_then_record)
            closing.shutdown()
        assert [outcome for outcome, _ in _pending(dataset)] == [outcomes[1]]
        (dataset / "_outcomes" / "writers" / "4242-0badc0de.lock").touch()  # another process holds outcomes here
        _child(zygote, dataset, "telemetry.shutdown()")  # its configure() runs a recovery
        compact(dataset, grace_seconds=0)  # what it merges is deleted at once
        assert telemetry.force_flush()
    finally:
        telemetry.shutdown()
    assert _stored_outcomes(dataset) == sorted(outcomes)
    assert _pending(dataset) == []


def test_a_recovery_that_opened_a_writer_lock_just_before_its_process_let_it_go_leaves_the_next_lock_alone(
    dataset, zygote
):
    # A recovery opens a live process's lock file; the process converts everything, drops its lock (unlinking
    # the file) and, still alive, records again under a new lock file of the same name. The recovery's lock on
    # the old, unlinked file then succeeds: taken for the process's, it would write the live process's new row
    # (and unlink its new lock file), a compaction merge that file, and the process write its batch again.
    opened, go = dataset.parent / "opened", dataset.parent / "go"
    telemetry = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=600)
    tracer = DecisionTracer()
    first, second = (tracer.decision("agent", "approve", f"r{i}", correlation_id="loan-1") for i in range(2))
    assert telemetry.force_flush()
    outcomes = [tracer.record_outcome(first, True).record_id]
    recovery = zygote.popen(
        textwrap.dedent(f"""
            import fcntl, os, time
            import otel_replay
            from otel_replay.storage import outcome_log
            def open_then_lock(path, **_):  # the recovery opens the file, and locks it once the process let go
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
                open({str(opened)!r}, "w").close()
                while not os.path.exists({str(go)!r}):
                    time.sleep(0.01)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    return None
                return fd
            outcome_log.try_lock = open_then_lock
            otel_replay.open({str(dataset)!r}).close()
        """)
    )
    try:
        deadline = time.monotonic() + 60
        while not opened.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert opened.exists(), recovery.communicate(timeout=60)
        telemetry.shutdown()  # everything converted: the lock is dropped
        telemetry = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=600)
        outcomes.append(tracer.record_outcome(second, False).record_id)  # held again, under a new lock file
        go.write_text("go")
        _, err = recovery.communicate(timeout=120)
        assert recovery.returncode == 0, err
        assert [outcome for outcome, _ in _pending(dataset)] == [outcomes[1]]  # still this live process's
        compact(dataset, grace_seconds=0)
        assert telemetry.force_flush()
    finally:
        go.write_text("go")
        telemetry.shutdown()
    assert _stored_outcomes(dataset) == sorted(outcomes)
    assert _pending(dataset) == []
