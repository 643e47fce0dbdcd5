"""Install and remove patches exactly: every patched attribute gets its original object back.

A :class:`PatchSet` remembers, per owner (a module or a class), the object
that was there before, and :meth:`PatchSet.remove` puts that very object back
(identity, not a copy), in reverse order, even when a later step fails.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import wrapt

__all__ = ["PatchSet"]

Wrapper = Callable[[Any, Any, tuple[Any, ...], dict[str, Any]], Any]


class PatchSet:
    """A set of attribute replacements that can be undone exactly."""

    def __init__(self) -> None:
        """Start with nothing patched."""
        self._undo: list[tuple[Any, str, Any, bool]] = []
        """(owner, attribute, original, whether the owner had it itself); an owner of None: ``original`` is a
        function to call (:meth:`call_on_remove`)."""

    def wrap(self, owner: Any, attribute: str, wrapper: Wrapper) -> None:
        """Replace ``owner.attribute`` with a wrapt ``FunctionWrapper`` calling ``wrapper``."""
        is_class = isinstance(owner, type)
        own = not is_class or attribute in owner.__dict__
        original = owner.__dict__[attribute] if is_class and own else getattr(owner, attribute)
        if is_class and own and isinstance(original, (staticmethod, classmethod)):
            raise TypeError(f"{owner.__qualname__}.{attribute}: static and class methods are not patched here")
        function = wrapt.FunctionWrapper(original, wrapper)
        setattr(owner, attribute, function)
        # An inherited method is shadowed on the subclass, and the shadow deleted on removal.
        self._undo.append((owner, attribute, original, own))

    def replace(self, owner: Any, attribute: str, value: Any, *, original: Any = None) -> None:
        """Set ``owner.attribute = value``, remembering what was there."""
        before = original if original is not None else getattr(owner, attribute)
        setattr(owner, attribute, value)
        self._undo.append((owner, attribute, before, True))

    def call_on_remove(self, undo: Callable[[], None]) -> None:
        """Call ``undo`` on removal, in its place among the patches (for what is not an attribute: a profile hook)."""
        self._undo.append((None, "", undo, True))

    def remove(self) -> None:
        """Put every original back, newest patch first; raises the first failure after trying all."""
        failure: BaseException | None = None
        while self._undo:
            owner, attribute, original, own = self._undo.pop()
            try:
                if owner is None:
                    original()
                elif own:
                    setattr(owner, attribute, original)
                else:
                    delattr(owner, attribute)
            except BaseException as exc:  # pragma: no cover - setattr on a module or class does not fail
                failure = failure or exc
        if failure is not None:
            raise failure

    def __len__(self) -> int:
        return len(self._undo)
