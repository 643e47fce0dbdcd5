"""Gate modes, escalation by effective gate, unmatched tools and on_error: what a failing call does to its response."""

from __future__ import annotations

from typing import Any

import pytest

from otel_replay.contracts.engine import Engine, ToolCallView
from otel_replay.contracts.model import ArgumentInvariant, SessionLimits, ToolContract
from otel_replay.errors import ContractError, ContractLoadError

from ._engine_support import call, calls, refund_bot, run_step, src

CUSTOMER = {"customer_email": "user1@example.test"}


def _mixed() -> list[ToolCallView]:
    """One passing call (add_note) and one failing call (check_eligibility in triage)."""
    return calls(("add_note", {"text": "hi"}), ("check_eligibility", {"order_id": "ORD-1"}))


def _all_failing() -> list[ToolCallView]:
    return calls(("check_eligibility", {"order_id": "ORD-1"}), ("close_ticket", {}))


@pytest.mark.parametrize(
    ("gate", "mixed", "all_failing"),
    [
        ("reject_all", "reject", "reject"),
        ("strip_partial", "strip", "reject"),
        ("strip_blocked", "strip", "text_only"),
    ],
)
def test_each_gate_mode_turns_failures_into_its_outcome(gate: str, mixed: str, all_failing: str) -> None:
    engine = Engine(refund_bot(), gate=gate)
    state = engine.new_state("s1", None)
    decision = engine.evaluate(state, _mixed())
    assert decision.outcome == mixed
    assert [v.call.name for v in decision.blocked] == ["check_eligibility"]
    assert [v.call.name for v in decision.allowed] == ([] if mixed == "reject" else ["add_note"])
    assert engine.evaluate(state, _all_failing()).outcome == all_failing
    assert engine.evaluate(state, calls(("add_note", {}))).outcome == "allow"
    assert engine.evaluate(state, []).outcome == "allow"


def test_a_strip_commits_only_the_allowed_calls() -> None:
    engine = Engine(refund_bot(), gate="strip_blocked")
    state = engine.new_state("s1", None)
    run_step(engine, state, _mixed())
    assert state.tool_call_counts == {"add_note": 1}
    assert (state.total_block_count, state.consecutive_block_count) == (1, 1)
    run_step(engine, state, calls(("add_note", {})))
    assert (state.total_block_count, state.consecutive_block_count) == (1, 0)


@pytest.mark.parametrize("gate", ["strip_partial", "strip_blocked"])
def test_a_failing_call_of_a_block_gated_tool_rejects_the_whole_response(gate: str) -> None:
    # close_ticket is side_effect write; risk_defaults make write tools "block": escalated.
    engine = Engine(refund_bot(risk_defaults={"write": "block"}), gate=gate)
    state = engine.new_state("s1", None)
    decision = engine.evaluate(state, calls(("add_note", {}), ("close_ticket", {})))
    assert decision.outcome == "reject"
    assert [v.escalated for v in decision.verdicts] == [False, True]
    # A tool's own gate wins over the risk default.
    engine = Engine(refund_bot(risk_defaults={"financial": "allow"}, issue_refund_gate="block"), gate=gate)
    refund = engine.evaluate(state, calls(("add_note", {}), ("issue_refund", {"amount": 1, "customer_id": "c"})))
    assert refund.outcome == "reject"


def test_a_passing_call_of_a_block_gated_tool_passes() -> None:
    engine = Engine(refund_bot(risk_defaults={"read": "block"}), gate="strip_partial")
    state = engine.new_state("s1", None)
    assert engine.evaluate(state, [call("lookup_customer", CUSTOMER)]).outcome == "allow"


def test_unmatched_policy_block_fails_a_tool_without_contract_and_allow_lets_it_pass() -> None:
    blocking = Engine(refund_bot())
    state = blocking.new_state("s1", None)
    decision = blocking.evaluate(state, [call("delete_everything", {"really": True})])
    assert [(f.rule, f.tool) for f in decision.failures] == [("unmatched", "delete_everything")]
    allowing = Engine(refund_bot(), unmatched_policy="allow")
    decision = run_step(allowing, state, [call("delete_everything", {"really": True})])
    assert decision.outcome == "allow"
    assert state.tool_call_counts == {"delete_everything": 1}


def test_session_rules_still_apply_to_an_unmatched_tool_under_allow() -> None:
    engine = Engine(refund_bot(limits=SessionLimits(max_calls_per_tool={"ping": 1})), unmatched_policy="allow")
    state = engine.new_state("s1", None)
    run_step(engine, state, [call("ping")])
    assert [f.rule for f in engine.evaluate(state, [call("ping")]).failures] == ["max_calls_per_tool"]


class _Exploding(dict[str, Any]):
    """Arguments whose every read raises: an internal error while evaluating."""

    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("boom")

    def __contains__(self, key: object) -> bool:
        raise RuntimeError("boom")


def _exploding_call() -> ToolCallView:
    return ToolCallView(0, "c0", "lookup_customer", '{"customer_email": "x@y"}', _Exploding(customer_email="x@y"))


def test_on_error_block_fails_the_call_closed() -> None:
    engine = Engine(refund_bot(), on_error="block")
    state = engine.new_state("s1", None)
    decision = engine.evaluate(state, [_exploding_call()])
    assert decision.outcome == "reject"
    assert [f.rule for f in decision.failures] == ["internal_error"]
    assert "RuntimeError" in decision.failures[0].detail


def test_on_error_allow_lets_the_call_through_and_counts_it_unguarded() -> None:
    engine = Engine(refund_bot(), on_error="allow")
    state = engine.new_state("s1", None)
    decision = run_step(engine, state, [_exploding_call()])
    assert decision.outcome == "allow"
    assert decision.verdicts[0].unguarded
    assert state.total_unguarded_calls == 1
    assert state.tool_call_counts == {"lookup_customer": 1}


@pytest.mark.parametrize(
    ("option", "value"), [("gate", "strip_all"), ("unmatched_policy", "warn"), ("on_error", "ignore")]
)
def test_an_unknown_option_is_refused_by_name(option: str, value: str) -> None:
    with pytest.raises(ContractError, match=f"{option}='{value}'"):
        Engine(refund_bot(), **{option: value})


def test_a_bad_regex_is_refused_at_construction_naming_its_file_and_line() -> None:
    bad = ToolContract(
        tool="bad",
        source=src("bad.yaml"),
        argument_value_invariants=(ArgumentInvariant(path="$.x", source=src("bad.yaml", 6), regex="(unclosed"),),
    )
    with pytest.raises(ContractLoadError, match=r"bad\.yaml:6: argument_value_invariants: regex"):
        Engine(refund_bot(extra_tools=[bad]))
