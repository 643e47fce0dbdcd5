r"""The ``$.a.b[0]`` paths contracts use to point into a tool call's arguments or a tool's output.

A path starts at ``$`` (the whole value) and goes down one step at a time:

- ``.name``: the member ``name`` of an object (letters, digits, ``_`` and ``-``);
- ``["odd key"]`` or ``['odd key']``: a member whose name has any other character
  (``\"``, ``\'`` and ``\\`` escape a quote or a backslash inside);
- ``[0]``: an item of a list, counted from 0.

Nothing else is a path (no wildcards, no ``..``, no filters, no negative index): a path
that does not parse raises :class:`ValueError`, so a typo in a contract is a load error and
never a check that is silently false. A member step never indexes a list and an index never
reads an object member: ``$.items.0`` on a list finds nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, TypeAlias

__all__ = ["Step", "parse_path", "read_path"]

Step: TypeAlias = str | int
"""One step of a parsed path: a member name (``str``) or a list index (``int``)."""

_MAX_PATH = 1000
_NAME = re.compile(r"[A-Za-z0-9_-]+")
_INDEX = re.compile(r"\[(0|[1-9][0-9]{0,17})\]")


@lru_cache(maxsize=4096)
def parse_path(path: str) -> tuple[Step, ...]:
    """The steps of ``path`` (``()`` for ``$``); :class:`ValueError` naming the column when it does not parse."""
    if not isinstance(path, str):
        raise ValueError(f"a path is a string starting with '$', not {type(path).__name__}")
    if len(path) > _MAX_PATH:
        raise ValueError(f"a path has at most {_MAX_PATH} characters, this one has {len(path)}")
    if not path.startswith("$"):
        raise ValueError(f"a path starts with '$' (like $.amount), not {path[:1]!r}")
    steps: list[Step] = []
    at = 1
    while at < len(path):
        char = path[at]
        if char == ".":
            name = _NAME.match(path, at + 1)
            if name is None:
                raise ValueError(_bad(path, at + 1, "a member name (letters, digits, _ or -) after '.'"))
            steps.append(name.group())
            at = name.end()
        elif char == "[" and path[at + 1 : at + 2] in ("'", '"'):
            key, at = _quoted(path, at + 1)
            steps.append(key)
        elif char == "[":
            index = _INDEX.match(path, at)
            if index is None:
                raise ValueError(_bad(path, at, 'an index like [0] or a quoted name like ["key"]'))
            steps.append(int(index.group(1)))
            at = index.end()
        else:
            raise ValueError(_bad(path, at, "'.' or '['"))
    return tuple(steps)


def _quoted(path: str, at: int) -> tuple[str, int]:
    """The quoted member name starting at the quote ``path[at]`` and the position after its closing ``]``."""
    quote = path[at]
    chars: list[str] = []
    at += 1
    while at < len(path):
        char = path[at]
        if char == "\\":
            escaped = path[at + 1 : at + 2]
            if escaped not in ("'", '"', "\\"):
                raise ValueError(_bad(path, at, "an escape of a quote or a backslash after '\\'"))
            chars.append(escaped)
            at += 2
        elif char == quote:
            if path[at + 1 : at + 2] != "]":
                raise ValueError(_bad(path, at + 1, "']' after the closing quote"))
            return "".join(chars), at + 2
        else:
            chars.append(char)
            at += 1
    raise ValueError(_bad(path, at, f"the closing {quote}"))


def _bad(path: str, at: int, wanted: str) -> str:
    """The one-line message of a path that does not parse at column ``at``."""
    found = repr(path[at]) if at < len(path) else "the end"
    return f"bad path {path!r}: expected {wanted} at column {at + 1}, found {found}"


def read_path(value: Any, path: str) -> tuple[bool, Any]:
    """``(True, the value at path)`` in ``value``, or ``(False, None)`` when nothing is there.

    ``value`` is JSON-like (mappings, lists, scalars). A ``path`` that does not parse raises
    :class:`ValueError`: a bad path is an error, never "not found".
    """
    current = value
    for step in parse_path(path):
        if isinstance(step, str):
            if not isinstance(current, Mapping) or step not in current:
                return False, None
            current = current[step]
        else:
            if (
                isinstance(current, (str, bytes, bytearray))
                or not isinstance(current, Sequence)
                or step >= len(current)
            ):
                return False, None
            current = current[step]
    return True, current
