"""Captured content in the registry's shapes, from ordinary and hostile requests and responses alike."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from otel_replay import semconv as sc
from otel_replay.instrumentation import scripted as s

from .conftest import Pipeline
from .test_genai_registry import check_messages, violations


def chat(server: s.ScriptedServer, **kwargs: Any) -> Any:
    with openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0) as c:
        return c.chat.completions.create(model="gpt-test", **kwargs)


def content_of(span: Any) -> dict[str, Any]:
    return {
        key: json.loads(span.attributes[key])
        for key in (sc.GEN_AI_INPUT_MESSAGES, sc.GEN_AI_OUTPUT_MESSAGES, sc.GEN_AI_SYSTEM_INSTRUCTIONS)
        if key in span.attributes
    }


def test_hostile_chat_messages_still_give_conforming_content_and_the_call_is_unchanged(server, capturing: Pipeline):
    nested: Any = "bottom"
    for _ in range(60):
        nested = {"deeper": nested}
    messages: list[Any] = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.test/a.png"}}]},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "mystery", "payload": nested}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "not json {"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "result"}]},
        {"role": "user", "content": 'ünïcode \u2028 "quoted" \\ back\\slash', "name": "ann"},
    ]
    server.enqueue(s.chat_completion("fine"))
    assert chat(server, messages=messages).choices[0].message.content == "fine"
    span = capturing.one("chat")
    [request] = [r for r in server.requests if r["method"] == "POST"]
    assert request["json"]["messages"][1]["content"][1]["payload"] == nested  # the request went as given
    shaped = content_of(span)[sc.GEN_AI_INPUT_MESSAGES]
    assert shaped[0]["parts"] == [{"type": "image_url", "image_url": {"url": "https://example.test/a.png"}}]
    assert shaped[2]["parts"][0]["arguments"] == "not json {"  # kept as the model's text when it is not JSON
    assert shaped[3] == {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": "c1", "response": [{"type": "text", "text": "result"}]}],
    }
    assert shaped[4]["name"] == "ann" and "\u2028" in shaped[4]["parts"][0]["content"]
    # the schemas themselves accept generic parts; only our stricter check (no generic part) flags them
    problems = check_messages(sc.GEN_AI_INPUT_MESSAGES, span.attributes[sc.GEN_AI_INPUT_MESSAGES])
    assert problems and all("generic part" in p or "not an object" in p for p in problems)


def test_messages_given_as_a_generator_are_not_consumed_by_the_instrumentation(server, capturing: Pipeline):
    server.enqueue(s.chat_completion("ok"))
    chat(server, messages=(m for m in [{"role": "user", "content": "from a generator"}]))
    [request] = [r for r in server.requests if r["method"] == "POST"]
    assert request["json"]["messages"] == [{"role": "user", "content": "from a generator"}]
    assert sc.GEN_AI_INPUT_MESSAGES not in capturing.one("chat").attributes


def test_secrets_in_messages_and_tool_arguments_are_redacted_and_the_json_stays_valid(server, capturing: Pipeline):
    secret = "sk-live-abcdefghijklmnopqrstuvwxyz0123"
    server.enqueue(s.chat_completion(None, tool_calls=[("c9", "login", {"password": "hunter22", "user": "ann"})]))
    chat(server, messages=[{"role": "user", "content": f"my key is {secret}", "api_key": secret}])
    span = capturing.one("chat")
    for key in (sc.GEN_AI_INPUT_MESSAGES, sc.GEN_AI_OUTPUT_MESSAGES, sc.MODEL_TOOL_CALLS):
        text = span.attributes[key]
        json.loads(text)
        assert secret not in text and "hunter22" not in text
    [output] = json.loads(span.attributes[sc.GEN_AI_OUTPUT_MESSAGES])
    assert output["parts"][0]["arguments"]["user"] == "ann"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (s.response_object("plain text"), "stop"),
        (s.response_object("", tool_calls=[("c1", "f", {})]), "tool_calls"),
        (
            {**s.response_object("cut"), "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}},
            "length",
        ),
        (
            {
                **s.response_object("filtered"),
                "status": "incomplete",
                "incomplete_details": {"reason": "content_filter"},
            },
            "content_filter",
        ),
        ({**s.response_object(""), "status": "failed"}, "error"),
    ],
    ids=["text", "function-call", "max-tokens", "content-filter", "failed"],
)
def test_responses_finish_reasons_come_from_the_output_not_the_status(server, capturing: Pipeline, body, reason):
    server.enqueue(s.Reply(200, body))
    with openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0) as c:
        c.responses.create(model="gpt-test", input="go")
    span = capturing.one("chat")
    assert tuple(span.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == (reason,)
    [output] = content_of(span)[sc.GEN_AI_OUTPUT_MESSAGES]
    assert output["finish_reason"] == reason and violations(span) == []


def test_anthropic_and_openai_tool_calls_have_the_same_shape(server, capturing: Pipeline):
    server.enqueue(
        s.chat_completion(None, tool_calls=[("call_1", "refund", {"order": 7})]),
        s.anthropic_message(None, tool_uses=[("toolu_1", "refund", {"order": 7})]),
        s.anthropic_stream([], tool_uses=[("toolu_2", "refund", {"order": 7})]),
    )
    chat(server, messages=[{"role": "user", "content": "refund"}])
    with anthropic.Anthropic(base_url=server.root_url, api_key="k", max_retries=0) as c:
        c.messages.create(model="claude-test", max_tokens=8, messages=[{"role": "user", "content": "refund"}])
        list(
            c.messages.create(
                model="claude-test", max_tokens=8, messages=[{"role": "user", "content": "x"}], stream=True
            )
        )
    parts = [content_of(span)[sc.GEN_AI_OUTPUT_MESSAGES][0]["parts"] for span in capturing.spans("chat")]
    shapes = [[(p["type"], p["name"], p["arguments"]) for p in found] for found in parts]
    assert shapes == [[("tool_call", "refund", {"order": 7})]] * 3
    listed = [json.loads(span.attributes[sc.MODEL_TOOL_CALLS])[0] for span in capturing.spans("chat")]
    assert [sorted(entry) for entry in listed] == [["arguments", "id", "name"]] * 3


def test_anthropic_thinking_and_system_blocks_become_reasoning_and_system_instructions(server, capturing: Pipeline):
    reply = s.anthropic_message("answer")
    reply.body["content"].insert(0, {"type": "thinking", "thinking": "let me see", "signature": "sig"})
    server.enqueue(reply)
    with anthropic.Anthropic(base_url=server.root_url, api_key="k", max_retries=0) as c:
        c.messages.create(
            model="claude-test",
            max_tokens=8,
            system=[{"type": "text", "text": "Be exact."}],
            messages=[{"role": "user", "content": "q"}],
        )
    span = capturing.one("chat")
    found = content_of(span)
    assert found[sc.GEN_AI_SYSTEM_INSTRUCTIONS] == [{"type": "text", "content": "Be exact."}]
    assert found[sc.GEN_AI_OUTPUT_MESSAGES][0]["parts"] == [
        {"type": "reasoning", "content": "let me see"},
        {"type": "text", "content": "answer"},
    ]
    assert violations(span) == []
