"""What the gate and replay judge: a receipt's identity, a policy's answer, the action committed, untrusted commits."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import otel_replay
from otel_replay import Action, ActionGate, FixAction, ReferenceLedger, audit
from otel_replay import semconv as sc
from otel_replay.cli import main
from otel_replay.errors import (
    AlreadyCompensated,
    CompensationPending,
    GateError,
    PayloadError,
    PolicyError,
    RecordNotFound,
)
from otel_replay.gate import reads
from otel_replay.gate.claims import CompensationClaims, idempotency_key
from otel_replay.gate.execute import execute_verdict, replay_stored
from otel_replay.gate.policy import replay
from otel_replay.integrity import SigningKey

from .._support import TEST_KEY, budget_policy, fork, payment, snapshot

STALE = {"budget_remaining": 0, "allow_list": ["acme-supplies"]}


def _budget(state: dict, action: Action) -> tuple[bool, str]:
    return action.cost <= state["budget_remaining"], "budget"


class ChargeRail:
    """A rail that notes the refund on the receipt it is handed, then times out once (the refund went through)."""

    def __init__(self, receipt: dict[str, Any]) -> None:
        self.receipt = receipt
        self.refunds: list[str] = []
        self.keys: set[str] = set()

    def commit(self, action: Action) -> dict[str, Any]:
        return dict(self.receipt, amount=action.cost)

    def compensate(self, receipt: Any, *, idempotency_key: str) -> None:
        if idempotency_key in self.keys:  # an idempotent rail: a repeated key is a no-op
            return
        self.keys.add(idempotency_key)
        receipt["refund_requested"] = True
        self.refunds.append(idempotency_key)
        if len(self.refunds) == 1:
            raise TimeoutError("refund API timed out (the refund went through)")


def _committed(dataset: Path, rail: Any) -> tuple[ActionGate, Any, Any]:
    gate = ActionGate(rail, dataset=dataset)
    with audit("vendor_payment", snapshot=snapshot()) as d:
        d.act(payment())
        receipt = gate.commit(payment(), record_id=d.record_id)
    verdict = replay(d.record, live_state=STALE, policy=_budget)
    assert verdict.fix is FixAction.ROLLBACK
    return gate, receipt, verdict


@pytest.mark.parametrize("shape", [{"id": "ch_3Q1", "currency": "usd"}, {"charge": "ch_3Q1", "currency": "usd"}])
def test_a_receipt_the_rail_marks_while_refunding_is_refunded_once_under_one_key(telemetry, dataset, shape):
    rail = ChargeRail(shape)
    gate, receipt, verdict = _committed(dataset, rail)
    before = dict(receipt)
    with pytest.raises(TimeoutError):
        gate.enforce_post_commit(verdict, receipt=receipt)
    assert receipt == before  # the rail was handed a copy: the caller's receipt is as committed
    with pytest.raises(CompensationPending):  # the same receipt, the same claim: not a fresh refund
        gate.enforce_post_commit(verdict, receipt=receipt)
    gate.enforce_post_commit(verdict, receipt=receipt, resume=True)
    assert len(rail.refunds) == 1 and len(rail.keys) == 1


def test_a_receipt_without_an_id_keeps_its_commit_identity_when_the_caller_annotates_it(telemetry, dataset):
    rail = ChargeRail({"charge": "ch_9", "currency": "usd"})
    gate, receipt, verdict = _committed(dataset, rail)
    with pytest.raises(TimeoutError):
        gate.enforce_post_commit(verdict, receipt=receipt)
    receipt["note"] = "retrying after a timeout"  # the caller annotates its receipt between attempts
    gate.enforce_post_commit(verdict, receipt=receipt, resume=True)
    assert len(rail.refunds) == 1
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:  # the dataset agrees: the stored commit is the one compensated
        with pytest.raises(AlreadyCompensated):
            execute_verdict(store, verdict, rail)
    assert len(rail.refunds) == 1


def test_a_stripe_like_id_names_the_receipt(telemetry, dataset):
    rail = ChargeRail({"id": "ch_3Q1"})
    _, _, verdict = _committed(dataset, rail)
    telemetry.force_flush()
    with otel_replay.open(dataset) as store, pytest.raises(TimeoutError) as raised:
        execute_verdict(store, verdict, rail)
    assert "receipt ch_3Q1 of decision" in "".join(raised.value.__notes__)


# --- 4: a policy's answer is a bool and a str, never coerced -------------------------------------------------


def _paid() -> Any:
    with audit("vendor_payment", snapshot=snapshot()) as d:
        d.act(payment())
    return d.record


def _swapped(state: dict, action: Action) -> Any:
    return "amount exceeds the remaining budget", False


@pytest.mark.parametrize(
    ("policy", "shown"),
    [
        (_swapped, "('amount exceeds the remaining budget', False) (str, bool)"),
        (lambda s, a: "no", "'no'"),
        (lambda s, a: (1, "ok"), "(1, 'ok') (int, str)"),
        (lambda s, a: (None, "ok"), "(None, 'ok') (NoneType, str)"),
        (lambda s, a: (True, None), "(True, None) (bool, NoneType)"),
    ],
)
def test_a_policy_answer_that_is_not_a_bool_and_a_str_is_refused_naming_the_policy(policy, shown):
    with pytest.raises(PolicyError) as raised:
        replay(_paid(), live_state=STALE, policy=policy)
    assert shown in str(raised.value) and policy.__qualname__ in str(raised.value)


def test_a_real_bool_answer_still_decides():
    verdict = replay(_paid(), live_state=STALE, policy=lambda s, a: (a.cost <= s["budget_remaining"], "budget"))
    assert verdict.fix is FixAction.ROLLBACK  # a list answer (JSON from a service) is accepted too:
    assert replay(_paid(), live_state=STALE, policy=lambda s, a: [True, "fine"]).fix is FixAction.ALLOW


# numpy 2 names its bool type ``numpy.bool`` (1.x: ``numpy.bool_``); a stand-in with that identity, as numpy is no
# dependency of the tests: ``np.float64(4200) <= 9000`` returns one.
_NumpyBool = type("bool", (), {"__module__": "numpy", "__bool__": lambda self: self.value})


def _numpy_bool(value: bool) -> Any:
    answer = _NumpyBool()
    answer.value = value
    return answer


def test_a_numpy_2_bool_answer_decides():
    verdict = replay(_paid(), live_state=STALE, policy=lambda s, a: (_numpy_bool(a.cost <= s["budget_remaining"]), "b"))
    assert verdict.fix is FixAction.ROLLBACK  # was: PolicyError "... got (<numpy.bool ...>, 'b') (bool, str)"
    assert replay(_paid(), live_state=STALE, policy=lambda s, a: (_numpy_bool(True), "fine")).fix is FixAction.ALLOW


def test_a_real_numpy_bool_answer_decides():
    np = pytest.importorskip("numpy")
    verdict = replay(_paid(), live_state=STALE, policy=lambda s, a: (np.float64(a.cost) <= s["budget_remaining"], "b"))
    assert verdict.fix is FixAction.ROLLBACK


class _Stop(BaseException):
    """Not an Exception: to the gate, a rail raising it is a process killed inside the rail (it never answers)."""


def _exits(state: dict, action: Action) -> Any:
    raise SystemExit(0)


def _raises_base(state: dict, action: Action) -> Any:
    raise _Stop("stopped")


def _generator_exit(state: dict, action: Action) -> Any:
    raise GeneratorExit


@pytest.mark.parametrize("policy", [_exits, _raises_base, _generator_exit])
def test_a_policy_that_exits_or_raises_a_base_exception_is_a_policy_error_not_a_verdict(policy):
    with pytest.raises(PolicyError, match=f"policy {policy.__qualname__} raised"):  # was: it went through
        replay(_paid(), live_state=STALE, policy=policy)


def test_a_policy_interrupted_by_the_user_is_interrupted():
    def interrupted(state: dict, action: Action) -> Any:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        replay(_paid(), live_state=STALE, policy=interrupted)


def test_the_cli_exits_1_with_one_line_when_the_policy_exits_0(demo_dataset, demo_build, tmp_path):
    live = tmp_path / "live.json"
    live.write_text(json.dumps(STALE))
    out = CliRunner().invoke(
        main,
        [
            "replay", demo_build.record_id, "-d", str(demo_dataset), "--live-state", str(live),
            "--policy", "tests.gate.test_gate_judging:_exits",
        ],
    )  # fmt: skip
    assert out.exit_code == 1, out.output  # was: 0 and no verdict, which a script reads as success
    assert "policy _exits raised SystemExit: 0" in out.output and out.output.count("\n") == 1


def _quoting_the_note(state: dict, action: Action) -> tuple[bool, str]:
    return "note" not in state, state.get("note", "no note")  # the live state (with a note) refuses, the snapshot not


def test_a_reason_quoting_a_lone_surrogate_of_the_live_state_is_refunded_and_recorded(dataset):
    live = {**STALE, "note": "\ud800"}  # what strict JSON reads from "\\ud800" in a --live-state file
    record, ledger = _committed_other(dataset, payment(), payment())
    with otel_replay.open(dataset) as store:
        verdict = replay_stored(store, record.record_id, live_state=live, policy=_quoting_the_note)
        assert verdict.fix is FixAction.ROLLBACK and verdict.reason.endswith("\\ud800")  # sealable text
        telemetry = otel_replay.configure(dataset, set_global=False)
        try:
            outcomes = execute_verdict(store, verdict, ledger)  # was: CaptureError after the refund
        finally:
            telemetry.shutdown()
    assert [o.executed for o in outcomes] == ["rolled_back"] and ledger.balance == 100_000
    with otel_replay.open(dataset) as store:
        assert store.verify(None).ok  # was: "marked done ... but the dataset holds no gate record of it"
        assert reads.compensation_for(store, record.record_id) is not None


def test_a_live_state_nested_too_deeply_is_named_not_blamed_on_the_policy():
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(5000):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(PayloadError, match="the live state is nested too deeply"):
        replay(_paid(), live_state=deep, policy=_budget)


# --- 7: a commit signed with a key not given is not "no receipt" -----------------------------------------------

AGENT_KEY = "agent-key-0123456789abcdef-agent"
PAYMENTS_KEY = "payments-key-0123456789abcdef-pay"


def _charged_by_another_service(dataset: Path) -> Any:
    """A decision sealed with the agent's key; its commit sealed by a payment service with its own key."""
    telemetry = otel_replay.configure(dataset, set_global=False, signing_key=AGENT_KEY)
    record = _paid()
    telemetry.shutdown()
    telemetry = otel_replay.configure(dataset, set_global=False, signing_key=PAYMENTS_KEY)
    ActionGate(ReferenceLedger(10_000), dataset=dataset).commit(payment(), record_id=record.record_id)
    telemetry.shutdown()
    return record


