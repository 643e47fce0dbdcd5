"""An outcome is durable when ``record_outcome()`` returns: its claim synced in the claim store (see
tests/storage/test_outcome_claims_sync.py), the outcome itself written ahead."""

from __future__ import annotations

import contextlib
import logging
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest

import otel_replay
from otel_replay import DecisionTracer, OutcomeAlreadyRecorded


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


def test_an_outcome_whose_write_ahead_fails_is_counted_logged_and_still_stored(dataset, caplog):
    dataset.mkdir(parents=True)
    (dataset / "_wal").write_text("a file where the write-ahead log's directory goes")
    telemetry = otel_replay.configure(dataset, set_global=False)
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
        assert telemetry.force_flush()
    finally:
        telemetry.shutdown()
    with otel_replay.open(dataset) as store:
        assert store.verified_outcomes([decision])[decision]["outcome_correct"] is True
