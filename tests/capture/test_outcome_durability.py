"""An outcome is durable when ``record_outcome()`` returns: sealed inside its claim's transaction and stored with
it in the claim store, written to Parquet later (tests/storage/test_outcome_log.py: crashes at each step, races,
hostile stores); through a pipeline with processors of the user's own, claimed, then written ahead."""

from __future__ import annotations

import contextlib
import logging
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

import otel_replay
from otel_replay import DecisionTracer, OutcomeAlreadyRecorded


def _pending(dataset) -> int:
    with contextlib.closing(sqlite3.connect(dataset / "_outcomes" / "claims.sqlite3")) as con:
        return int(con.execute("SELECT count(*) FROM outcome_pending").fetchone()[0])


def _claimed(dataset) -> list[str]:
    with contextlib.closing(sqlite3.connect(dataset / "_outcomes" / "claims.sqlite3")) as con:
        return sorted(row[0] for row in con.execute("SELECT decision_id FROM outcome_claims"))


@pytest.mark.parametrize("death", ["SIGKILL", "os._exit"])
def test_an_outcome_survives_its_process_dying_right_after_record_outcome_returned(dataset, death):
    # The decision is flushed; its outcome is not, and the process dies the moment record_outcome() returns:
    # no exit handler, no flush, no shutdown. The next process to open the dataset finds the outcome.
    die = "os.kill(os.getpid(), signal.SIGKILL)" if death == "SIGKILL" else "os._exit(0)"
    child = textwrap.dedent(f"""
        import os, signal
        import otel_replay
        from otel_replay import DecisionTracer
        telemetry = otel_replay.configure({str(dataset)!r}, set_global=False)
        tracer = DecisionTracer()
        decision = tracer.decision("agent", "approve_loan", "looks fine", correlation_id="loan-1")
        telemetry.force_flush()
        outcome = tracer.record_outcome(decision, False, "defaulted")
        print(decision, outcome.record_id, flush=True)
        {die}
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, -signal.SIGKILL), done.stderr
    decision, outcome_id = done.stdout.split()
    with otel_replay.open(dataset) as store:  # recovers what the dead process wrote ahead
        outcomes = store.verified_outcomes([decision])
        assert outcomes[decision]["outcome_correct"] is False
        assert [r["outcome_id"] for r in store.rows("SELECT outcome_id FROM outcomes")] == [outcome_id]
        with pytest.raises(OutcomeAlreadyRecorded, match=f"decision {decision} already has an outcome"):
            DecisionTracer(store=store).record_outcome(decision, True)
    assert _claimed(dataset) == [decision]


class _Watcher(SpanProcessor):
    """A span processor of the user's own: the pipeline is no longer only what ``configure()`` set up."""

    def __init__(self) -> None:
        self.ended: list[str] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.append(span.name)


def test_an_outcome_through_a_pipeline_with_processors_of_its_own_is_written_ahead_and_a_failure_is_logged(
    dataset, caplog
):
    # A processor of the user's own must see the outcome span: it takes the SDK's path and the write-ahead log,
    # and when that log cannot be written the outcome is counted, logged and still stored.
    dataset.mkdir(parents=True)
    (dataset / "_wal").write_text("a file where the write-ahead log's directory goes")
    telemetry = otel_replay.configure(dataset, set_global=False)
    watcher = _Watcher()
    telemetry.provider.add_span_processor(watcher)
    try:
        tracer = DecisionTracer()
        decision = tracer.decision("agent", "t", "r")
        with caplog.at_level(logging.ERROR, logger="otel_replay"):
            outcome = tracer.record_outcome(decision, True)
        assert telemetry.recorder is not None and telemetry.recorder.stats.capture_errors == 1
        said = [r.getMessage() for r in caplog.records if "could not be made durable" in r.getMessage()]
        assert said == [
            f"otel-replay: outcome {outcome.record_id} of decision {decision} is claimed and emitted, but could "
            "not be made durable before record_outcome() returned; a crash before the next flush loses it (its "
            "claim stays)"
        ]
        assert watcher.ended.count("replay.outcome") == 1
        assert telemetry.force_flush()
    finally:
        telemetry.shutdown()
    with otel_replay.open(dataset) as store:
        assert store.verified_outcomes([decision])[decision]["outcome_correct"] is True


def test_an_outcome_held_beside_its_claim_needs_no_write_ahead_log(dataset, caplog):
    dataset.mkdir(parents=True)
    (dataset / "_wal").write_text("a file where the write-ahead log's directory goes")
    with otel_replay.configure(dataset, set_global=False) as telemetry:
        tracer = DecisionTracer()
        decision = tracer.decision("agent", "t", "r")
        with caplog.at_level(logging.ERROR, logger="otel_replay"):
            tracer.record_outcome(decision, True)
        assert telemetry.recorder is not None and telemetry.recorder.stats.capture_errors == 0
        assert not [r for r in caplog.records if "outcome" in r.getMessage()]
        assert _pending(dataset) == 1  # held in the claim store until written to Parquet
        assert telemetry.force_flush()
        assert _pending(dataset) == 0
    with otel_replay.open(dataset) as store:
        assert store.verified_outcomes([decision])[decision]["outcome_correct"] is True


_OUTCOME_AFTER_A_DECISION_NOT_YET_STORED = textwrap.dedent(
    """
    import os, signal, sys
    import otel_replay
    from otel_replay import Action, ActionGate, DecisionTracer, DependencySnapshot, ReferenceLedger, audit

    dataset, writing_ahead = sys.argv[1], sys.argv[2] == "yes"
    telemetry = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600)
    tracer = DecisionTracer()
    first = tracer.decision("agent", "approve", "r1", correlation_id="loan-1")
    if writing_ahead:  # the process writes ahead from here on: the next decision is held for the next write-ahead
        ActionGate(ReferenceLedger(100), dataset=dataset).commit(Action("refund", {"order": "o-0"}, cost=1.0))
    else:
        telemetry.force_flush()  # the next decision waits in the batch queue
    with audit("refund", snapshot=DependencySnapshot({"balance": 100}, version="v1"), correlation_id="t-1") as d:
        d.act(Action("refund", {"order": "o-1"}, cost=5.0))
    tracer.record_outcome(first, True)  # sealed after d, durable when it returns; d is not
    print(d.record_id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.xfail(
    strict=True,
    reason="an outcome is made durable in the claim store without the records sealed before it in the chain: a "
    "crash then leaves it after a decision still in memory, which verify reads as deleted (review, twelfth session)",
)
@pytest.mark.parametrize("writing_ahead", ["yes", "no"], ids=["held-for-a-write-ahead", "in-the-batch-queue"])
def test_a_crash_after_an_outcome_leaves_no_decision_sealed_before_it_read_as_deleted(zygote, dataset, writing_ahead):
    # A decision ends (sealed, not durable: without a gate nothing waits on disk), then the outcome of an earlier
    # decision is recorded: sealed after it in the chain and durable when record_outcome() returns. The process
    # dies. The decision may be lost (it was never acknowledged), but the outcome's place in the chain must not make
    # verify read it as deleted, as a gate record's intent never does (its write-ahead takes what was sealed before).
    child = zygote.run(_OUTCOME_AFTER_A_DECISION_NOT_YET_STORED, str(dataset), writing_ahead)
    assert child.returncode == -signal.SIGKILL, child.stderr
    with otel_replay.open(dataset) as store:
        assert store.verify(None).problems == []  # was: "deleted: missing from the dataset, yet record ... follows it"
