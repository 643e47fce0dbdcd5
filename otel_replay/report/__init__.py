"""Post-mortem pages: a chain, a decision, a rerun, a contracts backtest as one HTML file, and ``otel-replay ui``.

:mod:`~otel_replay.report.model` builds what a page shows from the library
calls the CLI uses (:mod:`~otel_replay.report.contracts` for a contracts
backtest); :mod:`~otel_replay.report.html` lays it out (escaped, with
a strict Content-Security-Policy, no network); :mod:`~otel_replay.report.server`
serves the same pages over loopback, read-only.

Importing the package registers its pages for the notebook display of a
chain, a verdict and a rerun result (:mod:`otel_replay._display`).
"""

from __future__ import annotations

from otel_replay import _display
from otel_replay.gate.policy import Verdict
from otel_replay.query.chains import ReplayChain
from otel_replay.report import html, model
from otel_replay.rerun.runner import RerunResult

__all__: list[str] = []

_display.register(ReplayChain, lambda chain: html.embed(html.chain_page(model.chain_view(chain))))
_display.register(Verdict, lambda verdict: html.embed(html.verdict_page(model.verdict_view(verdict)), height=320))
_display.register(RerunResult, lambda result: html.embed(html.rerun_page(model.rerun_view(result))))
