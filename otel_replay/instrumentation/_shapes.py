"""Each provider's request content in the GenAI conventions' shapes (system instructions, messages, tools).

One function per API reads the call's keyword arguments and returns
``(system instructions, input messages, tool definitions)`` built with the
part helpers of :mod:`._messages`: OpenAI chat messages (system messages stay
in the chat history, as the API sends them), OpenAI Responses ``input`` items
(``instructions`` are the system instructions), Anthropic messages (``system``
is the system instructions). A content part of a kind the conventions do not
name is kept as a generic ``{"type": ...}`` part with its own members.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from otel_replay.instrumentation._genai import Input
from otel_replay.instrumentation._messages import (
    message,
    plain,
    reasoning_part,
    text_part,
    tool_call_part,
    tool_response_part,
)

__all__ = ["anthropic_input", "chat_input", "responses_input"]

_TEXT_KINDS: Final = frozenset({"text", "input_text", "output_text"})


def _generic(part: Any) -> dict[str, Any]:
    """A part the conventions name no shape for: its own members, its ``type`` kept (``unknown`` if none)."""
    if isinstance(part, Mapping):
        kind = part.get("type")
        return {**part, "type": kind if isinstance(kind, str) and kind else "unknown"}
    return {"type": "unknown", "content": part}


def _content_parts(content: Any) -> list[dict[str, Any]]:
    """A message's ``content``: a text, or a list of typed parts (text kept as text parts, the rest generic)."""
    content = plain(content)
    if content is None:
        return []
    if isinstance(content, str):
        return [text_part(content)]
    if not isinstance(content, list | tuple):
        return [_generic(content)]
    parts: list[dict[str, Any]] = []
    for part in content:
        part = plain(part)
        if isinstance(part, str):
            parts.append(text_part(part))
        elif isinstance(part, Mapping) and part.get("type") in _TEXT_KINDS and isinstance(part.get("text"), str):
            parts.append(text_part(part["text"]))
        elif isinstance(part, Mapping) and part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
            parts.append(text_part(part["refusal"]))
        else:
            parts.append(_generic(part))
    return parts


def _function_tools(tools: Any) -> list[dict[str, Any]] | None:
    """OpenAI tools (chat's ``{type, function: {...}}`` and Responses' flat ``{type, name, ...}``) as definitions."""
    tools = plain(tools)
    if not isinstance(tools, list | tuple):
        return None
    out: list[dict[str, Any]] = []
    for tool in tools:
        tool = plain(tool)
        if not isinstance(tool, Mapping):
            continue
        kind = tool.get("type") if isinstance(tool.get("type"), str) else "function"
        function = tool.get("function")
        spec: Mapping[str, Any] = function if isinstance(function, Mapping) else tool
        name = spec.get("name")
        definition: dict[str, Any] = {"type": kind, "name": name if isinstance(name, str) else kind}
        for key in ("description", "parameters", "strict"):
            if spec.get(key) is not None:
                definition[key] = spec[key]
        out.append(definition)
    return out or None


# --- OpenAI chat.completions ------------------------------------------------------------------------


def _chat_message(raw: Any) -> dict[str, Any]:
    item = plain(raw)
    if not isinstance(item, Mapping):
        return message("user", [_generic(item)])
    role = item.get("role")
    if role in ("tool", "function"):
        call_id = item.get("tool_call_id") if role == "tool" else item.get("name")
        return message("tool", [tool_response_part(call_id, plain(item.get("content")))])
    parts = _content_parts(item.get("content"))
    if isinstance(item.get("refusal"), str):
        parts.append(text_part(item["refusal"]))
    for call in plain(item.get("tool_calls")) or ():
        call = plain(call)
        if not isinstance(call, Mapping):
            continue
        given = call.get("function")
        function: Mapping[str, Any] = given if isinstance(given, Mapping) else call
        parts.append(tool_call_part(call.get("id"), function.get("name"), function.get("arguments")))
    extra = {"name": item["name"]} if isinstance(item.get("name"), str) else {}
    return message(role, parts, **extra)


