from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import otel_replay
from otel_replay import CaptureError, DecisionTracer, OutcomeAlreadyRecorded, RecordNotFound
from otel_replay.capture.recorder import Recorder, set_recorder
from otel_replay.cli import main
from otel_replay.errors import DatasetError
from otel_replay.storage import claim_store, outcome_claims
from otel_replay.storage.claim_store import claim_file_name
from otel_replay.storage.outcome_claims import claim_outcome

from .._support import fork


def _forget_stores() -> None:
    """Close this process's claim stores, so the next claim opens its file as a new process would."""
    for store in outcome_claims._stores.values():
        if store.pending is not None:  # its converter thread stops, as at a process's exit
            store.pending.close()
        if store._con is not None:
            store._con.close()
            store._con = None
    outcome_claims._stores.clear()


def _claimed(dataset) -> list[str]:
    """The decision ids the dataset's claim store holds, sorted."""
    with contextlib.closing(sqlite3.connect(dataset / "_outcomes" / "claims.sqlite3")) as con:
        return sorted(row[0] for row in con.execute("SELECT decision_id FROM outcome_claims"))


def _outcome_files(dataset) -> list[str]:
    """The files in ``_outcomes/``, less ``writers/`` (one lock file per process holding outcomes, none per outcome)."""
    held = dataset / "_outcomes" / "writers"
    assert not held.exists() or len(os.listdir(held)) <= 1
    return sorted(name for name in os.listdir(dataset / "_outcomes") if name != "writers")


def _drop_claim(dataset, decision_id: str) -> None:
    """Remove a decision's claim by hand, as the refusal tells an operator to (or as a dataset older than claims)."""
    with contextlib.closing(sqlite3.connect(dataset / "_outcomes" / "claims.sqlite3")) as con, con:
        assert con.execute("DELETE FROM outcome_claims WHERE decision_id = ?", (decision_id,)).rowcount == 1


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
    _drop_claim(dataset, decision)
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


def test_an_unflushed_outcome_of_another_process_still_refuses_a_second(dataset):
    # Files roll every 10 minutes here: the outcome stays held beside its claim while the other process runs.
    with otel_replay.configure(dataset, service_name="tests", set_global=False, max_file_age_seconds=600) as telemetry:
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
    with pytest.raises(OutcomeAlreadyRecorded, match=f"{decision} already has .* in .*_outcomes/claims.sqlite3"):
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
    assert _claimed(dataset) == []  # the claim was given back
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
    assert _claimed(dataset) == ["../x y"]  # a row keyed by the id itself, no file named after it
    assert _outcome_files(dataset) == ["claims.sqlite3", "claims.sqlite3-shm", "claims.sqlite3-wal"]
    with pytest.raises(OutcomeAlreadyRecorded):
        DecisionTracer().record_outcome("../x y", False)


def test_a_decision_with_two_stored_outcomes_reads_as_conflicting_and_its_chain_still_reads(telemetry, dataset, caplog):
    tracer = DecisionTracer()
    clean = tracer.decision("a", "t", "fine", correlation_id="loan-9")
    torn = tracer.decision("a", "t", "torn", correlation_id="loan-9")
    tracer.record_outcome(clean, True)
    first = tracer.record_outcome(torn, True)
    _drop_claim(dataset, torn)  # as in a dataset written before outcome claims
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


# --- the local claim store (_outcomes/claims.sqlite3): exactly once across processes, no file per outcome ---

_RACER = textwrap.dedent("""
    import os, sys, time
    from otel_replay.storage.outcome_claims import claim_outcome
    from otel_replay.errors import OutcomeAlreadyRecorded
    dataset, go, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    while not os.path.exists(go):
        time.sleep(0.001)
    for i in range(count):
        try:
            claim_outcome(dataset, f"decision-{i}", f"outcome-{os.getpid()}-{i}", True)
            print("won", i, flush=True)
        except OutcomeAlreadyRecorded as e:
            assert f"claimed by pid" in str(e) and "claims.sqlite3" in str(e), e
""")


