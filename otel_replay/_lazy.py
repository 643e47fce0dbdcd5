"""A package's public names imported on first use (PEP 562), so importing the package stays cheap.

A package root that re-exports its modules' names makes every ``import`` of
one of its modules pay for all of them: DuckDB, the contracts engine, the
instrumentors. :func:`exports` gives such a root a ``__getattr__`` that
imports a name's module the first time the name is used, and a ``__dir__``
that lists the names not imported yet. The root keeps its ``__all__`` and
imports the same names under ``TYPE_CHECKING`` for type checkers.

A public name that is also the name of a submodule (the function
``storage.compact`` in ``storage/compact.py``, ``otel_replay.rerun`` the
function beside the package ``otel_replay/rerun/``) stays the public object
when that submodule is imported later: importing a submodule binds it on its
package under its own name, and a root that imported everything up front had
bound the public object over it.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["exports"]


def exports(
    package: str, names: Mapping[str, str], *, submodules: bool = False
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose public ``names`` map to ``"module"`` or ``"module:attr"``.

    A module may be relative to ``package`` (``".gate"``); ``attr`` defaults to
    the name itself. A name resolved once is kept in the package's namespace,
    so its next use does not come here. With ``submodules``, any other public
    name is imported as a submodule of ``package``, as if the package had
    imported them all (``otel_replay.gate`` after a bare ``import otel_replay``,
    ``otel_replay.query.store`` after a bare ``import otel_replay.query``).
    """
    targets = {name: (where.partition(":")[0], where.partition(":")[2] or name) for name, where in names.items()}

    def __getattr__(name: str) -> Any:
        """Import the public name ``name`` of this package the first time it is used."""
        target = targets.get(name)
        if target is None:
            if submodules and name.isidentifier() and not name.startswith("_"):
                try:
                    return importlib.import_module(f"{package}.{name}")
                except ModuleNotFoundError as error:
                    if error.name != f"{package}.{name}":
                        raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(target[0], package), target[1])
        vars(sys.modules[package])[name] = value
        return value

    def __dir__() -> list[str]:
        """The package's names, with the public names not imported yet."""
        return sorted({*vars(sys.modules[package]), *targets})

    sys.modules[package].__class__ = _keeping(frozenset(targets))
    return __getattr__, __dir__


def _keeping(names: frozenset[str]) -> type[types.ModuleType]:
    """A module class on which importing a submodule called ``name`` does not bind it over the public ``name``."""

    class Package(types.ModuleType):
        def __setattr__(self, name: str, value: object) -> None:
            if name in names and isinstance(value, types.ModuleType):
                return
            super().__setattr__(name, value)

    return Package
