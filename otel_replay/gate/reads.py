"""The gate's reads of a dataset's stored commits: receipts, committed actions, intents, compensations.

Functions over an open :class:`~otel_replay.query.store.Store` (the read side
knows nothing of the gate): each reads the dataset's gate records and uses
only those that pass the store's seal check (:mod:`otel_replay.query.trust`).
:mod:`otel_replay.gate.execute` acts on what they return.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from otel_replay import semconv as sc
from otel_replay._json import loads
from otel_replay.errors import DatasetError
from otel_replay.gate.receipts import receipt_id_of
from otel_replay.integrity import StoredRecord, VerifyProblem
from otel_replay.query.store import Store
from otel_replay.query.trust import split_trusted
from otel_replay.records import Action, DecisionRecord, SpanRef

__all__ = [
    "commits_for",
    "committed_actions_for",
    "compensation_for",
    "intent_decision",
    "receipt_for",
    "receipts_for",
    "refused_commits_for",
]

_log = logging.getLogger(__name__)


def _gate_records(store: Store, decision_id: str, rows: Sequence[StoredRecord] | None = None) -> list[StoredRecord]:
    """The verified gate records of ``decision_id``, oldest first (untrusted ones are logged and left out).

    ``rows``: the decision's gate rows as :meth:`Store.record_rows` returned them, when the caller has read them.
    """
    if rows is None:
        rows = store.record_rows(gate_decision_id=decision_id)
    trusted, refused = split_trusted(rows, store.seal_check)
    for problem in refused:
        _log.warning("otel-replay: ignoring an untrusted gate row %s", problem)
    trusted = [r for r in trusted if r.attributes.get(sc.KIND) == sc.KIND_GATE]
    return sorted(trusted, key=lambda r: (r.start_ns, r.record_id))


def receipts_for(store: Store, decision_id: str) -> list[Any]:
    """The receipts of every verified commit of ``decision_id``'s action, in commit order.

    Each as stored (:func:`otel_replay.gate.receipts.stored_receipt`): a dict for a
    :class:`~otel_replay.gate.rails.Receipt`, whatever JSON a rail's own receipt was.
    A commit row stored twice gives its receipt twice.
    """
    return [receipt for _, receipt in commits_for(store, decision_id)]


def commits_for(
    store: Store, decision_id: str, *, rows: Sequence[StoredRecord] | None = None
) -> list[tuple[str, Any]]:
    """:func:`receipts_for` with the id of the commit gate record each receipt comes from.

    A commit row stored twice (a retried export, a copied file) gives one
    gate record id twice; two commits give two. ``rows``: as for
    :func:`committed_actions_for`.
    """
    commits = []
    for rec in _gate_records(store, decision_id, rows):
        attrs = rec.attributes
        if attrs.get(sc.GATE_STAGE) == "commit" and attrs.get(sc.GATE_RECEIPT) is not None:
            receipt = loads(attrs[sc.GATE_RECEIPT], where=f"receipt of gate record {rec.record_id}")
            if receipt is not None:
                commits.append((rec.record_id, receipt))
    return commits


def refused_commits_for(
    store: Store, decision_id: str, *, intents: bool = False, rows: Sequence[StoredRecord] | None = None
) -> list[VerifyProblem]:
    """The sealed commit gate rows of ``decision_id`` this store cannot trust, and why.

    A commit signed with a key not given (a payment service's own key, a
    key rotated since) or edited claims a receipt that :func:`commits_for`
    leaves out: a caller about to compensate must not take its absence for
    "nothing was charged". With ``intents``, commit intents too that no
    other sealed row answers (an answered intent is its commit's row): one
    this store cannot trust may have been executed, and its action was not
    judged. Not listed: an unsealed row (otel-replay seals every commit it
    writes, so it can only be forged; ``verify`` names it) and a refused
    copy of a record whose original is trusted. ``rows``: as for
    :func:`committed_actions_for`.
    """
    rows = [
        r
        for r in (store.record_rows(gate_decision_id=decision_id) if rows is None else rows)
        if r.attributes.get(sc.KIND) == sc.KIND_GATE
        and r.attributes.get(sc.GATE_STAGE) == "commit"
        and (intents or r.attributes.get(sc.GATE_EXECUTED) != sc.GATE_INTENT)  # an intent claims no receipt
        and r.attributes.get(sc.RECORD_HASH) is not None
    ]
    answered = {r.attributes.get(sc.GATE_INTENT_ID) for r in rows} - {None}
    rows = [r for r in rows if r.attributes.get(sc.GATE_EXECUTED) != sc.GATE_INTENT or r.record_id not in answered]
    trusted, refused = split_trusted(rows, store.seal_check)
    kept = {r.record_id for r in trusted}
    return [problem for problem in refused if problem.record_id not in kept]


def committed_actions_for(
    store: Store, decision_id: str, *, rows: Sequence[StoredRecord] | None = None
) -> list[tuple[str, Action]]:
    """The action each verified commit of ``decision_id`` stored, with its gate record id, in commit order.

    What was committed, which may differ from the decision's audited
    action (:func:`otel_replay.gate.execute.replay_stored` judges both). A
    commit recorded before gate records stored their action is left out.
    ``rows``: the decision's gate rows (``store.record_rows(gate_decision_id=...)``)
    when the caller has read them already, so several reads share one query.
    """
    actions: dict[str, Action] = {}
    for rec in _gate_records(store, decision_id, rows):
        attrs = rec.attributes
        text = attrs.get(sc.GATE_ACTION)
        if attrs.get(sc.GATE_STAGE) != "commit" or attrs.get(sc.GATE_EXECUTED) != "committed" or text is None:
            continue
        data = loads(text, where=f"action of gate record {rec.record_id}")
        try:
            actions[rec.record_id] = Action(data["type"], data.get("arguments") or {}, data.get("cost"))
        except (KeyError, TypeError, ValueError) as exc:
            raise DatasetError(f"gate record {rec.record_id} stores an action that is not one: {exc}") from None
    return list(actions.items())


def intent_decision(store: Store, decision_id: str) -> DecisionRecord | None:
    """Decision ``decision_id`` as a verified commit intent sealed it before the rail ran, or ``None``.

    A process that dies inside its ``audit()`` block after
    ``gate.commit()`` leaves no decision span; the gate's intent record
    holds the decision as it stood (snapshot, reads, model calls, action)
    under the intent's own seal. The latest such intent is returned, at
    the intent's span, without a seal of its own (``record.seal`` is ``None``).
    """
    found = None
    for rec in _gate_records(store, decision_id):
        attrs = rec.attributes
        text = attrs.get(sc.GATE_DECISION_RECORD)
        if attrs.get(sc.GATE_EXECUTED) != sc.GATE_INTENT or text is None:
            continue
        data = loads(text, where=f"decision of intent record {rec.record_id}")
        if not isinstance(data, dict) or data.get(sc.RECORD_ID) != decision_id:
            raise DatasetError(f"intent record {rec.record_id} holds another decision than {decision_id}")
        found = DecisionRecord.from_attributes(data, SpanRef(rec.trace_id, rec.span_id, rec.start_ns))
    return found


def receipt_for(store: Store, decision_id: str) -> Any:
    """The receipt of the latest verified commit of ``decision_id``'s action, or ``None``."""
    receipts = receipts_for(store, decision_id)
    return receipts[-1] if receipts else None


def compensation_for(
    store: Store,
    decision_id: str,
    *,
    receipt_id: str | None = None,
    rows: Sequence[StoredRecord] | None = None,
) -> dict[str, Any] | None:
    """The verified gate record that already compensated ``decision_id``'s action (that receipt), or ``None``.

    ``rows``: as for :func:`committed_actions_for`.
    """
    for rec in _gate_records(store, decision_id, rows):
        attrs = rec.attributes
        compensated = attrs.get(sc.GATE_EXECUTED) in ("rolled_back", "reversed")
        if attrs.get(sc.GATE_STAGE) != "post_commit" or not compensated:
            continue
        if receipt_id is not None:
            stored = loads(attrs.get(sc.GATE_RECEIPT), where=f"receipt of gate record {rec.record_id}")
            if stored is None or receipt_id_of(stored) != receipt_id:
                continue
        return {
            "executed": attrs[sc.GATE_EXECUTED],
            "recorded_at": rec.start_ns,
            "detail": attrs.get(sc.GATE_DETAIL),
            "gate_id": rec.record_id,
        }
    return None
