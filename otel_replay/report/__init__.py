"""Post-mortem pages: a chain, a decision, a rerun as one self-contained HTML file, and the ``otel-replay ui`` server.

:mod:`~otel_replay.report.model` builds what a page shows from the library
calls the CLI uses; :mod:`~otel_replay.report.html` lays it out (escaped, with
a strict Content-Security-Policy, no network); :mod:`~otel_replay.report.server`
serves the same pages over loopback, read-only.
"""

__all__: list[str] = []
