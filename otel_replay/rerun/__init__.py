"""Deterministic rerun: record every nondeterministic input of an agent run, rerun it offline, prove it.

* :func:`recording` - record mode: clock, entropy, HTTP, model and tool calls
  become sealed ``replay.recording`` spans of a session;
* :func:`rerun` - rerun mode: the agent runs again from the dataset alone,
  every recorded value served back, compared step by step and by causal
  fingerprint, ending (optionally) in the policy replay and the gate;
* the ``otel-replay rerun`` command and the ``pytest`` plugin build on these.

httpx, requests and the model clients are imported only when a recording or
rerun starts, so this package imports without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from otel_replay import _lazy

if TYPE_CHECKING:  # what the names below resolve to on first use, for type checkers
    from otel_replay.rerun.divergence import Divergence
    from otel_replay.rerun.events import Fingerprint
    from otel_replay.rerun.load import Recording, load_recording, recorded_sessions
    from otel_replay.rerun.record import RecordMode, recording
    from otel_replay.rerun.runner import GateResult, RerunResult, rerun
    from otel_replay.rerun.serve import RerunMode

__all__ = [
    "Divergence",
    "Fingerprint",
    "GateResult",
    "RecordMode",
    "Recording",
    "RerunMode",
    "RerunResult",
    "load_recording",
    "recorded_sessions",
    "recording",
    "rerun",
]

_LAZY = {
    "Divergence": ".divergence",
    "Fingerprint": ".events",
    "GateResult": ".runner",
    "load_recording": ".load",
    "recorded_sessions": ".load",
    "Recording": ".load",
    "recording": ".record",
    "RecordMode": ".record",
    "rerun": ".runner",
    "RerunMode": ".serve",
    "RerunResult": ".runner",
}
"""Public names imported on first use: name -> module."""

__getattr__, __dir__ = _lazy.exports(__name__, _LAZY, submodules=True)
