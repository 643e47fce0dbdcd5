"""A pydantic-ai agent (an ``Agent`` on ``OpenAIChatModel`` with one tool) under our instrumentation.

The agent runs against the scripted OpenAI server on loopback, plainly and streamed (``run_stream``, and ``run``
with an event stream handler, which streams the model's answer too). Each scenario runs twice, bare and
instrumented as a user does it (``configure()``, ``instrument()``, the tool declared with our ``@tool`` and given
to the agent), and the framework must see the same thing both times: the same requests to the model, the same
messages, the same exception. The instrumented run's rows are then read from the dataset: one ``model_calls`` row
per model call with its model, tokens, finish reasons and tool calls, and each tool the agent ran an act carrying
the model's call id. pydantic-ai-slim sends no telemetry of its own (no logfire; the agent's own OpenTelemetry
instrumentation is off unless asked for). Skipped where pydantic-ai is not installed (the ``frameworks`` extra).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="pydantic-ai-slim[openai] is in the frameworks extra")

import openai  # noqa: E402
from pydantic_ai import Agent, ModelRetry  # noqa: E402
from pydantic_ai.messages import ModelMessage  # noqa: E402
from pydantic_ai.models.instrumented import InstrumentationSettings  # noqa: E402
from pydantic_ai.models.openai import OpenAIChatModel  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402

import otel_replay  # noqa: E402
from otel_replay.instrumentation import scripted  # noqa: E402

from ._landed import (  # noqa: E402
    ANSWER_BOTH,
    ASK_BOTH,
    Landed,
    assert_both_cities_answered,
    assert_oslo_streamed,
    bare_then_instrumented,
    requests_sent,
    streamed_oslo,
)

AGENT = "forecaster"


def get_weather(city: str, days: int = 1) -> str:
    """The weather in a city (the model gives ``days`` or leaves it to its default, which the framework passes)."""
    if city == "Atlantis":
        raise ModelRetry(f"no weather station in {city}; ask about a real city")
    if city == "Nowhere":
        raise LookupError(f"no weather station in {city}")
    return f"rain in {city}"


@dataclass
class Outcome:
    """What the framework saw of one run."""

    messages: list[tuple[Any, ...]] = field(default_factory=list)
    output: Any = None
    streamed: str = ""
    error: tuple[str, str] | None = None
    requests: list[Any] = field(default_factory=list)


def _seen(messages: list[ModelMessage]) -> list[tuple[Any, ...]]:
    """The messages as the agent holds them, without times and the ids pydantic-ai makes up per run."""
    seen = []
    for message in messages:
        for part in message.parts:
            call_id = getattr(part, "tool_call_id", None)
            seen.append(
                (
                    message.kind,
                    part.part_kind,
                    str(getattr(part, "content", None)),
                    getattr(part, "tool_name", None),
                    getattr(part, "args", None),
                    getattr(part, "outcome", None),
                    call_id if isinstance(call_id, str) and call_id.startswith("call_") else None,
                )
            )
    return seen


async def _drive(agent: Agent[None, str], mode: str, outcome: Outcome) -> None:
    """One run: ``run``, ``run_stream`` reading the text as it comes, or ``run`` with an event stream handler."""
    if mode == "run":
        result: Any = await agent.run("weather?")
    elif mode == "run_stream":
        async with agent.run_stream("weather?") as streamed:
            async for delta in streamed.stream_text(delta=True):
                outcome.streamed += delta
            outcome.output = await streamed.get_output()
            outcome.messages = _seen(streamed.all_messages())
        return
    else:
        events: list[str] = []

        async def handler(_context: Any, stream: Any) -> None:
            async for event in stream:
                events.append(event.event_kind)

        result = await agent.run("weather?", event_stream_handler=handler)
        outcome.streamed = "part_start" if "part_start" in events else ""
    outcome.output = result.output
    outcome.messages = _seen(result.all_messages())


def _run(replies: list[scripted.Reply], weather: Callable[..., str], mode: str, spans_to: Any = None) -> Outcome:
    """One run against a scripted server of its own; ``spans_to``: pydantic-ai's own spans on, to that provider."""
    outcome = Outcome()

    async def main(base_url: str) -> None:
        async with openai.AsyncOpenAI(base_url=base_url, api_key="test", max_retries=0) as client:
            model = OpenAIChatModel("gpt-test", provider=OpenAIProvider(openai_client=client))
            agent = Agent(model, tools=[weather], retries=1)
            if spans_to is not None:
                agent.instrument = InstrumentationSettings(tracer_provider=spans_to)
            await _drive(agent, mode, outcome)

    with scripted.ScriptedServer(replies) as server:
        try:
            asyncio.run(main(server.base_url))
        except Exception as exc:
            outcome.error = (type(exc).__name__, str(exc))
        outcome.requests = requests_sent(server)
    return outcome


