"""The span exporter ``OTEL_TRACES_EXPORTER=otel_replay`` names (entry point ``opentelemetry_traces_exporter``)."""

from __future__ import annotations

from typing import Any

from otel_replay import redaction, settings
from otel_replay.errors import OtelReplayError
from otel_replay.exporters.parquet import ParquetSpanExporter
from otel_replay.instrumentation.autoconf import refuse_start, starting_up
from otel_replay.integrity import load_signing_key
from otel_replay.storage.claim_store import sync_outcomes

__all__ = ["AutoParquetSpanExporter"]


def _check_record_settings() -> None:
    """What ``configure()`` checks besides the exporter's own settings: read now, not at the first record.

    The signing key is checked only when a variable names one: without them
    the default key file is made at the first seal, as before.
    """
    redaction.check_settings()
    sync_outcomes()
    if settings.env_text(settings.SIGNING_KEY) is not None or settings.env_text(settings.KEY_FILE) is not None:
        load_signing_key(create=False)


class AutoParquetSpanExporter(ParquetSpanExporter):
    """:class:`ParquetSpanExporter` made by OpenTelemetry's SDK configuration from ``OTEL_*`` variables.

    A malformed ``OTEL_REPLAY_*`` value (``OTEL_REPLAY_MAX_FILE_AGE=5s``, and
    the settings records are made with: ``OTEL_REPLAY_SIGNING_KEY`` /
    ``OTEL_REPLAY_KEY_FILE``, ``OTEL_REPLAY_REDACT_*``,
    ``OTEL_REPLAY_OUTCOME_SYNC``) or a dataset that cannot be created stops
    ``opentelemetry-instrument`` at start with one line
    (:func:`~otel_replay.instrumentation.autoconf.refuse_start`), where the SDK
    would log it and run the application without recording it, or the
    application would meet it at its first record. Outside auto-instrumentation
    the error is raised as usual.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Create the exporter as :class:`ParquetSpanExporter` does."""
        try:
            _check_record_settings()  # first: nothing is started when one is refused
        except OtelReplayError as exc:
            if not starting_up():
                raise
            refuse_start(f"cannot record decisions: {exc}")
        try:
            super().__init__(*args, **kwargs)
        except OtelReplayError as exc:
            if not starting_up():
                raise
            refuse_start(f"cannot export spans to the dataset: {exc}")
