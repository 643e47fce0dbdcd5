"""The shortcuts on audit()'s hot path give exactly what the plain code gives (issue 9's capture cost)."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib
import json
import pickle
import random
from types import MappingProxyType
from typing import Any

import pytest
from opentelemetry import baggage, context
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_replay import audit, correlation
from otel_replay import semconv as sc
from otel_replay._json import canonical_json
from otel_replay.capture import Recorder, set_recorder
from otel_replay.capture.context import CorrelationSpanProcessor
from otel_replay.integrity import SealCheck, SigningKey, StoredRecord, record_hash
from otel_replay.records import (
    AuditEntry,
    DecisionRecord,
    GateRecord,
    ModelCall,
    OutcomeRecord,
    Report,
    Seal,
    SpanRef,
    _audit_record,
    _model_call,
    _seal,
    _span_ref,
)

from .._support import payment, snapshot

KEY = SigningKey(b"fast-path-key-0123456789")


def _reference_hash(name: str, start_ns: int, attributes: Any) -> str:
    """The record hash as specified: sorted covered keys, type-tagged values, framed as a JSON array."""
    parts = [name, str(int(start_ns))]
    for key in sorted(attributes):
        if key.startswith("replay.") and key not in sc.INTEGRITY_FIELDS:
            value = attributes[key]
            if isinstance(value, str):
                tagged = "s" + value
            elif isinstance(value, bool):
                tagged = "b1" if value else "b0"
            elif isinstance(value, int):
                tagged = f"i{value}"
            elif isinstance(value, float):
                tagged = f"f{value!r}"
            elif isinstance(value, (list, tuple)):
                tagged = "l" + canonical_json(list(value), where="t")
            else:
                tagged = "j" + canonical_json(value, where="t")
            parts += (key, tagged)
    frame = json.dumps(parts, ensure_ascii=False, separators=(",", ":")).encode()
    return hashlib.sha256(frame).hexdigest()


def test_fast_builders_equal_the_generated_init():
    """A field added to a record type must be added to its builder too: this fails until it is."""
    ref = SpanRef("t" * 32, "s" * 16, 7)
    seal = Seal("c", 3, "p", "0" * 64, "h" * 64, "sig", "k")
    record = DecisionRecord(
        record_id="r",
        source="audit",
        decision_type="pay",
        snapshot=snapshot(),
        action=payment(),
        inputs={"a": 1},
        models=(),
        reports=(),
        correlation_id="c",
        session_id=None,
        agent_id="ap",
        error="boom",
        span=ref,
    )
    built = [
        (ref, _span_ref("t" * 32, "s" * 16, 7)),
        (seal, _seal("c", 3, "p", "0" * 64, "h" * 64, "sig", "k")),
        (ModelCall("gpt-x", "PO match"), _model_call("gpt-x", "PO match")),
        (
            record,
            _audit_record("r", "pay", record.snapshot, record.action, {"a": 1}, (), (), "c", None, "ap", "boom", ref),
        ),
    ]
    for plain, fast in built:
        assert type(fast) is type(plain) and fast == plain
        assert _field_values(fast) == _field_values(plain)  # every field set (an unset slot raises)
        assert repr(fast) == repr(plain)
    sealed = _audit_record("r", "pay", record.snapshot, None, {}, (), (), None, None, None, None, ref, seal)
    assert sealed == dataclasses.replace(record, action=None, inputs={}, correlation_id=None, agent_id=None,
                                         error=None, seal=seal)


def _field_values(record: Any) -> dict[str, Any]:
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}


_RECORDS = [
    SpanRef("t" * 32, "s" * 16, 7),
    _span_ref("t" * 32, "s" * 16, 7),
    Seal("c", 3, "p", "0" * 64, "h" * 64, "sig", "k", "t-s"),
    _seal("c", 3, "p", "0" * 64, "h" * 64, "sig", "k", "t-s"),
    ModelCall("gpt-x", "PO match", {"score": 0.9}),
    _model_call("gpt-x", "PO match"),
    Report("data", "fresh", True, {"age_s": 3}),
    AuditEntry("e", "message", "a", "2026-03-02T14:30:00+00:00", payload={"x": [1]}),
    OutcomeRecord("o", "d", True, note="ok"),
    GateRecord("g", "d", "act", None, "yes", "committed", receipt={"id": 1}),
]


@pytest.mark.parametrize("record", _RECORDS, ids=lambda r: type(r).__name__)
def test_records_stay_frozen_equal_copyable_and_picklable(record: Any) -> None:
    """Slotted records (no ``__dict__``) keep what callers rely on: frozen, equal by value, copied, pickled."""
    name = dataclasses.fields(record)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(record, name, "changed")
    assert not hasattr(record, "__dict__")
    for twin in (pickle.loads(pickle.dumps(record)), copy.copy(record), copy.deepcopy(record)):
        assert type(twin) is type(record) and twin == record and repr(twin) == repr(record)
    assert dataclasses.replace(record) == record


def test_audit_records_pickle_and_compare_after_the_block() -> None:
    """A record made by ``audit()`` (fast builders, seal stamped after) round-trips through pickle whole."""
    provider = TracerProvider()
    previous = set_recorder(Recorder(provider.get_tracer("t"), KEY))
    try:
        with audit("pay", snapshot=snapshot()) as decision:
            decision.read(invoice="INV-1")
            decision.model("gpt-x", "PO match")
            decision.act(payment())
    finally:
        set_recorder(previous)
        provider.shutdown()
    record = decision.record
    assert record.seal is not None and record.span.span_id
    twin = pickle.loads(pickle.dumps(record))
    assert twin == record and twin.seal == record.seal and twin.models == record.models
    assert hash(record.span) == hash(twin.span) and {record.seal: 1}[twin.seal] == 1


@pytest.mark.parametrize(
    "attributes",
    [
        {"replay.kind": "decision"},  # one covered key: the getter is not itemgetter's
        {"other": "x", "replay.record.hash": "h"},  # none covered
        {},
        {"replay.b": "x", "replay.a": 1, "zzz": 2, "replay.record.signature": "s", "replay.c": 2.5},
    ],
)
def test_record_hash_is_the_specified_hash_for_any_shape(attributes):
    assert record_hash("n", 5, attributes) == _reference_hash("n", 5, attributes)
    assert record_hash("n", 5, MappingProxyType(attributes)) == _reference_hash("n", 5, attributes)


def test_record_hash_memo_keeps_no_values_and_stays_bounded(monkeypatch):
    """The layout memo is per key set; each call hashes its own values, whatever their type."""
    import otel_replay.integrity as integrity

    rnd = random.Random(9)
    values: list[Any] = ["x", "", "é\u2028", 0, -3, 2**70, True, False, 0.1, 1e20, ["a", 1], ("t",), {"k": [None]}]
    keys = ["replay.a", "replay.b", "replay.record.seq", "other", "replay.record.hash"]
    seen = set()
    for _ in range(300):
        shape = rnd.sample(keys, rnd.randint(0, len(keys)))  # the same keys come back in other orders
        attrs = {k: rnd.choice(values) for k in shape}
        digest = record_hash("replay.decision", 12, attrs)
        assert digest == _reference_hash("replay.decision", 12, attrs), attrs
        seen.add(digest)
    assert len(seen) > 100
    monkeypatch.setattr(integrity, "_LAYOUTS", {})
    monkeypatch.setattr(integrity, "_LAYOUTS_MAX", 3)
    for i in range(10):
        attrs = {f"replay.k{i}": i, "replay.kind": "x"}
        assert record_hash("n", 1, attrs) == _reference_hash("n", 1, attrs)
    assert len(integrity._LAYOUTS) == 3


def test_decision_span_carries_exactly_the_sealed_record_and_other_baggage_survives():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(CorrelationSpanProcessor())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    previous = set_recorder(Recorder(provider.get_tracer(sc.INSTRUMENTATION_NAME), KEY))
    try:
        token = context.attach(baggage.set_baggage("tenant", "t-9"))
        try:
            with correlation("c-1"), audit("pay", snapshot=snapshot(), agent_id="ap", session_id="s-2") as d:
                inside = dict(baggage.get_all())
                d.read(invoice="INV-1")
                d.model("gpt-x", decision_basis="PO match")
                d.act(payment())
            after = dict(baggage.get_all())
        finally:
            context.detach(token)
    finally:
        set_recorder(previous)
        provider.shutdown()
    assert inside == {"tenant": "t-9", sc.BAGGAGE_CORRELATION_ID: "c-1", sc.BAGGAGE_AGENT_ID: "ap",
                      sc.BAGGAGE_SESSION_ID: "s-2"}  # fmt: skip
    assert after == {"tenant": "t-9"}
    record = d.record
    (span,) = [s for s in exporter.get_finished_spans() if s.name == sc.SPAN_DECISION]
    attrs = dict(span.attributes or {})
    assert attrs == {**record.to_attributes(), **record.seal.to_attributes()}
    assert (record.correlation_id, record.session_id, record.agent_id) == ("c-1", "s-2", "ap")
    assert record.span == SpanRef(f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}", span.start_time)
    assert record_hash(span.name, span.start_time, attrs) == record.seal.hash == _reference_hash(
        span.name, span.start_time, attrs
    )
    here = (record.span.trace_id, record.span.span_id)
    stored = StoredRecord(record.record_id, span.name, span.start_time, attrs, "", *here)
    assert SealCheck(KEY).problem(stored) == (None, True)
    assert attrs[sc.RECORD_SPAN] == "-".join(here)  # the place is sealed with the record
    moved = StoredRecord(record.record_id, span.name, span.start_time, attrs, "", here[0], "0" * 16)
    assert SealCheck(KEY).problem(moved)[0].startswith("stored at another span than it was sealed in")


# --- record ids come from a pool of OS randomness --------------------------------------------------


def test_record_ids_are_unique_across_threads_and_pool_refills():
    from concurrent.futures import ThreadPoolExecutor

    from otel_replay.records import _ID_POOL_BYTES, new_id

    per_thread = 3 * _ID_POOL_BYTES // 16  # every thread crosses pool refills
    with ThreadPoolExecutor(8) as pool:
        batches = list(pool.map(lambda _: [new_id() for _ in range(per_thread)], range(8)))
    ids = [i for batch in batches for i in batch]
    assert len(set(ids)) == len(ids) == 8 * per_thread
    assert all(len(i) == 32 and int(i, 16) >= 0 and i == i.lower() for i in ids[:50])


def test_a_forked_child_never_hands_out_its_parents_pooled_ids():
    from otel_replay.records import new_id

    from .._support import in_forked_child

    new_id()  # the pool now holds 255 ids the parent has not handed out yet
    child = set(in_forked_child(lambda: [new_id() for _ in range(100)]))
    parent = {new_id() for _ in range(100)}
    assert len(child) == 100 and not child & parent


# --- the sealed rest of a decision goes onto its span without the SDK cleaning it again -------------


def _span_pair(limits: SpanLimits | None = None) -> tuple[Any, Any]:
    provider = TracerProvider(span_limits=limits) if limits is not None else TracerProvider()
    tracer = provider.get_tracer("tests")
    start = {sc.KIND: sc.KIND_DECISION, sc.RECORD_ID: "r" * 32, "other": "x"}
    return tracer.start_span(sc.SPAN_DECISION, attributes=start), tracer.start_span(sc.SPAN_DECISION, attributes=start)


_REST = {sc.SNAPSHOT_STATE: '{"a":1}', sc.ACTION_COST: 4200, sc.RECORD_SEQ: 7, sc.DECISION_CONFIDENCE: 0.5,
         "replay.flag": True, sc.RECORD_HASH: "h" * 64}  # fmt: skip


@pytest.mark.parametrize(
    ("case", "limits", "rest", "fast"),
    [
        ("plain values", None, _REST, True),
        ("a key the span has already", None, {**_REST, "other": "y"}, False),
        ("more attributes than the count limit", SpanLimits(max_span_attributes=5), _REST, False),
        ("a value length limit", SpanLimits(max_span_attribute_length=3), _REST, False),
        ("a list value", None, {**_REST, "replay.list": ["a", 1]}, False),
        ("a value of no attribute type", None, {**_REST, "replay.obj": object()}, False),
        ("a str subclass value", None, {**_REST, "replay.sub": type("S", (str,), {})("v")}, False),
    ],
)
def test_the_sealed_rest_is_stored_as_set_attributes_stores_it(monkeypatch, case, limits, rest, fast):
    from opentelemetry.sdk.trace import Span as SdkSpan

    audit_module = importlib.import_module("otel_replay.capture.audit")  # the package exports audit() by that name
    ours, theirs = _span_pair(limits)
    theirs.set_attributes(rest)
    calls = []
    through_sdk = SdkSpan.set_attributes
    monkeypatch.setattr(SdkSpan, "set_attributes", lambda span, attrs: calls.append(1) or through_sdk(span, attrs))
    audit_module._add_sealed(ours, dict(rest))
    assert calls == ([] if fast else [1]), case
    assert list(ours.attributes.items()) == list(theirs.attributes.items())  # same values, same order
    assert ours.dropped_attributes == theirs.dropped_attributes


def test_the_sealed_rest_of_an_ended_span_is_ignored_as_the_sdk_ignores_it(caplog):
    audit_module = importlib.import_module("otel_replay.capture.audit")
    ours, theirs = _span_pair()
    ours.end()
    theirs.end()
    theirs.set_attributes(_REST)
    audit_module._add_sealed(ours, dict(_REST))
    assert list(ours.attributes.items()) == list(theirs.attributes.items())
    assert sc.RECORD_HASH not in ours.attributes
    assert caplog.text.count("Setting attribute on ended span") == 2


# --- the default sink takes no lock per record ------------------------------------------------------


def test_the_default_sink_keeps_the_newest_records_while_threads_append_and_others_read():
    import threading

    from otel_replay.capture.sinks import MemorySink

    sink = MemorySink(maxlen=500)
    made = [[(t, i) for i in range(4_000)] for t in range(4)]
    failures: list[BaseException] = []
    done = threading.Event()

    def append(items: list[tuple[int, int]]) -> None:
        for item in items:
            sink.append(item)

    def read() -> None:
        try:
            while not done.is_set():
                seen = list(sink)
                assert len(seen) <= 500
                with pytest.raises(KeyError):
                    sink.get("no such record")
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failures.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=append, args=(items,)) for items in made]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    done.set()
    reader.join()
    assert failures == []
    kept = list(sink)
    assert len(kept) == len(sink) == 500
    assert len(set(kept)) == 500 and set(kept) <= {item for items in made for item in items}
    for t in range(4):  # each thread's records are kept in the order it appended them
        mine = [i for thread, i in kept if thread == t]
        assert mine == sorted(mine)


def test_a_sink_subclass_keeps_its_own_append():
    from otel_replay.capture.sinks import MemorySink

    class Upper(MemorySink):
        def append(self, record: Any) -> None:
            super().append(record.upper())

    sink = Upper()
    sink.append("abc")
    assert list(sink) == ["ABC"]
    plain = MemorySink(maxlen=2)
    for record in ("a", "b", "c"):
        plain.append(record)
    assert list(plain) == ["b", "c"]


# --- the models list written without canonical_json's check, the block's ids without a loop -----------------


class _Label(str):
    """A ``str`` subclass: json and orjson could write it differently, so it takes canonical_json's path."""


