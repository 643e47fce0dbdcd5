"""``DecisionTracer.record_outcomes()``: many outcomes in shared claim-store transactions, each decision once, a
decision's failure its own, the same records and rows as ``record_outcome()``, durable when it returns."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading

import pytest

import otel_replay
from otel_replay import DecisionTracer, OutcomeAlreadyRecorded
from otel_replay.capture.recorder import set_recorder
from otel_replay.errors import CaptureError, RecordNotFound
from otel_replay.storage import claim_store, outcome_claims
from otel_replay.storage.outcome_claims import claim_outcome

_SAME = ["name", "kind", "status_code", "record_source", "decision_type", "agent_id", "session_id"]


def _outcome_rows(dataset) -> list[dict]:
    with otel_replay.open(dataset) as store:
        return store.rows("SELECT * FROM spans WHERE name = 'replay.outcome' ORDER BY record_id")


def test_a_batch_records_each_outcome_once_with_the_rows_record_outcome_stores(telemetry, dataset):
    tracer = DecisionTracer()
    decisions = [tracer.decision("agent", "approve", f"r{i}", correlation_id=f"loan-{i}") for i in range(5)]
    single = tracer.record_outcome(decisions[0], True, "by itself")
    done = tracer.record_outcomes([(decisions[1], True, "in a batch"), (decisions[2], False), (decisions[3], True)])
    assert list(done.recorded) == decisions[1:4] and done.failed == {}
    assert [(o.decision_id, o.outcome_correct, o.note) for o in done.recorded.values()] == [
        (decisions[1], True, "in a batch"),
        (decisions[2], False, None),
        (decisions[3], True, None),
    ]
    assert all(o.seal is not None and o.span.span_id for o in done.recorded.values())
    with pytest.raises(OutcomeAlreadyRecorded, match=f"decision {decisions[2]} already has an outcome"):
        tracer.record_outcome(decisions[2], True)
    assert telemetry.force_flush()
    rows = {r["record_id"]: r for r in _outcome_rows(dataset)}
    assert sorted(rows) == sorted([single.record_id, *(o.record_id for o in done.recorded.values())])
    one, batched = rows[single.record_id], rows[done.recorded[decisions[1]].record_id]
    assert sorted(k for k, v in one.items() if v is not None) == sorted(k for k, v in batched.items() if v is not None)
    for column in _SAME:
        assert one.get(column) == batched.get(column), column
    assert batched["correlation_id"] == "loan-1"  # the decision's, so it is stored beside its chain
    with otel_replay.open(dataset) as store:
        verified = store.verified_outcomes(decisions)
        assert {d: v["outcome_correct"] for d, v in verified.items()} == {
            decisions[0]: True, decisions[1]: True, decisions[2]: False, decisions[3]: True
        }
        assert store.decision_span(decisions[1]).span_id == batched["links"][0]["span_id"]


def test_each_decision_fails_on_its_own_and_the_others_are_recorded(telemetry, dataset):
    tracer = DecisionTracer()
    decisions = [tracer.decision("agent", "approve", f"r{i}") for i in range(4)]
    tracer.record_outcome(decisions[0], True)  # this process recorded it already
    claim_outcome(dataset, decisions[1], "o-elsewhere", True)  # another process claimed it
    given = [(decisions[0], False), (decisions[1], False), (decisions[2], True), (decisions[2], False)]
    done = tracer.record_outcomes([*given, (decisions[3], True)])
    assert list(done.recorded) == [decisions[2], decisions[3]]
    assert done.recorded[decisions[2]].outcome_correct is True  # the first of the two given for it
    assert sorted(done.failed) == sorted(decisions[:3])
    assert all(isinstance(e, OutcomeAlreadyRecorded) for e in done.failed.values())
    assert "o-elsewhere" in str(done.failed[decisions[1]])
    assert telemetry.force_flush()
    stored = sorted(r["record_id"] for r in _outcome_rows(dataset))
    assert len(stored) == 3  # decisions[0]'s first outcome and the two recorded here, once each


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ("d-1", "entry 1 must be"),
        (("d-1",), "entry 1 must be"),
        (("d-1", True, "n", "x"), "entry 1 must be"),
        ((7, True), "entry 1 must be"),
        (("d-1", "yes"), "entry 1 \\(decision d-1\\): outcome_correct must be True or False"),
        (("d-1", 1), "entry 1 \\(decision d-1\\): outcome_correct must be"),
        (("d-1", True, b"note"), "the note a string or None"),
        (["d-1", True], "entry 1 must be"),
    ],
)
def test_a_malformed_entry_is_a_one_line_error_naming_it_and_nothing_is_recorded(telemetry, dataset, entry, said):
    tracer = DecisionTracer()
    decision = tracer.decision("agent", "approve", "r")
    with pytest.raises(CaptureError, match=said) as raised:
        tracer.record_outcomes([(decision, True), entry])
    assert "\n" not in str(raised.value)
    assert tracer.record_outcome(decision, False).outcome_correct is False  # nothing was taken for it


@pytest.mark.parametrize("hostile", ["ünïcødé-决定-🙂", "x" * 5_000, "a\x00b", "../../etc/passwd"])
def test_hostile_decision_ids_are_claimed_once_each_in_a_batch(dataset, hostile):
    with otel_replay.configure(dataset, set_global=False) as telemetry:
        tracer = DecisionTracer()
        done = tracer.record_outcomes([(hostile, True), (hostile + "-2", False), (hostile, False)])
        assert list(done.recorded) == [hostile, hostile + "-2"] and list(done.failed) == [hostile]
        again = DecisionTracer().record_outcomes([(hostile, True)])
        assert isinstance(again.failed[hostile], OutcomeAlreadyRecorded)
        assert telemetry.force_flush()
    assert len(_outcome_rows(dataset)) == 2
    assert not (dataset.parent / "etc").exists()


def test_an_outcome_that_cannot_be_sealed_fails_alone_and_its_decision_stays_free(telemetry, dataset):
    tracer = DecisionTracer()
    good = tracer.decision("agent", "approve", "r")
    done = tracer.record_outcomes([("\ud800 lone", True), (good, True)])  # the id is in the outcome's attributes
    assert list(done.recorded) == [good]
    assert isinstance(done.failed["\ud800 lone"], CaptureError)
    assert "cannot be sealed" in str(done.failed["\ud800 lone"])  # as record_outcome() says it
    with contextlib.closing(sqlite3.connect(dataset / "_outcomes" / "claims.sqlite3")) as con:
        assert con.execute("SELECT count(*) FROM outcome_claims").fetchone()[0] == 1  # nothing claimed for it


def test_a_store_on_another_dataset_gets_one_call_at_a_time_with_the_same_answers(telemetry, dataset, tmp_path):
    tracer = DecisionTracer()
    known = [tracer.decision("agent", "approve", f"r{i}") for i in range(2)]
    assert telemetry.force_flush()
    telemetry.shutdown()
    previous = set_recorder(telemetry.recorder)  # a recorder still current after its pipeline was shut down
    try:
        with pytest.raises(CaptureError, match="record_outcomes: the telemetry pipeline was shut down"):
            tracer.record_outcomes([(known[0], True)])
    finally:
        set_recorder(previous)
    # Outcomes go to another dataset's pipeline; the claims are taken in the store's (not held beside them there).
    with otel_replay.configure(tmp_path / "elsewhere", set_global=False) as other, otel_replay.open(dataset) as store:
        done = DecisionTracer(store=store).record_outcomes([(known[0], True), ("nope", True), (known[1], False)])
        assert list(done.recorded) == [known[0], known[1]]
        assert isinstance(done.failed["nope"], RecordNotFound) and "no decision nope" in str(done.failed["nope"])
        again = DecisionTracer(store=store).record_outcomes([(known[1], True)])
        assert isinstance(again.failed[known[1]], OutcomeAlreadyRecorded)
        assert other.force_flush()
    assert len(_outcome_rows(tmp_path / "elsewhere")) == 2


def test_a_batch_survives_its_process_being_killed_the_moment_it_returned(dataset):
    code = textwrap.dedent("""
        import os, signal
        import otel_replay
        from otel_replay import DecisionTracer
        telemetry = otel_replay.configure(DATASET, set_global=False)
        tracer = DecisionTracer()
        decisions = [tracer.decision("agent", "approve", f"r{i}") for i in range(30)]
        telemetry.force_flush()
        done = tracer.record_outcomes([(d, i % 2 == 0) for i, d in enumerate(decisions)])
        print(" ".join(o.record_id for o in done.recorded.values()), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """).replace("DATASET", repr(str(dataset)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr
    outcomes = done.stdout.split()
    assert len(outcomes) == 30
    with contextlib.closing(sqlite3.connect(dataset / "_outcomes" / "claims.sqlite3")) as con:
        assert con.execute("SELECT count(*) FROM outcome_pending").fetchone()[0] == 30  # held, never in Parquet
    assert sorted(r["record_id"] for r in _outcome_rows(dataset)) == sorted(outcomes)  # recovered, each once


def test_a_full_claim_store_fails_each_decision_of_a_batch_naming_that_decision_and_the_store(telemetry, dataset):
    # The disk fills mid-transaction (SQLite's "database or disk is full", here through max_page_count): every
    # decision of the batch fails, nothing claimed, and each failure names its own decision, not the batch's first.
    tracer = DecisionTracer()
    decisions = [tracer.decision("agent", "approve", f"r{i}") for i in range(12)]
    tracer.record_outcome(decisions[0], True)
    store = outcome_claims._store(str(dataset))
    assert store._con is not None
    pages = store._con.execute("PRAGMA page_count").fetchone()[0]
    store._con.execute(f"PRAGMA max_page_count={pages}")
    done = tracer.record_outcomes([(d, True) for d in decisions[1:]])
    assert done.recorded == {} and sorted(done.failed) == sorted(decisions[1:])
    for decision, failure in done.failed.items():
        said = str(failure)
        assert f"claims.sqlite3: cannot record the outcome of decision '{decision}'" in said, said
        assert "disk is full" in said and "\n" not in said
    store._con.execute("PRAGMA max_page_count=1073741823")  # room again: nothing was claimed for them
    assert sorted(tracer.record_outcomes([(d, False) for d in decisions[1:]]).recorded) == sorted(decisions[1:])
    assert telemetry.force_flush()
    assert len(_outcome_rows(dataset)) == len(decisions)


def test_a_flush_racing_an_outcome_commit_stalls_neither_and_seals_it_in_order(telemetry, dataset, monkeypatch, caplog):
    # The store's committing thread holds its lock, then takes the pipeline's write order to seal and commit; a
    # force_flush() took the write order, then the store's lock to write the held outcomes: each waited for the
    # other until the store gave up on the write order (logged) and sealed without it.
    monkeypatch.setattr(claim_store, "_ORDER_WAIT", 2.0)
    order = telemetry._ahead.write_order
    flushing, in_transaction = threading.Event(), threading.Event()

    class Watched:  # the write order, saying when the flush holds it
        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            taken = order.acquire(blocking, timeout)
            if threading.current_thread() is threading.main_thread():
                flushing.set()
            return taken

        def release(self) -> None:
            order.release()

        def __enter__(self) -> bool:
            return self.acquire()

        def __exit__(self, *exc: object) -> None:
            order.release()

    telemetry._ahead.write_order = Watched()
    real_orders = claim_store._write_orders

    def orders_once_the_flush_holds_the_order(batch):  # inside the store's transaction, holding its lock
        in_transaction.set()
        assert flushing.wait(30)
        return real_orders(batch)

    tracer = DecisionTracer()
    first = tracer.record_outcome(tracer.decision("agent", "approve", "r0", correlation_id="loan-0"), True)
    monkeypatch.setattr(claim_store, "_write_orders", orders_once_the_flush_holds_the_order)
    decision = tracer.decision("agent", "approve", "r1", correlation_id="loan-1")
    recorded: list[object] = []
    worker = threading.Thread(target=lambda: recorded.append(tracer.record_outcome(decision, True)))
    with caplog.at_level("WARNING"):
        worker.start()
        assert in_transaction.wait(30)
        assert telemetry.force_flush()
        worker.join(30)
    assert not worker.is_alive() and len(recorded) == 1
    assert "without their pipeline's write order" not in caplog.text
    assert telemetry.force_flush()
    assert sorted(r["record_id"] for r in _outcome_rows(dataset)) == sorted([first.record_id, recorded[0].record_id])
