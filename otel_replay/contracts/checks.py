"""The value checks of a contract: argument invariants and ``with_output`` conditions, one failure each.

Pure functions over parsed JSON values; the engine calls them and turns what
they return into failures. Equality is JSON equality: ``true`` is not ``1``,
``1`` is ``1.0``, ``NaN`` equals nothing.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

from otel_replay.contracts.model import ArgumentInvariant
from otel_replay.contracts.paths import read_path

__all__ = ["REGEX_MAX_CHARS", "InvariantCheck", "compile_regex", "json_equal", "kind_of"]

_SHOWN_NUMBER_CHARS = 40

REGEX_MAX_CHARS = 8192
"""Longer text fails a ``regex`` invariant unmatched: an unanchored pattern can take time quadratic in the
text, and a model's argument must not stall the gate (a 16,000-character argument can already cost seconds)."""


def kind_of(value: Any) -> str:
    """The JSON name of ``value``'s type, for messages (never the value itself)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__


def json_equal(left: Any, right: Any) -> bool:
    """JSON equality, deep for objects and arrays.

    Booleans equal only booleans, numbers compare by value (NaN equals nothing), text only text.
    """
    kind = type(left)
    if kind is type(right) and (kind is str or kind is int):  # the common case, and True is not an int here
        return bool(left == right)
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left is right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return bool(left == right)
    if isinstance(left, str) or isinstance(right, str):
        return isinstance(left, str) and isinstance(right, str) and left == right
    if left is None or right is None:
        return left is None and right is None
    if isinstance(left, Mapping) and isinstance(right, Mapping):
        if len(left) != len(right):
            return False
        return all(key in right and json_equal(value, right[key]) for key, value in left.items())
    if isinstance(left, list | tuple) and isinstance(right, list | tuple):
        return len(left) == len(right) and all(json_equal(a, b) for a, b in zip(left, right, strict=True))
    return False


def compile_regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` compiled (raises :class:`re.error` for a bad one; the loader reports those first)."""
    return re.compile(pattern)


def _number(value: Any) -> float | None:
    """``value`` as a number to compare, or ``None`` (booleans, text and NaN are not numbers here).

    A whole number stays the exact integer (Python compares it with a float bound exactly: 2**53 + 1 is above
    2**53, which its float is not); one beyond the float range is the infinity it exceeds.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond float range: compare as the infinity it exceeds
        return math.inf if value > 0 else -math.inf
    if isinstance(value, int):
        return value
    return number if not math.isnan(number) else None


def _shown(value: float) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_NUMBER_CHARS else text[:_SHOWN_NUMBER_CHARS] + "..."


_BOUNDS: tuple[tuple[str, Callable[[float, float], bool], str], ...] = (
    ("gte", operator.ge, "below the minimum"),
    ("gt", operator.gt, "not above"),
    ("lte", operator.le, "above the maximum"),
    ("lt", operator.lt, "not below"),
)


class InvariantCheck:
    """One argument invariant, prepared once (its bounds listed, its regex compiled) and checked per call."""

    __slots__ = ("bounds", "invariant", "path", "regex")

    def __init__(self, invariant: ArgumentInvariant) -> None:
        """Prepare ``invariant``; a bad regex raises :class:`re.error`, a bad path :class:`ValueError`."""
        self.invariant = invariant
        self.path = invariant.path
        read_path({}, invariant.path)  # parses (and caches) the path now: a bad one fails here, not per call
        self.regex = compile_regex(invariant.regex) if invariant.regex is not None else None
        self.bounds = tuple(
            (name, bound, holds, words)
            for name, holds, words in _BOUNDS
            if (bound := getattr(invariant, name)) is not None
        )

    def problems(self, arguments: Mapping[str, Any]) -> list[str]:
        """Every way the argument at the invariant's path breaks it, one line each (empty: it holds).

        A missing argument is one problem unless the invariant is ``optional``. Bounds (``gte``, ``gt``,
        ``lte``, ``lt``) need a finite number: text, booleans, NaN and infinities fail them (so does a whole
        number beyond the float range); whole numbers are compared exactly, never rounded to a float. ``equals`` and
        ``one_of`` use :func:`json_equal`. ``regex`` needs text of at most :data:`REGEX_MAX_CHARS` characters
        and is searched (anchor it with ``^``/``$`` to match whole). ``max_length`` counts the characters of
        text or the items of an array or object. Messages name numbers, never text values (which can be
        personal data).
        """
        invariant = self.invariant
        path = self.path
        found, value = read_path(arguments, path)
        if not found:
            return [] if invariant.optional else [f"{path} is missing"]
        problems: list[str] = []
        if self.bounds:
            number = _number(value)
            if number is None or math.isinf(number):
                problems.append(f"{path} must be a finite number, got {kind_of(value)}")
            else:
                for name, bound, holds, words in self.bounds:
                    if not holds(number, bound):
                        problems.append(f"{path} = {_shown(value)} is {words} ({name} {_shown(bound)})")
        if invariant.has_equals and not json_equal(value, invariant.equals):
            problems.append(f"{path} does not equal the required value")
        if invariant.one_of is not None and not any(json_equal(value, option) for option in invariant.one_of):
            problems.append(f"{path} is not one of the {len(invariant.one_of)} allowed values")
        regex = self.regex
        if regex is not None:
            if not isinstance(value, str):
                problems.append(f"{path} must be text to match /{regex.pattern}/, got {kind_of(value)}")
            elif len(value) > REGEX_MAX_CHARS:
                problems.append(f"{path} is {len(value)} characters, over {REGEX_MAX_CHARS} to match /{regex.pattern}/")
            elif regex.search(value) is None:
                problems.append(f"{path} does not match /{regex.pattern}/")
        if invariant.max_length is not None:
            if isinstance(value, str | list | tuple | Mapping):
                if len(value) > invariant.max_length:
                    problems.append(f"{path} is {len(value)} long, over max_length {invariant.max_length}")
            else:
                problems.append(f"{path} must be text or an array for max_length, got {kind_of(value)}")
        return problems
