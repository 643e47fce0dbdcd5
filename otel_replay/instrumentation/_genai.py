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
from otel_replay.redaction import scrub

__all__ = ["ToolCall", "request_attributes", "write_content", "write_response"]

ToolCall = tuple[str, str, Any]
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
)


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
            attrs[attr] = value
    stop = kwargs.get("stop", kwargs.get("stop_sequences"))
    if isinstance(stop, str):
        attrs[sc.GEN_AI_REQUEST_STOP_SEQUENCES] = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        attrs[sc.GEN_AI_REQUEST_STOP_SEQUENCES] = stop
    if kwargs.get("stream") is True:
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


def write_response(
    span: Span,
    *,
    response_id: str | None,
    model: str | None,
    finish_reasons: Sequence[str],
    input_tokens: int | None,
    output_tokens: int | None,
    tool_calls: Sequence[ToolCall],
    capture: bool,
    output_messages: Any = None,
) -> None:
    """Set the response attributes, one ``gen_ai.tool.call`` event per tool call, and the content if on."""
    attrs: dict[str, Any] = {}
    if response_id:
        attrs[sc.GEN_AI_RESPONSE_ID] = _short(response_id)
    if model:
        attrs[sc.GEN_AI_RESPONSE_MODEL] = _short(model)
    if finish_reasons:
        attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] = [_short(r) for r in finish_reasons[:MAX_TOOL_CALLS]]
    if isinstance(input_tokens, int):
        attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] = input_tokens
    if isinstance(output_tokens, int):
        attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = output_tokens
    if tool_calls:
        listed: list[dict[str, Any]] = []
        model_span = span.get_span_context()
        for call_id, name, arguments in tool_calls[:MAX_TOOL_CALLS]:
            call_id, name = _short(call_id or ""), _short(name or "")
            event: dict[str, Any] = {sc.GEN_AI_TOOL_CALL_ID: call_id, sc.GEN_AI_TOOL_NAME: name}
            entry: dict[str, Any] = {"id": call_id, "name": name}
            if capture:
                text = scrub(arguments)
                if text is not None:
                    event[sc.GEN_AI_TOOL_CALL_ARGUMENTS] = text
                    entry["arguments"] = text
            span.add_event(sc.GEN_AI_TOOL_CALL_EVENT, event)
            listed.append(entry)
            if call_id and name:
                _toolcalls.remember(name, arguments, call_id, model_span)
        attrs[sc.MODEL_TOOL_CALLS] = json.dumps(listed, separators=(",", ":"), default=str)
        if len(tool_calls) > MAX_TOOL_CALLS:
            attrs[sc.MODEL_TOOL_CALLS_DROPPED] = len(tool_calls) - MAX_TOOL_CALLS
    span.set_attributes(attrs)
    if capture and output_messages is not None:
        write_content(span, sc.GEN_AI_OUTPUT_MESSAGES, output_messages)
