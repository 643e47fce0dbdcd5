"""The model's tool calls, remembered so the tool execution that answers one can name it.

When a model response asks for ``get_weather({"city": "Oslo"})`` with call id
``call_1``, the instrumentor remembers it; when the decorated ``get_weather``
then runs with ``city="Oslo"``, its ``execute_tool`` span takes
``gen_ai.tool.call.id = call_1`` and a link to the model span that asked.
Each remembered call answers one execution; the memory is bounded (oldest
forgotten first, and arguments longer than ``SCAN_CHARS`` are not remembered, as
a stream keeps no more of them), so an agent that never runs its tools leaks nothing.

An agent framework that runs the tool itself (the OpenAI Agents SDK, say)
calls it with what the function's signature takes, not with the model's text:
it leaves out members the function has no parameter for, passes each omitted
parameter's default, and adds objects of its own (a run context). When no
remembered call has exactly the arguments of the execution, one matches
whose every member naming a parameter has the value passed for it, provided
each other argument passed is that parameter's default or a value that no
model's JSON could give (not a JSON value: a context object).

A framework that validates the model's arguments first (LangGraph's
ToolNode, pydantic-ai) also passes converted values (``2`` for ``"2"``, an
enum member for its value): those match the model's value they came from.
"""

from __future__ import annotations

import enum
import inspect
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final

from opentelemetry.trace import SpanContext

from otel_replay.redaction import SCAN_CHARS

__all__ = ["canonical_arguments", "remember", "take"]

_LIMIT: Final = 4096
_calls: OrderedDict[tuple[str, str, str], tuple[str, SpanContext]] = OrderedDict()
_lock = threading.Lock()
_SPREAD: Final = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _jsonable(value: Any) -> Any:
    """A value the JSON encoder cannot take: a pydantic model as the JSON it stands for, anything else as its repr.

    (A framework validates the model's arguments into the pydantic model a tool's parameter names.)
    """
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        try:
            return dump(mode="json")
        except Exception:  # a model_dump of another signature, or one that fails: its repr, as before
            return repr(value)
    return repr(value)


def _canonical(value: Any) -> str | None:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=_jsonable)
    except (TypeError, ValueError, RecursionError):
        return None


def canonical_arguments(arguments: Any) -> str | None:
    """Arguments (a JSON text from the model, or a mapping from the call) as one canonical text."""
    try:
        value = json.loads(arguments) if isinstance(arguments, str | bytes) else arguments
    except (TypeError, ValueError, RecursionError):
        return None
    return _canonical(value)


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


def _from_json(value: Any) -> bool:
    """Whether a model's JSON could have given ``value``, validated or not (framework-made objects cannot).

    Judged by type, not by encoding it: a JSON value of any depth, an enum member, a pydantic model.
    """
    return isinstance(value, _JSON_TYPES) or hasattr(value, "model_dump")


_JSON_TYPES: Final = (str, int, float, bool, type(None), list, tuple, dict, enum.Enum)


class _Passed:
    """What a tool execution was passed, by parameter, ready to be compared with each remembered call."""

    __slots__ = ("defaults", "given", "parameters")

    def __init__(self, arguments: Mapping[str, Any], signature: inspect.Signature) -> None:
        self.parameters = {
            name: parameter for name, parameter in signature.parameters.items() if parameter.kind not in _SPREAD
        }
        self.given = {key: (value, _canonical(value), _from_json(value)) for key, value in arguments.items()}
        self.defaults = {
            name: (parameter.default, _canonical(parameter.default))
            for name, parameter in self.parameters.items()
            if parameter.default is not inspect.Parameter.empty
        }

    def answer(self, asked: Any) -> bool:
        """Whether a framework calling the tool with these arguments runs the model's call ``asked`` (parsed)."""
        if not isinstance(asked, dict):
            return False
        for key, value in asked.items():
            if key not in self.parameters:
                continue  # a member the function takes no parameter for: the framework leaves it out
            given = self.given.get(key)
            if given is None or not (given[1] is not None and given[1] == _canonical(value) or _same(given[0], value)):
                return False
        for key, (raw, text, from_json) in self.given.items():
            if key in asked and key in self.parameters:
                continue
            if key in self.defaults and (text == self.defaults[key][1] or _is_default(raw, self.defaults[key][0])):
                continue  # the parameter's default, passed for a member the model left out
            if from_json:
                return False  # a value the model did not ask for
        return True


def take(name: str, arguments: Any, signature: inspect.Signature | None = None) -> tuple[str, SpanContext] | None:
    """The oldest remembered call of ``name`` with these arguments (consumed), if any.

    With the tool's ``signature``, a call these arguments answer as a framework passes them (see the module's
    docstring) is taken when none has exactly these arguments.
    """
    if not _calls:
        return None
    canonical = canonical_arguments(arguments)
    with _lock:
        if canonical is not None:
            for key in _calls:
                if key[0] == name and key[1] == canonical:
                    return _calls.pop(key)
        if signature is None or not isinstance(arguments, Mapping):
            return None
        candidates = [key for key in _calls if key[0] == name]
    if not candidates:
        return None
    passed = _Passed(arguments, signature)  # compared outside the lock: arguments may be large
    for key in candidates:
        if passed.answer(json.loads(key[1])):
            with _lock:
                found = _calls.pop(key, None)  # None: another thread's execution took it meanwhile
            if found is not None:
                return found
    return None


def _is_default(value: Any, default: Any) -> bool:
    """Whether ``value`` is the parameter's ``default`` (the same object, or an equal value of its type)."""
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
