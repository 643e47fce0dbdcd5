"""The record types shared by capture, storage and replay.

A record is what one span of kind ``decision``, ``outcome``, ``audit_entry``
or ``gate`` says. Each type converts to span attributes (``to_attributes``)
and back (``from_attributes``); the same attributes, read back from Parquet,
rebuild a record equal to the one captured in process. Structured values
(state, arguments, inputs) are held in canonical-JSON-normalised form so that
equality survives the round trip.
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from otel_replay import semconv as sc
from otel_replay._json import (
    _fast_sorted,  # orjson with sorted keys (None without orjson): a models list of known shape skips the check
    canonical_json,
    encode_mapping,
    flat_mapping_json,
    int_digits,
    loads,
    normalise,
)
from otel_replay.errors import CaptureError

__all__ = [
    "Action",
    "AuditEntry",
    "DecisionRecord",
    "DependencySnapshot",
    "GateRecord",
    "ModelCall",
    "OutcomeRecord",
    "Report",
    "Seal",
    "SpanRef",
    "id_problem",
    "iso_utc",
    "new_id",
    "trace_body",
]

Attributes = dict[str, Any]
Stage = Literal["data", "model", "harness"]


_ID_POOL_BYTES = 4096
"""Random bytes read from the OS at a time: 256 record ids per ``getrandom`` call."""
_id_lock = threading.Lock()
_id_pool = b""
_id_next = 0


def new_id() -> str:
    """A fresh 128-bit random record id, 32 lowercase hex (the OS's randomness, as ``secrets.token_hex(16)``).

    The bytes are read 4 KiB at a time: one ``os.urandom`` call per id cost
    about 15 us per decision in a process with an exporter thread (the call
    gives up the interpreter lock, and taking it back waits on that thread),
    against 0.4 us alone. A forked child drops the pool it inherited, so it
    never hands out its parent's ids.
    """
    global _id_pool, _id_next
    with _id_lock:
        start = _id_next
        if start >= len(_id_pool):
            _id_pool, start = os.urandom(_ID_POOL_BYTES), 0
        _id_next = start + 16
        return _id_pool[start : start + 16].hex()


def _new_pool_in_child() -> None:
    global _id_lock, _id_pool, _id_next
    _id_lock = threading.Lock()  # another thread may have held it at fork time
    _id_pool, _id_next = b"", 0


if hasattr(os, "register_at_fork"):  # not on Windows, where there is no fork
    os.register_at_fork(after_in_child=_new_pool_in_child)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DUCKDB_TIME = re.compile(r"^(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d(?::?\d\d)?)?$")


def iso_time(value: Any) -> str | None:
    """A stored or in-process time as ISO-8601 UTC text with microseconds (``None`` stays ``None``).

    Accepts datetimes, nanoseconds since the epoch, and DuckDB's timestamp text
    (``2026-03-02 14:30:01.123456789+00``), so both chain sources print alike.
    """
    if value is None:
        return None
    if isinstance(value, int):
        moment = _EPOCH + timedelta(microseconds=value // 1000)
    elif isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=UTC)
    else:
        match = _DUCKDB_TIME.match(str(value))
        if match is None:
            return str(value)
        day, clock, fraction, offset = match.groups()
        offset = "+00:00" if offset in (None, "Z") else offset
        if len(offset) == 3:
            offset += ":00"
        elif ":" not in offset:
            offset = f"{offset[:3]}:{offset[3:]}"
        moment = datetime.fromisoformat(f"{day}T{clock}.{(fraction or '0')[:6].ljust(6, '0')}{offset}")
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def iso_utc(value: datetime | str | None) -> str | None:
    """Normalise a timestamp to ISO-8601 UTC text (``None`` stays ``None``).

    Text must parse as ISO-8601 with a UTC offset; it is rewritten in the
    extended form in UTC (``2026-03-02T14:30:01+00:00``), so it sorts and
    parses the same way in SQL whatever form the writer used.
    """
    if value is None:
        return None
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise CaptureError(f"timestamp {value!r} is not ISO-8601 (e.g. 2026-03-02T14:30:00+00:00)") from None
        if parsed.tzinfo is None:
            raise CaptureError(f"timestamp {value!r} has no UTC offset; add one (e.g. +00:00)")
        # Stored in one extended form (compact "20260302T143001Z" included), so SQL can parse and sort it.
        return parsed.astimezone(UTC).isoformat()
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat()


@dataclass(frozen=True, slots=True)
class DependencySnapshot:
    """The versioned dependency state a decision relied on.

    ``state`` must be JSON-serialisable; it is deep-copied and normalised at
    construction, so later mutation of the caller's dict cannot alter it.
    """

    state: Mapping[str, Any]
    version: str | None = None
    captured_at: datetime | str | None = None
    state_json: str = field(init=False, repr=False, compare=False)
    """The state as canonical JSON, computed once at construction."""

    def __post_init__(self) -> None:
        if not isinstance(self.state, Mapping):
            raise CaptureError(f"DependencySnapshot.state must be a mapping, got {type(self.state).__name__}")
        text, state = encode_mapping(self.state, where="DependencySnapshot.state")
        object.__setattr__(self, "state_json", text)
        object.__setattr__(self, "state", state)
        object.__setattr__(self, "captured_at", iso_utc(self.captured_at))
        if self.version is not None:
            object.__setattr__(self, "version", str(self.version))


def _finite(number: float) -> bool:
    """``math.isfinite``, False for an int too large for a float (instead of OverflowError)."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


@dataclass(frozen=True, slots=True)
class Action:
    """An action an agent takes: its type, arguments and optional cost."""

    type: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    cost: float | int | None = None
    arguments_json: str = field(init=False, repr=False, compare=False)
    """The arguments as canonical JSON, computed once at construction."""

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or not self.type:
            raise CaptureError("Action.type must be a non-empty string")
        if type(self.type) is not str:  # a StrEnum member: stored and served as the plain string it is, so kept as one
            object.__setattr__(self, "type", str.__str__(self.type))
        encoded = flat_mapping_json(self.arguments)
        if encoded is None:
            if not isinstance(self.arguments, Mapping):
                raise CaptureError(f"Action.arguments must be a mapping, got {type(self.arguments).__name__}")
            encoded = encode_mapping(self.arguments, where=f"Action({self.type}).arguments")
        object.__setattr__(self, "arguments_json", encoded[0])
        object.__setattr__(self, "arguments", encoded[1])
        cost = self.cost
        number = isinstance(cost, (int, float)) and not isinstance(cost, bool)
        if cost is not None and not (number and _finite(cost)):
            shown = f"an int of about {int_digits(cost)} digits" if isinstance(cost, int) and number else repr(cost)
            raise CaptureError(f"Action({self.type}).cost must be a finite number a float can hold, got {shown}")

    def to_json(self) -> dict[str, Any]:
        """The action as a plain dict."""
        return {"type": self.type, "arguments": dict(self.arguments), "cost": self.cost}


@dataclass(frozen=True, slots=True)
class ModelCall:
    """Which model produced an output, and the basis it stated."""

    model_id: str
    decision_basis: str = ""
    output: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "output", normalise(self.output, where="model output"))

    def to_json(self) -> dict[str, Any]:
        """The model call as a plain dict."""
        return {"model_id": self.model_id, "decision_basis": self.decision_basis, "output": self.output}


