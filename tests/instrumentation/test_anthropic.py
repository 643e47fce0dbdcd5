"""The Anthropic instrumentor, with the real anthropic client against a local scripted server."""

from __future__ import annotations

import asyncio
import json

import anthropic
import pytest
from opentelemetry.trace import SpanKind, StatusCode

from otel_replay import semconv as sc
from otel_replay.instrumentation import scripted as s

from .conftest import Pipeline

MESSAGES = [{"role": "user", "content": "refund order 7"}]


def client(server: s.ScriptedServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.root_url, api_key="sk-ant-test", max_retries=0)


def test_message_with_tool_use_blocks(server, instrumented: Pipeline):
    server.enqueue(s.anthropic_message("ok", tool_uses=[("toolu_1", "refund", {"order": 7})], usage=(20, 6)))
    with client(server) as c:
        message = c.messages.create(model="claude-test", max_tokens=64, messages=MESSAGES)
    assert message.content[1].name == "refund"
    span = instrumented.one("chat")
    attrs = span.attributes
    assert span.name == "chat claude-test" and span.kind is SpanKind.CLIENT
    assert attrs[sc.GEN_AI_PROVIDER_NAME] == "anthropic" and attrs[sc.GEN_AI_REQUEST_MAX_TOKENS] == 64
    assert tuple(attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ("tool_use",)
    assert (attrs[sc.GEN_AI_USAGE_INPUT_TOKENS], attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS]) == (20, 6)
    assert json.loads(attrs[sc.MODEL_TOOL_CALLS]) == [{"id": "toolu_1", "name": "refund"}]
    assert not span.events  # the conventions define no tool-call span event
    assert sc.GEN_AI_OUTPUT_MESSAGES not in attrs


def test_streamed_create_aggregates_tool_input_json(server, capturing: Pipeline):
    server.enqueue(s.anthropic_stream(["Refun", "ding"], tool_uses=[("toolu_2", "refund", {"order": 8})]))
    with client(server) as c:
        kinds = [e.type for e in c.messages.create(model="claude-test", max_tokens=64, messages=MESSAGES, stream=True)]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    attrs = capturing.one("chat").attributes
    assert attrs[sc.STREAM_END] == "exhausted"
    [call] = json.loads(attrs[sc.MODEL_TOOL_CALLS])
    assert call["id"] == "toolu_2" and json.loads(call["arguments"]) == {"order": 8}
    assert "Refunding" in attrs[sc.GEN_AI_OUTPUT_MESSAGES]


def test_messages_stream_helper_sync_and_async(server, instrumented: Pipeline):
    server.enqueue(s.anthropic_stream(["a", "b"], usage=(3, 2)), s.anthropic_stream(["c"], usage=(4, 1)))
    with client(server) as c, c.messages.stream(model="claude-test", max_tokens=8, messages=MESSAGES) as stream:
        assert stream.get_final_text() == "ab"

    async def run() -> str:
        async with anthropic.AsyncAnthropic(base_url=server.root_url, api_key="k", max_retries=0) as ac:
            async with ac.messages.stream(model="claude-test", max_tokens=8, messages=MESSAGES) as stream:
                return "".join([t async for t in stream.text_stream])

    assert asyncio.run(run()) == "c"
    first, second = instrumented.spans("chat")
    assert first.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 3 and second.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 4
    assert {first.attributes[sc.STREAM_END], second.attributes[sc.STREAM_END]} == {"exhausted"}


def test_messages_stream_left_early_ends_the_span_once(server, instrumented: Pipeline):
    server.enqueue(s.anthropic_stream(["a", "b", "c"]))
    with client(server) as c:
        with c.messages.stream(model="claude-test", max_tokens=8, messages=MESSAGES) as stream:
            next(iter(stream))
    assert instrumented.one("chat").attributes[sc.STREAM_END] == "closed"


def test_error_status_and_broken_stream(server, instrumented: Pipeline):
    server.enqueue(s.error(529, "overloaded", "overloaded_error"), s.anthropic_stream(["a", "b", "c"], cut_after=3))
    with client(server) as c:
        with pytest.raises(anthropic.APIStatusError):
            c.messages.create(model="claude-test", max_tokens=8, messages=MESSAGES)
        with pytest.raises(Exception) as caught:  # the client's transport error, whatever its type
            for _ in c.messages.create(model="claude-test", max_tokens=8, messages=MESSAGES, stream=True):
                pass
    failed, broken = instrumented.spans("chat")
    assert failed.status.status_code is StatusCode.ERROR and failed.attributes[sc.ERROR_TYPE]
    assert broken.status.status_code is StatusCode.ERROR and broken.attributes[sc.STREAM_END] == "error"
    assert broken.attributes[sc.ERROR_TYPE] == type(caught.value).__qualname__
    assert broken.attributes[sc.GEN_AI_RESPONSE_ID] == "msg_s1"


def test_raw_response_path_records_the_parsed_message(server, instrumented: Pipeline):
    server.enqueue(s.anthropic_message("raw", usage=(5, 1)))
    with client(server) as c:
        raw = c.messages.with_raw_response.create(model="claude-test", max_tokens=8, messages=MESSAGES)
        assert raw.parse().content[0].text == "raw"
    attrs = instrumented.one("chat").attributes
    assert attrs["http.response.status_code"] == 200 and attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] == 5


def test_async_create_plain_and_streamed(server, instrumented: Pipeline):
    server.enqueue(s.anthropic_message("one", usage=(2, 1)), s.anthropic_stream(["t", "wo"], usage=(3, 2)))

    async def run() -> str:
        async with anthropic.AsyncAnthropic(base_url=server.root_url, api_key="k", max_retries=0) as ac:
            first = await ac.messages.create(model="claude-test", max_tokens=8, messages=MESSAGES)
            stream = await ac.messages.create(model="claude-test", max_tokens=8, messages=MESSAGES, stream=True)
            parts = [e.delta.text async for e in stream if e.type == "content_block_delta"]
            return first.content[0].text + "".join(parts)

    assert asyncio.run(run()) == "onetwo"
    plain, streamed = instrumented.spans("chat")
    assert plain.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 2 and sc.STREAM_END not in plain.attributes
    assert streamed.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 2 and streamed.attributes[sc.STREAM_END] == "exhausted"
