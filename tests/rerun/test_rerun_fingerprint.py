"""The causal fingerprint: bounded memory, and recordings made with its first version still rerun."""

from __future__ import annotations

import functools
import random
import time
import tracemalloc
from pathlib import Path

import pytest

from otel_replay.rerun import record as record_module
from otel_replay.rerun import rerun
from otel_replay.rerun.codec import arguments_codec
from otel_replay.rerun.events import Fingerprint

from .conftest import record


def _steps(fp: Fingerprint, n: int) -> None:
    for i in range(n):
        fp.add("clock|time.time|agent|", "clock", "time.time", "a" * 32, f"{i:032x}")


def test_the_fingerprint_keeps_no_step_in_memory() -> None:
    fp = Fingerprint()
    _steps(fp, 1_000)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        _steps(fp, 100_000)
        grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    finally:
        tracemalloc.stop()
    assert grown < 256 * 1024, grown  # version 1 kept every framed step: ~10 MB here


def test_the_same_steps_give_the_same_fingerprint_whatever_the_stream_interleaving() -> None:
    one, other = Fingerprint(), Fingerprint()
    for i in range(10):
        one.add("a", "clock", "t", "x", str(i))
        one.add("b", "entropy", "r", "y", str(i))
    for i in range(10):
        other.add("b", "entropy", "r", "y", str(i))
    for i in range(10):
        other.add("a", "clock", "t", "x", str(i))
    assert one.hexdigest() == other.hexdigest()
    other.add("a", "clock", "t", "x", "10")
    assert one.hexdigest() != other.hexdigest()


def _agent() -> list[float]:
    return [time.time(), random.random(), time.time()]


def test_a_recording_with_a_version_1_fingerprint_still_reruns_and_matches(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The record mode of before 2026-11-26: the final chunk carries the version-1 digest.
    with monkeypatch.context() as patch:
        patch.setattr(record_module, "Fingerprint", functools.partial(Fingerprint, version=1))
        patch.setattr(record_module, "RECORDING_FORMAT", 2)  # a recording of then was format 2 at most
        with arguments_codec(2):  # and hashed its arguments with codec 2
            original, stored, _ = record(dataset, "v1", _agent)
    result = rerun(_agent, dataset=dataset, session_id="v1", governance="strict")
    assert result.output == original and result.matched, result.report()
    assert result.fingerprint != stored  # compared in version 2, after checking the stored one


def test_a_version_1_fingerprint_that_does_not_fit_its_events_never_matches(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class _Off(Fingerprint):
        def hexdigest(self) -> str:
            return "0" * 64

    with monkeypatch.context() as patch:
        patch.setattr(record_module, "Fingerprint", _Off)
        record(dataset, "off", _agent)
    result = rerun(_agent, dataset=dataset, session_id="off")
    assert not result.matched and result.original_fingerprint == "0" * 64
