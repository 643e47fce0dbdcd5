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
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from opentelemetry import baggage, context, trace
from opentelemetry.trace import Span, Status, StatusCode

from otel_replay import semconv as sc
from otel_replay._json import canonical_json, encode_mapping
from otel_replay.capture.context import current_ids
from otel_replay.capture.recorder import get_recorder
from otel_replay.capture.sinks import Sink
from otel_replay.errors import CaptureError, RecordingError
from otel_replay.records import Action, DecisionRecord, DependencySnapshot, ModelCall, Report, SpanRef, new_id

__all__ = ["Decision", "audit", "current_decision"]

_log = logging.getLogger(__name__)


_current: ContextVar[Decision | None] = ContextVar("otel_replay_current_decision", default=None)


def current_decision() -> Decision | None:
    """The decision whose ``audit()`` block encloses this code (``None`` outside one).

    A gated tool called inside the block acts as that decision's action
    instead of opening a decision of its own.
    """
    return _current.get()


class Decision:
    """The handle :func:`audit` yields. Fill it in; read ``record`` after the block."""

    def __init__(self, record_id: str, decision_type: str, span: Span, base_attrs: dict[str, Any]) -> None:
        """Internal: created by :func:`audit`."""
        self.record_id = record_id
        self.decision_type = decision_type
        self._span = span
        self._base = base_attrs
        id_keys = (sc.CORRELATION_ID, sc.SESSION_ID, sc.AGENT_ID)
        self._ids: dict[str, Any] = {k: base_attrs[k] for k in id_keys if k in base_attrs}
        self._ctx = trace.set_span_in_context(span)
        self._inputs: dict[str, Any] = {}
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
        return get_recorder().tracer.start_span(name, context=self._ctx, attributes=attrs)

    def read(self, **inputs: Any) -> Decision:
        """Record what the agent read; merged into the data span's inputs."""
        self._open("read")
        where = f"decision {self.record_id} read() inputs"
        text, self._inputs = encode_mapping({**self._inputs, **inputs}, where=where)
        if self._read_span is None:
            self._read_span = self._child(sc.SPAN_READ, sc.KIND_READ, {sc.READ_INPUTS: text})
        else:
            self._read_span.set_attribute(sc.READ_INPUTS, text)
        return self

    def model(self, model_id: str, decision_basis: str = "", output: Any = None) -> Decision:
        """Record which model produced the output and the basis it stated."""
        self._open("model")
        call = ModelCall(model_id, decision_basis, output)
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
        if not isinstance(action, Action):
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

    def _finish(self, snapshot: DependencySnapshot, error: str | None, start_ns: int) -> DecisionRecord:
        for child in (self._read_span, *self._model_spans, self._act_span):
            if child is not None:
                child.end()
        ctx = self._span.get_span_context()
        record = DecisionRecord(
            record_id=self.record_id,
            source="audit",
            decision_type=self.decision_type,
            snapshot=snapshot,
            action=self._action,
            inputs=dict(self._inputs),
            models=tuple(self._models),
            reports=tuple(self._reports),
            correlation_id=self._base.get(sc.CORRELATION_ID),
            session_id=self._base.get(sc.SESSION_ID),
            agent_id=self._base.get(sc.AGENT_ID),
            error=error,
            span=SpanRef(f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}", start_ns),
        )
        attrs = record.to_attributes()
        recorder = get_recorder()
        seal = recorder.chain.seal(self.record_id, sc.SPAN_DECISION, start_ns, attrs)
        self._span.set_attributes({k: v for k, v in attrs.items() if k not in self._base})
        self._span.end()
        if recorder.closed:
            recorder.note_lost(f"{sc.SPAN_DECISION} record {self.record_id}")
        # The record is ours alone until returned: stamp the seal in place.
        object.__setattr__(record, "seal", seal)
        self._record = record
        return record


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
        get_recorder().note_capture_error()
        _log.error(
            "otel-replay: decision %s (%s): %s%s",
            decision.record_id,
            decision.decision_type,
            decision._failure,
            f"; the block itself raised {error}" if error else "",
        )
        return exc
    return None


@contextmanager
def audit(
    action_type: str,
    *,
    snapshot: DependencySnapshot,
    sink: Sink | None = None,
    correlation_id: str | None = None,
    session_id: str | None = None,
    agent_id: str | None = None,
) -> Iterator[Decision]:
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
        CaptureError: bad arguments, or the pipeline was shut down (checked
            before the block runs, so nothing has happened yet).
        RecordingError: the block completed but its record could not be kept.

    """
    if not isinstance(snapshot, DependencySnapshot):
        raise CaptureError(
            f"audit({action_type!r}): snapshot must be a DependencySnapshot, got {type(snapshot).__name__}"
        )
    if not isinstance(action_type, str) or not action_type:
        raise CaptureError("audit(): action_type must be a non-empty string")
    recorder = get_recorder()
    if recorder.closed:
        raise CaptureError(
            f"audit({action_type!r}): the telemetry pipeline was shut down (Telemetry.shutdown()), so this "
            "decision would be lost; call otel_replay.configure() again before capturing"
        )
    scope = current_ids()
    ids = {
        sc.CORRELATION_ID: correlation_id or scope.correlation_id,
        sc.SESSION_ID: session_id or scope.session_id,
        sc.AGENT_ID: agent_id or scope.agent_id,
    }
    record_id = new_id()
    base: dict[str, Any] = {
        sc.KIND: sc.KIND_DECISION,
        sc.RECORD_ID: record_id,
        sc.RECORD_SOURCE: "audit",
        sc.DECISION_TYPE: action_type,
        **{k: v for k, v in ids.items() if v is not None},
    }
    ctx = context.get_current()
    for key, value in ids.items():
        if value is not None:
            ctx = baggage.set_baggage(key, value, ctx)
    start_ns = time.time_ns()
    span = recorder.tracer.start_span(sc.SPAN_DECISION, context=ctx, attributes=base, start_time=start_ns)
    token = context.attach(trace.set_span_in_context(span, ctx))
    decision = Decision(record_id, action_type, span, base)
    target = sink if sink is not None else recorder.sink
    current = _current.set(decision)
    try:
        yield decision
    except BaseException as exc:
        _current.reset(current)
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, error))
        context.detach(token)
        _complete(decision, target, snapshot, error, start_ns)  # a failure here is logged, never raised
        raise  # the agent's own exception, unchanged
    _current.reset(current)
    context.detach(token)
    failure = _complete(decision, target, snapshot, None, start_ns)
    if failure is not None:
        raise RecordingError(
            f"decision {record_id} ({action_type}): the block completed, so its action stands, "
            f"but its record could not be kept: {decision._failure}",
            record_id,
            decision._record,
        ) from failure
