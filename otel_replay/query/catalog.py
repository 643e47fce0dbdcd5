"""The shared views and macros, each defined on a connection only when a query names it (or one that needs it).

``queries/views.sql`` and its companions define some forty views and macros
over ``span_source``. DuckDB binds each as it is created (about 0.15 s for
the lot), and a point lookup, a chain, or an analyst's ``SELECT 1`` uses a
few of them or none. A :class:`ViewCatalog` splits those files into their
``CREATE OR REPLACE`` statements and knows which names each one uses; given a
query's text it answers the statements, in file order, that define what the
query names and everything those need, less what the connection already
has. A word of the query that is a view's name counts as naming it (a word
in a comment or a string too: defining one view too many costs a few
milliseconds, never a wrong answer). SQL that reads the catalog itself
(``SHOW``, ``DESCRIBE``, ``information_schema``, DuckDB's ``duckdb_*``
functions) gets every view, so it lists what it always listed.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

__all__ = ["ViewCatalog"]

_DEFINITION = re.compile(r"^CREATE OR REPLACE (?:VIEW|MACRO) ([a-z_][a-z0-9_]*)", re.MULTILINE | re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_COMMENT = re.compile(r"--[^\n]*")
# SQL that lists or describes the catalog: it sees every view, as when all were defined at open.
_READS_CATALOG = re.compile(
    r"\b(?:show|describe|information_schema|duckdb_[a-z_]+|pg_catalog|pg_class|sqlite_master|sqlite_schema)\b",
    re.IGNORECASE,
)


class ViewCatalog:
    """The ``CREATE OR REPLACE`` statements of some shipped SQL files, by the name each defines.

    Args:
        texts: the files' text, in the order they are run (a view's dependencies first).

    """

    def __init__(self, texts: Sequence[str]) -> None:
        """Split ``texts`` into their statements and note which names each statement uses."""
        self.order: list[str] = []
        self.statements: dict[str, str] = {}
        for text in texts:
            starts = list(_DEFINITION.finditer(text))
            for at, match in enumerate(starts):
                end = starts[at + 1].start() if at + 1 < len(starts) else len(text)
                name = match.group(1).lower()
                if name not in self.statements:
                    self.order.append(name)
                self.statements[name] = text[match.start() : end]
        known = set(self.statements)
        self.uses: dict[str, frozenset[str]] = {
            name: frozenset(_names(_COMMENT.sub("", sql), known) - {name}) for name, sql in self.statements.items()
        }

    def needed(self, sql: str, defined: Collection[str]) -> list[str]:
        """The names to define, in file order, for ``sql`` on a connection that has ``defined`` already."""
        if _READS_CATALOG.search(sql):
            wanted = set(self.order)
        else:
            wanted = set()
            todo = list(_names(sql, self.statements.keys()))
            while todo:
                name = todo.pop()
                if name not in wanted:
                    wanted.add(name)
                    todo.extend(self.uses[name])
        return [name for name in self.order if name in wanted and name not in defined]


def _names(sql: str, known: Collection[str]) -> set[str]:
    """The words of ``sql`` that are names in ``known`` (lower case)."""
    return {word for word in {w.lower() for w in _WORD.findall(sql)} if word in known}
