"""Replay a stored decision and execute the verdict on a rail: the library behind ``otel-replay replay``.

A library user gets the same guarantees as the CLI: only a sealed, verified
record is replayed (:meth:`Store.record`), only receipts from verified commit
records are compensated (:meth:`Store.receipts_for`), each at most once
(:class:`~otel_replay.gate.ActionGate`'s claims plus the dataset's own gate
records), several in reverse commit order.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from otel_replay.errors import AlreadyCompensated, GateError
from otel_replay.gate import ActionGate, GateOutcome, Rail, Receipt
from otel_replay.replay import FixAction, Policy, Verdict, replay
from otel_replay.store import Store

__all__ = ["execute_verdict", "replay_stored"]


def replay_stored(store: Store, record_id: str, *, live_state: Mapping[str, Any], policy: Policy) -> Verdict:
    """Replay the verified decision ``record_id`` of ``store`` against ``live_state``."""
    return replay(store.record(record_id), live_state=live_state, policy=policy)


def _receipt(stored: Mapping[str, Any], decision_id: str) -> Receipt:
    try:
        return Receipt.from_json(stored)
    except (KeyError, TypeError) as exc:
        raise GateError(
            f"the receipt stored for decision {decision_id} is incomplete ({exc}); cannot compensate it"
        ) from None


def execute_verdict(store: Store, verdict: Verdict, rail: Rail, *, resume: bool = False) -> list[GateOutcome]:
    """Apply ``verdict`` post-commit through ``rail``, compensating the decision's stored receipts.

    ALLOW and HUMAN_REVIEW are recorded and leave the action standing.
    ROLLBACK and BLOCK compensate every verified receipt of the decision, the
    latest commit first (the saga rule); none is a ``compensation_unavailable``
    outcome. Spans are emitted through the configured pipeline, so call this
    inside :func:`otel_replay.configure` for the outcomes to land in the dataset.

    Raises:
        AlreadyCompensated: a receipt was compensated before (by any process).
        CompensationPending: an earlier attempt never finished; retry with ``resume=True``.
        GateError: a stored receipt is incomplete.

    """
    gate = ActionGate(rail, dataset=store.dataset)
    if verdict.fix in (FixAction.ALLOW, FixAction.HUMAN_REVIEW):
        return [gate.enforce_post_commit(verdict)]
    receipts = store.receipts_for(verdict.record_id)
    if not receipts:
        return [gate.enforce_post_commit(verdict)]
    outcomes = []
    for stored in reversed(receipts):
        receipt = _receipt(stored, verdict.record_id)
        done = store.compensation_for(verdict.record_id, receipt_id=receipt.receipt_id)
        if done is not None:
            # The dataset says so even where no claim file does (claims deleted, or another dataset copy).
            at = datetime.fromtimestamp(done["recorded_at"] / 1e9, tz=UTC).isoformat()
            raise AlreadyCompensated(
                f"decision {verdict.record_id} was already compensated ({done['executed']} at {at}, receipt "
                f"{receipt.receipt_id}, gate record {done['gate_id']}); not compensating it again"
            )
        outcomes.append(gate.enforce_post_commit(verdict, receipt=receipt, resume=resume))
    return outcomes
