"""``otel-replay serve`` and ``otel-replay ingest``: OTLP in, the same Parquet dataset out."""

from __future__ import annotations

from .admission import Overloaded
from .config import Metrics, ServerConfig
from .server import Receiver

__all__ = ["Metrics", "Overloaded", "Receiver", "ServerConfig"]