def _models_json(models: tuple[ModelCall, ...]) -> str:
    """``canonical_json([m.to_json() for m in models])``: the same text.

    Model calls without output whose id and basis are plain ``str`` (what
    ``Decision.model()`` records most often) are written by orjson straight
    away: for those, orjson's bytes are json's (a lone surrogate makes it
    refuse, and json decides as before), so the per-item check that
    :func:`~otel_replay._json.canonical_json` makes (about half its cost on a
    list of dicts) has nothing to find.
    """
    if _fast_sorted is not None:
        plain = []
        for m in models:
            if m.__class__ is not ModelCall or m.output is not None:
                break
            model_id, basis = m.model_id, m.decision_basis
            if model_id.__class__ is not str or basis.__class__ is not str:
                break
            plain.append({"model_id": model_id, "decision_basis": basis, "output": None})
        else:
            try:
                return _fast_sorted(plain).decode()
            except TypeError:  # a lone surrogate: json decides, as canonical_json does
                pass
    return canonical_json([m.to_json() for m in models], where="models")


@dataclass(frozen=True, slots=True)
class Report:
    """A leaf report routed to a stage span: ``data``, ``model`` or ``harness``."""

    stage: Stage
    name: str
    passed: bool | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.stage not in ("data", "model", "harness"):
            raise CaptureError(f"Report.stage must be 'data', 'model' or 'harness', got {self.stage!r}")
        object.__setattr__(self, "detail", normalise(self.detail, where=f"Report({self.name}).detail"))

    def to_json(self) -> dict[str, Any]:
        """The report as a plain dict."""
        return {"stage": self.stage, "name": self.name, "passed": self.passed, "detail": dict(self.detail)}