@pytest.mark.parametrize(
    "models",
    [
        (_model_call("gpt-x", "PO match"),),
        (_model_call("gpt-x", ""), _model_call("claude", "grounded in \"the\" PO\n\u00e9\u4e2d\U0001f600")),
        (_model_call("gpt-x", "b"), ModelCall("m2", "b", {"z": 1, "a": [1, 2.5, None]})),
        (ModelCall("m", "b", 0.1),),
        (_model_call(7, "b"),),
        (_model_call(_Label("gpt-x"), "b"),),
        (_model_call("gpt-x", "lone \ud800 surrogate"),),
        (_model_call("x" * 5000, "b" * 5000),),
    ],
    ids=["one", "escapes", "with-output", "float-output", "int-id", "str-subclass", "surrogate", "long"],
)
def test_the_models_attribute_is_canonical_json_byte_for_byte(models: tuple[ModelCall, ...]) -> None:
    from otel_replay.records import _models_json

    expected = canonical_json([m.to_json() for m in models], where="models")
    assert _models_json(models) == expected
    ref = _span_ref("", "", 0)
    record = _audit_record("r" * 32, "pay", snapshot(), None, {}, models, (), None, None, None, None, ref)
    assert record.to_attributes()[sc.DECISION_MODELS] == expected
    assert DecisionRecord.from_attributes(record.to_attributes(), SpanRef()).models == models