def test_a_commit_signed_with_a_key_not_given_refuses_execution_naming_the_row(dataset):
    record = _charged_by_another_service(dataset)
    verdict = replay(record, live_state=STALE, policy=_budget)
    ledger = ReferenceLedger(0)
    with otel_replay.open(dataset, keys=[SigningKey(AGENT_KEY.encode())]) as store:
        committed = "SELECT gate_id FROM gates WHERE stage = 'commit' AND executed = 'committed'"
        gate_id = store.query(committed).to_pylist()[0]["gate_id"]
        with pytest.raises(GateError) as raised:
            execute_verdict(store, verdict, ledger)
    message = str(raised.value)
    assert f"decision {record.record_id} has 1 commit record(s) this run cannot trust" in message
    assert f"gate record {gate_id}: signed with key" in message and "--key-file" in message
    assert ledger.entries == []
    with otel_replay.open(dataset, keys=[SigningKey(AGENT_KEY.encode()), SigningKey(PAYMENTS_KEY.encode())]) as store:
        assert [o.executed for o in execute_verdict(store, verdict, ReferenceLedger(0))] == ["rolled_back"]


def test_the_cli_exits_1_rather_than_report_no_receipt(dataset, tmp_path):
    record = _charged_by_another_service(dataset)
    key = tmp_path / "agent.key"
    key.write_text(AGENT_KEY)
    live = tmp_path / "live.json"
    live.write_text(json.dumps(STALE))
    out = CliRunner().invoke(
        main,
        [
            "replay", record.record_id, "-d", str(dataset), "--live-state", str(live), "--policy",
            "tests._support:budget_policy", "--execute", "--rail", "otel_replay.demo:demo_ledger",
            "--key-file", str(key),
        ],
    )  # fmt: skip
    assert out.exit_code == 1, out.output
    assert "compensation_unavailable" not in out.output and "cannot trust" in out.output


