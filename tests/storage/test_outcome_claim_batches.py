"""Claims and held outcomes in shared transactions: a refusal or a failed seal is its request's alone, a row is
held named for the batch that writes it, and what a claim looks for (an older version's claim file, a store put in
place by hand) is still found once ``_outcomes/`` has settled and is no longer listed for every claim."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time

import pytest

import otel_replay
from otel_replay import DecisionTracer, OutcomeAlreadyRecorded
from otel_replay import semconv as sc
from otel_replay.capture.recorder import HeldRecord, get_recorder
from otel_replay.records import OutcomeRecord, new_id
from otel_replay.storage import outcome_claims
from otel_replay.storage.outcome_claims import OutcomeClaim, claim_outcomes


def _rows(dataset, sql: str) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(dataset / "_outcomes" / "claims.sqlite3")) as con:
        return con.execute(sql).fetchall()


def _hold(decision_id: str) -> tuple[str, HeldRecord]:
    outcome = OutcomeRecord(new_id(), decision_id, True)
    held = get_recorder().held(sc.SPAN_OUTCOME, outcome.record_id, outcome.to_attributes())
    assert held is not None  # configure()'s pipeline: the outcome is sealed inside its claim's transaction
    return outcome.record_id, held


# Below 8 requests each claim is inserted alone; from 8 on, the taken claims are looked up first.
@pytest.mark.parametrize("size", [2, 12])
def test_a_decision_given_twice_in_one_transaction_is_claimed_once_and_the_repeat_names_the_first(
    telemetry, dataset, size
):
    decisions = [f"d-{i}" for i in range(size - 1)] + ["d-0"]
    holds = [_hold(d) for d in decisions]
    answers = claim_outcomes(dataset, [(d, o, True, h) for d, (o, h) in zip(decisions, holds, strict=True)])
    assert all(isinstance(a, OutcomeClaim) for a in answers[:-1])
    refusal = answers[-1]
    assert isinstance(refusal, OutcomeAlreadyRecorded)
    assert f"(outcome {holds[0][0]})" in str(refusal) and "claims.sqlite3" in str(refusal)
    assert holds[-1][1].seal is None  # refused before sealing: it took no link of the chain
    assert sorted(_rows(dataset, "SELECT decision_id FROM outcome_claims")) == sorted((d,) for d in decisions[:-1])
    assert len(_rows(dataset, "SELECT * FROM outcome_pending")) == size - 1


@pytest.mark.parametrize("size", [2, 12])
def test_a_seal_failing_inside_the_transaction_leaves_its_decision_free_and_stores_the_others(
    telemetry, dataset, monkeypatch, size
):
    tracer = DecisionTracer()
    decisions = [tracer.decision("agent", "approve", f"r{i}") for i in range(size)]
    unlucky = decisions[size // 2]
    real = HeldRecord.__call__

    def seal(self: HeldRecord):  # the disk or the key fails while this one outcome is being sealed
        if self._attributes[sc.OUTCOME_DECISION_ID] == unlucky:
            raise OSError("sealing failed")
        return real(self)

    monkeypatch.setattr(HeldRecord, "__call__", seal)
    done = tracer.record_outcomes([(d, True) for d in decisions])
    assert sorted(done.recorded) == sorted(d for d in decisions if d != unlucky)
    assert isinstance(done.failed[unlucky], OSError)
    assert (unlucky,) not in _rows(dataset, "SELECT decision_id FROM outcome_claims")
    monkeypatch.setattr(HeldRecord, "__call__", real)
    assert tracer.record_outcome(unlucky, False).outcome_correct is False  # free: recorded now, once
    assert len(_rows(dataset, "SELECT * FROM outcome_claims")) == size
    assert telemetry.force_flush()
    assert _rows(dataset, "SELECT * FROM outcome_pending") == []


def test_rows_are_held_named_for_the_open_batch_and_a_conversion_opens_the_next(telemetry, dataset):
    tracer = DecisionTracer()
    decisions = [tracer.decision("agent", "approve", f"r{i}") for i in range(3)]
    tracer.record_outcome(decisions[0], True)
    tracer.record_outcomes([(decisions[1], False)])
    assert _rows(dataset, "SELECT batch FROM outcome_pending") == [("1",), ("1",)]
    assert telemetry.force_flush()
    tracer.record_outcome(decisions[2], True)
    assert _rows(dataset, "SELECT batch FROM outcome_pending") == [("2",)]
    names = sorted(p.name for p in dataset.glob("spans/date=*/outcomes-*.parquet"))
    assert len(names) == 1 and names[0].endswith("-1.parquet")


def test_with_a_machine_sync_rows_are_named_by_the_conversion(dataset, monkeypatch):
    monkeypatch.setenv("OTEL_REPLAY_OUTCOME_SYNC", "machine")
    with otel_replay.configure(dataset, set_global=False) as telemetry:
        tracer = DecisionTracer()
        tracer.record_outcome(tracer.decision("agent", "approve", "r"), True)
        assert _rows(dataset, "SELECT batch FROM outcome_pending") == [(None,)]  # its span is handed over once synced
        assert telemetry.force_flush()
        assert _rows(dataset, "SELECT batch FROM outcome_pending") == []


def _settle(dataset) -> None:
    """Date ``_outcomes/`` back, as if nothing had changed there for a minute, and let a claim list it once."""
    old = time.time() - 60
    os.utime(dataset / "_outcomes", (old, old))
    store = outcome_claims._store(str(dataset))
    store.looked()
    assert store.looked() == (True, False)  # unchanged since listed, settled: claims no longer look for files


def test_a_claim_file_an_older_version_writes_after_the_directory_settled_still_refuses(telemetry, dataset):
    tracer = DecisionTracer()
    tracer.record_outcome(tracer.decision("agent", "approve", "the store exists"), True)
    later = tracer.decision("agent", "approve", "claimed by an older version")
    _settle(dataset)
    body = '{"claimant": "pid 42 on old-host", "claimed_at": "2026-01-02T03:04:05+00:00", "outcome_id": "o-old"}'
    (dataset / "_outcomes" / f"{later}.json").write_text(body)
    with pytest.raises(OutcomeAlreadyRecorded, match=rf"\(outcome o-old\) in .*_outcomes/{later}\.json"):
        tracer.record_outcome(later, False)
    (answer,) = claim_outcomes(dataset, [(later, "o-new", True, _hold(later)[1])])
    assert isinstance(answer, OutcomeAlreadyRecorded) and f"_outcomes/{later}.json" in str(answer)
    assert (later,) not in _rows(dataset, "SELECT decision_id FROM outcome_claims")


def test_a_store_removed_by_hand_after_the_directory_settled_is_not_written_through_a_stale_connection(
    telemetry, dataset
):
    tracer = DecisionTracer()
    first = tracer.decision("agent", "approve", "before")
    tracer.record_outcome(first, True)
    assert telemetry.force_flush()
    _settle(dataset)
    for name in ("claims.sqlite3", "claims.sqlite3-wal", "claims.sqlite3-shm"):
        (dataset / "_outcomes" / name).unlink(missing_ok=True)  # an operator starts an empty store
    second = tracer.decision("agent", "approve", "after")
    tracer.record_outcome(second, True)
    assert _rows(dataset, "SELECT decision_id FROM outcome_claims") == [(second,)]  # in the file at that path now


def test_an_older_claim_file_expired_as_a_batch_finds_it_leaves_no_claim_without_its_outcome(
    telemetry, dataset, monkeypatch
):
    # A batch finds an older version's claim file for a decision, and retention deletes the file the moment after.
    # Refused (the file was there) or claimed with its outcome held, either is right; claimed without its outcome
    # and then refused by that very claim is not: the decision could never get an outcome.
    tracer = DecisionTracer()
    tracer.record_outcome(tracer.decision("agent", "approve", "the store exists"), True)
    later = tracer.decision("agent", "approve", "claimed by an older version")
    old = dataset / "_outcomes" / f"{later}.json"
    old.write_text('{"claimant": "pid 42 on old-host", "outcome_id": "o-old"}')
    real = os.path.lexists

    def seen_then_expired(path: str) -> bool:
        found = real(path)
        if found and os.fspath(path) == str(old):
            old.unlink()  # retention expires it right after it was seen
        return found

    outcome_id, hold = _hold(later)
    monkeypatch.setattr(os.path, "lexists", seen_then_expired)
    (answer,) = claim_outcomes(dataset, [(later, outcome_id, True, hold)])
    monkeypatch.setattr(os.path, "lexists", real)
    claimed = _rows(dataset, f"SELECT outcome_id FROM outcome_claims WHERE decision_id = '{later}'")
    held = _rows(dataset, f"SELECT outcome_id FROM outcome_pending WHERE decision_id = '{later}'")
    if isinstance(answer, OutcomeClaim):
        assert claimed == held == [(outcome_id,)]
    else:
        assert isinstance(answer, OutcomeAlreadyRecorded) and f"_outcomes/{later}.json" in str(answer), answer
        assert claimed == held == []
