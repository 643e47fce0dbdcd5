"""Session limits: max_steps, max_tool_calls, max_calls_per_tool, the cost cap and the price table."""

from __future__ import annotations

import pytest

from otel_replay.contracts.engine import Engine
from otel_replay.contracts.model import Price, SessionLimits, Source

from ._engine_support import call, calls, refund_bot, run_step

PRICES = {"small": Price(1.0, 2.0, Source("session.yaml", 40))}


def test_max_steps_stops_the_model_call_after_the_last_allowed_step() -> None:
    engine = Engine(refund_bot(limits=SessionLimits(max_steps=2)))
    state = engine.new_state("s", None)
    for _ in range(2):
        assert engine.precheck(state, None) == ()
        run_step(engine, state, [])
    (failure,) = engine.precheck(state, None)
    assert (failure.rule, failure.detail) == ("max_steps", "max_steps 2 reached")
    assert str(failure.source) == "session.yaml:1"


def test_a_rejected_response_is_a_step_too() -> None:
    engine = Engine(refund_bot(limits=SessionLimits(max_steps=1)))
    state = engine.new_state("s", None)
    run_step(engine, state, [call("issue_refund", {})])
    assert [f.rule for f in engine.precheck(state, None)] == ["max_steps"]


def test_max_tool_calls_counts_allowed_calls_across_steps_and_within_one_response() -> None:
    engine = Engine(refund_bot(limits=SessionLimits(max_tool_calls=3)), gate="strip_blocked")
    state = engine.new_state("s", None)
    run_step(engine, state, calls(("add_note", {"n": 1}), ("add_note", {"n": 2})))
    decision = run_step(engine, state, calls(("add_note", {"n": 3}), ("add_note", {"n": 4})))
    assert [v.allowed for v in decision.verdicts] == [True, False]
    assert decision.verdicts[1].failures[0].rule == "max_tool_calls"
    assert state.total_tool_calls == 3
    assert engine.narrow(state, ["add_note"]).removed == {"add_note": "max_tool_calls 3 reached"}


def test_blocked_calls_do_not_use_up_max_tool_calls() -> None:
    engine = Engine(refund_bot(limits=SessionLimits(max_tool_calls=1)), gate="strip_blocked")
    state = engine.new_state("s", None)
    run_step(engine, state, [call("issue_refund", {})])  # blocked: wrong phase
    assert state.total_tool_calls == 0
    assert engine.evaluate(state, [call("add_note", {})]).outcome == "allow"


def test_max_calls_per_tool_allows_exactly_the_cap() -> None:
    engine = Engine(refund_bot(limits=SessionLimits(max_calls_per_tool={"add_note": 2})), gate="strip_blocked")
    state = engine.new_state("s", None)
    decision = run_step(engine, state, calls(("add_note", {"n": 1}), ("add_note", {"n": 2}), ("add_note", {"n": 3})))
    assert [v.allowed for v in decision.verdicts] == [True, True, False]
    failure = decision.verdicts[2].failures[0]
    assert (failure.rule, failure.detail) == ("max_calls_per_tool", "max_calls_per_tool 2 for add_note reached")
    assert engine.narrow(state, ["add_note", "lookup_customer"]).kept == ("lookup_customer",)
    # Other tools are not limited by add_note's cap.
    assert engine.evaluate(state, [call("lookup_customer", {"customer_email": "a@b"})]).outcome == "allow"


def test_cost_is_usage_times_the_price_per_million() -> None:
    engine = Engine(refund_bot(prices=PRICES))
    assert engine.cost("small", (1_000_000, 500_000)) == pytest.approx(2.0)
    assert engine.cost("small", None) == 0.0
    assert engine.cost("unpriced", (10, 10)) == 0.0
    assert engine.cost(None, (10, 10)) == 0.0


def test_the_cost_cap_counts_every_model_call_including_rejected_ones() -> None:
    engine = Engine(refund_bot(limits=SessionLimits(max_cost_per_session=3.0), prices=PRICES))
    state = engine.new_state("s", None)
    assert engine.precheck(state, "small") == ()
    run_step(engine, state, [call("issue_refund", {})], model="small", usage=(1_000_000, 0))  # rejected
    assert (state.actual_cost, state.total_cost) == (1.0, 0.0)
    run_step(engine, state, [], model="small", usage=(0, 500_000))  # committed
    assert (state.actual_cost, state.total_cost) == (2.0, 1.0)
    engine.charge(state, model="small", usage=(1_000_000, 0))  # a response that was never evaluated
    assert (state.actual_cost, state.total_cost) == (3.0, 1.0)
    (failure,) = engine.precheck(state, "small")
    assert failure.rule == "max_cost"
    assert failure.detail == "max_cost_per_session 3 reached (spent 3)"


@pytest.mark.parametrize(
    ("model", "named"), [("gpt-unknown", "model 'gpt-unknown' has no price"), (None, "no model named")]
)
def test_a_cost_cap_without_a_price_for_the_model_fails_the_precheck_naming_it(model: str | None, named: str) -> None:
    engine = Engine(refund_bot(limits=SessionLimits(max_cost_per_session=1.0), prices=PRICES))
    (failure,) = engine.precheck(engine.new_state("s", None), model)
    assert failure.rule == "max_cost"
    assert failure.detail == f"{named}: max_cost_per_session needs one in prices"


def test_without_a_cap_an_unpriced_model_is_fine() -> None:
    engine = Engine(refund_bot())
    assert engine.precheck(engine.new_state("s", None), "anything") == ()


def test_precheck_reports_every_limit_reached_at_once() -> None:
    engine = Engine(refund_bot(limits=SessionLimits(max_steps=0, max_cost_per_session=1.0), prices=PRICES))
    assert [f.rule for f in engine.precheck(engine.new_state("s", None), "nope")] == ["max_steps", "max_cost"]


def test_under_a_cost_cap_a_response_from_an_unpriced_model_costs_the_dearest_price_never_nothing() -> None:
    """The response may name another model than the request did (a dated snapshot): tokens are never free."""
    prices = {**PRICES, "large": Price(5.0, 3.0, Source("session.yaml", 44))}
    engine = Engine(refund_bot(limits=SessionLimits(max_cost_per_session=10.0), prices=prices))
    assert engine.cost("small-2024-07-18", (1_000_000, 1_000_000)) == 5.0 + 3.0  # the dearest input and output
    state = engine.new_state("s", None)
    assert engine.precheck(state, "small") == ()
    run_step(engine, state, [call("add_note", {})], model="small-2024-07-18", usage=(1_000_000, 1_000_000))
    engine.charge(state, model=None, usage=(1_000_000, 0))
    assert state.actual_cost == 13.0
    assert [f.rule for f in engine.precheck(state, "small")] == ["max_cost"]
    # Without a cap an unpriced model still costs nothing: there is nothing to hold.
    assert Engine(refund_bot(prices=prices)).cost("small-2024-07-18", (10, 10)) == 0.0
