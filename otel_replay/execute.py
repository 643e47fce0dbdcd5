"""Replay a stored decision and execute the verdict on a rail: the library behind ``otel-replay replay``.

A library user gets the same guarantees as the CLI: only a sealed, verified
record is replayed (:meth:`Store.record`), only receipts from verified commit
records are compensated (:meth:`Store.receipts_for`), each at most once
(:class:`~otel_replay.gate.ActionGate`'s claims plus the dataset's own gate
records), several in reverse commit order; calling again finishes a decision
compensated in part.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from otel_replay.errors import AlreadyCompensated
from otel_replay.gate import ALREADY_COMPENSATED, ActionGate, GateOutcome, Rail, Receipt
from otel_replay.receipts import receipt_id_of
from otel_replay.replay import FixAction, Policy, Verdict, replay
from otel_replay.store import Store

__all__ = ["execute_verdict", "replay_stored"]


def replay_stored(store: Store, record_id: str, *, live_state: Mapping[str, Any], policy: Policy) -> Verdict:
    """Replay the verified decision ``record_id`` of ``store`` against ``live_state``."""
    return replay(store.record(record_id), live_state=live_state, policy=policy)


_AGAIN = "; not compensating it again"
_RECEIPT_FIELDS = frozenset({"receipt_id", "action_type", "amount", "details"})


def _receipt(stored: Any) -> Any:
    """What the rail is handed: a :class:`Receipt` when one was stored (its four fields), else the stored JSON.

    A rail whose ``commit`` returns its own receipts (a dict, say) gets back
    what it returned, as stored; it never sees a type it did not make.
    """
    if isinstance(stored, Mapping) and set(stored) == _RECEIPT_FIELDS and isinstance(stored["details"], Mapping):
        return Receipt.from_json(stored)
    return stored


def _unique(receipts: list[Any]) -> list[Any]:
    """``receipts`` without repeats of one receipt id (a commit row stored twice: an OTLP retry, a copied file)."""
    seen: set[str] = set()
    kept = []
    for stored in receipts:
        rid = receipt_id_of(stored)
        if rid not in seen:
            seen.add(rid)
            kept.append(stored)
    return kept


def execute_verdict(store: Store, verdict: Verdict, rail: Rail, *, resume: bool = False) -> list[GateOutcome]:
    """Apply ``verdict`` post-commit through ``rail``, compensating the decision's stored receipts.

    ALLOW and HUMAN_REVIEW are recorded and leave the action standing.
    ROLLBACK and BLOCK compensate every verified receipt of the decision once,
    the latest commit first (the saga rule); none is a
    ``compensation_unavailable`` outcome. A receipt compensated before (by any
    process) is an ``already_compensated`` outcome and is skipped, so a
    decision compensated in part is finished by calling this again. A receipt
    whose compensation fails does not stop the others: they are tried, then
    the first error is raised (its notes list what happened to the others).
    Spans are emitted through the configured pipeline, so call this inside
    :func:`otel_replay.configure` for the outcomes to land in the dataset.

    Raises:
        AlreadyCompensated: every receipt was compensated before this call (or is being compensated now).
        CompensationPending: an earlier attempt never finished; retry with ``resume=True``.
        Exception: what the rail raised for a receipt (the others were tried first).

    """
    gate = ActionGate(rail, dataset=store.dataset)
    if verdict.fix in (FixAction.ALLOW, FixAction.HUMAN_REVIEW):
        return [gate.enforce_post_commit(verdict)]
    receipts = _unique(store.receipts_for(verdict.record_id))
    if not receipts:
        return [gate.enforce_post_commit(verdict)]
    outcomes: list[GateOutcome] = []
    done_before: list[str] = []
    errors: list[tuple[str, Exception]] = []
    summary: list[str] = []  # what happened to each receipt, for the note on a raised error
    for stored in reversed(receipts):
        rid = receipt_id_of(stored)
        receipt = _receipt(stored)
        done = store.compensation_for(verdict.record_id, receipt_id=rid)
        if done is not None:
            # The dataset says so even where no claim file does (claims deleted, or another dataset copy).
            at = datetime.fromtimestamp(done["recorded_at"] / 1e9, tz=UTC).isoformat()
            why = f"receipt {rid} was already compensated ({done['executed']} at {at}, gate record {done['gate_id']})"
        else:
            try:
                outcome = gate.enforce_post_commit(verdict, receipt=receipt, resume=resume)
                outcomes.append(outcome)
                summary.append(f"receipt {rid}: {outcome.executed}")
                continue
            except AlreadyCompensated as exc:  # its claim says done, or another claimant holds it right now
                why = str(exc).removesuffix(_AGAIN)
            except Exception as exc:  # pending, or the rail raised: the other receipts are still tried
                errors.append((rid, exc))
                summary.append(f"receipt {rid}: {type(exc).__name__}: {exc}")
                continue
        done_before.append(why)
        summary.append(f"receipt {rid}: {ALREADY_COMPENSATED}")
        outcomes.append(GateOutcome(verdict.fix, ALREADY_COMPENSATED, why, receipt))
    if errors:
        rid, first = errors[0]
        first.add_note(
            f"otel-replay: compensating receipt {rid} of decision {verdict.record_id} failed; "
            f"every receipt of the decision: {'; '.join(summary)}"
        )
        raise first
    if len(done_before) == len(receipts):
        whys = "; ".join(done_before)
        raise AlreadyCompensated(f"decision {verdict.record_id} was already compensated: {whys}{_AGAIN}")
    return outcomes
