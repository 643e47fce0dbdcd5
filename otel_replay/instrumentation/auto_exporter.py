"""The span exporter ``OTEL_TRACES_EXPORTER=otel_replay`` names (entry point ``opentelemetry_traces_exporter``)."""

from __future__ import annotations

from typing import Any

from otel_replay.errors import OtelReplayError
from otel_replay.exporters.parquet import ParquetSpanExporter
from otel_replay.instrumentation.autoconf import refuse_start, starting_up

__all__ = ["AutoParquetSpanExporter"]


class AutoParquetSpanExporter(ParquetSpanExporter):
    """:class:`ParquetSpanExporter` made by OpenTelemetry's SDK configuration from ``OTEL_*`` variables.

    A malformed ``OTEL_REPLAY_*`` value (``OTEL_REPLAY_MAX_FILE_AGE=5s``) or a
    dataset that cannot be created stops ``opentelemetry-instrument`` at start
    with one line (:func:`~otel_replay.instrumentation.autoconf.refuse_start`),
    where the SDK would log it and run the application without recording it.
    Outside auto-instrumentation the error is raised as usual.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Create the exporter as :class:`ParquetSpanExporter` does."""
        try:
            super().__init__(*args, **kwargs)
        except OtelReplayError as exc:
            if not starting_up():
                raise
            refuse_start(f"cannot export spans to the dataset: {exc}")
