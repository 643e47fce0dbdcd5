"""Every span and attribute name otel-replay writes or reads.

This module is the span model's single source of names: capture, the exporter
row conversion, the SQL views (which spell the same strings; a test pins that
each one used in ``queries/`` is defined here) and replay all import from it.

Two namespaces are used:

* ``replay.*`` for this project's own attributes;
* ``gen_ai.*`` (OpenTelemetry GenAI semantic conventions) for model calls, so
  any GenAI-aware backend understands the model spans too.
"""

from __future__ import annotations

from typing import Final

SCHEMA_VERSION: Final = "2"
"""Storage schema version written into every Parquet file's metadata.

Version 2 added the typed columns ``outcome_decision_id``, ``outcome_correct``
and ``decision_confidence``. Readers take files of every version up to this
one's major (a column a file lacks reads as NULL) and refuse a newer major."""

INSTRUMENTATION_NAME: Final = "otel_replay"

# --- span names --------------------------------------------------------------
SPAN_DECISION: Final = "replay.decision"
SPAN_READ: Final = "replay.read"
SPAN_MODEL: Final = "replay.model"
SPAN_ACT: Final = "replay.act"
SPAN_OUTCOME: Final = "replay.outcome"
SPAN_AUDIT_ENTRY: Final = "replay.audit_entry"
SPAN_GATE: Final = "replay.gate"
SPAN_VOID: Final = "replay.void"

# --- kinds (value of ``replay.kind``) ---------------------------------------
KIND: Final = "replay.kind"
KIND_DECISION: Final = "decision"
KIND_READ: Final = "read"
KIND_MODEL: Final = "model"
KIND_ACT: Final = "act"
KIND_OUTCOME: Final = "outcome"
KIND_AUDIT_ENTRY: Final = "audit_entry"
KIND_GATE: Final = "gate"
KIND_VOID: Final = "void"

# --- correlation, stamped on every span in scope ------------------------------
CORRELATION_ID: Final = "replay.correlation_id"
SESSION_ID: Final = "replay.session_id"
AGENT_ID: Final = "replay.agent_id"

# --- record identity and integrity -------------------------------------------
RECORD_ID: Final = "replay.record.id"
RECORD_SOURCE: Final = "replay.record.source"  # "audit" | "tracer" | "audit_log" | "gate"
RECORD_CHAIN_ID: Final = "replay.record.chain_id"
RECORD_SEQ: Final = "replay.record.seq"
RECORD_PREV_ID: Final = "replay.record.prev_id"
RECORD_PREV_HASH: Final = "replay.record.prev_hash"
RECORD_HASH: Final = "replay.record.hash"
RECORD_SIGNATURE: Final = "replay.record.signature"
RECORD_KEY_ID: Final = "replay.record.key_id"
RECORD_ERROR: Final = "replay.record.error"
RECORD_SPAN: Final = "replay.record.span"
"""Where the record was sealed: ``<trace id>-<span id>`` (32 and 16 lowercase hex), covered by its hash.

A stored row whose own ids differ is a copy, not the record. Records sealed
before this attribute existed do not carry it (``verify`` still names their
copies by comparing places).
"""

INTEGRITY_FIELDS: Final = frozenset({RECORD_HASH, RECORD_SIGNATURE})
"""Attributes left out of the hashed body (they are computed from it)."""

# --- decision ----------------------------------------------------------------
DECISION_TYPE: Final = "replay.decision.type"
DECISION_RATIONALE: Final = "replay.decision.rationale"
DECISION_CONFIDENCE: Final = "replay.decision.confidence"
DECISION_INPUTS: Final = "replay.decision.inputs"  # canonical JSON object
DECISION_MODELS: Final = "replay.decision.models"  # canonical JSON array
DECISION_REPORTS: Final = "replay.decision.reports"  # canonical JSON array

SNAPSHOT_STATE: Final = "replay.snapshot.state"  # canonical JSON
SNAPSHOT_VERSION: Final = "replay.snapshot.version"
SNAPSHOT_CAPTURED_AT: Final = "replay.snapshot.captured_at"  # ISO-8601 UTC

ACTION_TYPE: Final = "replay.action.type"
ACTION_ARGUMENTS: Final = "replay.action.arguments"  # canonical JSON object
ACTION_COST: Final = "replay.action.cost"

