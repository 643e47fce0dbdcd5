from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import otel_replay
from otel_replay import ActionGate, FixAction, Receipt, ReferenceLedger, Verdict, audit, replay
from otel_replay.gate import reads

from .._support import budget_policy, payment, snapshot


def _verdict(fix: FixAction, record_id: str = "r-1") -> Verdict:
    return Verdict(fix, fix is FixAction.ALLOW, f"because {fix.value}", record_id)


@pytest.mark.parametrize(
    ("fix", "executed"),
    [
        (FixAction.ALLOW, "allowed"),
        (FixAction.HUMAN_REVIEW, "held"),
        (FixAction.ROLLBACK, "blocked"),
        (FixAction.BLOCK, "blocked"),
    ],
)
def test_pre_commit_paths_never_touch_the_rail(fix, executed):
    ledger = ReferenceLedger(10_000)
    outcome = ActionGate(ledger).enforce_pre_commit(_verdict(fix), payment())
    assert outcome.fix is fix and outcome.executed == executed
    assert ledger.balance == 10_000 and ledger.entries == []


@pytest.mark.parametrize(
    ("fix", "executed", "balance"),
    [
        (FixAction.ALLOW, "allowed", 5_800),
        (FixAction.HUMAN_REVIEW, "held", 5_800),
        (FixAction.ROLLBACK, "rolled_back", 10_000),
        (FixAction.BLOCK, "reversed", 10_000),
    ],
)
def test_post_commit_paths(fix, executed, balance, tmp_path):
    ledger = ReferenceLedger(10_000)
    gate = ActionGate(ledger, dataset=tmp_path)
    receipt = gate.commit(payment())
    assert ledger.balance == 5_800
    outcome = gate.enforce_post_commit(_verdict(fix), receipt=receipt)
    assert outcome.executed == executed and outcome.fix is fix
    assert ledger.balance == balance


@pytest.mark.parametrize("fix", [FixAction.ROLLBACK, FixAction.BLOCK])
def test_post_commit_without_receipt_reports_compensation_unavailable(fix):
    ledger = ReferenceLedger(10_000)
    outcome = ActionGate(ledger).enforce_post_commit(_verdict(fix))
    assert outcome.executed == "compensation_unavailable"
    assert fix.value in outcome.detail


def test_ledger_refuses_overdraft_and_double_refund():
    ledger = ReferenceLedger(100)
    with pytest.raises(ValueError, match="exceeds the balance"):
        ledger.commit(payment(cost=200))
    receipt = ledger.commit(payment(cost=50))
    ledger.compensate(receipt)
    with pytest.raises(ValueError, match="already compensated"):
        ledger.compensate(receipt)


def test_gate_outcomes_are_spans_linked_to_the_decision(telemetry, dataset):
    ledger = ReferenceLedger(10_000)
    gate = ActionGate(ledger)
    with audit("vendor_payment", snapshot=snapshot(), correlation_id="pay-1") as d:
        action = payment()
        d.act(action)
        receipt = gate.commit(action, record_id=d.record_id)
    verdict = replay(
        d.record, live_state={"budget_remaining": 1, "allow_list": ["acme-supplies"]}, policy=budget_policy
    )
    gate.enforce_post_commit(verdict, receipt=receipt)
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        gates = store.rows("SELECT * FROM gates WHERE decision_id = ? ORDER BY recorded_at", [d.record_id])
        links = store.rows("SELECT links FROM spans WHERE record_id = ?", [gates[2]["gate_id"]])[0]["links"]
        stored_receipt = reads.receipt_for(store, d.record_id)
    assert [(g["stage"], g["executed"]) for g in gates] == [
        ("commit", "intent"),
        ("commit", "committed"),
        ("post_commit", "rolled_back"),
    ]
    assert gates[2]["fix"] == "ROLLBACK" and gates[2]["justified"] is False
    assert all(g["correlation_id"] == "pay-1" for g in gates)
    assert links[0]["span_id"] == d.record.span.span_id and links[0]["trace_id"] == d.record.span.trace_id
    assert Receipt.from_json(stored_receipt) == receipt
    assert json.loads(gates[1]["receipt"])["amount"] == 4200.0


class FlakyRail:
    """A rail whose backend is down."""

    def commit(self, action):
        raise ConnectionError("payments API unreachable")

    def compensate(self, receipt):
        raise ConnectionError("refund API unreachable")


def test_rail_failures_are_recorded_then_raised(telemetry, dataset):
    gate = ActionGate(FlakyRail())
    with pytest.raises(ConnectionError, match="payments API"):
        gate.commit(payment(), record_id="r-9")
    with pytest.raises(ConnectionError, match="refund API"):
        gate.enforce_post_commit(_verdict(FixAction.ROLLBACK, "r-9"), receipt=Receipt("x", "vendor_payment", 1.0))
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        rows = store.rows("SELECT stage, executed, detail FROM gates WHERE decision_id = 'r-9' ORDER BY recorded_at")
    assert [(r["stage"], r["executed"]) for r in rows] == [
        ("commit", "intent"),
        ("commit", "commit_failed"),
        ("post_commit", "compensation_failed"),
    ]
    assert "payments API unreachable" in rows[1]["detail"]


_PROCESS_GATE = """
import sys
from otel_replay import ActionGate, Action, FixAction, ReferenceLedger, Verdict
ledger = ReferenceLedger(100)
gate = ActionGate(ledger)
receipt = gate.commit(Action("pay", {"to": "a"}, cost=40))
gate.enforce_post_commit(Verdict(FixAction.BLOCK, False, "no", "r-1"), receipt=receipt)
assert ledger.balance == 100, ledger.balance
print(gate.claims.directory.parent)
"""


def test_a_gate_without_a_dataset_leaves_no_claims_directory_behind(tmp_path):
    # Its claims hold within the process only; a directory per process left in the
    # temp folder would pile up (one per test run, per script run...).
    env = {"TMPDIR": str(tmp_path), "PATH": ""}
    done = subprocess.run(
        [sys.executable, "-c", _PROCESS_GATE], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    used = Path(done.stdout.strip().splitlines()[-1])
    assert used.is_relative_to(tmp_path), used
    assert not used.exists() and list(tmp_path.iterdir()) == []
