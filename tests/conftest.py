"""Shared fixtures: a signing key, a dataset directory, and a configured pipeline."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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