@pytest.mark.slow
def test_processes_racing_to_claim_the_same_decisions_win_each_exactly_once(dataset):
    # Four real processes start at one signal and claim the same 300 decisions: every decision is won by exactly
    # one of them, none twice, none lost (the store is created by whichever comes first).
    go = dataset.parent / "go"
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(dataset), str(go), "300"], stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    go.touch()
    outputs = [racer.communicate(timeout=120)[0] for racer in racers]
    assert [racer.returncode for racer in racers] == [0, 0, 0, 0]
    won = sorted(int(line.split()[1]) for out in outputs for line in out.splitlines())
    assert won == list(range(300))
    assert len(_claimed(dataset)) == 300


@pytest.mark.slow
def test_a_claim_survives_its_claimant_being_killed_right_after_it_returned(dataset):
    child = textwrap.dedent(f"""
        import os, time
        from otel_replay.storage.outcome_claims import claim_outcome
        claim_outcome({str(dataset)!r}, "killed-decision", "outcome-k", False)
        print(os.getpid(), flush=True)
        time.sleep(600)
    """)
    claimant = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    assert claimant.stdout is not None
    pid = int(claimant.stdout.readline())
    claimant.kill()  # SIGKILL: no exit handler, no close, no checkpoint
    claimant.wait(timeout=30)
    claimant.stdout.close()
    with pytest.raises(OutcomeAlreadyRecorded, match=rf"claimed by pid {pid} on .* \(outcome outcome-k\) in "):
        claim_outcome(dataset, "killed-decision", "outcome-2", True)
    assert _second_process_claim(dataset, "killed-decision") == "refused"


def test_a_claim_file_written_by_an_older_version_still_refuses(telemetry, dataset):
    # Older versions wrote one claim file per outcome (the id as its name, or a hash of an id that is no file name).
    tracer = DecisionTracer()
    plain, odd = tracer.decision("a", "t", "r"), "loan/7 ünïcode"
    tracer.record_outcome(tracer.decision("a", "t", "the store exists already"), True)
    old = dataset / "_outcomes"
    body = '{"claimant": "pid 42 on old-host", "claimed_at": "2026-01-02T03:04:05+00:00", "outcome_id": "o-old"}'
    (old / f"{plain}.json").write_text(body)
    (old / claim_file_name(odd)).write_text("{torn")
    with pytest.raises(
        OutcomeAlreadyRecorded,
        match=rf"claimed by pid 42 on old-host at 2026-01-02T03:04:05\+00:00 \(outcome o-old\) "
        rf"in .*_outcomes/{plain}\.json",
    ):
        tracer.record_outcome(plain, False)
    with pytest.raises(OutcomeAlreadyRecorded, match=r"already has an outcome: claimed in .*_outcomes/sha256-"):
        tracer.record_outcome(odd, False)  # an unreadable old claim still refuses
    assert plain not in _claimed(dataset) and odd not in _claimed(dataset)


def test_a_released_claim_can_be_taken_again_and_an_old_release_frees_no_newer_claim(dataset):
    first = claim_outcome(dataset, "d-1", "o-1", True)
    first.release()
    assert _claimed(dataset) == []
    second = claim_outcome(dataset, "d-1", "o-2", False)
    first.release()  # late or repeated: it was o-1's claim, not o-2's
    with pytest.raises(OutcomeAlreadyRecorded, match=r"\(outcome o-2\)"):
        claim_outcome(dataset, "d-1", "o-3", True)
    second.release()
    claim_outcome(dataset, "d-1", "o-4", True)


