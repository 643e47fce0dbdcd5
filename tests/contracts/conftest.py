"""What the governed-client tests share: a span collector per test, and the scripted clients closed after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .govern_support import Spans, close_clients


@pytest.fixture
def spans() -> Iterator[Spans]:
    """The decision spans a test's sessions write (their tracer provider), its clients closed after the test."""
    kept = Spans()
    yield kept
    close_clients()
    kept.close()
