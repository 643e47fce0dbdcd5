"""Sampling never loses a record: configure() samples every record span; a sampler that would drop one is refused."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import context, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

import otel_replay
from otel_replay import ActionGate, RecordSampler, ReferenceLedger, audit
from otel_replay.capture.recorder import Recorder, get_recorder, set_recorder
from otel_replay.capture.sampling import follows_parent
from otel_replay.errors import CaptureError, ConfigError
from otel_replay.gate import reads
from otel_replay.integrity import SigningKey

from .._support import payment, snapshot

KEY = SigningKey(b"s" * 32)


def _unsampled_parent() -> object:
    """Attach the context of an upstream request whose traceparent ends in -00 (its caller sampled it out)."""
    parent = SpanContext(trace_id=0x1234, span_id=0x5678, is_remote=True, trace_flags=TraceFlags(0))
    return context.attach(trace.set_span_in_context(NonRecordingSpan(parent)))


def _stored(dataset: Path, sql: str) -> Any:
    with otel_replay.open(dataset) as store:
        return store.query(sql).to_pylist()


def test_a_decision_under_an_unsampled_parent_and_its_receipt_are_stored(dataset):
    telemetry = otel_replay.configure(dataset, set_global=False)
    ledger = ReferenceLedger(10_000)
    gate = ActionGate(ledger, dataset=dataset)
    token = _unsampled_parent()
    try:
        with audit("vendor_payment", snapshot=snapshot()) as d:
            d.act(payment())
            gate.commit(payment(), record_id=d.record_id)
    finally:
        context.detach(token)
    assert get_recorder().flush() is True
    assert get_recorder().stats.capture_errors == 0  # this pipeline's recorder (before shutdown restores another)
    telemetry.shutdown()
    with otel_replay.open(dataset) as store:
        assert store.record(d.record_id).action == payment()
        assert [r["receipt_id"] for r in reads.receipts_for(store, d.record_id)] == ["rcpt-0001"]


def test_a_ratio_sampler_in_the_environment_samples_other_spans_but_never_a_record(dataset, monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    telemetry = otel_replay.configure(dataset, set_global=False)
    gate = ActionGate(ReferenceLedger(10**9), dataset=dataset)
    other = telemetry.provider.get_tracer("app")
    for _ in range(20):
        with audit("vendor_payment", snapshot=snapshot()) as d:
            d.act(payment(1))
            gate.commit(payment(1), record_id=d.record_id)
        other.start_span("app.work").end()  # a root span of the app's own: the user's ratio applies
    telemetry.shutdown()
    assert _stored(dataset, "SELECT count(*) AS n FROM decisions") == [{"n": 20}]
    assert _stored(dataset, "SELECT count(*) AS n FROM gates WHERE executed = 'committed'") == [{"n": 20}]
    app = _stored(dataset, "SELECT count(*) AS n FROM spans WHERE name = 'app.work'")[0]["n"]
    assert app < 20  # the user's sampler still governs their own spans


def test_record_sampler_keeps_a_record_spans_attributes_and_delegates_the_rest():
    sampler = RecordSampler(ALWAYS_OFF)
    attrs = {"replay.kind": "gate", "replay.record_id": "r1"}
    kept = sampler.should_sample(None, 1, "replay.gate", attributes=attrs)
    assert kept.decision is Decision.RECORD_AND_SAMPLE and dict(kept.attributes) == attrs
    assert sampler.should_sample(None, 1, "app", attributes={"x": 1}).decision is Decision.DROP
    assert sampler.get_description() == "RecordSampler{AlwaysOffSampler}"


class _Pipeline:
    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.closed = False

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.provider.force_flush(timeout_millis)


def _own_provider(sampler: Sampler) -> tuple[Recorder, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Recorder(provider.get_tracer("tests"), key=KEY, pipeline=_Pipeline(provider)), exporter


def test_a_users_parent_based_sampler_is_refused_before_the_block_and_before_the_rail_under_an_unsampled_parent():
    recorder, exporter = _own_provider(ParentBased(TraceIdRatioBased(1.0)))
    previous = set_recorder(recorder)
    ledger = ReferenceLedger(10_000)
    gate = ActionGate(ledger)
    ran = []
    token = _unsampled_parent()
    try:
        with pytest.raises(ConfigError, match="would drop a sealed record's span under this unsampled parent"):
            with audit("vendor_payment", snapshot=snapshot()):
                ran.append(True)
        with pytest.raises(ConfigError, match="RecordSampler"):
            gate.commit(payment())
    finally:
        context.detach(token)
        set_recorder(previous)
    assert ran == [] and ledger.balance == 10_000 and ledger.entries == []
    assert exporter.get_finished_spans() == ()


def test_a_users_ratio_sampler_is_refused_every_time_not_by_chance():
    recorder, _ = _own_provider(TraceIdRatioBased(0.999))
    previous = set_recorder(recorder)
    try:
        for _ in range(5):
            with pytest.raises(ConfigError, match="for some traces"):
                ActionGate(ReferenceLedger(100)).commit(payment(1))
    finally:
        set_recorder(previous)


class _CoinSampler(Sampler):
    """A user sampler the probe cannot predict: it drops what it likes, whatever the attributes."""

    def __init__(self, drop: bool) -> None:
        self.drop = drop

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None):
        if "sampling-probe" in (attributes or {}).values():
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)
        return SamplingResult(Decision.DROP if self.drop else Decision.RECORD_AND_SAMPLE, attributes)

    def get_description(self) -> str:
        return "Coin"


def test_a_dropped_gate_record_is_counted_logged_and_flush_says_false_and_no_sequence_number_is_used(caplog):
    sampler = _CoinSampler(drop=False)
    recorder, exporter = _own_provider(sampler)
    previous = set_recorder(recorder)
    ledger = ReferenceLedger(10_000)
    gate = ActionGate(ledger)
    try:
        gate.commit(payment(1))  # stored: its intent (sequence 0) and its commit record (1)
        sampler.drop = True
        # Write-ahead: the intent is written before the rail is called, so a record the sampler drops now
        # refuses the commit before any money moves (it used to run the rail and lose the commit record).
        with pytest.raises(CaptureError, match="the tracer's sampler did not sample its span"):
            gate.commit(payment(2))
        assert ledger.balance == 10_000 - 1  # the rail never ran for payment(2)
        sampler.drop = False
        gate.commit(payment(3))
    finally:
        set_recorder(previous)
    gates = [span for span in exporter.get_finished_spans() if span.name == "replay.gate"]
    seqs = [span.attributes["replay.record.seq"] for span in gates]
    assert seqs == [0, 1, 2, 3]  # the refused record took no sequence number: verify sees no gap


def test_an_audit_block_whose_decision_span_is_not_sampled_is_refused_before_its_body():
    recorder, exporter = _own_provider(_CoinSampler(drop=True))
    previous = set_recorder(recorder)
    ran = []
    try:
        with pytest.raises(CaptureError, match="did not sample the decision span"):
            with audit("vendor_payment", snapshot=snapshot()):
                ran.append(True)
    finally:
        set_recorder(previous)
    assert ran == [] and exporter.get_finished_spans() == ()


def test_a_random_user_sampler_wrapped_in_record_sampler_keeps_every_record():
    rng = random.Random(7)

    class Flaky(Sampler):
        def should_sample(self, ctx, trace_id, name, kind=None, attributes=None, links=None, trace_state=None):
            return SamplingResult(Decision.DROP if rng.random() < 0.5 else Decision.RECORD_AND_SAMPLE, attributes)

        def get_description(self) -> str:
            return "Flaky"

    recorder, exporter = _own_provider(RecordSampler(Flaky()))
    previous = set_recorder(recorder)
    try:
        gate = ActionGate(ReferenceLedger(100))
        for _ in range(10):
            gate.commit(payment(1))
    finally:
        set_recorder(previous)
    assert recorder.stats.capture_errors == 0
    gates = [s for s in exporter.get_finished_spans() if s.name == "replay.gate"]
    assert len(gates) == 20  # each commit: its intent, then its commit record
    assert sum(s.attributes["replay.gate.executed"] == "committed" for s in gates) == 10


def _sampled_parent() -> object:
    parent = SpanContext(trace_id=0x1234, span_id=0x5678, is_remote=True, trace_flags=TraceFlags(1))
    return context.attach(trace.set_span_in_context(NonRecordingSpan(parent)))


def test_the_sdk_default_sampler_is_asked_only_for_the_parents_flag_and_still_refuses_an_unsampled_parent():
    provider_sampler = TracerProvider().sampler  # the SDK's default, ParentBased(ALWAYS_ON)
    recorder, exporter = _own_provider(provider_sampler)
    assert follows_parent(recorder.tracer)
    previous = set_recorder(recorder)
    ran = []
    try:
        for attach in (None, _unsampled_parent, _sampled_parent, _unsampled_parent, None):
            token = attach() if attach is not None else None
            try:
                if attach is _unsampled_parent:  # refused every time, also once the sampler is known
                    with pytest.raises(ConfigError, match="under this unsampled parent"):
                        with audit("vendor_payment", snapshot=snapshot()):
                            ran.append("unsampled")
                else:
                    with audit("vendor_payment", snapshot=snapshot()) as d:
                        d.act(payment())
                    ran.append("stored")
            finally:
                if token is not None:
                    context.detach(token)
    finally:
        set_recorder(previous)
    assert ran == ["stored", "stored", "stored"]
    assert len([s for s in exporter.get_finished_spans() if s.name == "replay.decision"]) == 3


def test_a_parent_based_sampler_with_other_delegates_is_probed_not_read_from_the_parents_flag():
    # Samples under an unsampled remote parent: the parent's flag alone would refuse it.
    keeps = ParentBased(ALWAYS_ON, remote_parent_not_sampled=ALWAYS_ON)
    drops = ParentBased(ALWAYS_OFF)  # drops at the root: the parent's flag alone would let it through
    assert not follows_parent(_own_provider(keeps)[0].tracer) and not follows_parent(_own_provider(drops)[0].tracer)
    recorder, exporter = _own_provider(keeps)
    previous = set_recorder(recorder)
    token = _unsampled_parent()
    try:
        with audit("vendor_payment", snapshot=snapshot()) as d:
            d.act(payment())
    finally:
        context.detach(token)
        set_recorder(previous)
    assert [s.name for s in exporter.get_finished_spans()].count("replay.decision") == 1
    recorder, _ = _own_provider(drops)
    previous = set_recorder(recorder)
    try:
        with pytest.raises(ConfigError, match="for some traces"):
            with audit("vendor_payment", snapshot=snapshot()):
                pass
    finally:
        set_recorder(previous)
