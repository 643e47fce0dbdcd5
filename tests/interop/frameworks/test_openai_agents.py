"""One small agent run by the OpenAI Agents SDK against the scripted server, instrumented the documented way.

The agent has one function tool, declared with ``@function_tool`` over ``@tool`` (how the instrumenting guide
says to link a framework's tool run to the model call that asked for it). ``Runner.run`` and
``Runner.run_streamed`` drive it through the Responses API (the SDK's default; its stream is read through
``with_streaming_response`` and ``parse()``) and through chat completions, against a scripted server on loopback.
The spans go through ``configure()`` into a dataset; every model call the SDK made is one ``model_calls`` row with
its model, tokens, finish reasons and tool calls, and each tool the SDK ran is an act joined to the call that asked
for it. The same script run without instrumentation (and with the undecorated function) makes the agent answer
the same and send the server the same requests, also when the tool raises or the model's arguments are malformed.
With content capture on, the conversation the SDK sends is read into the conventions' message shapes.

The SDK's own tracing (which exports to the internet) is off. Skipped where the SDK is not installed (the
``frameworks`` extra).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

import otel_replay
from otel_replay import Telemetry
from otel_replay.instrumentation import instrument, invoke_agent, scripted, tool, uninstrument

pytest.importorskip("agents", reason="the OpenAI Agents SDK is not installed (the frameworks extra)")

from agents import Agent, RunConfig, RunContextWrapper, Runner, function_tool, set_tracing_disabled  # noqa: E402
from agents.models.openai_provider import OpenAIProvider  # noqa: E402

set_tracing_disabled(True)  # the SDK's own traces would go to its hosted backend

Tool = tuple[str, str, Any]
"""A tool call the model makes: ``(call id, tool name, arguments)``; a str argument is sent as given."""


def get_weather(city: str) -> str:
    """The weather in a city."""
    if city == "Atlantis":
        raise LookupError("no such city")
    return {"Oslo": "rain", "Rome": "sun"}.get(city, "fog")


SKY = {"sky": "rain"}
"""The run's context, which the SDK hands a tool whose first parameter takes it."""


def get_forecast(ctx: RunContextWrapper[dict[str, str]], city: str, days: int = 3) -> str:
    """The forecast for a city."""
    return f"{city}: {ctx.context['sky']} for {days} days"


@dataclass(frozen=True)
class Run:
    """What the agent did: its answer, the items it produced, the request bodies the server received."""

    output: Any
    items: list[str]
    requests: list[Any]
    error: str | None = None


def replies(api: str, streamed: bool, first: list[Tool], answer: str) -> list[scripted.Reply]:
    """The model asks for ``first`` (one response), then answers with text; usage differs between the two."""
    if api == "responses":
        if streamed:
            return [
                scripted.responses_call_stream("", tool_calls=first, usage=(21, 6), response_id="resp_ask"),
                scripted.responses_call_stream(answer, usage=(40, 9), response_id="resp_answer"),
            ]
        return [
            scripted.Reply(200, scripted.response_object("", tool_calls=first, usage=(21, 6), response_id="resp_ask")),
            scripted.Reply(200, scripted.response_object(answer, usage=(40, 9), response_id="resp_answer")),
        ]
    if streamed:
        return [
            scripted.chat_stream((), tool_calls=first, usage=(21, 6), response_id="chatcmpl-ask"),
            scripted.chat_stream((answer[:3], answer[3:]), usage=(40, 9), response_id="chatcmpl-answer"),
        ]
    return [
        scripted.chat_completion(None, tool_calls=first, usage=(21, 6), response_id="chatcmpl-ask"),
        scripted.chat_completion(answer, usage=(40, 9), response_id="chatcmpl-answer"),
    ]


def run_agent(script: list[scripted.Reply], fn: Callable[..., Any], *, api: str, streamed: bool) -> Run:
    """Run the weather agent once, with ``fn`` as its function tool, against a server answering ``script``."""

    async def go(server: scripted.ScriptedServer) -> Any:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0)
        provider = OpenAIProvider(openai_client=client, use_responses=api == "responses")
        config = RunConfig(model_provider=provider, tracing_disabled=True)
        agent = Agent(name="weather", instructions="Answer with the weather.", tools=[function_tool(fn)],
                      model="gpt-test")  # fmt: skip
        try:
            if not streamed:
                return await Runner.run(agent, "Weather in Oslo and Rome?", context=SKY, run_config=config)
            result = Runner.run_streamed(agent, "Weather in Oslo and Rome?", context=SKY, run_config=config)
            async for _ in result.stream_events():
                pass
            return result
        finally:
            await client.close()

    with scripted.ScriptedServer(script) as server, invoke_agent("weather"):
        try:
            result = asyncio.run(go(server))
        except Exception as exc:  # the SDK gave up: how it did is part of its behaviour
            return Run(None, [], [r["json"] for r in server.requests], f"{type(exc).__name__}: {exc}")
        return Run(result.final_output, [item.type for item in result.new_items], [r["json"] for r in server.requests])