@dataclass(frozen=True, slots=True)
class Seal:
    """Integrity fields: the record's place in its hash chain, the span it was sealed in, and its signature."""

    chain_id: str
    seq: int
    prev_id: str
    prev_hash: str
    hash: str
    signature: str
    key_id: str
    span: str | None = None
    """``<trace id>-<span id>`` of the span the record was sealed in (``None``: sealed before places were)."""

    def to_attributes(self) -> Attributes:
        """The seal as span attributes."""
        attrs: Attributes = {
            sc.RECORD_CHAIN_ID: self.chain_id,
            sc.RECORD_SEQ: self.seq,
            sc.RECORD_PREV_ID: self.prev_id,
            sc.RECORD_PREV_HASH: self.prev_hash,
            sc.RECORD_HASH: self.hash,
            sc.RECORD_SIGNATURE: self.signature,
            sc.RECORD_KEY_ID: self.key_id,
        }
        if self.span is not None:
            attrs[sc.RECORD_SPAN] = self.span
        return attrs

    @classmethod
    def from_attributes(cls, attrs: Mapping[str, Any]) -> Seal | None:
        """Read a seal back; ``None`` when the span carries none."""
        if sc.RECORD_HASH not in attrs:
            return None
        return cls(
            chain_id=attrs[sc.RECORD_CHAIN_ID],
            seq=int(attrs[sc.RECORD_SEQ]),
            prev_id=attrs[sc.RECORD_PREV_ID],
            prev_hash=attrs[sc.RECORD_PREV_HASH],
            hash=attrs[sc.RECORD_HASH],
            signature=attrs[sc.RECORD_SIGNATURE],
            key_id=attrs[sc.RECORD_KEY_ID],
            span=attrs.get(sc.RECORD_SPAN),
        )


def _put(attrs: Attributes, key: str, value: Any) -> None:
    if value is not None:
        attrs[key] = value


def id_problem(ids: Mapping[str, Any]) -> str | None:
    """What is wrong with the first of ``ids`` (name -> value) given as anything but text; ``None``: none is.

    A chain looks ids (correlation, session, agent) up as text: a number is stored apart from the typed column every
    chain reads, so its chain would come back empty. Capture refuses one where it is given.
    """
    for name, value in ids.items():
        if value is not None and not isinstance(value, str):
            return f"{name} must be text, got {type(value).__name__} {str(value)[:40]!r} (pass str({name}))"
    return None


