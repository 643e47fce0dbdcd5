"""Hostile model output never crashes the engine: each bad call gets a verdict and a Failure."""

from __future__ import annotations

import json
from typing import Any

import pytest

from otel_replay.contracts.checks import REGEX_MAX_CHARS
from otel_replay.contracts.decisions import strict_json
from otel_replay.contracts.engine import Engine, ToolCallView, parse_arguments
from otel_replay.contracts.model import ArgumentInvariant, Price, SessionLimits, Source, ToolContract
from otel_replay.contracts.state import SessionState, output_digest

from ._engine_support import call, refund_bot, run_step

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    "text",
    [
        '{"customer_email": ',
        "not json",
        "[1, 2]",
        '"a string"',
        "42",
        "null",
        '{"v": NaN}',
        '{"v": Infinity}',
        '{"v": -Infinity}',
        '{"a": ' * 50_000 + "1" + "}" * 50_000,
        DEEP,
        "\udcff",
        '{"a": 1} trailing',
    ],
)
def test_arguments_that_are_not_a_json_object_fail_malformed_arguments(text: str) -> None:
    engine = Engine(refund_bot())
    state = engine.new_state("s", None)
    view = ToolCallView.parse(0, "c", "lookup_customer", text)
    assert view.arguments is None
    decision = run_step(engine, state, [view])
    assert decision.outcome == "reject"
    assert [f.rule for f in decision.failures] == ["malformed_arguments"]
    assert state.total_block_count == 1


def test_empty_arguments_text_is_an_empty_object() -> None:
    assert ToolCallView.parse(0, "c", "add_note", "  ").arguments == {}


@pytest.mark.parametrize("value", [None, 12, b"\xff\xfe", ["{}"]])
def test_parse_arguments_never_raises(value: Any) -> None:
    assert parse_arguments(value) is None


def test_ten_thousand_tool_calls_get_ten_thousand_verdicts() -> None:
    limits = SessionLimits(max_tool_calls=8, max_calls_per_tool={"add_note": 5})
    engine = Engine(refund_bot(limits=limits), gate="strip_blocked")
    state = engine.new_state("s", None)
    views = [call("add_note", {"n": i}, index=i) for i in range(10_000)]
    decision = run_step(engine, state, views)
    assert len(decision.verdicts) == 10_000
    assert sum(v.allowed for v in decision.verdicts) == 5
    assert decision.outcome == "strip"
    assert state.tool_call_counts == {"add_note": 5}
    assert state.total_block_count == 9_995
    assert state.to_json()  # still saves


def test_a_one_mebibyte_argument_is_checked_not_choked_on() -> None:
    engine = Engine(refund_bot())
    state = engine.new_state("s", None)
    huge = "x" * (1 << 20)
    decision = engine.evaluate(state, [call("lookup_customer", {"customer_email": huge + "@example.test"})])
    (failure,) = decision.failures
    assert (
        failure.detail
        == f"lookup_customer: $.customer_email is {len(huge) + 13} characters, over 8192 to match /^.+@.+/"
    )
    refund = engine.evaluate(state, [call("issue_refund", {"amount": 1, "customer_id": huge})])
    details = [f.detail for f in refund.failures]
    assert any("over max_length 32" in d for d in details)
    assert all(len(d) <= 300 for d in details)


def test_a_long_argument_cannot_stall_an_unanchored_regex() -> None:
    """``[a-z]+@`` searched in 1 MiB of letters would take hours; the text is refused unmatched instead."""
    tool = ToolContract(
        tool="t",
        source=Source("t.yaml", 1),
        argument_value_invariants=(ArgumentInvariant(path="$.v", source=Source("t.yaml", 3), regex="[a-z]+@"),),
    )
    engine = Engine(refund_bot(extra_tools=[tool]))
    state = engine.new_state("s", None)
    assert engine.evaluate(state, [call("t", {"v": "a" * REGEX_MAX_CHARS + "@"})]).outcome == "reject"
    assert engine.evaluate(state, [call("t", {"v": "a" * (REGEX_MAX_CHARS - 1) + "@"})]).outcome == "allow"
    decision = engine.evaluate(state, [call("t", {"v": "a" * (1 << 20)})])
    assert "over 8192 to match" in decision.failures[0].detail


def test_nan_and_infinite_arguments_passed_as_values_fail_the_bounds() -> None:
    engine = Engine(refund_bot())
    state = engine.new_state("s", None)
    state.current_phase = "eligibility_checked"
    for bad in (float("nan"), float("inf")):
        view = ToolCallView(0, "c", "issue_refund", "{}", {"amount": bad, "customer_id": "c"})
        rules = [f.rule for f in engine.evaluate(state, [view]).failures]
        assert "argument_invariant" in rules


