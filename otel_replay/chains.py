"""Replay chains: the causal story of a trade, session, directive or incident.

Each chain type is one SQL file in ``queries/chains/``; :class:`ReplayBuilder`
runs it and splits the rows into decisions ("traces", seed 002's word for
reasoning traces) and audit entries, plus one merged timeline (``events``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from otel_replay.errors import OtelReplayError
from otel_replay.store import Store

__all__ = ["CHAIN_TYPES", "ReplayBuilder", "ReplayChain"]

CHAIN_TYPES = ("trade", "session", "directive", "incident")
_JSON_FIELDS = ("inputs", "snapshot_state", "action_arguments", "models", "payload")


@dataclass
class ReplayChain:
    """A reconstructed causal chain."""

    chain_type: str
    chain_id: str
    events: list[dict[str, Any]] = field(default_factory=list)
    traces: list[dict[str, Any]] = field(default_factory=list)
    audit_entries: list[dict[str, Any]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """True when nothing was recorded under this id."""
        return not self.events


def _body(text: str, layer: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(text)
    for key in _JSON_FIELDS:
        if isinstance(body.get(key), str):
            body[key] = json.loads(body[key])
    body["layer"] = layer
    return body


class ReplayBuilder:
    """Builds replay chains from the dataset's decisions and audit entries."""

    def __init__(self, store: Store) -> None:
        """Build chains over ``store``."""
        self.store = store

    def build(self, chain_type: str, chain_id: str, limit: int | None = None) -> ReplayChain:
        """Build a chain of ``chain_type`` (one of :data:`CHAIN_TYPES`)."""
        if chain_type not in CHAIN_TYPES:
            raise OtelReplayError(f"unknown chain type {chain_type!r}; expected one of {', '.join(CHAIN_TYPES)}")
        if limit is not None and limit <= 0:
            raise OtelReplayError(f"chain limit must be positive, got {limit}")
        rows = self.store.run(f"chains/{chain_type}", chain_id=chain_id, chain_limit=limit)
        chain = ReplayChain(chain_type, chain_id)
        for row in rows:
            body = _body(row["body"], row["layer"])
            chain.events.append(body)
            (chain.traces if row["layer"] == "trace" else chain.audit_entries).append(body)
        return chain

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
