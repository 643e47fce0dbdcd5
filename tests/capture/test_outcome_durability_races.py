"""Outcomes stored beside their claims racing what else a process does: gate commits on eight threads, a fork
after holding started, shutdown(), a second pipeline on the dataset. Each stored once, none after a lost record in
its chain (tests/capture/test_outcome_durability.py: the single-threaded cases)."""

from __future__ import annotations

import json
import os
import signal
import textwrap

import pytest

import otel_replay
from otel_replay import DecisionTracer

from .test_outcome_durability import _stored_once

_RACING = textwrap.dedent(
    """
    import os, signal, sys, threading
    import otel_replay
    from otel_replay import Action, ActionGate, DecisionTracer, DependencySnapshot, ReferenceLedger, audit

    dataset, ending = sys.argv[1], sys.argv[2]
    telemetry = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600)
    tracer = DecisionTracer()
    gate = ActionGate(ReferenceLedger(10**9), dataset=dataset)
    said = threading.Lock()
    acknowledged = [0]
    enough = threading.Event()

    def say(*words):
        with said:
            os.write(1, (" ".join(words) + "\\n").encode())  # one write: a SIGKILL never cuts a line
            acknowledged[0] += 1
            if acknowledged[0] >= 300:
                enough.set()

    def agent(n):
        previous = tracer.decision("agent", "approve", f"r{n}", correlation_id=f"a{n}-0")
        for k in range(1, 40):
            if k % 3 == 0:  # a gated trade: its decision, its intent and its commit record
                with audit("refund", snapshot=DependencySnapshot({"k": k}, version="v1"),
                           correlation_id=f"a{n}-g{k}") as d:
                    action = Action("refund", {"order": f"o-{n}-{k}"}, cost=1.0)
                    d.act(action)
                    gate.commit(action, record_id=d.record_id)
                say("G", d.record_id)
            decision = tracer.decision("agent", "approve", f"r{n}-{k}", correlation_id=f"a{n}-{k}")
            if k % 7 == 0:  # a reconciliation batch: the previous decision, one unknown, the previous one again
                done = tracer.record_outcomes([(previous, True), ("no-such-decision", True), (previous, False)])
                for record in done.recorded.values():
                    say("O", record.record_id)
            else:
                say("O", tracer.record_outcome(previous, k % 2 == 0).record_id)
            previous = decision

    threads = [threading.Thread(target=agent, args=(n,), name=f"agent-{n}") for n in range(8)]
    for thread in threads:
        thread.start()
    if ending == "SIGKILL":
        enough.wait(120)
        os.kill(os.getpid(), signal.SIGKILL)
    for thread in threads:
        thread.join()
    telemetry.shutdown()
    """
)


@pytest.mark.parametrize(
    ("ending", "sync"), [("shutdown", "process"), ("SIGKILL", "process"), ("SIGKILL", "machine")]
)
def test_outcomes_and_gate_commits_racing_on_eight_threads_keep_every_chain_whole(zygote, dataset, ending, sync):
    # Eight agents each make decisions, gated trades (audit + commit) and outcomes (one at a time and in batches
    # with refusals inside), all at once; the process shuts down or is SIGKILLed in the middle (outcomes synced or
    # not). Every acknowledged outcome and gated decision is stored exactly once, and no durable record follows a
    # lost one in its chain.
    env = {**os.environ, "OTEL_REPLAY_OUTCOME_SYNC": sync}
    child = zygote.run(_RACING, str(dataset), ending, timeout=300, env=env)
    assert child.returncode == (0 if ending == "shutdown" else -signal.SIGKILL), child.stderr
    said = [line.split() for line in child.stdout.splitlines()]
    assert len(said) >= 300
    outcomes = [record_id for kind, record_id in said if kind == "O"]
    gated = [record_id for kind, record_id in said if kind == "G"]
    with otel_replay.open(dataset) as store:
        assert store.verify(None).problems == []
        counts = {row["record_id"]: row["n"] for row in store.rows(
            "SELECT record_id, count(*) AS n FROM spans WHERE record_id IS NOT NULL "
            "AND name IN ('replay.decision', 'replay.outcome') GROUP BY record_id")}
        gate_records = store.rows("SELECT attributes FROM spans WHERE name = 'replay.gate'")
    assert {counts.get(record_id, 0) for record_id in outcomes} == {1}
    # A gated trade's commit returned: its intent (the decision as it stood) and its commit record are stored, once;
    # the decision record its audit() block sealed on exit is not durable (nothing waits for it) and may be lost.
    for decision_id in gated:
        stages = sorted(
            json.loads(row["attributes"])["replay.gate.executed"] for row in gate_records
            if f'"replay.gate.decision_id":"{decision_id}"' in row["attributes"]
        )
        assert stages == ["committed", "intent"], (decision_id, stages)
    assert set(counts.values()) == {1}  # nothing stored twice, acknowledged or not


