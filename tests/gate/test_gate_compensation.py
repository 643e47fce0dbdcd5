"""The gate never loses or doubles money: receipts of any shape are kept, commits are durable, retries finish."""

from __future__ import annotations

import glob
import json
import os
import shutil
import textwrap
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from click.testing import CliRunner

import otel_replay
from otel_replay import (
    Action,
    ActionGate,
    AlreadyCompensated,
    FixAction,
    Receipt,
    ReferenceLedger,
    audit,
    execute_verdict,
    replay_stored,
)
from otel_replay.cli import main
from otel_replay.errors import CaptureError, GateError
from otel_replay.gate import reads
from otel_replay.gate.claims import CompensationClaims, idempotency_key
from otel_replay.storage import drop_older_than

from .._support import budget_policy, payment, snapshot
from .test_gate_write_ahead import KEY, _gates

REPO = Path(__file__).resolve().parents[2]
STALE = {"budget_remaining": 100, "allow_list": ["acme-supplies"]}  # the $4,200 payment is a ROLLBACK now


class Bank:
    """A payment API: its receipts carry a Decimal amount and a datetime, as real ones do."""

    def __init__(self) -> None:
        self.charges: list[float] = []
        self.refunds: list[object] = []

    def commit(self, action: Action) -> Receipt:
        self.charges.append(action.cost)
        return Receipt(f"ch_{len(self.charges)}", action.type, Decimal("4200.00"), {"at": datetime.now(UTC)})

    def compensate(self, receipt: object, *, idempotency_key: str) -> None:
        self.refunds.append(receipt)


class DictRail(Bank):
    """A rail whose receipts are plain dicts (no ``to_json``)."""

    def commit(self, action: Action) -> dict:  # type: ignore[override]
        self.charges.append(action.cost)
        return {"receipt_id": f"ch_{len(self.charges)}", "amount": action.cost, "currency": "USD"}


def _commit(dataset: Path, rail: object, *parts: float) -> str:
    """One sealed decision with a commit per part through ``rail``; returns the decision id."""
    telemetry = otel_replay.configure(dataset, set_global=False)
    gate = ActionGate(rail, dataset=dataset)  # type: ignore[arg-type]
    with audit("vendor_payment", snapshot=snapshot()) as d:
        d.act(payment())
        for part in parts or (4200,):
            gate.commit(payment(cost=part), record_id=d.record_id)
    telemetry.shutdown()
    return d.record_id


def _execute(dataset: Path, record_id: str, rail: object, *, resume: bool = False) -> list:
    telemetry = otel_replay.configure(dataset, set_global=False)
    try:
        with otel_replay.open(dataset) as store:
            verdict = replay_stored(store, record_id, live_state=STALE, policy=budget_policy)
            assert verdict.fix is FixAction.ROLLBACK
            return execute_verdict(store, verdict, rail, resume=resume)  # type: ignore[arg-type]
    finally:
        telemetry.shutdown()


def test_a_receipt_json_cannot_encode_is_returned_recorded_and_compensated(dataset):
    bank = Bank()
    telemetry = otel_replay.configure(dataset, set_global=False)
    errors = otel_replay.get_recorder().stats.capture_errors  # the process's count so far (other tests add to it)
    receipt = ActionGate(bank, dataset=dataset).commit(payment(), record_id="d-1")
    assert otel_replay.get_recorder().stats.capture_errors == errors
    telemetry.shutdown()
    assert receipt.receipt_id == "ch_1" and bank.charges == [4200]  # returned, so nobody commits again
    with otel_replay.open(dataset) as store:
        (stored,) = reads.receipts_for(store, "d-1")
    assert stored["amount"] == "4200.00" and stored["details"]["at"] == receipt.details["at"].isoformat()


def test_a_decimal_receipt_is_compensated_from_the_dataset(dataset):
    bank = Bank()
    record_id = _commit(dataset, bank)
    (outcome,) = _execute(dataset, record_id, bank)
    assert outcome.executed == "rolled_back"
    (refunded,) = bank.refunds
    assert isinstance(refunded, Receipt) and refunded.receipt_id == "ch_1" and refunded.amount == "4200.00"


def test_a_dict_receipt_is_stored_and_handed_back_as_the_rail_returned_it(dataset):
    rail = DictRail()
    record_id = _commit(dataset, rail)
    (outcome,) = _execute(dataset, record_id, rail)
    assert outcome.executed == "rolled_back"
    assert rail.refunds == [{"receipt_id": "ch_1", "amount": 4200, "currency": "USD"}]
    with pytest.raises(AlreadyCompensated):
        _execute(dataset, record_id, rail)
    assert len(rail.refunds) == 1


