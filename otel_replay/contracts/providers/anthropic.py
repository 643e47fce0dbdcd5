"""The ``anthropic`` client's ``messages`` API as governance sees it (``create`` and ``stream``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from otel_replay.contracts.engine import ToolCallView
from otel_replay.contracts.providers.base import ToolResultSeen, ToolsAdapter, decode_output, field

__all__ = ["MessagesAdapter", "tool_name"]


def tool_name(entry: Any) -> str | None:
    """The name of a ``messages`` tool entry (``{"name": ..., "input_schema": ...}``)."""
    name = field(entry, "name")
    return name if isinstance(name, str) else None


class MessagesAdapter(ToolsAdapter):
    """``messages.create`` and ``messages.stream``."""

    provider = "anthropic"
    api = "messages"

    def tool_name(self, entry: Any) -> str | None:
        """A ``messages`` tool entry's ``name``."""
        return tool_name(entry)

    def forces_removed(self, choice: Any, kept: frozenset[str]) -> bool:
        """``{"type": "tool", "name": ...}`` naming a tool not in ``kept``."""
        return bool(field(choice, "type") == "tool" and field(choice, "name") not in kept)

    def results(self, kwargs: Mapping[str, Any]) -> list[ToolResultSeen]:
        """``tool_result`` blocks of user messages, named by the ``tool_use`` blocks they answer (when there)."""
        messages = kwargs.get("messages")
        if not isinstance(messages, list | tuple):
            return []
        names: dict[str, str] = {}
        seen: list[ToolResultSeen] = []
        for message in messages:
            content = field(message, "content")
            if not isinstance(content, list | tuple):
                continue
            for block in content:
                kind = field(block, "type")
                if kind == "tool_use":
                    call_id, name = field(block, "id"), field(block, "name")
                    if isinstance(call_id, str) and isinstance(name, str):
                        names[call_id] = name
                elif kind == "tool_result" and not field(block, "is_error"):
                    call_id = field(block, "tool_use_id")
                    if isinstance(call_id, str):
                        output = decode_output(field(block, "content"))
                        seen.append(ToolResultSeen(call_id, names.get(call_id), output))
        return seen

    def calls(self, response: Any) -> list[ToolCallView]:
        """The ``tool_use`` content blocks, in order (their ``input`` is already an object)."""
        views: list[ToolCallView] = []
        for index, block in enumerate(getattr(response, "content", None) or ()):
            if getattr(block, "type", None) != "tool_use":
                continue
            value = block.input
            text = json.dumps(value, separators=(",", ":"), default=str)
            views.append(
                ToolCallView(index, block.id or "", block.name or "", text, value if isinstance(value, dict) else None)
            )
        return views

    def usage(self, response: Any) -> tuple[int, int] | None:
        """``usage.input_tokens`` (with cache reads and writes) and ``usage.output_tokens``."""
        usage = getattr(response, "usage", None)
        if usage is None:
            return None
        total = int(getattr(usage, "input_tokens", 0) or 0)
        for extra in ("cache_read_input_tokens", "cache_creation_input_tokens"):
            total += int(getattr(usage, extra, 0) or 0)
        return total, int(getattr(usage, "output_tokens", 0) or 0)

    def strip(self, response: Any, keep: frozenset[int]) -> None:
        """Drop the refused ``tool_use`` blocks; with none left, ``stop_reason`` becomes ``end_turn``."""
        content = list(getattr(response, "content", None) or ())
        kept = [
            block for index, block in enumerate(content) if getattr(block, "type", None) != "tool_use" or index in keep
        ]
        response.content = kept
        if response.stop_reason == "tool_use" and not any(getattr(b, "type", None) == "tool_use" for b in kept):
            response.stop_reason = "end_turn"