@pytest.mark.parametrize(
    "hostile",
    [
        "ünïcødé-决定-🙂",
        "x" * 10_000,
        "a\x00b",
        "../../etc/passwd",
        "C:\\windows\\system32",
        "'; DROP TABLE outcome_claims; --",
        "\ud800 lone surrogate",
        " ",
    ],
    ids=["unicode", "10k-chars", "nul", "slashes", "backslashes", "sql-quote", "surrogate", "space"],
)
def test_a_hostile_decision_id_is_claimed_exactly_once_and_apart_from_its_neighbours(dataset, hostile):
    claim_outcome(dataset, "a", "o-a", True)  # the store exists, and a prefix of some ids is taken
    claim_outcome(dataset, hostile, "o-1", True)
    with pytest.raises(OutcomeAlreadyRecorded, match="claimed by pid"):
        claim_outcome(dataset, hostile, "o-2", False)
    for neighbour in (hostile + "x", hostile[:-1] or "y", hostile.replace("\x00", "\x01")):
        if neighbour != hostile:
            claim_outcome(dataset, neighbour, "o-3", True)
    assert _outcome_files(dataset) == ["claims.sqlite3", "claims.sqlite3-shm", "claims.sqlite3-wal"]
    assert not (dataset.parent / "etc").exists()


def _one_short_line(message: str) -> None:
    """A refusal fit for a log line: one line, no control characters, valid UTF-8, a few hundred characters."""
    assert message.startswith("decision ") and message.isprintable() and len(message) < 1_000, message[:300]
    message.encode("utf-8")


@pytest.mark.parametrize(
    "hostile", ["line one\nline two", "a\x00b", "z" * 100_000, "\x1b[2J\r"], ids=["newline", "nul", "100k", "escape"]
)
def test_every_refusal_of_a_hostile_decision_id_is_one_short_line(telemetry, dataset, hostile):
    # The id goes into the message quoted and cut: a newline in it would forge a second log line, and 100k
    # characters bury the reason. Refused in this tracer, in another (the claim store's), and in a batch.
    tracer = DecisionTracer()
    tracer.record_outcome(hostile, True)
    for refuse in (tracer.record_outcome, DecisionTracer().record_outcome):
        with pytest.raises(OutcomeAlreadyRecorded) as raised:
            refuse(hostile, False)
        _one_short_line(str(raised.value))
    _one_short_line(str(DecisionTracer().record_outcomes([(hostile, False)]).failed[hostile]))
    with pytest.raises(CaptureError) as malformed:
        tracer.record_outcomes([(hostile, "yes")])
    assert "\n" not in str(malformed.value) and len(str(malformed.value)) < 1_000
    with otel_replay.open(dataset) as store, pytest.raises(RecordNotFound) as missing:
        DecisionTracer(store=store).record_outcome(hostile + "-never-decided", True)
    assert "\n" not in str(missing.value) and len(str(missing.value)) < 1_000


def test_a_refusal_of_a_decision_id_with_a_lone_surrogate_can_be_logged(dataset):
    claim_outcome(dataset, "\ud800 lone surrogate", "o-1", True)
    with pytest.raises(OutcomeAlreadyRecorded) as raised:
        claim_outcome(dataset, "\ud800 lone surrogate", "o-2", True)
    _one_short_line(str(raised.value))


@pytest.mark.slow
def test_5000_outcomes_leave_three_files_in_the_outcomes_directory(telemetry, dataset):
    tracer = DecisionTracer()
    decisions = [tracer.decision("a", "t", f"r{i}") for i in range(5_000)]
    for decision in decisions:
        tracer.record_outcome(decision, True)
    telemetry.force_flush()
    assert _outcome_files(dataset) == ["claims.sqlite3", "claims.sqlite3-shm", "claims.sqlite3-wal"]
    assert len(_claimed(dataset)) == 5_000


