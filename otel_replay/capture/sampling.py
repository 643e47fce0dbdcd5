"""Sampling: a sealed record is audit data, never telemetry to sample away.

A decision made under an unsampled parent (an upstream ``traceparent`` ending
in ``-00``) or under ``OTEL_TRACES_SAMPLER=traceidratio`` would otherwise get
a non-recording span: the record, or a commit's receipt, would never reach
the dataset while the money moved. :class:`RecordSampler` (what
:func:`otel_replay.configure` builds its provider with) samples every span
that carries ``replay.kind`` and leaves every other span to the user's
sampler; :func:`sampling_problem` is the check made before an action runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import sampling
from opentelemetry.trace import Link, Span, SpanKind, Tracer
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

from otel_replay import semconv as sc

__all__ = ["RecordSampler", "always_samples", "exported", "follows_parent", "parent_unsampled", "sampling_problem"]

_PROBE_ATTRIBUTES = {sc.KIND: sc.KIND_DECISION, sc.RECORD_ID: "sampling-probe"}
_UNLUCKY_TRACE_ID = (1 << 128) - 1
"""The trace id a ratio sampler is least likely to sample: a probe with it finds any ratio below 1."""


def _env_sampler() -> sampling.Sampler:
    """The sampler ``OTEL_TRACES_SAMPLER`` names (the SDK's own reading; its default when unset)."""
    reader = getattr(sampling, "_get_from_env_or_default", None)
    return reader() if reader is not None else sampling.DEFAULT_ON  # pragma: no cover - an SDK without it


class RecordSampler(sampling.Sampler):
    """Sample every otel-replay record span; leave every other span to ``delegate``.

    A span whose start attributes carry ``replay.kind`` (a sealed record, a
    decision's read/model/act children, a gated tool call) is always
    recorded and sampled, whatever its parent or trace id: dropping it would
    lose a decision or a receipt. Any other span is sampled as ``delegate``
    says (default: the sampler ``OTEL_TRACES_SAMPLER`` names, else the SDK's
    ``ParentBased(ALWAYS_ON)``), so telemetry volume still follows the
    user's sampling.

    A user with their own ``TracerProvider`` wraps their sampler:
    ``TracerProvider(sampler=RecordSampler(my_sampler))``.
    """

    def __init__(self, delegate: sampling.Sampler | None = None) -> None:
        """Wrap ``delegate`` (see the class docstring)."""
        self.delegate = delegate if delegate is not None else _env_sampler()

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> sampling.SamplingResult:
        """RECORD_AND_SAMPLE for a record span (its attributes kept whole), else the delegate's answer."""
        if attributes is not None and sc.KIND in attributes:
            parent = trace.get_current_span(parent_context).get_span_context()
            state = parent.trace_state if parent.is_valid else None
            # The SDK gives a span the attributes the sampler returns: all of them, or the seal would not match.
            return sampling.SamplingResult(sampling.Decision.RECORD_AND_SAMPLE, attributes, state)
        return self.delegate.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self) -> str:
        """``RecordSampler{<delegate>}``."""
        return f"RecordSampler{{{self.delegate.get_description()}}}"


def exported(span: Span) -> bool:
    """True when ``span`` will reach the exporters: recording, and sampled (a RECORD_ONLY span is not exported)."""
    return span.is_recording() and span.get_span_context().trace_flags.sampled


def _sdk_sampler(tracer: Tracer) -> Any:
    """The SDK sampler behind ``tracer`` (through the API's proxy), or ``None`` when it is not an SDK tracer."""
    real: Any = tracer
    if isinstance(tracer, trace.ProxyTracer):
        real = tracer._tracer  # the global provider's tracer once one is installed
    return getattr(real, "sampler", None)


def always_samples(tracer: Tracer) -> bool:
    """True when ``tracer``'s sampler samples every record span in any context (nothing to probe per call)."""
    sampler = _sdk_sampler(tracer)
    return isinstance(sampler, RecordSampler) or sampler is sampling.ALWAYS_ON


def follows_parent(tracer: Tracer) -> bool:
    """True when ``tracer``'s sampler is the SDK's default, ``ParentBased(ALWAYS_ON)`` with its default delegates.

    Such a sampler samples a record span exactly when there is no parent or
    the parent is sampled, so the check before an action needs only the
    parent's flag (:func:`parent_unsampled`), not a probe of the sampler.
    """
    sampler = _sdk_sampler(tracer)
    if sampler.__class__ is not sampling.ParentBased:
        return False
    on, off = sampling.ALWAYS_ON, sampling.ALWAYS_OFF
    return (
        getattr(sampler, "_root", None) is on
        and getattr(sampler, "_remote_parent_sampled", None) is on
        and getattr(sampler, "_local_parent_sampled", None) is on
        and getattr(sampler, "_remote_parent_not_sampled", None) is off
        and getattr(sampler, "_local_parent_not_sampled", None) is off
    )


def parent_unsampled(ctx: Context | None = None) -> bool:
    """True when the current span in ``ctx`` is a valid parent that is not sampled (a traceparent ending -00)."""
    parent = trace.get_current_span(ctx).get_span_context()
    return parent.is_valid and not parent.trace_flags.sampled


def sampling_problem(tracer: Tracer, ctx: Context | None = None) -> str | None:
    """Why a record span started now in ``ctx`` would not be exported by ``tracer``'s sampler, or ``None``.

    The sampler is asked as the SDK would ask it for a record span here:
    with the current span's trace id under a parent, and otherwise with the
    trace id a ratio sampler is least likely to sample, so a ratio below 1
    is found every time rather than by chance. A tracer that is not the
    SDK's has no sampler to ask (``None``; :meth:`Recorder.emit` still
    refuses a span that turns out not to record).
    """
    sampler = _sdk_sampler(tracer)
    if sampler is None or isinstance(sampler, RecordSampler) or sampler is sampling.ALWAYS_ON:
        return None
    parent = trace.get_current_span(ctx).get_span_context()
    trace_id = parent.trace_id if parent.is_valid else _UNLUCKY_TRACE_ID
    result = sampler.should_sample(ctx, trace_id, sc.SPAN_DECISION, SpanKind.INTERNAL, dict(_PROBE_ATTRIBUTES), [])
    if result.decision.is_sampled():
        return None
    where = (
        "under this unsampled parent span (a traceparent ending in -00)"
        if parent.is_valid and not parent.trace_flags.sampled
        else "for some traces"
    )
    return (
        f"the TracerProvider's sampler {sampler.get_description()} would drop a sealed record's span {where}, "
        "losing the decision or receipt: build the provider with sampler=otel_replay.RecordSampler(your sampler) "
        "or use otel_replay.configure() (its provider samples every record)"
    )
