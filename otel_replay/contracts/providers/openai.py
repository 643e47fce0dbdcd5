"""The ``openai`` client's two APIs as governance sees them: ``chat.completions`` and ``responses``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from otel_replay.contracts.engine import ToolCallView
from otel_replay.contracts.providers.base import ToolResultSeen, ToolsAdapter, decode_output, field

__all__ = [
    "APP_CALLS",
    "BUILT_IN_TOOLS",
    "ChatAdapter",
    "ResponsesAdapter",
    "chat_call",
    "chat_tool_name",
    "responses_call",
    "responses_tool_name",
]

APP_CALLS: Final[Mapping[str, str | None]] = {
    "function_call": None,
    "custom_tool_call": None,
    "local_shell_call": "local_shell",
    "shell_call": "shell",
    "computer_call": "computer",
    "apply_patch_call": "apply_patch",
}
"""The ``responses`` output items the APPLICATION carries out (so the gate must see them): item type -> the
tool name a contract governs a built-in one by (a function or custom tool call names its tool itself).
Items the provider carries out itself (web search, file search, code interpreter, MCP calls) are not here."""

BUILT_IN_TOOLS: Final[Mapping[str, str]] = {
    "local_shell": "local_shell",
    "shell": "shell",
    "computer": "computer",
    "computer_use_preview": "computer",
    "apply_patch": "apply_patch",
}
"""A request's built-in tool entry type -> the tool name its calls are gated (and narrowed) under."""


def chat_tool_name(entry: Any) -> str | None:
    """The name of a ``chat.completions`` tool entry or call (``function``, or ``custom``, ``{"name": ...}``)."""
    body = field(entry, "custom") if field(entry, "type") == "custom" else field(entry, "function")
    name = field(body, "name") if body is not None else None
    return name if isinstance(name, str) else None


def chat_call(call: Any) -> tuple[str, str]:
    """``(name, arguments text)`` of a ``message.tool_calls`` entry: a function call, or a custom tool's input."""
    custom = field(call, "type") == "custom"
    body = field(call, "custom") if custom else field(call, "function")
    name = field(body, "name") if body is not None else None
    arguments = field(body, "input" if custom else "arguments") if body is not None else None
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, default=str)
    return (name if isinstance(name, str) else ""), text


def responses_tool_name(entry: Any) -> str | None:
    """The tool name of a ``responses`` tool entry: a function's or custom tool's name, a built-in's governed name.

    Tools the provider runs itself (web search, file search, ...) have none and are never narrowed.
    """
    kind = field(entry, "type")
    if kind in BUILT_IN_TOOLS:
        return BUILT_IN_TOOLS[kind]
    if kind not in (None, "function", "custom"):
        return None
    name = field(entry, "name")
    return name if isinstance(name, str) else None