@dataclass(frozen=True, slots=True)
class SpanRef:
    """Where a record lives: its span's trace id, span id and start time."""

    trace_id: str = ""
    span_id: str = ""
    start_ns: int = 0


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One consequential decision: what was read, decided, acted on, and the state relied on.

    ``source`` is ``"audit"`` for :func:`otel_replay.audit` records (with a
    snapshot and an action) and ``"tracer"`` for reasoning traces recorded by
    :class:`otel_replay.DecisionTracer` (with rationale and confidence).
    """

    record_id: str
    source: str
    decision_type: str
    snapshot: DependencySnapshot | None = None
    action: Action | None = None
    inputs: Mapping[str, Any] = field(default_factory=dict)
    models: tuple[ModelCall, ...] = ()
    reports: tuple[Report, ...] = ()
    rationale: str | None = None
    confidence: float | None = None
    correlation_id: str | None = None
    session_id: str | None = None
    agent_id: str | None = None
    error: str | None = None
    span: SpanRef = field(default_factory=SpanRef, compare=True)
    seal: Seal | None = None

    @property
    def action_type(self) -> str:
        """The decision's action type (seed 000's name for ``decision_type``)."""
        return self.decision_type

    def to_attributes(self) -> Attributes:
        """The record's content as decision-span attributes (seal excluded)."""
        return self._to_attributes(None)

    def _to_attributes(self, inputs_json: str | None) -> Attributes:
        # inputs_json: canonical_json(self.inputs) when the caller has it already (audit's read() does).
        attrs: Attributes = {
            sc.KIND: sc.KIND_DECISION,
            sc.RECORD_ID: self.record_id,
            sc.RECORD_SOURCE: self.source,
            sc.DECISION_TYPE: self.decision_type,
        }
        # Inline rather than _put(): this runs once per audit() on the agent's thread.
        if self.correlation_id is not None:
            attrs[sc.CORRELATION_ID] = self.correlation_id
        if self.session_id is not None:
            attrs[sc.SESSION_ID] = self.session_id
        if self.agent_id is not None:
            attrs[sc.AGENT_ID] = self.agent_id
        if self.rationale is not None:
            attrs[sc.DECISION_RATIONALE] = self.rationale
        if self.confidence is not None:
            attrs[sc.DECISION_CONFIDENCE] = self.confidence
        if self.error is not None:
            attrs[sc.RECORD_ERROR] = self.error
        if self.inputs:
            attrs[sc.DECISION_INPUTS] = inputs_json or canonical_json(self.inputs, where="decision inputs")
        if self.models:
            attrs[sc.DECISION_MODELS] = _models_json(self.models)
        if self.reports:
            attrs[sc.DECISION_REPORTS] = canonical_json([r.to_json() for r in self.reports], where="reports")
        snapshot = self.snapshot
        if snapshot is not None:
            attrs[sc.SNAPSHOT_STATE] = snapshot.state_json
            if snapshot.version is not None:
                attrs[sc.SNAPSHOT_VERSION] = snapshot.version
            if snapshot.captured_at is not None:
                attrs[sc.SNAPSHOT_CAPTURED_AT] = snapshot.captured_at
        action = self.action
        if action is not None:
            attrs[sc.ACTION_TYPE] = action.type
            attrs[sc.ACTION_ARGUMENTS] = action.arguments_json
            if action.cost is not None:
                attrs[sc.ACTION_COST] = action.cost
        return attrs

    @classmethod
    def from_attributes(cls, attrs: Mapping[str, Any], span: SpanRef) -> DecisionRecord:
        """Rebuild a record from its decision span's attributes."""
        snapshot = None
        if sc.SNAPSHOT_STATE in attrs:
            snapshot = DependencySnapshot(
                state=loads(attrs[sc.SNAPSHOT_STATE]),
                version=attrs.get(sc.SNAPSHOT_VERSION),
                captured_at=attrs.get(sc.SNAPSHOT_CAPTURED_AT),
            )
        action = None
        if sc.ACTION_TYPE in attrs:
            action = Action(
                attrs[sc.ACTION_TYPE], loads(attrs.get(sc.ACTION_ARGUMENTS)) or {}, attrs.get(sc.ACTION_COST)
            )
        models = tuple(ModelCall(**m) for m in loads(attrs.get(sc.DECISION_MODELS)) or ())
        reports = tuple(Report(**r) for r in loads(attrs.get(sc.DECISION_REPORTS)) or ())
        return cls(
            record_id=attrs[sc.RECORD_ID],
            source=attrs.get(sc.RECORD_SOURCE, "audit"),
            decision_type=attrs.get(sc.DECISION_TYPE, ""),
            snapshot=snapshot,
            action=action,
            inputs=loads(attrs.get(sc.DECISION_INPUTS)) or {},
            models=models,
            reports=reports,
            rationale=attrs.get(sc.DECISION_RATIONALE),
            confidence=attrs.get(sc.DECISION_CONFIDENCE),
            correlation_id=attrs.get(sc.CORRELATION_ID),
            session_id=attrs.get(sc.SESSION_ID),
            agent_id=attrs.get(sc.AGENT_ID),
            error=attrs.get(sc.RECORD_ERROR),
            span=span,
            seal=Seal.from_attributes(attrs),
        )


