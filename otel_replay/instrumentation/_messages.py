"""Captured content in the GenAI conventions' shapes, bounded before it is rendered.

The conventions give ``gen_ai.input.messages`` and ``gen_ai.output.messages``
as arrays of ``{role, parts}`` messages (an output message also has its
``finish_reason``), ``gen_ai.system_instructions`` as an array of parts, and
``gen_ai.tool.definitions`` as an array of ``{type, name, description,
parameters}``. A part is ``{"type": "text", "content"}``, ``{"type":
"tool_call", "id", "name", "arguments"}``, ``{"type": "tool_call_response",
"id", "response"}``, ``{"type": "reasoning", "content"}``, or any other
``{"type", ...}``. Provider modules build these values with the helpers here.

Whatever is captured is cut to what can reach the span *before* it is
rendered and redacted: a 20 MB completion costs the same as a 32 KiB one.
A cut text ends with ``…[N chars cut]``, so the attribute stays valid JSON;
the characters (and list items) cut are counted in ``replay.content.cut``.
Every member of a mapping is kept, and short texts (roles, types, ids,
finish reasons) are never cut, so a cut value keeps its shape.
:class:`Kept` does the same for text arriving in stream deltas: it keeps at
most what can reach the span, whatever the stream's length.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from opentelemetry.trace import Span

from otel_replay import semconv as sc
from otel_replay.redaction import MAX_CONTENT_CHARS, SCAN_CHARS, scrub

__all__ = [
    "LINK_CHARS",
    "Budget",
    "Kept",
    "arguments_value",
    "bound",
    "message",
    "plain",
    "reasoning_part",
    "text_part",
    "tool_call_part",
    "tool_response_part",
    "write_json",
]

LINK_CHARS: Final = SCAN_CHARS
"""Tool-call argument characters kept per stream (all its calls together), with content capture on or off.

