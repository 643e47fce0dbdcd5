"""The action side: the gate over a rail, its receipts and compensation claims, and execution of a verdict.

:mod:`~otel_replay.gate.policy` judges a decision against today's state
(:func:`replay`); :mod:`~otel_replay.gate.gate` routes the verdict to a
:class:`Rail` (:class:`ActionGate`); :mod:`~otel_replay.gate.execute`
replays a stored decision and compensates its stored receipts, read by
:mod:`~otel_replay.gate.reads`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from otel_replay import _lazy

if TYPE_CHECKING:  # what the names below resolve to on first use, for type checkers
    from otel_replay.gate.execute import execute_verdict, judge_stored, replay_stored
    from otel_replay.gate.gate import ALREADY_COMPENSATED, ActionGate, GateOutcome
    from otel_replay.gate.policy import FixAction, Policy, Verdict, load_callable, load_policy, replay
    from otel_replay.gate.rails import Rail, Receipt, ReferenceLedger

__all__ = [
    "ALREADY_COMPENSATED",
    "ActionGate",
    "FixAction",
    "GateOutcome",
    "Policy",
    "Rail",
    "Receipt",
    "ReferenceLedger",
    "Verdict",
    "execute_verdict",
    "judge_stored",
    "load_callable",
    "load_policy",
    "replay",
    "replay_stored",
]

_LAZY = {
    "ActionGate": ".gate",
    "ALREADY_COMPENSATED": ".gate",
    "execute_verdict": ".execute",
    "FixAction": ".policy",
    "GateOutcome": ".gate",
    "judge_stored": ".execute",
    "load_callable": ".policy",
    "load_policy": ".policy",
    "Policy": ".policy",
    "Rail": ".rails",
    "Receipt": ".rails",
    "ReferenceLedger": ".rails",
    "replay": ".policy",
    "replay_stored": ".execute",
    "Verdict": ".policy",
}
"""Public names imported on first use: name -> module."""

__getattr__, __dir__ = _lazy.exports(__name__, _LAZY, submodules=True)