@dataclass(frozen=True, slots=True)
class OutcomeRecord:
    """Whether a decision turned out correct; recorded once per decision."""

    record_id: str
    decision_id: str
    outcome_correct: bool
    note: str | None = None
    correlation_id: str | None = None
    span: SpanRef = field(default_factory=SpanRef)
    seal: Seal | None = None

    def to_attributes(self) -> Attributes:
        """The outcome as span attributes (its ``record_id`` names the decision)."""
        attrs: Attributes = {
            sc.KIND: sc.KIND_OUTCOME,
            sc.RECORD_ID: self.record_id,
            sc.RECORD_SOURCE: "tracer",
            sc.DECISION_TYPE: "outcome",
            sc.OUTCOME_CORRECT: self.outcome_correct,
            sc.OUTCOME_DECISION_ID: self.decision_id,
        }
        _put(attrs, sc.OUTCOME_NOTE, self.note)
        _put(attrs, sc.CORRELATION_ID, self.correlation_id)
        return attrs


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One inter-agent message or system action in the audit log."""

    entry_id: str
    event_type: str
    source_agent: str
    created_at: str
    target_agent: str | None = None
    correlation_id: str | None = None
    session_id: str | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)
    seal: Seal | None = None

    def to_attributes(self) -> Attributes:
        """The entry as span attributes."""
        attrs: Attributes = {
            sc.KIND: sc.KIND_AUDIT_ENTRY,
            sc.RECORD_ID: self.entry_id,
            sc.RECORD_SOURCE: "audit_log",
            sc.AUDIT_EVENT_TYPE: self.event_type,
            sc.AUDIT_SOURCE_AGENT: self.source_agent,
            sc.AUDIT_CREATED_AT: self.created_at,
            sc.AUDIT_PAYLOAD: canonical_json(self.payload, where=f"audit entry {self.entry_id} payload"),
        }
        _put(attrs, sc.AUDIT_TARGET_AGENT, self.target_agent)
        _put(attrs, sc.CORRELATION_ID, self.correlation_id)
        _put(attrs, sc.SESSION_ID, self.session_id)
        return attrs

    def to_json(self) -> dict[str, Any]:
        """The entry as a plain dict, as :meth:`AuditLog.query` returns it."""
        return {
            "entry_id": self.entry_id,
            "event_type": self.event_type,
            "source_agent": self.source_agent,
            "target_agent": self.target_agent,
            "correlation_id": self.correlation_id,
            "session_id": self.session_id,
            "created_at": self.created_at,
            "payload": dict(self.payload),
        }


@dataclass(frozen=True, slots=True)
class GateRecord:
    """What an :class:`ActionGate` did with a verdict (or a commit)."""

    record_id: str
    decision_id: str | None
    stage: str
    fix: str | None
    executed: str
    detail: str
    justified: bool | None = None
    reason: str | None = None
    receipt: Mapping[str, Any] | None = None
    correlation_id: str | None = None
    seal: Seal | None = None
    action: Mapping[str, Any] | None = None
    """A commit's action (:meth:`Action.to_json`): what was committed, which replay judges too."""
    intent_id: str | None = None
    """A commit's (or failed commit's) intent: the gate record written, durably, before the rail was called."""
    decision: Mapping[str, Any] | None = None
    """An intent's decision as it stood when its action was committed (its decision-span attributes, unsealed).

    Sealed with the intent, so a process that dies inside its ``audit()``
    block after the commit still leaves the decision its commit executed.
    """

    def to_attributes(self) -> Attributes:
        """The gate outcome as span attributes."""
        attrs: Attributes = {
            sc.KIND: sc.KIND_GATE,
            sc.RECORD_ID: self.record_id,
            sc.RECORD_SOURCE: "gate",
            sc.GATE_STAGE: self.stage,
            sc.GATE_EXECUTED: self.executed,
            sc.GATE_DETAIL: self.detail,
        }
        _put(attrs, sc.GATE_DECISION_ID, self.decision_id)
        _put(attrs, sc.GATE_FIX, self.fix)
        _put(attrs, sc.GATE_JUSTIFIED, self.justified)
        _put(attrs, sc.GATE_REASON, self.reason)
        _put(attrs, sc.CORRELATION_ID, self.correlation_id)
        if self.receipt is not None:
            attrs[sc.GATE_RECEIPT] = canonical_json(self.receipt, where="gate receipt")
        if self.action is not None:
            attrs[sc.GATE_ACTION] = canonical_json(self.action, where="committed action")
        _put(attrs, sc.GATE_INTENT_ID, self.intent_id)
        if self.decision is not None:
            attrs[sc.GATE_DECISION_RECORD] = canonical_json(self.decision, where="intent decision")
        return attrs


# Capture's hot path builds these frozen records without their generated __init__ (keyword parsing, then an
# object.__setattr__ call per field, ~2 us for a DecisionRecord). Each is filled in as an instance of a plain
# class with the same slots, then becomes the record by __class__ assignment, which Python allows between
# classes of the same layout: plain slot stores, ~6x cheaper. They have no __post_init__ to skip;
# tests/capture/test_capture_fast.py checks each builder against the generated __init__.
_new = object.__new__


def _builder(cls: type) -> type:
    """A plain class with ``cls``'s slots, in order: an instance of it can be turned into a ``cls`` instance."""
    slots = cls.__dict__["__slots__"]  # the field names, in order (dataclass(slots=True))
    return type(f"_{cls.__name__}Builder", (), {"__slots__": slots, "__module__": __name__})