def both_ways(
    telemetry: Telemetry,
    script: Callable[[], list[scripted.Reply]],
    *,
    api: str = "responses",
    streamed: bool,
    fn: Callable[..., Any] = get_weather,
    capture: bool = False,
) -> Run:
    """Run the agent uninstrumented with the bare function, then instrumented with it under ``@tool``: the same run.

    The spans of the instrumented run are in the dataset afterwards.
    """
    plain = run_agent(script(), fn, api=api, streamed=streamed)
    instrument(tracer_provider=telemetry.provider, capture_content=capture)  # what the guide's one line does
    try:
        traced = tool(side_effect="read", capture_content=capture, tracer_provider=telemetry.provider)(fn)
        observed = run_agent(script(), traced, api=api, streamed=streamed)
    finally:
        uninstrument()
    telemetry.shutdown()
    assert observed == plain  # the same answer, items, error and requests (tool outputs included)
    return observed


def model_calls(dataset: Path) -> list[dict[str, Any]]:
    return otel_replay.open(dataset).rows("SELECT * FROM model_calls ORDER BY start_time")


def tool_acts(dataset: Path) -> list[dict[str, Any]]:
    """Each tool execution with the response id of the model call that asked for it (the documented join)."""
    return otel_replay.open(dataset).rows(
        "SELECT a.*, m.response_id AS asked_by FROM acts a"
        " LEFT JOIN model_calls m ON m.tool_calls LIKE '%\"' || a.tool_call_id || '\"%'"
        " WHERE a.source = 'tool' ORDER BY a.tool_call_id"
    )


OSLO_ROME: list[Tool] = [("call_oslo", "get_weather", {"city": "Oslo"}), ("call_rome", "get_weather", {"city": "Rome"})]


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize("api", ["responses", "chat"])
def test_every_model_call_is_one_row_and_each_tool_the_sdk_ran_is_an_act_joined_to_its_call(
    telemetry: Telemetry, dataset: Path, api: str, streamed: bool
) -> None:
    script = lambda: replies(api, streamed, OSLO_ROME, "Oslo: rain. Rome: sun.")  # noqa: E731
    observed = both_ways(telemetry, script, api=api, streamed=streamed)
    assert observed.error is None and observed.items == ["tool_call_item"] * 2 + ["tool_call_output_item"] * 2 + [
        "message_output_item"]  # fmt: skip
    assert observed.output == "Oslo: rain. Rome: sun." and len(observed.requests) == 2
    ask, answer = ("resp_ask", "resp_answer") if api == "responses" else ("chatcmpl-ask", "chatcmpl-answer")
    calls = model_calls(dataset)
    assert [row["response_id"] for row in calls] == [ask, answer]  # one row per model call, no more
    for row in calls:
        assert (row["provider"], row["model"], row["operation"]) == ("openai", "gpt-test", "chat")
        assert row["streamed"] is streamed and row["status_code"] != "ERROR" and row["agent_name"] == "weather"
    assert [(row["input_tokens"], row["output_tokens"]) for row in calls] == [(21, 6), (40, 9)]
    assert [json.loads(row["finish_reasons"]) for row in calls] == [["tool_calls"], ["stop"]]
    assert json.loads(calls[0]["tool_calls"]) == [
        {"id": "call_oslo", "name": "get_weather"}, {"id": "call_rome", "name": "get_weather"}]  # fmt: skip
    assert calls[1]["tool_calls"] is None
    acts = tool_acts(dataset)
    assert [(a["tool_call_id"], a["asked_by"]) for a in acts] == [("call_oslo", ask), ("call_rome", ask)]
    assert all(a["tool_name"] == "get_weather" and a["agent_name"] == "weather" for a in acts)
    assert all(a["side_effect"] == "read" and a["status_code"] != "ERROR" for a in acts)


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_a_tool_that_raises_is_an_error_act_joined_to_its_call_and_the_agent_goes_on_as_without_us(
    telemetry: Telemetry, dataset: Path, streamed: bool
) -> None:
    asked: list[Tool] = [("call_atlantis", "get_weather", {"city": "Atlantis"})]
    script = lambda: replies("responses", streamed, asked, "No such city.")  # noqa: E731
    observed = both_ways(telemetry, script, api="responses", streamed=streamed)
    assert observed.error is None and observed.output == "No such city."
    [sent] = [item for item in observed.requests[1]["input"] if item.get("type") == "function_call_output"]
    assert sent["call_id"] == "call_atlantis" and "error" in sent["output"].lower()  # the SDK told the model
    calls = model_calls(dataset)
    assert [row["response_id"] for row in calls] == ["resp_ask", "resp_answer"]
    assert [json.loads(row["finish_reasons"]) for row in calls] == [["tool_calls"], ["stop"]]
    [act] = tool_acts(dataset)
    assert (act["tool_call_id"], act["asked_by"]) == ("call_atlantis", "resp_ask")
    assert (act["status_code"], act["error_type"]) == ("ERROR", "LookupError")


