"""Every decision sealed inside a recording or a rerun is recorded and compared, whatever sink or recorder."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import otel_replay
from otel_replay import Action, DependencySnapshot, audit
from otel_replay.capture.recorder import Recorder, set_recorder
from otel_replay.capture.sinks import MemorySink
from otel_replay.errors import RecordingError, ReplayMismatchError
from otel_replay.rerun import rerun

from .conftest import record

_AMOUNT = {"cost": 100}
_OWN_SINK = MemorySink()


def _pay() -> str:
    n = random.randint(1, 100)  # a recorded boundary, so the recording is not empty without the decision
    with audit("vendor_payment", snapshot=DependencySnapshot({"budget": 10_000})) as d:
        d.act(Action("vendor_payment", {"recipient": "acme", "n": n}, cost=_AMOUNT["cost"]))
    return "paid"


def _pays_into_its_own_sink() -> str:
    n = random.randint(1, 100)
    with audit("vendor_payment", snapshot=DependencySnapshot({"budget": 10_000}), sink=_OWN_SINK) as d:
        d.act(Action("vendor_payment", {"recipient": "acme", "n": n}, cost=_AMOUNT["cost"]))
    return "paid"


def _pays_under_its_own_configure(dataset: Path) -> Callable[[], str]:
    def agent() -> str:  # a main() that sets up its own telemetry: a recorder of its own
        with otel_replay.configure(dataset, set_global=False):
            return _pay()

    return agent


def _entrypoints(dataset: Path) -> dict[str, Callable[[], str]]:
    return {
        "default sink": _pay,
        "own sink": _pays_into_its_own_sink,
        "own configure()": _pays_under_its_own_configure(dataset),
    }


@pytest.mark.parametrize("how", ["default sink", "own sink", "own configure()"])
def test_a_changed_decision_diverges_whatever_sink_or_recorder_the_agent_uses(
    dataset: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = _entrypoints(dataset)[how]
    monkeypatch.setitem(_AMOUNT, "cost", 100)
    _, _, events = record(dataset, "s1", entry)
    assert events == 2, "the decision is in the recording beside the entropy draw"
    telemetry = otel_replay.configure(dataset, set_global=False)
    try:
        same = rerun(entry, dataset=dataset, session_id="s1", write=False)
        assert same.matched and len(same.decisions) == 1, same.report()
        monkeypatch.setitem(_AMOUNT, "cost", 1000)  # the new code pays ten times as much
        changed = rerun(entry, dataset=dataset, session_id="s1", write=False)
    finally:
        telemetry.shutdown()
    assert not changed.matched and changed.decisions == []
    assert changed.divergence is not None and "the decision differs" in changed.divergence.reason
    assert '"cost":1000' in changed.divergence.actual and '"cost":100,' in changed.divergence.expected


def test_strict_stops_at_a_changed_decision_made_under_the_agents_own_configure(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = _pays_under_its_own_configure(dataset)
    record(dataset, "s1", entry)
    monkeypatch.setitem(_AMOUNT, "cost", 1000)
    with pytest.raises(ReplayMismatchError, match="the decision differs"):
        rerun(entry, dataset=dataset, session_id="s1", governance="strict", write=False)


def _with_a_recorder_that_cannot_seal(monkeypatch: pytest.MonkeyPatch) -> Callable[[], str]:
    def agent() -> str:
        with monkeypatch.context() as m:
            m.setenv("OTEL_REPLAY_SIGNING_KEY", "short")  # found bad at the first seal
            previous = set_recorder(Recorder())
            try:
                _pay()
            except RecordingError:
                pass  # an agent that carries on when its record could not be kept
            finally:
                set_recorder(previous)
        return "paid"

    return agent


def test_a_decision_that_could_not_be_sealed_is_never_a_silent_match(
    dataset: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    unsealable = _with_a_recorder_that_cannot_seal(monkeypatch)
    with caplog.at_level(logging.ERROR, logger="otel_replay.rerun"):
        record(dataset, "lost", unsealable)
    assert any("is not in the recording" in r.getMessage() for r in caplog.records)
    record(dataset, "kept", _pay)
    telemetry = otel_replay.configure(dataset, set_global=False)
    try:
        recorded_lost = rerun(_pay, dataset=dataset, session_id="lost", write=False)
        rerun_lost = rerun(unsealable, dataset=dataset, session_id="kept", write=False)
    finally:
        telemetry.shutdown()
    assert not recorded_lost.matched, recorded_lost.report()
    assert "dropped 1 event" in recorded_lost.original_outcome
    assert not rerun_lost.matched and rerun_lost.divergence is not None
    assert "could not be sealed" in rerun_lost.divergence.reason, rerun_lost.report()


def _two_decisions() -> Any:
    return [_pay(), _pay()]


def test_decisions_are_reported_once_each_and_paired_in_order(dataset: Path) -> None:
    record(dataset, "two", _two_decisions)
    telemetry = otel_replay.configure(dataset, set_global=False)
    try:
        result = rerun(_two_decisions, dataset=dataset, session_id="two", write=False)
    finally:
        telemetry.shutdown()
    assert result.matched and len(result.decisions) == 2, result.report()
    with otel_replay.open(dataset) as store:
        for original, _ in result.decisions:
            assert store.record(original).decision_type == "vendor_payment"
