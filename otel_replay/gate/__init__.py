"""The action side: the gate over a rail, its receipts and compensation claims, and execution of a verdict.

:mod:`~otel_replay.gate.policy` judges a decision against today's state
(:func:`replay`); :mod:`~otel_replay.gate.gate` routes the verdict to a
:class:`Rail` (:class:`ActionGate`); :mod:`~otel_replay.gate.execute`
replays a stored decision and compensates its stored receipts, read by
:mod:`~otel_replay.gate.reads`.
"""

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
