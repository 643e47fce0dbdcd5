"""Agent-framework runs for tests/interop/frameworks: bare then instrumented, and what they left in the dataset."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import otel_replay
from otel_replay import instrumentation
from otel_replay.instrumentation import scripted

T = TypeVar("T")

__all__ = [
    "ANSWER_BOTH",
    "ASK_BOTH",
    "Landed",
    "assert_both_cities_answered",
    "assert_oslo_streamed",
    "bare_then_instrumented",
    "landed",
    "requests_sent",
    "streamed_oslo",
]

# the join README and the schema reference give from a tool execution to the model call that asked for it
_ASKED_BY = """
SELECT a.tool_call_id, m.response_id
FROM acts a JOIN model_calls m ON m.tool_calls LIKE '%"' || a.tool_call_id || '"%'
WHERE a.source = 'tool'
"""


@dataclass(frozen=True)
class Landed:
    """The rows of one run: ``model_calls`` in start order, tool ``acts`` by call id, and the README's join."""

    model_calls: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    asked_by: dict[str, str]
    """Each tool execution's call id -> the response id of the model call listing it."""

    def calls(self) -> list[tuple[Any, ...]]:
        """Per model call: response id, model, tokens in and out, finish reasons, the tool calls' ids, streamed."""
        return [
            (
                row["response_id"],
                row["model"],
                row["input_tokens"],
                row["output_tokens"],
                json.loads(row["finish_reasons"] or "null"),
                [(call["id"], call["name"]) for call in json.loads(row["tool_calls"] or "[]")],
                row["streamed"],
            )
            for row in self.model_calls
        ]

    def by_call_id(self) -> dict[str, dict[str, Any]]:
        """The tool executions by the model's call id (one each: a second would be a duplicate row)."""
        found = {row["tool_call_id"]: row for row in self.tools}
        assert len(found) == len(self.tools), [row["tool_call_id"] for row in self.tools]
        return found


def landed(dataset: Path) -> Landed:
    """Read a flushed dataset's model calls and tool executions."""
    with otel_replay.open(dataset) as store:
        calls = store.rows("SELECT * FROM model_calls ORDER BY start_time")
        tools = store.rows("SELECT * FROM acts WHERE source = 'tool' ORDER BY start_time")
        joined = store.rows(_ASKED_BY)
    asked_by: dict[str, str] = {}
    for row in joined:
        assert row["tool_call_id"] not in asked_by, f"two model calls list {row['tool_call_id']}"
        asked_by[row["tool_call_id"]] = row["response_id"]
    return Landed(calls, tools, asked_by)


def bare_then_instrumented(
    telemetry: otel_replay.Telemetry,
    dataset: Path,
    run: Callable[[Callable[..., Any], bool], T],
    tool: Callable[..., Any],
    agent: str,
    capture: bool,
) -> tuple[Landed, T]:
    """``run(tool, False)`` bare, then ``run(ours, True)`` instrumented as a user does it; both saw the same.

    Instrumented: our client instrumentation on, ``tool`` wrapped by our ``@tool``, the run inside
    ``invoke_agent(agent)``. Returns the rows the instrumented run left and what it saw.
    """
    bare = run(tool, False)
    instrumentation.instrument(tracer_provider=telemetry.provider, capture_content=capture)
    try:
        ours = instrumentation.tool(side_effect="read", capture_content=capture, tracer_provider=telemetry.provider)(
            tool
        )
        with instrumentation.invoke_agent(agent, tracer_provider=telemetry.provider):
            observed = run(ours, True)
    finally:
        instrumentation.uninstrument()
    telemetry.shutdown()
    assert observed == bare
    return landed(dataset), observed


ASK_BOTH = scripted.chat_completion(
    None,
    tool_calls=[
        ("call_oslo", "get_weather", {"city": "Oslo"}),
        ("call_rome", "get_weather", {"city": "Rome", "days": "2"}),
    ],
    usage=(31, 12),
    response_id="chatcmpl-ask",
)
"""The two-city scenario's ask: Oslo with ``days`` left out (its default), Rome with ``days`` as the text ``"2"``."""
ANSWER_BOTH = scripted.chat_completion("Rain in both.", usage=(58, 5), response_id="chatcmpl-answer")
"""The two-city scenario's answer, once both tools ran."""


def assert_both_cities_answered(rows: Landed) -> None:
    """The two-city scenario both frameworks run: one ask for Oslo (the default left out) and Rome (``days: "2"``).

    Two model calls (the ask, with both tool calls, and the answer), each tool run an act that names the call it
    answered with the arguments the framework validated, the README's join back to the ask, all in one trace.
    """
    both = [("call_oslo", "get_weather"), ("call_rome", "get_weather")]
    assert rows.calls() == [
        ("chatcmpl-ask", "gpt-test", 31, 12, ["tool_calls"], both, False),
        ("chatcmpl-answer", "gpt-test", 58, 5, ["stop"], [], False),
    ]
    tools = rows.by_call_id()
    assert {call_id: json.loads(row["action_arguments"]) for call_id, row in tools.items()} == {
        "call_oslo": {"city": "Oslo", "days": 1},  # the default the model left out, which the framework passed
        "call_rome": {"city": "Rome", "days": 2},  # the model's "2", as the framework validated it
    }
    assert {call_id: row["tool_result"] for call_id, row in tools.items()} == {
        "call_oslo": "rain in Oslo",
        "call_rome": "rain in Rome",
    }
    assert rows.asked_by == {"call_oslo": "chatcmpl-ask", "call_rome": "chatcmpl-ask"}
    assert {row["trace_id"] for row in rows.model_calls + rows.tools} == {rows.model_calls[0]["trace_id"]}


def streamed_oslo() -> list[scripted.Reply]:
    """The one-city streamed scenario: the ask for Oslo's weather, then the answer, each a chat stream with usage."""
    return [
        scripted.chat_stream((), tool_calls=[("call_oslo", "get_weather", {"city": "Oslo"})], usage=(40, 9),
                             response_id="chatcmpl-ask"),
        scripted.chat_stream(("Rain ", "in Oslo."), usage=(61, 4), response_id="chatcmpl-answer"),
    ]  # fmt: skip


def assert_oslo_streamed(rows: Landed) -> None:
    """What :func:`streamed_oslo` leaves with content capture off: two complete streamed model calls, and the tool
    run an act linked to the ask, without its arguments."""
    assert rows.calls() == [
        ("chatcmpl-ask", "gpt-test", 40, 9, ["tool_calls"], [("call_oslo", "get_weather")], True),
        ("chatcmpl-answer", "gpt-test", 61, 4, ["stop"], [], True),
    ]
    [act] = rows.tools
    assert act["tool_call_id"] == "call_oslo" and act["tool_name"] == "get_weather" and act["side_effect"] == "read"
    assert act["action_arguments"] is None and act["status_code"] != "ERROR"  # content capture off
    assert rows.asked_by == {"call_oslo": "chatcmpl-ask"}


def requests_sent(server: Any) -> list[Any]:
    """The JSON bodies a scripted server received, in order (what the framework asked the model)."""
    return [request["json"] for request in server.requests]
