"""A durable record whose span the SDK would add nothing to is built without the SDK's span, stored the same.

The same record (same ids, same start, same chain link) goes once through
the span built here and once through the SDK (a span processor added after
``configure()`` makes it take the SDK's path, so that processor sees it);
both must reach the write-ahead log as the same span and the same bytes.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry import context as context_api
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, TraceFlags, TraceState, set_span_in_context

import otel_replay
from otel_replay import semconv as sc
from otel_replay.capture import recorder as recorder_module
from otel_replay.capture.direct_spans import bare_tracer
from otel_replay.capture.log_encoding import RequestEncoder as _RequestEncoder
from otel_replay.integrity import Chain
from otel_replay.records import GateRecord

START_NS = 1_764_000_000_123_456_789


class _Ids:
    """An id generator that hands out the same ids after each ``reset()``."""

    def __init__(self, random: bool) -> None:
        self.random = random
        self.reset()

    def reset(self) -> None:
        self.next = 0x1000

    def generate_span_id(self) -> int:
        self.next += 1
        return self.next

    def generate_trace_id(self) -> int:
        self.next += 1
        return 0xABCDEF0000 + self.next

    def is_trace_id_random(self) -> bool:
        return self.random


class _Seen(SpanProcessor):
    """A processor of the user's: records the spans it is shown."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.started.append(span.name)


def _record(detail: str) -> dict[str, Any]:
    return GateRecord(
        record_id="gate-1",
        decision_id="dec-1",
        stage="commit",
        fix=None,
        executed=sc.GATE_INTENT,
        detail=detail,
        correlation_id="corr-9",
        action={"type": "refund", "arguments": {"amount": 12.5, "to": "r\u00e9sum\u00e9"}},
        decision={"replay.decision.type": "refund", "replay.snapshot.state": '{"a":1}'},
    ).to_attributes()


def _emit_both(tmp_path, monkeypatch, *, parent: SpanContext | None, random: bool, detail: str = "about to refund"):
    """The record through the span built here, then through the SDK's; the spans the log was handed, and the seen."""
    monkeypatch.setattr(recorder_module, "time", SimpleNamespace(time_ns=lambda: START_NS))
    telemetry = otel_replay.configure(tmp_path / "ds", set_global=False)
    try:
        recorder = telemetry.recorder
        assert recorder is not None and telemetry.log is not None
        tracer: Any = recorder.tracer
        ids = tracer.id_generator = _Ids(random)
        key = recorder.chain.key
        logged: list[Any] = []
        enqueue = telemetry.log.enqueue
        monkeypatch.setattr(telemetry.log, "enqueue", lambda spans: (logged.extend(spans), enqueue(spans))[1])
        context = set_span_in_context(NonRecordingSpan(parent)) if parent is not None else None
        seen = _Seen()
        for through_sdk in (False, True):
            if through_sdk:
                telemetry.provider.add_span_processor(seen)
            ids.reset()
            recorder._chain = Chain(key, chain_id="chain-fixed")
            token = _attach(context)
            try:
                ref, seal, durable = recorder.emit_durable(sc.SPAN_GATE, "gate-1", _record(detail))
            finally:
                _detach(token)
            assert durable is True and seal.seq == 0
        return logged, seen
    finally:
        telemetry.shutdown()


def _attach(context: Any) -> Any:
    return context_api.attach(context) if context is not None else None


def _detach(token: Any) -> None:
    if token is not None:
        context_api.detach(token)


REMOTE = SpanContext(
    0x0123456789ABCDEF0123456789ABCDEF,
    0x1122334455667788,
    is_remote=True,
    trace_flags=TraceFlags(TraceFlags.SAMPLED),
    trace_state=TraceState([("vendor", "v=1"), ("other", "x")]),
)


@pytest.mark.parametrize(
    ("parent", "random"), [(None, False), (None, True), (REMOTE, False)], ids=["root", "root-random", "remote-parent"]
)
def test_a_durable_record_is_the_same_span_and_bytes_built_here_or_by_the_sdk(tmp_path, monkeypatch, parent, random):
    (direct, through_sdk), seen = _emit_both(tmp_path, monkeypatch, parent=parent, random=random)
    assert seen.started == [sc.SPAN_GATE]  # the processor added later saw the second one only: it took the SDK's path
    assert type(direct._attributes) is dict and type(through_sdk._attributes) is not dict  # two paths were taken
    assert direct.context == through_sdk.context and direct.parent == through_sdk.parent
    assert direct.context.trace_flags == through_sdk.context.trace_flags
    assert direct.context.trace_state == through_sdk.context.trace_state
    assert list(direct.attributes.items()) == list(through_sdk.attributes.items())  # same keys, same order
    assert (direct.start_time, direct.end_time) == (through_sdk.start_time, through_sdk.end_time) == (START_NS,) * 2
    assert (direct.resource, direct.instrumentation_scope) == (through_sdk.resource, through_sdk.instrumentation_scope)
    assert (direct.kind, direct.status.status_code) == (through_sdk.kind, through_sdk.status.status_code)
    sdk = encode_spans([direct]).SerializeToString(deterministic=True)
    assert sdk == encode_spans([through_sdk]).SerializeToString(deterministic=True)
    assert _RequestEncoder().encode([direct]) == _RequestEncoder().encode([through_sdk])
    if parent is not None:
        assert direct.parent.span_id == REMOTE.span_id and direct.context.trace_id == REMOTE.trace_id