def test_the_in_process_gate_and_the_dataset_agree_on_a_dict_receipt_id(dataset):
    """The id (so the claim and idempotency key) of a dict receipt is the same before and after storage."""
    rail = DictRail()
    telemetry = otel_replay.configure(dataset, set_global=False)
    gate = ActionGate(rail, dataset=dataset)
    with audit("vendor_payment", snapshot=snapshot()) as d:
        d.act(payment())
        receipt = gate.commit(payment(), record_id=d.record_id)
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        verdict = replay_stored(store, d.record_id, live_state=STALE, policy=budget_policy)
    assert gate.enforce_post_commit(verdict, receipt=receipt).executed == "rolled_back"
    telemetry.shutdown()
    with pytest.raises(AlreadyCompensated):
        _execute(dataset, d.record_id, rail)
    assert len(rail.refunds) == 1


class Opaque:
    """A receipt JSON cannot hold whose to_json and str break."""

    receipt_id = "op-1"

    def to_json(self) -> dict:
        raise RuntimeError("broken to_json")

    def __str__(self) -> str:
        raise RuntimeError("broken str")


def test_an_opaque_receipt_is_recorded_by_id_and_repr(dataset):
    class OpaqueRail(Bank):
        def commit(self, action):  # type: ignore[override]
            return Opaque()

    telemetry = otel_replay.configure(dataset, set_global=False)
    receipt = ActionGate(OpaqueRail(), dataset=dataset).commit(payment(), record_id="d-2")
    telemetry.shutdown()
    assert isinstance(receipt, Opaque)
    with otel_replay.open(dataset) as store:
        (stored,) = reads.receipts_for(store, "d-2")
    assert stored["receipt_id"] == "op-1" and "Opaque" in stored["repr"]


_CRASH_AFTER_COMMIT = """
import os, sys
import otel_replay
from otel_replay import ActionGate, ReferenceLedger, audit
from tests._support import payment, snapshot
otel_replay.configure(sys.argv[1], set_global=False)
gate = ActionGate(ReferenceLedger(10_000), dataset=sys.argv[1], flush_timeout=120)  # durability, not the bound
with audit("vendor_payment", snapshot=snapshot()) as d:
    d.act(payment())
    receipt = gate.commit(payment(), record_id=d.record_id)
    print(d.record_id, receipt.receipt_id, flush=True)
    os._exit(9)  # killed right after the commit went through
"""


def test_the_commit_record_is_durable_when_commit_returns(zygote, dataset):
    done = zygote.run(_CRASH_AFTER_COMMIT, str(dataset), cwd=str(REPO))  # a real process, forked from the zygote
    assert done.returncode == 9, done.stderr
    record_id, receipt_id = done.stdout.split()
    with otel_replay.open(dataset) as store:
        assert [r["receipt_id"] for r in reads.receipts_for(store, record_id)] == [receipt_id]


class FlakyLedger(ReferenceLedger):
    """Fails the first compensation of the receipts in ``fail``."""

    def __init__(self, balance: float, fail: set[str]) -> None:
        super().__init__(balance)
        self.fail = fail

    def compensate(self, receipt, *, idempotency_key=None):
        if receipt.receipt_id in self.fail:
            self.fail.discard(receipt.receipt_id)
            raise ConnectionError("rail timeout")
        super().compensate(receipt, idempotency_key=idempotency_key)


def test_a_partly_compensated_decision_is_finished_by_resume(dataset):
    ledger = FlakyLedger(10_000, {"rcpt-0001"})
    record_id = _commit(dataset, ledger, 2100, 2100)
    assert ledger.balance == 5_800
    with pytest.raises(ConnectionError, match="rail timeout") as failed:
        _execute(dataset, record_id, ledger)
    assert ledger.balance == 7_900  # the newest receipt was refunded before the older one failed
    assert any("rcpt-0002: rolled_back" in note for note in failed.value.__notes__)
    outcomes = _execute(dataset, record_id, ledger, resume=True)
    assert [o.executed for o in outcomes] == ["already_compensated", "rolled_back"]
    assert ledger.balance == 10_000
    with pytest.raises(AlreadyCompensated, match="rcpt-0002.*rcpt-0001"):
        _execute(dataset, record_id, ledger, resume=True)
    assert ledger.balance == 10_000


