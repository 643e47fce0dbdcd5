"""The write-ahead log's records hold the OTLP message the SDK's encoder makes (issue 20).

A decision or audit entry held for a write-ahead is encoded on the agent's
thread with the gate record that follows it; where its fields say it is of
the known shape (internal, status unset, no events or links, nothing
dropped) it is written by that shape, like a gate record. Either way the
bytes parse as the SDK encoder's message, hostile values included.
"""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from otel_replay import semconv as sc
from otel_replay.capture import log_encoding
from otel_replay.capture.direct_spans import RecordSpan
from otel_replay.capture.log_encoding import RequestEncoder

HOSTILE: dict[str, Any] = {
    sc.KIND: "decision",  # a key whose short texts are kept and reused
    sc.AGENT_ID: "ag\u00e9nt \U0001f600",
    "text": "r\u00e9sum\u00e9 \U0001f600 \x00 nul",
    "empty": "",
    "no": False,
    "yes": True,
    "zero": 0,
    "int64 max": (1 << 63) - 1,
    "int64 min": -(1 << 63),
    "negative zero": -0.0,
    "nan": float("nan"),
    "inf": float("inf"),
    "minus inf": float("-inf"),
    "tiny": 5e-324,
    "strings": ("a", "", "\U0001f600"),
    "ints": [1, -2, 0],
    "bools": [True, False],
    "floats": (1.5, float("nan")),
    "empty list": [],
    "long": "x" * 70_000,
}


def _same(group: list[ReadableSpan]) -> None:
    ours = ExportTraceServiceRequest.FromString(RequestEncoder().encode(group))
    theirs = encode_spans(group)
    assert ours.SerializeToString(deterministic=True) == theirs.SerializeToString(deterministic=True)


def _sdk_spans(attributes: dict[str, Any]) -> list[ReadableSpan]:
    """Spans the SDK ended: some of the known shape (internal, unset, plain), some not."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "caf\u00e9"}, schema_url="https://r/1"),
        span_limits=SpanLimits(max_attributes=30, max_events=1),
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("scope \u00e9", "1.2", schema_url="https://s/2")
    remote = SpanContext(0xABC, 0xDEF, True, TraceFlags(TraceFlags.SAMPLED), TraceState([("k", "v")]))
    with tracer.start_as_current_span("decision \u00e9", attributes=attributes):
        tracer.start_span("", attributes={"a": 1}).end()  # an empty name
        with_event = tracer.start_span("with events", attributes=attributes)
        with_event.add_event("e", {"n": 1}, timestamp=5)
        with_event.add_event("dropped", {})
        with_event.end()
        failed = tracer.start_span("failed", attributes=attributes)
        failed.set_status(Status(StatusCode.ERROR, "boom \u00e9"))
        failed.end()
        ok = tracer.start_span("ok", attributes={"a": 1})
        ok.set_status(Status(StatusCode.OK))
        ok.end()
        tracer.start_span("client", kind=SpanKind.CLIENT, attributes=attributes).end()
        tracer.start_span("too many", attributes={f"a{i}": i for i in range(40)}).end()  # attributes dropped
    tracer.start_span("under a remote parent", context=set_span_in_context(NonRecordingSpan(remote))).end()
    return list(exporter.get_finished_spans())


def _by_hand(attributes: dict[str, Any]) -> ReadableSpan:
    """A ``ReadableSpan`` holding a plain dict, as a span built without the SDK's attribute cleaning does."""
    return ReadableSpan(
        "by hand",
        context=SpanContext(0x1234, 0x5678, is_remote=False),
        parent=SpanContext(0x1234, 0x9ABC, is_remote=True),
        resource=Resource.create({"service.name": "hand"}),
        attributes=attributes,
        instrumentation_scope=InstrumentationScope("hand", "1"),
        start_time=10,
        end_time=20,
    )


def test_held_spans_of_the_known_shape_are_written_by_it_as_the_sdk_encoder_writes_them(monkeypatch):
    spans = _sdk_spans(HOSTILE)
    plain = [s for s in spans if s.name in ("decision \u00e9", "", "under a remote parent")]
    assert len(plain) == 3
    general = log_encoding._span_bytes

    def not_general(span: ReadableSpan) -> bytes:
        raise AssertionError(f"{span.name} was left to the general writer")

    with monkeypatch.context() as patched:
        patched.setattr(log_encoding, "_span_bytes", not_general)
        known = [log_encoding._ended_span_bytes(span) for span in plain]
    assert known == [general(span) for span in plain]
    for _ in range(2):  # the second time, the texts that repeat come from what the first one kept
        for span in spans:
            _same([span])
        _same(spans)  # one record of many spans, of both shapes


def test_a_held_span_with_any_field_the_known_shape_lacks_is_written_by_the_general_writer(monkeypatch):
    spans = [s for s in _sdk_spans(HOSTILE) if s.name in ("with events", "failed", "ok", "client", "too many")]
    assert len(spans) == 5

    def known_shape(*args: Any) -> bytes:
        raise AssertionError("a span of another shape was written as the known one")

    with monkeypatch.context() as patched:
        patched.setattr(log_encoding, "_internal_span_bytes", known_shape)
        for span in spans:
            assert log_encoding._ended_span_bytes(span)
    for span in spans:
        _same([span])


@pytest.mark.parametrize(
    "value",
    [b"\x00\xffbytes", 1 << 64, -(1 << 63) - 1, "\ud800", ("a", 1)],
    ids=["bytes", "past-64-bits", "below-int64", "lone-surrogate", "mixed-sequence"],
)
def test_a_held_span_with_a_value_the_log_writes_otherwise_holds_what_the_sdk_encoder_makes(value):
    span = _by_hand({**HOSTILE, "": "an empty key", "odd": value})
    _same([span])
    record = RecordSpan(
        "replay.gate",
        context=SpanContext(0x1234, 0xDEF0, is_remote=False),
        resource=span.resource,
        attributes={sc.KIND: "gate", "n": 1},
        instrumentation_scope=span.instrumentation_scope,
        start_time=30,
        end_time=30,
    )
    _same([span, record])  # a held span and the gate record after it: one record
