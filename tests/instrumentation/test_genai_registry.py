"""Every gen_ai.* / openai.* attribute and span event our instrumentors emit conforms to the GenAI registry.

The registry, the span and event definitions and the message JSON schemas are the copies in
``genai_registry/`` (their source and version are named there). Every instrumented call kind runs against
the scripted server, with content capture on and off: a name the registry lacks, a value of the wrong type,
an enum value it does not list, an event it does not define, or a message that does not fit its schema fails.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import openai
import pytest
import yaml
from opentelemetry.sdk.trace import ReadableSpan

from otel_replay import semconv as sc
from otel_replay.instrumentation import AnthropicInstrumentor, OpenAIInstrumentor, invoke_agent, tool
from otel_replay.instrumentation import scripted as s

from .conftest import Pipeline

REGISTRY = Path(__file__).parent / "genai_registry"
SCHEMAS = {
    sc.GEN_AI_INPUT_MESSAGES: "gen-ai-input-messages.json",
    sc.GEN_AI_OUTPUT_MESSAGES: "gen-ai-output-messages.json",
    sc.GEN_AI_SYSTEM_INSTRUCTIONS: "gen-ai-system-instructions.json",
    sc.GEN_AI_TOOL_DEFINITIONS: "gen-ai-tool-definitions.json",
}
PART_SHAPES = {
    "text": "TextPart",
    "tool_call": "ToolCallRequestPart",
    "tool_call_response": "ToolCallResponsePart",
    "reasoning": "ReasoningPart",
    "blob": "BlobPart",
    "file": "FilePart",
    "uri": "UriPart",
}
"""The part kinds the schemas give a shape for, and that shape: a part of one of these kinds must fit it (the
schemas alone let any ``{"type"}`` through as a generic part, which our instrumentors never mean to send)."""
STANDARD_EVENTS = {"exception"}
"""Span events of the general OpenTelemetry conventions (an exception recorded on a failed call)."""


@cache
def registry() -> dict[str, Any]:
    """Attribute name -> its type in the registry (a ``members`` mapping for an enum), deprecated ones left out."""
    types: dict[str, Any] = {}
    for name in ("registry.yaml", "openai-registry.yaml"):
        for group in yaml.safe_load((REGISTRY / name).read_text())["groups"]:
            for attribute in group.get("attributes", ()):
                if "deprecated" not in attribute:
                    types[attribute["id"]] = attribute["type"]
    return types


@cache
def events() -> set[str]:
    groups = yaml.safe_load((REGISTRY / "events.yaml").read_text())["groups"]
    return {group["name"] for group in groups if group.get("type") == "event"}


@cache
def validator(attribute: str, shape: str | None = None) -> jsonschema.protocols.Validator:
    """The schema of a content attribute, or of one of its ``$defs`` (a part's shape)."""
    schema = json.loads((REGISTRY / SCHEMAS[attribute]).read_text())
    if shape is not None:
        schema = {"$defs": schema["$defs"], "$ref": f"#/$defs/{shape}"}
    return jsonschema.Draft202012Validator(schema)


def conforms(value: Any, kind: Any) -> bool:
    """Whether an attribute value (as the SDK stores it) has the registry type ``kind``."""
    if isinstance(kind, dict):  # an enum: one of its listed values
        return isinstance(value, str) and value in {member["value"] for member in kind["members"]}
    checks = {
        "string": lambda v: isinstance(v, str),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "double": lambda v: isinstance(v, float),
        "boolean": lambda v: isinstance(v, bool),
        "string[]": lambda v: isinstance(v, tuple | list) and all(isinstance(x, str) for x in v),
        "any": lambda v: isinstance(v, str),  # structured values are recorded as JSON text on spans
    }
    return checks[kind](value)


def check_messages(attribute: str, text: str) -> list[str]:
    """What is wrong with a captured content attribute: not JSON, off-schema, a part kind or role not named."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return [f"{attribute} is not JSON: {exc}"]
    problems = [f"{attribute}: {error.message}" for error in validator(attribute).iter_errors(value)]
    if attribute == sc.GEN_AI_TOOL_DEFINITIONS:
        return problems
    messages = value if attribute != sc.GEN_AI_SYSTEM_INSTRUCTIONS else [{"role": "system", "parts": value}]
    for message in messages if isinstance(messages, list) else ():
        if message.get("role") not in ("system", "user", "assistant", "tool"):
            problems.append(f"{attribute}: role {message.get('role')!r}")
        for part in message.get("parts", ()):
            shape = PART_SHAPES.get(part.get("type"))
            if shape is None:
                problems.append(f"{attribute}: a generic part {part!r}")
            else:
                problems += [f"{attribute}: {e.message}" for e in validator(attribute, shape).iter_errors(part)]
            if part.get("type") == "tool_call" and not isinstance(part.get("arguments"), dict):
                problems.append(f"{attribute}: tool call arguments not an object: {part!r}")
    return problems


def violations(span: ReadableSpan) -> list[str]:
    """Every way ``span``'s GenAI attributes and events depart from the registry."""
    found: list[str] = []
    items = [(span.name, dict(span.attributes or {}))]
    for event in span.events:
        if event.name not in STANDARD_EVENTS and event.name not in events():
            found.append(f"{span.name}: event {event.name!r} is not defined by events.yaml")
        items.append((f"{span.name} / {event.name}", dict(event.attributes or {})))
    for where, attributes in items:
        for key, value in attributes.items():
            if not key.startswith(("gen_ai.", "openai.")):
                continue
            if key not in registry():
                found.append(f"{where}: {key} is not in the registry")
            elif not conforms(value, registry()[key]):
                found.append(f"{where}: {key} = {value!r} is not of type {registry()[key]!r}")
            elif key in SCHEMAS:
                found += [f"{where}: {problem}" for problem in check_messages(key, value)]
    return found


# --- every call kind, against the scripted server ---------------------------------------------------

CHAT_TOOLS = [
    {
        "type": "function",
        "function": {"name": "pay", "description": "Pay an invoice", "parameters": {"type": "object"}},
    }
]
CHAT_MESSAGES = [
    {"role": "system", "content": "You pay invoices."},
    {"role": "user", "content": [{"type": "text", "text": "pay INV-1"}]},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "pay", "arguments": '{"n": 1}'}}],
    },
    {"role": "tool", "tool_call_id": "call_0", "content": "paid"},
]
RESPONSES_INPUT = [
    {"role": "developer", "content": "be brief"},
    {"role": "user", "content": [{"type": "input_text", "text": "pay INV-2"}]},
    {"type": "function_call", "call_id": "call_1", "name": "pay", "arguments": '{"n": 2}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "paid"},
]
RESPONSES_TOOLS = [{"type": "function", "name": "pay", "parameters": {"type": "object"}, "strict": False}]
ANTHROPIC_MESSAGES = [
    {"role": "user", "content": "refund order 7"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_0", "name": "refund", "input": {"o": 7}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_0", "content": "done"}]},
]
ANTHROPIC_TOOLS = [{"name": "refund", "description": "Refund an order", "input_schema": {"type": "object"}}]


