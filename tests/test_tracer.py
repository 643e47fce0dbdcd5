from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

import otel_replay
from otel_replay import CaptureError, DecisionTracer, OutcomeAlreadyRecorded, RecordNotFound
from otel_replay.capture.recorder import Recorder, set_recorder
from otel_replay.cli import main


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
    # A dataset written before outcome claims existed (here: the claim removed) may hold two outcomes;
    # the view still shows one.
    decision = DecisionTracer().decision("a", "t", "r")
    DecisionTracer().record_outcome(decision, True)
    (dataset / "_outcomes" / f"{decision}.json").unlink()
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


def _second_process_outcome(dataset, decision: str) -> str:
    """Another process (a store on the dataset) records a contradicting outcome; what it printed."""
    child = textwrap.dedent(f"""
        import otel_replay
        from otel_replay import DecisionTracer
        from otel_replay.errors import OutcomeAlreadyRecorded
        telemetry = otel_replay.configure({str(dataset)!r}, set_global=False)
        with otel_replay.open({str(dataset)!r}) as store:
            try:
                DecisionTracer(store=store).record_outcome({decision!r}, False, "defaulted")
                print("accepted")
            except OutcomeAlreadyRecorded as e:
                print("refused:", e)
        telemetry.shutdown()
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=os.environ, check=True)
    return done.stdout.strip()


def test_an_unflushed_outcome_of_another_process_still_refuses_a_second(telemetry, dataset):
    tracer = DecisionTracer()
    decision = tracer.decision("agent-a", "approve_loan", "looks fine", 0.9, correlation_id="loan-7")
    telemetry.force_flush()  # the decision is in the dataset; its outcome will not be, yet
    tracer.record_outcome(decision, True, "repaid")
    said = _second_process_outcome(dataset, decision)
    assert said.startswith("refused:") and f"decision {decision} already has an outcome: claimed by pid" in said
    assert "_outcomes" in said
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        assert store.verified_outcomes([decision])[decision]["outcome_correct"] is True
        traces = DecisionTracer(store=store).query_traces(correlation_id="loan-7")
    assert [(t["record_id"], t["outcome_correct"]) for t in traces] == [(decision, True)]


def test_two_tracers_in_one_process_share_the_datasets_claim(telemetry, dataset):
    decision = DecisionTracer().decision("a", "t", "r")
    DecisionTracer().record_outcome(decision, True)
    with pytest.raises(OutcomeAlreadyRecorded, match=f"{decision}.json"):
        DecisionTracer().record_outcome(decision, False)
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        assert [r["outcome_correct"] for r in store.rows("SELECT * FROM outcomes")] == [True]


def test_an_outcome_whose_emit_failed_can_be_recorded_again(telemetry, dataset, monkeypatch):
    tracer = DecisionTracer()
    decision = tracer.decision("a", "t", "r")
    # A recorder on the same dataset that finds its key bad only when it seals: the emit raises.
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", "short")
    previous = set_recorder(Recorder(dataset=str(dataset)))
    try:
        with pytest.raises(otel_replay.ConfigError, match="signing key is too short"):
            tracer.record_outcome(decision, True)
    finally:
        set_recorder(previous)
        monkeypatch.undo()
    assert not (dataset / "_outcomes" / f"{decision}.json").exists()  # the claim was given back
    assert tracer.record_outcome(decision, True).outcome_correct is True
    with pytest.raises(OutcomeAlreadyRecorded):
        tracer.record_outcome(decision, False)


def test_an_outcome_after_shutdown_is_refused_not_lost(dataset):
    telemetry = otel_replay.configure(dataset, set_global=False)
    tracer = DecisionTracer()
    decision = tracer.decision("a", "t", "r")
    telemetry.shutdown()
    previous = set_recorder(telemetry.recorder)  # a recorder still current after its pipeline was shut down
    try:
        with pytest.raises(CaptureError, match="pipeline was shut down"):
            tracer.record_outcome(decision, True)
        assert telemetry.recorder.stats.dropped_after_shutdown == 0
    finally:
        set_recorder(previous)
    assert not (dataset / "_outcomes").exists()
    again = otel_replay.configure(dataset, set_global=False)
    try:
        assert tracer.record_outcome(decision, True).outcome_correct is True
    finally:
        again.shutdown()


def test_a_decision_id_that_is_no_file_name_gets_a_hashed_claim(telemetry, dataset):
    tracer = DecisionTracer()
    with pytest.raises(RecordNotFound):
        with otel_replay.open(dataset) as store:
            DecisionTracer(store=store).record_outcome("../../etc/passwd", True)
    tracer.record_outcome("../x y", True)  # no store: an id the tracer has not seen is still claimed
    names = os.listdir(dataset / "_outcomes")
    assert len(names) == 1 and names[0].startswith("sha256-")
    with pytest.raises(OutcomeAlreadyRecorded):
        DecisionTracer().record_outcome("../x y", False)


def test_a_decision_with_two_stored_outcomes_reads_as_conflicting_and_its_chain_still_reads(
    telemetry, dataset, caplog
):
    tracer = DecisionTracer()
    clean = tracer.decision("a", "t", "fine", correlation_id="loan-9")
    torn = tracer.decision("a", "t", "torn", correlation_id="loan-9")
    tracer.record_outcome(clean, True)
    first = tracer.record_outcome(torn, True)
    (dataset / "_outcomes" / f"{torn}.json").unlink()  # as in a dataset written before outcome claims
    second = DecisionTracer().record_outcome(torn, False)
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        outcomes = store.verified_outcomes([clean, torn])
        assert outcomes[clean]["outcome_correct"] is True
        assert outcomes[torn]["outcome_correct"] is None and outcomes[torn]["outcome_id"] is None
        assert sorted(outcomes[torn]["conflicting"]) == sorted([first.record_id, second.record_id])
        assert store.has_outcome(torn)  # a third outcome is still refused
        traces = DecisionTracer(store=store).query_traces(correlation_id="loan-9")
    by_id = {t["record_id"]: t for t in traces}
    assert by_id[clean]["outcome_correct"] is True
    assert by_id[torn]["outcome_correct"] is None and "conflicting outcomes" in by_id[torn]["outcome_note"]
    assert any("2 verified outcomes" in r.getMessage() for r in caplog.records)
    # the chain table says so rather than leaving the outcome cell empty
    result = CliRunner().invoke(main, ["chain", "trade", "loan-9", "-d", str(dataset)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "conflicting" in result.output and "correct" in result.output