def chat_input(kwargs: Mapping[str, Any]) -> Input:
    """``chat.completions.create``'s content: no separate system instructions, the messages, the tools."""
    messages = plain(kwargs.get("messages"))
    shaped = [_chat_message(m) for m in messages] if isinstance(messages, list | tuple) else None
    return None, shaped, _function_tools(kwargs.get("tools"))


# --- OpenAI responses ------------------------------------------------------------------------------


def _responses_item(raw: Any) -> dict[str, Any]:
    item = plain(raw)
    if isinstance(item, str):
        return message("user", [text_part(item)])
    if not isinstance(item, Mapping):
        return message("user", [_generic(item)])
    kind = item.get("type")
    if kind == "function_call":
        return message("assistant", [tool_call_part(item.get("call_id"), item.get("name"), item.get("arguments"))])
    if kind == "function_call_output":
        return message("tool", [tool_response_part(item.get("call_id"), item.get("output"))])
    if kind == "reasoning":
        summary = item.get("summary") or ()
        texts = [s["text"] for s in summary if isinstance(s, Mapping) and isinstance(s.get("text"), str)]
        return message("assistant", [reasoning_part(t) for t in texts] or [_generic(item)])
    if "role" in item and (kind in (None, "message")):
        role = item.get("role")
        return message("system" if role == "developer" else role, _content_parts(item.get("content")))
    return message("user", [_generic(item)])


def responses_input(kwargs: Mapping[str, Any]) -> Input:
    """``responses.create``'s content: ``instructions``, the ``input`` items, the tools."""
    instructions = kwargs.get("instructions")
    system = [text_part(instructions)] if isinstance(instructions, str) and instructions else None
    given = plain(kwargs.get("input"))
    if isinstance(given, str):
        shaped: list[dict[str, Any]] | None = [message("user", [text_part(given)])]
    elif isinstance(given, list | tuple):
        shaped = [_responses_item(item) for item in given]
    else:
        shaped = None
    return system, shaped, _function_tools(kwargs.get("tools"))


# --- Anthropic messages ----------------------------------------------------------------------------


def _anthropic_parts(content: Any) -> list[dict[str, Any]]:
    content = plain(content)
    if isinstance(content, str):
        return [text_part(content)]
    if not isinstance(content, list | tuple):
        return [] if content is None else [_generic(content)]
    parts: list[dict[str, Any]] = []
    for block in content:
        block = plain(block)
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(text_part(block["text"]))
        elif kind == "tool_use":
            parts.append(tool_call_part(block.get("id"), block.get("name"), block.get("input")))
        elif kind == "tool_result":
            parts.append(tool_response_part(block.get("tool_use_id"), block.get("content")))
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            parts.append(reasoning_part(block["thinking"]))
        else:
            parts.append(_generic(block))
    return parts


def anthropic_input(kwargs: Mapping[str, Any]) -> Input:
    """``messages.create``'s content: ``system``, the messages, the tools."""
    system = _anthropic_parts(kwargs.get("system")) or None
    messages = plain(kwargs.get("messages"))
    shaped: list[dict[str, Any]] | None = None
    if isinstance(messages, list | tuple):
        shaped = []
        for raw in messages:
            item = plain(raw)
            if isinstance(item, Mapping):
                shaped.append(message(item.get("role"), _anthropic_parts(item.get("content"))))
            else:
                shaped.append(message("user", [_generic(item)]))
    tools: list[dict[str, Any]] | None = None
    given = plain(kwargs.get("tools"))
    if isinstance(given, list | tuple):
        tools = []
        for tool in given:
            tool = plain(tool)
            if not isinstance(tool, Mapping):
                continue
            kind = tool.get("type") if isinstance(tool.get("type"), str) else "function"
            if kind == "custom":
                kind = "function"
            name = tool.get("name")
            definition: dict[str, Any] = {"type": kind, "name": name if isinstance(name, str) else kind}
            if isinstance(tool.get("description"), str):
                definition["description"] = tool["description"]
            if tool.get("input_schema") is not None:
                definition["parameters"] = tool["input_schema"]
            tools.append(definition)
    return system, shaped, tools or None
