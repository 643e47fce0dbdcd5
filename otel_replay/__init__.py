"""otel-replay: OpenTelemetry-native capture, storage and replay of AI-agent decisions.

Capture decisions as spans, store them as Parquet, query replay chains with
DuckDB, replay decisions against live state and gate the real action.

The public API is re-exported here; see README.md for the manual.
"""

from __future__ import annotations

from otel_replay import report as _report  # noqa: F401  (registers the notebook pages of chains, verdicts, reruns)
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
from otel_replay.contracts import GovernedSession, govern, load_contracts
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
from otel_replay.exporters.parquet import use_compactor
from otel_replay.gate import ActionGate, GateOutcome, Rail, Receipt, ReferenceLedger
from otel_replay.gate.execute import execute_verdict, replay_stored
from otel_replay.gate.policy import FixAction, Policy, Verdict, load_policy, replay
from otel_replay.instrumentation import (
    AnthropicInstrumentor,
    OpenAIInstrumentor,
    ThreadContextInstrumentor,
    invoke_agent,
    tool,
    unwrap_tool,
    wrap_tool,
)
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
from otel_replay.rerun import Divergence, GateResult, RerunResult, recording, rerun
from otel_replay.storage.background import BackgroundCompactor

# The exporter sits below storage: it is handed the compactor its compact_every_seconds starts.
use_compactor(BackgroundCompactor)

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