They are kept so the tool's own execution span can name the call that asked for it (the link matches
on the arguments); a call whose arguments run past this cannot be linked, and is still listed."""
_ITEM_COST: Final = 8
"""What one list item or mapping member counts against the budget besides its text (its punctuation)."""
_SHORT: Final = 64
"""Texts this short are never cut (a role, a type, a finish reason, an id): they count against the budget."""
_BUDGETS: Final = (MAX_CONTENT_CHARS * 3 // 4, MAX_CONTENT_CHARS // 4, MAX_CONTENT_CHARS // 16)
"""Text budgets tried in turn until the rendered, redacted value fits in ``MAX_CONTENT_CHARS``."""


def text_part(content: str) -> dict[str, Any]:
    """A text part."""
    return {"type": "text", "content": content}


def reasoning_part(content: str) -> dict[str, Any]:
    """A reasoning part (a model's thinking or reasoning summary)."""
    return {"type": "reasoning", "content": content}


def arguments_value(arguments: Any) -> Any:
    """Tool-call arguments as the conventions want them: an object when the text is JSON, else as given."""
    if isinstance(arguments, str | bytes) and len(arguments) <= SCAN_CHARS:
        try:
            return json.loads(arguments)
        except (ValueError, RecursionError):
            return arguments
    return arguments


def tool_call_part(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    """A tool-call request part (``arguments`` parsed when they are JSON text)."""
    part: dict[str, Any] = {"type": "tool_call", "id": call_id if isinstance(call_id, str) else None}
    part["name"] = name if isinstance(name, str) else ""
    if arguments is not None:
        part["arguments"] = arguments_value(arguments)
    return part


def tool_response_part(call_id: Any, response: Any) -> dict[str, Any]:
    """A tool-call response part (what a tool returned, sent back to the model)."""
    return {"type": "tool_call_response", "id": call_id if isinstance(call_id, str) else None, "response": response}


def message(role: Any, parts: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A ``{role, parts}`` message, with extra members (``finish_reason``, ``name``) when given."""
    value: dict[str, Any] = {"role": role if isinstance(role, str) else "user", "parts": parts}
    value.update(extra)
    return value


def plain(value: Any) -> Any:
    """A request value as plain JSON-like data: a pydantic model (the clients' params types) dumped."""
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        try:
            return dump(mode="json", exclude_none=True)
        except Exception:  # a model that will not dump is rendered by repr() later
            return value
    return value


class _Cutter:
    """Cuts a value's texts (and lists) to a character budget, counting what it cut."""

    __slots__ = ("cut", "left")

    def __init__(self, budget: int) -> None:
        self.left = budget
        self.cut = 0

    def text(self, text: str) -> str:
        if len(text) <= self.left or len(text) <= _SHORT:
            self.left -= len(text)
            return text
        keep = max(self.left, 0)
        self.left = 0
        self.cut += len(text) - keep
        return f"{text[:keep]}…[{len(text) - keep} chars cut]"

    def value(self, value: Any, depth: int = 0) -> Any:
        value = plain(value)
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, bytes | bytearray):
            return f"<{len(value)} bytes>"
        if depth > 32:
            self.cut += 1
            return "…[nested too deep]"
        if isinstance(value, Mapping):  # members are kept (values maybe cut), the first 64 always: shapes stay whole
            out: dict[Any, Any] = {}
            for key, item in value.items():
                if self.left <= 0 and len(out) >= _SHORT:
                    self.cut += len(value) - len(out)
                    break
                self.left -= _ITEM_COST + (len(key) if isinstance(key, str) else 0)
                out[key] = self.value(item, depth + 1)
            return out
        if isinstance(value, list | tuple):
            kept: list[Any] = []
            for item in value:
                if self.left <= 0:
                    self.cut += len(value) - len(kept)
                    break
                self.left -= _ITEM_COST
                kept.append(self.value(item, depth + 1))
            return kept
        return value


def bound(value: Any, budget: int) -> tuple[Any, int]:
    """``value`` with its texts cut so they total at most ``budget`` characters, and how much was cut."""
    cutter = _Cutter(budget)
    return cutter.value(value), cutter.cut


def write_json(span: Span, attribute: str, value: Any, *, cut: int = 0) -> None:
    """Set ``value`` on ``span`` as redacted JSON no longer than ``MAX_CONTENT_CHARS``, cut before it renders.

    ``cut``: characters already cut while the value was gathered (a stream's content), added to the count.
    When redaction fails, the drop is counted instead (``replay.content.dropped``).
    """
    text: str | None = None
    cut_now = 0
    for budget in _BUDGETS:
        bounded, cut_now = bound(value, budget)
        text = scrub(bounded)
        if text is None or len(text) <= MAX_CONTENT_CHARS:
            break
    if text is None:
        span.set_attribute(sc.TOOL_CONTENT_DROPPED, 1)
        return
    span.set_attribute(attribute, text)
    if cut or cut_now:
        so_far = (getattr(span, "attributes", None) or {}).get(sc.CONTENT_CUT, 0)  # one count for the span
        span.set_attribute(sc.CONTENT_CUT, (so_far if isinstance(so_far, int) else 0) + cut + cut_now)


class Budget:
    """Characters a stream may still keep, shared by every text gathered from it."""

    __slots__ = ("left",)

    def __init__(self, limit: int) -> None:
        self.left = limit


class Kept:
    """Text gathered from stream deltas within a shared :class:`Budget`; what does not fit is only counted."""

    __slots__ = ("budget", "cut", "pieces")

    def __init__(self, budget: Budget) -> None:
        self.pieces: list[str] = []
        self.budget = budget
        self.cut = 0

    def add(self, piece: str) -> None:
        """Keep ``piece``, or as much of it as the budget allows."""
        budget = self.budget
        if budget.left >= len(piece):
            self.pieces.append(piece)
            budget.left -= len(piece)
        elif budget.left > 0:
            self.pieces.append(piece[: budget.left])
            self.cut += len(piece) - budget.left
            budget.left = 0
        else:
            self.cut += len(piece)

    def text(self) -> str:
        """What was kept, joined (with ``…[N chars cut]`` when the budget ran out)."""
        joined = "".join(self.pieces)
        return f"{joined}…[{self.cut} chars cut]" if self.cut else joined