def test_trusted_receipts_are_still_refunded_and_then_the_untrusted_commit_is_named(dataset):
    record = _charged_by_another_service(dataset)
    telemetry = otel_replay.configure(dataset, set_global=False, signing_key=AGENT_KEY)
    ActionGate(ReferenceLedger(10_000), dataset=dataset).commit(payment(100), record_id=record.record_id)
    telemetry.shutdown()
    verdict = replay(record, live_state=STALE, policy=_budget)
    ledger = ReferenceLedger(0)
    with otel_replay.open(dataset, keys=[SigningKey(AGENT_KEY.encode())]) as store:
        telemetry = otel_replay.configure(dataset, set_global=False, signing_key=AGENT_KEY)
        try:
            with pytest.raises(GateError, match="1 commit record.s. this run cannot trust") as raised:
                execute_verdict(store, verdict, ledger)
        finally:
            telemetry.shutdown()
    assert ledger.balance == 100  # the trusted receipt was refunded; a forged-looking row cannot hold it back
    assert "the trusted receipts of the decision: receipt rcpt-0001: rolled_back" in "".join(raised.value.__notes__)


LIVE_OK = {"budget_remaining": 10_000, "allow_list": ["acme-supplies"]}
AGENT_ONLY = [SigningKey(AGENT_KEY.encode())]


