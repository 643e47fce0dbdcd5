"""Replay a stored decision and execute the verdict on a rail: the library behind ``otel-replay replay``.

A library user gets the same guarantees as the CLI: only a sealed, verified
record is replayed (:meth:`Store.record`), only receipts from verified commit
records are compensated (:func:`otel_replay.gate.reads.receipts_for`), each at most once
(:class:`~otel_replay.gate.gate.ActionGate`'s claims plus the dataset's own gate
records), several in reverse commit order; calling again finishes a decision
compensated in part.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from otel_replay import semconv as sc
from otel_replay._json import canonical_json
from otel_replay.errors import AlreadyCompensated, CompensationInProgress, GateError, RecordNotFound
from otel_replay.gate import reads
from otel_replay.gate.claims import CompensationClaims, idempotency_key
from otel_replay.gate.gate import ALREADY_COMPENSATED, ActionGate, GateOutcome
from otel_replay.gate.policy import FixAction, Policy, Verdict, replay
from otel_replay.gate.rails import Rail, Receipt
from otel_replay.gate.receipts import RECEIPT_TYPE, RECEIPT_TYPE_KEY, receipt_id_of
from otel_replay.integrity import StoredRecord
from otel_replay.query.store import Store
from otel_replay.records import Action, DecisionRecord

__all__ = ["execute_verdict", "judge_stored", "replay_stored"]

_log = logging.getLogger(__name__)


def replay_stored(store: Store, record_id: str, *, live_state: Mapping[str, Any], policy: Policy) -> Verdict:
    """Replay the verified decision ``record_id`` of ``store`` against ``live_state``, and every action it committed.

    See :func:`judge_stored`.

    A process killed inside ``audit()`` after ``gate.commit()`` leaves no
    decision span, but the commit's intent holds the decision as it was
    acted on: that is what is judged then (a warning says so).

    Raises:
        RecordNotFound: no decision ``record_id`` nor an intent holding it;
            when commits name it (a dataset written before intents), the
            message names their receipts, to compensate by hand.

    """
    try:
        record = store.record(record_id)
    except RecordNotFound as exc:
        acted = reads.intent_decision(store, record_id)
        if acted is not None:
            _log.warning(
                "otel-replay: decision %s has no decision record (its process died inside the audit() block); "
                "judging it as its commit intent sealed it before the rail was called",
                record_id,
            )
            return judge_stored(store, acted, live_state=live_state, policy=policy)
        orphans = reads.commits_for(store, record_id)
        if not orphans:
            raise
        receipts = ", ".join(f"{receipt_id_of(r)} (gate record {g})" for g, r in orphans)
        raise RecordNotFound(
            f"decision {record_id} was never recorded, but {len(orphans)} commit(s) were made for it: {receipts} "
            "(a process killed inside its audit() block?); nothing can replay it: review and compensate by hand"
        ) from exc
    return judge_stored(store, record, live_state=live_state, policy=policy)


UNKNOWN = "executed? unknown - check the rail"
"""What replay and verify say of a commit intent with no commit record (the process died inside the rail)."""

_SEVERITY = {FixAction.ALLOW: 0, FixAction.HUMAN_REVIEW: 1, FixAction.ROLLBACK: 2, FixAction.BLOCK: 3}


def judge_stored(store: Store, record: DecisionRecord, *, live_state: Mapping[str, Any], policy: Policy) -> Verdict:
    """The verdict on ``record``'s audited action and on every different action its commits stored: the worst.

    ``gate.commit(action, record_id=...)`` may commit another action than the
    block's ``act()`` (a bug, an edited action, a second payment): a verdict
    on the audited action alone would ALLOW a $9,000 commit under a $100
    decision. Each committed action that differs is replayed too, and the
    most severe verdict wins (ALLOW < HUMAN_REVIEW < ROLLBACK < BLOCK), its
    reason naming the commit; ROLLBACK and BLOCK compensate every receipt of
    the decision, as for any decision.

    A commit whose action cannot be judged makes the verdict HUMAN_REVIEW at
    least, its reason naming the gate record: an intent no commit record
    answers (executed? unknown), and a sealed commit or intent this store
    cannot trust (signed with a key not given, or edited), whose action was
    left out. So does an ALLOW of a decision compensated already (in whole
    or in part), or whose compensation was begun (a claim taken, its outcome
    not recorded): "the action stands" may be false.
    """
    verdict = replay(record, live_state=live_state, policy=policy)
    rows = store.record_rows(gate_decision_id=record.record_id)  # one read for the three questions below
    for gate_id, action in reads.committed_actions_for(store, record.record_id, rows=rows):
        if action == record.action:
            continue
        other = replay(dataclasses.replace(record, action=action), live_state=live_state, policy=policy)
        if _SEVERITY[other.fix] > _SEVERITY[verdict.fix]:
            shown = canonical_json(action.to_json(), where="committed action")[:200]
            verdict = dataclasses.replace(
                other, reason=f"commit {gate_id} committed another action than the decision audited ({shown}): "
                f"{other.reason}"
            )
    refused = reads.refused_commits_for(store, record.record_id, intents=True, rows=rows)
    if refused:
        named = "; ".join(f"gate {problem}" for problem in refused)
        verdict = _at_least_review(
            verdict, f"{len(refused)} commit record(s) of the decision cannot be trusted, so what they committed "
            f"was not judged ({named}): pass the key that signed them (--key-file, OTEL_REPLAY_KEY_FILE)"
        )
    unknown = _unknown(store, record.record_id, rows)
    if unknown:
        named = ", ".join(f"{action.type} (intent {gate_id})" for gate_id, action in unknown)
        verdict = _at_least_review(verdict, f"{UNKNOWN}: {named} has no commit record")
    if verdict.fix is FixAction.ALLOW:
        done = reads.compensation_for(store, record.record_id, rows=rows)
        if done is not None:
            verdict = _at_least_review(
                verdict, f"the decision's action was compensated already ({done['executed']}, gate record "
                f"{done['gate_id']}): it no longer stands, so allowing it would not make it happen again"
            )
        else:
            begun = _compensation_begun(store, record.record_id, rows)
            if begun is not None:
                verdict = _at_least_review(verdict, begun)
    return verdict


def _compensation_begun(store: Store, decision_id: str, rows: Any) -> str | None:
    """Why a compensation of ``decision_id`` may have been made though the dataset records none, or ``None``.

    A claim taken for one of its receipts (a claimant killed inside the rail, a rail that raised, one killed
    after the refund but before its gate record): compensated? unknown - check the rail.
    """
    claims = CompensationClaims(store.dataset)
    for _, stored in reads.commits_for(store, decision_id, rows=rows):
        rid = receipt_id_of(stored)
        held = claims.state(idempotency_key(decision_id, rid))
        if held is not None:
            return (
                f"a compensation of receipt {rid} was begun ({held.get('state')} by "
                f"{held.get('claimant', '?')} at {held.get('claimed_at', '?')}) and the dataset records none: "
                "compensated? unknown - check the rail"
            )
    return None


def _unknown(store: Store, decision_id: str, rows: Sequence[StoredRecord]) -> list[tuple[str, Action]]:
    """:meth:`Store.unknown_commits_for`, less the intents a sealed commit record this store cannot trust answers.

    Such an intent is named with that record (:func:`reads.refused_commits_for`), not as having none.
    """
    answered = {
        r.attributes.get(sc.GATE_INTENT_ID)
        for r in rows
        if r.attributes.get(sc.GATE_STAGE) == "commit" and r.attributes.get(sc.RECORD_HASH) is not None
    }
    return [(gate_id, action) for gate_id, action in store.unknown_commits_for(decision_id) if gate_id not in answered]


def _at_least_review(verdict: Verdict, why: str) -> Verdict:
    """``verdict`` made HUMAN_REVIEW when it was ALLOW, its reason led by ``why``."""
    fix = verdict.fix if _SEVERITY[verdict.fix] >= _SEVERITY[FixAction.HUMAN_REVIEW] else FixAction.HUMAN_REVIEW
    return dataclasses.replace(verdict, fix=fix, reason=f"{why}; {verdict.reason}")


_AGAIN = "; not compensating it again"


def _receipt(stored: Any) -> Any:
    """What the rail is handed: a :class:`Receipt` when the commit returned one (its stored marker), else the JSON.

    A rail whose ``commit`` returns its own receipts (a dict, say, even one
    with ``Receipt``'s four keys) gets back what it returned, as stored; it
    never sees a type it did not make.
    """
    if isinstance(stored, Mapping) and stored.get(RECEIPT_TYPE_KEY) == RECEIPT_TYPE:
        fields = {k: v for k, v in stored.items() if k != RECEIPT_TYPE_KEY}
        if isinstance(fields.get("details", {}), Mapping) and {"receipt_id", "action_type", "amount"} <= set(fields):
            return Receipt.from_json(fields)
    return stored


def _unique(commits: list[tuple[str, Any]], decision_id: str) -> tuple[list[Any], list[tuple[str, Exception]]]:
    """The receipts to compensate, one per commit gate record (a record stored twice counts once); and refusals.

    Two different commits whose receipts share one receipt id cannot both be
    compensated: the claim and the rail's idempotency key name the receipt
    id, so the second refund would be taken for a retry of the first. Each
    such id is refused with a :class:`GateError` naming both gate records,
    and neither receipt is compensated; nothing is dropped silently.
    """
    first: dict[str, tuple[str, Any]] = {}
    clash: dict[str, list[tuple[str, Any]]] = {}
    kept: list[Any] = []
    for gate_id, stored in commits:
        rid = receipt_id_of(stored)
        if rid not in first:
            first[rid] = (gate_id, stored)
            kept.append(stored)
        elif first[rid][0] != gate_id and all(g != gate_id for g, _ in clash.get(rid, [])):
            clash.setdefault(rid, [first[rid]]).append((gate_id, stored))
    refused: list[tuple[str, Exception]] = []
    for rid, records in clash.items():
        kept = [stored for stored in kept if receipt_id_of(stored) != rid]
        named = "; ".join(f"gate record {g}: {canonical_json(r, where='receipt')[:200]}" for g, r in records)
        refused.append((
            rid,
            GateError(
                f"decision {decision_id}: {len(records)} different commits returned receipt id {rid} ({named}); "
                "one idempotency key cannot refund them apart, so neither is compensated: refund them on the "
                "rail by hand"
            ),
        ))
    return kept, refused


def _not_compensated(store: Store, decision_id: str) -> GateError | None:
    """The error naming ``decision_id``'s commits whose receipts this run cannot compensate, or ``None``.

    Sealed commit records (and unanswered intents) this store cannot trust,
    and intents no commit record answers (executed? unknown): each may have
    moved money, so a compensation that leaves them out is not done.
    """
    rows = store.record_rows(gate_decision_id=decision_id)
    refused = reads.refused_commits_for(store, decision_id, intents=True, rows=rows)
    unknown = _unknown(store, decision_id, rows)
    parts = []
    if refused:
        named = "; ".join(f"gate {problem}" for problem in refused)  # "gate record <id>: <why> [<file>]"
        parts.append(
            f"has {len(refused)} commit record(s) this run cannot trust ({named}); their receipts were not "
            "compensated: pass the key that signed them (--key-file, OTEL_REPLAY_KEY_FILE) and run again"
        )
    if unknown:
        intents = ", ".join(f"{action.type} (intent {gate_id})" for gate_id, action in unknown)
        parts.append(
            f"has {len(unknown)} commit(s) no commit record answers ({intents}): {UNKNOWN}; no receipt was "
            "recorded, so they were not compensated: refund them on the rail by hand if it executed them"
        )
    return GateError(f"decision {decision_id} {'; it also '.join(parts)}") if parts else None


def execute_verdict(store: Store, verdict: Verdict, rail: Rail, *, resume: bool = False) -> list[GateOutcome]:
    """Apply ``verdict`` post-commit through ``rail``, compensating the decision's stored receipts.

    ALLOW and HUMAN_REVIEW are recorded and leave the action standing.
    ROLLBACK and BLOCK compensate every verified receipt of the decision once,
    the latest commit first (the saga rule); none is a
    ``compensation_unavailable`` outcome. A receipt compensated before (by any
    process) is an ``already_compensated`` outcome and is skipped, so a
    decision compensated in part is finished by calling this again. A receipt
    being compensated by another claimant right now is not done: it is
    reported as :class:`CompensationInProgress`. A receipt whose compensation
    fails (or is in progress elsewhere, or whose id two different commits
    share) does not stop the others: they are tried, then the first error is
    raised (its notes list what happened to every receipt).
    Spans are emitted through the configured pipeline, so call this inside
    :func:`otel_replay.configure` for the outcomes to land in the dataset.

    Raises:
        AlreadyCompensated: every receipt was compensated before this call.
        CompensationInProgress: another claimant is compensating a receipt right
            now (not done: run again once it finished).
        CompensationPending: an earlier attempt never finished; retry with ``resume=True``.
        GateError: two different commits returned the same receipt id (neither is compensated), or a
            sealed commit record of the decision cannot be trusted (signed with a key not given, edited), or
            a commit intent has no commit record (executed? unknown): neither is "no receipt", so after the
            trusted receipts were tried this names them.
        Exception: what the rail raised for a receipt (the others were tried first).

    """
    gate = ActionGate(rail, dataset=store.dataset)
    if verdict.fix in (FixAction.ALLOW, FixAction.HUMAN_REVIEW):
        return [gate.enforce_post_commit(verdict)]
    untrusted = _not_compensated(store, verdict.record_id)
    commits = reads.commits_for(store, verdict.record_id)
    if not commits:
        if untrusted is not None:  # a receipt this run cannot read, or an executed? unknown, is not "no receipt"
            raise untrusted
        return [gate.enforce_post_commit(verdict)]
    receipts, errors = _unique(commits, verdict.record_id)
    outcomes: list[GateOutcome] = []
    done_before: list[str] = []
    # what happened to each receipt, for the note on a raised error
    summary: list[str] = [f"receipt {rid}: {type(exc).__name__}: {exc}" for rid, exc in errors]
    for stored in reversed(receipts):
        rid = receipt_id_of(stored)
        receipt = _receipt(stored)
        done = reads.compensation_for(store, verdict.record_id, receipt_id=rid)
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
            except CompensationInProgress as exc:  # held elsewhere right now: not done until that claimant finishes
                errors.append((rid, exc))
                summary.append(f"receipt {rid}: in progress elsewhere: {exc}")
                continue
            except AlreadyCompensated as exc:  # its claim says done
                why = str(exc).removesuffix(_AGAIN)
            except Exception as exc:  # pending, or the rail raised: the other receipts are still tried
                errors.append((rid, exc))
                summary.append(f"receipt {rid}: {type(exc).__name__}: {exc}")
                continue
        done_before.append(why)
        summary.append(f"receipt {rid}: {ALREADY_COMPENSATED}")
        outcomes.append(GateOutcome(verdict.fix, ALREADY_COMPENSATED, why, receipt))
    if untrusted is not None:  # the trusted receipts were handled; the others still stand
        untrusted.add_note(f"otel-replay: the trusted receipts of the decision: {'; '.join(summary)}")
        raise untrusted
    if errors:
        rid, first = errors[0]
        first.add_note(
            f"otel-replay: compensating receipt {rid} of decision {verdict.record_id} failed; "
            f"every receipt of the decision: {'; '.join(summary)}"
        )
        raise first
    if done_before and len(done_before) == len(receipts):
        whys = "; ".join(done_before)
        raise AlreadyCompensated(f"decision {verdict.record_id} was already compensated: {whys}{_AGAIN}")
    return outcomes
