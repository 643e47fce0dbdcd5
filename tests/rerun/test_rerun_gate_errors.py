"""``rerun --execute``: a rail that refuses one decision's refund does not stop the gate for the others."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

import otel_replay
from otel_replay import Action, ActionGate, DependencySnapshot, ReferenceLedger
from otel_replay.cli.rerun import DIVERGED, rerun_command
from otel_replay.rerun import rerun

from .conftest import record

REFUNDED: list[tuple[str, float]] = []


def two_payments(gate: ActionGate | None = None) -> list[str]:
    """Two paid decisions, INV-1 then INV-2; the receipts' ids."""
    gate = gate or ActionGate(ReferenceLedger(balance=0))  # a rerun never commits: a zero balance would refuse
    receipts = []
    for invoice, cost in (("INV-1", 4200), ("INV-2", 1300)):
        with otel_replay.audit("vendor_payment", snapshot=DependencySnapshot({"budget_remaining": 10_000})) as d:
            action = Action("vendor_payment", {"invoice": invoice}, cost=cost)
            d.act(action)
            receipts.append(gate.commit(action, record_id=d.record_id).receipt_id)
    return receipts


class PickyRail:
    """The card network declines refunds of INV-1; every other refund goes through."""

    def commit(self, action: Action) -> Any:
        raise AssertionError("a rerun must not commit")

    def compensate(self, receipt: Any, *, idempotency_key: str) -> None:
        if receipt.details.get("invoice") == "INV-1":
            raise RuntimeError("card network declined the refund")
        REFUNDED.append((receipt.receipt_id, receipt.amount))


def picky() -> PickyRail:
    return PickyRail()


def over_budget(state: dict, action: Action) -> tuple[bool, str]:
    return action.cost <= state["budget_remaining"], "budget"


def _recorded(dataset: Path) -> None:
    REFUNDED.clear()
    ledger = ReferenceLedger(balance=100_000)
    record(dataset, "s1", lambda: two_payments(ActionGate(ledger, dataset=dataset)))


def test_a_refused_refund_is_recorded_and_the_next_decision_is_still_compensated(dataset: Path) -> None:
    _recorded(dataset)
    telemetry = otel_replay.configure(dataset, set_global=False)
    try:
        result = rerun(
            two_payments, dataset=dataset, session_id="s1", live_state={"budget_remaining": 0},
            policy=over_budget, rail=PickyRail(),
        )  # fmt: skip
        telemetry.force_flush()
    finally:
        telemetry.shutdown()
    assert REFUNDED == [("rcpt-0002", 1300.0)]  # the second decision was gated although the first was refused
    first, second = result.gate
    assert first.error is not None and "RuntimeError: card network declined the refund" in first.error
    assert "receipt rcpt-0001: RuntimeError" in first.error  # the note listing every receipt of the decision
    assert second.executed == ("rolled_back",) and second.error is None
    with otel_replay.open(dataset) as store:  # the rerun's record was written
        assert len(store.run("rerun_compare", session_id="s1")) == 1


def test_the_cli_goes_on_and_exits_diverged_naming_the_refusal(dataset: Path, tmp_path: Path) -> None:
    _recorded(dataset)
    live = tmp_path / "live.json"
    live.write_text(json.dumps({"budget_remaining": 0}))
    me = "tests.rerun.test_rerun_gate_errors"
    out = CliRunner().invoke(
        rerun_command,
        [
            "s1", "-d", str(dataset), "--entrypoint", f"{me}:two_payments", "--live-state", str(live),
            "--policy", f"{me}:over_budget", "--execute", "--rail", f"{me}:picky",
        ],
    )  # fmt: skip
    assert out.exit_code == DIVERGED, out.output
    assert "card network declined the refund" in out.output and "internal error" not in out.output
    assert REFUNDED == [("rcpt-0002", 1300.0)]


def paid_more_than_audited(gate: ActionGate | None = None) -> str:
    """Audits a 100 payment, then commits 9,000 under the same decision (a bug the gate must judge)."""
    gate = gate or ActionGate(ReferenceLedger(balance=0))
    with otel_replay.audit("vendor_payment", snapshot=DependencySnapshot({"budget_remaining": 10_000})) as d:
        d.act(Action("vendor_payment", {"invoice": "INV-9"}, cost=100))
        receipt = gate.commit(Action("vendor_payment", {"invoice": "INV-9"}, cost=9_000), record_id=d.record_id)
    return str(receipt.receipt_id)


def test_the_rerun_gate_judges_a_commit_of_another_action_than_audited(dataset: Path) -> None:
    record(dataset, "s9", lambda: paid_more_than_audited(ActionGate(ReferenceLedger(balance=100_000), dataset=dataset)))
    result = rerun(
        paid_more_than_audited, dataset=dataset, session_id="s9", live_state={"budget_remaining": 5_000},
        policy=over_budget,
    )  # fmt: skip
    (gated,) = result.gate
    assert gated.fix != "allow"  # the audited 100 fits the budget; the 9,000 committed does not
    assert "committed another action than the decision audited" in gated.reason