def test_a_failure_on_the_newest_receipt_does_not_stop_the_older_ones(dataset):
    ledger = FlakyLedger(10_000, {"rcpt-0002"})
    record_id = _commit(dataset, ledger, 1000, 2000)
    with pytest.raises(ConnectionError, match="rail timeout"):
        _execute(dataset, record_id, ledger)
    assert ledger.balance == 8_000  # rcpt-0001 (1,000) refunded all the same
    outcomes = _execute(dataset, record_id, ledger, resume=True)
    assert [o.executed for o in outcomes] == ["rolled_back", "already_compensated"]
    assert ledger.balance == 10_000


def test_a_commit_row_stored_twice_is_refunded_once_with_an_outcome(dataset):
    ledger = ReferenceLedger(10_000)
    record_id = _commit(dataset, ledger)
    for path in glob.glob(str(dataset / "spans" / "*" / "*.parquet")):
        shutil.copy(path, path[: -len(".parquet")] + "-9.parquet")  # the files delivered twice
    with otel_replay.open(dataset) as store:
        assert len(reads.receipts_for(store, record_id)) == 2
    (outcome,) = _execute(dataset, record_id, ledger)
    assert outcome.executed == "rolled_back" and ledger.balance == 10_000


_RAILS = """
def none():
    return None

def text():
    return "ledger"
"""


