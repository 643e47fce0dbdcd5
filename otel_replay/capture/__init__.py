"""Capture: ``audit()``, the decision tracer, the audit log and correlation scopes."""

from __future__ import annotations

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
