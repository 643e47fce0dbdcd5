"""``OpenAIInstrumentor``: model-call spans for the ``openai`` client.

Wraps ``chat.completions.create`` and ``responses.create`` on the sync and
async resources (so the ``with_raw_response`` and ``with_streaming_response``
paths, which call the same methods, are covered too). Spans follow the GenAI
semantic conventions: ``chat {model}``, kind CLIENT, ``gen_ai.provider.name =
openai``, request parameters, response model and id, finish reasons (for
``responses.create``: ``stop``, or ``tool_calls`` when the output has function
calls), token usage with cached and reasoning tokens, ``openai.response.*``,
and the tool calls in ``replay.model.tool_calls``.

``openai`` is imported only when :meth:`instrument` runs, so this module
imports in an environment without it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Final

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]
from opentelemetry.trace import Span

from otel_replay import semconv as sc
from otel_replay.instrumentation._common import Layers, content_enabled, tracer_for
from otel_replay.instrumentation._genai import MAX_TOOL_CALLS, ToolCall, write_response
from otel_replay.instrumentation._messages import LINK_CHARS, Budget, Kept, reasoning_part, text_part, tool_call_part
from otel_replay.instrumentation._messages import message as shaped
from otel_replay.instrumentation._model import ModelMethod, async_wrapper, sync_wrapper
from otel_replay.instrumentation._shapes import chat_input, responses_input
from otel_replay.redaction import MAX_CONTENT_CHARS, check_settings

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


def _chat_usage(usage: Any) -> dict[str, Any]:
    """Token counts of a chat completion's ``usage`` (cached and reasoning tokens from their details)."""
    return {
        "input_tokens": getattr(usage, "prompt_tokens", None),
        "output_tokens": getattr(usage, "completion_tokens", None),
        "cache_read": getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", None),
        "reasoning": getattr(getattr(usage, "completion_tokens_details", None), "reasoning_tokens", None),
    }


def _openai_extra(response: Any) -> dict[str, Any]:
    return {
        sc.OPENAI_RESPONSE_SYSTEM_FINGERPRINT: getattr(response, "system_fingerprint", None),
        sc.OPENAI_RESPONSE_SERVICE_TIER: getattr(response, "service_tier", None),
    }


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
            parts = [text_part(message.content)] if isinstance(message.content, str) else []
            if isinstance(getattr(message, "refusal", None), str):
                parts.append(text_part(message.refusal))
            parts += [tool_call_part(*c) for c in mine]
            outputs.append(shaped(message.role or "assistant", parts, finish_reason=choice.finish_reason or ""))
    write_response(
        span,
        response_id=getattr(completion, "id", None),
        model=getattr(completion, "model", None),
        finish_reasons=finish,
        usage=_chat_usage(getattr(completion, "usage", None)),
        extra=_openai_extra(completion),
        tool_calls=calls,
        capture=capture,
        output_messages=outputs if capture else None,
    )


class _ChatChunks:
    """Aggregates ``ChatCompletionChunk`` objects: id, model, finish reasons, usage, tool calls, content.

    Content is kept within what can reach the span, tool-call arguments within :data:`LINK_CHARS`, and at
    most ``MAX_TOOL_CALLS`` calls (the rest counted): memory does not grow with the stream.
    """

    __slots__ = ("args", "capture", "content", "extra", "id", "model", "more", "reasons", "text", "tools", "usage")

    def __init__(self, capture: bool) -> None:
        self.capture = capture
        self.id: str | None = None
        self.model: str | None = None
        self.usage: Any = None
        self.extra: dict[str, Any] = {}
        self.reasons: dict[int, str] = {}
        self.tools: dict[tuple[int, int], list[Any]] = {}
        self.more = 0
        self.content: dict[int, Kept] = {}
        self.text = Budget(MAX_CONTENT_CHARS)
        self.args = Budget(LINK_CHARS)

    def add(self, chunk: Any) -> None:
        if self.id is None:
            self.id = chunk.id
            self.model = chunk.model
            self.extra = _openai_extra(chunk)
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
                kept = self.content.get(choice.index)
                if kept is None:
                    kept = self.content[choice.index] = Kept(self.text)
                kept.add(delta.content)
            for call in delta.tool_calls or ():
                key = (choice.index, call.index)
                slot = self.tools.get(key)
                if slot is None:
                    if len(self.tools) >= MAX_TOOL_CALLS:
                        self.more += 1 if call.id else 0  # a call's first delta carries its id
                        continue
                    slot = self.tools[key] = [None, None, Kept(self.args)]
                if call.id:
                    slot[0] = call.id
                function = call.function
                if function is not None:
                    if function.name:
                        slot[1] = function.name
                    if function.arguments:
                        slot[2].add(function.arguments)

    def finish(self, span: Span) -> None:
        ordered = sorted(self.tools.items())
        calls: list[ToolCall] = [(s[0], s[1], s[2].text()) for _, s in ordered]
        calls += [(None, None, None)] * self.more  # counted as dropped past the cap
        outputs: list[dict[str, Any]] | None = None
        cut = 0
        if self.capture:
            outputs = []
            for index in sorted(set(self.reasons) | set(self.content)):
                kept = self.content.get(index)
                parts = [text_part(kept.text())] if kept is not None else []
                cut += kept.cut if kept is not None else 0
                parts += [tool_call_part(s[0], s[1], s[2].text()) for (i, _), s in ordered if i == index]
                outputs.append(shaped("assistant", parts, finish_reason=self.reasons.get(index, "")))
        if not self.reasons and not self.content and calls and outputs is not None:
            outputs.append(shaped("assistant", [tool_call_part(*c) for c in calls if c[1]], finish_reason=""))
        write_response(
            span,
            response_id=self.id,
            model=self.model,
            finish_reasons=[reason for _, reason in sorted(self.reasons.items())],
            usage=_chat_usage(self.usage),
            extra=self.extra,
            tool_calls=calls,
            capture=self.capture,
            output_messages=outputs,
            content_cut=cut,
        )


