"""``audit()``: capture one consequential decision as a span tree.

::

    replay.decision   (kind=decision, the record: snapshot, action, seal)
    ├── replay.read   (kind=read: inputs merged across read() calls)
    ├── replay.model  (kind=model, gen_ai.request.model; one per model() call)
    └── replay.act    (kind=act: the action)

The decision span carries the whole record, so one row is enough to rehydrate
and verify it; the child spans give the causal tree, timing, and the GenAI
view any OpenTelemetry backend understands. Reports go as ``replay.report``
events on their stage span (data -> read, model -> the latest model span,
harness -> the decision span).
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Mapping
from contextlib import AbstractContextManager
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Literal

from opentelemetry import baggage, context, trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Span as _SdkSpan
from opentelemetry.trace import Span, Status, StatusCode

from otel_replay import semconv as sc
from otel_replay._json import canonical_json, encode_mapping, flat_mapping_json
from otel_replay._seam import current as _seam_mode  # the record or rerun mode installed here, or None
from otel_replay.capture.recorder import Recorder, get_recorder
from otel_replay.capture.sampling import exported
from otel_replay.capture.sinks import Sink
from otel_replay.errors import CaptureError, RecordingError
from otel_replay.records import (
    Action,
    DecisionRecord,
    DependencySnapshot,
    ModelCall,
    Report,
    _audit_record,
    _model_call,
    _span_ref,
    id_problem,
    new_id,
)
from otel_replay.redaction import message_of, redact

__all__ = ["Decision", "audit", "current_decision"]

_log = logging.getLogger(__name__)


_current: ContextVar[Decision | None] = ContextVar("otel_replay_current_decision", default=None)


def current_decision() -> Decision | None:
    """The decision whose ``audit()`` block encloses this code (``None`` outside one).

    A gated tool called inside the block acts as that decision's action
    instead of opening a decision of its own.
    """
    return _current.get()


_in_blocks: dict[str, Decision] = {}
"""Record id -> the decision of an ``audit()`` block still open (until its decision is sealed), on any thread."""


def decision_in_block(record_id: str) -> Decision | None:
    """The decision ``record_id`` if its ``audit()`` block is still open, on this thread or another (else ``None``).

    A commit made for it on another thread (a thread pool's, ``run_in_executor``: no context is carried there)
    seals the decision as it stands in its intent, as :func:`current_decision` lets one inside the block do.
    """
    return _in_blocks.get(record_id)


_ID_KEYS = (sc.CORRELATION_ID, sc.SESSION_ID, sc.AGENT_ID)


class Decision:
    """The handle :func:`audit` yields. Fill it in; read ``record`` after the block."""

    __slots__ = (
        "_act_span",
        "_action",
        "_base",
        "_ctx",
        "_failure",
        "_ids",
        "_inputs",
        "_inputs_json",
        "_model_spans",
        "_models",
        "_read_span",
        "_record",
        "_recorder",
        "_reports",
        "_snapshot",
        "_span",
        "decision_type",
        "record_id",
    )

    def __init__(
        self,
        record_id: str,
        decision_type: str,
        span: Span,
        base_attrs: dict[str, Any],
        ctx: Context | None = None,
        recorder: Recorder | None = None,
        ids: dict[str, Any] | None = None,
        snapshot: DependencySnapshot | None = None,
    ) -> None:
        """Internal: created by :func:`audit`."""
        self._snapshot = snapshot
        self.record_id = record_id
        self.decision_type = decision_type
        self._span = span
        self._base = base_attrs
        self._ids: dict[str, Any] = ids if ids is not None else {k: base_attrs[k] for k in _ID_KEYS if k in base_attrs}
        # The context the block runs in (the decision span active): the children's parent.
        self._ctx = ctx if ctx is not None else trace.set_span_in_context(span)
        self._recorder = recorder if recorder is not None else get_recorder()
        self._inputs: dict[str, Any] = {}
        self._inputs_json: str | None = None
        self._models: list[ModelCall] = []
        self._reports: list[Report] = []
        self._action: Action | None = None
        self._read_span: Span | None = None
        self._model_spans: list[Span] = []
        self._act_span: Span | None = None
        self._record: DecisionRecord | None = None
        self._failure: str | None = None

    @property
    def record(self) -> DecisionRecord:
        """The sealed record; available once the ``with`` block has exited."""
        if self._record is None:
            if self._failure is not None:
                raise CaptureError(f"decision {self.record_id}: no record: {self._failure}")
            raise CaptureError(f"decision {self.record_id}: the record exists only after the audit block exits")
        return self._record

    def _open(self, method: str) -> None:
        if self._record is not None or self._failure is not None:
            raise CaptureError(
                f"decision {self.record_id}: {method}() after the audit block exited; the record is sealed"
            )

    def _child(self, name: str, kind: str, attrs: dict[str, Any]) -> Span:
        # The scope's ids go in up front, so the span processor has nothing left to add.
        attrs = {**self._ids, sc.KIND: kind, sc.RECORD_ID: self.record_id, **attrs}
        return self._recorder.tracer.start_span(name, context=self._ctx, attributes=attrs)

    def read(self, **inputs: Any) -> Decision:
        """Record what the agent read; merged into the data span's inputs."""
        self._open("read")
        merged = {**self._inputs, **inputs} if self._inputs else inputs
        encoded = flat_mapping_json(merged) or encode_mapping(merged, where=f"decision {self.record_id} read() inputs")
        text, self._inputs = encoded
        self._inputs_json = text
        if self._read_span is None:
            self._read_span = self._child(sc.SPAN_READ, sc.KIND_READ, {sc.READ_INPUTS: text})
        else:
            self._read_span.set_attribute(sc.READ_INPUTS, text)
        return self

    def model(self, model_id: str, decision_basis: str = "", output: Any = None) -> Decision:
        """Record which model produced the output and the basis it stated."""
        self._open("model")
        # No output: built field by field (the generated __init__ and its normalise(None) cost twice as much).
        call = _model_call(model_id, decision_basis) if output is None else ModelCall(model_id, decision_basis, output)
        self._models.append(call)
        attrs: dict[str, Any] = {
            sc.GEN_AI_REQUEST_MODEL: model_id,
            sc.MODEL_DECISION_BASIS: decision_basis,
        }
        if call.output is not None:
            attrs[sc.MODEL_OUTPUT] = canonical_json(call.output, where="model output")
        self._model_spans.append(self._child(sc.SPAN_MODEL, sc.KIND_MODEL, attrs))
        return self

    @property
    def acted(self) -> bool:
        """Whether :meth:`act` was called (a decision has one action)."""
        return self._action is not None

    def act(self, action: Action) -> Decision:
        """Record the action the agent executed (once per decision)."""
        self._open("act")
        if action.__class__ is not Action and not isinstance(action, Action):
            raise CaptureError(f"decision {self.record_id}: act() takes an Action, got {type(action).__name__}")
        if self._action is not None:
            raise CaptureError(f"decision {self.record_id}: act() was already called; one action per decision")
        self._action = action
        attrs: dict[str, Any] = {
            sc.ACTION_TYPE: action.type,
            sc.ACTION_ARGUMENTS: action.arguments_json,
        }
        if action.cost is not None:
            attrs[sc.ACTION_COST] = action.cost
        self._act_span = self._child(sc.SPAN_ACT, sc.KIND_ACT, attrs)
        return self

    def attach(self, report: Report) -> Decision:
        """Route a leaf report to its stage span (data, model or harness)."""
        self._open("attach")
        if not isinstance(report, Report):
            raise CaptureError(f"decision {self.record_id}: attach() takes a Report, got {type(report).__name__}")
        self._reports.append(report)
        target: Span = self._span
        if report.stage == "data" and self._read_span is not None:
            target = self._read_span
        elif report.stage == "model" and self._model_spans:
            target = self._model_spans[-1]
        target.add_event(
            sc.REPORT_EVENT,
            {sc.REPORT_STAGE: report.stage, sc.REPORT_BODY: canonical_json(report.to_json(), where="report")},
        )
        return self

    def _as_acted(self) -> dict[str, Any]:
        """The decision as it stands now (snapshot, reads, model calls, action, reports): its span's attributes.

        What a gate seals in its intent before the rail is called
        (:class:`~otel_replay.records.GateRecord` ``decision``), for when the
        block never ends.
        """
        ids = self._ids
        record = _audit_record(
            self.record_id,
            self.decision_type,
            self._snapshot if self._snapshot is not None else DependencySnapshot({}),
            self._action,
            self._inputs,
            tuple(self._models),
            tuple(self._reports),
            ids.get(sc.CORRELATION_ID),
            ids.get(sc.SESSION_ID),
            ids.get(sc.AGENT_ID),
            None,
            _span_ref("", "", 0),
        )
        attrs = record._to_attributes(self._inputs_json)
        if self._snapshot is None:  # a Decision made without one (not by audit()): none is claimed
            for key in (sc.SNAPSHOT_STATE, sc.SNAPSHOT_VERSION, sc.SNAPSHOT_CAPTURED_AT):
                attrs.pop(key, None)
        return attrs

    def _finish(self, snapshot: DependencySnapshot, error: str | None, start_ns: int) -> DecisionRecord:
        if self._read_span is not None:
            self._read_span.end()
        for child in self._model_spans:
            child.end()
        if self._act_span is not None:
            self._act_span.end()
        ctx = self._span.get_span_context()
        trace_id, span_id = f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"
        base = self._base
        ids = self._ids
        record = _audit_record(
            self.record_id,
            self.decision_type,
            snapshot,
            self._action,
            self._inputs,  # replaced, never mutated, by read(), which is closed from here on
            tuple(self._models),
            tuple(self._reports),
            ids.get(sc.CORRELATION_ID),
            ids.get(sc.SESSION_ID),
            ids.get(sc.AGENT_ID),
            error,
            _span_ref(trace_id, span_id, start_ns),
        )
        attrs = record._to_attributes(self._inputs_json)
        recorder = self._recorder
        recorder.check_destination(sc.SPAN_DECISION, self.record_id)
        # Sealed before the span ends: a decision span that could not be sealed is never emitted.
        # The place is span_place(trace id, span id), from the hex already made for the record's SpanRef.
        # Both under the pipeline's write order (see Recorder._emit): a write-ahead on another thread, which
        # takes the held records under it, never finds this decision sealed and not yet ended.
        write_order = getattr(recorder.pipeline, "write_order", None)
        if write_order is not None:
            write_order.acquire()
        try:
            seal = recorder.chain.seal(self.record_id, sc.SPAN_DECISION, start_ns, attrs, f"{trace_id}-{span_id}")
            # The span started with ``base``: the rest goes on now, in _to_attributes() order (a copy less
            # base's keys is cheaper than filtering every key).
            rest = attrs.copy()
            for key in base:
                rest.pop(key, None)
            _add_sealed(self._span, rest)
            self._span.end()
        finally:
            if write_order is not None:
                write_order.release()
        if recorder.closed:
            recorder.note_lost(f"{sc.SPAN_DECISION} record {self.record_id}")
        # The record is ours alone until returned: stamp the seal in place.
        object.__setattr__(record, "seal", seal)
        self._record = record
        return record


_PLAIN = frozenset((str, int, float, bool))
"""Value types the SDK stores exactly as given (no copy, no conversion) when no length limit applies."""


_SDK_SPANS: dict[type, bool] = {}
"""Per span class: whether it is the SDK's span (the tracer makes a private subclass) with its ``set_attributes``."""


def _add_sealed(span: Span, attrs: dict[str, Any]) -> None:
    """``span.set_attributes(attrs)`` for the sealed rest of a decision record, without cleaning it again.

    The SDK's ``set_attributes`` checks and copies each value (a Python call
    per attribute, 15 per decision) to store it unchanged: every value here
    is a ``str``, ``int``, ``float`` or ``bool`` made by the record, and the
    recorder refused any provider with a value length limit before the block
    began. Where the span is the SDK's own, open, with no length limit, room
    for every attribute and none of these keys yet, they are added under the
    same locks, in the same order, as ``set_attributes`` adds them (the
    stored span is the same; a test compares both); anything else goes
    through ``set_attributes``.
    """
    bounded = getattr(span, "_attributes", None)
    cls = span.__class__
    sdk = _SDK_SPANS.get(cls)
    if sdk is None:
        sdk = issubclass(cls, _SdkSpan) and cls.set_attributes is _SdkSpan.set_attributes
        if len(_SDK_SPANS) < 64:
            _SDK_SPANS[cls] = sdk
    if (
        sdk
        and bounded.__class__ is BoundedAttributes
        and bounded.max_value_len is None
        and not bounded._immutable
        and _PLAIN.issuperset(map(type, attrs.values()))
    ):
        added = False
        sdk_span: Any = span  # the SDK's span: its lock and end time are its own (private) fields
        with sdk_span._lock:
            if sdk_span._end_time is None:
                with bounded._lock:
                    stored = bounded._dict
                    limit = bounded.maxlen
                    if (limit is None or len(stored) + len(attrs) <= limit) and stored.keys().isdisjoint(attrs):
                        stored.update(attrs)
                        added = True
        if added:
            return
    span.set_attributes(attrs)


def _complete(
    decision: Decision, sink: Sink, snapshot: DependencySnapshot, error: str | None, start_ns: int
) -> BaseException | None:
    """Seal, emit and hand over the record; the failure (counted and logged), or ``None``."""
    stage = "sealing and emitting"
    try:
        record = decision._finish(snapshot, error, start_ns)
        stage = "handing it to the sink"
        sink.append(record)
    except Exception as exc:
        decision._failure = f"{stage} failed: {type(exc).__name__}: {exc}"
        decision._recorder.note_capture_error()
        _log.error(
            "otel-replay: decision %s (%s): %s%s",
            decision.record_id,
            decision.decision_type,
            decision._failure,
            f"; the block itself raised {error}" if error else "",
        )
        return exc
    return None


def _report(decision: Decision) -> None:
    """Hand a sealed record to the record or rerun mode in force (its ``decision`` method), if any.

    Straight from here, not through a sink: whatever sink the block was given
    and whichever recorder sealed it (an agent that calls ``configure()``
    itself has a recorder of its own), a recording holds every decision and
    a rerun compares every one. A strict rerun's ``ReplayMismatchError`` from
    here is the rerun stopping, not a recording failure.
    """
    mode = _seam_mode()
    if mode is None:
        return
    record = decision._record
    if record is not None:
        hook = getattr(mode, "decision", None)
        if hook is not None:
            hook(record)
    elif decision._failure is not None:  # never sealed: the mode must not take the run for a match
        lost = getattr(mode, "decision_lost", None)
        if lost is not None:
            lost(decision.record_id, decision.decision_type, decision._failure)


_BAGGAGE_KEY = getattr(baggage, "_BAGGAGE_KEY", None)
"""Where OpenTelemetry keeps baggage in a context (private to it, hence the fallback)."""


def _with_baggage(values: dict[str, object], ctx: Context) -> Context:
    """``ctx`` with its baggage replaced by ``values``: one new context, as a ``set_baggage`` call per key gives."""
    if _BAGGAGE_KEY is not None:
        return context.set_value(_BAGGAGE_KEY, values, ctx)
    for key, value in values.items():  # pragma: no cover - an SDK that keeps baggage elsewhere
        ctx = baggage.set_baggage(key, value, ctx)
    return ctx


def _baggage(ctx: Context) -> Mapping[str, object]:
    """``baggage.get_all(ctx)`` without its read-only view (read here, never changed: a copy is made to change it)."""
    if _BAGGAGE_KEY is not None:
        values = ctx.get(_BAGGAGE_KEY)
        return values if isinstance(values, dict) else {}
    return baggage.get_all(ctx)  # pragma: no cover - an SDK that keeps baggage elsewhere


def _block_ids(
    scope: Mapping[str, object], correlation_id: Any, session_id: Any, agent_id: Any
) -> tuple[dict[str, Any], dict[str, object] | None]:
    """A block's ids (explicit ones first, else the scope's strings) and the baggage to put in scope, if new.

    An explicit id is put in scope for everything inside the block: the
    second value is ``scope`` with the explicit ids that differ from it set
    (``None`` when none differs). The baggage keys are the attribute keys
    (``semconv.BAGGAGE_*``).
    """
    if not scope:  # no baggage (the common case): the explicit ids are the ids and the whole new scope
        ids: dict[str, Any] = {}
        if correlation_id:
            ids[sc.CORRELATION_ID] = correlation_id
        if session_id:
            ids[sc.SESSION_ID] = session_id
        if agent_id:
            ids[sc.AGENT_ID] = agent_id
        return ids, (ids.copy() if ids else None)
    ids = {}
    scoped: dict[str, object] | None = None
    for key, explicit in ((sc.CORRELATION_ID, correlation_id), (sc.SESSION_ID, session_id), (sc.AGENT_ID, agent_id)):
        in_scope = scope.get(key)
        if explicit:
            ids[key] = explicit
            if explicit != in_scope:
                if scoped is None:
                    scoped = dict(scope)
                scoped[key] = explicit
        elif in_scope and isinstance(in_scope, str):
            ids[key] = in_scope
    return ids, scoped


class _AuditBlock:
    """The context manager :func:`audit` returns: opens the decision on entry, seals it on exit."""

    __slots__ = ("_args", "_decision", "_reset", "_sink", "_snapshot", "_start_ns", "_token")

    def __init__(self, action_type: str, snapshot: DependencySnapshot, sink: Sink | None, ids: tuple[Any, ...]) -> None:
        self._args = (action_type, ids)
        self._snapshot = snapshot
        self._sink = sink
        self._decision: Decision | None = None

    def __enter__(self) -> Decision:
        action_type, (correlation_id, session_id, agent_id) = self._args
        snapshot = self._snapshot
        if snapshot.__class__ is not DependencySnapshot and not isinstance(snapshot, DependencySnapshot):
            raise CaptureError(
                f"audit({action_type!r}): snapshot must be a DependencySnapshot, got {type(snapshot).__name__}"
            )
        if not isinstance(action_type, str) or not action_type:
            raise CaptureError("audit(): action_type must be a non-empty string")
        problem = id_problem({"correlation_id": correlation_id, "session_id": session_id, "agent_id": agent_id})
        if problem is not None:  # before the block runs: never an unrecorded act
            raise CaptureError(f"audit({action_type!r}): {problem}")
        if self._decision is not None:
            raise CaptureError(f"audit({action_type!r}): an audit block can be entered once")
        recorder = get_recorder()
        if recorder.closed:
            raise CaptureError(
                f"audit({action_type!r}): the telemetry pipeline was shut down (Telemetry.shutdown()), so this "
                "decision would be lost; call otel_replay.configure() again before capturing"
            )
        recorder.check_tracer()  # a provider that would cut the record: refused before the block's action runs
        ctx = context.get_current()
        scope = _baggage(ctx)
        record_id = new_id()
        ids, scoped = _block_ids(scope, correlation_id, session_id, agent_id)
        base: dict[str, Any] = {
            sc.KIND: sc.KIND_DECISION,
            sc.RECORD_ID: record_id,
            sc.RECORD_SOURCE: "audit",
            sc.DECISION_TYPE: action_type,
            **ids,
        }
        if scoped is not None:
            ctx = _with_baggage(scoped, ctx)
        start_ns = time.time_ns()
        span = recorder.tracer.start_span(sc.SPAN_DECISION, context=ctx, attributes=base, start_time=start_ns)
        if not exported(span) and not recorder.goes_nowhere:  # check_tracer() could not ask this tracer's sampler
            span.end()
            raise CaptureError(
                f"audit({action_type!r}): the tracer's sampler did not sample the decision span, so this decision "
                "would be lost; build the provider with sampler=otel_replay.RecordSampler(...) or use "
                "otel_replay.configure()"
            )
        ctx = trace.set_span_in_context(span, ctx)
        self._token = context.attach(ctx)
        self._start_ns = start_ns
        decision = self._decision = Decision(record_id, action_type, span, base, ctx, recorder, ids, snapshot)
        self._reset = _current.set(decision)
        _in_blocks[record_id] = decision
        return decision

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        decision = self._decision
        assert decision is not None
        _current.reset(self._reset)
        target = self._sink if self._sink is not None else decision._recorder.sink
        if exc_type is not None:
            if exc is None:  # pragma: no cover - the with statement always passes the instance
                exc = exc_type()
            # Stored (the decision's error, its span's status and exception event) through the one redaction
            # engine: a tool that failed with a card number or a bearer token in its message leaks neither.
            error = redact("".join(traceback.format_exception_only(type(exc), exc)).strip())
            decision._span.record_exception(
                exc,
                attributes={
                    "exception.message": redact(message_of(exc)),
                    "exception.stacktrace": redact("".join(traceback.format_exception(exc))),
                },
            )
            decision._span.set_status(Status(StatusCode.ERROR, error))
            context.detach(self._token)
            _complete(decision, target, self._snapshot, error, self._start_ns)  # a failure is logged, never raised
            _in_blocks.pop(decision.record_id, None)  # sealed (and held for a write-ahead) by now, or never will be
            try:
                _report(decision)
            except Exception as report_error:  # a strict rerun's mismatch: the mode keeps it as its divergence
                _log.warning("otel-replay: decision %s: %s", decision.record_id, report_error)
            return False  # the agent's own exception propagates, unchanged
        context.detach(self._token)
        failure = _complete(decision, target, self._snapshot, None, self._start_ns)
        _in_blocks.pop(decision.record_id, None)
        _report(decision)
        if failure is not None:
            raise RecordingError(
                f"decision {decision.record_id} ({decision.decision_type}): the block completed, so its action "
                f"stands, but its record could not be kept: {decision._failure}",
                decision.record_id,
                decision._record,
            ) from failure
        return False


def audit(
    action_type: str,
    *,
    snapshot: DependencySnapshot,
    sink: Sink | None = None,
    correlation_id: str | None = None,
    session_id: str | None = None,
    agent_id: str | None = None,
) -> AbstractContextManager[Decision]:
    """Capture one decision with the dependency state it relied on.

    Yields a :class:`Decision`; fill it with ``read``/``model``/``act``/``attach``.
    On exit the record is sealed (hash-chained and signed), emitted as spans
    through the configured ``TracerProvider`` and appended to ``sink``
    (default: the recorder's in-memory sink). An exception inside the block is
    recorded on the span (status ERROR) and in the record, then re-raised
    unchanged: the same object, with nothing chained in front of it.

    When recording fails (the key, the sink), the failure is logged and counted
    in ``get_recorder().stats.capture_errors``. If the block raised, its own
    exception is what propagates; if the block completed, its action stands
    and :class:`~otel_replay.errors.RecordingError` is raised after it, saying
    so (``.record`` holds the sealed record when only the sink failed).

    Ids not given explicitly are taken from the enclosing
    :func:`otel_replay.correlation`/:func:`otel_replay.session` scope, and the
    explicit ones are put in scope for everything inside the block.

    Raises:
        CaptureError: bad arguments, the pipeline was shut down, or the
            tracer's sampler did not sample the decision span (checked when
            the block is entered, so nothing has happened yet).
        ConfigError: the tracer's provider would cut a sealed record (an
            attribute length limit) or its sampler would drop it here (an
            unsampled parent, a ratio sampler); also checked on entry.
        RecordingError: the block completed but its record could not be kept.

    """
    return _AuditBlock(action_type, snapshot, sink, (correlation_id, session_id, agent_id))
