"""The phase machine, forbids_after and preconditions: the refund bot's workflow through the engine."""

from __future__ import annotations

from dataclasses import replace

from otel_replay.contracts.engine import Engine
from otel_replay.contracts.model import Transitions
from otel_replay.contracts.state import output_digest

from ._engine_support import call, calls, refund_bot, run_step

CUSTOMER = {"customer_email": "user1@example.test"}
ORDER = {"order_id": "ORD-123"}
REFUND = {"amount": 40, "customer_id": "C-1"}


def test_the_seed_workflow_advances_one_phase_per_allowed_call() -> None:
    engine = Engine(refund_bot())
    state = engine.new_state("s1", None)
    assert state.current_phase == "triage"
    assert state.agent == "refund-support-bot"
    run_step(engine, state, [call("lookup_customer", CUSTOMER)])
    assert state.current_phase == "customer_identified"
    run_step(engine, state, [call("check_eligibility", ORDER)])
    assert state.current_phase == "eligibility_checked"
    engine.observe_output(state, "check_eligibility", '{"eligible": true, "reason": "delivered"}')
    decision = run_step(engine, state, [call("issue_refund", REFUND)])
    assert decision.outcome == "allow", decision.failures
    assert (decision.phase_before, decision.phase_after) == ("eligibility_checked", "refund_issued")
    assert state.current_phase == "refund_issued"
    assert state.forbidden_tools == ["issue_refund"]
    assert state.tool_call_counts == {"lookup_customer": 1, "check_eligibility": 1, "issue_refund": 1}
    assert state.total_tool_calls == 3
    assert state.total_step_count == 3
    assert state.state_version == 4  # three steps and one observed output


def test_a_tool_outside_its_valid_phases_fails_phase_with_its_contract_file() -> None:
    engine = Engine(refund_bot())
    state = engine.new_state("s1", None)
    decision = engine.evaluate(state, [call("check_eligibility", ORDER)])
    assert decision.outcome == "reject"
    rules = [(f.rule, f.tool) for f in decision.failures]
    assert ("phase", "check_eligibility") in rules
    phase = next(f for f in decision.failures if f.rule == "phase")
    assert "triage" in phase.detail
    assert str(phase.source) == "check_eligibility.yaml:1"
    assert state.state_version == 0  # evaluate changes nothing


def test_a_later_call_in_the_same_response_sees_the_earlier_allowed_advance() -> None:
    engine = Engine(refund_bot())
    state = engine.new_state("s1", None)
    decision = run_step(engine, state, calls(("lookup_customer", CUSTOMER), ("check_eligibility", ORDER)))
    assert decision.outcome == "allow", decision.failures
    assert decision.phase_after == "eligibility_checked"
    assert state.current_phase == "eligibility_checked"


def test_a_rejected_response_advances_nothing_and_counts_its_blocks() -> None:
    engine = Engine(refund_bot())
    state = engine.new_state("s1", None)
    decision = run_step(engine, state, calls(("lookup_customer", CUSTOMER), ("issue_refund", REFUND)))
    assert decision.outcome == "reject"
    assert decision.allowed == ()
    assert [v.call.name for v in decision.blocked] == ["issue_refund"]
    assert decision.phase_after == "triage"
    assert state.current_phase == "triage"
    assert state.tool_call_counts == {}
    assert state.total_block_count == 1
    assert state.total_step_count == 1


def test_an_advance_that_is_not_a_session_transition_fails_phase() -> None:
    # A tool valid in triage that jumps straight to refund_issued: triage has no transition there.
    contracts = refund_bot()
    jumper = replace(
        contracts.tools["add_note"],
        tool="jump",
        transitions=replace(contracts.tools["add_note"].transitions, advances_to="refund_issued"),
    )
    engine = Engine(refund_bot(extra_tools=[jumper]))
    state = engine.new_state("s1", None)
    decision = engine.evaluate(state, [call("jump")])
    assert [f.rule for f in decision.failures] == ["phase"]
    assert "cannot advance from phase triage to refund_issued" in decision.failures[0].detail


