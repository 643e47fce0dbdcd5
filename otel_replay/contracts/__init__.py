"""Contract governance: YAML tool and session contracts enforced on a model client before a tool runs.

``model`` holds what a contracts directory says; the loader reads and checks
it, the engine enforces it, ``govern()`` wraps a client with it, and the
backtest runs recorded sessions through it offline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from otel_replay import _lazy

if TYPE_CHECKING:  # what the names below resolve to on first use, for type checkers
    from otel_replay.contracts.backtest import BacktestReport, backtest, backtest_dataset
    from otel_replay.contracts.decisions import CallVerdict, Decision, Failure, Narrowing, ToolCallView
    from otel_replay.contracts.engine import Engine
    from otel_replay.contracts.infer import Draft, infer_contracts, write_draft
    from otel_replay.contracts.loader import load_contracts, validate_file
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
    from otel_replay.contracts.session import GovernedSession, govern
    from otel_replay.contracts.state import SessionState
    from otel_replay.contracts.store import FileStateStore, MemoryStateStore, StateStore
    from otel_replay.contracts.tools import ToolRun

__all__ = [
    "ArgumentInvariant",
    "BacktestReport",
    "CallVerdict",
    "CircuitBreaker",
    "ContractSet",
    "Decision",
    "Draft",
    "Engine",
    "Failure",
    "FileStateStore",
    "GovernedSession",
    "LoopDetection",
    "MemoryStateStore",
    "Narrowing",
    "OutputCondition",
    "Phase",
    "Precondition",
    "Price",
    "SessionContract",
    "SessionLimits",
    "SessionState",
    "Source",
    "StateStore",
    "ToolCallView",
    "ToolContract",
    "ToolRun",
    "Transitions",
    "backtest",
    "backtest_dataset",
    "govern",
    "infer_contracts",
    "load_contracts",
    "validate_file",
    "write_draft",
]

_LAZY = {
    "ArgumentInvariant": ".model",
    "backtest": ".backtest",
    "backtest_dataset": ".backtest",
    "BacktestReport": ".backtest",
    "CallVerdict": ".decisions",
    "CircuitBreaker": ".model",
    "ContractSet": ".model",
    "Decision": ".decisions",
    "Draft": ".infer",
    "Engine": ".engine",
    "Failure": ".decisions",
    "FileStateStore": ".store",
    "govern": ".session",
    "GovernedSession": ".session",
    "infer_contracts": ".infer",
    "load_contracts": ".loader",
    "LoopDetection": ".model",
    "MemoryStateStore": ".store",
    "Narrowing": ".decisions",
    "OutputCondition": ".model",
    "Phase": ".model",
    "Precondition": ".model",
    "Price": ".model",
    "SessionContract": ".model",
    "SessionLimits": ".model",
    "SessionState": ".state",
    "Source": ".model",
    "StateStore": ".store",
    "ToolCallView": ".decisions",
    "ToolContract": ".model",
    "ToolRun": ".tools",
    "Transitions": ".model",
    "validate_file": ".loader",
    "write_draft": ".infer",
}
"""Public names imported on first use: name -> module."""

__getattr__, __dir__ = _lazy.exports(__name__, _LAZY, submodules=True)
