"""Compensation happens at most once: across threads, processes, crashes, and the in-process gate plus the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import otel_replay
from otel_replay import (
    ActionGate,
    AlreadyCompensated,
    CompensationPending,
    FixAction,
    ReferenceLedger,
    audit,
    replay,
)
from otel_replay.cli import main
from otel_replay.gate.claims import CompensationClaims, idempotency_key

from .._support import budget_policy, forked_child_result, payment, snapshot, start_forked_child
from ..rails import FileLedger

REPO = Path(__file__).resolve().parents[2]
LIVE = {"budget_remaining": 3_000, "allow_list": ["acme-supplies"]}


@pytest.fixture
def committed(tmp_path, dataset):
    """A dataset holding one sealed, committed $4,200 payment made through the file ledger."""
    ledger = FileLedger(tmp_path / "ledger.json")
    telemetry = otel_replay.configure(dataset, set_global=False)
    gate = ActionGate(ledger, dataset=dataset)
    with audit("vendor_payment", snapshot=snapshot()) as d:
        d.act(payment())
        receipt = gate.commit(payment(), record_id=d.record_id)
    telemetry.shutdown()
    live = tmp_path / "live.json"
    live.write_text(json.dumps(LIVE))
    return d.record, receipt, ledger, live


def _cli(record_id: str, dataset: Path, live: Path, ledger: FileLedger, *extra: str, **env: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "otel_replay", "replay", record_id, "-d", str(dataset), "--live-state", str(live)]
    args += ["--policy", "otel_replay.demo:budget_policy", "--execute", "--rail", "tests.rails:file_ledger", *extra]
    environ = {**os.environ, "OTEL_REPLAY_TEST_LEDGER": str(ledger.path), **env}
    return subprocess.Popen(args, cwd=REPO, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _in_process(record_id: str, dataset: Path, live: Path, ledger: FileLedger, *extra: str) -> tuple[int, str, str]:
    """``_cli``'s command through click's runner, where the process boundary is not the point: (code, out, err)."""
    args = ["replay", record_id, "-d", str(dataset), "--live-state", str(live), "--policy"]
    args += ["otel_replay.demo:budget_policy", "--execute", "--rail", "tests.rails:file_ledger", *extra]
    result = CliRunner(env={"OTEL_REPLAY_TEST_LEDGER": str(ledger.path)}).invoke(main, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result.exit_code, result.stdout, result.stderr


def _forked(record_id: str, dataset: Path, live: Path, ledger: FileLedger, **env: str) -> tuple[int, int]:
    """``_in_process`` in a child forked from this process (no interpreter start, no imports), started and left
    running (see ``start_forked_child``). Its claims meet the others' only on disk."""

    def work() -> tuple[int, str, str]:
        with pytest.MonkeyPatch.context() as mp:
            for name, value in env.items():
                mp.setenv(name, value)
            return _in_process(record_id, dataset, live, ledger)

    return start_forked_child(work)


def _forked_done(child: tuple[int, int]) -> tuple[int, str, str]:
    code, out, err = forked_child_result(child)
    return code, out, err


def _done(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def _gate_rows(dataset: Path) -> list[str]:
    with otel_replay.open(dataset) as store:
        return [g["executed"] for g in store.rows("SELECT executed FROM gates ORDER BY recorded_at")]


def test_three_concurrent_cli_executions_refund_once(committed, dataset):
    record, receipt, ledger, live = committed
    children = [_forked(record.record_id, dataset, live, ledger, OTEL_REPLAY_TEST_DELAY="1.5") for _ in range(3)]
    results = [_forked_done(child) for child in children]
    winners = [r for r in results if r[0] == 0]
    losers = [r for r in results if r[0] != 0]
    assert len(winners) == 1 and "rolled_back" in winners[0][1], results
    for code, _, err in losers:
        assert code == 1 and "Traceback" not in err
        assert "being compensated by" in err or "already compensated" in err, err
    assert [r["receipt"] for r in ledger.refunds()] == [receipt.receipt_id]
    assert _gate_rows(dataset).count("rolled_back") == 1


def test_in_process_rollback_not_yet_flushed_then_cli_refuses(committed, dataset):
    record, receipt, ledger, live = committed
    telemetry = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600)
    try:
        verdict = replay(record, live_state=LIVE, policy=budget_policy)
        assert verdict.fix is FixAction.ROLLBACK
        outcome = ActionGate(ledger, dataset=dataset).enforce_post_commit(verdict, receipt=receipt)
        assert outcome.executed == "rolled_back"
        code, _, err = _done(_cli(record.record_id, dataset, live, ledger))
        assert code == 1 and "already compensated" in err, err
    finally:
        telemetry.shutdown()
    assert len(ledger.refunds()) == 1


