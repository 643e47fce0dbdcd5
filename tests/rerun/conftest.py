"""Fixtures for the rerun tests: scripted local servers and a record-once helper."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import otel_replay
from otel_replay.rerun import recording

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

import example_rerun_agent as agent  # noqa: E402


@pytest.fixture
def servers() -> Iterator[tuple[str, str]]:
    """An API server and a model server on free 127.0.0.1 ports (stopped after the test)."""
    with agent.scripted_server() as api, agent.scripted_server() as model:
        yield api, model


def record(dataset: Path, session_id: str, entrypoint: Callable[[], Any]) -> tuple[Any, str, int]:
    """Record one run of ``entrypoint`` into ``dataset``; returns (output, fingerprint, events)."""
    telemetry = otel_replay.configure(dataset, service_name="rerun-tests", set_global=False)
    try:
        with recording(session_id) as mode:
            output = entrypoint()
        assert mode is not None
        telemetry.force_flush()
        return output, mode.fingerprint.hexdigest(), mode.events
    finally:
        telemetry.shutdown()
