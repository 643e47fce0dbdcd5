"""The read side: an open dataset (:class:`~otel_replay.query.store.Store`) and what reads it.

``store`` (the facade), ``files`` (which files are live and readable),
``engine`` (DuckDB views, the shipped queries, narrowing, plans), ``stored``
(trusted record reads), ``verify``, ``chains`` with ``chain_types``,
``analyst`` (the read-only sandbox for analyst SQL) and ``trust``.
"""
