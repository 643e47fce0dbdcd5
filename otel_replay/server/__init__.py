"""The OTLP receiver and the ingester behind ``otel-replay serve`` and ``ingest`` (:mod:`otel_replay.cli.serve`).

OTLP in, the same Parquet dataset out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from otel_replay import _lazy

if TYPE_CHECKING:  # what the names below resolve to on first use, for type checkers
    from .admission import Overloaded
    from .config import Metrics, ServerConfig
    from .server import Receiver

__all__ = ["Metrics", "Overloaded", "Receiver", "ServerConfig"]

_LAZY = {
    "Metrics": ".config",
    "Overloaded": ".admission",
    "Receiver": ".server",
    "ServerConfig": ".config",
}
"""Public names imported on first use: name -> module."""

__getattr__, __dir__ = _lazy.exports(__name__, _LAZY, submodules=True)
