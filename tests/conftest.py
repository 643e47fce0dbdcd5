"""Shared fixtures: a signing key, a dataset directory, and a configured pipeline."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace

import otel_replay
from otel_replay import Telemetry

TEST_KEY = "test-signing-key-0123456789abcdef"


@pytest.fixture(autouse=True)
def signing_key(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Every test signs with a known key and never touches ~/.config."""
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", TEST_KEY)
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))
    monkeypatch.delenv("OTEL_REPLAY_KEY_FILE", raising=False)
    monkeypatch.delenv("OTEL_REPLAY_DATASET", raising=False)
    return TEST_KEY


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return tmp_path / "traces"


@pytest.fixture
def telemetry(dataset: Path) -> Iterator[Telemetry]:
    handle = otel_replay.configure(dataset, service_name="tests", set_global=False)
    yield handle
    handle.shutdown()


@pytest.fixture(autouse=True)
def no_global_tracer_provider() -> Iterator[None]:
    """No test may install a global TracerProvider: it is set-once, so it would outlive the test dead.

    Use ``configure(..., set_global=False)`` or a provider of the test's own.
    """
    before = trace.get_tracer_provider()
    yield
    after = trace.get_tracer_provider()
    assert after is before, f"this test installed a global TracerProvider ({after!r}); use set_global=False"