def run_twice(
    telemetry: otel_replay.Telemetry,
    dataset: Path,
    replies: list[scripted.Reply],
    *,
    mode: str = "run",
    capture: bool = False,
    framework_spans: bool = False,
) -> tuple[Landed, Outcome]:
    """The scenario bare, then instrumented as a user does it; both saw the same; the rows and what was seen."""
    spans_to = telemetry.provider if framework_spans else None
    rows, observed = bare_then_instrumented(
        telemetry,
        dataset,
        lambda tool, ours: _run(replies, tool, mode, spans_to if ours else None),
        get_weather,
        AGENT,
        capture,
    )
    assert {row["agent_name"] for row in rows.model_calls + rows.tools} == {AGENT}
    return rows, observed


def test_an_agent_run_leaves_each_model_call_and_each_tool_run_linked(telemetry, dataset):
    rows, seen = run_twice(telemetry, dataset, [ASK_BOTH, ANSWER_BOTH], capture=True)
    assert seen.error is None and seen.output == "Rain in both."
    # pydantic-ai ran both calls (a sync tool runs in a worker thread): each act names the call it answered
    assert_both_cities_answered(rows)


@pytest.mark.parametrize("mode", ["run_stream", "event_stream_handler"])
def test_a_streamed_agent_run_leaves_complete_model_calls_and_the_tool_linked(telemetry, dataset, mode):
    rows, seen = run_twice(telemetry, dataset, streamed_oslo(), mode=mode)
    assert seen.error is None and seen.output == "Rain in Oslo."
    assert seen.streamed == ("Rain in Oslo." if mode == "run_stream" else "part_start")
    assert [(r["stream"], r["stream_options"]) for r in seen.requests] == [(True, {"include_usage": True})] * 2
    assert_oslo_streamed(rows)


def test_a_tool_asking_the_model_to_retry_is_an_error_act_and_the_retry_is_linked(telemetry, dataset):
    replies = [
        scripted.chat_completion(None, tool_calls=[("call_atl", "get_weather", {"city": "Atlantis"})],
                                 usage=(20, 6), response_id="chatcmpl-ask"),
        scripted.chat_completion(None, tool_calls=[("call_oslo", "get_weather", {"city": "Oslo"})],
                                 usage=(50, 6), response_id="chatcmpl-again"),
        scripted.chat_completion("Rain in Oslo.", usage=(70, 5), response_id="chatcmpl-answer"),
    ]  # fmt: skip
    rows, seen = run_twice(telemetry, dataset, replies)
    assert seen.error is None and seen.output == "Rain in Oslo."
    assert [m[5] for m in seen.messages].count("retried") == 1  # ModelRetry went back to the model
    assert [call[0] for call in rows.calls()] == ["chatcmpl-ask", "chatcmpl-again", "chatcmpl-answer"]
    tools = rows.by_call_id()
    assert (tools["call_atl"]["status_code"], tools["call_atl"]["error_type"]) == ("ERROR", "ModelRetry")
    assert tools["call_oslo"]["status_code"] != "ERROR"
    assert rows.asked_by == {"call_atl": "chatcmpl-ask", "call_oslo": "chatcmpl-again"}


def test_a_tool_that_raises_ends_the_run_as_bare_and_is_an_error_act_linked_to_its_call(telemetry, dataset):
    ask = scripted.chat_completion(
        None, tool_calls=[("call_none", "get_weather", {"city": "Nowhere"})], usage=(20, 6), response_id="chatcmpl-ask"
    )
    rows, seen = run_twice(telemetry, dataset, [ask])
    assert seen.error == ("LookupError", "no weather station in Nowhere")  # bare, the same (run_twice compared)
    assert rows.calls() == [("chatcmpl-ask", "gpt-test", 20, 6, ["tool_calls"], [("call_none", "get_weather")], False)]
    [act] = rows.tools
    assert (act["tool_call_id"], act["status_code"], act["error_type"]) == ("call_none", "ERROR", "LookupError")
    assert rows.asked_by == {"call_none": "chatcmpl-ask"}


