"""SessionState: the JSON round trip, the refusal of corrupt or newer states, and the redacted public snapshot."""

from __future__ import annotations

import json
from typing import Any

import pytest

from otel_replay.contracts.engine import Engine
from otel_replay.contracts.state import STATE_FORMAT, SessionState, SessionStateError, output_digest

from ._engine_support import call, calls, refund_bot, run_step


def _busy_state() -> SessionState:
    engine = Engine(refund_bot(), gate="strip_blocked")
    state = engine.new_state("sess-1", None)
    run_step(
        engine,
        state,
        calls(("lookup_customer", {"customer_email": "a@b.test"}), ("check_eligibility", {"order_id": "ORD-1"})),
    )
    engine.observe_output(state, "check_eligibility", {"eligible": True, "email": "jane@example.test"})
    run_step(engine, state, [call("issue_refund", {"amount": 10, "customer_id": "C"})])
    engine.restrict(state, ["add_note"])
    engine.note_narrowing(state, engine.narrow(state, ["add_note", "issue_refund"]))
    engine.kill(state, "operator stop")
    return state


def test_a_state_round_trips_through_json_exactly() -> None:
    state = _busy_state()
    again = SessionState.from_json(state.to_json())
    assert again == state
    assert again.to_json() == state.to_json()
    assert state.copy() == state and state.copy() is not state


def test_a_copy_shares_no_list_or_object_with_its_original() -> None:
    """Shadow mode and the memory store change copies in place: nothing of a copy may reach back."""
    state = _busy_state()
    before = state.to_json()
    twin = state.copy()
    assert twin == state
    for name, value in vars(state).items():
        if isinstance(value, dict | list):  # every container field (a field added later too) is copied
            assert getattr(twin, name) is not value, name
    twin.tool_call_counts["lookup_customer"] += 5
    twin.forbidden_tools.append("add_note")
    twin.recent_calls.clear()
    assert twin.narrowed_to is not None and twin.last_step is not None and twin.last_narrowing is not None
    twin.narrowed_to.append("issue_refund")
    twin.satisfied_preconditions["check_eligibility"]["$.eligible"] = output_digest(False)
    twin.last_step["allowed"].append("issue_refund")
    twin.last_narrowing["removed"]["x"] = "y"
    twin.output_call_ids["x"] = "y"
    assert state.to_json() == before


def test_public_snapshot_has_the_seed_fields_with_principal_none_and_values_redacted() -> None:
    state = _busy_state()
    public = state.public()
    assert public["principal"] is None
    assert public["satisfied_preconditions"] == {"check_eligibility": {"$.eligible": "[REDACTED]"}}
    assert "jane@example.test" not in json.dumps(public)
    for name in (
        "session_id",
        "agent",
        "current_phase",
        "state_version",
        "control_revision",
        "total_step_count",
        "total_tool_calls",
        "total_cost",
        "actual_cost",
        "tool_call_counts",
        "forbidden_tools",
        "killed",
        "total_block_count",
        "consecutive_block_count",
        "total_unguarded_calls",
        "last_step",
        "last_narrowing",
        "started_at",
    ):
        assert name in public, name
    assert public["current_phase"] == "refund_issued"
    assert public["killed"] is True and public["kill_reason"] == "operator stop"
    assert public["started_at"].endswith("+00:00")
    assert public["last_step"]["allowed"] == ["issue_refund"]
    json.dumps(public)  # serialisable
    public["tool_call_counts"]["x"] = 1
    assert "x" not in state.tool_call_counts  # a snapshot, not a view


def _without(name: str) -> str:
    """A saved state with one field taken out (a default must never stand in: it would widen the session)."""
    body = json.loads(SessionState(session_id="s").to_json())
    del body[name]
    return json.dumps(body)


def _body(**changes: Any) -> str:
    body = json.loads(SessionState(session_id="s").to_json())
    body.update(changes)
    return json.dumps(body)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not JSON"),
        ("[]", "a JSON object expected"),
        (json.dumps({"session_id": "s"}), "no integer 'format'"),
        (_body(format=STATE_FORMAT + 1), "written by a newer otel-replay"),
        (_body(surprise=1), "unknown field 'surprise'"),
        (_body(session_id=5), "'session_id' must be text"),
        (_body(total_tool_calls=-1), "'total_tool_calls' must be a non-negative integer"),
        (_body(total_tool_calls=True), "'total_tool_calls'"),
        (_body(actual_cost="1"), "'actual_cost'"),
        (_body(tool_call_counts={"a": "1"}), "'tool_call_counts'"),
        (_body(forbidden_tools="issue_refund"), "'forbidden_tools'"),
        (_body(killed=1), "'killed'"),
        (_body(narrowed_to=[1]), "'narrowed_to'"),
        (_body(satisfied_preconditions={"t": 1}), "'satisfied_preconditions'"),
        ('{"format": 1, "session_id": "s", "actual_cost": NaN}', "'actual_cost'"),
        (_body(actual_cost=10**400), "'actual_cost'"),
        (_body(killed_at=-(10**400)), "'killed_at'"),
        (_without("forbidden_tools"), "'forbidden_tools' is missing"),
        (_without("killed"), "'killed' is missing"),
        (_without("tool_call_counts"), "'tool_call_counts' is missing"),
    ],
)
def test_a_corrupt_or_newer_state_is_refused_naming_where(text: str, message: str) -> None:
    with pytest.raises(SessionStateError, match="^sessions.sqlite3 session 's'.*") as caught:
        SessionState.from_json(text, where="sessions.sqlite3 session 's'")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_state_with_nan_cost_cannot_be_saved() -> None:
    state = SessionState(session_id="s", actual_cost=float("nan"))
    with pytest.raises(ValueError, match="not JSON compliant"):
        state.to_json()


def test_a_tool_name_shaped_like_a_secret_never_reaches_the_public_snapshot() -> None:
    """Under unmatched_policy allow the model names the tool: it may echo a key it saw in its context."""
    key = "sk-proj-" + "a1B2c3D4e5" * 4
    engine = Engine(refund_bot(), unmatched_policy="allow", gate="strip_blocked")
    state = engine.new_state("s", None)
    run_step(engine, state, calls((key, {}), ("add_note", {})))
    run_step(
        engine,
        state,
        calls(
            ("sk-ant-" + "z9Y8x7W6v5" * 4, {}),
        ),
    )
    engine.restrict(state, [key, "add_note"])
    engine.note_narrowing(state, engine.narrow(state, [key, "add_note"]))
    public = state.public()
    text = json.dumps(public)
    assert key not in text and "z9Y8x7W6v5" not in text
    assert public["tool_call_counts"] == {"[REDACTED]": 2, "add_note": 1}
    # the state keeps such a name redacted too (it is saved in the session store); no contract, so no limit counts it
    assert key not in json.dumps(state.tool_call_counts) and state.tool_call_counts["[REDACTED]"] == 2
