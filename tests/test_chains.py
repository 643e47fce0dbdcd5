from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import otel_replay
from otel_replay import AuditLog, DecisionTracer, OtelReplayError, ReplayBuilder, correlation, session

T0 = datetime(2026, 3, 2, 14, 30, tzinfo=UTC)


def test_trade_chain_sorts_audit_entries_by_created_at_not_arrival(telemetry, dataset):
    log, tracer = AuditLog(), DecisionTracer()
    with correlation("trade-1"):
        # Arrival order differs from the writers' clocks.
        log.append("approval_requested", source_agent="sizer", created_at=T0 + timedelta(seconds=3))
        log.append("signal_received", source_agent="router", created_at=T0)
        log.append("evaluation_sent", source_agent="foresight", created_at=T0 + timedelta(seconds=1))
        first = tracer.decision("foresight", "signal_evaluation", "bullish", 0.74, {"signal": "S1"})
        second = tracer.decision("sizer", "position_sizing", "1.4x", 0.68, {"mult": 1.4})
    with correlation("trade-2"):
        log.append("unrelated", source_agent="x", created_at=T0)
    tracer.record_outcome(second, False)
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        chain = ReplayBuilder(store).build_trade_chain("trade-1")
    assert chain.chain_type == "trade" and chain.chain_id == "trade-1"
    assert [e["event_type"] for e in chain.audit_entries] == [
        "signal_received",
        "evaluation_sent",
        "approval_requested",
    ]
    assert [t["record_id"] for t in chain.traces] == [first, second]
    sizing = chain.traces[1]
    assert sizing["rationale"] == "1.4x" and sizing["confidence"] == 0.68 and sizing["inputs"] == {"mult": 1.4}
    assert sizing["outcome_correct"] is False and chain.traces[0]["outcome_correct"] is None
    assert len(chain.events) == 5


def test_session_chain_has_traces_only(telemetry, dataset):
    log, tracer = AuditLog(), DecisionTracer()
    with session("sess-9"), correlation("c"):
        tracer.decision("a", "step", "r1")
        tracer.decision("a", "step", "r2")
        log.append("msg", source_agent="a")
    tracer.decision("a", "step", "elsewhere", session_id="other")
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        chain = ReplayBuilder(store).build_session_chain("sess-9")
    assert [t["rationale"] for t in chain.traces] == ["r1", "r2"] and chain.audit_entries == []


def test_incident_chain_has_audit_entries_only(telemetry, dataset):
    log, tracer = AuditLog(), DecisionTracer()
    with correlation("inc-7"):
        log.append("kill_switch", source_agent="risk", created_at=T0 + timedelta(seconds=5))
        log.append("breach_detected", source_agent="monitor", created_at=T0)
        tracer.decision("risk", "halt", "drawdown")
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        chain = ReplayBuilder(store).build_incident_chain("inc-7")
    assert [e["event_type"] for e in chain.audit_entries] == ["breach_detected", "kill_switch"]
    assert chain.traces == []


def test_limits_default_per_chain_type(telemetry, dataset):
    log = AuditLog()
    with correlation("big"):
        for i in range(520):
            log.append("tick", source_agent="a", created_at=T0 + timedelta(seconds=i))
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        builder = ReplayBuilder(store)
        assert len(builder.build_trade_chain("big").audit_entries) == 100
        assert len(builder.build_directive_chain("big").audit_entries) == 500
        incident = builder.build_incident_chain("big")
        assert len(incident.audit_entries) == 500
        assert incident.audit_entries[0]["payload"] == {} and incident.audit_entries[-1]["created_at"].endswith(
            "14:38:19+00"
        )
        assert len(builder.build_trade_chain("big", limit=7).audit_entries) == 7
        with pytest.raises(OtelReplayError, match="unknown chain type"):
            builder.build("weekly", "big")


def test_audit_log_query_in_process_and_from_store(telemetry, dataset):
    log = AuditLog()
    with correlation("q"):
        log.append("b", source_agent="x", created_at=T0 + timedelta(seconds=1), payload={"k": 1})
        log.append("a", source_agent="x", created_at=T0)
    log.append("other", source_agent="x")
    assert [e["event_type"] for e in log.query(correlation_id="q")] == ["b", "a"]
    assert len(log.query(limit=2)) == 2
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        stored = AuditLog(store=store).query(correlation_id="q")
    assert [e["event_type"] for e in stored] == ["b", "a"] and stored[0]["payload"] == {"k": 1}


def test_causal_tree_and_calibration(telemetry, dataset):
    from otel_replay import audit

    from ._support import payment, snapshot

    with audit("vendor_payment", snapshot=snapshot()) as d:
        d.read(x=1)
        d.model("m")
        d.act(payment())
    tracer = DecisionTracer()
    for conf, correct in [(0.95, True), (0.91, True), (0.92, False), (0.55, True), (0.51, False), (0.12, False)]:
        tracer.record_outcome(tracer.decision("a", "sizing", "r", conf), correct)
    tracer.record_outcome(tracer.decision("a", "other", "r", 0.99), False)
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        tree = store.causal_tree(d.record_id)
        calib = store.calibration("sizing")
        everything = store.calibration()
    assert [(t["depth"], t["name"]) for t in tree] == [
        (0, "replay.decision"),
        (1, "replay.read"),
        (1, "replay.model"),
        (1, "replay.act"),
    ]
    assert [(c["bucket"], c["decisions"], c["correct"]) for c in calib] == [(0.1, 1, 0), (0.5, 2, 1), (0.9, 3, 2)]
    assert sum(c["decisions"] for c in everything) == 7


def test_audit_entry_timestamps_must_be_iso_with_offset():
    from otel_replay import CaptureError

    log = AuditLog()
    with pytest.raises(CaptureError, match="not ISO-8601"):
        log.append("x", source_agent="a", created_at="yesterday")
    with pytest.raises(CaptureError, match="no UTC offset"):
        log.append("x", source_agent="a", created_at="2026-03-02T14:30:00")
    naive = log.append("x", source_agent="a", created_at=datetime(2026, 3, 2, 14, 30))
    assert naive.created_at == "2026-03-02T14:30:00+00:00"