@pytest.mark.parametrize(
    "arguments",
    ['{"city": "Os', '{"town": "Oslo"}', '["Oslo"]', '{"city": 7}', ""],
    ids=["truncated", "wrong_field", "not_an_object", "wrong_type", "empty"],
)
def test_malformed_tool_arguments_are_retried_as_bare_and_only_the_good_call_is_an_act(telemetry, dataset, arguments):
    replies = [
        scripted.chat_completion(None, tool_calls=[("call_bad", "get_weather", arguments)], usage=(20, 6),
                                 response_id="chatcmpl-ask"),
        scripted.chat_completion(None, tool_calls=[("call_good", "get_weather", {"city": "Oslo"})], usage=(50, 6),
                                 response_id="chatcmpl-again"),
        scripted.chat_completion("Rain in Oslo.", usage=(70, 5), response_id="chatcmpl-answer"),
    ]  # fmt: skip
    rows, seen = run_twice(telemetry, dataset, replies)
    assert seen.error is None and seen.output == "Rain in Oslo."
    assert [m[5] for m in seen.messages].count("retried") == 1  # pydantic-ai told the model what was wrong
    assert rows.calls() == [
        ("chatcmpl-ask", "gpt-test", 20, 6, ["tool_calls"], [("call_bad", "get_weather")], False),
        ("chatcmpl-again", "gpt-test", 50, 6, ["tool_calls"], [("call_good", "get_weather")], False),
        ("chatcmpl-answer", "gpt-test", 70, 5, ["stop"], [], False),
    ]
    # the refused call never reached the function: the one act is the good call's
    assert [(a["tool_call_id"], a["status_code"]) for a in rows.tools] == [("call_good", "UNSET")]
    assert rows.asked_by == {"call_good": "chatcmpl-again"}


@pytest.mark.parametrize("mode", ["run", "run_stream"])
def test_with_pydantic_ais_own_spans_on_each_call_and_each_tool_run_is_still_one_row(telemetry, dataset, mode):
    ask = scripted.chat_completion(
        None, tool_calls=[("call_oslo", "get_weather", {"city": "Oslo"})], usage=(31, 12), response_id="chatcmpl-ask"
    )
    answer = scripted.chat_completion("Rain.", usage=(58, 5), response_id="chatcmpl-answer")
    replies = [ask, answer] if mode == "run" else [
        scripted.chat_stream((), tool_calls=[("call_oslo", "get_weather", {"city": "Oslo"})], usage=(31, 12),
                             response_id="chatcmpl-ask"),
        scripted.chat_stream(("Rain.",), usage=(58, 5), response_id="chatcmpl-answer"),
    ]  # fmt: skip
    rows, seen = run_twice(telemetry, dataset, replies, mode=mode, framework_spans=True)
    assert seen.error is None and seen.output == "Rain."
    with otel_replay.open(dataset) as store:  # pydantic-ai's spans are there: a chat span per call, one per tool run
        theirs = store.rows(
            "SELECT name FROM spans WHERE replay_kind IS NULL"
            " AND (name LIKE 'chat %' OR name = 'execute_tool get_weather')"
        )
    assert sorted(row["name"] for row in theirs) == ["chat gpt-test", "chat gpt-test", "execute_tool get_weather"]
    streamed = mode == "run_stream"
    assert rows.calls() == [
        ("chatcmpl-ask", "gpt-test", 31, 12, ["tool_calls"], [("call_oslo", "get_weather")], streamed),
        ("chatcmpl-answer", "gpt-test", 58, 5, ["stop"], [], streamed),
    ]
    [act] = rows.tools  # ours, under pydantic-ai's execute_tool span with the same call id
    assert (act["tool_call_id"], act["side_effect"]) == ("call_oslo", "read")
    assert rows.asked_by == {"call_oslo": "chatcmpl-ask"}