_SpanRefBuilder = _builder(SpanRef)
_ModelCallBuilder = _builder(ModelCall)
_SealBuilder = _builder(Seal)
_DecisionRecordBuilder = _builder(DecisionRecord)


def _span_ref(trace_id: str, span_id: str, start_ns: int) -> SpanRef:
    """``SpanRef(trace_id, span_id, start_ns)``."""
    ref: Any = _new(_SpanRefBuilder)
    ref.trace_id = trace_id
    ref.span_id = span_id
    ref.start_ns = start_ns
    ref.__class__ = SpanRef
    return ref


def _model_call(model_id: str, decision_basis: str) -> ModelCall:
    """``ModelCall(model_id, decision_basis)``: no output (``None`` normalises to itself)."""
    call: Any = _new(_ModelCallBuilder)
    call.model_id = model_id
    call.decision_basis = decision_basis
    call.output = None
    call.__class__ = ModelCall
    return call


def _seal(
    chain_id: str,
    seq: int,
    prev_id: str,
    prev_hash: str,
    digest: str,
    signature: str,
    key_id: str,
    span: str | None = None,
) -> Seal:
    """``Seal(chain_id, seq, prev_id, prev_hash, digest, signature, key_id, span)``."""
    seal: Any = _new(_SealBuilder)
    seal.chain_id = chain_id
    seal.seq = seq
    seal.prev_id = prev_id
    seal.prev_hash = prev_hash
    seal.hash = digest
    seal.signature = signature
    seal.key_id = key_id
    seal.span = span
    seal.__class__ = Seal
    return seal


def _audit_record(
    record_id: str,
    decision_type: str,
    snapshot: DependencySnapshot,
    action: Action | None,
    inputs: Mapping[str, Any],
    models: tuple[ModelCall, ...],
    reports: tuple[Report, ...],
    correlation_id: str | None,
    session_id: str | None,
    agent_id: str | None,
    error: str | None,
    span: SpanRef,
    seal: Seal | None = None,
) -> DecisionRecord:
    """An ``audit()`` record: ``DecisionRecord(source="audit", ...)`` with no rationale or confidence."""
    record: Any = _new(_DecisionRecordBuilder)
    record.record_id = record_id
    record.source = "audit"
    record.decision_type = decision_type
    record.snapshot = snapshot
    record.action = action
    record.inputs = inputs
    record.models = models
    record.reports = reports
    record.rationale = None
    record.confidence = None
    record.correlation_id = correlation_id
    record.session_id = session_id
    record.agent_id = agent_id
    record.error = error
    record.span = span
    record.seal = seal
    record.__class__ = DecisionRecord
    return record


def trace_body(record: DecisionRecord, outcome: OutcomeRecord | None = None) -> dict[str, Any]:
    """A decision as a chain trace, with the fields the ``decisions`` view gives (and its outcome).

    Here, below both, for the tracer's in-process chains and the read side's
    decisions held only by a commit intent: the read side does not import the
    capture path for it.
    """
    snapshot, action = record.snapshot, record.action
    return {
        "record_id": record.record_id,
        "source": record.source,
        "decision_type": record.decision_type,
        "agent_id": record.agent_id,
        "session_id": record.session_id,
        "correlation_id": record.correlation_id,
        "rationale": record.rationale,
        "confidence": record.confidence,
        "inputs": dict(record.inputs) or None,
        "snapshot_state": None if snapshot is None else loads(snapshot.state_json),
        "snapshot_version": None if snapshot is None else snapshot.version,
        "snapshot_captured_at": None if snapshot is None else snapshot.captured_at,
        "action_type": None if action is None else action.type,
        "action_arguments": None if action is None else loads(action.arguments_json),
        "action_cost": None if action is None or action.cost is None else float(action.cost),
        "models": [m.to_json() for m in record.models] or None,
        "error": record.error,
        "record_hash": None if record.seal is None else record.seal.hash,
        "created_at": iso_time(record.span.start_ns),
        "trace_id": record.span.trace_id,
        "span_id": record.span.span_id,
        "outcome_id": None if outcome is None else outcome.record_id,
        "outcome_correct": None if outcome is None else outcome.outcome_correct,
        "outcome_note": None if outcome is None else outcome.note,
        "layer": "trace",
    }
