"""The model's tool calls, remembered so the tool execution that answers one can name it.

When a model response asks for ``get_weather({"city": "Oslo"})`` with call id
``call_1``, the instrumentor remembers it; when the decorated ``get_weather``
then runs with ``city="Oslo"``, its ``execute_tool`` span takes
``gen_ai.tool.call.id = call_1`` and a link to the model span that asked.
Each remembered call answers one execution; the memory is bounded (oldest
forgotten first, and arguments longer than ``SCAN_CHARS`` are not remembered, as
a stream keeps no more of them), so an agent that never runs its tools leaks nothing.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any, Final

from opentelemetry.trace import SpanContext

from otel_replay.redaction import SCAN_CHARS

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
    """Note that the model span asked for ``name(arguments)`` under ``call_id``.

    Arguments longer than ``SCAN_CHARS`` are not noted (nor rendered): the call cannot be linked, as a streamed
    call's cannot, and a tool never run does not hold megabytes here.
    """
    if not name or not call_id or (isinstance(arguments, str | bytes) and len(arguments) > SCAN_CHARS):
        return
    canonical = canonical_arguments(arguments)
    if canonical is None or len(canonical) > SCAN_CHARS:
        return
    with _lock:
        _calls[(name, canonical, call_id)] = (call_id, model_span)
        while len(_calls) > _LIMIT:
            _calls.popitem(last=False)


def take(name: str, arguments: Any) -> tuple[str, SpanContext] | None:
    """The oldest remembered call of ``name`` with these arguments (consumed), if any."""
    if not _calls:
        return None
    canonical = canonical_arguments(arguments)
    if canonical is None:
        return None
    with _lock:
        for key in _calls:
            if key[0] == name and key[1] == canonical:
                return _calls.pop(key)
    return None