def _reference_block_ids(scope: Any, correlation_id: Any, session_id: Any, agent_id: Any) -> tuple[Any, Any]:
    """What audit() takes as a block's ids and its new baggage, written out as the docstring says."""
    ids: dict[str, Any] = {}
    scoped = None
    keys = (sc.CORRELATION_ID, sc.SESSION_ID, sc.AGENT_ID)
    for key, explicit in zip(keys, (correlation_id, session_id, agent_id), strict=True):
        if explicit:
            ids[key] = explicit
            if explicit != scope.get(key):
                scoped = dict(scope) if scoped is None else scoped
                scoped[key] = explicit
        elif scope.get(key) and isinstance(scope.get(key), str):
            ids[key] = scope[key]
    return ids, scoped


def test_a_blocks_ids_and_new_baggage_follow_the_rule_in_every_combination() -> None:
    audit_module = importlib.import_module("otel_replay.capture.audit")
    scopes = [
        {},
        {sc.CORRELATION_ID: "c-1"},
        {sc.CORRELATION_ID: "c-2", "tenant": "t-9"},
        {sc.AGENT_ID: 5, sc.SESSION_ID: "s"},
        {sc.SESSION_ID: "", "tenant": "t"},
    ]
    values = [None, "", "c-1", "s", 7]
    for scope in scopes:
        for ids in [(c, s, a) for c in values for s in values for a in values]:
            got = audit_module._block_ids(scope, *ids)
            want = _reference_block_ids(scope, *ids)
            assert got == want, (scope, ids)
            assert [None if x is None else list(x) for x in got] == [None if x is None else list(x) for x in want]
            if got[1] is not None:
                assert got[1] is not got[0] and got[1] is not scope  # the baggage put in scope is a dict of its own


