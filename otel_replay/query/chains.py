"""Replay chains: the causal story of a trade, session, directive or incident.

A chain merges two layers of one event: reasoning traces (decisions, with the
outcome each turned out to have) and audit entries (inter-agent messages,
sorted by their writers' ``created_at``). :class:`ReplayBuilder` builds chains
either from a dataset (each chain type is one entry in
:data:`~otel_replay.query.chain_types.REGISTRY` and one SQL file in ``queries/chains/``)
or from in-process objects (a :class:`~otel_replay.DecisionTracer` and an
:class:`~otel_replay.AuditLog`), with the same fields and order either way.

Each layer is capped (100 rows for trade and session chains, 500 for directive
and incident chains, or ``limit``); a chain that hit the cap says so in
:attr:`ReplayChain.truncated_layers` instead of silently ending early. Outcome
fields come only from verified outcome records (see :mod:`otel_replay.query.trust`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from otel_replay._json import loads
from otel_replay.errors import ConfigError, OtelReplayError
from otel_replay.query.chain_types import CHAIN_TYPES, DEFAULT_LIMITS, REGISTRY
from otel_replay.query.store import Store

if TYPE_CHECKING:
    from otel_replay.capture.audit_log import AuditLog
    from otel_replay.capture.tracer import DecisionTracer
    from otel_replay.records import DecisionRecord, OutcomeRecord

__all__ = ["CHAIN_TYPES", "DEFAULT_LIMITS", "ReplayBuilder", "ReplayChain", "stored_traces", "trace_body"]

_JSON_FIELDS = ("inputs", "snapshot_state", "action_arguments", "models", "payload")
_TIME_FIELDS = ("created_at", "end_time", "recorded_at")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DUCKDB_TIME = re.compile(r"^(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d(?::?\d\d)?)?$")


@dataclass
class ReplayChain:
    """A reconstructed causal chain.

    ``events`` is the merged timeline; ``traces`` and ``audit_entries`` are its
    two layers. ``limit`` is the cap each layer was built with, and
    ``truncated_layers`` names the layers ("trace", "audit") that had more rows
    than the cap (the newest ones are left out). ``outcomes_verified`` is False
    when no verification key was available, so outcome fields are left empty.
    """

    chain_type: str
    chain_id: str
    events: list[dict[str, Any]] = field(default_factory=list)
    traces: list[dict[str, Any]] = field(default_factory=list)
    audit_entries: list[dict[str, Any]] = field(default_factory=list)
    limit: int = 0
    truncated_layers: tuple[str, ...] = ()
    outcomes_verified: bool = True

    @property
    def empty(self) -> bool:
        """True when nothing was recorded under this id."""
        return not self.events

    @property
    def truncated(self) -> bool:
        """True when a layer had more rows than :attr:`limit`."""
        return bool(self.truncated_layers)

    def to_json(self) -> dict[str, Any]:
        """The chain as a JSON-ready dict (what ``otel-replay chain --json`` prints)."""
        return {
            "chain_type": self.chain_type,
            "chain_id": self.chain_id,
            "limit": self.limit,
            "truncated": self.truncated,
            "truncated_layers": list(self.truncated_layers),
            "outcomes_verified": self.outcomes_verified,
            "traces": self.traces,
            "audit_entries": self.audit_entries,
        }


def iso_time(value: Any) -> str | None:
    """A stored or in-process time as ISO-8601 UTC text with microseconds (``None`` stays ``None``).

    Accepts datetimes, nanoseconds since the epoch, and DuckDB's timestamp text
    (``2026-03-02 14:30:01.123456789+00``), so both chain sources print alike.
    """
    if value is None:
        return None
    if isinstance(value, int):
        moment = _EPOCH + timedelta(microseconds=value // 1000)
    elif isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=UTC)
    else:
        match = _DUCKDB_TIME.match(str(value))
        if match is None:
            return str(value)
        day, clock, fraction, offset = match.groups()
        offset = "+00:00" if offset in (None, "Z") else offset
        if len(offset) == 3:
            offset += ":00"
        elif ":" not in offset:
            offset = f"{offset[:3]}:{offset[3:]}"
        moment = datetime.fromisoformat(f"{day}T{clock}.{(fraction or '0')[:6].ljust(6, '0')}{offset}")
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def _body(row: Mapping[str, Any], where: str) -> dict[str, Any]:
    body: dict[str, Any] = loads(row["body"], where=where)
    for key in _JSON_FIELDS:
        if isinstance(body.get(key), str):
            body[key] = loads(body[key], where=f"{where} field {key}")
    for key in _TIME_FIELDS:
        if key in body:
            body[key] = iso_time(body[key])
    body["layer"] = row["layer"]
    return body


def trace_body(record: DecisionRecord, outcome: OutcomeRecord | None = None) -> dict[str, Any]:
    """An in-process decision as a chain trace, with the fields the ``decisions`` view gives."""
    snapshot, action = record.snapshot, record.action
    return {
        "record_id": record.record_id,
        "source": record.source,
        "decision_type": record.decision_type,
        "agent_id": record.agent_id,
        "session_id": record.session_id,
        "correlation_id": record.correlation_id,
        "rationale": record.rationale,
        "confidence": record.confidence,
        "inputs": dict(record.inputs) or None,
        "snapshot_state": None if snapshot is None else loads(snapshot.state_json),
        "snapshot_version": None if snapshot is None else snapshot.version,
        "snapshot_captured_at": None if snapshot is None else snapshot.captured_at,
        "action_type": None if action is None else action.type,
        "action_arguments": None if action is None else loads(action.arguments_json),
        "action_cost": None if action is None or action.cost is None else float(action.cost),
        "models": [m.to_json() for m in record.models] or None,
        "error": record.error,
        "record_hash": None if record.seal is None else record.seal.hash,
        "created_at": iso_time(record.span.start_ns),
        "trace_id": record.span.trace_id,
        "span_id": record.span.span_id,
        "outcome_id": None if outcome is None else outcome.record_id,
        "outcome_correct": None if outcome is None else outcome.outcome_correct,
        "outcome_note": None if outcome is None else outcome.note,
        "layer": "trace",
    }


def _with_lost_decisions(store: Store, correlation_id: str, traces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``traces`` plus each decision of ``correlation_id`` stored only in a commit intent, in time order.

    A process that died inside its ``audit()`` block after ``gate.commit()``
    left no decision span; the intent sealed the decision as it was acted on.
    Such a trace has ``from_intent`` True (and no ``record_hash``: the
    intent's seal covers it).
    """
    shown = {t["record_id"] for t in traces}
    lost = [trace_body(record) for record in store.intent_decisions(correlation_id) if record.record_id not in shown]
    if not lost:
        return traces
    for body in lost:
        body["from_intent"] = True
    return sorted([*traces, *lost], key=lambda t: (t.get("created_at") or "", t["record_id"]))


