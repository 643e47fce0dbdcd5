"""Drafting contracts from recorded sessions: they load, they pass on their own sessions, they flag an anomaly."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

import otel_replay
from otel_replay.contracts.backtest import backtest, backtest_dataset
from otel_replay.contracts.infer import infer_contracts, write_draft
from otel_replay.contracts.loader import load_contracts
from otel_replay.contracts.recorded import RecordedSession, recorded_sessions, refused_calls, sessions_from_rows
from otel_replay.contracts.session import govern
from otel_replay.contracts.store import MemoryStateStore
from otel_replay.errors import ContractError, ReplayContractError
from otel_replay.instrumentation import OpenAIInstrumentor, scripted

from .govern_support import GPT, REFUND_BOT
from .recorded import recorded_dataset, refund_session

NORMAL = {
    f"s{i}": [
        [("lookup_customer", {"customer_email": f"user{i}@example.com"})],
        [("search_orders", {"customer_id": "C1", "page": 1})],
        [("search_orders", {"customer_id": "C1", "page": 2, "status": "delivered"})],
        [("check_eligibility", {"order_id": f"ORD-{100 + i}"})],
        [("issue_refund", {"customer_id": "C1", "order_id": f"ORD-{100 + i}", "amount": 20.0 + 10 * i})],
    ]
    for i in range(5)
}
ANOMALIES = {
    "second-refund": [
        *NORMAL["s1"],
        [("issue_refund", {"customer_id": "C1", "order_id": "ORD-101", "amount": 30.0})],
    ],
    "huge-amount": [*NORMAL["s1"][:4], [("issue_refund", {"customer_id": "C1", "order_id": "ORD-101", "amount": 9e6})]],
    "skipped-check": [NORMAL["s1"][0], NORMAL["s1"][4]],
    "odd-order-id": [
        *NORMAL["s1"][:4],
        [("issue_refund", {"customer_id": "C1", "order_id": "x'; drop", "amount": 30})],
    ],
}


@pytest.fixture(scope="module")
def normal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return recorded_dataset(tmp_path_factory, "normal", NORMAL)


@pytest.fixture(scope="module")
def sessions(normal: Path) -> list[RecordedSession]:
    with otel_replay.open(normal) as store:
        return recorded_sessions(store)


@pytest.fixture(scope="module")
def drafted(sessions: list[RecordedSession], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("drafted") / "contracts"
    write_draft(infer_contracts(sessions), out)
    return out


def test_the_drafts_load_and_the_sessions_they_came_from_pass(drafted: Path, normal: Path) -> None:
    contracts = load_contracts(drafted)
    assert set(contracts.tools) == {"lookup_customer", "search_orders", "check_eligibility", "issue_refund"}
    with otel_replay.open(normal) as store:
        report = backtest_dataset(contracts, store)
    assert report.passed, [(s.session_id, [c.failures for c in s.blocked]) for s in report.sessions]
    assert len(report.sessions) == 5


def test_each_anomaly_is_flagged_with_its_rule(drafted: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    dataset = recorded_dataset(tmp_path_factory, "anomalies", ANOMALIES)
    with otel_replay.open(dataset) as store:
        report = {s.session_id: s for s in backtest_dataset(load_contracts(drafted), store).sessions}
    assert not any(s.passed for s in report.values())
    found = {sid: {(c.tool, f.rule) for c in s.blocked for f in c.failures} for sid, s in report.items()}
    assert ("issue_refund", "forbidden") in found["second-refund"]
    assert ("issue_refund", "argument_invariant") in found["huge-amount"]
    assert {("issue_refund", "phase"), ("issue_refund", "precondition")} <= found["skipped-check"]
    assert ("issue_refund", "argument_invariant") in found["odd-order-id"]


def test_phases_follow_the_observed_order(drafted: Path) -> None:
    session = yaml.safe_load((drafted / "session.yaml").read_text())
    assert [p["name"] for p in session["phases"]][0] == "start"
    assert session["transitions"] == {
        "start": ["after_lookup_customer"],
        "after_lookup_customer": ["after_check_eligibility"],
        "after_check_eligibility": ["after_issue_refund"],
    }
    search = yaml.safe_load((drafted / "search_orders.yaml").read_text())
    assert search["transitions"] == {"valid_in_phases": ["after_lookup_customer"]}  # repeated: it does not advance
    assert "forbids_after" not in search
    refund = yaml.safe_load((drafted / "issue_refund.yaml").read_text())
    assert refund["transitions"]["advances_to"] == "after_issue_refund"
    assert refund["forbids_after"] == ["issue_refund"]
    pre = {p["requires_prior_tool"]: p.get("with_output") for p in refund["preconditions"]}
    assert pre["check_eligibility"] == [{"path": "$.eligible", "equals": True}]


def test_argument_ranges_patterns_and_optional_arguments(drafted: Path) -> None:
    refund = yaml.safe_load((drafted / "issue_refund.yaml").read_text())
    rules = {r["path"]: r for r in refund["argument_value_invariants"]}
    amount = rules["$.amount"]
    assert amount["gte"] <= 20 and amount["lte"] >= 60 and amount["lte"] <= 100  # 20..60 widened by a quarter
    assert re.fullmatch(rules["$.order_id"]["regex"], "ORD-999")
    assert not re.search(rules["$.order_id"]["regex"], "x'; drop")
    search = yaml.safe_load((drafted / "search_orders.yaml").read_text())
    status = {r["path"]: r for r in search["argument_value_invariants"]}["$.status"]
    assert status["optional"] is True  # missing from some calls
    assert "$.page" in {r["path"] for r in search["argument_value_invariants"]}
    limits = yaml.safe_load((drafted / "session.yaml").read_text())["session_limits"]
    assert limits["max_calls_per_tool"] == {"search_orders": 3}  # 2 seen, a quarter more, at least one more
    assert limits["max_steps"] == math.ceil(6 * 1.25) and limits["max_tool_calls"] == math.ceil(5 * 1.25)
    assert limits["loop_detection"]["threshold"] >= 3


def test_every_rule_says_how_many_sessions_support_it(drafted: Path) -> None:
    text = (drafted / "issue_refund.yaml").read_text()
    assert "in 5 sessions" in text and "called before it in 5 of 5 sessions" in text
    assert "never called twice in a session (5 sessions)" in text
    assert "Review every rule before use" in (drafted / "session.yaml").read_text()


def test_write_draft_refuses_to_overwrite_unless_forced(sessions: list[RecordedSession], tmp_path: Path) -> None:
    draft = infer_contracts(sessions)
    out = tmp_path / "c"
    write_draft(draft, out)
    (out / "session.yaml").write_text("# mine\n")
    with pytest.raises(ContractError, match="not overwritten"):
        write_draft(draft, out)
    assert (out / "session.yaml").read_text() == "# mine\n"  # nothing was touched
    write_draft(draft, out, force=True)
    assert (out / "session.yaml").read_text() == draft.files["session.yaml"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(ContractError, match="is a file"):
        write_draft(draft, tmp_path / "file")


def test_nothing_to_draft_from_is_an_error(sessions: list[RecordedSession]) -> None:
    empty = [replace(s, steps=tuple(replace(step, calls=()) for step in s.steps)) for s in sessions]
    with pytest.raises(ContractError, match="holds a tool call"):
        infer_contracts(empty)
    with pytest.raises(ContractError, match="margin"):
        infer_contracts(sessions, margin=-1)
    with pytest.raises(ContractError, match="margin"):
        infer_contracts(sessions, margin=float("nan"))


HOSTILE = {
    "h1": [
        [("bad name/../x", {"a": 1})],
        [("session", {"a": 1})],
        [("fine", {"odd.name": 1, "n": float("1e300"), "nested": {"a": [1]}, "flag": True})],
        [("fine", {"password": "hunter2", "text": 'line one\nline "two" # not a comment: {x}', "n": -5})],
        [("fine", {"api key": 7, "n": 0})],
    ]
}


def test_hostile_names_keys_and_values_give_loadable_drafts(tmp_path_factory: pytest.TempPathFactory) -> None:
    dataset = recorded_dataset(tmp_path_factory, "hostile", HOSTILE)
    with otel_replay.open(dataset) as store:
        sessions = recorded_sessions(store)
    draft = infer_contracts(sessions)
    assert set(draft.files) == {"fine.yaml", "session.yaml"}
    assert any("bad name" in note for note in draft.notes) and any("'session'" in note for note in draft.notes)
    assert any("'password' was redacted" in note for note in draft.notes)
    # a secret-named key whose number redaction replaced by a bare marker: the recorded text is no longer JSON
    [broken] = [c for c in sessions[0].calls if c.missing]
    assert "redacted when recorded" in (broken.missing or "") and broken.arguments is None
    out = tmp_path_factory.mktemp("hostile-out") / "c"
    write_draft(draft, out)
    contracts = load_contracts(out)
    fine = yaml.safe_load((out / "fine.yaml").read_text())
    paths = {r["path"] for r in fine.get("argument_value_invariants", [])}
    assert paths == {"$.n", "$.text", '$["odd.name"]'}  # none for the redacted value, the nested one or the flag
    # the drafted file's only misses are the tools that cannot have a contract: unmatched, as they should be
    result = backtest(contracts, sessions)
    [session] = result.sessions
    assert {(c.tool, f.rule) for c in session.blocked for f in c.failures} == {
        ("bad name/../x", "unmatched"),
        ("session", "unmatched"),
    }


def test_without_captured_arguments_only_the_order_and_limits_are_drafted(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    dataset = recorded_dataset(
        tmp_path_factory, "blind-infer", {"a": refund_session(), "b": refund_session()}, capture=False
    )
    with otel_replay.open(dataset) as store:
        sessions = recorded_sessions(store)
        draft = infer_contracts(sessions)
        out = tmp_path_factory.mktemp("blind-out") / "c"
        write_draft(draft, out)
        assert backtest_dataset(load_contracts(out), store).passed
    assert not any("argument_value_invariants" in text for text in draft.files.values())
    assert "loop_detection" not in draft.files["session.yaml"]
    assert any("no recorded arguments" in note for note in draft.notes)


def _governed_dataset(path: Path, sessions: dict[str, float | None]) -> Path:
    """Refund sessions run under govern() with the refund bot's contracts, recorded with content capture.

    ``sessions``: id -> the amount of a second refund the model asks for (refused: forbidden), or None.
    """
    telemetry = otel_replay.configure(path, service_name="refund-bot", set_global=False)
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=telemetry.provider, capture_content=True)
    results = {"lookup_customer": {"customer_id": "C1"}, "check_eligibility": {"eligible": True}}
    try:
        for session_id, second in sessions.items():
            steps = [
                ("lookup_customer", {"customer_email": "ada@example.com"}),
                ("check_eligibility", {"order_id": "ORD-7"}),
                ("issue_refund", {"customer_id": "C1", "amount": 40.0, "currency": "USD"}),
            ]
            if second is not None:
                steps.append(("issue_refund", {"customer_id": "C1", "amount": second, "currency": "USD"}))
            replies = [
                scripted.chat_completion(None, model=GPT, tool_calls=[(f"{session_id}-{n}", name, args)])
                for n, (name, args) in enumerate(steps)
            ]
            with scripted.ScriptedServer(replies) as server:
                client = openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
                session = govern(
                    client,
                    REFUND_BOT,
                    session_id=session_id,
                    store=MemoryStateStore(),
                    tracer_provider=telemetry.provider,
                )
                messages: list[Any] = [{"role": "user", "content": "refund order ORD-7"}]
                with otel_replay.session(session_id):
                    for _ in steps:
                        try:
                            reply = session.client.chat.completions.create(model=GPT, messages=messages)
                        except ReplayContractError:
                            continue
                        message = reply.choices[0].message
                        messages.append(message.model_dump(exclude_none=True))
                        for call in message.tool_calls or ():
                            output = json.dumps(results.get(call.function.name, {"status": "processed"}))
                            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
                client.close()
    finally:
        instrumentor.uninstrument()
        telemetry.shutdown()
    return path


def test_calls_governance_refused_are_marked_and_left_out_of_the_draft(tmp_path: Path) -> None:
    """A refused second refund is evidence of what not to allow: the draft still forbids a second refund."""
    dataset = _governed_dataset(tmp_path / "traces", {"g1": 450.0, "g2": None, "g3": None})
    with otel_replay.open(dataset) as store:
        sessions = recorded_sessions(store)
    refused = [(s.session_id, c.name, c.call_id) for s in sessions for c in s.calls if c.refused]
    assert refused == [("g1", "issue_refund", "g1-3")]
    assert sum(len(s.calls) for s in sessions) == 10  # the refused call is recorded, only marked
    draft = infer_contracts(sessions)
    refund = yaml.safe_load(draft.files["issue_refund.yaml"])
    assert refund["forbids_after"] == ["issue_refund"]  # never called twice among the calls that ran
    [amount] = [rule for rule in refund["argument_value_invariants"] if rule["path"] == "$.amount"]
    assert amount["lte"] < 450  # the refused amount widened nothing
    assert any("1 tool calls refused by governance were left out" in note for note in draft.notes)
    out = tmp_path / "drafts"
    write_draft(draft, out)
    report = {s.session_id: s for s in backtest(load_contracts(out), sessions).sessions}
    assert report["g2"].passed and report["g3"].passed
    assert [(c.tool, {f.rule for f in c.failures} >= {"forbidden"}) for c in report["g1"].blocked] == [
        ("issue_refund", True)
    ]


def test_refused_calls_are_read_from_the_enforcing_decisions_only(tmp_path: Path) -> None:
    dataset = _governed_dataset(tmp_path / "traces", {"g1": 450.0})
    with otel_replay.open(dataset) as store:
        assert refused_calls(store) == {("g1", "g1-3")}
        rows = store.rows("SELECT count(*) AS n FROM contract_decisions WHERE mode = 'enforce'")
    assert rows[0]["n"] == 4
    assert sessions_from_rows([], frozenset({("x", "y")})) == []
