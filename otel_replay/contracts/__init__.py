"""Contract governance: YAML tool and session contracts enforced on a model client before a tool runs.

``model`` holds what a contracts directory says; the loader reads and checks
it, the engine enforces it, ``govern()`` wraps a client with it, and the
backtest runs recorded sessions through it offline.
"""

from __future__ import annotations

from otel_replay.contracts.model import (
    ArgumentInvariant,
    CircuitBreaker,
    ContractSet,
    LoopDetection,
    OutputCondition,
    Phase,
    Precondition,
    Price,
    SessionContract,
    SessionLimits,
    Source,
    ToolContract,
    Transitions,
)

__all__ = [
    "ArgumentInvariant",
    "CircuitBreaker",
    "ContractSet",
    "LoopDetection",
    "OutputCondition",
    "Phase",
    "Precondition",
    "Price",
    "SessionContract",
    "SessionLimits",
    "Source",
    "ToolContract",
    "Transitions",
]
