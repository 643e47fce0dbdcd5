"""A LangGraph agent (langchain-openai's ChatOpenAI, a model node and a ToolNode) under our instrumentation.

One small agent with one tool, run against the scripted OpenAI server on loopback, invoked and streamed (sync,
async, and through ``with_raw_response`` as ChatOpenAI does when asked for response headers). Each scenario runs
twice, bare and instrumented as a user does it (``configure()``, ``instrument()``, the tool declared with our
``@tool`` under LangChain's), and the framework must see the same thing both times: the same requests to the model,
the same messages, the same exception. The instrumented run's rows are then read from the dataset: one
``model_calls`` row per model call with its model, tokens, finish reasons and tool calls, and each tool the graph
ran an act carrying the model's call id. Skipped where LangGraph is not installed (the ``frameworks`` extra).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph", reason="LangGraph is in the frameworks extra")
pytest.importorskip("langchain_openai", reason="langchain-openai is in the frameworks extra")

import langsmith.utils  # noqa: E402
from langchain_core.messages import AnyMessage  # noqa: E402
from langchain_core.runnables import RunnableLambda  # noqa: E402
from langchain_core.tools import tool as langchain_tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from langgraph.graph import START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode, tools_condition  # noqa: E402

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


@pytest.fixture(autouse=True)
def no_langsmith(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """LangSmith tracing stays off: nothing the framework records goes to the internet."""
    for name in ("LANGSMITH_TRACING", "LANGSMITH_TRACING_V2", "LANGCHAIN_TRACING_V2", "LANGCHAIN_TRACING"):
        monkeypatch.setenv(name, "false")
    for name in ("LANGSMITH_API_KEY", "LANGCHAIN_API_KEY", "LANGSMITH_ENDPOINT", "LANGCHAIN_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    yield
    assert not langsmith.utils.tracing_is_enabled()


def get_weather(city: str, days: int = 1) -> str:
    """The weather in a city (the model gives ``days`` or leaves it to its default, which the framework passes)."""
    if city == "Atlantis":
        raise LookupError(f"no weather station in {city}")
    return f"rain in {city}"


@dataclass
class Outcome:
    """What the framework saw of one run."""

    messages: list[tuple[Any, ...]] = field(default_factory=list)
    streamed: str = ""
    error: tuple[str, str] | None = None
    requests: list[Any] = field(default_factory=list)


def _seen(messages: list[AnyMessage]) -> list[tuple[Any, ...]]:
    """The messages as the graph holds them, without the ids LangChain makes up per run."""
    return [
        (
            message.type,
            message.content,
            [(c["id"], c["name"], c["args"]) for c in getattr(message, "tool_calls", ())],
            [(c["id"], c["name"], c["args"]) for c in getattr(message, "invalid_tool_calls", ())],
            getattr(message, "tool_call_id", None),
            getattr(message, "status", None),
        )
        for message in messages
    ]


def _graph(llm: ChatOpenAI, weather: Callable[..., str], handle_tool_errors: bool | None) -> Any:
    """The agent: a model node with the tool bound, a ToolNode, and LangGraph's own routing between them."""
    lc_tool = langchain_tool(weather)
    bound = llm.bind_tools([lc_tool])

    def model(state: MessagesState) -> dict[str, list[AnyMessage]]:
        return {"messages": [bound.invoke(state["messages"])]}

    async def amodel(state: MessagesState) -> dict[str, list[AnyMessage]]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    tools = ToolNode([lc_tool]) if handle_tool_errors is None else ToolNode([lc_tool], handle_tool_errors=True)
    graph = StateGraph(MessagesState)
    graph.add_node("model", RunnableLambda(model, afunc=amodel))
    graph.add_node("tools", tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile()


def _drive(app: Any, mode: str, question: str, outcome: Outcome) -> None:
    """Run the graph once: ``invoke`` / ``ainvoke``, or streamed with LangGraph's ``messages`` mode (sync or async)."""
    state = {"messages": [("user", question)]}
    if mode == "invoke":
        outcome.messages = _seen(app.invoke(state)["messages"])
        return
    if mode == "ainvoke":
        outcome.messages = _seen(asyncio.run(app.ainvoke(state))["messages"])
        return
    last: dict[str, Any] = {}
    if mode == "astream":

        async def consume() -> None:
            async for kind, item in app.astream(state, stream_mode=["messages", "values"]):
                if kind == "values":
                    last.update(item)
                elif item[0].type == "AIMessageChunk" and isinstance(item[0].content, str):
                    outcome.streamed += item[0].content

        asyncio.run(consume())
    else:
        for kind, item in app.stream(state, stream_mode=["messages", "values"]):
            if kind == "values":
                last.update(item)
            elif item[0].type == "AIMessageChunk" and isinstance(item[0].content, str):
                outcome.streamed += item[0].content
    outcome.messages = _seen(last["messages"])


def _run(
    replies: list[scripted.Reply], weather: Callable[..., str], mode: str, handle_tool_errors: bool | None
) -> Outcome:
    outcome = Outcome()
    with scripted.ScriptedServer(replies) as server:
        llm = ChatOpenAI(
            model="gpt-test",
            base_url=server.base_url,
            api_key="test",  # type: ignore[arg-type]
            max_retries=0,
            stream_usage=mode not in ("invoke", "ainvoke"),  # sends stream_options={"include_usage": true}
            include_response_headers=mode == "stream_raw",  # a stream through with_raw_response, then parse()
        )
        try:
            _drive(_graph(llm, weather, handle_tool_errors), mode, "weather?", outcome)
        except Exception as exc:
            outcome.error = (type(exc).__name__, str(exc))
        outcome.requests = requests_sent(server)
    return outcome


def run_twice(
    telemetry: otel_replay.Telemetry,
    dataset: Path,
    replies: list[scripted.Reply],
    *,
    mode: str = "invoke",
    capture: bool = False,
    handle_tool_errors: bool | None = None,
) -> tuple[Landed, Outcome]:
    """The scenario bare, then instrumented as a user does it; both saw the same; the rows and what was seen."""
    rows, observed = bare_then_instrumented(
        telemetry, dataset, lambda tool, _: _run(replies, tool, mode, handle_tool_errors), get_weather, AGENT, capture
    )
    assert {row["agent_name"] for row in rows.model_calls + rows.tools} <= {AGENT}
    return rows, observed




@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_an_invoked_graph_leaves_each_model_call_and_each_tool_run_linked(telemetry, dataset, mode):
    # ChatOpenAI asks through with_raw_response.create and then parse(), with the sync and the async client
    rows, seen = run_twice(telemetry, dataset, [ASK_BOTH, ANSWER_BOTH], mode=mode, capture=True)
    assert [m[1] for m in seen.messages[2:]] == ["rain in Oslo", "rain in Rome", "Rain in both."]
    # the ToolNode ran both calls (in its thread pool): each act carries the id of the call it answered
    assert_both_cities_answered(rows)
    assert {row["agent_name"] for row in rows.model_calls + rows.tools} == {AGENT}


@pytest.mark.parametrize("mode", ["stream", "astream", "stream_raw"])
def test_a_streamed_graph_leaves_complete_model_calls_and_the_tool_linked(telemetry, dataset, mode):
    rows, seen = run_twice(telemetry, dataset, streamed_oslo(), mode=mode)
    assert seen.streamed == "Rain in Oslo." and seen.error is None
    assert [(r["stream"], r["stream_options"]) for r in seen.requests] == [(True, {"include_usage": True})] * 2
    assert_oslo_streamed(rows)


@pytest.mark.parametrize("handled", [False, True], ids=["raised", "handled_by_tool_node"])
def test_a_tool_that_raises_is_an_error_act_linked_to_its_call(telemetry, dataset, handled):
    ask = scripted.chat_completion(
        None, tool_calls=[("call_atl", "get_weather", {"city": "Atlantis"})], usage=(20, 6), response_id="chatcmpl-ask"
    )
    replies = [ask, scripted.chat_completion("No station there.", usage=(44, 5), response_id="chatcmpl-answer")]
    rows, seen = run_twice(telemetry, dataset, replies, handle_tool_errors=True if handled else None)
    if handled:
        assert seen.error is None and seen.messages[2][4:] == ("call_atl", "error")
    else:  # the exception left the graph as it does bare (run_twice compared them)
        assert seen.error == ("LookupError", "no weather station in Atlantis")
    expected = [("chatcmpl-ask", "gpt-test", 20, 6, ["tool_calls"], [("call_atl", "get_weather")], False)]
    if handled:  # the error went back to the model as the tool's message, and the model answered
        expected.append(("chatcmpl-answer", "gpt-test", 44, 5, ["stop"], [], False))
    assert rows.calls() == expected
    [act] = rows.tools
    assert (act["tool_call_id"], act["status_code"], act["error_type"]) == ("call_atl", "ERROR", "LookupError")
    assert rows.asked_by == {"call_atl": "chatcmpl-ask"}


@pytest.mark.parametrize(
    ("arguments", "answered", "ran"),
    [
        ('{"city": "Os', False, False),  # not JSON: LangChain keeps an invalid tool call and the graph ends
        ('{"town": "Oslo"}', True, False),  # JSON the tool's schema refuses: the ToolNode answers the model an error
        ('["Oslo"]', False, False),  # JSON, not an object: LangChain's message refuses it and invoke() raises
        ('{"city": "Oslo", "city": "Rome"}', True, True),  # a repeated key: the tool gets the last, as JSON parsers do
    ],
    ids=["truncated", "wrong_field", "not_an_object", "repeated_key"],
)
def test_malformed_tool_arguments_from_the_model_leave_the_same_run_and_right_rows(
    telemetry, dataset, arguments, answered, ran
):
    ask = scripted.chat_completion(
        None, tool_calls=[("call_bad", "get_weather", arguments)], usage=(20, 6), response_id="chatcmpl-ask"
    )
    replies = [ask, scripted.chat_completion("Sorry.", usage=(44, 5), response_id="chatcmpl-answer")]
    rows, seen = run_twice(telemetry, dataset, replies)
    expected = [("chatcmpl-ask", "gpt-test", 20, 6, ["tool_calls"], [("call_bad", "get_weather")], False)]
    if answered:
        expected.append(("chatcmpl-answer", "gpt-test", 44, 5, ["stop"], [], False))
    assert rows.calls() == expected
    assert len(seen.requests) == len(expected) and (seen.error is None) is (arguments != '["Oslo"]')
    if ran:  # the tool ran with what the framework parsed, and the act still names the call
        assert [(a["tool_call_id"], a["status_code"]) for a in rows.tools] == [("call_bad", "UNSET")]
        assert rows.asked_by == {"call_bad": "chatcmpl-ask"} and seen.messages[2][1] == "rain in Rome"
    else:  # the function never ran: no act
        assert rows.tools == [] and rows.asked_by == {}
