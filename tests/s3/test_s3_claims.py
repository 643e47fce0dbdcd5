"""Compensation claims on an s3:// dataset live on the object store: two hosts never both refund."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

import otel_replay
from otel_replay import ActionGate, AlreadyCompensated, CompensationPending, audit
from otel_replay.gate.claims import ClaimState, CompensationClaims

from .._support import CLI, ForkedProcess, Zygote
from ..rails import FileLedger
from .conftest import keys

ROOT = Path(__file__).resolve().parents[2]
LIVE = {"budget_remaining": 3_000, "allow_list": ["acme-supplies"]}


def _committed(uri: str, ledger: FileLedger) -> tuple[str, str]:
    """A sealed, committed $4,200 payment on ``uri``: (decision id, receipt id)."""
    from .._support import payment, snapshot

    telemetry = otel_replay.configure(uri, set_global=False)
    with audit("vendor_payment", snapshot=snapshot()) as d:
        d.act(payment())
        receipt = ActionGate(ledger, dataset=uri).commit(payment(), record_id=d.record_id)
    telemetry.shutdown()
    return d.record_id, receipt.receipt_id


def _cli(
    zygote: Zygote, record_id: str, uri: str, live: Path, ledger: FileLedger, cwd: Path
) -> ForkedProcess:
    """``python -m otel_replay replay ... --execute`` in a process of its own (forked with the package imported)."""
    args = ["replay", record_id, "-d", uri, "--live-state", str(live)]
    args += ["--policy", "otel_replay.demo:budget_policy", "--execute", "--rail", "tests.rails:file_ledger"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OTEL_REPLAY_TEST_LEDGER": str(ledger.path)}
    env["OTEL_REPLAY_TEST_DELAY"] = "1.5"  # both are inside the rail call at once
    return zygote.popen(CLI, *args, cwd=str(cwd), env=env)


@pytest.mark.slow
def test_two_hosts_executing_one_verdict_on_s3_refund_once(
    bucket: str, s3: Any, tmp_path: Path, zygote: Zygote
) -> None:
    uri = f"s3://{bucket}/prod"
    ledger = FileLedger(tmp_path / "ledger.json")
    record_id, receipt_id = _committed(uri, ledger)
    live = tmp_path / "live.json"
    live.write_text(json.dumps(LIVE))
    hosts = [tmp_path / "hostA", tmp_path / "hostB"]  # two working directories stand for two hosts
    for host in hosts:
        host.mkdir()
    procs = [_cli(zygote, record_id, uri, live, ledger, host) for host in hosts]
    results = [(p.returncode, out, err) for p in procs for out, err in [p.communicate(timeout=180)]]
    winners = [r for r in results if r[0] == 0]
    assert len(winners) == 1 and "rolled_back" in winners[0][1], results
    ((code, _, err),) = [r for r in results if r[0] != 0]
    # Which message the loser gets depends on when it looks: while the winner holds the claim, or after it
    # finished (a loaded machine can start the second interpreter that late). Either way it refunds nothing.
    assert code == 1 and "Traceback" not in err, err
    assert "being compensated by" in err or "was already compensated by" in err, err
    with otel_replay.open(uri) as store:
        executed = [g["executed"] for g in store.rows("SELECT executed FROM gates")]
    assert executed.count("rolled_back") == 1  # one compensation, whatever the rail remembers
    assert [r["receipt"] for r in ledger.refunds()] == [receipt_id]
    assert [p for host in hosts for p in host.iterdir()] == []  # no local "s3:" directory anywhere
    claims = keys(s3, bucket, "prod/_compensations/")
    assert len(claims) == 1 and claims[0].endswith(".json")
    assert keys(s3, bucket, "prod/.locks/") == []  # the lock was given back


def test_claim_states_on_s3_refuse_a_second_claimant(bucket: str) -> None:
    uri = f"s3://{bucket}/ds"
    first, second = CompensationClaims(uri), CompensationClaims(uri)
    assert first.directory == f"{uri}/_compensations"
    claim = first.claim("a" * 32, decision_id="d", receipt_id="r-1")
    with pytest.raises(AlreadyCompensated, match="r-1 is being compensated by pid"):
        second.claim("a" * 32, decision_id="d", receipt_id="r-1", resume=True)
    first.finish(claim, ClaimState.DONE, executed="rolled_back")
    with pytest.raises(AlreadyCompensated, match="r-1 was already compensated by .*rolled_back"):
        second.claim("a" * 32, decision_id="d", receipt_id="r-1", resume=True)
    state = second.state("a" * 32)
    assert state is not None and state["state"] == "done" and state["receipt_id"] == "r-1"


_CRASHING_CLAIMANT = """
import os, sys
from otel_replay.gate.claims import CompensationClaims
CompensationClaims(sys.argv[1], ttl_seconds=0.5).claim("b" * 32, decision_id="d", receipt_id="r-2")
os._exit(17)  # dies between its claim and the rail's answer, lock and all
"""


@pytest.mark.slow
def test_a_crashed_claimant_on_s3_is_pending_then_resumable(bucket: str, zygote: Zygote) -> None:
    uri = f"s3://{bucket}/ds"
    done = zygote.run(_CRASHING_CLAIMANT, uri)  # a process of its own that dies (forked with the package imported)
    assert done.returncode == 17, done.stderr
    claims = CompensationClaims(uri, ttl_seconds=1.0)
    deadline = time.monotonic() + 30
    # its lock lasts ttl_seconds past its last renewal by the server's clock, in whole seconds: a 0.5 s lock has
    # expired once the server's next second begins, then the claim is pending
    while True:
        try:
            claims.claim("b" * 32, decision_id="d", receipt_id="r-2")
        except CompensationPending as exc:
            assert "stopped before the rail answered" in str(exc)
            break
        except AlreadyCompensated as exc:
            assert "being compensated by" in str(exc)
            assert time.monotonic() < deadline, "the crashed claimant's lock never expired"
            time.sleep(0.1)
    claim = claims.claim("b" * 32, decision_id="d", receipt_id="r-2", resume=True)
    claims.finish(claim, ClaimState.DONE, executed="reversed")
    state = claims.state("b" * 32)
    assert state is not None and state["state"] == "done" and state["resumed_from"]["state"] == "claimed"
