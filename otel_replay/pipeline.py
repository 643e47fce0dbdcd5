"""``configure()``: one call from nothing to spans landing in a Parquet dataset."""

from __future__ import annotations

import logging
import os
from types import TracebackType

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from otel_replay import semconv as sc
from otel_replay import settings
from otel_replay.capture.context import CorrelationSpanProcessor
from otel_replay.capture.recorder import Recorder, set_recorder
from otel_replay.exporters import ParquetSpanExporter
from otel_replay.integrity import load_signing_key

__all__ = ["Telemetry", "configure"]

_log = logging.getLogger(__name__)


class Telemetry:
    """What :func:`configure` set up; flush it, shut it down, or use it as a context manager."""

    def __init__(self, provider: TracerProvider, exporter: ParquetSpanExporter, previous: Recorder) -> None:
        """Internal: made by :func:`configure`."""
        self.provider = provider
        self.exporter = exporter
        self._previous = previous
        self._closed = False

    @property
    def dataset(self) -> str:
        """The dataset directory spans are written to."""
        return self.exporter.dataset_dir

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export every finished span and write it to Parquet now."""
        ok = self.provider.force_flush(timeout_millis)
        return self.exporter.force_flush(timeout_millis) and ok

    def shutdown(self) -> None:
        """Flush everything, stop the pipeline and restore the previous recorder."""
        if self._closed:
            return
        self._closed = True
        self.provider.shutdown()
        set_recorder(self._previous)

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()


def _resource(service_name: str | None) -> Resource:
    """The SDK's precedence (``OTEL_SERVICE_NAME``, then ``OTEL_RESOURCE_ATTRIBUTES``), an explicit name first."""
    if service_name is not None:
        return Resource.create({SERVICE_NAME: service_name})
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "otel-replay"}))
    return resource


def configure(
    dataset: str | os.PathLike[str] | None = None,
    service_name: str | None = None,
    *,
    signing_key: str | bytes | None = None,
    set_global: bool = True,
    max_file_age_seconds: float | None = None,
) -> Telemetry:
    """Wire a ``TracerProvider`` + ``BatchSpanProcessor`` + :class:`ParquetSpanExporter`.

    Args:
        dataset: dataset directory (``OTEL_REPLAY_DATASET``, default ``./traces``).
        service_name: ``service.name`` resource attribute (``OTEL_SERVICE_NAME``,
            default ``otel-replay``).
        signing_key: the record signing secret (see :mod:`otel_replay.integrity`).
        set_global: also install the provider as the global one, when no SDK
            provider is installed yet, so other instrumentations' spans land in
            the same dataset.
        max_file_age_seconds: how long spans may sit in the exporter's buffer.

    Users with their own ``TracerProvider`` skip this and add
    ``CorrelationSpanProcessor()`` and ``BatchSpanProcessor(ParquetSpanExporter(dir))``.

    """
    dataset = settings.dataset_dir(dataset)
    provider = TracerProvider(resource=_resource(service_name))
    provider.add_span_processor(CorrelationSpanProcessor())
    exporter = ParquetSpanExporter(dataset, max_age_seconds=max_file_age_seconds)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    if set_global and isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
    key = load_signing_key(signing_key) if signing_key is not None else None
    recorder = Recorder(provider.get_tracer(sc.INSTRUMENTATION_NAME), key=key)
    previous = set_recorder(recorder)
    return Telemetry(provider, exporter, previous)
