"""Loop detection, the circuit breaker and kill: a session that goes round in circles or keeps failing stops."""

from __future__ import annotations

import pytest

from otel_replay.contracts.engine import Engine, StaleDecisionError
from otel_replay.contracts.model import CircuitBreaker, LoopDetection, SessionLimits, Source

from ._engine_support import call, calls, refund_bot, run_step, src

LOOP = LoopDetection(window=4, threshold=3, source=Source("session.yaml", 22))


def _engine(**limits: object) -> Engine:
    return Engine(refund_bot(limits=SessionLimits(**limits)), gate="strip_blocked")  # type: ignore[arg-type]


def test_the_third_identical_call_in_the_window_is_a_loop() -> None:
    engine = _engine(loop_detection=LOOP)
    state = engine.new_state("s", None)
    run_step(engine, state, [call("add_note", {"a": 1, "b": 2})])
    run_step(engine, state, [call("add_note", {"b": 2, "a": 1})])  # same canonical arguments
    decision = run_step(engine, state, [call("add_note", {"a": 1, "b": 2})])
    (failure,) = decision.failures
    assert failure.rule == "loop"
    assert failure.detail == "add_note called with the same arguments 3 times in the last 4 calls (threshold 3)"
    assert str(failure.source) == "session.yaml:22"
    assert engine.evaluate(state, [call("add_note", {"a": 1, "b": 3})]).outcome == "allow"


def test_calls_in_one_response_count_toward_the_loop() -> None:
    engine = _engine(loop_detection=LOOP)
    state = engine.new_state("s", None)
    decision = engine.evaluate(state, calls(("add_note", {}), ("add_note", {}), ("add_note", {})))
    assert [v.allowed for v in decision.verdicts] == [True, True, False]


def test_identical_calls_spread_wider_than_the_window_are_not_a_loop() -> None:
    engine = _engine(loop_detection=LOOP)
    state = engine.new_state("s", None)
    for other in range(6):
        run_step(engine, state, [call("add_note", {"same": True})])
        decision = run_step(engine, state, calls(("add_note", {"n": other}), ("add_note", {"m": other})))
        assert decision.outcome == "allow", decision.failures
    assert len(state.recent_calls) == 4


def test_a_blocked_call_still_enters_the_loop_window() -> None:
    engine = _engine(loop_detection=LOOP)
    state = engine.new_state("s", None)
    for _ in range(2):
        run_step(engine, state, [call("issue_refund", {"amount": 5})])  # blocked by phase each time
    decision = engine.evaluate(state, [call("issue_refund", {"amount": 5})])
    assert "loop" in [f.rule for f in decision.failures]


def test_consecutive_blocked_calls_trip_the_breaker_and_kill_the_session() -> None:
    engine = _engine(circuit_breaker=CircuitBreaker(Source("session.yaml", 30), consecutive_blocks=3))
    state = engine.new_state("s", None)
    run_step(engine, state, calls(("issue_refund", {}), ("close_ticket", {})))
    run_step(engine, state, [call("add_note", {})])  # a clean response resets the streak
    assert state.consecutive_block_count == 0
    run_step(engine, state, calls(("issue_refund", {}), ("close_ticket", {})))
    assert not state.killed
    run_step(engine, state, [call("issue_refund", {})])
    assert state.killed
    assert state.kill_reason == "circuit breaker: 3 consecutive blocked calls"
    assert state.killed_at is not None
    assert [f.rule for f in engine.precheck(state, None)] == ["kill"]
    assert [f.rule for f in engine.evaluate(state, [call("add_note", {})]).failures] == ["kill"]


def test_consecutive_tool_errors_trip_the_breaker_and_an_output_resets_the_streak() -> None:
    engine = _engine(circuit_breaker=CircuitBreaker(Source("session.yaml", 30), consecutive_errors=2))
    state = engine.new_state("s", None)
    engine.observe_error(state, "lookup_customer", TimeoutError("slow"))
    engine.observe_output(state, "lookup_customer", {"customer_id": "C1"})
    engine.observe_error(state, "lookup_customer", TimeoutError("slow"))
    assert not state.killed and state.total_error_count == 2
    engine.observe_error(state, "lookup_customer", ConnectionError("down"))
    assert state.killed
    assert state.kill_reason == "circuit breaker: 2 consecutive tool errors (last: lookup_customer ConnectionError)"


def test_kill_keeps_the_first_reason_and_time() -> None:
    engine = _engine()
    state = engine.new_state("s", None)
    engine.kill(state, "operator")
    first = (state.killed_at, state.kill_reason, state.state_version)
    engine.kill(state, "again")
    assert (state.killed_at, state.kill_reason, state.state_version) == first
    (failure,) = engine.precheck(state, None)
    assert failure.detail == "session s was killed (operator)"


def test_finalize_refuses_a_decision_made_on_an_older_state() -> None:
    engine = _engine()
    state = engine.new_state("s", None)
    decision = engine.evaluate(state, [call("add_note", {})])
    engine.observe_output(state, "add_note", "ok")  # another thread changed the state in between
    with pytest.raises(StaleDecisionError, match="evaluated on state version 0, the state is at 1"):
        engine.finalize(state, decision, model=None, usage=None)
    assert state.total_step_count == 0


@pytest.mark.parametrize(
    "spellings",
    [
        ['{"note": 1}', '{"note": 1.0}'],
        ['{"note": 1.0}', '{"note": 1e0}', '{"note": 10e-1}'],
        ['{"note": 0}', '{"note": -0.0}'],
        ['{"n": {"a": [2, 3.0]}}', '{"n": {"a": [2.0, 3]}}'],
        ['{"note": "\\u0061"}', '{"note": "a"}'],
        ['{"a": 1, "b": 2}', '{"b": 2, "a": 1}'],
    ],
)
def test_one_value_spelt_two_ways_is_the_same_call_for_the_loop(spellings: list[str]) -> None:
    """The model must not dodge loop detection by writing 1 as 1.0 or reordering keys."""
    limits = SessionLimits(loop_detection=LoopDetection(window=10, threshold=2, source=src("session.yaml", 20)))
    engine = Engine(refund_bot(limits=limits))
    state = engine.new_state("s", None)
    run_step(engine, state, [call("add_note", text=spellings[0])])
    decision = engine.evaluate(state, [call("add_note", text=spellings[1])])
    assert [f.rule for f in decision.failures] == ["loop"]
