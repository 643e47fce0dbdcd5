"""The OTLP receiver and the ingester behind ``otel-replay serve`` and ``ingest`` (:mod:`otel_replay.cli.serve`).

OTLP in, the same Parquet dataset out.
"""

from __future__ import annotations

from .admission import Overloaded
from .config import Metrics, ServerConfig
from .server import Receiver

__all__ = ["Metrics", "Overloaded", "Receiver", "ServerConfig"]
