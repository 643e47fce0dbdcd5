"""Capture: ``audit()``, the decision tracer, the audit log and correlation scopes.

The names are imported on first use: the read side opens a dataset through a
few modules of this package (the write-ahead log's recovery, the stored
records' bodies) and does not pay for the recorder, the OpenTelemetry SDK and
the exporters that ``audit()`` runs on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from otel_replay import _lazy

if TYPE_CHECKING:  # what the names below resolve to on first use, for type checkers
    from otel_replay.capture.audit import Decision, audit
    from otel_replay.capture.audit_log import AuditLog
    from otel_replay.capture.context import CorrelationIds, CorrelationSpanProcessor, correlation, current_ids, session
    from otel_replay.capture.recorder import Recorder, RecorderStats, get_recorder, set_recorder
    from otel_replay.capture.sampling import RecordSampler
    from otel_replay.capture.sinks import MemorySink, Sink
    from otel_replay.capture.tracer import DecisionTracer

__all__ = [
    "AuditLog",
    "CorrelationIds",
    "CorrelationSpanProcessor",
    "Decision",
    "DecisionTracer",
    "MemorySink",
    "Recorder",
    "RecordSampler",
    "RecorderStats",
    "Sink",
    "audit",
    "correlation",
    "current_ids",
    "get_recorder",
    "session",
    "set_recorder",
]

_LAZY = {
    "audit": ".audit",
    "AuditLog": ".audit_log",
    "correlation": ".context",
    "CorrelationIds": ".context",
    "CorrelationSpanProcessor": ".context",
    "current_ids": ".context",
    "Decision": ".audit",
    "DecisionTracer": ".tracer",
    "get_recorder": ".recorder",
    "MemorySink": ".sinks",
    "Recorder": ".recorder",
    "RecorderStats": ".recorder",
    "RecordSampler": ".sampling",
    "session": ".context",
    "set_recorder": ".recorder",
    "Sink": ".sinks",
}
"""Public names imported on first use: name -> module."""

__getattr__, __dir__ = _lazy.exports(__name__, _LAZY, submodules=True)