READ_INPUTS: Final = "replay.read.inputs"  # canonical JSON object
MODEL_DECISION_BASIS: Final = "replay.model.decision_basis"
MODEL_OUTPUT: Final = "replay.model.output"  # canonical JSON
REPORT_EVENT: Final = "replay.report"
REPORT_STAGE: Final = "replay.report.stage"
REPORT_BODY: Final = "replay.report.body"  # canonical JSON

# --- outcome -----------------------------------------------------------------
OUTCOME_CORRECT: Final = "replay.outcome.correct"
OUTCOME_NOTE: Final = "replay.outcome.note"
OUTCOME_DECISION_ID: Final = "replay.outcome.decision_id"

# --- audit log entry ---------------------------------------------------------
AUDIT_EVENT_TYPE: Final = "replay.audit.event_type"
AUDIT_SOURCE_AGENT: Final = "replay.audit.source_agent"
AUDIT_TARGET_AGENT: Final = "replay.audit.target_agent"
AUDIT_CREATED_AT: Final = "replay.audit.created_at"  # ISO-8601, the writer's clock
AUDIT_PAYLOAD: Final = "replay.audit.payload"  # canonical JSON

# --- gate --------------------------------------------------------------------
GATE_STAGE: Final = "replay.gate.stage"  # "commit" | "pre_commit" | "post_commit"
GATE_FIX: Final = "replay.gate.fix"
GATE_EXECUTED: Final = "replay.gate.executed"
GATE_DETAIL: Final = "replay.gate.detail"
GATE_JUSTIFIED: Final = "replay.gate.justified"
GATE_REASON: Final = "replay.gate.reason"
GATE_RECEIPT: Final = "replay.gate.receipt"  # canonical JSON
GATE_DECISION_ID: Final = "replay.gate.decision_id"
GATE_ACTION: Final = "replay.gate.action"  # a commit's action, canonical JSON {"type", "arguments", "cost"}
GATE_INTENT_ID: Final = "replay.gate.intent_id"  # a commit's (or failed commit's) intent record
GATE_DECISION_RECORD: Final = "replay.gate.decision_record"  # an intent's decision as acted on: its attributes, JSON
GATE_INTENT: Final = "intent"  # replay.gate.executed of the record written (durably) before the rail is called

# --- void: a record sealed, then not kept by its store -------------------------
VOID_RECORD_ID: Final = "replay.void.record_id"  # the record sealed and not kept
VOID_NAME: Final = "replay.void.name"  # its span name
VOID_SEQ: Final = "replay.void.seq"  # its sequence number in the void's own chain
VOID_HASH: Final = "replay.void.hash"  # its sealed hash
VOID_REASON: Final = "replay.void.reason"

# --- OpenTelemetry GenAI semantic conventions (model spans) ------------------
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_SYSTEM: Final = "gen_ai.system"  # deprecated gen_ai.provider.name, still sent by peers: read, never emitted
OPENINFERENCE_SPAN_KIND: Final = "openinference.span.kind"  # OpenInference's LLM/TOOL/AGENT/CHAIN: read, never emitted
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"  # string array
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P: Final = "gen_ai.request.top_p"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_SEED: Final = "gen_ai.request.seed"
GEN_AI_REQUEST_STOP_SEQUENCES: Final = "gen_ai.request.stop_sequences"
GEN_AI_REQUEST_FREQUENCY_PENALTY: Final = "gen_ai.request.frequency_penalty"
GEN_AI_REQUEST_PRESENCE_PENALTY: Final = "gen_ai.request.presence_penalty"
GEN_AI_REQUEST_TOP_K: Final = "gen_ai.request.top_k"
GEN_AI_REQUEST_CHOICE_COUNT: Final = "gen_ai.request.choice.count"
GEN_AI_REQUEST_STREAM: Final = "gen_ai.request.stream"  # bool
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"  # double, seconds
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS: Final = "gen_ai.usage.cache_creation.input_tokens"
GEN_AI_USAGE_REASONING_OUTPUT_TOKENS: Final = "gen_ai.usage.reasoning.output_tokens"
GEN_AI_OUTPUT_TYPE: Final = "gen_ai.output.type"
OPENAI_REQUEST_SERVICE_TIER: Final = "openai.request.service_tier"
OPENAI_RESPONSE_SERVICE_TIER: Final = "openai.response.service_tier"
OPENAI_RESPONSE_SYSTEM_FINGERPRINT: Final = "openai.response.system_fingerprint"
OPENAI_API_TYPE: Final = "openai.api.type"  # "chat_completions" | "responses"
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
GEN_AI_AGENT_ID: Final = "gen_ai.agent.id"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_AGENT_DESCRIPTION: Final = "gen_ai.agent.description"
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"  # JSON [{role, parts}], only with content capture on
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"  # JSON [{role, parts, finish_reason}], capture on
GEN_AI_SYSTEM_INSTRUCTIONS: Final = "gen_ai.system_instructions"  # JSON [part], only with content capture on
GEN_AI_TOOL_DEFINITIONS: Final = "gen_ai.tool.definitions"  # JSON [{type, name, ...}], only with capture on
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_TYPE: Final = "gen_ai.tool.type"
GEN_AI_TOOL_DESCRIPTION: Final = "gen_ai.tool.description"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"  # only with content capture on
GEN_AI_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"  # only with content capture on
ERROR_TYPE: Final = "error.type"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"

