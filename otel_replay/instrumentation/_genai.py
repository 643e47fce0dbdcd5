"""Writing a model call's request and response onto its span, in GenAI semantic-convention terms.

Provider modules extract plain values from their client's objects and hand
them here, so every provider's spans carry the same attributes the views read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from opentelemetry.trace import Span

from otel_replay import semconv as sc
from otel_replay.instrumentation import _toolcalls
from otel_replay.instrumentation._common import scope_ids
from otel_replay.instrumentation._messages import write_json
from otel_replay.redaction import scrub

__all__ = ["Input", "ToolCall", "request_attributes", "write_content", "write_input", "write_response"]

ToolCall = tuple[str | None, str | None, Any]
"""``(call id, tool name, arguments)`` of one tool call the model asked for."""

MAX_TOOL_CALLS: Final = 128
"""Tool calls recorded per response (the SDK's default event limit); the rest are counted, not recorded."""
MAX_NAME_CHARS: Final = 256
"""Ids, model names and finish reasons from a response are cut to this length."""


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= MAX_NAME_CHARS else text[:MAX_NAME_CHARS] + "…"


# request keyword -> attribute, for plain numeric parameters
_NUMERIC: Final = (
    ("temperature", sc.GEN_AI_REQUEST_TEMPERATURE),
    ("top_p", sc.GEN_AI_REQUEST_TOP_P),
    ("max_tokens", sc.GEN_AI_REQUEST_MAX_TOKENS),
    ("max_completion_tokens", sc.GEN_AI_REQUEST_MAX_TOKENS),
    ("max_output_tokens", sc.GEN_AI_REQUEST_MAX_TOKENS),
    ("seed", sc.GEN_AI_REQUEST_SEED),
    ("frequency_penalty", sc.GEN_AI_REQUEST_FREQUENCY_PENALTY),
    ("presence_penalty", sc.GEN_AI_REQUEST_PRESENCE_PENALTY),
)
_DOUBLES: Final = frozenset(
    {
        sc.GEN_AI_REQUEST_TEMPERATURE,
        sc.GEN_AI_REQUEST_TOP_P,
        sc.GEN_AI_REQUEST_TOP_K,
        sc.GEN_AI_REQUEST_FREQUENCY_PENALTY,
        sc.GEN_AI_REQUEST_PRESENCE_PENALTY,
    }
)
"""Attributes the conventions type as double: an int given for one is written as a float."""


def request_attributes(provider: str, kwargs: Mapping[str, Any], client: Any) -> dict[str, Any]:
    """The attributes known when the call starts (no content)."""
    attrs: dict[str, Any] = {
        sc.KIND: sc.KIND_MODEL,
        sc.GEN_AI_OPERATION_NAME: sc.GEN_AI_OP_CHAT,
        sc.GEN_AI_PROVIDER_NAME: provider,
    }
    model = kwargs.get("model")
    if isinstance(model, str):
        attrs[sc.GEN_AI_REQUEST_MODEL] = _short(model)
    for key, attr in _NUMERIC:
        value = kwargs.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            attrs[attr] = float(value) if attr in _DOUBLES else value
    top_k = kwargs.get("top_k")
    if isinstance(top_k, int | float) and not isinstance(top_k, bool):
        attrs[sc.GEN_AI_REQUEST_TOP_K] = float(top_k)
    count = kwargs.get("n")
    if isinstance(count, int) and not isinstance(count, bool) and count != 1:
        attrs[sc.GEN_AI_REQUEST_CHOICE_COUNT] = count
    if provider == "openai":
        tier = kwargs.get("service_tier")
        if isinstance(tier, str):
            attrs[sc.OPENAI_REQUEST_SERVICE_TIER] = _short(tier)
    stop = kwargs.get("stop", kwargs.get("stop_sequences"))
    if isinstance(stop, str):
        attrs[sc.GEN_AI_REQUEST_STOP_SEQUENCES] = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        attrs[sc.GEN_AI_REQUEST_STOP_SEQUENCES] = stop
    streamed = kwargs.get("stream") is True
    attrs[sc.GEN_AI_REQUEST_STREAM] = streamed
    if streamed:
        attrs[sc.MODEL_STREAMED] = True
    # the Stainless clients' ``base_url`` property returns ``_base_url`` but costs ~1 µs per read; read the field
    url = getattr(client, "_base_url", None)
    if url is None:
        url = getattr(client, "base_url", None)
    if url is not None:
        host, port = _server(url)
        if host:
            attrs[sc.SERVER_ADDRESS] = host
            if isinstance(port, int):
                attrs[sc.SERVER_PORT] = port
    scope_ids(attrs)
    return attrs


_last_server: tuple[Any, Any, Any] = (None, None, None)
"""The last base URL read, with its host and port (the client's URL object is immutable; reading them parses)."""


def _server(url: Any) -> tuple[Any, Any]:
    """``(host, port)`` of a client's base URL, remembered for the last URL object seen."""
    global _last_server
    last = _last_server
    if last[0] is url:
        return last[1], last[2]
    host = getattr(url, "host", None)
    port = getattr(url, "port", None) if host else None
    _last_server = (url, host, port)
    return host, port


def write_content(span: Span, attribute: str, value: Any) -> None:
    """Set captured content on ``span``, redacted; when redaction fails, count the drop instead."""
    text = scrub(value)
    if text is None:
        span.set_attribute(sc.TOOL_CONTENT_DROPPED, 1)
    else:
        span.set_attribute(attribute, text)


Input = tuple[Any, Any, Any]
"""A request's content in the conventions' shapes: ``(system instructions, input messages, tool definitions)``;
each ``None`` when the request has none."""


def write_input(span: Span, content: Input) -> None:
    """Set ``gen_ai.system_instructions``, ``gen_ai.input.messages`` and ``gen_ai.tool.definitions``."""
    system, messages, tools = content
    if system:
        write_json(span, sc.GEN_AI_SYSTEM_INSTRUCTIONS, system)
    if messages is not None:
        write_json(span, sc.GEN_AI_INPUT_MESSAGES, messages)
    if tools:
        write_json(span, sc.GEN_AI_TOOL_DEFINITIONS, tools)


_USAGE: Final = (
    ("input_tokens", sc.GEN_AI_USAGE_INPUT_TOKENS),
    ("output_tokens", sc.GEN_AI_USAGE_OUTPUT_TOKENS),
    ("cache_read", sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS),
    ("cache_creation", sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS),
    ("reasoning", sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS),
)


def write_response(
    span: Span,
    *,
    response_id: str | None,
    model: str | None,
    finish_reasons: Sequence[str],
    tool_calls: Sequence[ToolCall],
    capture: bool,
    output_messages: Any = None,
    content_cut: int = 0,
    usage: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Set the response attributes, the ``replay.model.tool_calls`` list, and the output content if on.

    ``usage``: token counts by ``input_tokens``, ``output_tokens``, ``cache_read``, ``cache_creation``,
    ``reasoning`` (ints; others ignored). ``extra``: provider attributes (strings, cut to the name length).
    ``content_cut``: characters of output content a stream already cut.
    """
    attrs: dict[str, Any] = {}
    if response_id:
        attrs[sc.GEN_AI_RESPONSE_ID] = _short(response_id)
    if model:
        attrs[sc.GEN_AI_RESPONSE_MODEL] = _short(model)
    if finish_reasons:
        attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] = [_short(r) for r in finish_reasons[:MAX_TOOL_CALLS]]
    for key, attr in _USAGE:
        value = usage.get(key) if usage else None
        if isinstance(value, int) and not isinstance(value, bool):
            attrs[attr] = value
    for attr, value in (extra or {}).items():
        if isinstance(value, str) and value:
            attrs[attr] = _short(value)
    if tool_calls:
        listed: list[dict[str, Any]] = []
        model_span = span.get_span_context()
        for call_id, name, arguments in tool_calls[:MAX_TOOL_CALLS]:
            call_id, name = _short(call_id or ""), _short(name or "")
            entry: dict[str, Any] = {"id": call_id, "name": name}
            if capture:
                text = scrub(arguments)
                if text is not None:
                    entry["arguments"] = text
            listed.append(entry)
            if call_id and name:
                _toolcalls.remember(name, arguments, call_id, model_span)
        attrs[sc.MODEL_TOOL_CALLS] = json.dumps(listed, separators=(",", ":"), default=str)
        if len(tool_calls) > MAX_TOOL_CALLS:
            attrs[sc.MODEL_TOOL_CALLS_DROPPED] = len(tool_calls) - MAX_TOOL_CALLS
    span.set_attributes(attrs)
    if capture and output_messages is not None:
        write_json(span, sc.GEN_AI_OUTPUT_MESSAGES, output_messages, cut=content_cut)