def _audit_body(entry: Mapping[str, Any]) -> dict[str, Any]:
    body = dict(entry)
    for key in _TIME_FIELDS:
        if key in body:
            body[key] = iso_time(body[key])
    body["layer"] = "audit"
    return body


def _attach_verified_outcomes(store: Store, traces: list[dict[str, Any]]) -> bool:
    """Replace each trace's outcome fields with its verified outcome; False if none could be verified."""
    try:
        verified = store.verified_outcomes([t["record_id"] for t in traces]) if traces else {}
        ok = True
    except ConfigError:  # no key to verify with: show no outcome rather than an unverified one
        verified, ok = {}, False
    for trace in traces:
        outcome = verified.get(trace["record_id"])
        trace["outcome_id"] = None if outcome is None else outcome["outcome_id"]
        trace["outcome_correct"] = None if outcome is None else outcome["outcome_correct"]
        trace["outcome_note"] = None if outcome is None else outcome["note"]
    return ok


def stored_traces(
    store: Store, *, correlation_id: str | None = None, session_id: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    """Decisions from a dataset by correlation and/or session id, in time order, verified outcomes attached."""
    # Every row carries the id it was asked by, so the side index narrows the files; outcome fields are replaced
    # by verified ones below. With neither id, every file is read.
    key = "correlation_id" if correlation_id is not None else "session_id"
    rows = store.run_for(
        "traces",
        {key: correlation_id if correlation_id is not None else session_id},
        correlation_id=correlation_id,
        session_id=session_id,
        trace_limit=limit,
    )
    traces = [_body(row, f"trace {row['record_id']}") for row in rows]
    _attach_verified_outcomes(store, traces)
    return traces


def _event_key(event: Mapping[str, Any]) -> tuple[str, str, str]:
    ident = event.get("record_id") or event.get("entry_id") or ""
    return (event.get("created_at") or "", event["layer"], ident)


def _cap(rows: Sequence[dict[str, Any]], limit: int) -> tuple[list[dict[str, Any]], bool]:
    return list(rows[:limit]), len(rows) > limit


class ReplayBuilder:
    """Builds replay chains from a dataset or from in-process objects.

    ``ReplayBuilder(store)`` reads the dataset through the SQL in
    ``queries/chains/``. ``ReplayBuilder(tracer, audit_log)`` (seed 002's form)
    reads what the tracer and the audit log hold: their store when they were
    given one, else this process's newest records.
    """

    def __init__(self, source: Store | DecisionTracer, audit_log: AuditLog | None = None) -> None:
        """Build chains over a :class:`Store`, or over a tracer and an audit log."""
        self.store: Store | None = source if isinstance(source, Store) else None
        self.tracer: DecisionTracer | None = None if self.store is not None else source  # type: ignore[assignment]
        self.audit_log = audit_log

    def build(self, chain_type: str, chain_id: str, limit: int | None = None) -> ReplayChain:
        """Build a chain of ``chain_type`` (one of :data:`CHAIN_TYPES`), each layer capped at ``limit``."""
        if chain_type not in CHAIN_TYPES:
            raise OtelReplayError(f"unknown chain type {chain_type!r}; expected one of {', '.join(CHAIN_TYPES)}")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
            raise OtelReplayError(f"chain limit must be a positive integer, got {limit!r}")
        kind = REGISTRY[chain_type]
        cap = kind.default_limit if limit is None else limit
        layers = kind.layers
        if self.store is not None:
            traces, audits, verified = self._from_store(chain_type, chain_id, cap)
        else:
            traces, audits, verified = self._in_process(chain_type, chain_id, cap, layers)
        traces, more_traces = _cap(traces, cap)
        audits, more_audits = _cap(audits, cap)
        truncated = tuple(
            layer for layer, more in (("audit", more_audits), ("trace", more_traces)) if more and layer in layers
        )
        chain = ReplayChain(chain_type, chain_id, limit=cap, truncated_layers=truncated, outcomes_verified=verified)
        chain.traces, chain.audit_entries = traces, audits
        chain.events = sorted([*audits, *traces], key=_event_key)
        return chain

    def _from_store(
        self, chain_type: str, chain_id: str, cap: int
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
        assert self.store is not None
        # One row past the cap tells a full layer from a truncated one. Every row of a chain carries its id, so
        # only the files the side index names for it are read; outcome fields come from verified_outcomes below.
        kind = REGISTRY[chain_type]
        rows = self.store.run_for(kind.query, {kind.key: chain_id}, chain_id=chain_id, chain_limit=cap + 1)
        traces: list[dict[str, Any]] = []
        audits: list[dict[str, Any]] = []
        for row in rows:
            body = _body(row, f"{chain_type} chain {chain_id} row {row['record_id']}")
            (traces if row["layer"] == "trace" else audits).append(body)
        if kind.finds_lost_decisions:
            traces = _with_lost_decisions(self.store, chain_id, traces)
        verified = _attach_verified_outcomes(self.store, traces[:cap])
        unknown = self.store.unknown_commits_of([t["record_id"] for t in traces[:cap]])
        for trace in traces:
            trace["unknown_commits"] = [intent_id for intent_id, _ in unknown.get(trace["record_id"], [])]
            trace.setdefault("from_intent", False)
        return traces, audits, verified

    def _in_process(
        self, chain_type: str, chain_id: str, cap: int, layers: Iterable[str]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
        traces: list[dict[str, Any]] = []
        audits: list[dict[str, Any]] = []
        if "trace" in layers:
            if self.tracer is None:
                raise OtelReplayError(f"a {chain_type} chain needs a DecisionTracer")
            by = {REGISTRY[chain_type].key: chain_id}
            traces = self.tracer.query_traces(**by, limit=cap + 1)
            for trace in traces:
                trace.setdefault("unknown_commits", [])  # no gate in process: the fields a dataset's chain has
                trace.setdefault("from_intent", False)
        if "audit" in layers:
            if self.audit_log is None:
                raise OtelReplayError(f"a {chain_type} chain needs an AuditLog")
            entries = [_audit_body(e) for e in self.audit_log.query(correlation_id=chain_id, limit=None)]
            audits = sorted(entries, key=lambda e: (e["created_at"] or "", e["entry_id"]))[: cap + 1]
        return traces, audits, True

    def build_trade_chain(self, correlation_id: str, limit: int = 100) -> ReplayChain:
        """Audit entries (by ``created_at``) and decisions sharing a trade's correlation id."""
        return self.build("trade", correlation_id, limit)

    def build_session_chain(self, session_id: str, limit: int = 100) -> ReplayChain:
        """Every decision of one session; no audit entries."""
        return self.build("session", session_id, limit)

    def build_directive_chain(self, directive_id: str, limit: int = 500) -> ReplayChain:
        """A directive's audit entries and decisions (up to 500 each)."""
        return self.build("directive", directive_id, limit)

    def build_incident_chain(self, incident_id: str, limit: int = 500) -> ReplayChain:
        """The cross-agent audit timeline of an incident (up to 500 entries)."""
        return self.build("incident", incident_id, limit)
