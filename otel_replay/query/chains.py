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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from otel_replay._display import html_of
from otel_replay.errors import OtelReplayError
from otel_replay.query.chain_types import CHAIN_TYPES, DEFAULT_LIMITS, REGISTRY
from otel_replay.query.store import Store
from otel_replay.query.stored import TIME_FIELDS, attach_outcomes, lost_decisions, row_body
from otel_replay.records import iso_time, trace_body

if TYPE_CHECKING:  # in-process sources, handed in by their owner: a chain over a dataset never loads capture
    from otel_replay.capture.audit_log import AuditLog
    from otel_replay.capture.tracer import DecisionTracer

__all__ = ["CHAIN_TYPES", "DEFAULT_LIMITS", "ReplayBuilder", "ReplayChain"]


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

    def _repr_html_(self) -> str:
        """The chain's report page in a sandboxed frame (a notebook shows it; see :mod:`otel_replay.report`)."""
        return html_of(self)

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


def _with_lost_decisions(store: Store, key: str, chain_id: str, traces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``traces`` plus each decision of ``chain_id`` (a value of ``key``) stored only in a commit intent, in time order.

    A process that died inside its ``audit()`` block after ``gate.commit()``
    left no decision span; the intent sealed the decision as it was acted on.
    Such a trace has ``from_intent`` True (and no ``record_hash``: the
    intent's seal covers it). An intent is filed under the ids in scope at
    the commit, which may be other than its decision's: a decision with an id
    of ``key`` joins only the chain of that id (where its span would be); one
    without joins the chain it was committed in.
    """
    shown = {t["record_id"] for t in traces}
    lost = [
        trace_body(record)
        for record in lost_decisions(store.engine, store.seal_check, key, chain_id)
        if record.record_id not in shown and getattr(record, key) in (chain_id, None)
    ]
    if not lost:
        return traces
    for body in lost:
        body["from_intent"] = True
    return sorted([*traces, *lost], key=lambda t: (t.get("created_at") or "", t["record_id"]))


def _audit_body(entry: Mapping[str, Any]) -> dict[str, Any]:
    body = dict(entry)
    for key in TIME_FIELDS:
        if key in body:
            body[key] = iso_time(body[key])
    body["layer"] = "audit"
    return body


def _event_key(event: Mapping[str, Any]) -> tuple[str, str, str]:
    ident = event.get("record_id") or event.get("entry_id") or ""
    return (event.get("created_at") or "", event["layer"], ident)


_MAX_SQL_LIMIT = 2**63 - 1
"""The largest LIMIT DuckDB takes (BIGINT)."""


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
        if not isinstance(chain_id, str):
            # Ids are text: compared as a number, 42 would equal the ids "042", "42.0" and " 42" of other trades.
            raise OtelReplayError(f"a chain id is text (str), got {type(chain_id).__name__} {chain_id!r}")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
            raise OtelReplayError(f"chain limit must be a positive integer, got {limit!r}")
        kind = REGISTRY[chain_type]
        cap = kind.default_limit if limit is None else limit
        layers = kind.layers
        if self.store is not None:
            with self.store.engine.one_listing():  # the chain's lookups list the dataset once between them
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
        asked = min(cap + 1, _MAX_SQL_LIMIT)  # a cap past SQL's BIGINT asks for every row: none can be cut
        rows = self.store.run_for(kind.query, {kind.key: chain_id}, chain_id=chain_id, chain_limit=asked)
        traces: list[dict[str, Any]] = []
        audits: list[dict[str, Any]] = []
        for row in rows:
            body = row_body(row, f"{chain_type} chain {chain_id} row {row['record_id']}")
            (traces if row["layer"] == "trace" else audits).append(body)
        if kind.finds_lost_decisions:
            traces = _with_lost_decisions(self.store, kind.key, chain_id, traces)
        verified = attach_outcomes(traces[:cap], self.store.verified_outcomes)
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
