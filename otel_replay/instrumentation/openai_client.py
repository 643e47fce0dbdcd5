"""``OpenAIInstrumentor``: model-call spans for the ``openai`` client.

Wraps ``chat.completions.create`` and ``responses.create`` on the sync and
async resources (so the ``with_raw_response`` and ``with_streaming_response``
paths, which call the same methods, are covered too). Spans follow the GenAI
semantic conventions: ``chat {model}``, kind CLIENT, ``gen_ai.provider.name =
openai``, request/response model, response id, finish reasons, token usage,
and one ``gen_ai.tool.call`` event per tool call in the response.

``openai`` is imported only when :meth:`instrument` runs, so this module
imports in an environment without it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Final

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]
from opentelemetry.trace import Span

from otel_replay.instrumentation._common import Layers, content_enabled, tracer_for
from otel_replay.instrumentation._genai import ToolCall, write_response
from otel_replay.instrumentation._model import ModelMethod, async_wrapper, sync_wrapper
from otel_replay.redaction import check_settings

__all__ = ["OpenAIInstrumentor"]

_CHAT_MODULE: Final = "openai.resources.chat.completions.completions"
_RESPONSES_MODULE: Final = "openai.resources.responses.responses"
_TARGETS: Final = (
    (_CHAT_MODULE, "Completions", "chat", False),
    (_CHAT_MODULE, "AsyncCompletions", "chat", True),
    (_RESPONSES_MODULE, "Responses", "responses", False),
    (_RESPONSES_MODULE, "AsyncResponses", "responses", True),
)


# --- chat.completions ---------------------------------------------------------------------------


def _record_chat(span: Span, completion: Any, capture: bool) -> None:
    finish: list[str] = []
    calls: list[ToolCall] = []
    outputs: list[dict[str, Any]] = []
    for choice in getattr(completion, "choices", None) or ():
        if choice.finish_reason:
            finish.append(choice.finish_reason)
        message = choice.message
        mine: list[ToolCall] = []
        for call in getattr(message, "tool_calls", None) or ():
            function = getattr(call, "function", None)
            if function is not None:
                mine.append((call.id, function.name, function.arguments))
        calls.extend(mine)
        if capture:
            outputs.append(
                {
                    "role": message.role,
                    "content": message.content,
                    "tool_calls": [{"id": c[0], "name": c[1], "arguments": c[2]} for c in mine] or None,
                    "finish_reason": choice.finish_reason,
                }
            )
    usage = getattr(completion, "usage", None)
    write_response(
        span,
        response_id=getattr(completion, "id", None),
        model=getattr(completion, "model", None),
        finish_reasons=finish,
        input_tokens=getattr(usage, "prompt_tokens", None),
        output_tokens=getattr(usage, "completion_tokens", None),
        tool_calls=calls,
        capture=capture,
        output_messages=outputs if capture else None,
    )


class _ChatChunks:
    """Aggregates ``ChatCompletionChunk`` objects: id, model, finish reasons, usage, tool calls, content."""

    __slots__ = ("capture", "content", "id", "model", "reasons", "tools", "usage")

    def __init__(self, capture: bool) -> None:
        self.capture = capture
        self.id: str | None = None
        self.model: str | None = None
        self.usage: Any = None
        self.reasons: dict[int, str] = {}
        self.tools: dict[tuple[int, int], list[Any]] = {}
        self.content: dict[int, list[str]] = {}

    def add(self, chunk: Any) -> None:
        if self.id is None:
            self.id = chunk.id
            self.model = chunk.model
        usage = chunk.usage
        if usage is not None:
            self.usage = usage
        for choice in chunk.choices:
            if choice.finish_reason:
                self.reasons[choice.index] = choice.finish_reason
            delta = choice.delta
            if delta is None:
                continue
            if self.capture and delta.content:
                self.content.setdefault(choice.index, []).append(delta.content)
            for call in delta.tool_calls or ():
                slot = self.tools.get((choice.index, call.index))
                if slot is None:
                    slot = self.tools[(choice.index, call.index)] = [None, None, []]
                if call.id:
                    slot[0] = call.id
                function = call.function
                if function is not None:
                    if function.name:
                        slot[1] = function.name
                    if function.arguments:
                        slot[2].append(function.arguments)

    def finish(self, span: Span) -> None:
        calls: list[ToolCall] = [(s[0], s[1], "".join(s[2])) for _, s in sorted(self.tools.items())]
        outputs: list[dict[str, Any]] | None = None
        if self.capture:
            outputs = [
                {"role": "assistant", "content": "".join(self.content.get(i, [])), "finish_reason": reason}
                for i, reason in sorted(self.reasons.items())
            ] or [{"role": "assistant", "content": "".join(v)} for _, v in sorted(self.content.items())]
            if calls:
                outputs.append({"tool_calls": [{"id": c[0], "name": c[1], "arguments": c[2]} for c in calls]})
        write_response(
            span,
            response_id=self.id,
            model=self.model,
            finish_reasons=[reason for _, reason in sorted(self.reasons.items())],
            input_tokens=getattr(self.usage, "prompt_tokens", None),
            output_tokens=getattr(self.usage, "completion_tokens", None),
            tool_calls=calls,
            capture=self.capture,
            output_messages=outputs,
        )


def _chat_input(kwargs: Mapping[str, Any]) -> Any:
    content: dict[str, Any] = {"messages": kwargs.get("messages")}
    tools = kwargs.get("tools")
    if isinstance(tools, list):
        content["tools"] = tools
    return content


# --- responses ----------------------------------------------------------------------------------


def _record_response(span: Span, response: Any, capture: bool) -> None:
    calls: list[ToolCall] = []
    outputs: list[Any] = []
    for item in getattr(response, "output", None) or ():
        kind = getattr(item, "type", None)
        if kind == "function_call":
            calls.append((item.call_id, item.name, item.arguments))
        elif capture and kind == "message":
            outputs.append(
                {
                    "role": getattr(item, "role", "assistant"),
                    "content": [getattr(part, "text", None) for part in getattr(item, "content", None) or ()],
                }
            )
    if capture and calls:
        outputs.append({"tool_calls": [{"id": c[0], "name": c[1], "arguments": c[2]} for c in calls]})
    usage = getattr(response, "usage", None)
    status = getattr(response, "status", None)
    write_response(
        span,
        response_id=getattr(response, "id", None),
        model=getattr(response, "model", None),
        finish_reasons=[status] if isinstance(status, str) else [],
        input_tokens=getattr(usage, "input_tokens", None),
        output_tokens=getattr(usage, "output_tokens", None),
        tool_calls=calls,
        capture=capture,
        output_messages=outputs if capture else None,
    )


_FINAL_EVENTS: Final = frozenset({"response.completed", "response.incomplete", "response.failed"})


class _ResponseEvents:
    """Keeps the final ``Response`` a responses stream ends with (it holds everything the span needs)."""

    __slots__ = ("capture", "final", "started")

    def __init__(self, capture: bool) -> None:
        self.capture = capture
        self.final: Any = None
        self.started: Any = None

    def add(self, event: Any) -> None:
        kind = getattr(event, "type", None)
        if kind in _FINAL_EVENTS:
            self.final = event.response
        elif kind == "response.created":
            self.started = event.response

    def finish(self, span: Span) -> None:
        response = self.final if self.final is not None else self.started
        if response is not None:
            _record_response(span, response, self.capture)


def _responses_input(kwargs: Mapping[str, Any]) -> Any:
    content: dict[str, Any] = {"input": kwargs.get("input")}
    for key in ("instructions", "tools"):
        value = kwargs.get(key)
        if isinstance(value, str | list):
            content[key] = value
    return content


_METHODS: Final = {
    "chat": ModelMethod("openai", "openai.chat.completions.create", _record_chat, _ChatChunks, _chat_input),
    "responses": ModelMethod("openai", "openai.responses.create", _record_response, _ResponseEvents, _responses_input),
}


class OpenAIInstrumentor(BaseInstrumentor):
    """Model-call spans for ``openai``'s ``chat.completions.create`` and ``responses.create``.

    ``OpenAIInstrumentor().instrument(tracer_provider=..., capture_content=...)``;
    ``capture_content`` defaults to ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``.
    Loaded by ``opentelemetry-instrument`` through the ``opentelemetry_instrumentor``
    entry point ``otel_replay_openai``.
    """

    def instrumentation_dependencies(self) -> Collection[str]:
        """The client versions this instrumentor supports."""
        return ("openai >= 1.40",)

    def _instrument(self, **kwargs: Any) -> None:
        tracer = tracer_for("openai", kwargs.get("tracer_provider"))
        capture = content_enabled(kwargs.get("capture_content"))
        check_settings()  # a bad OTEL_REPLAY_REDACT_* is refused here, not at the first captured call
        self._layers = Layers()
        for module, owner, api, aio in _TARGETS:
            method = _METHODS[api]
            wrapper = async_wrapper(tracer, method, capture) if aio else sync_wrapper(tracer, method, capture)
            self._layers.wrap(module, f"{owner}.create", wrapper)

    def _uninstrument(self, **kwargs: Any) -> None:
        self._layers.remove()