MALFORMED: list[Tool] = [
    ("call_cut", "get_weather", '{"city": "Os'),
    ("call_wrong_type", "get_weather", '{"city": ["Oslo"]}'),
    ("call_not_an_object", "get_weather", '["Oslo"]'),
    ("call_empty", "get_weather", ""),
    ("call_unknown_member", "get_weather", '{"city": "Oslo", "units": "kelvin"}'),  # dropped, the tool runs
    ("call_repeated_member", "get_weather", '{"city": "Oslo", "city": "Rome"}'),  # JSON keeps the last: Rome
    ("call_rome", "get_weather", {"city": "Rome"}),
]
"""Arguments a model may send, in one response: the SDK runs the tool for the last three only."""


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_malformed_tool_arguments_leave_the_agent_as_without_us_and_the_rows_right(
    telemetry: Telemetry, dataset: Path, streamed: bool
) -> None:
    script = lambda: replies("responses", streamed, MALFORMED, "Rome: sun.")  # noqa: E731
    observed = both_ways(telemetry, script, streamed=streamed)
    outputs = {item["call_id"]: item["output"] for item in observed.requests[1]["input"] if "output" in item}
    ran = {"call_unknown_member": "rain", "call_repeated_member": "sun", "call_rome": "sun"}
    assert {call_id: output for call_id, output in outputs.items() if call_id in ran} == ran
    refused = {call_id: output for call_id, output in outputs.items() if call_id not in ran}
    assert len(refused) == 4 and not {"rain", "sun", "fog"} & set(refused.values())  # the SDK's error texts
    calls = model_calls(dataset)
    assert [row["response_id"] for row in calls] == ["resp_ask", "resp_answer"]
    assert json.loads(calls[0]["tool_calls"]) == [{"id": call_id, "name": name} for call_id, name, _ in MALFORMED]
    assert (calls[0]["input_tokens"], calls[0]["output_tokens"]) == (21, 6)
    assert [json.loads(row["finish_reasons"]) for row in calls] == [["tool_calls"], ["stop"]]
    acts = tool_acts(dataset)
    assert all(a["asked_by"] == "resp_ask" and a["status_code"] != "ERROR" for a in acts)
    assert [a["tool_call_id"] for a in acts] == sorted(ran)  # each run joined; the two for Rome are alike


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_a_tool_taking_the_run_context_and_a_default_is_joined_to_the_call_that_asked_for_it(
    telemetry: Telemetry, dataset: Path, streamed: bool
) -> None:
    # the SDK calls get_forecast(context, city, days): the context added, the default passed, "verbose" left out
    asked: list[Tool] = [
        ("call_oslo", "get_forecast", {"city": "Oslo", "verbose": True}),
        ("call_rome", "get_forecast", {"city": "Rome", "days": 5}),
    ]
    script = lambda: replies("responses", streamed, asked, "Rain.")  # noqa: E731
    observed = both_ways(telemetry, script, streamed=streamed, fn=get_forecast)
    outputs = {item["call_id"]: item["output"] for item in observed.requests[1]["input"] if "output" in item}
    assert outputs == {"call_oslo": "Oslo: rain for 3 days", "call_rome": "Rome: rain for 5 days"}
    acts = tool_acts(dataset)
    assert [(a["tool_call_id"], a["asked_by"], a["tool_name"]) for a in acts] == [
        ("call_oslo", "resp_ask", "get_forecast"), ("call_rome", "resp_ask", "get_forecast")]  # fmt: skip


def test_with_content_capture_the_sdks_conversation_is_in_the_conventions_shapes(
    telemetry: Telemetry, dataset: Path
) -> None:
    script = lambda: replies("responses", True, OSLO_ROME[:1], "Oslo: rain.")  # noqa: E731
    both_ways(telemetry, script, streamed=True, capture=True)
    ask, answer = model_calls(dataset)
    assert json.loads(ask["output_messages"]) == [{"role": "assistant", "finish_reason": "tool_calls", "parts": [
        {"type": "tool_call", "id": "call_oslo", "name": "get_weather", "arguments": {"city": "Oslo"}}]}]  # fmt: skip
    assert json.loads(answer["input_messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "Weather in Oslo and Rome?"}]},
        {"role": "assistant", "parts": [
            {"type": "tool_call", "id": "call_oslo", "name": "get_weather", "arguments": {"city": "Oslo"}}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_oslo", "response": "rain"}]},
    ]  # fmt: skip
    assert json.loads(answer["output_messages"])[0]["parts"] == [{"type": "text", "content": "Oslo: rain."}]
    [act] = tool_acts(dataset)
    assert (act["tool_call_id"], act["asked_by"]) == ("call_oslo", "resp_ask")
    assert json.loads(act["action_arguments"]) == {"city": "Oslo"} and act["tool_result"] == "rain"
