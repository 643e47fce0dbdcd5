"""The adapter interface every provider module fills in, the provider detection, and shared helpers."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from otel_replay.contracts.engine import ToolCallView
from otel_replay.errors import ContractError

__all__ = [
    "Adapter",
    "ToolResultSeen",
    "ToolsAdapter",
    "decode_output",
    "detect",
    "field",
    "named_tools",
    "narrowed_tools",
]

_CLIENTS: Mapping[tuple[str, str], tuple[str, bool]] = {
    ("openai", "OpenAI"): ("openai", False),
    ("openai", "AsyncOpenAI"): ("openai", True),
    ("anthropic", "Anthropic"): ("anthropic", False),
    ("anthropic", "AsyncAnthropic"): ("anthropic", True),
}


def detect(client: Any) -> tuple[str, bool]:
    """``(provider, is_async)`` of a client, by its class (a subclass such as ``AzureOpenAI`` counts).

    Raises :class:`ContractError` naming the class when it is neither an ``openai`` nor an ``anthropic`` client.
    """
    for cls in type(client).__mro__:
        found = _CLIENTS.get((cls.__module__.split(".")[0], cls.__name__))
        if found is not None:
            return found
    kind = f"{type(client).__module__}.{type(client).__qualname__}"
    raise ContractError(f"govern(): {kind} is not an OpenAI or Anthropic client (sync or async)")


@dataclass(frozen=True)
class ToolResultSeen:
    """A tool result a request carries back to the model: the call it answers, the tool (when known), the output."""

    call_id: str
    name: str | None
    output: Any


def decode_output(content: Any) -> Any:
    """A tool result's content as a value: JSON text parsed, text parts joined first; anything else as it is."""
    if isinstance(content, list):
        texts: list[str] = [
            text for part in content if isinstance(part, Mapping) and isinstance(text := part.get("text"), str)
        ]
        if len(texts) == len(content):
            content = "".join(texts)
    if isinstance(content, str):
        try:
            return json.loads(content)
        except (ValueError, RecursionError):
            return content
    return content


def named_tools(tools: Any, name_of: Any) -> list[str] | None:
    """The names of the tools a request offers (``None`` when it offers no list); entries without a name skipped."""
    if not isinstance(tools, list | tuple):
        return None
    names = []
    for entry in tools:
        name = name_of(entry)
        if isinstance(name, str):
            names.append(name)
    return names


def narrowed_tools(tools: Sequence[Any], kept: frozenset[str], name_of: Any) -> list[Any]:
    """``tools`` with the named entries not in ``kept`` left out (unnamed entries, e.g. built-in tools, kept)."""
    out = []
    for entry in tools:
        name = name_of(entry)
        if not isinstance(name, str) or name in kept:
            out.append(entry)
    return out


def field(entry: Any, key: str) -> Any:
    """``entry[key]`` of a mapping or ``entry.key`` of an object (request items may be either)."""
    if isinstance(entry, Mapping):
        return entry.get(key)
    return getattr(entry, key, None)


class Adapter(Protocol):
    """What governance reads and rewrites in one API's requests and responses."""

    provider: str
    api: str

    def offered(self, kwargs: Mapping[str, Any]) -> list[str] | None:
        """The tool names the request offers (``None``: no tools list)."""
        ...

    def narrow(self, kwargs: dict[str, Any], kept: frozenset[str]) -> dict[str, Any]:
        """The request with its tools list cut to ``kept`` (and a tool choice naming a removed tool dropped)."""
        ...

    def results(self, kwargs: Mapping[str, Any]) -> list[ToolResultSeen]:
        """The tool results the request carries (OpenAI ``role: tool`` messages, Anthropic ``tool_result`` blocks)."""
        ...

    def model(self, kwargs: Mapping[str, Any]) -> str | None:
        """The requested model."""
        ...

    def calls(self, response: Any) -> list[ToolCallView]:
        """The tool calls a complete response asks for, in order."""
        ...

    def usage(self, response: Any) -> tuple[int, int] | None:
        """``(input tokens, output tokens)`` of a complete response, when it says."""
        ...

    def strip(self, response: Any, keep: frozenset[int]) -> None:
        """Remove from ``response`` (in place) every tool call whose index is not in ``keep``.

        With none left, the finish reason says the model stopped (not that it wants tools).
        """
        ...


class ToolsAdapter:
    """The request steps every API takes alike: its offered tools, their narrowing and the model.

    A provider's adapter names a tool entry (:meth:`tool_name`), tells a tool choice that forces a
    removed tool (:meth:`forces_removed`), and lists what goes with an emptied tools list.
    """

    dropped_with_tools: tuple[str, ...] = ("tool_choice",)
    """Request fields left out with the tools list when no tool remains (the APIs refuse them without tools)."""

    def tool_name(self, entry: Any) -> str | None:
        """The name a tool entry of the request's ``tools`` is governed by (``None``: never narrowed)."""
        raise NotImplementedError

    def forces_removed(self, choice: Any, kept: frozenset[str]) -> bool:
        """Whether ``tool_choice`` forces a tool that is not in ``kept``."""
        raise NotImplementedError

    def offered(self, kwargs: Mapping[str, Any]) -> list[str] | None:
        """The names in ``tools`` (entries without one, e.g. a provider's built-in tools, are not listed)."""
        return named_tools(kwargs.get("tools"), self.tool_name)

    def narrow(self, kwargs: dict[str, Any], kept: frozenset[str]) -> dict[str, Any]:
        """``tools`` cut to ``kept``; left out when none remain (with ``tool_choice``)."""
        tools = kwargs.get("tools")
        if not isinstance(tools, list | tuple):
            return kwargs
        out = dict(kwargs)
        remaining = narrowed_tools(tools, kept, self.tool_name)
        if remaining:
            out["tools"] = remaining
        else:  # the API refuses an empty tools list, and a tool choice without tools
            out.pop("tools", None)
            for key in self.dropped_with_tools:
                out.pop(key, None)
        if self.forces_removed(out.get("tool_choice"), kept):
            out.pop("tool_choice", None)
        return out

    def model(self, kwargs: Mapping[str, Any]) -> str | None:
        """``model``."""
        model = kwargs.get("model")
        return model if isinstance(model, str) else None