def chat_reply() -> s.Reply:
    reply = s.chat_completion(None, tool_calls=[("call_a", "pay", {"amount": 10})])
    reply.body.update(system_fingerprint="fp_1", service_tier="default")
    reply.body["usage"].update(
        prompt_tokens_details={"cached_tokens": 4}, completion_tokens_details={"reasoning_tokens": 2}
    )
    return reply


def anthropic_reply() -> s.Reply:
    reply = s.anthropic_message("ok", tool_uses=[("toolu_1", "refund", {"order": 7})])
    reply.body["usage"].update(cache_read_input_tokens=5, cache_creation_input_tokens=3)
    return reply


def run_every_call(server: s.ScriptedServer, pipeline: Pipeline, capture: bool) -> None:
    server.enqueue(
        chat_reply(),
        s.chat_stream(["Pay", "ing"], tool_calls=[("call_s", "pay", {"amount": 99})]),
        s.chat_stream(["via", " parse"], tool_calls=[("call_w", "pay", {"amount": 5})]),
        s.Reply(200, s.response_object("done", tool_calls=[("call_r", "pay", {"amount": 3})])),
        s.responses_call_stream("streamed", tool_calls=[("call_t", "pay", {"amount": 4})]),
        s.responses_call_stream("parsed"),
        anthropic_reply(),
        s.anthropic_stream(["Refun", "ding"], tool_uses=[("toolu_2", "refund", {"order": 8})]),
        s.anthropic_stream(["helper"]),
    )
    with (
        openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0) as oa,
        anthropic.Anthropic(base_url=server.root_url, api_key="k", max_retries=0) as an,
    ):
        run_calls(oa, an, pipeline.provider)

    @tool(side_effect="write", capture_content=capture, tracer_provider=pipeline.provider)
    def pay(amount: int) -> dict[str, Any]:
        """Pay an amount."""
        return {"paid": amount}

    pay(amount=99)


