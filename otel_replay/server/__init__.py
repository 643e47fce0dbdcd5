"""``otel-replay serve`` and ``otel-replay ingest``: OTLP in, the same Parquet dataset out."""

from __future__ import annotations

from .server import Metrics, Overloaded, Receiver, ServerConfig

__all__ = ["Metrics", "Overloaded", "Receiver", "ServerConfig"]
