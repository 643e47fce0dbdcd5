"""Content capture off: no prompt, completion, tool argument or tool result text reaches any span, on any path."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai

from otel_replay.instrumentation import scripted as s
from otel_replay.instrumentation import tool, unwrap_tool, wrap_tool

from .conftest import Pipeline

PROMPT = "zqxprompt-pay-invoice"
ANSWER = "zqxanswer-paid"
ARG = "zqxargument-acme"
RESULT = "zqxresult-receipt"
MARKERS = (PROMPT, ANSWER, ARG, RESULT)


def _everything(pipeline: Pipeline) -> str:
    """Every attribute and event attribute of every finished span, as one text."""
    parts: list[Any] = []
    for span in pipeline.exporter.get_finished_spans():
        parts.append(span.name)
        parts.append(dict(span.attributes or {}))
        parts.extend(dict(e.attributes or {}) for e in span.events)
        parts.append(span.status.description)
    return json.dumps(parts, default=str)


def send_note(text: str) -> str:
    """A plain function wrapped in place."""
    return f"{RESULT}:{text}"


def test_no_content_on_any_model_or_tool_path_with_capture_off(server: s.ScriptedServer, instrumented: Pipeline):
    messages = [{"role": "user", "content": PROMPT}]
    server.enqueue(
        s.chat_completion(ANSWER, tool_calls=[("call_1", "pay_vendor", {"vendor": ARG})]),
        s.chat_stream([ANSWER[:6], ANSWER[6:]], tool_calls=[("call_2", "pay_vendor", {"vendor": ARG})]),
        s.Reply(200, s.response_object(ANSWER, tool_calls=[("fc_1", "pay_vendor", {"vendor": ARG})])),
        s.responses_stream(ANSWER),
        s.anthropic_message(ANSWER, tool_uses=[("toolu_1", "pay_vendor", {"vendor": ARG})]),
        s.anthropic_stream([ANSWER], tool_uses=[("toolu_2", "pay_vendor", {"vendor": ARG})]),
    )
    oai = openai.OpenAI(base_url=server.base_url, api_key="sk-test-key", max_retries=0)
    oai.chat.completions.create(model="gpt-test", messages=messages)
    list(oai.chat.completions.create(model="gpt-test", messages=messages, stream=True))
    oai.responses.create(model="gpt-test", input=PROMPT, instructions=PROMPT)
    list(oai.responses.create(model="gpt-test", input=PROMPT, stream=True))
    with anthropic.Anthropic(base_url=server.root_url, api_key="sk-ant-test", max_retries=0) as claude:
        claude.messages.create(model="claude-test", max_tokens=8, messages=messages, system=PROMPT)
        list(claude.messages.create(model="claude-test", max_tokens=8, messages=messages, stream=True))

    @tool(tracer_provider=instrumented.provider)
    def pay_vendor(vendor: str) -> dict[str, str]:
        return {"receipt": RESULT, "vendor": vendor}

    assert pay_vendor(ARG)["receipt"] == RESULT
    wrap_tool(f"{__name__}:send_note", capture_content=False, tracer_provider=instrumented.provider)
    try:
        assert send_note(ARG).startswith(RESULT)
    finally:
        unwrap_tool(f"{__name__}:send_note")
    text = _everything(instrumented)
    assert text.count("chat ") >= 6 and "execute_tool pay_vendor" in text and "execute_tool send_note" in text
    leaked = [m for m in MARKERS if m in text]
    assert leaked == [], leaked