GEN_AI_OP_CHAT: Final = "chat"
GEN_AI_OP_EXECUTE_TOOL: Final = "execute_tool"
SPAN_EXECUTE_TOOL_PREFIX: Final = "execute_tool"  # span name "execute_tool {tool name}"

# --- instrumentation (otel_replay.instrumentation) -----------------------------
INSTRUMENTATION_SCOPE_PREFIX: Final = "otel_replay.instrumentation"
"""Scope names of the instrumentors' tracers; distinct from INSTRUMENTATION_NAME, so the
CorrelationSpanProcessor stamps their spans like any other instrumentation's."""
KIND_TOOL: Final = "tool"
MODEL_TOOL_CALLS: Final = "replay.model.tool_calls"  # JSON array of {id, name[, arguments]}
MODEL_TOOL_CALLS_DROPPED: Final = "replay.model.tool_calls.dropped"  # int: tool calls past the per-span cap
MODEL_STREAMED: Final = "replay.model.streamed"  # bool
STREAM_END: Final = "replay.stream.end"  # "exhausted" | "closed" | "error" | "abandoned"
TOOL_SIDE_EFFECT: Final = "replay.tool.side_effect"
TOOL_CONTENT_DROPPED: Final = "replay.content.dropped"  # int: content attributes dropped (redaction failed)
CONTENT_CUT: Final = "replay.content.cut"  # int: characters (and list items) cut from captured content to fit
HTTP_REQUEST_BODY: Final = "replay.http.request.body"  # redacted, capped; only with content capture on
HTTP_RESPONSE_BODY: Final = "replay.http.response.body"  # redacted, capped; only with content capture on

# --- contract governance (otel_replay.contracts: one span per enforcement decision) ---------
SPAN_CONTRACT_DECISION: Final = "replay.contract.decision"
CONTRACT_SESSION_ID: Final = "replay.contract.session_id"
CONTRACT_AGENT: Final = "replay.contract.agent"
CONTRACT_STEP: Final = "replay.contract.step"
CONTRACT_MODE: Final = "replay.contract.mode"  # "enforce" | "shadow" | "log-only"
CONTRACT_OUTCOME: Final = "replay.contract.outcome"  # "allow" | "reject" | "strip" | "text_only" | "logged"
CONTRACT_PHASE_BEFORE: Final = "replay.contract.phase_before"
CONTRACT_PHASE_AFTER: Final = "replay.contract.phase_after"
CONTRACT_STATE_VERSION: Final = "replay.contract.state_version"
CONTRACT_DIGEST: Final = "replay.contract.digest"  # the contracts' digest (ContractSet.digest)
CONTRACT_TOOLS: Final = "replay.contract.tools"  # JSON array of {call_id, name, allowed, arguments (redacted JSON)}
CONTRACT_TOOLS_DROPPED: Final = "replay.contract.tools.dropped"  # int: tool calls past the per-span cap
CONTRACT_FAILURES: Final = "replay.contract.failures"  # JSON array of {rule, tool, call_id, path, detail, source}
CONTRACT_NARROWED: Final = "replay.contract.narrowed"  # JSON array of the tool names narrowing removed
CONTRACT_PROVIDER: Final = "replay.contract.provider"  # "openai" | "anthropic"
CONTRACT_API: Final = "replay.contract.api"  # "chat.completions" | "responses" | "messages" | "tools"
CONTRACT_STREAMED: Final = "replay.contract.streamed"  # bool