def test_a_commit_signed_with_a_key_not_given_makes_an_allow_a_human_review_naming_it(dataset):
    # The $4,200 fits the budget, but the payment service's commit (its own key) could have committed anything:
    # its action was never judged, so the verdict cannot ALLOW it.
    record = _charged_by_another_service(dataset)
    with otel_replay.open(dataset, keys=AGENT_ONLY) as store:
        committed = "SELECT gate_id FROM gates WHERE stage = 'commit' AND executed = 'committed'"
        gate_id = store.query(committed).to_pylist()[0]["gate_id"]
        verdict = replay_stored(store, record.record_id, live_state=LIVE_OK, policy=budget_policy)
        assert verdict.fix is FixAction.HUMAN_REVIEW  # was: ALLOW, "committed action stands"
        assert "1 commit record(s) of the decision cannot be trusted, so what they committed was not judged" in (
            verdict.reason
        )
        assert f"gate record {gate_id}: signed with key" in verdict.reason and "--key-file" in verdict.reason
        assert verdict.reason.endswith("; within budget")
    keys = [*AGENT_ONLY, SigningKey(PAYMENTS_KEY.encode())]
    with otel_replay.open(dataset, keys=keys) as store:  # with the key that signed it, it is judged
        assert replay_stored(store, record.record_id, live_state=LIVE_OK, policy=budget_policy).fix is FixAction.ALLOW


class _DyingRail(ReferenceLedger):
    def commit(self, action: Action) -> Any:
        raise _Stop("killed inside the rail")


def _died_inside_the_rail(dataset: Path, record_id: str, key: str, action: Action) -> str:
    """A commit under decision ``record_id`` whose process died inside the rail (sealed with ``key``): its intent id."""
    telemetry = otel_replay.configure(dataset, set_global=False, signing_key=key)
    try:
        with pytest.raises(_Stop):
            ActionGate(_DyingRail(), dataset=dataset).commit(action, record_id=record_id)
    finally:
        telemetry.shutdown()
    with otel_replay.open(dataset, keys=[SigningKey(key.encode())]) as store:
        [(intent_id, _)] = store.unknown_commits_for(record_id)
    return intent_id


def test_an_intent_signed_with_a_key_not_given_makes_an_allow_a_human_review_and_refuses_execution(dataset):
    telemetry = otel_replay.configure(dataset, set_global=False, signing_key=AGENT_KEY)
    record = _paid()
    telemetry.shutdown()
    intent_id = _died_inside_the_rail(dataset, record.record_id, PAYMENTS_KEY, payment(50_000))
    with otel_replay.open(dataset, keys=AGENT_ONLY) as store:
        verdict = replay_stored(store, record.record_id, live_state=LIVE_OK, policy=budget_policy)
        assert verdict.fix is FixAction.HUMAN_REVIEW and f"gate record {intent_id}: signed with key" in verdict.reason
        stale = replay_stored(store, record.record_id, live_state=STALE, policy=budget_policy)
        assert stale.fix is FixAction.ROLLBACK
        with pytest.raises(GateError, match=f"1 commit record.s. this run cannot trust .gate record {intent_id}"):
            execute_verdict(store, stale, ReferenceLedger(0))  # was: compensation_unavailable, "no receipt"


