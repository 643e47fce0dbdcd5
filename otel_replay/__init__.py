"""otel-replay: OpenTelemetry-native capture, storage and replay of AI-agent decisions.

Capture decisions as spans, store them as Parquet, query replay chains with
DuckDB, replay decisions against live state and gate the real action.

The public API is re-exported here; see README.md for the manual. Every
public name is imported on first use (``from otel_replay import audit`` imports
the capture path, ``otel_replay.Store`` the read side): importing the package
itself, as every ``import otel_replay.X`` does first, loads none of them, so a
CLI command, an agent and a test's subprocess start without the OpenTelemetry
SDK, pyarrow, DuckDB, the contracts engine or the report pages they do not use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from otel_replay import _display, _lazy
from otel_replay._compaction import use_compactor
from otel_replay._version import __version__

if TYPE_CHECKING:  # what the names below resolve to on first use, for type checkers
    from pathlib import Path

    from otel_replay._compaction import Compactor
    from otel_replay._counters import CompactionCounters
    from otel_replay.capture.audit import Decision, audit
    from otel_replay.capture.audit_log import AuditLog
    from otel_replay.capture.context import CorrelationSpanProcessor, correlation, current_ids, session
    from otel_replay.capture.recorder import Recorder, RecorderStats, get_recorder, set_recorder
    from otel_replay.capture.sampling import RecordSampler
    from otel_replay.capture.sinks import MemorySink, Sink
    from otel_replay.capture.tracer import DecisionTracer
    from otel_replay.contracts.loader import load_contracts
    from otel_replay.contracts.session import GovernedSession, govern
    from otel_replay.errors import (
        AlreadyCompensated,
        CaptureError,
        CompensationPending,
        ConfigError,
        ConflictingRecords,
        ContractError,
        ContractLoadError,
        CorruptFileError,
        DatasetError,
        DeterminismLeakError,
        GateError,
        IntegrityError,
        OtelReplayError,
        OutcomeAlreadyRecorded,
        PayloadError,
        PolicyError,
        PolicyLoadError,
        QueryError,
        ReadOnlyViolation,
        RecordingError,
        RecordNotFound,
        ReplayContractError,
        ReplayKillError,
        ReplayMismatchError,
        ReplayUndecidable,
        RerunError,
        UntrustedRecord,
    )
    from otel_replay.exporters.parquet import ParquetSpanExporter
    from otel_replay.gate.execute import execute_verdict, replay_stored
    from otel_replay.gate.gate import ActionGate, GateOutcome
    from otel_replay.gate.policy import FixAction, Policy, Verdict, load_policy, replay
    from otel_replay.gate.rails import Rail, Receipt, ReferenceLedger
    from otel_replay.instrumentation.agent import invoke_agent
    from otel_replay.instrumentation.anthropic_client import AnthropicInstrumentor
    from otel_replay.instrumentation.openai_client import OpenAIInstrumentor
    from otel_replay.instrumentation.threads import ThreadContextInstrumentor
    from otel_replay.instrumentation.tools import tool, unwrap_tool, wrap_tool
    from otel_replay.integrity import SealCheck, SigningKey, VerifyReport, load_signing_key
    from otel_replay.pipeline import Telemetry, configure
    from otel_replay.query.chains import CHAIN_TYPES, ReplayBuilder, ReplayChain
    from otel_replay.query.store import Store
    from otel_replay.query.store import open_store as open
    from otel_replay.records import (
        Action,
        AuditEntry,
        DecisionRecord,
        DependencySnapshot,
        GateRecord,
        ModelCall,
        OutcomeRecord,
        Report,
        Seal,
        SpanRef,
    )
    from otel_replay.rerun.divergence import Divergence
    from otel_replay.rerun.record import recording
    from otel_replay.rerun.runner import GateResult, RerunResult, rerun

_LAZY = {
    "Action": "otel_replay.records",
    "ActionGate": "otel_replay.gate.gate",
    "AlreadyCompensated": "otel_replay.errors",
    "AnthropicInstrumentor": "otel_replay.instrumentation.anthropic_client",
    "audit": "otel_replay.capture.audit",
    "AuditEntry": "otel_replay.records",
    "AuditLog": "otel_replay.capture.audit_log",
    "CaptureError": "otel_replay.errors",
    "CHAIN_TYPES": "otel_replay.query.chains",
    "CompensationPending": "otel_replay.errors",
    "ConfigError": "otel_replay.errors",
    "configure": "otel_replay.pipeline",
    "ConflictingRecords": "otel_replay.errors",
    "ContractError": "otel_replay.errors",
    "ContractLoadError": "otel_replay.errors",
    "correlation": "otel_replay.capture.context",
    "CorrelationSpanProcessor": "otel_replay.capture.context",
    "CorruptFileError": "otel_replay.errors",
    "current_ids": "otel_replay.capture.context",
    "DatasetError": "otel_replay.errors",
    "Decision": "otel_replay.capture.audit",
    "DecisionRecord": "otel_replay.records",
    "DecisionTracer": "otel_replay.capture.tracer",
    "DependencySnapshot": "otel_replay.records",
    "DeterminismLeakError": "otel_replay.errors",
    "Divergence": "otel_replay.rerun.divergence",
    "execute_verdict": "otel_replay.gate.execute",
    "FixAction": "otel_replay.gate.policy",
    "GateError": "otel_replay.errors",
    "GateOutcome": "otel_replay.gate.gate",
    "GateRecord": "otel_replay.records",
    "GateResult": "otel_replay.rerun.runner",
    "get_recorder": "otel_replay.capture.recorder",
    "govern": "otel_replay.contracts.session",
    "GovernedSession": "otel_replay.contracts.session",
    "IntegrityError": "otel_replay.errors",
    "invoke_agent": "otel_replay.instrumentation.agent",
    "load_contracts": "otel_replay.contracts.loader",
    "load_policy": "otel_replay.gate.policy",
    "load_signing_key": "otel_replay.integrity",
    "MemorySink": "otel_replay.capture.sinks",
    "ModelCall": "otel_replay.records",
    "open": "otel_replay.query.store:open_store",
    "OpenAIInstrumentor": "otel_replay.instrumentation.openai_client",
    "OtelReplayError": "otel_replay.errors",
    "OutcomeAlreadyRecorded": "otel_replay.errors",
    "OutcomeRecord": "otel_replay.records",
    "ParquetSpanExporter": "otel_replay.exporters.parquet",
    "PayloadError": "otel_replay.errors",
    "Policy": "otel_replay.gate.policy",
    "PolicyError": "otel_replay.errors",
    "PolicyLoadError": "otel_replay.errors",
    "QueryError": "otel_replay.errors",
    "Rail": "otel_replay.gate.rails",
    "ReadOnlyViolation": "otel_replay.errors",
    "Receipt": "otel_replay.gate.rails",
    "Recorder": "otel_replay.capture.recorder",
    "RecorderStats": "otel_replay.capture.recorder",
    "recording": "otel_replay.rerun.record",
    "RecordingError": "otel_replay.errors",
    "RecordNotFound": "otel_replay.errors",
    "RecordSampler": "otel_replay.capture.sampling",
    "ReferenceLedger": "otel_replay.gate.rails",
    "replay": "otel_replay.gate.policy",
    "replay_stored": "otel_replay.gate.execute",
    "ReplayBuilder": "otel_replay.query.chains",
    "ReplayChain": "otel_replay.query.chains",
    "ReplayContractError": "otel_replay.errors",
    "ReplayKillError": "otel_replay.errors",
    "ReplayMismatchError": "otel_replay.errors",
    "ReplayUndecidable": "otel_replay.errors",
    "Report": "otel_replay.records",
    "rerun": "otel_replay.rerun.runner",
    "RerunError": "otel_replay.errors",
    "RerunResult": "otel_replay.rerun.runner",
    "Seal": "otel_replay.records",
    "SealCheck": "otel_replay.integrity",
    "session": "otel_replay.capture.context",
    "set_recorder": "otel_replay.capture.recorder",
    "SigningKey": "otel_replay.integrity",
    "Sink": "otel_replay.capture.sinks",
    "SpanRef": "otel_replay.records",
    "Store": "otel_replay.query.store",
    "Telemetry": "otel_replay.pipeline",
    "ThreadContextInstrumentor": "otel_replay.instrumentation.threads",
    "tool": "otel_replay.instrumentation.tools",
    "UntrustedRecord": "otel_replay.errors",
    "unwrap_tool": "otel_replay.instrumentation.tools",
    "Verdict": "otel_replay.gate.policy",
    "VerifyReport": "otel_replay.integrity",
    "wrap_tool": "otel_replay.instrumentation.tools",
}
"""Public names imported on first use: name -> "module" or "module:attribute"."""

__getattr__, __dir__ = _lazy.exports(__name__, _LAZY, submodules=True)


def _background_compactor(
    dataset: Path | str, every_seconds: float, max_batch_rows: int, metrics: CompactionCounters
) -> Compactor:
    """The compactor an exporter's ``compact_every_seconds`` starts."""
    # Imported here for start-up cost: compaction loads DuckDB, and only an exporter that compacts asks for it.
    from otel_replay.storage.background import BackgroundCompactor

    return BackgroundCompactor(dataset, every_seconds, max_batch_rows, metrics)


