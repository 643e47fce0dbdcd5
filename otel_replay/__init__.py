"""otel-replay: OpenTelemetry-native capture, storage and replay of AI-agent decisions.

Capture decisions as spans, store them as Parquet, query replay chains with
DuckDB, replay decisions against live state and gate the real action.

The public API is re-exported here; see README.md for the manual. Importing the
package loads what capture needs (``configure()``, ``audit()``, the tracer,
the audit log, the records and errors); the rest of the API (the read side,
the gate, rerun, contracts, the instrumentors) is imported on first use of
its name, so an agent, a CLI command and a test's subprocess start without
DuckDB, the contracts engine or the report pages they do not use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from otel_replay import _display, _lazy
from otel_replay._version import __version__
from otel_replay.capture import (
    AuditLog,
    CorrelationSpanProcessor,
    Decision,
    DecisionTracer,
    MemorySink,
    Recorder,
    RecorderStats,
    RecordSampler,
    Sink,
    audit,
    correlation,
    current_ids,
    get_recorder,
    session,
    set_recorder,
)
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
from otel_replay.exporters import ParquetSpanExporter
from otel_replay.exporters.parquet import Compactor, use_compactor
from otel_replay.integrity import SealCheck, SigningKey, VerifyReport, load_signing_key
from otel_replay.pipeline import Telemetry, configure
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

if TYPE_CHECKING:  # what the names below resolve to on first use, for type checkers
    from pathlib import Path

    from otel_replay._counters import CompactionCounters
    from otel_replay.contracts.loader import load_contracts
    from otel_replay.contracts.session import GovernedSession, govern
    from otel_replay.gate.execute import execute_verdict, replay_stored
    from otel_replay.gate.gate import ActionGate, GateOutcome
    from otel_replay.gate.policy import FixAction, Policy, Verdict, load_policy, replay
    from otel_replay.gate.rails import Rail, Receipt, ReferenceLedger
    from otel_replay.instrumentation.agent import invoke_agent
    from otel_replay.instrumentation.anthropic_client import AnthropicInstrumentor
    from otel_replay.instrumentation.openai_client import OpenAIInstrumentor
    from otel_replay.instrumentation.threads import ThreadContextInstrumentor
    from otel_replay.instrumentation.tools import tool, unwrap_tool, wrap_tool
    from otel_replay.query.chains import CHAIN_TYPES, ReplayBuilder, ReplayChain
    from otel_replay.query.store import Store
    from otel_replay.query.store import open_store as open
    from otel_replay.rerun.divergence import Divergence
    from otel_replay.rerun.record import recording
    from otel_replay.rerun.runner import GateResult, RerunResult, rerun

_LAZY = {
    "ActionGate": "otel_replay.gate.gate",
    "AnthropicInstrumentor": "otel_replay.instrumentation.anthropic_client",
    "CHAIN_TYPES": "otel_replay.query.chains",
    "Divergence": "otel_replay.rerun.divergence",
    "execute_verdict": "otel_replay.gate.execute",
    "FixAction": "otel_replay.gate.policy",
    "GateOutcome": "otel_replay.gate.gate",
    "GateResult": "otel_replay.rerun.runner",
    "govern": "otel_replay.contracts.session",
    "GovernedSession": "otel_replay.contracts.session",
    "invoke_agent": "otel_replay.instrumentation.agent",
    "load_contracts": "otel_replay.contracts.loader",
    "load_policy": "otel_replay.gate.policy",
    "open": "otel_replay.query.store:open_store",
    "OpenAIInstrumentor": "otel_replay.instrumentation.openai_client",
    "Policy": "otel_replay.gate.policy",
    "Rail": "otel_replay.gate.rails",
    "Receipt": "otel_replay.gate.rails",
    "recording": "otel_replay.rerun.record",
    "ReferenceLedger": "otel_replay.gate.rails",
    "replay": "otel_replay.gate.policy",
    "replay_stored": "otel_replay.gate.execute",
    "ReplayBuilder": "otel_replay.query.chains",
    "ReplayChain": "otel_replay.query.chains",
    "rerun": "otel_replay.rerun.runner",
    "RerunResult": "otel_replay.rerun.runner",
    "Store": "otel_replay.query.store",
    "ThreadContextInstrumentor": "otel_replay.instrumentation.threads",
    "tool": "otel_replay.instrumentation.tools",
    "unwrap_tool": "otel_replay.instrumentation.tools",
    "Verdict": "otel_replay.gate.policy",
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
