from __future__ import annotations

import pytest

import otel_replay
from otel_replay import CaptureError, DecisionTracer, OutcomeAlreadyRecorded, RecordNotFound


def test_outcome_is_recorded_once(telemetry, dataset):
    tracer = DecisionTracer()
    decision = tracer.decision("sizer", "position_sizing", "1.4x", 0.68, {"mult": 1.4})
    outcome = tracer.record_outcome(decision, False, note="moved against us")
    assert outcome.decision_id == decision and outcome.outcome_correct is False
    with pytest.raises(OutcomeAlreadyRecorded, match=f"decision {decision} already has an outcome"):
        tracer.record_outcome(decision, True)
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        rows = store.rows("SELECT * FROM outcomes")
        links = store.rows("SELECT links FROM spans WHERE name = 'replay.outcome'")[0]["links"]
        decision_span = store.decision_span(decision)
    assert [(r["decision_id"], r["outcome_correct"], r["note"]) for r in rows] == [
        (decision, False, "moved against us")
    ]
    assert links[0]["span_id"] == decision_span.span_id


def test_immutability_holds_across_processes_through_the_store(telemetry, dataset):
    first = DecisionTracer()
    decision = first.decision("a", "t", "r")
    first.record_outcome(decision, True)
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        later = DecisionTracer(store=store)  # a new process would start here
        with pytest.raises(OutcomeAlreadyRecorded, match="in .*outcomes are immutable"):
            later.record_outcome(decision, False)
        with pytest.raises(RecordNotFound, match="no decision nope"):
            later.record_outcome("nope", True)
        second = later.decision("a", "t", "r2")
        assert later.record_outcome(second, True).outcome_correct is True


def test_outcomes_view_keeps_only_the_first_outcome(telemetry, dataset):
    # Two tracers without a store cannot see each other; the view still shows one outcome.
    decision = DecisionTracer().decision("a", "t", "r")
    DecisionTracer().record_outcome(decision, True)
    DecisionTracer().record_outcome(decision, False)
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        assert [r["outcome_correct"] for r in store.rows("SELECT * FROM outcomes")] == [True]


def test_bad_tracer_input_is_refused():
    tracer = DecisionTracer()
    with pytest.raises(CaptureError, match=r"confidence must be a number in \[0, 1\]"):
        tracer.decision("a", "t", "r", confidence=1.5)
    with pytest.raises(CaptureError, match="outcome_correct must be True or False"):
        tracer.record_outcome("x", "yes")  # type: ignore[arg-type]
    with pytest.raises(CaptureError, match=r"inputs is not JSON-serialisable: \$\.s is a set"):
        tracer.decision("a", "t", "r", inputs={"s": {1, 2}})