def _register_report_pages() -> None:
    """Register the notebook pages of a chain, a verdict and a rerun result."""
    # Imported here for start-up cost: the report package loads the read side, the gate and rerun,
    # and registers its pages on import; a notebook asks for them at its first display.
    import otel_replay.report  # noqa: F401


# The exporter sits below storage: it is handed the compactor its compact_every_seconds starts.
use_compactor(_background_compactor)
_display.register_later(_register_report_pages)

__all__ = [
    "Action",
    "ActionGate",
    "AlreadyCompensated",
    "AnthropicInstrumentor",
    "AuditEntry",
    "AuditLog",
    "CHAIN_TYPES",
    "CaptureError",
    "CompensationPending",
    "ConfigError",
    "ConflictingRecords",
    "ContractError",
    "ContractLoadError",
    "CorrelationSpanProcessor",
    "CorruptFileError",
    "DatasetError",
    "Decision",
    "DecisionRecord",
    "DecisionTracer",
    "DependencySnapshot",
    "DeterminismLeakError",
    "Divergence",
    "FixAction",
    "GateError",
    "GateOutcome",
    "GateRecord",
    "GateResult",
    "GovernedSession",
    "IntegrityError",
    "MemorySink",
    "ModelCall",
    "OpenAIInstrumentor",
    "OtelReplayError",
    "OutcomeAlreadyRecorded",
    "OutcomeRecord",
    "ParquetSpanExporter",
    "PayloadError",
    "Policy",
    "PolicyError",
    "PolicyLoadError",
    "QueryError",
    "Rail",
    "ReadOnlyViolation",
    "Receipt",
    "RecordNotFound",
    "RecordSampler",
    "Recorder",
    "RecorderStats",
    "RecordingError",
    "ReferenceLedger",
    "ReplayBuilder",
    "ReplayChain",
    "ReplayContractError",
    "ReplayKillError",
    "ReplayMismatchError",
    "ReplayUndecidable",
    "Report",
    "RerunError",
    "RerunResult",
    "Seal",
    "SealCheck",
    "SigningKey",
    "Sink",
    "SpanRef",
    "Store",
    "Telemetry",
    "ThreadContextInstrumentor",
    "UntrustedRecord",
    "Verdict",
    "VerifyReport",
    "__version__",
    "audit",
    "configure",
    "correlation",
    "current_ids",
    "execute_verdict",
    "get_recorder",
    "govern",
    "invoke_agent",
    "load_contracts",
    "load_policy",
    "load_signing_key",
    "open",
    "recording",
    "replay",
    "replay_stored",
    "rerun",
    "session",
    "set_recorder",
    "tool",
    "unwrap_tool",
    "wrap_tool",
]
