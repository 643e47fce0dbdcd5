from __future__ import annotations

import pytest

from otel_replay import Action, FixAction, ReplayUndecidable, audit, replay

from .._support import budget_policy, payment, snapshot


def _record(action: Action | None = None):
    with audit("vendor_payment", snapshot=snapshot()) as d:
        d.act(action or payment())
    return d.record


LIVE_OK = {"budget_remaining": 9_000, "allow_list": ["acme-supplies"]}
LIVE_DROPPED = {"budget_remaining": 3_000, "allow_list": ["acme-supplies"]}


def test_allow_when_justified_live():
    verdict = replay(_record(), live_state=LIVE_OK, policy=budget_policy)
    assert verdict.fix is FixAction.ALLOW and verdict.justified and verdict.reason == "within budget"


def test_rollback_when_only_the_snapshot_justified_it():
    record = _record()
    verdict = replay(record, live_state=LIVE_DROPPED, policy=budget_policy)
    assert verdict.fix is FixAction.ROLLBACK and not verdict.justified
    assert verdict.record_id == record.record_id and "over budget" in verdict.reason


def test_block_when_not_justified_even_on_snapshot():
    record = _record(payment(recipient="mallory"))
    verdict = replay(record, live_state=LIVE_OK, policy=budget_policy)
    assert verdict.fix is FixAction.BLOCK and "recipient not allow-listed" in verdict.reason


def test_human_review_when_policy_cannot_decide():
    def undecidable(state, action):
        raise ReplayUndecidable("FX rate feed stale; cannot price the payment")

    verdict = replay(_record(), live_state=LIVE_OK, policy=undecidable)
    assert verdict.fix is FixAction.HUMAN_REVIEW
    assert verdict.reason == "FX rate feed stale; cannot price the payment"


def test_replay_is_pure_against_mutating_policy():
    record = _record()
    live = {"budget_remaining": 3_000, "allow_list": ["acme-supplies"]}

    def vandal(state, action):
        state["budget_remaining"] = 0
        state["allow_list"].clear()
        action.arguments["recipient"] = "mallory"  # type: ignore[index]
        return False, "vandalised"

    replay(record, live_state=live, policy=vandal)
    assert live == {"budget_remaining": 3_000, "allow_list": ["acme-supplies"]}
    assert record.snapshot.state["allow_list"] == ["acme-supplies"]
    assert record.action.arguments == {"recipient": "acme-supplies"}


def test_policy_sees_snapshot_state_on_second_question():
    seen = []

    def spy(state, action):
        seen.append(state["budget_remaining"])
        return state["budget_remaining"] >= action.cost, "spy"

    replay(_record(), live_state=LIVE_DROPPED, policy=spy)
    assert seen == [3_000, 10_000]


def test_record_without_action_cannot_be_replayed():
    with audit("x", snapshot=snapshot()) as d:
        pass
    with pytest.raises(ValueError, match="has no action"):
        replay(d.record, live_state=LIVE_OK, policy=budget_policy)


def test_bad_policy_return_is_a_clear_type_error():
    with pytest.raises(TypeError, match=r"must return \(justified, reason\)"):
        replay(_record(), live_state=LIVE_OK, policy=lambda s, a: True)  # type: ignore[arg-type,return-value]