_FORK_AFTER_HOLDING = textwrap.dedent(
    """
    import os, signal, sys, warnings
    import otel_replay
    from otel_replay import DecisionTracer

    warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded, fork() may deadlock": none is held
    dataset, child_ending = sys.argv[1], sys.argv[2]
    telemetry = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600)
    tracer = DecisionTracer()
    first = tracer.decision("agent", "approve", "p0", correlation_id="p-0")
    second = tracer.decision("agent", "approve", "p1", correlation_id="p-1")
    print("O", tracer.record_outcome(first, True).record_id, flush=True)  # holding starts; the ticker runs
    held = tracer.decision("agent", "approve", "p2", correlation_id="p-2")  # held in the parent at the fork
    print("D", first, second, held, flush=True)
    pid = os.fork()
    if pid == 0:
        mine = tracer.decision("agent", "approve", "c0", correlation_id="c-0")
        print("O", tracer.record_outcome(second, False).record_id, flush=True)  # the parent's decision, settled here
        later = tracer.decision("agent", "approve", "c1", correlation_id="c-1")
        print("O", tracer.record_outcome(mine, True).record_id, flush=True)
        print("D", mine, later, flush=True)
        if child_ending == "SIGKILL":
            os.kill(os.getpid(), signal.SIGKILL)
        telemetry.shutdown()
        os._exit(0)
    os.waitpid(pid, 0)
    print("O", tracer.record_outcome(held, True).record_id, flush=True)
    telemetry.shutdown()
    """
)


@pytest.mark.parametrize("child_ending", ["shutdown", "SIGKILL"])
def test_a_child_forked_after_holding_started_and_its_parent_both_record_outcomes_once(zygote, dataset, child_ending):
    # The parent holds a decision for its next durable record when it forks; the child (its own chain, its own
    # claim-store instance) records outcomes of the parent's decision and of its own, and shuts down or is killed.
    # The parent goes on. Each record is stored once, verify is clean, and the parent's held decision is the
    # parent's to write (never the child's too).
    child = zygote.run(_FORK_AFTER_HOLDING, str(dataset), child_ending)
    assert child.returncode == 0, child.stderr
    ids = [record_id for line in child.stdout.splitlines() for record_id in line.split()[1:]]
    assert len(ids) == 9
    assert _stored_once(dataset, ids) == dict.fromkeys(ids, 1)


