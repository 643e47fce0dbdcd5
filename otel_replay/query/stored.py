"""Trusted reads of stored records: only rows that pass the seal check act.

Functions over a store's :class:`~otel_replay.query.engine.Engine` and its
:class:`~otel_replay.integrity.SealCheck` (the rule rows must pass, see
:mod:`otel_replay.query.trust`): a decision rehydrated from its verified
row, verified outcomes, the decisions commit intents sealed, and the intents
no commit answers. The :class:`~otel_replay.query.store.Store` methods of
the same names call these. Rows as the seal check sees them
(:func:`otel_replay.integrity.stored_record`) are storage's too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from otel_replay import semconv as sc
from otel_replay._json import loads
from otel_replay.errors import ConfigError, DatasetError, PayloadError, RecordNotFound
from otel_replay.integrity import SealCheck, StoredRecord, stored_record
from otel_replay.query.engine import Engine
from otel_replay.query.trust import TrustedRecord, select_trusted, split_trusted
from otel_replay.records import Action, DecisionRecord, SpanRef, iso_time

__all__ = [
    "TIME_FIELDS",
    "attach_outcomes",
    "audit_entries",
    "causal_tree",
    "intent_decisions",
    "lost_decisions",
    "record",
    "record_rows",
    "row_body",
    "traces",
    "trusted_record",
    "unknown_commits_of",
    "verified_outcomes",
]

_log = logging.getLogger(__name__)
_JSON_FIELDS = ("inputs", "snapshot_state", "action_arguments", "models", "payload")
TIME_FIELDS = ("created_at", "end_time", "recorded_at")
"""The time fields of a chain row or an audit entry, shown as ISO-8601 UTC text."""
Verified = Callable[[Sequence[str]], dict[str, dict[str, Any]]]


def record_rows(engine: Engine, **filters: Any) -> list[StoredRecord]:
    """Every stored row of ``queries/record.sql`` matching ``filters`` as the seal check sees it (none trusted yet).

    ``record_id=`` and ``decision_ids=`` (a decision's outcomes) are narrowed by the side index;
    ``gate_decision_id=`` and ``gate_decision_ids=`` (in a gate record's JSON, which no side index holds) by the
    id keys of the files newer than it; other filters read every file.
    """
    if set(filters) == {"record_id"} and filters["record_id"] is not None:
        rows = engine.run_for("record", {"record_id": str(filters["record_id"])}, **filters)
    elif set(filters) == {"decision_ids"} and filters["decision_ids"]:
        # the outcomes of these decisions, wherever stored: the side index maps decision ids to files
        decided = [str(d) for d in filters["decision_ids"]]
        rows = engine.run_ids("record", {"outcome_decision_id": decided}, {"decision_ids": decided})
    elif set(filters) in ({"gate_decision_id"}, {"gate_decision_ids"}) and any(filters.values()):
        # a gate record's decision id is in its JSON: no side index holds it, the keys of newer files do
        value = next(iter(filters.values()))
        gated = [str(value)] if isinstance(value, str) else [str(d) for d in value]
        rows = engine.run_ids("record", {"gate_decision_id": gated}, filters)
    else:
        rows = engine.run("record", **filters)  # a gate's decision id lives in the JSON: not indexed
    return [stored_record(row) for row in rows]


def trusted_record(engine: Engine, check: SealCheck, record_id: str, *, what: str = "record") -> TrustedRecord:
    """The one verified row of ``record_id``.

    Raises:
        RecordNotFound: nothing claims the id.
        UntrustedRecord: rows claim it, none is sealed and verified.
        ConflictingRecords: verified rows claim it with different content.

    """
    rows = record_rows(engine, record_id=record_id)
    found = select_trusted(record_id, rows, check, where=str(engine.dataset), what=what)
    for problem in found.ignored:
        _log.warning("otel-replay: ignoring an untrusted row claiming %s", problem)
    return found


def record(engine: Engine, check: SealCheck, record_id: str) -> DecisionRecord:
    """Rehydrate the decision record ``record_id`` from its verified row."""
    found = trusted_record(engine, check, record_id, what="decision record")
    kind = found.attributes.get(sc.KIND)
    if kind != sc.KIND_DECISION:
        raise RecordNotFound(
            f"record {record_id!r} in {engine.dataset} is a{'n' if str(kind)[:1] in 'aeiou' else ''} "
            f"{kind} record, not a decision"
        )
    return DecisionRecord.from_attributes(found.attributes, found.span)


def verified_outcomes(engine: Engine, check: SealCheck, decision_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The verified outcome of each decision that has one (decision id -> outcome fields).

    Outcomes are immutable, so a decision with two verified outcomes (a
    dataset written without outcome claims) has none that can be trusted:
    its entry has ``outcome_id`` and ``outcome_correct`` ``None``, the
    outcome ids in ``conflicting`` and a ``note`` naming them and their
    files, and a warning is logged. The other decisions read as usual.
    """
    if not decision_ids:
        return {}
    rows = record_rows(engine, decision_ids=list(decision_ids))
    trusted, _ = split_trusted(rows, check)
    found: dict[str, dict[str, Any]] = {}
    for rec in trusted:
        attrs = rec.attributes
        if attrs.get(sc.KIND) != sc.KIND_OUTCOME:
            continue
        decision_id = str(attrs.get(sc.OUTCOME_DECISION_ID))
        outcome = {
            "outcome_id": rec.record_id,
            "decision_id": decision_id,
            "outcome_correct": attrs.get(sc.OUTCOME_CORRECT),
            "note": attrs.get(sc.OUTCOME_NOTE),
            "recorded_at": rec.start_ns,
            "file": rec.file,
        }
        earlier = found.get(decision_id)
        if earlier is None:
            found[decision_id] = outcome
        elif earlier["outcome_id"] != rec.record_id and rec.record_id not in earlier.get("conflicting", ()):
            found[decision_id] = _conflict(earlier, outcome)
    return found


def intent_decisions(engine: Engine, check: SealCheck, correlation_id: str) -> list[DecisionRecord]:
    """The decisions of ``correlation_id`` as their verified commit intents sealed them, oldest first.

    One per decision: its latest intent. A chain reads :func:`lost_decisions`
    instead (only those whose decision span is not stored).
    """
    rows = engine.run_for("record", {"correlation_id": correlation_id}, intent_correlation_id=correlation_id)
    return _intended(rows, check)


def lost_decisions(engine: Engine, check: SealCheck, key: str, value: str) -> list[DecisionRecord]:
    """The decisions sealed by verified commit intents of ``value`` that have no readable decision span under it.

    ``key``: the id column ``value`` is a value of (``correlation_id`` or
    ``session_id``). Oldest first, the latest intent of each decision.

    What a chain shows for a decision whose process died inside its
    ``audit()`` block after a commit (no decision span was stored); read by
    ``queries/lost_decisions.sql``, so the intents of stored decisions (one per
    gated decision) are never read, checked and parsed.
    """
    if key not in ("correlation_id", "session_id"):
        raise ValueError(f"lost decisions are found by correlation_id or session_id, not {key!r}")
    ids = {"correlation_id": None, "session_id": None, key: value}
    rows = engine.run_for("lost_decisions", {key: value}, **ids)
    return _intended(rows, check)


def _intended(rows: Sequence[Mapping[str, Any]], check: SealCheck) -> list[DecisionRecord]:
    """The decisions the verified commit intents among ``rows`` sealed (the latest intent of each), oldest first."""
    trusted, _ = split_trusted([stored_record(row) for row in rows], check)
    found: dict[str, DecisionRecord] = {}
    for rec in sorted(trusted, key=lambda r: (r.start_ns, r.record_id)):
        text = rec.attributes.get(sc.GATE_DECISION_RECORD)
        if rec.attributes.get(sc.GATE_EXECUTED) != sc.GATE_INTENT or text is None:
            continue
        data = loads(text, where=f"decision of intent record {rec.record_id}")
        decision_id = rec.attributes.get(sc.GATE_DECISION_ID)
        if not isinstance(data, dict) or data.get(sc.RECORD_ID) != decision_id:
            raise DatasetError(f"intent record {rec.record_id} holds another decision than {decision_id}")
        found[str(decision_id)] = DecisionRecord.from_attributes(data, SpanRef(rec.trace_id, rec.span_id, rec.start_ns))
    return list(found.values())


def unknown_commits_of(
    engine: Engine, check: SealCheck, decision_ids: Sequence[str]
) -> dict[str, list[tuple[str, Action]]]:
    """The commit intents no commit record answers of several decisions in one read: decision id -> those intents."""
    if not decision_ids:
        return {}
    rows = record_rows(engine, gate_decision_ids=[str(d) for d in decision_ids])
    trusted, refused = split_trusted(rows, check)
    for problem in refused:
        _log.warning("otel-replay: ignoring an untrusted gate row %s", problem)
    records = sorted(
        (r for r in trusted if r.attributes.get(sc.KIND) == sc.KIND_GATE), key=lambda r: (r.start_ns, r.record_id)
    )
    answered = {r.attributes.get(sc.GATE_INTENT_ID) for r in records}
    unknown: dict[str, list[tuple[str, Action]]] = {}
    for rec in records:
        attrs = rec.attributes
        if attrs.get(sc.GATE_EXECUTED) != sc.GATE_INTENT or rec.record_id in answered:
            continue
        data = loads(attrs.get(sc.GATE_ACTION), where=f"action of intent record {rec.record_id}") or {}
        try:
            action = Action(data["type"], data.get("arguments") or {}, data.get("cost"))
        except (KeyError, TypeError, ValueError) as exc:
            raise DatasetError(f"intent record {rec.record_id} stores an action that is not one: {exc}") from None
        found = unknown.setdefault(str(attrs.get(sc.GATE_DECISION_ID)), [])
        if all(r != rec.record_id for r, _ in found):
            found.append((rec.record_id, action))
    return unknown


def audit_entries(engine: Engine, correlation_id: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """Audit entries (all, or for one correlation id) in the order they were recorded.

    A payload whose stored text is not JSON (an unsealed entry a foreign client
    sent) is kept as that text, as in a chain (:func:`row_body`).
    """
    rows = engine.run("audit_entries", correlation_id=correlation_id, entry_limit=limit)
    for row in rows:
        try:
            row["payload"] = loads(row["payload"], where=f"payload of audit entry {row['entry_id']}") or {}
        except PayloadError:
            pass  # shown as stored
    return rows


def causal_tree(engine: Engine, check: SealCheck, record_id: str) -> list[dict[str, Any]]:
    """The decision span of ``record_id`` and every span below it, depth-first.

    A description, not an action: when one span claims the id it is used
    as stored (no key needed); when several do, only the verified one is.
    """
    rows = [r for r in record_rows(engine, record_id=record_id) if r.name == sc.SPAN_DECISION]
    if not rows:
        raise RecordNotFound(f"no decision record {record_id!r} in {engine.dataset}")
    places = {(r.trace_id, r.span_id) for r in rows}
    if len(places) == 1:
        trace_id, span_id = places.pop()
    else:
        span = record(engine, check, record_id).span
        trace_id, span_id = span.trace_id, span.span_id
    return engine.run("causal_tree", root_trace_id=trace_id, root_span_id=span_id)


def _conflict(earlier: dict[str, Any], outcome: dict[str, Any]) -> dict[str, Any]:
    """A decision's entry once a second verified outcome was found: no outcome, the conflict named."""
    ids = [*earlier.get("conflicting", [earlier["outcome_id"]]), outcome["outcome_id"]]
    files = [*earlier.get("files", [earlier["file"]]), outcome["file"]]
    where = ", ".join(f"{i} in {f}" for i, f in zip(ids, files, strict=True))
    note = f"conflicting outcomes: {where}; outcomes are immutable, so none is shown"
    _log.warning("otel-replay: decision %s has %d verified outcomes (%s)", outcome["decision_id"], len(ids), where)
    return {
        "outcome_id": None,
        "decision_id": outcome["decision_id"],
        "outcome_correct": None,
        "note": note,
        "recorded_at": None,
        "file": None,
        "conflicting": ids,
        "files": files,
    }


def row_body(row: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A chain or trace row's ``body`` JSON as a dict: its JSON fields parsed, its times ISO-8601 UTC.

    A JSON field whose stored text does not parse (a span no seal vouches for:
    any OTLP client may send one under a trade's id) is kept as that text: a
    chain describes what is stored, and one such row must not hide the rest.
    """
    body: dict[str, Any] = loads(row["body"], where=where)
    for key in _JSON_FIELDS:
        if isinstance(body.get(key), str):
            try:
                body[key] = loads(body[key], where=f"{where} field {key}")
            except PayloadError:
                pass  # shown as stored
    for key in TIME_FIELDS:
        if key in body:
            body[key] = iso_time(body[key])
    body["layer"] = row["layer"]
    return body


def attach_outcomes(traces: list[dict[str, Any]], verified_outcomes: Verified) -> bool:
    """Replace each trace's outcome fields with its verified outcome; False if none could be verified.

    ``verified_outcomes``: :meth:`~otel_replay.query.store.Store.verified_outcomes` of the store read.
    """
    try:
        verified = verified_outcomes([t["record_id"] for t in traces]) if traces else {}
        ok = True
    except ConfigError:  # no key to verify with: show no outcome rather than an unverified one
        verified, ok = {}, False
    for trace in traces:
        outcome = verified.get(trace["record_id"])
        trace["outcome_id"] = None if outcome is None else outcome["outcome_id"]
        trace["outcome_correct"] = None if outcome is None else outcome["outcome_correct"]
        trace["outcome_note"] = None if outcome is None else outcome["note"]
    return ok


def traces(
    engine: Engine,
    verified_outcomes: Verified,
    *,
    correlation_id: str | None = None,
    session_id: str | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Decisions from a dataset by correlation and/or session id, in time order, verified outcomes attached."""
    # Every row carries the id it was asked by, so the side index narrows the files; outcome fields are replaced
    # by verified ones below. With neither id, every file is read.
    key = "correlation_id" if correlation_id is not None else "session_id"
    rows = engine.run_for(
        "traces",
        {key: correlation_id if correlation_id is not None else session_id},
        correlation_id=correlation_id,
        session_id=session_id,
        trace_limit=limit,
    )
    found = [row_body(row, f"trace {row['record_id']}") for row in rows]
    attach_outcomes(found, verified_outcomes)
    return found
