"""TEMPORARY: a ``$.a.b[0]`` reader with the loader's signature, until ``otel_replay.contracts.paths`` is merged."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["read_path"]

_STEP = re.compile(r"\.([A-Za-z0-9_\-]+)|\[(\d+)\]|\[\"((?:[^\"\\]|\\.)*)\"\]")


def read_path(value: Any, path: str) -> tuple[bool, Any]:
    """``(found, value)`` at ``path`` in ``value``."""
    if not path.startswith("$"):
        raise ValueError(f"path {path!r} must start with $")
    at, current = 1, value
    while at < len(path):
        match = _STEP.match(path, at)
        if match is None:
            raise ValueError(f"path {path!r}: cannot read at character {at}")
        name, index, quoted = match.groups()
        key = name if name is not None else quoted
        if key is not None:
            if not isinstance(current, Mapping) or key not in current:
                return False, None
            current = current[key]
        else:
            if not isinstance(current, list | tuple) or int(index) >= len(current):
                return False, None
            current = current[int(index)]
        at = match.end()
    return True, current
