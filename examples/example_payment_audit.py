"""Capture a $4,200 vendor payment, commit it, replay it under a dropped budget, roll it back.

Run: python examples/example_payment_audit.py [DATASET_DIR]
"""

from __future__ import annotations

import sys
import tempfile

import otel_replay
from otel_replay import Action, ActionGate, DependencySnapshot, FixAction, ReferenceLedger, audit, replay


def budget_policy(state, action):
    """Justified while the recipient is allow-listed and the payment fits the budget."""
    if action.arguments["recipient"] not in state.get("allow_list", []):
        return False, "Recipient not on the allow-list."
    if action.cost > state.get("budget_remaining", 0):
        return False, "Amount exceeds the remaining budget."
    return True, "Within budget and allow-list."


def main(dataset: str) -> int:
    telemetry = otel_replay.configure(dataset, service_name="payables")
    ledger = ReferenceLedger(balance=10_000)
    gate = ActionGate(ledger)

    # 1. Capture the decision with the state it relied on, and commit the action.
    snapshot = DependencySnapshot(state={"budget_remaining": 10_000, "allow_list": ["acme-supplies"]}, version="v7")
    with audit("vendor_payment", snapshot=snapshot, agent_id="payables-agent") as d:
        d.read(invoice="INV-4471")
        d.model("gpt-x", decision_basis="Invoice matches an approved PO; within budget.")
        action = Action("vendor_payment", {"recipient": "acme-supplies"}, cost=4200)
        d.act(action)
        receipt = gate.commit(action, record_id=d.record_id)
    print(f"committed {action.cost} to {action.arguments['recipient']}; balance {ledger.balance:,.0f}")

    # 2. Later the budget drops. Replay the decision against the live state.
    live_state = {"budget_remaining": 3_000, "allow_list": ["acme-supplies"]}
    verdict = replay(d.record, live_state=live_state, policy=budget_policy)
    print(f"verdict: {verdict.fix.value} - {verdict.reason}")

    # 3. The gate reverses the committed action.
    outcome = gate.enforce_post_commit(verdict, receipt=receipt)
    print(f"gate: {outcome.executed}; balance {ledger.balance:,.0f}")
    telemetry.shutdown()

    # 4. The whole story is in the dataset; the record rehydrates and replays the same.
    with otel_replay.open(dataset) as store:
        again = replay(store.record(d.record.record_id), live_state=live_state, policy=budget_policy)
        gates = store.rows(
            "SELECT stage, executed FROM gates WHERE decision_id = ? ORDER BY recorded_at", [d.record_id]
        )
    print(f"from Parquet: {again.fix.value}; gate spans: {[g['executed'] for g in gates]}")
    ok = verdict.fix is FixAction.ROLLBACK and again.fix is verdict.fix and ledger.balance == 10_000
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="payment-audit-")))