def test_a_crash_between_claim_and_rail_is_visible_and_resumable(committed, dataset):
    record, receipt, ledger, live = committed
    assert _done(_cli(record.record_id, dataset, live, ledger, OTEL_REPLAY_TEST_CRASH="1"))[0] == 17
    assert ledger.refunds() == []
    key = idempotency_key(record.record_id, receipt.receipt_id)
    assert CompensationClaims(dataset).state(key)["state"] == "claimed"
    code, _, err = _in_process(record.record_id, dataset, live, ledger)  # the crash needed a process; these not
    assert code == 1 and "never finished" in err and key in err and len(err.strip().splitlines()) == 1
    assert ledger.refunds() == []
    code, out, err = _in_process(record.record_id, dataset, live, ledger, "--resume")
    assert code == 0 and "rolled_back" in out, err
    assert [r["receipt"] for r in ledger.refunds()] == [receipt.receipt_id]
    state = CompensationClaims(dataset).state(key)
    assert state["state"] == "done" and state["resumed_from"]["state"] == "claimed"


def test_a_rail_that_already_refunded_dedups_the_resumed_call(committed, dataset):
    """The rail saw the refund, the claimant died before recording it: resume is a no-op on the rail."""
    record, receipt, ledger, live = committed
    key = idempotency_key(record.record_id, receipt.receipt_id)
    claims = CompensationClaims(dataset)
    claim = claims.claim(key, decision_id=record.record_id, receipt_id=receipt.receipt_id)
    ledger.compensate(receipt, idempotency_key=key)
    claims.release(claim)  # the process "dies" here: state stays claimed
    with pytest.raises(CompensationPending):
        ActionGate(ledger, dataset=dataset).enforce_post_commit(
            replay(record, live_state=LIVE, policy=budget_policy), receipt=receipt
        )
    outcome = ActionGate(ledger, dataset=dataset).enforce_post_commit(
        replay(record, live_state=LIVE, policy=budget_policy), receipt=receipt, resume=True
    )
    assert outcome.executed == "rolled_back" and len(ledger.refunds()) == 1


def test_threads_in_one_process_compensate_once(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    ledger = ReferenceLedger(10_000)
    gate = ActionGate(ledger, dataset=tmp_path)
    receipt = gate.commit(payment())
    verdict = otel_replay.Verdict(FixAction.ROLLBACK, False, "stale", "decision-1")

    def attempt(_: int) -> str:
        try:
            return gate.enforce_post_commit(verdict, receipt=receipt).executed
        except AlreadyCompensated:
            return "refused"

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(attempt, range(8)))
    assert sorted(results) == ["refused"] * 7 + ["rolled_back"]
    assert ledger.balance == 10_000 and [e[0] for e in ledger.entries] == ["commit", "compensate"]


def test_rail_without_idempotency_keyword_still_works_and_is_warned(tmp_path, caplog):
    class OldRail:
        def __init__(self) -> None:
            self.refunds = 0

        def commit(self, action):
            return otel_replay.Receipt("old-1", action.type, 1.0)

        def compensate(self, receipt):
            self.refunds += 1

    rail = OldRail()
    gate = ActionGate(rail, dataset=tmp_path)
    receipt = gate.commit(payment())
    verdict = otel_replay.Verdict(FixAction.BLOCK, False, "no", "decision-2")
    assert gate.enforce_post_commit(verdict, receipt=receipt).executed == "reversed"
    with pytest.raises(AlreadyCompensated):
        gate.enforce_post_commit(verdict, receipt=receipt)
    assert rail.refunds == 1 and "cannot deduplicate retries" in caplog.text


def test_a_failing_rail_leaves_a_failed_claim_that_needs_resume(tmp_path):
    class Broken(ReferenceLedger):
        fail = True

        def compensate(self, receipt, *, idempotency_key=None):
            if self.fail:
                raise RuntimeError("rail is down")
            super().compensate(receipt, idempotency_key=idempotency_key)

    ledger = Broken(10_000)
    gate = ActionGate(ledger, dataset=tmp_path)
    receipt = gate.commit(payment())
    verdict = otel_replay.Verdict(FixAction.ROLLBACK, False, "stale", "decision-3")
    with pytest.raises(RuntimeError, match="rail is down"):
        gate.enforce_post_commit(verdict, receipt=receipt)
    with pytest.raises(CompensationPending, match="rail call failed: RuntimeError: rail is down"):
        gate.enforce_post_commit(verdict, receipt=receipt)
    ledger.fail = False
    assert gate.enforce_post_commit(verdict, receipt=receipt, resume=True).executed == "rolled_back"
    assert ledger.balance == 10_000
