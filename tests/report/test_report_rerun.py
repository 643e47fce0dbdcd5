"""The rerun page: the recorded run and the rerun side by side, the first divergent step marked, secrets as stored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import otel_replay
from otel_replay.report import html, model
from otel_replay.rerun import rerun
from otel_replay.rerun.load import load_recording

from ..rerun.conftest import agent, record
from .conftest import Page


@pytest.fixture
def diverged(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, model.RerunView, model.RerunView]:
    """Session ``sess-r`` recorded, then rerun with a changed prompt: the live result and the stored one."""
    with agent.scripted_server() as api, agent.scripted_server() as llm:
        monkeypatch.setenv("RERUN_EXAMPLE_API", api)
        monkeypatch.setenv("RERUN_EXAMPLE_MODEL", llm)
        record(dataset, "sess-r", agent.agent_from_env)
    monkeypatch.setenv("RERUN_EXAMPLE_SUFFIX", " Think twice.")
    telemetry = otel_replay.configure(dataset, service_name="report-tests", set_global=False)
    try:
        with otel_replay.open(dataset) as store:
            result = rerun(agent.agent_from_env, dataset=store, session_id="sess-r")
            live = model.rerun_view(result, load_recording(store, "sess-r"))
        assert telemetry.force_flush()
    finally:
        telemetry.shutdown()
    with otel_replay.open(dataset) as store:
        stored = model.session_rerun_view(store, "sess-r")
    return dataset, live, stored


def test_the_first_divergent_step_is_marked_with_expected_and_actual(
    diverged: tuple[Path, model.RerunView, model.RerunView],
) -> None:
    _, live, stored = diverged
    for view in (live, stored):
        assert view.divergence is not None and view.state == "diverged"
        states = [s.state for s in view.steps]
        at = states.index("diverged")
        assert view.steps[at].seq == view.divergence.step
        assert set(states[:at]) <= {"same"} and set(states[at + 1 :]) <= {"not reached"}
        assert "Think twice." in view.steps[at].rerun
        page = Page(html.rerun_page(view))
        (row,) = [r for r in page.all("tr") if r.get("class") == "diverged"]
        assert row["id"] == f"step-{view.divergence.step}"
        text = " ".join(page.text)
        assert "First divergence" in text and "Think twice." in text and "expected (recorded)" in text
        assert view.original_fingerprint in text and view.rerun_fingerprint in text
    assert live.divergence == stored.divergence


def test_the_rerun_page_shows_credentials_as_the_recording_stored_them(
    diverged: tuple[Path, model.RerunView, model.RerunView],
) -> None:
    _, live, stored = diverged
    for view in (live, stored):
        page = html.rerun_page(view)
        assert agent.API_KEY not in page


def test_a_session_never_rerun_shows_its_recording_and_says_so(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with agent.scripted_server() as api, agent.scripted_server() as llm:
        monkeypatch.setenv("RERUN_EXAMPLE_API", api)
        monkeypatch.setenv("RERUN_EXAMPLE_MODEL", llm)
        _, _, events = record(dataset, "sess-n", agent.agent_from_env)
    with otel_replay.open(dataset) as store:
        view = model.session_rerun_view(store, "sess-n")
    assert view.state == "not rerun" and len(view.steps) == events
    assert "this session was never rerun" in " ".join(Page(html.rerun_page(view)).text)


def test_a_session_without_a_recording_is_not_found(demo_dataset: Path) -> None:
    with otel_replay.open(demo_dataset) as store, pytest.raises(otel_replay.RecordNotFound):
        model.session_rerun_view(store, "no-such-session")


def _stored(divergence: object) -> dict[str, object]:
    """A ``rerun_compare`` row as a rerun record stores it, with ``divergence`` as its JSON."""
    return {"session_id": "s", "rerun_id": "r", "matched": False, "divergence": json.dumps(divergence)}


def test_a_stored_divergence_of_ten_megabytes_is_cut_and_its_candidates_counted() -> None:
    # What a divergence holds is recorded tool arguments and model output: as long as an agent made them.
    big = "x" * 10_000_000
    row = _stored({"step": 3, "reason": big, "expected": big, "actual": big, "candidates": ["y" * 500] * 1000})
    view = model.stored_rerun_view(row, None)
    assert view.divergence is not None and view.divergence.step == 3
    assert (
        len(view.divergence.expected) < model.MAX_TEXT + 100 and "more characters not shown" in view.divergence.actual
    )
    assert len(view.divergence.candidates) == 21 and view.divergence.candidates[-1] == "… and 980 more not shown"
    assert len(html.rerun_page(view)) < 100_000


@pytest.mark.parametrize("step", [1e400, "three", None, [3]])
def test_a_stored_divergence_whose_step_is_not_a_number_is_said_to_be_unreadable(step: object) -> None:
    row = _stored({"step": step, "reason": "r", "expected": "e", "actual": "a"})
    view = model.stored_rerun_view(row, None)
    assert view.divergence is not None and view.divergence.reason == "the stored divergence could not be read"
    Page(html.rerun_page(view))
