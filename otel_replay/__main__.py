"""``python -m otel_replay``: the same as the ``otel-replay`` command."""

from otel_replay.cli import run

run()
