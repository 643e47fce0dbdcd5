"""Content capture off: no prompt, completion, tool argument or tool result text reaches any span, on any path."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from otel_replay.instrumentation import invoke_agent, tool, unwrap_tool, wrap_tool
from otel_replay.instrumentation import scripted as s

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


CARD = "4111 1111 1111 1111"
BEARER = "zqbearer0123456789abcdef"
LEAKY_MESSAGE = f"card {CARD} refused; sent Authorization: Bearer {BEARER}"


def _errors(pipeline: Pipeline) -> list[Any]:
    failed = [span for span in pipeline.exporter.get_finished_spans() if span.status.status_code.name == "ERROR"]
    assert failed, [span.name for span in pipeline.exporter.get_finished_spans()]
    return failed


def _raise_everywhere(pipeline: Pipeline, server: s.ScriptedServer, capture: bool) -> None:
    """A tool and a model call (plain and streamed) that fail with a message carrying a card and a token."""

    @tool(tracer_provider=pipeline.provider, capture_content=capture)
    def charge(amount: int) -> None:
        raise ValueError(LEAKY_MESSAGE)

    server.enqueue(s.error(400, LEAKY_MESSAGE), s.error(400, LEAKY_MESSAGE))
    try:
        charge(12)
    except ValueError:
        pass
    with openai.OpenAI(base_url=server.base_url, api_key="sk-test-key", max_retries=0) as oai:
        for stream in (False, True):
            try:
                oai.chat.completions.create(
                    model="gpt-test", messages=[{"role": "user", "content": "x"}], stream=stream
                )
            except openai.BadRequestError:
                pass


def test_with_capture_off_a_failed_tool_or_model_span_keeps_the_error_type_only(
    server: s.ScriptedServer, instrumented: Pipeline
):
    _raise_everywhere(instrumented, server, capture=False)
    failed = _errors(instrumented)
    assert {span.attributes.get("error.type") for span in failed} == {"ValueError", "BadRequestError"}
    assert len(failed) == 3
    for span in failed:
        assert span.status.description in ("ValueError", "BadRequestError")
        (event,) = span.events
        assert dict(event.attributes or {}) == {"exception.type": span.attributes["error.type"]}
    text = _everything(instrumented)
    assert "refused" not in text and "1111" not in text and BEARER not in text


def test_with_capture_on_a_failed_tool_or_model_span_keeps_the_message_redacted(
    server: s.ScriptedServer, capturing: Pipeline
):
    _raise_everywhere(capturing, server, capture=True)
    failed = _errors(capturing)
    assert len(failed) == 3
    for span in failed:
        message = dict(span.events[0].attributes or {})["exception.message"]
        assert "refused" in message and "Bearer [REDACTED]" in message and "card [REDACTED] refused" in message
        assert "exception.stacktrace" not in dict(span.events[0].attributes or {})
    text = _everything(capturing)
    assert "1111" not in text and BEARER not in text


def test_with_capture_off_a_failed_agent_span_keeps_the_error_type_only(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", raising=False)
    with pytest.raises(ValueError), invoke_agent("payer", tracer_provider=pipeline.provider):
        raise ValueError(LEAKY_MESSAGE)
    (span,) = _errors(pipeline)
    assert span.status.description == "ValueError" and span.attributes["error.type"] == "ValueError"
    assert "refused" not in _everything(pipeline) and BEARER not in _everything(pipeline)
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    with pytest.raises(ValueError), invoke_agent("payer", tracer_provider=pipeline.provider):
        raise ValueError(LEAKY_MESSAGE)
    assert "card [REDACTED] refused" in _everything(pipeline) and BEARER not in _everything(pipeline)