def test_a_record_with_hostile_text_is_the_same_span_built_here_or_by_the_sdk(tmp_path, monkeypatch):
    detail = 'refund "\\u0000" \x00 \u2028 \U0001f600 ' + "x" * 70_000  # control bytes, a long value, non-BMP text
    (direct, through_sdk), _ = _emit_both(tmp_path, monkeypatch, parent=None, random=True, detail=detail)
    assert type(direct._attributes) is dict
    assert _RequestEncoder().encode([direct]) == _RequestEncoder().encode([through_sdk])
    assert encode_spans([direct]).SerializeToString(deterministic=True) == encode_spans(
        [through_sdk]
    ).SerializeToString(deterministic=True)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda a: a.update(extra=["a", "b"]), id="a list value (the SDK makes it a tuple)"),
        pytest.param(lambda a: a.update(extra=None), id="a None value (the SDK drops it)"),
        pytest.param(lambda a: a.update({"": "x"}), id="an empty key (the SDK drops it)"),
        pytest.param(lambda a: a.update({3: "x"}), id="a key that is not text"),
        pytest.param(lambda a: a.update(extra=b"\x00"), id="a bytes value"),
        pytest.param(lambda a: a.update({"replay.record.hash": "forged"}), id="a seal key given in advance"),
        pytest.param(lambda a: a.pop(sc.KIND), id="not a record span (the sampler would ask its delegate)"),
        pytest.param(lambda a: a.update({f"k{i}": i for i in range(1100)}), id="more attributes than the limit"),
    ],
)
def test_a_record_the_sdk_would_change_is_not_built_here(tmp_path, change):
    telemetry = otel_replay.configure(tmp_path / "ds", set_global=False)
    try:
        tracer = telemetry.recorder.tracer  # type: ignore[union-attr]
        attributes = _record("d")
        assert bare_tracer(tracer, telemetry.bare_processors, attributes, ())
        change(attributes)
        assert not bare_tracer(tracer, telemetry.bare_processors, attributes, ())
    finally:
        telemetry.shutdown()


def test_links_another_tracer_or_no_pipeline_processors_take_the_sdks_path(tmp_path):
    from opentelemetry.sdk.trace import TracerProvider

    telemetry = otel_replay.configure(tmp_path / "ds", set_global=False)
    try:
        tracer = telemetry.recorder.tracer  # type: ignore[union-attr]
        attributes = _record("d")
        link = Link(REMOTE)
        assert not bare_tracer(tracer, telemetry.bare_processors, attributes, [link])
        assert not bare_tracer(tracer, None, attributes, ())
        other = TracerProvider(sampler=tracer.sampler).get_tracer("x")  # same sampler, not the pipeline's processors
        assert not bare_tracer(other, telemetry.bare_processors, attributes, ())
        assert not bare_tracer(TracerProvider().get_tracer("y"), telemetry.bare_processors, attributes, ())
    finally:
        telemetry.shutdown()


def test_records_built_here_land_in_the_dataset_and_verify(tmp_path):
    dataset = tmp_path / "ds"
    telemetry = otel_replay.configure(dataset, set_global=False)
    gate = otel_replay.ActionGate(otel_replay.ReferenceLedger(balance=100.0), dataset=dataset)
    snapshot = otel_replay.DependencySnapshot({"budget": 5}, version="v1")
    for i in range(3):
        with otel_replay.audit("refund", snapshot=snapshot, correlation_id=f"c-{i}") as d:
            d.read(order=f"o-{i}")
            action = otel_replay.Action("refund", {"order": f"o-{i}", "note": "r\u00e9sum\u00e9 \U0001f600"}, cost=1.0)
            d.act(action)
            gate.commit(action, record_id=d.record_id)
    try:
        # an intent and a commit record per commit, and the two decisions held for the next intents
        assert telemetry.log is not None and telemetry.log.appended == 8
    finally:
        telemetry.shutdown()
    with otel_replay.open(str(dataset)) as store:
        report = store.verify(None)
        assert report.problems == [] and report.unknown_commits == []
        rows = store.rows("SELECT executed FROM gates ORDER BY recorded_at")
        assert [row["executed"] for row in rows].count("committed") == 3
        assert store.rows("SELECT span_id, count(*) AS n FROM spans GROUP BY span_id HAVING count(*) > 1") == []