_OUTCOME_WHILE_A_GATE_RECORD_IS_QUEUED = textwrap.dedent(
    """
    import os, signal, sys, threading
    import otel_replay
    from otel_replay import Action, ActionGate, DecisionTracer, DependencySnapshot, ReferenceLedger, audit
    from otel_replay.storage import wal

    dataset = sys.argv[1]
    telemetry = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600)
    tracer = DecisionTracer()
    first = tracer.decision("agent", "approve", "r1", correlation_id="loan-1")
    telemetry.force_flush()
    gate = ActionGate(ReferenceLedger(100), dataset=dataset)
    gate.commit(Action("refund", {"order": "o-0"}, cost=1.0))  # the log is open and writing ahead
    writing, go = threading.Event(), threading.Event()
    real_write = wal.WriteAheadLog._write_queued

    def slow_write(self):  # the log's writer is slow to take the queue (another thread had the GIL)
        writing.set()
        go.wait(60)
        real_write(self)

    wal.WriteAheadLog._write_queued = slow_write

    def trade():
        with audit("refund", snapshot=DependencySnapshot({"balance": 100}, version="v1"), correlation_id="t-1") as d:
            action = Action("refund", {"order": "o-1"}, cost=5.0)
            d.act(action)
            gate.commit(action, record_id=d.record_id)  # its intent queued, not yet written

    trader = threading.Thread(target=trade)
    trader.start()
    writing.wait(60)
    settler = threading.Thread(target=tracer.record_outcome, args=(first, True))  # sealed after the intent
    settler.start()
    settler.join(2)
    print("outcome before the intent was written" if not settler.is_alive() else "waited", flush=True)
    if settler.is_alive():
        go.set()
        settler.join()
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_an_outcome_recorded_while_a_gate_record_waits_for_the_log_is_not_durable_before_it(zygote, dataset):
    # A gated commit on one thread has queued its intent in the write-ahead log (sealed, not yet written: its group
    # commit is still to come); an outcome is recorded on another thread, sealed after the intent in the chain and
    # durable when its SQLite commit returns. The process is killed. The outcome must not be on disk without the
    # intent before it: it waits for the log first. (It did not: with eight threads trading and settling, a SIGKILL
    # left 'deleted: missing from the dataset, yet record ... follows it' for a gate record in about one run of three.)
    child = zygote.run(_OUTCOME_WHILE_A_GATE_RECORD_IS_QUEUED, str(dataset))
    assert child.returncode == -signal.SIGKILL, child.stderr
    with otel_replay.open(dataset) as store:
        assert store.verify(None).problems == [], child.stdout

@pytest.mark.parametrize("sync", ["process", "machine"])
def test_shutdown_racing_outcomes_on_four_threads_loses_no_acknowledged_outcome_and_leaves_no_thread(
    dataset, monkeypatch, sync
):
    # Four threads make decisions and settle the previous ones while the pipeline shuts down under them. An outcome
    # is either refused as record_outcome() says (CaptureError: the pipeline is shut down) or stored, once, and in
    # Parquet when shutdown() returned; verify is clean; and no thread of the pipeline's (the held records' ticker,
    # the outcomes' converter) is left running (tests/conftest.py fails the test otherwise). Before: an outcome whose
    # hold came after the shutdown either raised OtelReplayError 'the batch queue could not be flushed first (timed
    # out)' (records had been held at the shutdown) or was committed past shutdown's conversion, acknowledged and
    # not in the dataset (about one run in four).
    # Only an outcome recorded through the pipeline counts: one whose call began once shutdown() had restored the
    # recorder before it is "sealed but not stored anywhere" (warned, as documented). A thread still in an outcome's
    # machine sync all through the shutdown made its next calls so, which read as lost (2 runs in 8 with =machine).
    import threading

    monkeypatch.setenv("OTEL_REPLAY_OUTCOME_SYNC", sync)
    telemetry = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600)
    tracer = DecisionTracer()
    tracer.record_outcome(tracer.decision("agent", "approve", "r"), True)  # holding starts: the ticker runs
    acknowledged: list[str] = []
    unexpected: list[BaseException] = []
    started = threading.Barrier(5)

    def settle(n: int) -> None:
        started.wait()
        previous = None
        for k in range(400):
            try:
                decision = tracer.decision("agent", "approve", f"r{n}-{k}", correlation_id=f"a{n}-{k}")
                if previous is not None:
                    outcome = tracer.record_outcome(previous, k % 2 == 0).record_id
                    if otel_replay.get_recorder() is not telemetry.recorder:
                        return  # through the recorder restored after the shutdown (it may have taken this one)
                    acknowledged.append(outcome)
            except otel_replay.CaptureError:
                return  # refused: the pipeline is shut down
            except Exception as exc:  # noqa: BLE001 - reported below
                unexpected.append(exc)
                return
            previous = decision

    threads = [threading.Thread(target=settle, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    started.wait()
    while len(acknowledged) < 40 and any(thread.is_alive() for thread in threads):
        threading.Event().wait(0.01)
    telemetry.shutdown()
    for thread in threads:
        thread.join()
    assert unexpected == []
    assert acknowledged
    assert _stored_once(dataset, acknowledged) == dict.fromkeys(acknowledged, 1)


def test_a_gate_commit_returns_with_the_decisions_an_outcome_took_before_it_on_disk(dataset, monkeypatch):
    # gate.commit() promises its intent is fsynced "with every record the process sealed before it". A decision held
    # since the last outcome is taken into the next outcome's SQLite commit, which the default sync mode never
    # fdatasyncs: when the commit returns, a machine crash (power cut) keeps the gate record and loses that decision
    # before it, and verify reads it as deleted. Before the outcome took it, the decision went into the intent's
    # own fsynced log record. Observed here as which files were fdatasynced by the time commit() returned.
    from otel_replay import Action, ActionGate, ReferenceLedger

    monkeypatch.delenv("OTEL_REPLAY_OUTCOME_SYNC", raising=False)
    with otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600):
        tracer = DecisionTracer()
        first = tracer.decision("agent", "approve", "r1")
        second = tracer.decision("agent", "approve", "r2")
        gate = ActionGate(ReferenceLedger(100), dataset=dataset)
        tracer.record_outcome(first, True)  # holding starts
        tracer.decision("agent", "approve", "r3")  # held for the next durable record
        tracer.record_outcome(second, True)  # takes it into its SQLite commit
        synced: list[str] = []
        real_sync = os.fdatasync

        def watched_sync(fd: int) -> None:
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
            real_sync(fd)

        monkeypatch.setattr(os, "fdatasync", watched_sync)
        gate.commit(Action("refund", {"order": "o-1"}, cost=1.0))
        monkeypatch.setattr(os, "fdatasync", real_sync)
    assert any(path.endswith("claims.sqlite3-wal") for path in synced), synced

_TWO_PIPELINES = textwrap.dedent(
    """
    import os, signal, sys
    import otel_replay
    from otel_replay import DecisionTracer

    dataset, ending = sys.argv[1], sys.argv[2]
    tracer = DecisionTracer()
    one = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600)
    a0 = tracer.decision("agent", "approve", "a0", correlation_id="a-0")
    a1 = tracer.decision("agent", "approve", "a1", correlation_id="a-1")
    ids = [a0, a1, tracer.record_outcome(a0, True).record_id]  # the first pipeline holds from here on
    a2 = tracer.decision("agent", "approve", "a2", correlation_id="a-2")  # held by the first pipeline
    two = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600)  # its recorder is current
    b0 = tracer.decision("agent", "approve", "b0", correlation_id="b-0")
    ids += [a2, b0, tracer.record_outcome(a1, False).record_id]  # through the second: its own chain, its held ones
    b1 = tracer.decision("agent", "approve", "b1", correlation_id="b-1")
    ids += [b1, tracer.record_outcome(b0, True).record_id]
    two.shutdown()  # the first pipeline's recorder is current again; the shared claim store stays open for it
    a3 = tracer.decision("agent", "approve", "a3", correlation_id="a-3")
    ids += [a3, tracer.record_outcome(a2, True).record_id, tracer.record_outcome(b1, True).record_id]
    print(" ".join(ids), flush=True)
    if ending == "SIGKILL":
        os.kill(os.getpid(), signal.SIGKILL)
    one.shutdown()
    """
)


@pytest.mark.parametrize("ending", ["shutdown", "SIGKILL"])
def test_two_pipelines_on_one_dataset_in_one_process_store_each_record_once(zygote, dataset, ending):
    # Two pipelines configured on one dataset share its claim store; each holds its own chain's records. Outcomes
    # through either, of decisions of either, one shut down before the other: every decision before an outcome and
    # every outcome is stored once (after a SIGKILL too), and verify is clean.
    child = zygote.run(_TWO_PIPELINES, str(dataset), ending)
    assert child.returncode == (0 if ending == "shutdown" else -signal.SIGKILL), child.stderr
    ids = child.stdout.split()
    assert len(ids) == 11
    assert _stored_once(dataset, ids) == dict.fromkeys(ids, 1)


def test_an_outcome_synced_while_shutdown_converts_is_in_parquet_when_both_returned(dataset, monkeypatch):
    # The outcome is committed (its hold ran before the shutdown), its machine sync is in flight while another
    # thread shuts the pipeline down. Once shutdown() and record_outcome() have both returned, the outcome must be in
    # Parquet, and no pipeline thread left running. (Seen racing four threads against shutdown(): an acknowledged
    # outcome missing from the dataset in 3 of 10 runs with =machine, none with =process.)
    import os
    import threading

    from otel_replay.storage.outcome_claims import close_outcomes

    monkeypatch.setenv("OTEL_REPLAY_OUTCOME_SYNC", "machine")
    telemetry = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600)
    tracer = DecisionTracer()
    first = tracer.decision("agent", "approve", "r1")
    tracer.record_outcome(first, True)
    second = tracer.decision("agent", "approve", "r2")
    assert telemetry.force_flush()  # the shutdown below finds no outcome of its own to convert (and sync)
    syncing, go = threading.Event(), threading.Event()
    real_sync = os.fdatasync

    def slow_sync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("claims.sqlite3-wal") and not syncing.is_set():
            syncing.set()
            go.wait(60)
        real_sync(fd)

    monkeypatch.setattr(os, "fdatasync", slow_sync)
    recorded: list[str] = []
    settler = threading.Thread(target=lambda: recorded.append(tracer.record_outcome(second, False).record_id))
    settler.start()
    try:
        assert syncing.wait(60)
        telemetry.shutdown()
    finally:
        go.set()
        settler.join()
        monkeypatch.setattr(os, "fdatasync", real_sync)
    try:
        with otel_replay.open(dataset) as store:
            stored = store.rows("SELECT 1 FROM spans WHERE record_id = ?", recorded)
        assert len(recorded) == 1 and len(stored) == 1
    finally:
        close_outcomes(dataset)  # the converter the late outcome restarted: stopped, its outcome written


def test_an_outcome_of_a_second_pipeline_recorded_while_the_first_shuts_down_leaves_a_converter_running(
    dataset, monkeypatch
):
    # Two pipelines on one dataset share its claim store and its converter; the first's shutdown() closes that
    # converter. An outcome recorded through the second while that close is converting (its stop event set, its
    # thread already joined and forgotten) started a converter thread that saw the stop event and ended at once, and
    # the dead thread was kept: no outcome recorded through the second pipeline afterwards was converted in the
    # background again (only at its shutdown or the process's exit), so its claim store grew for the process's life.
    # The outcome recorded during the close itself is converted in the background too (the close restarts the thread).
    from otel_replay.storage.outcome_claims import _store
    from otel_replay.storage.outcome_log import PendingOutcomes

    monkeypatch.delenv("OTEL_REPLAY_OUTCOME_SYNC", raising=False)
    one = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600)
    two = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600)  # its recorder is current
    try:
        tracer = DecisionTracer()
        decisions = [tracer.decision("agent", "approve", f"r{n}", correlation_id=f"a-{n}") for n in range(3)]
        recorded = [tracer.record_outcome(decisions[0], True).record_id]  # the converter starts
        real_convert = PendingOutcomes.convert
        during: list[str] = []

        def convert_then_record(self: PendingOutcomes) -> int:
            rows = real_convert(self)
            if self.closes and not during:  # the first pipeline's close, still under way
                during.append(tracer.record_outcome(decisions[1], False).record_id)
            return rows

        monkeypatch.setattr(PendingOutcomes, "convert", convert_then_record)
        one.shutdown()
        monkeypatch.setattr(PendingOutcomes, "convert", real_convert)
        assert during
        pending = _store(str(dataset)).pending
        assert pending is not None
        thread = pending._thread
        assert thread is not None and thread.is_alive(), "no converter for the outcome recorded during the close"
        recorded += [*during, tracer.record_outcome(decisions[2], True).record_id]
        thread = pending._thread
        assert thread is not None and thread.is_alive(), "no converter for the outcomes the second pipeline holds"
    finally:
        one.shutdown()
        two.shutdown()
    assert _stored_once(dataset, recorded) == dict.fromkeys(recorded, 1)


_FORK_WHILE_THE_STORE_SYNCS = textwrap.dedent(
    """
    import os, signal, sys, threading
    import otel_replay
    from otel_replay import Action, ActionGate, DecisionTracer, ReferenceLedger
    from otel_replay.storage.outcome_claims import _store

    dataset = sys.argv[1]
    telemetry = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600)
    tracer = DecisionTracer()
    gate = ActionGate(ReferenceLedger(100), dataset=dataset)
    first = tracer.decision("agent", "approve", "r1", correlation_id="c-1")
    second = tracer.decision("agent", "approve", "r2", correlation_id="c-2")
    tracer.record_outcome(first, True)  # holding starts
    tracer.decision("agent", "approve", "r3", correlation_id="c-3")  # held: the next outcome takes it
    tracer.record_outcome(second, True)  # its commit, not synced: the next gate record syncs it first
    store = _store(dataset)
    syncing, go = threading.Event(), threading.Event()
    real_sync = os.fdatasync

    def slow_sync(fd):
        if threading.current_thread().name == "syncer" and not syncing.is_set():
            syncing.set()
            go.wait(60)
        real_sync(fd)

    os.fdatasync = slow_sync
    syncer = threading.Thread(target=store.sync_all, name="syncer")  # a sync of the store under way at the fork
    syncer.start()
    assert syncing.wait(60)
    pid = os.fork()
    if pid == 0:
        signal.alarm(30)  # a child that hangs is killed by SIGALRM
        gate.commit(Action("refund", {"order": "o-child"}, cost=1.0))
        os._exit(0)
    go.set()
    syncer.join()
    os.fdatasync = real_sync
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
    telemetry.shutdown()
    """
)


def test_a_child_forked_while_its_parent_syncs_the_claim_store_can_commit_through_the_gate(zygote, dataset):
    # An outcome's commit hands its pipeline the store's sync for the next gate record to call. A child forked while
    # another thread of the parent synced that store inherited the store mid-sync (its flag set, no thread left to
    # clear it): the child's first gate commit called the parent's sync, waited for that sync forever, and held the
    # pipeline's write order while it did (the child hung). The parent's commit is the parent's to sync: the child's
    # records start chains of their own.
    child = zygote.run(_FORK_WHILE_THE_STORE_SYNCS, str(dataset))
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == ["0"], child.stderr


def test_an_outcome_synced_after_shutdown_whose_late_conversion_fails_is_written_once_later(dataset, monkeypatch):
    # As above, and the late conversion the recording call does itself fails (disk full). record_outcome() still
    # answers (the outcome is durable in the claim store), no converter thread is left running, the instance's lock
    # is kept (a recovery in another process never writes it meanwhile), and the exit's conversion writes it: once,
    # also after a new pipeline on the dataset converted in between.
    import errno
    import threading

    from otel_replay.storage import outcome_log
    from otel_replay.storage.outcome_claims import _store, close_outcomes

    monkeypatch.setenv("OTEL_REPLAY_OUTCOME_SYNC", "machine")
    telemetry = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600)
    tracer = DecisionTracer()
    first = tracer.decision("agent", "approve", "r1")
    recorded = [tracer.record_outcome(first, True).record_id]
    second = tracer.decision("agent", "approve", "r2")
    assert telemetry.force_flush()
    syncing, go = threading.Event(), threading.Event()
    real_sync, real_write = os.fdatasync, outcome_log._write

    def slow_sync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("claims.sqlite3-wal") and not syncing.is_set():
            syncing.set()
            go.wait(60)
        real_sync(fd)

    def disk_full(*args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fdatasync", slow_sync)
    settler = threading.Thread(target=lambda: recorded.append(tracer.record_outcome(second, False).record_id))
    settler.start()
    try:
        assert syncing.wait(60)
        telemetry.shutdown()
        monkeypatch.setattr(outcome_log, "_write", disk_full)
    finally:
        go.set()
        settler.join()
        monkeypatch.setattr(os, "fdatasync", real_sync)
        monkeypatch.setattr(outcome_log, "_write", real_write)
    pending = _store(str(dataset)).pending
    try:
        assert len(recorded) == 2
        assert pending is not None and pending.convert_errors == 1
        assert pending._thread is None or not pending._thread.is_alive()
        assert list((dataset / "_outcomes" / "writers").iterdir()), "the instance's lock was dropped"
        with otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600):  # recovers nothing held
            third = tracer.decision("agent", "approve", "r3")
            recorded.append(tracer.record_outcome(third, True).record_id)
    finally:
        close_outcomes(dataset)  # as the exit does
    assert _stored_once(dataset, recorded) == dict.fromkeys(recorded, 1)


def test_a_gate_commit_whose_outcome_store_sync_fails_is_refused_before_the_rail_and_the_next_one_syncs(
    dataset, monkeypatch
):
    # The sync an outcome's commit handed the pipeline fails (EIO) when the next gate commit's intent calls it. The
    # intent is then not durable after the outcome: the commit is refused (GateError) before the rail runs, the sync
    # is kept, and the next gate commit does it before its intent. Every decision, the outcome and the refused
    # intent are stored once after shutdown(), and verify is clean.
    import errno

    from otel_replay import Action, ActionGate, GateError, ReferenceLedger

    monkeypatch.delenv("OTEL_REPLAY_OUTCOME_SYNC", raising=False)
    ledger = ReferenceLedger(100)
    with otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600):
        tracer = DecisionTracer()
        first = tracer.decision("agent", "approve", "r1")
        second = tracer.decision("agent", "approve", "r2")
        gate = ActionGate(ledger, dataset=dataset)
        ids = [first, second, tracer.record_outcome(first, True).record_id]  # holding starts
        ids.append(tracer.decision("agent", "approve", "r3"))  # held for the next durable record
        ids.append(tracer.record_outcome(second, True).record_id)  # takes it into its commit, not synced
        real_sync = os.fdatasync
        synced: list[str] = []

        def failing_sync(fd: int) -> None:
            path = os.readlink(f"/proc/self/fd/{fd}")
            if path.endswith("claims.sqlite3-wal"):
                synced.append(path)
                if len(synced) == 1:
                    raise OSError(errno.EIO, "Input/output error")
            real_sync(fd)

        monkeypatch.setattr(os, "fdatasync", failing_sync)
        with pytest.raises(GateError):
            gate.commit(Action("refund", {"order": "o-1"}, cost=1.0))
        assert ledger.balance == 100  # the rail was not called
        gate.commit(Action("refund", {"order": "o-2"}, cost=1.0))
        monkeypatch.setattr(os, "fdatasync", real_sync)
    assert ledger.balance == 99
    assert len(synced) >= 2, "the failed sync was not done again before the next gate record"
    assert _stored_once(dataset, ids) == dict.fromkeys(ids, 1)


def test_a_shutdown_that_holds_the_write_order_does_not_wait_forever_on_the_ticker_releasing_held_records(dataset):
    # The pipeline's own thread releases held records once they are as old as a file may be, taking the write order
    # to sync the outcomes before them. A shutdown takes that order and then joins the thread: had the thread waited
    # for the order without end, the two would wait on each other for ever.
    import threading
    import time

    telemetry = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=0.05)
    tracer = DecisionTracer()
    first = tracer.decision("agent", "approve", "r1")
    tracer.record_outcome(first, True)  # holding starts, and the thread that releases old held records
    later = tracer.decision("agent", "approve", "r2")  # held
    order = telemetry.write_order
    assert order is not None
    done = threading.Event()

    def shut_down_holding_the_order() -> None:
        with order:
            time.sleep(0.5)  # the held decision grows old: the thread now waits for the order this one holds
            telemetry.shutdown()
        done.set()

    closer = threading.Thread(target=shut_down_holding_the_order, name="test-closer", daemon=True)
    closer.start()
    closer.join(120)
    assert done.is_set(), "shutdown never returned: it and the releasing thread wait on each other"
    assert _stored_once(dataset, [first, later]) == {first: 1, later: 1}


def test_records_a_gate_commit_took_stay_out_of_parquet_while_the_outcome_sync_before_them_fails(dataset, monkeypatch):
    # As above, and a flush comes while the store's sync still fails. The refused intent and the decision it took,
    # both sealed after the outcome, went to the batch queue, and the flush wrote them to a Parquet file while the
    # outcome's commit was not on disk (found on s14-void: a machine crash could keep that file and lose the outcome,
    # and verify would read it as deleted). Kept held, as a release of held records keeps them when that sync fails,
    # they reach Parquet once the sync is done.
    from otel_replay import Action, ActionGate, GateError, ReferenceLedger

    monkeypatch.delenv("OTEL_REPLAY_OUTCOME_SYNC", raising=False)
    real_sync, real_replace = os.fdatasync, os.replace
    failing, events = [False], []

    def sync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("claims.sqlite3-wal"):
            if failing[0]:
                raise OSError(5, "Input/output error")
            real_sync(fd)
            events.append("claims synced")
            return
        real_sync(fd)

    def replace(src, dst, *args, **kwargs):
        real_replace(src, dst, *args, **kwargs)
        if str(dst).endswith(".parquet"):
            events.append(str(dst))

    with otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600) as telemetry:
        tracer = DecisionTracer()
        gate = ActionGate(ReferenceLedger(100), dataset=dataset)
        first = tracer.decision("agent", "approve", "r1")
        ids = [first, tracer.record_outcome(first, True).record_id]  # its commit, not synced
        later = tracer.decision("agent", "approve", "r2")  # held: the gate's intent takes it
        ids.append(later)
        monkeypatch.setattr(os, "fdatasync", sync)
        monkeypatch.setattr(os, "replace", replace)
        failing[0] = True
        with pytest.raises(GateError):
            gate.commit(Action("refund", {"order": "o-1"}, cost=1.0))
        assert telemetry.force_flush() is False  # the sync before them failed: they are not written
        failing[0] = False
        assert telemetry.force_flush()
        monkeypatch.undo()
    with otel_replay.open(dataset) as store:
        (file,) = {row["filename"] for row in store.rows("SELECT filename FROM spans WHERE record_id = ?", [later])}
    assert file in events and "claims synced" in events[: events.index(file)], events
    assert _stored_once(dataset, ids) == dict.fromkeys(ids, 1)


@pytest.mark.xfail(
    strict=True,
    reason="found in review of s14-void: an outcome whose machine sync fails is released and given back; when "
    "shutdown() shut the batch queue meanwhile, the decisions it took (deleted with its row) and its void are "
    "dropped: an outcome sealed and not kept with no void, and records lost. Needs the store to keep such a row "
    "for the exit's conversion, or the pipeline to take spans back after shutdown",
)
def test_an_outcome_whose_machine_sync_fails_as_shutdown_runs_loses_no_record_it_took(dataset, monkeypatch):
    # The outcome commits with the two decisions it took; its sync fails (EIO), and while its claim is released
    # (slowly: a busy disk) the pipeline shuts down. The decisions go back to the batch queue, shut down by then.
    import errno
    import threading

    from otel_replay.storage.claim_store import OutcomeClaimStore

    monkeypatch.setenv("OTEL_REPLAY_OUTCOME_SYNC", "machine")
    telemetry = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600)
    tracer = DecisionTracer()
    first = tracer.decision("agent", "approve", "r1")
    ids = [first, tracer.record_outcome(first, True).record_id]  # holding starts
    ids += [tracer.decision("agent", "approve", "r2"), tracer.decision("agent", "approve", "r3")]  # held: taken next
    releasing, go = threading.Event(), threading.Event()
    real_sync, real_release = os.fdatasync, OutcomeClaimStore.release
    failures: list[BaseException] = []

    def failing_once(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("claims.sqlite3-wal") and not releasing.is_set():
            raise OSError(errno.EIO, "Input/output error")
        real_sync(fd)

    def slow_release(self, *args):
        releasing.set()
        go.wait(60)
        return real_release(self, *args)

    def settle() -> None:
        try:
            tracer.record_outcome(ids[2], False)
        except Exception as exc:  # noqa: BLE001 - what the test looks at
            failures.append(exc)

    monkeypatch.setattr(os, "fdatasync", failing_once)
    monkeypatch.setattr(OutcomeClaimStore, "release", slow_release)
    settler = threading.Thread(target=settle)
    settler.start()
    try:
        assert releasing.wait(60)  # committed, its sync failed, its claim about to be released
        telemetry.shutdown()
    finally:
        go.set()
        settler.join()
        monkeypatch.undo()
        telemetry.shutdown()
    assert len(failures) == 1 and "Input/output error" in str(failures[0])  # refused to its caller
    assert _stored_once(dataset, ids) == dict.fromkeys(ids, 1)


def test_a_void_waits_a_bounded_time_for_a_write_order_held_by_a_thread_waiting_for_the_claim_store(
    dataset, monkeypatch
):
    # X holds the write order (a span processor of the user's recording an outcome as a record's span ends) and
    # waits for the claim store's lock; Y leads a transaction, waits for the write order a bounded time, seals
    # anyway, and its transaction fails: the void it then seals must not wait for X without end (both would hang).
    import contextlib
    import sqlite3
    import threading
    import time

    from otel_replay.capture import recorder as recorder_module
    from otel_replay.storage import claim_store

    monkeypatch.setattr(claim_store, "_ORDER_WAIT", 0.5)
    monkeypatch.setattr(recorder_module, "VOID_ORDER_WAIT", 0.5)
    telemetry = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600)
    tracer = DecisionTracer()
    first = tracer.decision("agent", "approve", "r1")
    tracer.record_outcome(first, True)
    second, third = tracer.decision("agent", "approve", "r2"), tracer.decision("agent", "approve", "r3")
    with contextlib.closing(sqlite3.connect(dataset / "_outcomes" / "claims.sqlite3")) as con:
        con.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON outcome_pending BEGIN SELECT RAISE(ABORT, 'disk says no'); END"
        )
        con.commit()
    answers: dict[str, str] = {}
    holding = threading.Event()
    order = telemetry.write_order
    assert order is not None

    def x() -> None:
        with order:
            holding.set()
            time.sleep(0.3)  # Y now holds the claim store's lock and waits for this order
            try:
                tracer.record_outcome(third, True)
            except Exception as exc:  # noqa: BLE001 - the refused row: what matters is that it returns
                answers["x"] = type(exc).__name__

    def y() -> None:
        holding.wait()
        try:
            tracer.record_outcome(second, True)
        except Exception as exc:  # noqa: BLE001
            answers["y"] = type(exc).__name__

    threads = [threading.Thread(target=x, name="test-x", daemon=True), threading.Thread(target=y, name="test-y",
                                                                                          daemon=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "the two threads wait on each other"
    assert answers == {"x": "DatasetError", "y": "DatasetError"}
    telemetry.shutdown()
