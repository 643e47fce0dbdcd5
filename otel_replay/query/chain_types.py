"""The chain types a :class:`~otel_replay.query.chains.ReplayBuilder` builds: one entry each, one SQL file each.

A chain type names the layers it merges (``audit`` entries, ``trace``
decisions), the indexed id column its id is (what narrows the files read),
and the rows per layer when no limit is given. Its dataset form is
``queries/chains/<name>.sql``, which returns one row per event with the
columns ``layer``, ``record_id`` and ``body`` (a JSON object), oldest first;
a new chain type is one entry in :data:`REGISTRY` and that one file.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CHAIN_TYPES", "DEFAULT_LIMITS", "REGISTRY", "ChainType"]


@dataclass(frozen=True)
class ChainType:
    """One kind of replay chain: its name, layers, id column and default cap."""

    name: str
    layers: tuple[str, ...]
    """Which layers the chain shows: ``"audit"``, ``"trace"`` or both."""
    key: str
    """The indexed column the chain's id is a value of (``correlation_id`` or ``session_id``)."""
    default_limit: int
    """Rows per layer when no limit is given."""

    @property
    def query(self) -> str:
        """The shipped query that builds it from a dataset (``queries/chains/<name>.sql``)."""
        return f"chains/{self.name}"

    @property
    def finds_lost_decisions(self) -> bool:
        """Whether decisions stored only in a commit intent (filed under the chain's id) join its trace layer."""
        return "trace" in self.layers and self.key in ("correlation_id", "session_id")


REGISTRY: dict[str, ChainType] = {
    chain.name: chain
    for chain in (
        ChainType("trade", ("audit", "trace"), "correlation_id", 100),
        ChainType("session", ("trace",), "session_id", 100),
        ChainType("directive", ("audit", "trace"), "correlation_id", 500),
        ChainType("incident", ("audit",), "correlation_id", 500),
    )
}
"""Every chain type by name."""

CHAIN_TYPES = tuple(REGISTRY)
"""The names of the chain types."""
DEFAULT_LIMITS = {name: chain.default_limit for name, chain in REGISTRY.items()}
"""Rows per layer when no limit is given, by chain type."""