def test_an_intent_no_commit_answers_is_not_taken_for_no_receipt_when_compensating(dataset):
    # A $4,200 commit was acknowledged; a second one died inside the rail (executed? unknown). ROLLBACK refunds
    # the receipt it has, then says the other was not compensated: a run that exits 0 reads as "all undone".
    record, ledger = _committed_other(dataset, payment(), payment())
    intent_id = _died_inside_the_rail(dataset, record.record_id, TEST_KEY, payment(9000))
    with otel_replay.open(dataset) as store:
        verdict = replay_stored(store, record.record_id, live_state=STALE, policy=budget_policy)
        assert verdict.fix is FixAction.ROLLBACK and f"vendor_payment (intent {intent_id})" in verdict.reason
        telemetry = otel_replay.configure(dataset, set_global=False)
        try:
            with pytest.raises(GateError) as raised:  # was: [rolled_back], and the $9,000 never mentioned
                execute_verdict(store, verdict, ledger)
        finally:
            telemetry.shutdown()
    message = str(raised.value)
    assert f"has 1 commit(s) no commit record answers (vendor_payment (intent {intent_id}))" in message
    assert "executed? unknown - check the rail" in message and "refund them on the rail by hand" in message
    assert ledger.balance == 100_000  # the receipt it has was refunded first
    assert "receipt rcpt-0001: rolled_back" in "".join(raised.value.__notes__)


def test_an_executed_unknown_is_still_named_when_another_committed_action_decides_the_verdict(dataset):
    record, _ = _committed_other(dataset, payment(100), payment(9000))
    intent_id = _died_inside_the_rail(dataset, record.record_id, TEST_KEY, payment(50))
    with otel_replay.open(dataset) as store:
        verdict = replay_stored(store, record.record_id, live_state=LIVE_500, policy=budget_policy)
    assert verdict.fix is FixAction.ROLLBACK and "committed another action than the decision audited" in verdict.reason
    assert f"executed? unknown - check the rail: vendor_payment (intent {intent_id})" in verdict.reason  # was: lost



def _execute_under_stale_state(record_id: str, dataset, tmp_path):
    """``otel-replay replay RECORD --execute`` under the stale live state, through the demo's ledger: its result."""
    live = tmp_path / "live.json"
    live.write_text(json.dumps(STALE))
    return CliRunner().invoke(
        main,
        [
            "replay", record_id, "-d", str(dataset), "--live-state", str(live), "--policy",
            "tests._support:budget_policy", "--execute", "--rail", "otel_replay.demo:demo_ledger",
        ],
    )  # fmt: skip


def test_the_cli_exits_1_for_a_decision_whose_only_commit_is_executed_unknown(dataset, tmp_path):
    telemetry = otel_replay.configure(dataset, set_global=False)
    record = _paid()
    telemetry.shutdown()
    intent_id = _died_inside_the_rail(dataset, record.record_id, TEST_KEY, payment())
    out = _execute_under_stale_state(record.record_id, dataset, tmp_path)
    assert out.exit_code == 1, out.output  # was: 0, "compensation_unavailable ... no receipt to compensate"
    assert "compensation_unavailable" not in out.output and f"intent {intent_id}" in out.output


def test_the_cli_says_what_it_refunded_before_naming_a_commit_it_could_not_compensate(dataset, tmp_path):
    record, _ = _committed_other(dataset, payment(), payment())
    intent_id = _died_inside_the_rail(dataset, record.record_id, TEST_KEY, payment(9000))
    out = _execute_under_stale_state(record.record_id, dataset, tmp_path)
    assert out.exit_code == 1 and f"intent {intent_id}" in out.output, out.output
    assert "(the trusted receipts: receipt rcpt-0001: rolled_back)" in " ".join(out.output.split())  # was: unsaid