def _as_json(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else value


def responses_call(item: Any) -> tuple[str, str, str] | None:
    """``(call id, tool name, arguments text)`` of an output item the application carries out; else ``None``.

    A custom tool's free-text input is its arguments text (it passes only a contract's checks if it is a
    JSON object); a built-in call's action (or patch operation) is its arguments, as JSON.
    """
    kind = field(item, "type")
    if kind not in APP_CALLS:
        return None
    call_id = field(item, "call_id") or field(item, "id") or ""
    if kind == "function_call":
        name, arguments = field(item, "name"), field(item, "arguments")
    elif kind == "custom_tool_call":
        name, arguments = field(item, "name"), field(item, "input")
    else:
        name = APP_CALLS[kind]
        arguments = json.dumps(_as_json(field(item, "operation" if kind == "apply_patch_call" else "action")))
    text = arguments if isinstance(arguments, str) else json.dumps(_as_json(arguments), default=str)
    return str(call_id), (name if isinstance(name, str) else ""), text


class _OpenAITools(ToolsAdapter):
    """What both openai APIs narrow alike.

    An emptied tools list takes ``parallel_tool_calls`` with it, and a tool choice forces the tool it
    names the way a tool entry names it.
    """

    dropped_with_tools = ("tool_choice", "parallel_tool_calls")

    def forces_removed(self, choice: Any, kept: frozenset[str]) -> bool:
        """A ``tool_choice`` object naming a tool not in ``kept`` (``"auto"``, ``"required"``... name none)."""
        if not (isinstance(choice, Mapping) or hasattr(choice, "type")):
            return False
        forced = self.tool_name(choice)
        return forced is not None and forced not in kept


class ChatAdapter(_OpenAITools):
    """``chat.completions.create``."""

    provider = "openai"
    api = "chat.completions"

    def tool_name(self, entry: Any) -> str | None:
        """:func:`chat_tool_name`."""
        return chat_tool_name(entry)

    def results(self, kwargs: Mapping[str, Any]) -> list[ToolResultSeen]:
        """``role: tool`` messages, each named by the assistant tool call it answers (when in the messages)."""
        messages = kwargs.get("messages")
        if not isinstance(messages, list | tuple):
            return []
        names: dict[str, str] = {}
        seen: list[ToolResultSeen] = []
        for message in messages:
            role = field(message, "role")
            if role == "assistant":
                for call in field(message, "tool_calls") or ():
                    call_id, name = field(call, "id"), chat_tool_name(call)
                    if isinstance(call_id, str) and name is not None:
                        names[call_id] = name
            elif role == "tool":
                call_id = field(message, "tool_call_id")
                if isinstance(call_id, str):
                    seen.append(ToolResultSeen(call_id, names.get(call_id), decode_output(field(message, "content"))))
        return seen

    def calls(self, response: Any) -> list[ToolCallView]:
        """The ``message.tool_calls`` of every choice, in order (choice, then call), numbered across choices.

        With ``n`` > 1 the choices' calls are checked in that order as one response: stricter than judging
        each alternative alone, never looser (no choice's call reaches the caller unchecked).
        A choice's deprecated ``message.function_call`` (the ``functions`` API, which the client still parses
        and an application on it runs) comes after its tool calls, gated by its name like them.
        """
        views: list[ToolCallView] = []
        index = 0
        for choice in getattr(response, "choices", None) or ():
            for call in getattr(choice.message, "tool_calls", None) or ():
                name, text = chat_call(call)  # a custom tool's call is gated by its name like a function's
                views.append(ToolCallView.parse(index, call.id or "", name, text))
                index += 1
            legacy = getattr(choice.message, "function_call", None)
            if legacy is not None:
                name, text = chat_call({"function": legacy})  # read as a tool call's function is read
                views.append(ToolCallView.parse(index, "", name, text))
                index += 1
        return views

    def usage(self, response: Any) -> tuple[int, int] | None:
        """``usage.prompt_tokens`` and ``usage.completion_tokens``."""
        usage = getattr(response, "usage", None)
        if usage is None:
            return None
        return int(usage.prompt_tokens or 0), int(usage.completion_tokens or 0)

    def strip(self, response: Any, keep: frozenset[int]) -> None:
        """Drop the refused calls from every choice; a choice left with none finishes ``stop``."""
        index = 0
        for choice in getattr(response, "choices", None) or ():
            calls = list(choice.message.tool_calls or ())
            legacy = getattr(choice.message, "function_call", None)
            if not calls and legacy is None:
                continue
            kept = [call for offset, call in enumerate(calls) if index + offset in keep]
            index += len(calls)
            if calls:
                choice.message.tool_calls = kept or None
            legacy_kept = legacy is not None and index in keep
            if legacy is not None:
                if not legacy_kept:
                    choice.message.function_call = None
                index += 1
            if not kept and not legacy_kept and choice.finish_reason in ("tool_calls", "function_call"):
                choice.finish_reason = "stop"


class ResponsesAdapter(_OpenAITools):
    """``responses.create``."""

    provider = "openai"
    api = "responses"

    def tool_name(self, entry: Any) -> str | None:
        """:func:`responses_tool_name`."""
        return responses_tool_name(entry)

    def results(self, kwargs: Mapping[str, Any]) -> list[ToolResultSeen]:
        """``function_call_output`` input items, named by the ``function_call`` items beside them (when there)."""
        items = kwargs.get("input")
        if not isinstance(items, list | tuple):
            return []
        names: dict[str, str] = {}
        seen: list[ToolResultSeen] = []
        for item in items:
            kind = field(item, "type")
            if kind in APP_CALLS:
                call_id, name, _ = responses_call(item) or ("", "", "")
                if call_id and name:
                    names[call_id] = name
            elif isinstance(kind, str) and kind.endswith("_call_output"):
                call_id = field(item, "call_id")
                if isinstance(call_id, str):
                    seen.append(ToolResultSeen(call_id, names.get(call_id), decode_output(field(item, "output"))))
        return seen

    def calls(self, response: Any) -> list[ToolCallView]:
        """The output items the application carries out (function, custom and built-in tool calls), in order."""
        views: list[ToolCallView] = []
        for index, item in enumerate(getattr(response, "output", None) or ()):
            call = responses_call(item)
            if call is not None:
                views.append(ToolCallView.parse(index, *call))
        return views

    def usage(self, response: Any) -> tuple[int, int] | None:
        """``usage.input_tokens`` and ``usage.output_tokens``."""
        usage = getattr(response, "usage", None)
        if usage is None:
            return None
        return int(usage.input_tokens or 0), int(usage.output_tokens or 0)

    def strip(self, response: Any, keep: frozenset[int]) -> None:
        """Drop the refused tool call items from ``output`` (indexes are positions in ``output``)."""
        output = list(getattr(response, "output", None) or ())
        response.output = [
            item for index, item in enumerate(output) if getattr(item, "type", None) not in APP_CALLS or index in keep
        ]
