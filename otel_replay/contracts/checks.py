"""The value checks of a contract: argument invariants and ``with_output`` conditions, one failure each.

Pure functions over parsed JSON values; the engine calls them and turns what
they return into failures. Equality is JSON equality: ``true`` is not ``1``,
``1`` is ``1.0``, ``NaN`` equals nothing.
"""

from __future__ import annotations

import functools
import math
import operator
import re
import re._compiler as _regex_compiler  # the stdlib's own parse of a pattern: sre_parse warns it is deprecated
import re._constants as _regex_constants
import re._parser as _regex_parser
from collections.abc import Callable, Mapping
from typing import Any, Final

from otel_replay.contracts._regex_overlap import overlapping_repetitions
from otel_replay.contracts.model import ArgumentInvariant
from otel_replay.contracts.paths import read_path

__all__ = ["REGEX_MAX_CHARS", "InvariantCheck", "SlowRegexError", "compile_regex", "json_equal", "kind_of"]

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


class SlowRegexError(re.error):
    """A pattern that compiles but whose matching can take exponential, or high polynomial, time in the text."""


def compile_regex(pattern: str) -> re.Pattern[str]:
    r"""``pattern`` compiled; :class:`re.error` for a bad one, or one that can take exponential time (see below).

    The pattern means what it means in ECMA-262, the dialect of the JSON Schema and of the seed's contracts,
    where Python differs in a way a model could use: ``$`` (outside multi-line mode) matches only at the end
    of the text, never before a final newline; ``\d``, ``\w`` and ``\b`` are ASCII classes (``\d`` is
    ``[0-9]``: full-width or Arabic-Indic digits, which ``int()`` reads, do not pass it). ``\s`` is ASCII
    whitespace too, narrower than ECMA-262's (which also takes the Unicode spaces).

    Python's regular expressions backtrack, and a repetition nested in another, as in ``^(a+)+$`` or
    ``^(\w+\s?)*$``, can try every way of splitting a text between them: 30 characters the pattern almost
    matches take longer than a session lives, and the model writes the text. Such a pattern is refused
    unless each inner repetition repeats one character that cannot be a literal character the outer one
    must match each time (``^([a-z0-9]+\.)*$`` splits only at the dots, so it is accepted). A repetition of
    alternatives two of which can start with the same character (``^(a|aa)*$``) is refused for the same
    reason; ``^(foo|bar)*$`` is accepted. Atomic groups
    ``(?>...)`` and possessive repetitions (``a++``) never backtrack and are never refused for nesting.

    Without nesting, repetitions in sequence that can each take the same text (``^.*-.*-.*$``,
    ``^\w*\d*\w*x$``) make a failing match try every way of splitting the text between them: n**3 steps for
    three. A pattern that can try more ways than two unbounded repetitions on :data:`REGEX_MAX_CHARS`
    characters is refused too; an unanchored pattern is searched from every start, which counts as one of
    them, and a counted repetition ``{m,n}`` counts its ``n - m + 1`` choices (see
    :mod:`otel_replay.contracts._regex_overlap` for which way it errs where it cannot tell). Two (``^.*-.*$``,
    ``.*x``) are accepted: 0.2-0.7 CPU seconds on their worst :data:`REGEX_MAX_CHARS` characters (lazy ones the
    slowest; ``benchmarks/bench_contracts_regex.py``), 1.6-3.1 s when they sit in alternatives or counted groups
    (Python's matcher has no fast path for those).
    """
    re.compile(pattern, re.ASCII)  # the checks and messages of the standard compiler, for a bad pattern
    slow = _slowness(pattern)
    if slow:
        raise SlowRegexError(slow)
    parsed = _regex_parser.parse(pattern, re.ASCII)
    _end_of_text(parsed.data, parsed.state.flags)
    compiled: re.Pattern[str] = _regex_compiler.compile(parsed, parsed.state.flags)
    return compiled


@functools.lru_cache(maxsize=1024)
def _slowness(pattern: str) -> str | None:
    """Why matching ``pattern`` (a valid one) can take exponential or high polynomial time, or ``None``.

    Cached: the loader and every engine built on the same contracts ask again (the walk costs ~0.2 ms).
    """
    parsed = _regex_parser.parse(pattern, re.ASCII)
    hazard = _nested_repeat(parsed.data, parsed.state.flags)
    if hazard:
        return (
            f"{hazard}: matching can take exponential time; make the inner repetition possessive (a++) or "
            "atomic ((?>...)), or put a character it cannot match between repetitions"
        )
    return overlapping_repetitions(parsed, REGEX_MAX_CHARS)