def test_deeply_nested_arguments_given_as_values_are_evaluated() -> None:
    nested: Any = 1
    for _ in range(5_000):
        nested = {"a": nested}
    engine = Engine(refund_bot(limits=SessionLimits(loop_detection=None)))
    state = engine.new_state("s", None)
    decision = run_step(engine, state, [ToolCallView(0, "c", "add_note", "{}", {"deep": nested})])
    assert decision.outcome == "allow"


@pytest.mark.parametrize("name", ["", " ", "a" * 100_000, "lookup_customer\n", "ISSUE_REFUND"])
def test_odd_tool_names_are_unmatched_and_the_detail_stays_short(name: str) -> None:
    engine = Engine(refund_bot())
    decision = engine.evaluate(engine.new_state("s", None), [call(name, {})])
    assert [f.rule for f in decision.failures] == ["unmatched"]
    assert len(decision.failures[0].detail) <= 300


def test_a_non_text_tool_name_or_call_id_from_a_careless_caller_is_a_verdict() -> None:
    engine = Engine(refund_bot())
    view = ToolCallView(0, None, ["x"], "{}", {})  # type: ignore[arg-type]
    decision = engine.evaluate(engine.new_state("s", None), [view])
    assert decision.outcome == "reject"
    assert len(decision.verdicts) == 1


@pytest.mark.parametrize("output", ["not json", DEEP, '{"eligible": NaN}', b"\xff", None, 12, {"eligible": {1, 2}}])
def test_an_unreadable_tool_output_satisfies_nothing_and_never_raises(output: Any) -> None:
    engine = Engine(refund_bot())
    state = engine.new_state("s", None)
    engine.observe_output(state, "check_eligibility", output)
    assert state.satisfied_preconditions == {"check_eligibility": {}}
    assert state.to_json()


@pytest.mark.parametrize(
    "usage", [(-5, 10), (True, 3), ("100", 1), None, (1,), (10**30, 0), (10**400, 10**400), (1.5, 2)]
)
def test_hostile_usage_counts_never_raise_and_never_lower_the_cost(usage: Any) -> None:
    engine = Engine(refund_bot(prices={"m": Price(1.0, 2.0, Source("session.yaml", 30))}))
    cost = engine.cost("m", usage)
    assert 0.0 <= cost < float("inf")
    state = engine.new_state("s", None)
    engine.charge(state, model="m", usage=usage)
    assert state.actual_cost == cost
    assert state.to_json()


def test_narrowing_odd_offers_keeps_text_names_once_and_ignores_the_rest() -> None:
    engine = Engine(refund_bot(), unmatched_policy="allow")
    state = engine.new_state("s", None)
    offered: list[Any] = ["add_note", None, 3, "add_note", "x" * 10_000, *(f"t{n}" for n in range(10_000))]
    narrowing = engine.narrow(state, offered)
    assert narrowing.kept[:2] == ("add_note", "t0")
    assert len(narrowing.kept) == 10_001
    assert "is not a tool name" in narrowing.removed["x" * 10_000]  # over 128 characters: no provider takes it
    engine.restrict(state, ["add_note", None, "add_note", 7])  # type: ignore[list-item]
    assert state.narrowed_to == ["add_note"]


@pytest.mark.parametrize(
    "text",
    [
        '{"amount": 1, "amount": 99999, "customer_id": "c1"}',
        '{"amount": 99999, "amount": 1, "customer_id": "c1"}',
        '{"amount": 1, "customer_id": "c1", "meta": {"k": 1, "k": 2}}',
        '{"amount": 1, "customer_id": "c1", "\\u0061mount": 99999, "amount": 2}',
    ],
)
def test_a_key_given_twice_is_malformed_whichever_copy_the_tool_would_read(text: str) -> None:
    """JSON parsers disagree on which copy of a duplicate key wins: the checked one must be the one that runs."""
    engine = Engine(refund_bot())
    state = engine.new_state("s", None)
    state.current_phase = "eligibility_checked"
    state.tool_call_counts = {"lookup_customer": 1, "check_eligibility": 1}
    state.satisfied_preconditions = {"check_eligibility": {"$.eligible": output_digest(True)}}
    assert engine.evaluate(state, [call("issue_refund", {"amount": 1, "customer_id": "c1"})]).outcome == "allow"
    view = ToolCallView.parse(0, "c", "issue_refund", text)
    assert view.arguments is None
    assert [f.rule for f in engine.evaluate(state, [view]).failures] == ["malformed_arguments"]