@pytest.mark.parametrize(("factory", "kind"), [("none", "NoneType"), ("text", "str")])
def test_a_rail_factory_that_returns_no_rail_is_a_one_line_error(dataset, tmp_path, monkeypatch, factory, kind):
    record_id = _commit(dataset, ReferenceLedger(10_000))
    (tmp_path / "bad_rails.py").write_text(_RAILS)
    (tmp_path / "live.json").write_text(json.dumps(STALE))
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["replay", record_id, "-d", str(dataset), "--live-state", str(tmp_path / "live.json")]
    args += ["--policy", "otel_replay.demo:budget_policy", "--execute", "--rail", f"bad_rails:{factory}"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    last = result.output.strip().splitlines()[-1]
    assert f"--rail bad_rails:{factory}: the factory returned {kind}, not a rail" in last
    assert "a bug in otel-replay" not in result.output


def test_a_damaged_done_claim_is_never_retried_even_with_resume(tmp_path):
    ledger = ReferenceLedger(10_000)
    gate = ActionGate(ledger, dataset=tmp_path)
    receipt = gate.commit(payment())
    verdict = otel_replay.Verdict(FixAction.ROLLBACK, False, "stale", "decision-9")
    gate.enforce_post_commit(verdict, receipt=receipt)
    key = idempotency_key("decision-9", receipt.receipt_id)
    claims = CompensationClaims(tmp_path)
    assert claims.state(key)["state"] == "done"
    Path(claims.directory, f"{key}.json").write_bytes(b'{"state": "do\xff')  # a damaged disk block
    for resume in (False, True):
        with pytest.raises(GateError, match=f"compensation claim .*{key}.json .* is unreadable") as refused:
            gate.enforce_post_commit(verdict, receipt=receipt, resume=resume)
        assert not isinstance(refused.value, AlreadyCompensated)
    assert ledger.balance == 10_000 and [e[0] for e in ledger.entries] == ["commit", "compensate"]


def test_claims_of_a_relative_dataset_stay_put_after_chdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    claims = CompensationClaims("traces")
    assert claims.directory == tmp_path / "traces" / "_compensations"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    claim = claims.claim("k" * 32, decision_id="d", receipt_id="r")
    claims.release(claim)
    assert (tmp_path / "traces" / "_compensations" / f"{'k' * 32}.json").exists()
    assert not (tmp_path / "elsewhere" / "traces").exists()


def test_a_file_uri_dataset_keeps_its_claims_in_the_dataset(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    claims = CompensationClaims(f"file://{tmp_path}/traces")
    assert claims.directory == tmp_path / "traces" / "_compensations"


def test_a_commit_whose_record_cannot_be_sealed_is_refused_before_the_rail(dataset):
    ledger = ReferenceLedger(10_000)
    telemetry = otel_replay.configure(dataset, set_global=False)
    try:
        with pytest.raises(CaptureError, match="UUID"):  # the intent, sealed before the rail, cannot hold it
            ActionGate(ledger, dataset=dataset).commit(payment(), record_id=uuid.uuid4())  # type: ignore[arg-type]
    finally:
        telemetry.shutdown()
    assert ledger.balance == 10_000 and ledger.entries == []  # nothing was committed


def test_a_gate_on_a_relative_dataset_keeps_its_claims_there_after_chdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ledger = ReferenceLedger(10_000)
    gate = ActionGate(ledger, dataset="traces")
    receipt = gate.commit(payment())
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # the agent changes directory before the verdict comes in
    gate.enforce_post_commit(otel_replay.Verdict(FixAction.BLOCK, False, "no", "decision-7"), receipt=receipt)
    key = idempotency_key("decision-7", receipt.receipt_id)
    assert CompensationClaims(tmp_path / "traces").state(key)["state"] == "done"
    assert list((tmp_path / "elsewhere").iterdir()) == []


_COMPENSATING = textwrap.dedent(
    """
    import os, signal, sys
    import otel_replay
    from otel_replay import Action, ActionGate, DependencySnapshot, FixAction, Verdict, audit

    dataset, refunds = sys.argv[1:3]

    class Rail:
        def commit(self, action):
            return {"receipt_id": "r-comp"}

        def compensate(self, receipt, *, idempotency_key):
            with open(refunds, "a") as handle:  # the refund is on the wire when the process is killed
                handle.write(receipt["receipt_id"] + "\\n")
            os.kill(os.getpid(), signal.SIGKILL)

    otel_replay.configure(dataset, set_global=False)
    gate = ActionGate(Rail(), dataset=dataset)
    with audit("refund", snapshot=DependencySnapshot({"balance": 5}), correlation_id="t-comp") as d:
        action = Action("refund", {"order": "o-c"}, cost=5.0)
        d.act(action)
        receipt = gate.commit(action, record_id=d.record_id)
    print(d.record_id, flush=True)
    gate.enforce_post_commit(Verdict(FixAction.ROLLBACK, False, "stale balance", d.record_id), receipt=receipt)
    """
)


def test_a_process_killed_inside_a_compensation_leaves_it_shown_by_verify_as_compensated_unknown(
    zygote, tmp_path, monkeypatch
):
    dataset, refunds = tmp_path / "traces", tmp_path / "refunds.txt"
    env = {**os.environ, "OTEL_REPLAY_SIGNING_KEY": KEY}
    child = zygote.run(_COMPENSATING, str(dataset), str(refunds), env=env)
    assert child.returncode == -9, child.stderr
    decision_id = child.stdout.strip()
    assert refunds.read_text().split() == ["r-comp"]  # the rail may have refunded: only it knows
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", KEY)
    with otel_replay.open(dataset) as store:
        assert _gates(store, decision_id) == ["intent", "committed"]  # nothing in the spans says "compensating"
        report = store.verify(None)
    # Was: verify said OK, and the claim left "claimed" in _compensations/ was the only sign of the refund.
    [unknown] = report.unknown_commits
    assert unknown.record_id == decision_id and "receipt r-comp" in unknown.problem
    assert "compensated? unknown - check the rail" in unknown.problem
    result = CliRunner().invoke(main, ["verify", str(dataset)])
    assert result.exit_code == 0, result.output  # not an integrity failure
    assert "compensated? unknown - check the rail" in result.output


_DONE_THEN_KILLED = textwrap.dedent(
    """
    import os, signal, sys
    import otel_replay
    from otel_replay import Action, ActionGate, DependencySnapshot, FixAction, Verdict, audit
    from otel_replay.gate.claims import ClaimState, CompensationClaims

    dataset = sys.argv[1]
    finish = CompensationClaims.finish

    def finish_then_die(self, claim, state, **details):
        finish(self, claim, state, **details)
        if state is ClaimState.DONE:  # the claim says done; the compensation's gate record is not yet durable
            os.kill(os.getpid(), signal.SIGKILL)

    CompensationClaims.finish = finish_then_die

    class Rail:
        def commit(self, action):
            return {"receipt_id": "r-done", "amount": 5}

        def compensate(self, receipt, *, idempotency_key):
            pass

    otel_replay.configure(dataset, set_global=False)
    gate = ActionGate(Rail(), dataset=dataset)
    with audit("refund", snapshot=DependencySnapshot({"balance": 5}), correlation_id="t-done") as d:
        action = Action("refund", {"order": "o-d"}, cost=5.0)
        d.act(action)
        receipt = gate.commit(action, record_id=d.record_id)
    print(d.record_id, flush=True)
    gate.enforce_post_commit(Verdict(FixAction.ROLLBACK, False, "stale balance", d.record_id), receipt=receipt)
    """
)


def test_a_claim_marked_done_whose_gate_record_the_dataset_lacks_is_a_not_ok_finding_of_verify(
    zygote, tmp_path, monkeypatch
):
    dataset = tmp_path / "traces"
    env = {**os.environ, "OTEL_REPLAY_SIGNING_KEY": KEY}
    child = zygote.run(_DONE_THEN_KILLED, str(dataset), env=env)
    assert child.returncode == -9, child.stderr
    decision_id = child.stdout.strip()
    key = idempotency_key(decision_id, "r-done")
    assert CompensationClaims(dataset).state(key)["state"] == "done"
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", KEY)
    with otel_replay.open(dataset) as store:
        assert _gates(store, decision_id) == ["intent", "committed"]  # the refund's own record never landed
        report = store.verify(None)
    # Was: verify said OK; only the claim file under _compensations/ knew the refund was made.
    assert not report.ok
    [problem] = [p for p in report.problems if p.record_id == decision_id]
    assert "receipt r-done" in problem.problem and key in problem.problem and "no gate record" in problem.problem
    result = CliRunner().invoke(main, ["verify", str(dataset)])
    assert result.exit_code != 0 and decision_id in result.output, result.output


def test_a_compensation_recorded_in_the_dataset_leaves_verify_ok(dataset, monkeypatch):
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", KEY)
    bank = DictRail()
    record_id = _commit(dataset, bank, 2000, 2200)
    assert [o.executed for o in _execute(dataset, record_id, bank)] == ["rolled_back", "rolled_back"]
    with otel_replay.open(dataset) as store:
        report = store.verify(None)
    assert report.ok and report.problems == [] and report.unknown_commits == []


def test_a_compensation_a_live_process_wrote_ahead_and_has_not_yet_converted_is_not_a_problem_of_verify(
    dataset, monkeypatch
):
    # The refund's gate record is durable in the live process's write-ahead log (files an hour apart), not yet in
    # Parquet: verify must not call the record missing (report not ok) while that process lives; once it shuts
    # down (the log converted), the record is found and verify is ok.
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", KEY)
    bank = DictRail()
    record_id = _commit(dataset, bank)
    telemetry = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600)
    try:
        with otel_replay.open(dataset) as store:
            verdict = replay_stored(store, record_id, live_state=STALE, policy=budget_policy)
            assert [o.executed for o in execute_verdict(store, verdict, bank)] == ["rolled_back"]
        with otel_replay.open(dataset) as store:
            live = store.verify(None)
    finally:
        telemetry.shutdown()
    assert live.problems == [], live.problems  # was: "the refund was made and its record is missing"
    [pending] = [p for p in live.unknown_commits if p.record_id == record_id]
    assert "marked done" in pending.problem and "live process" in pending.problem
    with otel_replay.open(dataset) as store:
        report = store.verify(None)
    assert report.ok and report.problems == [] and report.unknown_commits == []


def test_a_done_claim_is_dropped_by_retention_with_its_record_so_verify_stays_ok(dataset, monkeypatch):
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", KEY)
    bank = DictRail()
    record_id = _commit(dataset, bank)
    assert [o.executed for o in _execute(dataset, record_id, bank)] == ["rolled_back"]
    tomorrow = datetime.now(UTC).date() + timedelta(days=1)
    drop_older_than(dataset, 0, today=tomorrow, grace_seconds=0)  # today's records, the refund's included
    with otel_replay.open(dataset) as store:
        assert _gates(store, record_id) == []
        report = store.verify(None)
    assert report.problems == []
    assert not list((dataset / "_compensations").glob("*.json"))  # the claim went with its day's records


def test_a_compensation_whose_gate_record_cannot_be_sealed_returns_its_outcome_and_counts_the_error(
    telemetry, dataset, caplog
):
    # Once the rail has refunded, an error would read as "not refunded" (and a retry as CompensationPending):
    # the outcome is returned, as commit() returns its receipt, and the record that failed is logged and counted.
    bank = Bank()
    gate = ActionGate(bank, dataset=dataset)
    receipt = gate.commit(payment())
    verdict = otel_replay.Verdict(FixAction.ROLLBACK, False, "stale", record_id="dec-\ud800")  # built by hand
    errors = otel_replay.get_recorder().stats.capture_errors
    outcome = gate.enforce_post_commit(verdict, receipt=receipt)  # was: CaptureError after the refund
    assert outcome.executed == "rolled_back" and len(bank.refunds) == 1
    assert otel_replay.get_recorder().stats.capture_errors > errors
    assert "compensation of receipt ch_1 could not be recorded: CaptureError" in caplog.text
    with pytest.raises(AlreadyCompensated):  # the claim says done: never refunded twice
        gate.enforce_post_commit(verdict, receipt=receipt)
    assert len(bank.refunds) == 1
