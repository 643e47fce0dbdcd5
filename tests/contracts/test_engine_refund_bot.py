"""The seed's refund bot, loaded from its YAML fixture, end to end through the engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_replay.contracts.engine import Engine
from otel_replay.contracts.loader import load_contracts

from ._engine_support import call, run_step

REFUND_BOT = Path(__file__).parent / "refund_bot"
ALL_TOOLS = ["lookup_customer", "check_eligibility", "issue_refund"]
CUSTOMER = {"customer_email": "user1@example.test"}
ORDER = {"order_id": "ORD-123"}
REFUND = {"amount": 40, "currency": "USD", "customer_id": "C42"}
USAGE = (1_000, 200)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(load_contracts(REFUND_BOT), gate="strip_partial")


def test_the_workflow_narrows_one_tool_per_phase_and_refunds_once(engine: Engine) -> None:
    state = engine.new_state("refund-1", None)
    steps = [
        ("lookup_customer", CUSTOMER, "customer_identified"),
        ("check_eligibility", ORDER, "eligibility_checked"),
        ("issue_refund", REFUND, "refund_issued"),
    ]
    for name, arguments, phase in steps:
        assert engine.precheck(state, "gpt-4o-mini") == ()
        assert engine.narrow(state, ALL_TOOLS).kept == (name,)
        decision = run_step(engine, state, [call(name, arguments)], model="gpt-4o-mini", usage=USAGE)
        assert decision.outcome == "allow", decision.failures
        assert state.current_phase == phase
        engine.observe_output(state, name, {"eligible": True} if name == "check_eligibility" else {"ok": True})
    assert engine.narrow(state, ALL_TOOLS).kept == ()
    # The model insists on a second refund: forbidden, and issue_refund's gate is "block", so the response is rejected.
    decision = engine.evaluate(state, [call("lookup_customer", CUSTOMER), call("issue_refund", REFUND, index=1)])
    assert decision.outcome == "reject"
    assert {f.rule for f in decision.verdicts[1].failures} >= {"forbidden", "max_calls_per_tool", "phase"}
    assert decision.verdicts[1].escalated
    assert state.total_cost == pytest.approx(3 * (1_000 * 0.15 + 200 * 0.60) / 1e6)
    assert state.public()["tool_call_counts"] == {"lookup_customer": 1, "check_eligibility": 1, "issue_refund": 1}


def test_an_ineligible_order_blocks_the_refund_naming_the_contract_line(engine: Engine) -> None:
    state = engine.new_state("refund-2", None)
    run_step(engine, state, [call("lookup_customer", CUSTOMER)])
    run_step(engine, state, [call("check_eligibility", ORDER)])
    engine.observe_output(state, "check_eligibility", '{"eligible": false, "reason": "not delivered"}')
    decision = engine.evaluate(state, [call("issue_refund", REFUND)])
    (failure,) = decision.failures
    assert (failure.rule, failure.path) == ("precondition", "$.eligible")
    assert failure.source is not None and failure.source.file.endswith("issue_refund.yaml")
    assert failure.source.line == 14  # the with_output item: - path: "$.eligible"


def test_an_amount_out_of_range_and_an_unknown_currency_are_each_reported(engine: Engine) -> None:
    state = engine.new_state("refund-3", None)
    state.current_phase = "eligibility_checked"
    decision = engine.evaluate(state, [call("issue_refund", {"amount": 900, "currency": "BTC", "customer_id": "C1"})])
    rules = [(f.rule, f.path) for f in decision.failures if f.rule == "argument_invariant"]
    assert rules == [("argument_invariant", "$.amount"), ("argument_invariant", "$.currency")]


def test_three_blocked_responses_kill_the_session(engine: Engine) -> None:
    state = engine.new_state("refund-4", None)
    for _ in range(3):
        run_step(engine, state, [call("issue_refund", REFUND)])
    assert state.killed
    assert [f.rule for f in engine.precheck(state, "gpt-4o-mini")] == ["kill"]


def test_the_cost_cap_needs_the_model_in_the_price_table(engine: Engine) -> None:
    state = engine.new_state("refund-5", None)
    assert [f.detail for f in engine.precheck(state, "gpt-5")] == [
        "model 'gpt-5' has no price: max_cost_per_session needs one in prices"
    ]
