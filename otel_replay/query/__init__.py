"""The read side: an open dataset (:class:`~otel_replay.query.store.Store`) and what reads it.

``store`` (the facade), ``files`` (which files are live and readable),
``engine`` (DuckDB views, the shipped queries, narrowing, plans), ``stored``
(trusted record reads), ``verify``, ``chains`` with ``chain_types``,
``analyst`` (the read-only sandbox for analyst SQL) and ``trust``.
"""

from __future__ import annotations

from otel_replay import _lazy

__all__: list[str] = []

# Its modules are imported when used (``otel_replay.query.store`` after ``import otel_replay``, as before).
__getattr__, __dir__ = _lazy.exports(__name__, {}, submodules=True)
