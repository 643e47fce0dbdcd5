"""A stream read through with_streaming_response / with_raw_response and parse() is observed like a plain stream."""

from __future__ import annotations

import asyncio
import gc
import json

import openai
import pytest

from otel_replay import semconv as sc
from otel_replay.instrumentation import scripted as s
from otel_replay.instrumentation import tool

from .conftest import Pipeline

MESSAGES = [{"role": "user", "content": "rate for EUR?"}]
ASKED = {"currency": "EUR"}


def client(server: s.ScriptedServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)


def linked_tool(pipeline: Pipeline):  # type: ignore[no-untyped-def]
    @tool(tracer_provider=pipeline.provider)
    def get_rate(currency: str) -> float:
        return 1.1

    return get_rate


def test_a_chat_stream_through_with_streaming_response_gets_tokens_reasons_and_its_tool_act_linked(
    server, instrumented: Pipeline
):
    get_rate = linked_tool(instrumented)
    server.enqueue(s.chat_stream(["one"], tool_calls=[("call_eur", "get_rate", ASKED)], usage=(9, 4)))
    with client(server) as c:
        api = c.chat.completions.with_streaming_response
        with api.create(model="gpt-test", messages=MESSAGES, stream=True, stream_options={"include_usage": True}) as r:
            assert r.status_code == 200
            chunks = list(r.parse())
    arguments = "".join(
        call.function.arguments or ""
        for chunk in chunks
        for choice in chunk.choices
        for call in choice.delta.tool_calls or ()
    )
    get_rate(**json.loads(arguments))
    model = instrumented.one("chat")
    attrs = model.attributes
    assert (attrs[sc.GEN_AI_USAGE_INPUT_TOKENS], attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS]) == (9, 4)
    assert tuple(attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ("tool_calls",)
    assert json.loads(attrs[sc.MODEL_TOOL_CALLS]) == [{"id": "call_eur", "name": "get_rate"}]
    assert attrs[sc.STREAM_END] == "exhausted" and attrs[sc.MODEL_STREAMED] is True
    assert attrs["http.response.status_code"] == 200
    act = instrumented.one("execute_tool")
    assert act.attributes[sc.GEN_AI_TOOL_CALL_ID] == "call_eur"
    assert [link.context.span_id for link in act.links] == [model.context.span_id]


def test_a_responses_stream_through_with_streaming_response_gets_its_tool_call_and_finish_reason(
    server, instrumented: Pipeline
):
    get_rate = linked_tool(instrumented)
    server.enqueue(s.responses_call_stream("", tool_calls=[("call_r", "get_rate", ASKED)], usage=(6, 2)))
    with client(server) as c:
        with c.responses.with_streaming_response.create(model="gpt-test", input="rate?", stream=True) as r:
            events = list(r.parse())
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    get_rate(**json.loads(done[0].arguments))
    attrs = instrumented.one("chat").attributes
    assert tuple(attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ("tool_calls",)
    assert (attrs[sc.GEN_AI_USAGE_INPUT_TOKENS], attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS]) == (6, 2)
    assert instrumented.one("execute_tool").attributes[sc.GEN_AI_TOOL_CALL_ID] == "call_r"


def test_an_async_stream_through_with_streaming_response_is_observed(server, instrumented: Pipeline):
    server.enqueue(s.chat_stream(["a", "b"], usage=(3, 2)))

    async def run() -> str:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0) as c:
            api = c.chat.completions.with_streaming_response
            async with api.create(model="gpt-test", messages=MESSAGES, stream=True) as response:
                stream = await response.parse()
                return "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])

    assert asyncio.run(run()) == "ab"
    attrs = instrumented.one("chat").attributes
    assert attrs[sc.STREAM_END] == "exhausted" and attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 2


@pytest.mark.parametrize("aio", [False, True], ids=["sync", "async"])
def test_a_streaming_response_closed_unread_ends_its_span_once_as_closed(server, instrumented: Pipeline, aio: bool):
    server.enqueue(s.chat_stream(["never", "read"]))
    if aio:

        async def run() -> None:
            async with openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0) as c:
                api = c.chat.completions.with_streaming_response
                async with api.create(model="gpt-test", messages=MESSAGES, stream=True):
                    pass

        asyncio.run(run())
    else:
        with client(server) as c:
            with c.chat.completions.with_streaming_response.create(model="gpt-test", messages=MESSAGES, stream=True):
                pass
    gc.collect()
    span = instrumented.one("chat")
    assert span.attributes[sc.STREAM_END] == "closed" and sc.GEN_AI_RESPONSE_FINISH_REASONS not in span.attributes


def test_a_raw_response_dropped_after_parse_leaves_the_stream_in_charge_of_the_span(server, instrumented: Pipeline):
    server.enqueue(s.chat_stream(["x", "y"], usage=(2, 2)))
    with client(server) as c:
        stream = c.chat.completions.with_raw_response.create(model="gpt-test", messages=MESSAGES, stream=True).parse()
        gc.collect()  # the raw response is gone; its stream is not read yet
        assert instrumented.spans("chat") == []
        assert isinstance(stream, openai.Stream)
        assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == "xy"
    attrs = instrumented.one("chat").attributes
    assert attrs[sc.STREAM_END] == "exhausted" and attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] == 2
