"""The backtest: sessions recorded with the real openai client, run through the seed's refund-bot contracts offline."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import otel_replay
from otel_replay.contracts.backtest import backtest, backtest_dataset
from otel_replay.contracts.loader import load_contracts
from otel_replay.contracts.recorded import recorded_sessions

from .recorded import recorded_dataset, refund_session

CONTRACTS = Path(__file__).parent / "refund_bot"

DOUBLE_REFUND = [
    *refund_session(),
    [("issue_refund", {"customer_id": "C1", "order_id": "ORD-1", "amount": 40.0, "currency": "USD"})],
]
SESSIONS = {
    "clean": refund_session(),
    "double-refund": DOUBLE_REFUND,
    "too-much": refund_session(900.0),
    "not-eligible": refund_session(order="ORD-0"),
    "refund-first": [refund_session()[2], *refund_session()],
    "malformed": [*refund_session()[:2], [("issue_refund", '{"amount": 40, "customer_id": ')]],
    "unknown-tool": [[("delete_account", {"customer_id": "C1"})]],
    "two-calls": [refund_session()[0], [("check_eligibility", {"order_id": "ORD-1"}), ("drop_table", {})]],
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return recorded_dataset(tmp_path_factory, "backtest", SESSIONS)


@pytest.fixture(scope="module")
def report(dataset: Path):
    with otel_replay.open(dataset) as store:
        return {s.session_id: s for s in backtest_dataset(load_contracts(CONTRACTS), store).sessions}


def rules(session) -> list[tuple[int, str, str]]:
    return [(call.step, call.tool, failure.rule) for call in session.blocked for failure in call.failures]


def test_the_sessions_come_back_in_order_with_their_arguments_and_results(dataset: Path) -> None:
    with otel_replay.open(dataset) as store:
        sessions = {s.session_id: s for s in recorded_sessions(store)}
    assert set(sessions) == set(SESSIONS)
    clean = sessions["clean"]
    assert [c.name for c in clean.calls] == ["lookup_customer", "check_eligibility", "issue_refund"]
    assert len(clean.steps) == 4 and clean.steps[-1].calls == ()  # the closing text-only answer is a step too
    assert clean.steps[0].model == "gpt-4o-mini" and clean.steps[0].usage == (100, 20)
    assert clean.calls[1].output == {"eligible": True, "reason": "delivered"} and clean.calls[1].executions == 1
    assert clean.calls[2].arguments == {"customer_id": "C1", "order_id": "ORD-1", "amount": 40.0, "currency": "USD"}
    assert clean.agent == "refund-bot" and clean.key_kind == "session"


def test_a_session_inside_the_contracts_passes(report) -> None:
    clean = report["clean"]
    assert clean.passed and clean.blocked == () and clean.final_phase == "refund_issued"


def test_a_second_refund_is_blocked_by_forbids_after_and_the_per_tool_limit(report) -> None:
    session = report["double-refund"]
    assert not session.passed
    [call] = session.blocked
    assert (call.step, call.tool) == (4, "issue_refund")
    by_rule = {f.rule: f for f in call.failures}
    assert {"forbidden", "max_calls_per_tool"} <= set(by_rule)
    assert by_rule["max_calls_per_tool"].source is not None
    assert by_rule["max_calls_per_tool"].source.file.endswith("session.yaml")


def test_an_amount_over_the_limit_names_the_path_and_the_contract_line(report) -> None:
    [call] = report["too-much"].blocked
    [failure] = call.failures
    assert failure.rule == "argument_invariant" and failure.path == "$.amount"
    assert failure.source is not None and failure.source.file.endswith("issue_refund.yaml")
    assert failure.source.line == 21  # the `- path: "$.amount"` entry
    assert "900" in failure.detail or "500" in failure.detail


def test_a_refund_after_a_negative_eligibility_fails_its_with_output_precondition(report) -> None:
    [call] = report["not-eligible"].blocked
    assert [(f.rule, f.path) for f in call.failures] == [("precondition", "$.eligible")]


def test_a_blocked_call_does_not_move_the_session_on(report) -> None:
    session = report["refund-first"]
    first = session.blocked[0]
    assert first.step == 1 and {f.rule for f in first.failures} >= {"phase", "precondition"}
    # the blocked refund never ran: the workflow after it passes from the start, the refund included
    assert [c.step for c in session.blocked] == [1] and session.final_phase == "refund_issued"


def test_malformed_arguments_from_the_model_are_a_verdict(report) -> None:
    [call] = report["malformed"].blocked
    assert call.tool == "issue_refund" and {f.rule for f in call.failures} == {"malformed_arguments"}


def test_a_tool_without_a_contract_is_unmatched(report) -> None:
    [call] = report["unknown-tool"].blocked
    assert call.tool == "delete_account" and [f.rule for f in call.failures] == ["unmatched"]


def test_under_reject_all_the_passing_call_goes_with_its_response(report) -> None:
    session = report["two-calls"]
    assert [(c.tool, c.with_response) for c in session.blocked] == [("check_eligibility", True), ("drop_table", False)]
    assert session.steps[1].outcome == "reject" and session.final_phase == "customer_identified"


def test_strip_blocked_lets_the_passing_call_through(dataset: Path) -> None:
    with otel_replay.open(dataset) as store:
        result = backtest_dataset(load_contracts(CONTRACTS), store, session_id="two-calls", gate="strip_blocked")
    [session] = result.sessions
    assert [c.tool for c in session.blocked] == ["drop_table"]
    assert session.steps[1].outcome == "strip" and session.final_phase == "eligibility_checked"


def test_a_missing_price_refuses_every_model_call_before_it_is_made(dataset: Path, tmp_path: Path) -> None:
    contracts = tmp_path / "contracts"
    shutil.copytree(CONTRACTS, contracts)
    session_yaml = contracts / "session.yaml"
    session_yaml.write_text(session_yaml.read_text().replace("gpt-4o-mini:", "gpt-other:"))
    with otel_replay.open(dataset) as store:
        [session] = backtest_dataset(load_contracts(contracts), store, session_id="clean").sessions
    assert len(session.refused_steps) == 4
    assert {f.rule for s in session.refused_steps for f in s.refused} == {"max_cost"}
    assert "gpt-4o-mini" in session.refused_steps[0].refused[0].detail


def test_the_report_is_json_ready_and_counts_what_was_blocked(dataset: Path) -> None:
    with otel_replay.open(dataset) as store:
        result = backtest_dataset(load_contracts(CONTRACTS), store)
    data = result.as_dict()
    assert data["sessions_checked"] == len(SESSIONS) and data["passed"] is False
    assert data["sessions_blocked"] == len(SESSIONS) - 1
    assert data["blocked_calls"] == result.blocked_calls == sum(len(s["blocked"]) for s in data["sessions"])
    assert data["digest"] == load_contracts(CONTRACTS).digest


def test_uncaptured_arguments_are_left_unchecked_and_said_so(tmp_path_factory: pytest.TempPathFactory) -> None:
    sessions = {"blind": [*refund_session(900.0), refund_session()[2]]}
    dataset = recorded_dataset(tmp_path_factory, "blind", sessions, capture=False)
    with otel_replay.open(dataset) as store:
        [session] = backtest_dataset(load_contracts(CONTRACTS), store).sessions
    # the over-limit amount cannot be seen; the second refund is still forbidden, and the with_output
    # condition on an unrecorded eligibility result is not held against the agent
    [call] = session.blocked
    assert call.step == 4 and {f.rule for f in call.failures} >= {"forbidden"}
    refund = session.steps[2].calls[0]
    assert refund.allowed and any("argument rules" in u for u in refund.unchecked)
    assert any("with_output of check_eligibility" in u for u in refund.unchecked)
    assert any("not checked" in note for note in session.notes)


def test_a_recorded_tool_error_streak_trips_the_circuit_breaker(tmp_path_factory: pytest.TempPathFactory) -> None:
    contracts = tmp_path_factory.mktemp("breaker") / "contracts"
    shutil.copytree(CONTRACTS, contracts)
    (contracts / "broken_lookup.yaml").write_text("tool: broken_lookup\nside_effect: read\n")
    steps = [[("broken_lookup", {"q": 1})], [("broken_lookup", {"q": 2})], *refund_session()]
    dataset = recorded_dataset(tmp_path_factory, "breaker", {"errors": steps})
    with otel_replay.open(dataset) as store:
        [session] = backtest_dataset(load_contracts(contracts), store).sessions
    assert session.killed and "consecutive tool errors" in (session.kill_reason or "")
    assert session.refused_steps[0].number == 3 and session.refused_steps[0].refused[0].rule == "kill"


def test_sessions_without_a_session_id_are_grouped_by_correlation_id(tmp_path_factory: pytest.TempPathFactory) -> None:
    dataset = recorded_dataset(tmp_path_factory, "corr", {"corr-1": refund_session()}, correlation=True)
    with otel_replay.open(dataset) as store:
        [session] = backtest_dataset(load_contracts(CONTRACTS), store).sessions
    assert session.session_id == "corr-1" and session.key_kind == "correlation" and session.passed


def test_a_flood_of_tool_calls_is_checked_and_the_unrecorded_rest_counted(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    flood = [[("lookup_customer", {"customer_email": f"u{i}@example.com"}) for i in range(300)]]
    dataset = recorded_dataset(tmp_path_factory, "flood", {"flood": flood})
    with otel_replay.open(dataset) as store:
        [session] = backtest_dataset(load_contracts(CONTRACTS), store).sessions
    assert len(session.steps[0].calls) == 128  # what the instrumentor records per response
    assert any("172 tool calls were not recorded" in note for note in session.notes)
    assert session.steps[0].outcome == "reject" and len(session.blocked) == 128


def test_backtest_takes_sessions_from_anywhere(dataset: Path) -> None:
    with otel_replay.open(dataset) as store:
        sessions = [s for s in recorded_sessions(store) if s.session_id == "clean"]
    assert backtest(load_contracts(CONTRACTS), sessions).passed
    assert backtest(load_contracts(CONTRACTS), []).passed  # nothing checked, nothing blocked