# --- responses ----------------------------------------------------------------------------------

_INCOMPLETE: Final = {"max_output_tokens": "length", "content_filter": "content_filter"}


def _responses_finish(response: Any, called: bool) -> str:
    """The finish reason a Responses result stands for: its status says whether, its items why."""
    status = getattr(response, "status", None)
    if status == "incomplete":
        reason = getattr(getattr(response, "incomplete_details", None), "reason", None)
        return _INCOMPLETE.get(reason, reason) if isinstance(reason, str) else "length"
    if status in ("failed", "cancelled"):
        return "error"
    return "tool_calls" if called else "stop"


def _record_response(span: Span, response: Any, capture: bool) -> None:
    calls: list[ToolCall] = []
    parts: list[dict[str, Any]] = []
    for item in getattr(response, "output", None) or ():
        kind = getattr(item, "type", None)
        if kind == "function_call":
            calls.append((item.call_id, item.name, item.arguments))
            if capture:
                parts.append(tool_call_part(item.call_id, item.name, item.arguments))
        elif capture and kind == "message":
            for part in getattr(item, "content", None) or ():
                text = getattr(part, "text", None)
                if not isinstance(text, str):
                    text = getattr(part, "refusal", None)
                if isinstance(text, str):
                    parts.append(text_part(text))
        elif capture and kind == "reasoning":
            for summary in getattr(item, "summary", None) or ():
                if isinstance(getattr(summary, "text", None), str):
                    parts.append(reasoning_part(summary.text))
    usage = getattr(response, "usage", None)
    status = getattr(response, "status", None)
    finish = _responses_finish(response, bool(calls)) if status not in (None, "in_progress", "queued") else None
    write_response(
        span,
        response_id=getattr(response, "id", None),
        model=getattr(response, "model", None),
        finish_reasons=[finish] if finish else [],
        usage={
            "input_tokens": getattr(usage, "input_tokens", None),
            "output_tokens": getattr(usage, "output_tokens", None),
            "cache_read": getattr(getattr(usage, "input_tokens_details", None), "cached_tokens", None),
            "reasoning": getattr(getattr(usage, "output_tokens_details", None), "reasoning_tokens", None),
        },
        extra={sc.OPENAI_RESPONSE_SERVICE_TIER: getattr(response, "service_tier", None)},
        tool_calls=calls,
        capture=capture,
        output_messages=[shaped("assistant", parts, finish_reason=finish or "")] if capture else None,
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


_METHODS: Final = {
    "chat": ModelMethod("openai", "openai.chat.completions.create", _record_chat, _ChatChunks, chat_input),
    "responses": ModelMethod("openai", "openai.responses.create", _record_response, _ResponseEvents, responses_input),
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
        wrappers: dict[str, dict[str, Callable[..., Any]]] = {}
        for module, owner, api, aio in _TARGETS:
            method = _METHODS[api]
            wrapper = async_wrapper(tracer, method, capture) if aio else sync_wrapper(tracer, method, capture)
            wrappers.setdefault(module, {})[f"{owner}.create"] = wrapper
        for module, targets in wrappers.items():  # openai is not imported here if the application has not yet
            self._layers.wrap_when_imported(module, targets)

    def _uninstrument(self, **kwargs: Any) -> None:
        self._layers.remove()