# --- OpenTelemetry resource --------------------------------------------------
SERVICE_NAME: Final = "service.name"

# --- baggage keys (propagate across threads, tasks and processes) ------------
BAGGAGE_CORRELATION_ID: Final = CORRELATION_ID
BAGGAGE_SESSION_ID: Final = SESSION_ID
BAGGAGE_AGENT_ID: Final = AGENT_ID

# --- typed columns: attribute promoted to its own Parquet column -------------
PROMOTED_COLUMNS: Final = {
    CORRELATION_ID: "correlation_id",
    SESSION_ID: "session_id",
    AGENT_ID: "agent_id",
    RECORD_ID: "record_id",
    KIND: "replay_kind",
    DECISION_TYPE: "decision_type",
    OUTCOME_DECISION_ID: "outcome_decision_id",  # schema version 2 on
    OUTCOME_CORRECT: "outcome_correct",  # schema version 2 on
    DECISION_CONFIDENCE: "decision_confidence",  # schema version 2 on
}
"""Attribute key -> column name. A promoted attribute is stored only in its
column (when its value is of the column's exact type, see :data:`PROMOTED_TYPES`)
and restored from it on rehydration; any other value stays in the JSON."""

PROMOTED_TYPES: Final[dict[str, type]] = {
    OUTCOME_CORRECT: bool,
    DECISION_CONFIDENCE: float,
}
"""The Python type a promoted attribute's value must have to move into its column
(``bool`` -> BOOLEAN, ``float`` -> DOUBLE, finite only); a key not listed here is ``str``."""

# --- record and rerun (otel_replay.rerun) -------------------------------------
SPAN_RECORDING: Final = "replay.recording"
"""A sealed chunk of recorded boundary calls (clock, entropy, HTTP, model, tool) of one session."""
SPAN_RERUN: Final = "replay.rerun"
"""The sealed summary of one rerun of a recorded session (fingerprints, divergence, verdicts)."""
KIND_RECORDING: Final = "recording"
KIND_RERUN: Final = "rerun"
RECORDING_FORMAT: Final = "replay.recording.format"  # int: event format version
RECORDING_CHUNK: Final = "replay.recording.chunk"  # int: 0, 1, 2 ... in order
RECORDING_ID: Final = "replay.recording.id"  # str: one recording run; every chunk of it carries the same id
RECORDING_FIRST_SEQ: Final = "replay.recording.first_seq"  # int: sequence number of the chunk's first event
RECORDING_EVENTS: Final = "replay.recording.events"  # canonical JSON array of events
RECORDING_FINAL: Final = "replay.recording.final"  # bool: the last chunk of a finished recording
RECORDING_FINGERPRINT: Final = "replay.recording.fingerprint"  # on the final chunk: causal fingerprint
RECORDING_OUTCOME: Final = "replay.recording.outcome"  # on the final chunk: "returned" | "raised: ..."
RECORDING_OUTPUT: Final = "replay.recording.output"  # on the final chunk, if given: hash of what the run returned
RERUN_ID: Final = "replay.rerun.id"
RERUN_OF: Final = "replay.rerun.of_session"
RERUN_GOVERNANCE: Final = "replay.rerun.governance"
RERUN_MATCHED: Final = "replay.rerun.matched"
RERUN_FINGERPRINT: Final = "replay.rerun.fingerprint"
RERUN_ORIGINAL_FINGERPRINT: Final = "replay.rerun.original_fingerprint"
RERUN_STEPS: Final = "replay.rerun.steps"
RERUN_DIVERGENCE: Final = "replay.rerun.divergence"  # canonical JSON object, absent when matched
RERUN_VERDICTS: Final = "replay.rerun.verdicts"  # canonical JSON array
