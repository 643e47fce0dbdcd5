"""``ActionGate``: execute a verdict through a rail, and record what happened.

==============  ======================  ==================================
verdict         enforce_pre_commit      enforce_post_commit
==============  ======================  ==================================
ALLOW           allowed                 allowed (the action stands)
HUMAN_REVIEW    held                    held
ROLLBACK        blocked                 rolled_back (rail.compensate)
BLOCK           blocked                 reversed (rail.compensate)
(no receipt)    -                       compensation_unavailable
(rail raised)   -                       compensation_failed, re-raised
==============  ======================  ==================================

Every call emits a sealed ``replay.gate`` span linked to the decision span,
so the dataset holds the whole story: decision, verdict, and what the gate did.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from otel_replay import semconv as sc
from otel_replay.capture.context import current_ids
from otel_replay.capture.recorder import get_recorder
from otel_replay.capture.tracer import link_to
from otel_replay.records import Action, GateRecord, SpanRef, new_id
from otel_replay.replay import FixAction, Verdict

__all__ = ["ActionGate", "GateOutcome", "Rail", "Receipt", "ReferenceLedger"]


@dataclass(frozen=True)
class Receipt:
    """Proof a rail committed an action; what ``compensate`` needs to undo it."""

    receipt_id: str
    action_type: str
    amount: float
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The receipt as a plain dict (stored on the gate span)."""
        return {
            "receipt_id": self.receipt_id,
            "action_type": self.action_type,
            "amount": self.amount,
            "details": dict(self.details),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Receipt:
        """Rebuild a receipt stored by :meth:`to_json`."""
        return cls(data["receipt_id"], data["action_type"], data["amount"], data.get("details") or {})


@runtime_checkable
class Rail(Protocol):
    """Any commit/compensate backend: a payment rail, a record store, a ledger."""

    def commit(self, action: Action) -> Any:
        """Execute ``action``; return a receipt."""

    def compensate(self, receipt: Any) -> None:
        """Reverse the action ``receipt`` proves."""


class ReferenceLedger:
    """The in-process reference rail for demos and tests. It moves no real money.

    ``commit`` spends the action's cost from the balance and returns a
    :class:`Receipt`; ``compensate`` refunds it (once).
    """

    def __init__(self, balance: float = 0.0) -> None:
        """Open a ledger holding ``balance``."""
        self.balance = float(balance)
        self.entries: list[tuple[str, str, float]] = []
        self._refunded: set[str] = set()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def commit(self, action: Action) -> Receipt:
        """Spend ``action.cost`` (0 when unset) and return a receipt."""
        amount = float(action.cost or 0.0)
        with self._lock:
            if amount > self.balance:
                raise ValueError(f"ledger: {action.type} of {amount:,.2f} exceeds the balance {self.balance:,.2f}")
            receipt = Receipt(f"rcpt-{next(self._ids):04d}", action.type, amount, dict(action.arguments))
            self.balance -= amount
            self.entries.append(("commit", receipt.receipt_id, -amount))
        return receipt

    def compensate(self, receipt: Receipt) -> None:
        """Refund ``receipt``; a second refund of the same receipt is refused."""
        with self._lock:
            if receipt.receipt_id in self._refunded:
                raise ValueError(f"ledger: receipt {receipt.receipt_id} was already compensated")
            self._refunded.add(receipt.receipt_id)
            self.balance += receipt.amount
            self.entries.append(("compensate", receipt.receipt_id, receipt.amount))


@dataclass(frozen=True)
class GateOutcome:
    """What the gate did: the fix applied, ``executed`` and a human-readable detail."""

    fix: FixAction | None
    executed: str
    detail: str
    receipt: Any = None


class ActionGate:
    """Route verdicts to a :class:`Rail`: commit, hold, block or compensate."""

    def __init__(self, rail: Rail) -> None:
        """Gate actions through ``rail``."""
        self.rail = rail

    def commit(self, action: Action, *, record_id: str | None = None) -> Any:
        """Run ``action`` through the rail; returns the rail's receipt.

        A rail that raises is recorded as a ``commit_failed`` gate span, then re-raised.
        """
        try:
            receipt = self.rail.commit(action)
        except Exception as exc:
            self._emit("commit", None, "commit_failed", f"{action.type}: {exc}", record_id=record_id, receipt=None)
            raise
        self._emit("commit", None, "committed", f"{action.type} committed", record_id=record_id, receipt=receipt)
        return receipt

    def enforce_pre_commit(self, verdict: Verdict, action: Action) -> GateOutcome:
        """Before the action runs: ALLOW allows, HUMAN_REVIEW holds, ROLLBACK/BLOCK block."""
        if verdict.fix is FixAction.ALLOW:
            return self._outcome("pre_commit", verdict, "allowed", f"{action.type} may proceed: {verdict.reason}")
        if verdict.fix is FixAction.HUMAN_REVIEW:
            return self._outcome("pre_commit", verdict, "held", f"{action.type} held for review: {verdict.reason}")
        return self._outcome("pre_commit", verdict, "blocked", f"{action.type} blocked before commit: {verdict.reason}")

    def enforce_post_commit(self, verdict: Verdict, *, receipt: Any = None) -> GateOutcome:
        """After the action committed: ALLOW stands, HUMAN_REVIEW holds, ROLLBACK/BLOCK compensate."""
        if verdict.fix is FixAction.ALLOW:
            return self._outcome(
                "post_commit", verdict, "allowed", f"committed action stands: {verdict.reason}", receipt
            )
        if verdict.fix is FixAction.HUMAN_REVIEW:
            return self._outcome("post_commit", verdict, "held", f"held for review: {verdict.reason}", receipt)
        if receipt is None:
            return self._outcome(
                "post_commit",
                verdict,
                "compensation_unavailable",
                f"{verdict.fix.value} routed but no receipt to compensate: {verdict.reason}",
            )
        try:
            self.rail.compensate(receipt)
        except Exception as exc:
            self._outcome("post_commit", verdict, "compensation_failed", f"{verdict.fix.value}: {exc}", receipt)
            raise
        executed = "rolled_back" if verdict.fix is FixAction.ROLLBACK else "reversed"
        rid = getattr(receipt, "receipt_id", receipt)
        return self._outcome("post_commit", verdict, executed, f"compensated {rid}: {verdict.reason}", receipt)

    def _outcome(self, stage: str, verdict: Verdict, executed: str, detail: str, receipt: Any = None) -> GateOutcome:
        self._emit(stage, verdict, executed, detail, record_id=verdict.record_id, receipt=receipt)
        return GateOutcome(verdict.fix, executed, detail, receipt)

    def _emit(
        self, stage: str, verdict: Verdict | None, executed: str, detail: str, *, record_id: str | None, receipt: Any
    ) -> None:
        receipt_json = receipt.to_json() if hasattr(receipt, "to_json") else None
        record = GateRecord(
            record_id=new_id(),
            decision_id=record_id,
            stage=stage,
            fix=verdict.fix.value if verdict else None,
            executed=executed,
            detail=detail,
            justified=verdict.justified if verdict else None,
            reason=verdict.reason if verdict else None,
            receipt=receipt_json,
            correlation_id=(verdict.correlation_id if verdict else None) or current_ids().correlation_id,
        )
        link = link_to(SpanRef(verdict.trace_id, verdict.span_id)) if verdict else None
        get_recorder().emit(sc.SPAN_GATE, record.record_id, record.to_attributes(), links=[link] if link else [])