def _record_spans(tracer: Any, attributes: dict[str, Any], parent: SpanContext | None) -> list[Any]:
    """The record span built here for ``attributes``, and the same span as a plain ``ReadableSpan``."""
    from opentelemetry.sdk.trace import ReadableSpan

    from otel_replay.capture.direct_spans import RecordSpan, ended_record_span

    context = SpanContext(REMOTE.trace_id, 0x99, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    built = ended_record_span(tracer, parent, context, sc.SPAN_GATE, START_NS, attributes)
    assert type(built) is RecordSpan
    plain = ReadableSpan(
        built.name,
        context=built.context,
        parent=built.parent,
        resource=built.resource,
        attributes=dict(attributes),
        kind=built.kind,
        status=built.status,
        start_time=built.start_time,
        end_time=built.end_time,
        instrumentation_scope=built.instrumentation_scope,
    )
    return [built, plain]


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({}, id="a gate record"),
        pytest.param({sc.GATE_DETAIL: "r\u00e9sum\u00e9 \U0001f600 \x00 \u2028"}, id="non-ASCII and control text"),
        pytest.param({sc.GATE_DETAIL: "d" * 300, sc.AGENT_ID: ""}, id="a text too long to keep, an empty one"),
        pytest.param({sc.GATE_DETAIL: "lone \ud800 surrogate"}, id="a lone surrogate (the SDK's encoder decides)"),
        pytest.param({sc.AGENT_ID: 7, sc.GATE_FIX: 2**70}, id="a kept key holding an int, one past 64 bits"),
    ],
)
@pytest.mark.parametrize("parent", [None, REMOTE], ids=["root", "remote-parent"])
def test_a_record_span_is_written_to_the_log_as_any_span_with_its_fields_is(tmp_path, values, parent):
    from otel_replay.capture import log_encoding

    telemetry = otel_replay.configure(tmp_path / "ds", set_global=False)
    try:
        tracer = telemetry.recorder.tracer  # type: ignore[union-attr]
        attributes = {**_record("about to refund"), **values}
        built, plain = _record_spans(tracer, attributes, parent)
        sdk = encode_spans([plain]).SerializeToString()
        for _ in range(2):  # the second time, the texts that repeat come from what the first one kept
            assert _RequestEncoder().encode([built]) == _RequestEncoder().encode([plain]) == sdk
        kept = dict(log_encoding._repeats)
        assert all(len(value) <= log_encoding._REPEAT_VALUE for _, value in kept)
        assert ("replay.record.source", "gate") in kept
    finally:
        telemetry.shutdown()


def test_a_record_span_keeps_no_more_texts_than_its_bound(tmp_path, monkeypatch):
    from otel_replay.capture import log_encoding

    monkeypatch.setattr(log_encoding, "_repeats", {})
    monkeypatch.setattr(log_encoding, "_REPEATS_KEPT", 16)  # the bound, made small: the same code, fewer records
    telemetry = otel_replay.configure(tmp_path / "ds", set_global=False)
    try:
        tracer = telemetry.recorder.tracer  # type: ignore[union-attr]
        for i in range(log_encoding._REPEATS_KEPT + 20):  # a detail of its own per record: a runaway of kept texts
            built, plain = _record_spans(tracer, {**_record(f"refund {i}"), sc.GATE_DETAIL: f"refund {i}"}, None)
            assert _RequestEncoder().encode([built]) == encode_spans([plain]).SerializeToString()
        assert len(log_encoding._repeats) == log_encoding._REPEATS_KEPT
    finally:
        telemetry.shutdown()


def test_a_pipeline_that_wrote_ahead_is_freed_once_shut_down_and_replaced(tmp_path):
    """Which tracers may have their record spans built here is remembered without keeping a tracer (or its pipeline).

    A tracer holds its provider's span processors and, through them, the
    pipeline: its recorder's sink of up to 10,000 records and its log.
    """
    import gc
    import weakref

    telemetry = otel_replay.configure(tmp_path / "ds", set_global=False)
    gate = otel_replay.ActionGate(otel_replay.ReferenceLedger(balance=10.0), dataset=tmp_path / "ds")
    gate.commit(otel_replay.Action("refund", {"order": "o-1"}, cost=1.0))
    assert telemetry.log is not None and telemetry.log.appended == 2  # an intent and a commit record, written ahead
    telemetry.shutdown()
    gone = weakref.ref(telemetry)
    del telemetry, gate
    later = otel_replay.configure(tmp_path / "other", set_global=False)  # the recorder in use is the new one's
    try:
        gc.collect()
        assert gone() is None
    finally:
        later.shutdown()