def _end_of_text(items: list[tuple[Any, Any]], flags: int) -> None:
    r"""Make each ``$`` outside multi-line mode match only at the end of the text (in place), as in ECMA-262.

    Python's ``$`` also matches before a final newline, so ``^C[0-9]+$`` would pass ``"C123\n"``.
    """
    for index, (op, av) in enumerate(items):
        if op is _regex_constants.AT and av is _regex_constants.AT_END and not flags & re.MULTILINE:
            items[index] = (op, _regex_constants.AT_END_STRING)
        elif op in _REPEATS or op is _regex_constants.POSSESSIVE_REPEAT:
            _end_of_text(av[2].data, flags)
        elif op is _regex_constants.SUBPATTERN:
            _end_of_text(av[3].data, (flags | av[1]) & ~av[2])
        elif op is _regex_constants.ATOMIC_GROUP:
            _end_of_text(av.data, flags)
        elif op is _regex_constants.BRANCH:
            for branch in av[1]:
                _end_of_text(branch.data, flags)
        elif op in (_regex_constants.ASSERT, _regex_constants.ASSERT_NOT):
            _end_of_text(av[1].data, flags)
        elif op is _regex_constants.GROUPREF_EXISTS:
            for branch in av[1:]:
                if branch is not None:
                    _end_of_text(branch.data, flags)


_REPEATS: Final = (_regex_constants.MAX_REPEAT, _regex_constants.MIN_REPEAT)
_ONE_CHAR: Final = (
    _regex_constants.LITERAL,
    _regex_constants.NOT_LITERAL,
    _regex_constants.IN,
    _regex_constants.ANY,
)


def _variable(low: int, high: int) -> bool:
    return high > low and high > 1


def _nested_repeat(items: list[tuple[Any, Any]], flags: int) -> str | None:
    """A repetition nested in a repetition among ``items`` (a parsed pattern), described, or ``None``."""
    for op, av in items:
        if op in _REPEATS:
            low, high, body = av
            if _variable(low, high) and _inner_repeats(body.data) and not _delimited(body.data, flags):
                return "a repetition inside a repetition"
            if _variable(low, high) and _ambiguous_branch(body.data, flags):
                return "a repetition of alternatives that can start alike"
            found = _nested_repeat(body.data, flags)
            if found:
                return found
        elif op is _regex_constants.SUBPATTERN:
            found = _nested_repeat(av[-1].data, flags)
            if found:
                return found
        elif op is _regex_constants.BRANCH:
            for branch in av[1]:
                found = _nested_repeat(branch.data, flags)
                if found:
                    return found
        elif op in (_regex_constants.ASSERT, _regex_constants.ASSERT_NOT):
            found = _nested_repeat(av[1].data, flags)
            if found:
                return found
        elif op is _regex_constants.GROUPREF_EXISTS:
            for branch in av[1:]:
                if branch is not None:
                    found = _nested_repeat(branch.data, flags)
                    if found:
                        return found
        # ATOMIC_GROUP and POSSESSIVE_REPEAT never backtrack into themselves: nothing inside them is a hazard.
    return None


def _ambiguous_branch(items: list[tuple[Any, Any]], flags: int) -> bool:
    """Whether ``items`` (a repeated body) hold alternatives two of which may start with the same character.

    ``^(a|aa)*$`` or ``^(ab|a|b)*$`` can split ``"aaaa...!"`` between alternatives in exponentially many
    ways, just as nested repetitions can. An alternative that starts with anything but one character
    (empty, a group of alternatives, a repetition) is taken to start like every other.
    """
    for op, av in items:
        if op is _regex_constants.BRANCH:
            firsts = [_first_char(branch.data) for branch in av[1]]
            for index, first in enumerate(firsts):
                if any(_may_meet(first, other, flags) for other in firsts[index + 1 :]):
                    return True
            if any(_ambiguous_branch(branch.data, flags) for branch in av[1]):
                return True
        elif op in _REPEATS:
            if _ambiguous_branch(av[2].data, flags):
                return True
        elif op is _regex_constants.SUBPATTERN:
            if _ambiguous_branch(av[-1].data, (flags | av[1]) & ~av[2]):
                return True
        elif op is _regex_constants.GROUPREF_EXISTS:
            if any(branch is not None and _ambiguous_branch(branch.data, flags) for branch in av[1:]):
                return True
    return False


def _first_char(items: list[tuple[Any, Any]]) -> tuple[Any, Any] | None:
    """The one-character item ``items`` must start with, or ``None`` when it may start otherwise."""
    while items and items[0][0] is _regex_constants.SUBPATTERN:
        items = items[0][1][-1].data
    if items and items[0][0] in _ONE_CHAR:
        return items[0]
    return None


def _may_meet(left: tuple[Any, Any] | None, right: tuple[Any, Any] | None, flags: int) -> bool:
    """Whether one character can match both one-character items (``None``: any character)."""
    if left is None or right is None:
        return True
    state = _regex_parser.State()
    state.flags = flags
    one, two = (_regex_compiler.compile(_regex_parser.SubPattern(state, [item]), flags) for item in (left, right))
    probes = {chr(code) for code in range(0x100)} | {"\u0100", "\uffff"} | _chars_named(left) | _chars_named(right)
    return any(one.fullmatch(char) and two.fullmatch(char) for char in probes)