def test_a_tool_output_with_a_key_given_twice_satisfies_nothing() -> None:
    engine = Engine(refund_bot())
    state = engine.new_state("s", None)
    engine.observe_output(state, "check_eligibility", '{"eligible": false, "eligible": true}')
    assert state.satisfied_preconditions["check_eligibility"] == {}


@pytest.mark.parametrize(
    "name",
    [
        "Issue_Refund",
        "ISSUE_REFUND",
        "issue_refund ",
        " issue_refund",
        "issue_refund\u200b",
        "\u0456ssue_refund",
        "\uff49\uff53\uff53\uff55\uff45_refund",
        "issue refund",
        "issue_refund\n",
    ],
)
def test_under_unmatched_allow_a_name_that_only_looks_like_a_contracted_tool_still_fails(name: str) -> None:
    """Case, spaces, invisible and look-alike letters must not carry a contracted tool past its contract."""
    engine = Engine(refund_bot(), unmatched_policy="allow")
    state = engine.new_state("s", None)
    decision = engine.evaluate(state, [call(name, {"amount": 99999})])
    assert decision.outcome == "reject"
    assert [f.rule for f in decision.failures] == ["unmatched"]
    assert engine.evaluate(state, [call("send_survey", {})]).outcome == "allow"  # a plain unknown name still passes


def test_narrowing_under_unmatched_allow_removes_the_names_a_call_would_fail_on() -> None:
    engine = Engine(refund_bot(), unmatched_policy="allow")
    narrowing = engine.narrow(engine.new_state("s", None), ["lookup_customer", "Lookup_Customer", "send survey", "faq"])
    assert narrowing.kept == ("lookup_customer", "faq")
    assert narrowing.removed["Lookup_Customer"] == "no contract and looks like the contracted tool lookup_customer"
    assert "is not a tool name" in narrowing.removed["send survey"]


@pytest.mark.parametrize(
    ("usage", "expected"),
    [((1_000_000.0, 0), 1.0), ((2e6, 1e6), 4.0), ((float("nan"), 1_000_000), 2.0), ((float("inf"), 0), 1e9)],
)
def test_token_counts_given_as_floats_are_charged_not_dropped(usage: Any, expected: float) -> None:
    """A usage of 1e6 tokens written as a float must not cost nothing (infinite ones count as the 10**15 cap)."""
    engine = Engine(refund_bot(prices={"m": Price(1.0, 2.0, Source("session.yaml", 30))}))
    assert engine.cost("m", usage) == expected


def test_a_price_so_large_its_cost_overflows_still_leaves_a_state_that_saves() -> None:
    engine = Engine(refund_bot(prices={"m": Price(1e300, 1e300, Source("session.yaml", 30))}))
    state = engine.new_state("s", None)
    engine.charge(state, model="m", usage=(10**15, 10**15))
    engine.charge(state, model="m", usage=(10**15, 10**15))
    assert 0 < state.actual_cost < float("inf")
    assert SessionState.from_json(state.to_json()).actual_cost == state.actual_cost


@pytest.mark.parametrize("pad", [150, 190, 195, 199, 290, 295])
def test_a_secret_cut_where_a_detail_or_name_is_shortened_is_still_redacted(pad: int) -> None:
    """Shortening before redacting leaves a key's first characters, too short for redaction to know them."""
    key = "sk-proj-" + "a1B2c3D4e5" * 4
    engine = Engine(refund_bot())
    decision = engine.evaluate(engine.new_state("s", None), [call("x" * pad + " " + key, {})])
    detail = decision.failures[0].detail
    assert "sk-proj" not in detail and "a1B2" not in detail
    assert len(detail) <= 300


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1}',
        b'{"a": [1, 2.5, "x"]}',
        '{"a": 1}'.encode("utf-16"),
        bytearray(b'{"a": null}'),
        "\ufeff{}",
        b"\xef\xbb\xbf{}",
        b"\xff\xfe\x00",
        "",
        12,
        None,
    ],
)
def test_strict_json_reads_what_json_loads_reads_and_refuses_what_it_refuses(text: Any) -> None:
    """The strict reader keeps one decoder for speed: bytes, byte order marks and odd types behave as json.loads."""
    try:
        expected: Any = ("ok", json.loads(text))
    except Exception as exc:  # noqa: BLE001 - the comparison is of the exception's type
        expected = ("error", type(exc))
    try:
        got: Any = ("ok", strict_json(text))
    except Exception as exc:  # noqa: BLE001
        got = ("error", type(exc))
    assert got == expected