def test_a_receipt_edited_after_commit_is_named_as_edited_never_judged_nor_taken_for_no_commit(dataset):
    from ..query.test_trust import _rows, _write

    record, ledger = _committed_other(dataset, payment(), payment())
    path, rows = _rows(dataset)
    [row] = [r for r in rows if '"committed"' in (r["attributes"] or "") and sc.GATE_RECEIPT in r["attributes"]]
    attrs = json.loads(row["attributes"])
    attrs[sc.GATE_RECEIPT] = attrs[sc.GATE_RECEIPT].replace("4200", "1")  # the refund made small
    row["attributes"] = json.dumps(attrs)
    _write(path, rows, rows.schema)
    with otel_replay.open(dataset) as store:
        allowed = replay_stored(store, record.record_id, live_state=LIVE_OK, policy=budget_policy)
        stale = replay_stored(store, record.record_id, live_state=STALE, policy=budget_policy)
        with pytest.raises(GateError) as raised:
            execute_verdict(store, stale, ledger)
    assert allowed.fix is FixAction.HUMAN_REVIEW and "content edited (hash mismatch)" in allowed.reason  # was: ALLOW
    assert "executed? unknown" not in allowed.reason  # its intent is answered, by the edited record
    assert "1 commit record(s) this run cannot trust" in str(raised.value) and "content edited" in str(raised.value)
    assert "no commit record answers" not in str(raised.value) and ledger.balance == 95_800  # nothing refunded


# --- 2: the action committed is judged, not only the one audited ----------------------------------------------

LIVE_500 = {"budget_remaining": 500, "allow_list": ["acme-supplies"]}


def _committed_other(dataset: Path, audited: Action, committed: Action) -> tuple[Any, ReferenceLedger]:
    ledger = ReferenceLedger(100_000)
    telemetry = otel_replay.configure(dataset, set_global=False)
    with audit("vendor_payment", snapshot=snapshot()) as d:
        d.act(audited)
        ActionGate(ledger, dataset=dataset).commit(committed, record_id=d.record_id)
    telemetry.shutdown()
    return d.record, ledger


def test_a_commit_of_another_action_than_audited_is_judged_on_its_own_action(dataset):
    record, ledger = _committed_other(dataset, payment(100), payment(9000))
    assert ledger.balance == 91_000
    with otel_replay.open(dataset) as store:
        [(gate_id, action)] = reads.committed_actions_for(store, record.record_id)
        assert action == payment(9000)  # the commit record stores what was committed
        assert replay(record, live_state=LIVE_500, policy=budget_policy).fix is FixAction.ALLOW  # $100 fits
        verdict = replay_stored(store, record.record_id, live_state=LIVE_500, policy=budget_policy)
        assert verdict.fix is FixAction.ROLLBACK  # was: ALLOW, and the $9,000 stood
        assert f"commit {gate_id} committed another action than the decision audited" in verdict.reason
        telemetry = otel_replay.configure(dataset, set_global=False)
        try:
            assert [o.executed for o in execute_verdict(store, verdict, ledger)] == ["rolled_back"]
        finally:
            telemetry.shutdown()
    assert ledger.balance == 100_000


def test_a_commit_of_the_audited_action_keeps_its_verdict(dataset):
    record, _ = _committed_other(dataset, payment(100), payment(100))
    with otel_replay.open(dataset) as store:
        verdict = replay_stored(store, record.record_id, live_state=LIVE_500, policy=budget_policy)
    assert verdict.fix is FixAction.ALLOW and verdict.reason == "within budget"


# --- 6: a commit whose decision was never recorded is named ----------------------------------------------------


def test_a_commit_made_by_a_process_killed_inside_audit_is_judged_from_its_intent(dataset):
    read, write = os.pipe()
    pid = fork()
    if pid == 0:  # pragma: no cover - the child dies inside the block, as a killed agent would
        otel_replay.configure(dataset, set_global=False)
        with audit("vendor_payment", snapshot=snapshot()) as d:
            d.act(payment())
            ActionGate(ReferenceLedger(10_000), dataset=dataset).commit(payment(), record_id=d.record_id)
            os.write(write, d.record_id.encode())
            os._exit(9)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        record_id = pipe.read()
    assert os.WEXITSTATUS(status) == 9 and record_id
    with otel_replay.open(dataset) as store:  # opening converts the write-ahead log the dead process left
        with pytest.raises(RecordNotFound):
            store.record(record_id)  # the decision span was still in the batch queue
        verdict = replay_stored(store, record_id, live_state=STALE, policy=budget_policy)  # was: RecordNotFound
        receipts = reads.receipts_for(store, record_id)
    assert verdict.record_id == record_id and verdict.fix is FixAction.ROLLBACK
    assert [r["receipt_id"] for r in receipts] == ["rcpt-0001"]