@pytest.mark.parametrize(
    "damage",
    [b"", b"this is no SQLite database, it was overwritten" * 100, b"SQLite format 3\x00" + b"\xff" * 4000],
    ids=["emptied", "overwritten", "torn-header"],
)
def test_a_damaged_claim_store_is_a_one_line_error_naming_it_and_is_never_replaced(telemetry, dataset, damage):
    tracer = DecisionTracer()
    first = tracer.decision("a", "t", "r")
    tracer.record_outcome(first, True)
    assert telemetry.force_flush()  # its outcome in Parquet, as a process leaves it at exit
    store = dataset / "_outcomes" / "claims.sqlite3"
    _forget_stores()  # damaged while closed (a disk fault, a stray write), as the next process finds it
    for sidecar in ("-wal", "-shm"):
        Path(f"{store}{sidecar}").unlink(missing_ok=True)
    store.write_bytes(damage)
    second = DecisionTracer().decision("a", "t", "r2")
    for _ in range(2):  # twice: a failed open leaves nothing behind that would pass the second time
        with pytest.raises(DatasetError) as raised:
            DecisionTracer().record_outcome(second, True)
        message = str(raised.value)
        assert f"outcome claim store {store} is damaged (" in message and "\n" not in message
        assert store.read_bytes() == damage  # never recreated over the claims it may hold
    child = _second_process_claim(dataset, first, check=False)
    assert f"DatasetError: outcome claim store {store} is damaged" in child
    telemetry.force_flush()
    with otel_replay.open(dataset) as store_:
        assert [r["decision_id"] for r in store_.rows("SELECT * FROM outcomes")] == [first]  # nothing emitted


def test_an_unopenable_claim_store_is_a_one_line_error_and_the_outcome_can_be_recorded_once_fixed(telemetry, dataset):
    tracer = DecisionTracer()
    decision = tracer.decision("a", "t", "r")
    (dataset / "_outcomes").write_text("a file where the claims directory belongs")
    with pytest.raises(
        DatasetError, match=r"^outcome claim store .*_outcomes/claims.sqlite3: cannot open it \(.*Not a directory"
    ):
        tracer.record_outcome(decision, True)
    (dataset / "_outcomes").unlink()
    (dataset / "_outcomes" / "claims.sqlite3").mkdir(parents=True)  # a directory where the database belongs
    with pytest.raises(DatasetError, match=r"^outcome claim store .*claims.sqlite3: cannot open it \(unable to open"):
        tracer.record_outcome(decision, True)
    (dataset / "_outcomes" / "claims.sqlite3").rmdir()
    assert tracer.record_outcome(decision, True).outcome_correct is True  # nothing was claimed or emitted before
    with pytest.raises(OutcomeAlreadyRecorded):
        DecisionTracer().record_outcome(decision, False)


def test_a_claim_store_removed_by_hand_is_not_written_through_a_stale_connection(dataset):
    claim_outcome(dataset, "d-1", "o-1", True)
    for name in ("claims.sqlite3", "claims.sqlite3-wal", "claims.sqlite3-shm"):
        (dataset / "_outcomes" / name).unlink(missing_ok=True)  # an operator starts an empty store
    claim_outcome(dataset, "d-1", "o-2", True)
    assert _claimed(dataset) == ["d-1"]  # in the file now at that path, where other processes look
    assert _second_process_claim(dataset, "d-1") == "refused"


