"""How a result shows itself in a notebook (``_repr_html_``), without the classes below the report importing it.

A chain, a verdict and a rerun result live below :mod:`otel_replay.report`,
which draws them; so their ``_repr_html_`` asks here, and the report package
registers its pages when it is imported. ``import otel_replay`` does not import
it (start-up cost): it hands :func:`register_later` what imports it, run at the
first display. A type with no page registered shows its ``repr``, escaped.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["html_of", "register", "register_later"]

_pages: dict[type, Callable[[Any], str]] = {}
_later: list[Callable[[], None]] = []
_later_lock = threading.Lock()


def register(kind: type, page: Callable[[Any], str]) -> None:
    """Show values of ``kind`` (and its subclasses) in a notebook as ``page(value)``."""
    _pages[kind] = page


def register_later(load: Callable[[], None]) -> None:
    """Call ``load`` (which calls :func:`register`) before the first page is looked up, not now."""
    with _later_lock:
        _later.append(load)


def html_of(value: Any) -> str:
    """The HTML a notebook shows for ``value``: its registered page, else its ``repr`` escaped."""
    if _later:
        with _later_lock:
            while _later:
                _later.pop(0)()
    for kind in type(value).__mro__:
        page = _pages.get(kind)
        if page is not None:
            return page(value)
    return f"<pre>{html.escape(repr(value))}</pre>"
