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


_NAMES = ['GET http://h/p?q="x"', "tool pay\\n", "é\u2028", "", "a|b", "\x00\x1f"]


def _hostile_steps(version: int) -> str:
    fp = Fingerprint(version=version)
    for i, name in enumerate(_NAMES):
        for boundary in ("http", "clock", "tool"):
            after = [None, 0, 7, 10**20][i % 4]
            fp.add(f"{boundary}|{name}|w|", boundary, name, f"{i:032x}", "v" * (i + 1), after)
    return fp.hexdigest()


def test_a_fingerprint_folds_steps_as_recordings_made_before_were_folded() -> None:
    # Written by the code before each step was framed without building a JSON encoder (2026-11-29): a stored
    # fingerprint must still equal its rerun's, names with quotes, escapes, line separators and control
    # characters included, and ordered steps with no place, place 0 and a place past 64 bits.
    assert _hostile_steps(1) == "495d48798f6d22e532b2265d80eca10a7cc8577d3f9572c8718f352f51da9608"
    assert _hostile_steps(2) == "3a0774363e9d32b9b26bb9dce9f4a294095ecd6b2b78fa62d990e56b340a507f"
    assert _hostile_steps(3) == "80a714785d1f01f52d2a55540dc085658be6db40cbd95f1ed311fdeb57e4daf1"


def test_a_step_whose_place_is_not_an_int_is_folded_as_json_writes_it() -> None:
    # bool is an int to Python but "true" to JSON: such a place is framed by the encoder, not as "True".
    one, other = Fingerprint(), Fingerprint()
    one.add("http|GET u||", "http", "GET u", "a" * 32, "b" * 32, True)
    other.add("http|GET u||", "http", "GET u", "a" * 32, "b" * 32, 1)
    assert one.hexdigest() != other.hexdigest()
