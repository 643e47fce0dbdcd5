"""A worker process for the store race: each round, take the one allowed refund of a new session if it can."""

from __future__ import annotations

import threading
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from otel_replay.contracts.engine import Engine
from otel_replay.contracts.model import ContractSet, SessionContract, SessionLimits, Source, ToolContract
from otel_replay.contracts.state import SessionState
from otel_replay.contracts.store import FileStateStore

from ._engine_support import call

__all__ = ["hold_the_lock", "one_refund_contracts", "race"]


def one_refund_contracts() -> ContractSet:
    """One tool, ``refund``, allowed once per session."""
    session = SessionContract(
        source=Source("session.yaml", 1), session_limits=SessionLimits(max_calls_per_tool={"refund": 1})
    )
    tool = ToolContract(tool="refund", source=Source("refund.yaml", 1), side_effect="financial")
    return ContractSet(directory=Path("contracts"), session=session, tools={"refund": tool}, digest="race")


def race(path: str, rounds: int, barrier: Barrier, results: Any, worker: int) -> None:
    """For each round: wait for the other worker, then try the refund of session ``round-N``; report the outcome."""
    store = FileStateStore(path)
    engine = Engine(one_refund_contracts())
    won: list[int] = []
    for number in range(rounds):
        session_id = f"round-{number}"
        outcome: list[str] = []

        def take(
            state: SessionState | None, session_id: str = session_id, outcome: list[str] = outcome
        ) -> SessionState:
            current = state if state is not None else engine.new_state(session_id, None)
            decision = engine.evaluate(current, [call("refund", {"amount": 10})])
            engine.finalize(current, decision, model=None, usage=None)
            outcome[:] = [decision.outcome]
            return current

        barrier.wait()
        store.update(session_id, take)
        if outcome == ["allow"]:
            won.append(number)
    store.close()
    results.put((worker, won))


def hold_the_lock(path: str, session_id: str, holding: Any) -> None:
    """Start an update of ``session_id``, signal ``holding`` from inside it, then hang until killed."""
    store = FileStateStore(path)

    def change(state: SessionState | None) -> SessionState:
        assert state is not None
        state.total_tool_calls = 999  # never saved: the process dies first
        holding.set()
        threading.Event().wait()  # hang, holding the write lock, until the parent kills this process
        return state

    store.update(session_id, change)