def _second_process_claim(dataset, decision_id: str, check: bool = True) -> str:
    """Another process claims ``decision_id``: "claimed", "refused", or (``check=False``) what it printed on stderr."""
    child = textwrap.dedent(f"""
        from otel_replay.storage.outcome_claims import claim_outcome
        from otel_replay.errors import OutcomeAlreadyRecorded
        try:
            claim_outcome({str(dataset)!r}, {decision_id!r}, "o-child", True)
            print("claimed")
        except OutcomeAlreadyRecorded:
            print("refused")
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=check)
    return done.stdout.strip() or done.stderr


def test_a_forked_child_claims_through_its_own_connection(dataset):
    claim_outcome(dataset, "parent", "o-1", True)
    pid = fork()
    if pid == 0:  # the child: its parent's connection must not be used (SQLite forbids it across fork)
        code = 1
        try:
            claim_outcome(dataset, "child", "o-2", True)
            try:
                claim_outcome(dataset, "parent", "o-3", True)
            except OutcomeAlreadyRecorded:
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _claimed(dataset) == ["child", "parent"]


def test_verify_compact_and_reads_pass_over_the_claim_store(telemetry, dataset):
    tracer = DecisionTracer()
    decisions = [tracer.decision("a", "t", f"r{i}", correlation_id="c-1") for i in range(20)]
    for decision in decisions:
        tracer.record_outcome(decision, True)
    telemetry.force_flush()
    for command in (["verify", str(dataset)], ["compact", str(dataset), "--grace", "0"], ["verify", str(dataset)]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 0, result.output
        assert "claims.sqlite3" not in result.output
    with otel_replay.open(dataset) as store:
        assert len(store.verified_outcomes(decisions)) == 20
    assert len(_claimed(dataset)) == 20
    with pytest.raises(OutcomeAlreadyRecorded, match="claims.sqlite3"):
        DecisionTracer().record_outcome(decisions[0], False)


def test_a_replaced_claim_store_keeps_the_claims_another_process_put_in_its_successor(dataset):
    # An operator moves the store aside while this process has it open; another process creates the new one and
    # claims in it (its claim still only in the new WAL). This process then reopens, closing its old connection,
    # which must neither checkpoint into nor delete "claims.sqlite3-wal" by name: that is the new store's WAL now.
    claim_outcome(dataset, "before", "o-1", True)
    outcomes = dataset / "_outcomes"
    aside = dataset / "aside"
    aside.mkdir()
    for name in ("claims.sqlite3", "claims.sqlite3-wal", "claims.sqlite3-shm"):
        if (outcomes / name).exists():
            os.rename(outcomes / name, aside / name)
    child = textwrap.dedent(f"""
        import time
        from otel_replay.storage.outcome_claims import claim_outcome
        claim_outcome({str(dataset)!r}, "in-the-new-store", "o-2", True)
        print("claimed", flush=True)
        time.sleep(600)
    """)
    holder = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "claimed"
    try:
        claim_outcome(dataset, "after", "o-3", True)  # this process finds the new store
    finally:
        holder.kill()  # dies holding the new store open: its claim is in the WAL alone
        holder.wait(timeout=30)
        holder.stdout.close()
    assert _second_process_claim(dataset, "in-the-new-store") == "refused"
    assert _claimed(dataset) == ["after", "in-the-new-store"]


def test_a_claim_waits_for_another_writer_of_the_store_and_names_the_store_when_it_waits_too_long(dataset, monkeypatch):
    import threading

    claim_outcome(dataset, "first", "o-1", True)
    store = dataset / "_outcomes" / "claims.sqlite3"
    other = sqlite3.connect(store, isolation_level=None, check_same_thread=False)  # another process's writer
    try:
        other.execute("BEGIN IMMEDIATE")  # holds the write lock
        threading.Timer(0.3, other.execute, ("COMMIT",)).start()
        claim_outcome(dataset, "waited", "o-2", True)  # waits for the writer instead of failing
        _forget_stores()
        monkeypatch.setattr(claim_store, "BUSY_SECONDS", 0.2)
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(DatasetError) as raised:
            claim_outcome(dataset, "too-long", "o-3", True)
        assert str(raised.value) == (
            f"outcome claim store {store}: cannot record the claim for decision 'too-long' "
            "(database is locked: other processes kept it busy for 0.2 s)"
        )
        other.execute("COMMIT")
    finally:
        other.close()
    claim_outcome(dataset, "too-long", "o-4", True)  # nothing was claimed by the one that gave up
    assert _claimed(dataset) == ["first", "too-long", "waited"]


def test_an_outcome_for_a_decision_an_older_build_stored_with_a_number_as_correlation_id_is_recorded(
    telemetry, dataset
):
    # Builds before ids were refused unless text stored tracer.decision(..., correlation_id=42) as the number 42.
    # Its outcome takes the decision's correlation id as text, rather than being refused for it.
    from otel_replay import semconv as sc
    from otel_replay.capture import get_recorder
    from otel_replay.records import DecisionRecord, new_id

    record = DecisionRecord(record_id=new_id(), decision_type="step", source="tracer", correlation_id="42")
    attributes = record.to_attributes()
    attributes[sc.CORRELATION_ID] = 42  # as the older build stored it (in the JSON, not the typed column)
    get_recorder().emit(sc.SPAN_DECISION, record.record_id, attributes)
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        outcome = DecisionTracer(store=store).record_outcome(record.record_id, True)
    assert outcome.correlation_id == "42"
