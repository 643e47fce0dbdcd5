"""The seed payment scenario end to end: capture, commit, replay under a dropped budget, roll back.

Also importable for the CLI's follow-up commands: ``budget_policy`` is a policy
(``otel_replay.demo:budget_policy``) and ``demo_ledger`` a rail factory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_replay.capture import AuditLog, audit, correlation
from otel_replay.gate import ActionGate, GateOutcome, ReferenceLedger
from otel_replay.gate.policy import Verdict, replay
from otel_replay.integrity import VerifyReport, load_signing_key
from otel_replay.pipeline import configure
from otel_replay.query.chains import ReplayBuilder, ReplayChain
from otel_replay.query.store import Store
from otel_replay.records import Action, DecisionRecord, DependencySnapshot, Report

__all__ = ["DemoResult", "budget_policy", "demo_ledger", "run_demo"]

OPENING_BALANCE = 10_000
PAYMENT = 4_200
DROPPED_BUDGET = 3_000


def budget_policy(state: Mapping[str, Any], action: Action) -> tuple[bool, str]:
    """Justified when the recipient is allow-listed and the cost fits the remaining budget."""
    recipient = action.arguments.get("recipient")
    if recipient not in state.get("allow_list", []):
        return False, f"recipient {recipient!r} is not on the allow-list"
    if (action.cost or 0) > state.get("budget_remaining", 0):
        return False, f"amount {action.cost:,} exceeds the remaining budget {state.get('budget_remaining', 0):,}"
    return True, "within budget and allow-list"


def demo_ledger() -> ReferenceLedger:
    """A reference ledger as the demo leaves it after the commit (for ``replay --execute``)."""
    return ReferenceLedger(OPENING_BALANCE - PAYMENT)


@dataclass
class DemoResult:
    """Everything the demo produced, for printing and for tests."""

    dataset: str
    correlation_id: str
    record: DecisionRecord
    verdict: Verdict
    outcome: GateOutcome
    balance_after_commit: float
    balance_after_gate: float
    chain: ReplayChain
    rehydrated_equal: bool
    verify: VerifyReport
    live_state_file: str


def run_demo(dataset: str | os.PathLike[str]) -> DemoResult:
    """Run the scenario, writing spans to ``dataset``; returns what happened."""
    telemetry = configure(dataset, service_name="otel-replay-demo", set_global=False)
    try:
        ledger = ReferenceLedger(OPENING_BALANCE)
        gate = ActionGate(ledger, dataset=dataset)
        log = AuditLog()
        snapshot = DependencySnapshot(
            {"budget_remaining": OPENING_BALANCE, "allow_list": ["acme-supplies"]}, version="budget-v7"
        )
        with correlation(agent_id="payables-agent") as cid:
            log.append(
                "invoice_received",
                source_agent="inbox-agent",
                target_agent="payables-agent",
                payload={"invoice": "INV-4471", "amount": PAYMENT},
            )
            with audit("vendor_payment", snapshot=snapshot) as d:
                d.read(invoice="INV-4471", purchase_order="PO-1182")
                d.attach(Report("data", "po_match", passed=True, detail={"po": "PO-1182"}))
                d.model("gpt-x", decision_basis="Invoice matches an approved PO; within budget.")
                action = Action("vendor_payment", {"recipient": "acme-supplies", "invoice": "INV-4471"}, cost=PAYMENT)
                d.act(action)
                receipt = gate.commit(action, record_id=d.record_id)
            balance_after_commit = ledger.balance
            log.append(
                "budget_revised",
                source_agent="finance-agent",
                payload={"budget_remaining": DROPPED_BUDGET, "reason": "quarter-end freeze"},
            )
            live_state = {"budget_remaining": DROPPED_BUDGET, "allow_list": ["acme-supplies"]}
            verdict = replay(d.record, live_state=live_state, policy=budget_policy)
            outcome = gate.enforce_post_commit(verdict, receipt=receipt)
            log.append("payment_reversed", source_agent="gate", payload={"receipt": receipt.receipt_id})
        telemetry.force_flush()
        live_file = Path(dataset) / "demo-live-state.json"
        live_file.write_text(json.dumps(live_state, indent=2) + "\n", encoding="utf-8")
        with Store(dataset) as store:
            chain = ReplayBuilder(store).build_trade_chain(cid)
            rehydrated = store.record(d.record_id)
            report = store.verify(load_signing_key(create=False))
        return DemoResult(
            dataset=str(dataset),
            correlation_id=cid,
            record=d.record,
            verdict=verdict,
            outcome=outcome,
            balance_after_commit=balance_after_commit,
            balance_after_gate=ledger.balance,
            chain=chain,
            rehydrated_equal=rehydrated == d.record,
            verify=report,
            live_state_file=str(live_file),
        )
    finally:
        telemetry.shutdown()