def _chars_named(item: tuple[Any, Any]) -> set[str]:
    """The characters a one-character item names (a literal, a set's members and range ends), each case."""
    op, av = item
    codes: list[int] = []
    if op in (_regex_constants.LITERAL, _regex_constants.NOT_LITERAL):
        codes.append(av)
    elif op is _regex_constants.IN:
        for kind, value in av:
            if kind is _regex_constants.LITERAL:
                codes.append(value)
            elif kind is _regex_constants.RANGE:
                codes.extend(value)
    return {variant for code in codes for variant in (chr(code), chr(code).lower(), chr(code).upper())}


def _inner_repeats(items: list[tuple[Any, Any]]) -> list[list[tuple[Any, Any]]]:
    """The bodies of the variable repetitions among ``items``, at any depth (not inside atomic parts)."""
    found: list[list[tuple[Any, Any]]] = []
    for op, av in items:
        if op in _REPEATS:
            if _variable(av[0], av[1]):
                found.append(av[2].data)
            found.extend(_inner_repeats(av[2].data))
        elif op is _regex_constants.SUBPATTERN:
            found.extend(_inner_repeats(av[-1].data))
        elif op is _regex_constants.BRANCH:
            for branch in av[1]:
                found.extend(_inner_repeats(branch.data))
        elif op in (_regex_constants.ASSERT, _regex_constants.ASSERT_NOT):
            found.extend(_inner_repeats(av[1].data))
        elif op is _regex_constants.GROUPREF_EXISTS:
            for branch in av[1:]:
                if branch is not None:
                    found.extend(_inner_repeats(branch.data))
    return found


def _delimited(items: list[tuple[Any, Any]], flags: int) -> bool:
    """Whether every variable repetition in ``items`` repeats one character that a literal ``items`` needs is not.

    The literal must be at the top of the repeated body (matched on every repetition), so the outer
    repetition can only be split where that character is.
    """
    while len(items) == 1 and items[0][0] is _regex_constants.SUBPATTERN:  # a group around the whole body
        items = items[0][1][-1].data
    # Each literal in every case (a scoped (?i) may apply to it), tested with the pattern's flags (DOTALL...).
    literals = {
        variant
        for op, av in items
        if op is _regex_constants.LITERAL
        for variant in (chr(av), chr(av).lower(), chr(av).upper())
    }
    if not literals:
        return False
    for body in _inner_repeats(items):
        if len(body) != 1 or body[0][0] not in _ONE_CHAR:
            return False
        state = _regex_parser.State()
        state.flags = flags
        one = _regex_compiler.compile(_regex_parser.SubPattern(state, [body[0]]), flags)
        if any(one.fullmatch(char) for char in literals):
            return False
    return True


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

    __slots__ = ("bounds", "invariant", "path", "pattern", "regex")

    def __init__(self, invariant: ArgumentInvariant) -> None:
        """Prepare ``invariant``; a bad regex raises :class:`re.error`, a bad path :class:`ValueError`."""
        self.invariant = invariant
        self.path = invariant.path
        read_path({}, invariant.path)  # parses (and caches) the path now: a bad one fails here, not per call
        self.regex = compile_regex(invariant.regex) if invariant.regex is not None else None
        self.pattern = invariant.regex
        self.bounds = tuple(
            (name, bound, holds, words)
            for name, holds, words in _BOUNDS
            if (bound := getattr(invariant, name)) is not None
        )

    def problems(self, arguments: Mapping[str, Any]) -> list[str]:
        r"""Every way the argument at the invariant's path breaks it, one line each (empty: it holds).

        A missing argument is one problem unless the invariant is ``optional``. Bounds (``gte``, ``gt``,
        ``lte``, ``lt``) need a finite number: text, booleans, NaN and infinities fail them (so does a whole
        number beyond the float range); whole numbers are compared exactly, never rounded to a float.
        ``equals`` and ``one_of`` use :func:`json_equal`. ``regex`` needs text of at most
        :data:`REGEX_MAX_CHARS` characters and is searched (anchor it with ``^``/``$`` to match whole; see
        :func:`compile_regex` for what ``$``, ``\d`` and ``\w`` mean). ``max_length`` counts the characters
        of text or the items of an array or object. Messages name numbers, never text values (which can be
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
                problems.append(f"{path} must be text to match /{self.pattern}/, got {kind_of(value)}")
            elif len(value) > REGEX_MAX_CHARS:
                problems.append(f"{path} is {len(value)} characters, over {REGEX_MAX_CHARS} to match /{self.pattern}/")
            elif regex.search(value) is None:
                problems.append(f"{path} does not match /{self.pattern}/")
        if invariant.max_length is not None:
            if isinstance(value, str | list | tuple | Mapping):
                if len(value) > invariant.max_length:
                    problems.append(f"{path} is {len(value)} long, over max_length {invariant.max_length}")
            else:
                problems.append(f"{path} must be text or an array for max_length, got {kind_of(value)}")
        return problems