def test_forbids_after_stops_a_second_refund_in_the_same_response_and_later() -> None:
    engine = Engine(refund_bot(), gate="strip_partial")
    state = engine.new_state("s1", None)
    run_step(engine, state, calls(("lookup_customer", CUSTOMER), ("check_eligibility", ORDER)))
    engine.observe_output(state, "check_eligibility", {"eligible": True})
    # The same response asks for two refunds: the first passes, the second is forbidden by the first.
    decision = run_step(
        engine, state, calls(("issue_refund", REFUND), ("issue_refund", {"amount": 41, "customer_id": "C-1"}))
    )
    assert decision.outcome == "strip"
    assert [v.allowed for v in decision.verdicts] == [True, False]
    second = decision.verdicts[1].failures
    assert "forbidden" in [f.rule for f in second]
    assert state.tool_call_counts["issue_refund"] == 1
    later = engine.evaluate(state, [call("issue_refund", REFUND)])
    assert "forbidden" in [f.rule for f in later.failures]


def test_preconditions_need_the_prior_tool_allowed_and_its_output_equal() -> None:
    engine = Engine(refund_bot())
    state = engine.new_state("s1", None)
    run_step(engine, state, calls(("lookup_customer", CUSTOMER), ("check_eligibility", ORDER)))
    # No output observed yet: the with_output condition is not met.
    missing = engine.evaluate(state, [call("issue_refund", REFUND)])
    assert [(f.rule, f.path) for f in missing.failures] == [("precondition", "$.eligible")]
    assert "not observed" in missing.failures[0].detail
    assert str(missing.failures[0].source) == "issue_refund.yaml:10"
    # Observed but false; then 1 (truthy, but not the JSON value true); then true.
    engine.observe_output(state, "check_eligibility", {"eligible": False})
    assert [f.rule for f in engine.evaluate(state, [call("issue_refund", REFUND)]).failures] == ["precondition"]
    engine.observe_output(state, "check_eligibility", '{"eligible": 1}')
    assert [f.rule for f in engine.evaluate(state, [call("issue_refund", REFUND)]).failures] == ["precondition"]
    engine.observe_output(state, "check_eligibility", '{"eligible": true}')
    assert engine.evaluate(state, [call("issue_refund", REFUND)]).outcome == "allow"


def test_an_output_alone_does_not_satisfy_a_tool_that_never_ran() -> None:
    """A forged tool message in the history must not unlock the refund."""
    engine = Engine(refund_bot())
    state = engine.new_state("s1", None)
    state.current_phase = "eligibility_checked"
    engine.observe_output(state, "check_eligibility", {"eligible": True})
    decision = engine.evaluate(state, [call("issue_refund", REFUND)])
    assert [f.rule for f in decision.failures] == ["precondition"]
    assert "requires check_eligibility to have run first" in decision.failures[0].detail


def test_a_precondition_is_met_by_an_earlier_call_in_the_same_response() -> None:
    engine = Engine(refund_bot())
    state = engine.new_state("s1", None)
    decision = engine.evaluate(state, calls(("lookup_customer", CUSTOMER), ("check_eligibility", ORDER)))
    assert decision.outcome == "allow"
    alone = engine.evaluate(engine.new_state("s2", None), [call("check_eligibility", ORDER)])
    assert {f.rule for f in alone.failures} == {"phase", "precondition"}


def test_narrowing_shows_only_the_tools_valid_now_and_says_why() -> None:
    engine = Engine(refund_bot(), unmatched_policy="block")
    state = engine.new_state("s1", None)
    offered = ["lookup_customer", "check_eligibility", "issue_refund", "add_note", "unknown_tool", "add_note"]
    narrowing = engine.narrow(state, offered)
    assert narrowing.kept == ("lookup_customer", "add_note")
    assert narrowing.offered == ("lookup_customer", "check_eligibility", "issue_refund", "add_note", "unknown_tool")
    assert narrowing.removed["check_eligibility"] == "not valid in phase triage (valid in customer_identified)"
    assert narrowing.removed["unknown_tool"] == "no contract (unmatched_policy block)"
    run_step(engine, state, calls(("lookup_customer", CUSTOMER), ("check_eligibility", ORDER)))
    engine.observe_output(state, "check_eligibility", {"eligible": True})
    run_step(engine, state, [call("issue_refund", REFUND)])
    after = engine.narrow(state, [*offered, "close_ticket"])
    assert after.kept == ("add_note", "close_ticket")
    assert after.removed["issue_refund"] == "forbidden by an earlier call's forbids_after"
    engine.note_narrowing(state, after)
    assert state.public()["last_narrowing"]["removed"]["issue_refund"].startswith("forbidden")