def test_explicit_ids_with_no_baggage_are_in_scope_inside_the_block_only() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(CorrelationSpanProcessor())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    previous = set_recorder(Recorder(provider.get_tracer(sc.INSTRUMENTATION_NAME), KEY))
    try:
        before = dict(baggage.get_all())
        with audit("pay", snapshot=snapshot(), correlation_id="c-1", agent_id="ap") as d:
            inside = dict(baggage.get_all())
            with provider.get_tracer("other").start_as_current_span("http-call"):
                pass
            d.read(invoice="INV-1")
            d.act(payment())
        after = dict(baggage.get_all())
    finally:
        set_recorder(previous)
        provider.shutdown()
    assert before == after == {}
    assert inside == {sc.BAGGAGE_CORRELATION_ID: "c-1", sc.BAGGAGE_AGENT_ID: "ap"}
    assert (d.record.correlation_id, d.record.session_id, d.record.agent_id) == ("c-1", None, "ap")
    spans = {s.name: dict(s.attributes or {}) for s in exporter.get_finished_spans()}
    for name in (sc.SPAN_DECISION, sc.SPAN_READ, sc.SPAN_ACT, "http-call"):
        assert (spans[name].get(sc.CORRELATION_ID), spans[name].get(sc.AGENT_ID)) == ("c-1", "ap"), name
        assert sc.SESSION_ID not in spans[name], name
    assert list(spans[sc.SPAN_DECISION])[:6] == [
        sc.KIND, sc.RECORD_ID, sc.RECORD_SOURCE, sc.DECISION_TYPE, sc.CORRELATION_ID, sc.AGENT_ID
    ]  # fmt: skip