def run_calls(oa: openai.OpenAI, an: anthropic.Anthropic, provider: Any) -> None:
    chat = dict(model="gpt-test", messages=CHAT_MESSAGES, tools=CHAT_TOOLS)
    with invoke_agent("payer", agent_id="agent-1", description="pays", tracer_provider=provider):
        oa.chat.completions.create(
            **chat,
            temperature=1,
            top_p=0.5,
            frequency_penalty=0,
            presence_penalty=0.25,
            max_tokens=64,
            seed=3,
            stop="END",
            n=2,
            service_tier="auto",
        )
        list(oa.chat.completions.create(**chat, stream=True, stream_options={"include_usage": True}))
        with oa.chat.completions.with_streaming_response.create(**chat, stream=True) as response:
            list(response.parse())
    responses = dict(model="gpt-test", input=RESPONSES_INPUT, instructions="Pay invoices.", tools=RESPONSES_TOOLS)
    oa.responses.create(**responses)
    list(oa.responses.create(**responses, stream=True))
    with oa.responses.with_streaming_response.create(**responses, stream=True) as response:
        list(response.parse())
    claude = dict(model="claude-test", max_tokens=64, messages=ANTHROPIC_MESSAGES, tools=ANTHROPIC_TOOLS)
    an.messages.create(**claude, system="You refund orders.", stop_sequences=["END"])
    list(an.messages.create(**claude, system=[{"type": "text", "text": "Refund."}], stream=True))
    with an.messages.stream(**claude) as stream:
        stream.get_final_text()


@pytest.fixture(params=[True, False], ids=["capture-on", "capture-off"])
def observed(request: pytest.FixtureRequest, pipeline: Pipeline) -> Iterator[tuple[Pipeline, bool]]:
    capture = bool(request.param)
    instrumentors = [OpenAIInstrumentor(), AnthropicInstrumentor()]
    for instrumentor in instrumentors:
        instrumentor.instrument(tracer_provider=pipeline.provider, capture_content=capture)
    yield pipeline, capture
    for instrumentor in instrumentors:
        instrumentor.uninstrument()


def test_every_genai_attribute_and_event_we_emit_is_in_the_registry(server, observed: tuple[Pipeline, bool]):
    pipeline, capture = observed
    run_every_call(server, pipeline, capture)
    spans = pipeline.spans()
    models = [span for span in spans if span.attributes.get(sc.KIND) == sc.KIND_MODEL]
    assert len(models) == 9, [span.name for span in spans]
    assert [violation for span in spans for violation in violations(span)] == []
    emitted = {key for span in spans for key in span.attributes or {}}
    expected = {
        sc.GEN_AI_REQUEST_STREAM,
        sc.GEN_AI_REQUEST_FREQUENCY_PENALTY,
        sc.GEN_AI_REQUEST_PRESENCE_PENALTY,
        sc.GEN_AI_REQUEST_CHOICE_COUNT,
        sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
        sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS,
        sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS,
        sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK,
        sc.OPENAI_REQUEST_SERVICE_TIER,
        sc.OPENAI_RESPONSE_SYSTEM_FINGERPRINT,
        sc.OPENAI_RESPONSE_SERVICE_TIER,
        sc.GEN_AI_AGENT_NAME,
        sc.GEN_AI_TOOL_CALL_ID,
    }
    content = {
        sc.GEN_AI_INPUT_MESSAGES,
        sc.GEN_AI_OUTPUT_MESSAGES,
        sc.GEN_AI_SYSTEM_INSTRUCTIONS,
        sc.GEN_AI_TOOL_DEFINITIONS,
        sc.GEN_AI_TOOL_CALL_ARGUMENTS,
        sc.GEN_AI_TOOL_CALL_RESULT,
    }
    assert expected <= emitted
    assert (content & emitted) == (content if capture else set())
    assert all(span.attributes[sc.GEN_AI_REQUEST_STREAM] is (sc.MODEL_STREAMED in span.attributes) for span in models)


def test_a_name_type_or_shape_off_the_registry_is_caught():
    """The checker itself: each kind of departure is reported (so a passing check means something)."""
    good = json.dumps([{"role": "user", "parts": [{"type": "text", "content": "hi"}]}])
    assert check_messages(sc.GEN_AI_INPUT_MESSAGES, good) == []
    wrong = {
        "an object, not an array": json.dumps({"messages": [{"role": "user", "content": "hi"}]}),
        "no parts": json.dumps([{"role": "user", "content": "hi"}]),
        "a part with no content": json.dumps([{"role": "user", "parts": [{"type": "text"}]}]),
        "arguments as a list": json.dumps(
            [{"role": "assistant", "parts": [{"type": "tool_call", "id": "c", "name": "f", "arguments": [1]}]}]
        ),
        "an unnamed role": json.dumps([{"role": "robot", "parts": []}]),
        "not JSON": "[{",
    }
    for why, text in wrong.items():
        assert check_messages(sc.GEN_AI_INPUT_MESSAGES, text), why
    no_reason = json.dumps([{"role": "assistant", "parts": []}])
    assert check_messages(sc.GEN_AI_OUTPUT_MESSAGES, no_reason)
    assert not conforms(1, registry()[sc.GEN_AI_REQUEST_TEMPERATURE])  # an int where a double is due
    assert not conforms("completed", registry()[sc.GEN_AI_RESPONSE_FINISH_REASONS])
    assert not conforms("chatting", registry()[sc.GEN_AI_OPERATION_NAME])
    assert "gen_ai.tool.call" not in events() and "gen_ai.system" not in registry()