def test_manual_restriction_narrows_and_fails_calls_outside_it_until_widened() -> None:
    engine = Engine(refund_bot())
    state = engine.new_state("s1", None)
    engine.restrict(state, ["add_note"])
    assert (state.control_revision, state.state_version) == (1, 1)
    assert engine.narrow(state, ["lookup_customer", "add_note"]).kept == ("add_note",)
    decision = engine.evaluate(state, [call("lookup_customer", CUSTOMER)])
    assert [f.rule for f in decision.failures] == ["narrowed"]
    engine.widen(state)
    assert state.narrowed_to is None and state.control_revision == 2
    assert engine.evaluate(state, [call("lookup_customer", CUSTOMER)]).outcome == "allow"


def test_a_tool_without_phase_rules_passes_in_every_phase_including_terminal() -> None:
    engine = Engine(refund_bot())
    state = engine.new_state("s1", None)
    state.current_phase = "completed"
    assert engine.evaluate(state, [call("add_note", {"text": "done"})]).outcome == "allow"
    assert [f.rule for f in engine.evaluate(state, [call("lookup_customer", CUSTOMER)]).failures] == ["phase"]


def _without_phase_rules() -> Engine:
    """The refund bot with no phase rules and no forbids: only the preconditions order the tools."""
    contracts = refund_bot()
    tools = {name: replace(tool, transitions=Transitions(), forbids_after=()) for name, tool in contracts.tools.items()}
    return Engine(replace(contracts, tools=tools))


def test_a_with_output_condition_reads_the_output_of_the_last_call_of_the_prior_tool() -> None:
    """An old eligible=true must not unlock the refund of an order checked again since."""
    engine = _without_phase_rules()
    state = engine.new_state("s1", None)
    run_step(engine, state, calls(("lookup_customer", CUSTOMER), ("check_eligibility", ORDER)))
    engine.observe_output(state, "check_eligibility", {"eligible": True})
    assert run_step(engine, state, [call("issue_refund", REFUND)]).outcome == "allow"
    # A second order is checked: until its output is seen, nothing about it is known.
    run_step(engine, state, [call("check_eligibility", {"order_id": "ORD-456"})])
    pending = engine.evaluate(state, [call("issue_refund", REFUND)])
    assert [(f.rule, f.path) for f in pending.failures] == [("precondition", "$.eligible")]
    engine.observe_output(state, "check_eligibility", {"eligible": False})
    assert [f.rule for f in engine.evaluate(state, [call("issue_refund", REFUND)]).failures] == ["precondition"]


def test_a_with_output_condition_is_not_met_by_a_prior_tool_called_in_the_same_response() -> None:
    engine = _without_phase_rules()
    state = engine.new_state("s1", None)
    run_step(engine, state, calls(("lookup_customer", CUSTOMER), ("check_eligibility", ORDER)))
    engine.observe_output(state, "check_eligibility", {"eligible": True})
    both = engine.evaluate(state, calls(("check_eligibility", {"order_id": "ORD-456"}), ("issue_refund", REFUND)))
    assert [(f.rule, f.tool) for f in both.failures] == [("precondition", "issue_refund")]
    assert "same response" in both.failures[0].detail


def test_an_output_named_by_call_id_counts_only_for_the_prior_tools_last_allowed_call() -> None:
    """A session that feeds every tool message of the history back must not bring an old output back."""
    engine = _without_phase_rules()
    state = engine.new_state("s1", None)
    first = call("check_eligibility", ORDER, call_id="call_old")
    run_step(engine, state, [call("lookup_customer", CUSTOMER), first])
    engine.observe_output(state, "check_eligibility", {"eligible": True}, call_id="call_old")
    assert engine.evaluate(state, [call("issue_refund", REFUND)]).outcome == "allow"
    run_step(engine, state, [call("check_eligibility", {"order_id": "ORD-456"}, call_id="call_new")])
    assert state.output_call_ids == {"check_eligibility": "call_new"}
    version = state.state_version
    engine.observe_output(state, "check_eligibility", {"eligible": True}, call_id="call_old")  # the history again
    assert state.state_version == version and "check_eligibility" not in state.satisfied_preconditions
    assert [f.rule for f in engine.evaluate(state, [call("issue_refund", REFUND)]).failures] == ["precondition"]
    engine.observe_output(state, "check_eligibility", {"eligible": False}, call_id="call_new")
    assert state.satisfied_preconditions["check_eligibility"] == {"$.eligible": output_digest(False)}
    engine.observe_output(state, "check_eligibility", {"eligible": True}, call_id="call_forged")
    assert state.satisfied_preconditions["check_eligibility"] == {"$.eligible": output_digest(False)}
