"""The ``contract_decisions`` and ``contract_failures`` views over stored ``replay.contract.decision`` spans."""

from __future__ import annotations

import json
from pathlib import Path

import otel_replay
from otel_replay import Telemetry

TOOLS = [
    {"call_id": "c1", "name": "issue_refund", "allowed": False, "arguments": '{"amount": 900}'},
    {"call_id": "c2", "name": "lookup_customer", "allowed": True, "arguments": "{}"},
]
FAILURES = [
    {"rule": "argument_invariant", "tool": "issue_refund", "call_id": "c1", "path": "$.amount",
     "detail": "issue_refund: $.amount 900 > 500", "source": "contracts/issue_refund.yaml:21"},
    {"rule": "forbidden", "tool": "issue_refund", "call_id": "c1", "path": None,
     "detail": "issue_refund is forbidden", "source": None},
]  # fmt: skip


def decision(telemetry: Telemetry, **attributes: object) -> None:
    tracer = telemetry.provider.get_tracer("otel_replay.contracts")
    with tracer.start_as_current_span("replay.contract.decision", attributes=attributes):  # type: ignore[arg-type]
        pass


def test_each_decision_is_a_row_and_each_failure_a_row(telemetry: Telemetry, dataset: Path) -> None:
    with otel_replay.session("s-1"):
        decision(
            telemetry,
            **{
                "replay.contract.session_id": "s-1",
                "replay.contract.agent": "refund-bot",
                "replay.contract.step": 3,
                "replay.contract.mode": "enforce",
                "replay.contract.outcome": "reject",
                "replay.contract.phase_before": "eligibility_checked",
                "replay.contract.phase_after": "eligibility_checked",
                "replay.contract.state_version": 7,
                "replay.contract.digest": "abc",
                "replay.contract.tools": json.dumps(TOOLS),
                "replay.contract.failures": json.dumps(FAILURES),
                "replay.contract.narrowed": json.dumps(["drop_table"]),
                "replay.contract.provider": "openai",
                "replay.contract.api": "chat.completions",
                "replay.contract.streamed": True,
                "replay.contract.tools.dropped": 5,
            },
        )
        decision(telemetry, **{"replay.contract.step": 4, "replay.contract.outcome": "allow",
                               "replay.contract.tools": "[]", "replay.contract.failures": "[]"})  # fmt: skip
    telemetry.shutdown()
    with otel_replay.open(dataset) as store:
        rows = store.rows("SELECT * FROM contract_decisions ORDER BY step")
        failures = store.rows("SELECT * FROM contract_failures ORDER BY rule")
    first, second = rows
    assert (first["session_id"], first["agent"], first["step"], first["outcome"]) == ("s-1", "refund-bot", 3, "reject")
    assert (first["tool_calls"], first["blocked_calls"], first["state_version"]) == (2, 1, 7)
    assert json.loads(first["narrowed"]) == ["drop_table"] and first["contracts_digest"] == "abc"
    assert (first["provider"], first["api"], first["streamed"], first["tools_dropped"]) == (
        "openai", "chat.completions", True, 5,
    )  # fmt: skip
    assert (second["streamed"], second["tools_dropped"]) == (False, 0)
    assert second["session_id"] == "s-1"  # from the span's session id when the attribute is absent
    assert (second["tool_calls"], second["blocked_calls"]) == (0, 0)
    assert [(f["rule"], f["path"], f["source"]) for f in failures] == [
        ("argument_invariant", "$.amount", "contracts/issue_refund.yaml:21"),
        ("forbidden", None, None),
    ]
    assert {f["step"] for f in failures} == {3}


def test_hostile_attribute_values_give_nulls_not_errors(telemetry: Telemetry, dataset: Path) -> None:
    for tools, failures in (("[1", "not json{"), ('{"a": 1}', '{"rule": "x"}'), ("[1, 2]", "[1, null]"), ("", "")):
        decision(telemetry, **{"replay.contract.tools": tools, "replay.contract.failures": failures,
                               "replay.contract.step": "three"})  # fmt: skip
    telemetry.shutdown()
    with otel_replay.open(dataset) as store:
        rows = store.rows("SELECT step, tool_calls, blocked_calls FROM contract_decisions")
        failures = store.rows("SELECT rule FROM contract_failures")
    assert len(rows) == 4 and all(row["step"] is None for row in rows)
    assert sorted(str(r["tool_calls"]) for r in rows) == ["0", "2", "None", "None"]
    assert [f["rule"] for f in failures] == [None, None]  # the array [1, null]: two entries, neither an object
