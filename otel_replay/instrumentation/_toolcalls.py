"""The model's tool calls, remembered so the tool execution that answers one can name it.

When a model response asks for ``get_weather({"city": "Oslo"})`` with call id
``call_1``, the instrumentor remembers it; when the decorated ``get_weather``
then runs with ``city="Oslo"``, its ``execute_tool`` span takes
``gen_ai.tool.call.id = call_1`` and a link to the model span that asked.
Each remembered call answers one execution; the memory is bounded (oldest
forgotten first), so an agent that never runs its tools leaks nothing.

An agent framework (LangGraph's ToolNode, pydantic-ai) validates the model's
arguments before it calls the function: it passes the parameters the model
left out at their defaults, and converted values (``2`` for ``"2"``). When no
call matches exactly, a call matches whose every argument is the model's
value, or a plain conversion of it, and whose other arguments are the
function's defaults.
"""

from __future__ import annotations

import enum
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final

from opentelemetry.trace import SpanContext

__all__ = ["canonical_arguments", "remember", "take"]

_LIMIT: Final = 4096
_calls: OrderedDict[tuple[str, str, str], tuple[str, SpanContext]] = OrderedDict()
_lock = threading.Lock()


def canonical_arguments(arguments: Any) -> str | None:
    """Arguments (a JSON text from the model, or a mapping from the call) as one canonical text."""
    try:
        value = json.loads(arguments) if isinstance(arguments, str | bytes) else arguments
        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)
    except (TypeError, ValueError, RecursionError):
        return None


def remember(name: str, arguments: Any, call_id: str, model_span: SpanContext) -> None:
    """Note that the model span asked for ``name(arguments)`` under ``call_id``."""
    canonical = canonical_arguments(arguments)
    if canonical is None or not name or not call_id:
        return
    with _lock:
        _calls[(name, canonical, call_id)] = (call_id, model_span)
        while len(_calls) > _LIMIT:
            _calls.popitem(last=False)


def take(name: str, arguments: Any, defaults: Mapping[str, Any] | None = None) -> tuple[str, SpanContext] | None:
    """The oldest remembered call of ``name`` with these arguments (consumed), if any.

    Failing an exact match, the oldest whose arguments these are once validated by a framework: each of the
    model's values, or a conversion of it, and the rest at the function's ``defaults``.
    """
    if not _calls:
        return None
    canonical = canonical_arguments(arguments)
    if canonical is None:
        return None
    with _lock:
        for key in _calls:
            if key[0] == name and key[1] == canonical:
                return _calls.pop(key)
        if isinstance(arguments, Mapping):
            for key in _calls:
                if key[0] == name and _validated_from(arguments, key[1], defaults or {}):
                    return _calls.pop(key)
    return None


def _validated_from(called: Mapping[str, Any], asked_text: str, defaults: Mapping[str, Any]) -> bool:
    """Whether ``called`` is what validating the model's arguments (canonical JSON) gives a function."""
    try:
        asked = json.loads(asked_text)
    except (ValueError, RecursionError):
        return False
    if not isinstance(asked, dict) or not asked.keys() <= called.keys():
        return False
    for key, value in called.items():
        if key in asked:
            if not _same(value, asked[key]):
                return False
        elif key not in defaults or not _is_default(value, defaults[key]):
            return False
    return True


def _is_default(value: Any, default: Any) -> bool:
    try:
        return value is default or (type(value) is type(default) and bool(value == default))
    except (TypeError, ValueError, RecursionError):
        return False


def _same(value: Any, asked: Any) -> bool:
    """A called value is the model's (a JSON value), or what validation converts it to."""
    try:
        if isinstance(value, bool) or isinstance(asked, bool):
            return value is asked
        if isinstance(value, enum.Enum):
            return _same(value.value, asked)
        if isinstance(value, int | float) and isinstance(asked, str):
            return float(asked) == value  # "2" -> 2, "2.50" -> 2.5
        if isinstance(value, Mapping) and isinstance(asked, dict):
            return value.keys() == asked.keys() and all(_same(value[k], asked[k]) for k in asked)
        if isinstance(value, list | tuple) and isinstance(asked, list):
            return len(value) == len(asked) and all(_same(v, a) for v, a in zip(value, asked, strict=True))
        return bool(value == asked)
    except (TypeError, ValueError, RecursionError):
        return False