# --- 8: an ALLOW does not say an action stands once it was compensated ---------------------------------------


def test_an_allow_of_a_decision_compensated_already_is_a_human_review_not_the_action_stands(dataset):
    record, ledger = _committed_other(dataset, payment(), payment())
    telemetry = otel_replay.configure(dataset, set_global=False)
    try:
        with otel_replay.open(dataset) as store:
            stale = replay_stored(store, record.record_id, live_state=STALE, policy=budget_policy)
            assert [o.executed for o in execute_verdict(store, stale, ledger)] == ["rolled_back"]
        telemetry.force_flush()
        with otel_replay.open(dataset) as store:  # the budget came back: the policy would allow the payment now
            verdict = replay_stored(store, record.record_id, live_state=LIVE_OK, policy=budget_policy)
            outcomes = execute_verdict(store, verdict, ledger)
    finally:
        telemetry.shutdown()
    assert verdict.fix is FixAction.HUMAN_REVIEW  # was: ALLOW, and --execute printed "committed action stands"
    assert "the decision's action was compensated already (rolled_back, gate record" in verdict.reason
    assert [o.executed for o in outcomes] == ["held"] and ledger.balance == 100_000


def test_an_allow_of_a_decision_whose_compensation_was_begun_and_never_recorded_is_a_human_review(dataset):
    # A ROLLBACK's claimant was killed inside the rail (its claim stays "claimed"): whether the refund went
    # through only the rail knows, so a later ALLOW cannot say the action stands.
    record, _ = _committed_other(dataset, payment(), payment())
    key = idempotency_key(record.record_id, "rcpt-0001")
    claims = CompensationClaims(dataset)
    claims.release(claims.claim(key, decision_id=record.record_id, receipt_id="rcpt-0001"))  # killed here
    with otel_replay.open(dataset) as store:
        verdict = replay_stored(store, record.record_id, live_state=LIVE_OK, policy=budget_policy)
    assert verdict.fix is FixAction.HUMAN_REVIEW  # was: ALLOW
    assert "a compensation of receipt rcpt-0001 was begun (claimed by pid" in verdict.reason
    assert "compensated? unknown - check the rail" in verdict.reason


# --- 9: holes left open (strict xfails: each passes once it is fixed) ------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason="a policy is asked each question once, so one that answers the same question two ways (a toggle, a "
    "random draw, a flaky service) decides the verdict by its first answer: detecting it means asking twice",
)
def test_a_policy_answering_one_question_two_ways_is_a_human_review():
    answers = iter([True, False, True, False])

    def flaky(state: dict, action: Action) -> tuple[bool, str]:
        return next(answers), "flaky"

    assert replay(_paid(), live_state=STALE, policy=flaky).fix is FixAction.HUMAN_REVIEW  # now: ALLOW


class _TimedOutRail(ReferenceLedger):
    """A rail whose client times out after the charge went through."""

    def commit(self, action: Action) -> Any:
        super().commit(action)
        raise TimeoutError("payment API timed out (the charge went through)")


@pytest.mark.xfail(
    strict=True,
    reason="a rail that raises from commit() is recorded as commit_failed, which answers the intent as 'not "
    "executed': a charge made before a timeout is neither judged nor compensated; the Rail protocol has no way "
    "to say 'outcome unknown' (see the s14 verdict report)",
)
def test_a_commit_whose_rail_raised_after_charging_is_executed_unknown(dataset):
    telemetry = otel_replay.configure(dataset, set_global=False)
    rail = _TimedOutRail(10_000)
    try:
        with audit("vendor_payment", snapshot=snapshot()) as d:
            d.act(payment(100))
            with pytest.raises(TimeoutError):
                ActionGate(rail, dataset=dataset).commit(payment(9000), record_id=d.record_id)
    finally:
        telemetry.shutdown()
    assert rail.balance == 1_000  # the $9,000 moved
    with otel_replay.open(dataset) as store:
        verdict = replay_stored(store, d.record_id, live_state=LIVE_500, policy=budget_policy)
    assert verdict.fix is not FixAction.ALLOW and "executed? unknown" in verdict.reason  # now: ALLOW ($100 fits)
