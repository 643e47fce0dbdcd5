"""A decision is durable before the commit that acts on it, wherever the commit is made (issue 20).

Inside the decision's ``audit()`` block the intent carries the decision
(tests/gate/test_gate_write_ahead.py). Here the block has ended when the
gate commits: the decision is sealed but may still be in the batch queue.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

import otel_replay
from otel_replay import Action, ActionGate, DependencySnapshot, ReferenceLedger, audit
from otel_replay.errors import GateError, RecordNotFound
from otel_replay.gate import reads
from tests.gate.test_gate_write_ahead import KEY, _gates, _no_row_twice, _reopen

_AFTER_BLOCK = textwrap.dedent(
    """
    import os, signal, sys
    import otel_replay
    from otel_replay import Action, ActionGate, DependencySnapshot, ReferenceLedger, audit

    dataset, recent = sys.argv[1], int(sys.argv[2])
    import otel_replay.capture.write_ahead as write_ahead
    write_ahead.RECENT_DECISIONS = recent
    otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600)
    gate = ActionGate(ReferenceLedger(100), dataset=dataset)
    with audit("refund", snapshot=DependencySnapshot({"balance": 100}, version="v1"), correlation_id="t-2") as d:
        d.read(order="o-2")
        action = Action("refund", {"order": "o-2"}, cost=25.0)
        d.act(action)
    if recent == 1:  # another decision ends before the commit: the first is no longer at hand
        with audit("refund", snapshot=DependencySnapshot({"balance": 100}, version="v1"), correlation_id="t-3"):
            pass
    print(d.record_id, flush=True)
    gate.commit(action, record_id=d.record_id)  # the block has ended: the decision is sealed, not yet durable
    print("acknowledged", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.parametrize(
    ("recent", "through"),
    [(256, "the write-ahead log"), (1, "a flush")],
    ids=["decision-at-hand", "decision-ended-too-long-ago"],
)
def test_a_process_killed_after_committing_a_decision_whose_block_had_ended_keeps_that_decision(
    zygote, tmp_path, monkeypatch, recent, through
):
    dataset = tmp_path / "traces"
    child = zygote.run(_AFTER_BLOCK, str(dataset), str(recent), env={**os.environ, "OTEL_REPLAY_SIGNING_KEY": KEY})
    assert child.returncode == -9, child.stderr
    decision_id, said = child.stdout.split()
    assert said == "acknowledged"
    # At hand, the decision went to the log with the intent (no Parquet file yet: files are an hour apart);
    # ended too long ago to be at hand, the batch queue was flushed to Parquet before the intent.
    parquet = sorted((dataset / "spans").rglob("*.parquet")) if (dataset / "spans").exists() else []
    assert (parquet == []) == (through == "the write-ahead log"), parquet
    _reopen(dataset, monkeypatch)
    with otel_replay.open(dataset) as store:
        assert _gates(store, decision_id) == ["intent", "committed"]
        try:
            kept = store.record(decision_id)
        except RecordNotFound:  # the decision span was still in the batch queue: the intent must hold it
            kept = reads.intent_decision(store, decision_id)
        assert kept is not None and kept.action is not None and kept.action.cost == 25.0
        assert store.verify(None).problems == []  # a decision missing before its commit reads as deleted
        _no_row_twice(store)


def _decide(ledger_cost: float = 25.0) -> tuple[str, Action]:
    with audit("refund", snapshot=DependencySnapshot({"balance": 100}, version="v1"), correlation_id="t-4") as d:
        action = Action("refund", {"order": "o-4"}, cost=ledger_cost)
        d.act(action)
    return d.record_id, action


def test_a_decision_written_ahead_for_its_commit_is_stored_once_when_the_process_lives_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", KEY)
    dataset = tmp_path / "traces"
    telemetry = otel_replay.configure(dataset, set_global=False)
    try:
        gate = ActionGate(ReferenceLedger(100), dataset=dataset)
        decision_id, action = _decide()
        gate.commit(action, record_id=decision_id)
        gate.commit(Action("refund", {"order": "o-4b"}, cost=5.0), record_id=decision_id)  # a second act on it
        assert telemetry.log is not None and telemetry.log.appended == 5  # the decision once, two intents, two commits
    finally:
        telemetry.shutdown()
    with otel_replay.open(dataset) as store:
        assert store.record(decision_id).action is not None
        assert _gates(store, decision_id) == ["intent", "committed", "intent", "committed"]
        assert store.verify(None).problems == []
        _no_row_twice(store)  # the exporter skipped the decision the log had


def test_a_commit_whose_decision_cannot_be_made_durable_first_is_refused_before_the_rail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", KEY)
    dataset = tmp_path / "traces"
    telemetry = otel_replay.configure(dataset, set_global=False)
    try:
        ledger = ReferenceLedger(100)
        gate = ActionGate(ledger, dataset=dataset)
        decision_id, action = _decide()
        assert telemetry.log is not None

        def full_disk(spans: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(telemetry.log, "append", full_disk)
        with pytest.raises(GateError, match="decision could not be made durable"):
            gate.commit(action, record_id=decision_id)
        assert ledger.entries == [] and ledger.balance == 100  # the rail was never called
        monkeypatch.undo()
        monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", KEY)
    finally:
        telemetry.shutdown()
    with otel_replay.open(dataset) as store:
        assert store.record(decision_id).action is not None  # it reached Parquet the usual way
        assert _gates(store, decision_id) == ["commit_refused"]
