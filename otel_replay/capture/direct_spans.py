"""A record span made without the SDK's ``Span`` object, for records that go straight to a write-ahead log.

A gate's intent and commit records are sealed, then appended to the
pipeline's write-ahead log (:mod:`otel_replay.capture.write_ahead`), never to
the batch queue. Through the SDK such a record costs a ``Span`` (its
attributes cleaned once at start and again for the seal's, its processors
called at start and end) only to be taken back from the processor chain as
the ``ReadableSpan`` it ends as. Where the SDK would add nothing to that
span, this builds the same ``ReadableSpan`` directly: the ids come from the
tracer's own id generator in the SDK's order (trace id, then span id), the
trace state and flags as the SDK sets them under :class:`RecordSampler`, the
resource and scope are the tracer's. The stored bytes are the same (the
tests compare both ways of making one record).

"Adds nothing" is checked per record (:func:`bare_tracer`): an SDK tracer
of the pipeline made by :func:`otel_replay.configure`, with that pipeline's
span processors and no other, sampling with :class:`RecordSampler`, the
SDK's internal span metrics off, no attribute value length limit and room
for every attribute; no links; every key a non-empty ``str`` not among the
seal's keys, every value a ``str``, ``bool``, ``int`` or ``float`` (values the
SDK keeps as they are). Anything else takes the SDK's path.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from otel_replay import semconv as sc
from otel_replay.capture.sampling import RecordSampler
from otel_replay.integrity import SEAL_KEYS

__all__ = ["RecordSpan", "bare_tracer", "ended_record_span", "record_context"]

_SEALS = frozenset(SEAL_KEYS)
_KEPT = (str, bool, int, float)  # attribute values the SDK stores as they are given (no copy, no conversion)
_UNSET = Status(StatusCode.UNSET)
_SAMPLED = TraceFlags.SAMPLED
_RANDOM = getattr(TraceFlags, "RANDOM_TRACE_ID", 0)  # the W3C "random trace id" flag, where the SDK has it
_SAMPLED_FLAGS = TraceFlags(_SAMPLED)
_RANDOM_FLAGS = TraceFlags(_SAMPLED | _RANDOM)
_NOOP_METRICS = "NoOpTracerMetrics"  # the SDK's span metrics when OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED is off


class RecordSpan(ReadableSpan):
    """An ended record span built by :func:`ended_record_span`: a ``ReadableSpan`` whose shape is known.

    Kind internal, status unset, no events and no links, nothing dropped,
    start and end at one instant, attributes in a plain ``dict``: the
    write-ahead log's encoder writes such a span without reading the fields
    it knows (:mod:`otel_replay.capture.write_ahead`). To everything else it
    is the ``ReadableSpan`` the SDK would have ended.
    """


def _static(tracer: Any) -> bool:
    """What does not change in a tracer's life: SDK tracer, record sampler, no span metrics, no length limit."""
    if tracer.__class__ is not SdkTracer or tracer.sampler.__class__ is not RecordSampler:
        return False
    metrics = getattr(tracer, "_tracer_metrics", None)
    if metrics is None or metrics.__class__.__name__ != _NOOP_METRICS:
        return False
    limits = getattr(tracer, "_span_limits", None)
    if limits is None or limits.max_span_attribute_length is not None:
        return False
    return all(hasattr(tracer, name) for name in ("_instrumentation_scope", "_is_enabled", "id_generator"))


_checked: dict[int, tuple[weakref.ref[Any], bool]] = {}
"""id(tracer) -> (a weak reference to the tracer, whether its static checks passed).

Weak: a tracer holds its provider's span processors, and through them the
pipeline :func:`otel_replay.configure` made (its recorder's sink of up to
10,000 records, its log): a strong reference here kept every pipeline that
once wrote ahead alive after its ``shutdown()``, up to 64 of them.
"""


def bare_tracer(
    tracer: Any, processors: Sequence[Any] | None, attributes: Mapping[str, Any], links: Sequence[Link]
) -> bool:
    """Whether a record span of ``tracer`` with ``attributes`` can be built here: the SDK would add nothing.

    ``processors``: the span processors the pipeline set up (the provider's
    tuple when it was made); any other processor added since, and this answers ``False``.
    """
    if links or processors is None or tracer.__class__ is not SdkTracer:  # (an SDK tracer can be weakly referred to)
        return False
    kept = _checked.get(id(tracer))
    if kept is None or kept[0]() is not tracer:  # not seen, or another tracer that had its id
        if len(_checked) > 64:  # a process has a tracer or two: a runaway number is not all kept
            _checked.clear()
        kept = _checked[id(tracer)] = (weakref.ref(tracer), _static(tracer))
    if not kept[1]:
        return False
    if getattr(tracer.span_processor, "_span_processors", None) is not processors or not tracer._is_enabled():
        return False
    limit = tracer._span_limits.max_span_attributes
    if limit is not None and len(attributes) + len(SEAL_KEYS) > limit:
        return False
    if sc.KIND not in attributes:  # not a record span: the sampler would ask its delegate
        return False
    seals = _SEALS
    for key, value in attributes.items():
        if key.__class__ is not str or not key or key in seals or value.__class__ not in _KEPT:
            return False
    return True


def record_context(tracer: Any) -> tuple[SpanContext | None, SpanContext]:
    """The parent (``None`` at a root) and the context a record span of ``tracer`` gets here, as the SDK gives them.

    As ``Tracer.start_span`` with :class:`RecordSampler`: the current span's
    trace (else a new trace id), then a new span id, sampled; the parent's
    trace state.
    """
    current = trace.get_current_span().get_span_context()
    ids = tracer.id_generator
    parent: SpanContext | None = current if current is not None and current.is_valid else None
    if parent is None:
        trace_id = ids.generate_trace_id()
        random = ids.is_trace_id_random() if hasattr(ids, "is_trace_id_random") else False
        state = None
    else:
        trace_id = parent.trace_id
        random = getattr(parent.trace_flags, "random_trace_id", False)
        state = parent.trace_state
    flags = _RANDOM_FLAGS if random and _RANDOM else _SAMPLED_FLAGS
    context = SpanContext(trace_id, ids.generate_span_id(), is_remote=False, trace_flags=flags, trace_state=state)
    return parent, context


def ended_record_span(
    tracer: Any,
    parent: SpanContext | None,
    context: SpanContext,
    name: str,
    start_ns: int,
    attributes: Mapping[str, Any],
    links: Sequence[Link] = (),
) -> ReadableSpan:
    """The ended span the SDK would hand its processors for this record (it starts and ends at ``start_ns``).

    A :class:`RecordSpan`, which the write-ahead log encodes without reading what it knows of its shape.

    ``links``: links without attributes, as the SDK keeps them (the caller checks their count against the limit).
    """
    made = RecordSpan if not links else ReadableSpan  # a RecordSpan has no links: its encoding skips them
    return made(
        name,
        context=context,
        parent=parent,
        resource=tracer.resource,
        attributes=dict(attributes),
        links=tuple(links),
        kind=SpanKind.INTERNAL,
        instrumentation_info=tracer.instrumentation_info,
        status=_UNSET,
        start_time=start_ns,
        end_time=start_ns,
        instrumentation_scope=tracer._instrumentation_scope,
    )
