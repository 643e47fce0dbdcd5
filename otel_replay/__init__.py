"""otel-replay: OpenTelemetry-native capture, storage and replay of AI-agent decisions.

Capture decisions as spans, store them as Parquet, query replay chains with
DuckDB, replay decisions against live state and gate the real action.

The public API is re-exported here; see README.md for the manual.
"""

from __future__ import annotations

from otel_replay.capture import (
    AuditLog,
    CorrelationSpanProcessor,
    Decision,
    DecisionTracer,
    MemorySink,
    Recorder,
    RecorderStats,
    Sink,
    audit,
    correlation,
    current_ids,
    get_recorder,
    session,
    set_recorder,
)
from otel_replay.chains import CHAIN_TYPES, ReplayBuilder, ReplayChain
from otel_replay.errors import (
    AlreadyCompensated,
    CaptureError,
    CompensationPending,
    ConfigError,
    ConflictingRecords,
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
    ReplayMismatchError,
    ReplayUndecidable,
    RerunError,
    UntrustedRecord,
)
from otel_replay.execute import execute_verdict, replay_stored
from otel_replay.exporters import ParquetSpanExporter
from otel_replay.gate import ActionGate, GateOutcome, Rail, Receipt, ReferenceLedger
from otel_replay.instrumentation import (
    AnthropicInstrumentor,
    OpenAIInstrumentor,
    ThreadContextInstrumentor,
    tool,
    unwrap_tool,
    wrap_tool,
)
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
from otel_replay.replay import FixAction, Policy, Verdict, load_policy, replay
from otel_replay.rerun import Divergence, GateResult, RerunResult, recording, rerun
from otel_replay.store import Store
from otel_replay.store import open_store as open

__version__ = "0.1.0"

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
    "Recorder",
    "RecorderStats",
    "RecordingError",
    "ReferenceLedger",
    "ReplayBuilder",
    "ReplayChain",
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
