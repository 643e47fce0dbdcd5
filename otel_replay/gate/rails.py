"""What the gate commits through: the :class:`Rail` protocol, its :class:`Receipt`, the :class:`ReferenceLedger`."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from otel_replay.records import Action

__all__ = ["Rail", "Receipt", "ReferenceLedger"]


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
        """Execute ``action``; return a receipt (a :class:`Receipt`, a dict, any JSON-like value).

        The gate stores it (:func:`otel_replay.gate.receipts.stored_receipt`) and a
        later ``replay --execute`` hands the stored form back to ``compensate``.
        """

    def compensate(self, receipt: Any, *, idempotency_key: str) -> None:
        """Reverse the action ``receipt`` proves.

        ``idempotency_key`` is the same for every attempt at one receipt's
        compensation: a rail that remembers it can make a retried or resumed
        call a no-op. (A rail whose ``compensate`` takes no such keyword is
        still called, without it, and a warning says retries cannot be
        deduplicated by the rail.)
        """


class ReferenceLedger:
    """The in-process reference rail for demos and tests. It moves no real money.

    ``commit`` spends the action's cost from the balance and returns a
    :class:`Receipt`; ``compensate`` refunds it once: a repeat with the same
    idempotency key is a no-op, a repeat without one is refused.
    """

    def __init__(self, balance: float = 0.0) -> None:
        """Open a ledger holding ``balance``."""
        self.balance = float(balance)
        self.entries: list[tuple[str, str, float]] = []
        self._refunded: set[str] = set()
        self._keys: set[str] = set()
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

    def compensate(self, receipt: Receipt, *, idempotency_key: str | None = None) -> None:
        """Refund ``receipt``; a retry with the same key does nothing, any other second refund is refused."""
        with self._lock:
            if idempotency_key is not None and idempotency_key in self._keys:
                return
            if receipt.receipt_id in self._refunded:
                raise ValueError(f"ledger: receipt {receipt.receipt_id} was already compensated")
            self._refunded.add(receipt.receipt_id)
            if idempotency_key is not None:
                self._keys.add(idempotency_key)
            self.balance += receipt.amount
            self.entries.append(("compensate", receipt.receipt_id, receipt.amount))
