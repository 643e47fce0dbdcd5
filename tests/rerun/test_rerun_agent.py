"""Record the example agent against live local servers, stop them, rerun from the dataset alone."""

from __future__ import annotations

import asyncio
import random
import uuid
from pathlib import Path

import httpx
import pytest

import otel_replay
from otel_replay.errors import DeterminismLeakError, ReplayMismatchError
from otel_replay.rerun import recording, rerun
from tests._support import Zygote

from .conftest import EXAMPLES, SCRIPT, agent, record


def test_the_scripted_servers_answer_differently_on_every_call(dataset: Path, servers: tuple[str, str]) -> None:
    api, model = servers
    original, fingerprint, events = record(dataset, "s1", lambda: agent.run_agent(api, model))
    # The servers' answers change on every call: a second live run differs.
    again = agent.run_agent(api, model)
    assert again["quote"] != original["quote"] and again["answer"] != original["answer"]
    assert events >= 12


def test_rerun_with_servers_stopped_is_identical(dataset: Path) -> None:
    with agent.scripted_server() as api, agent.scripted_server() as model:
        original, fingerprint, _ = record(dataset, "s1", lambda: agent.run_agent(api, model))
    # Both servers are gone: any real network call would fail.
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{api}/quote", timeout=1)
    result = rerun(lambda: agent.run_agent(api, model), dataset=dataset, session_id="s1")
    assert result.error is None, result.report()
    assert result.output == original
    assert result.matched, result.report()
    assert result.fingerprint == result.original_fingerprint == fingerprint
    assert result.leaks == [] and result.divergence is None
    assert len(result.decisions) == 1
    # Same code, same recording: same fingerprint every time.
    assert rerun(lambda: agent.run_agent(api, model), dataset=dataset, session_id="s1").fingerprint == fingerprint


def test_a_changed_prompt_names_the_first_divergent_step(dataset: Path) -> None:
    with agent.scripted_server() as api, agent.scripted_server() as model:
        record(dataset, "s1", lambda: agent.run_agent(api, model))
    result = rerun(lambda: agent.run_agent(api, model, " Think twice."), dataset=dataset, session_id="s1")
    assert not result.matched
    assert result.fingerprint != result.original_fingerprint
    div = result.divergence
    assert div is not None
    assert "/v1/chat/completions called with other arguments" in div.reason
    assert "Buy?" in div.expected and "Think twice." in div.actual and "Think twice." not in div.expected
    assert any("✓ method" in c and "✗ body" in c for c in div.candidates)
    assert f"diverged at step {div.step}" in result.report()
    # The step named is the model call: everything before it matched.
    assert 5 < div.step < 15


def test_strict_raises_on_the_divergent_call_with_step_and_candidates(dataset: Path) -> None:
    with agent.scripted_server() as api, agent.scripted_server() as model:
        record(dataset, "s1", lambda: agent.run_agent(api, model))
    with pytest.raises(ReplayMismatchError) as caught:
        rerun(
            lambda: agent.run_agent(api, model, " Think twice."), dataset=dataset, session_id="s1", governance="strict"
        )
    err = caught.value
    assert err.step > 0 and "Think twice." in err.actual and err.candidates
    # One message, numbered as the recording numbers its steps (the closest recorded call is that very step).
    assert str(err).startswith(f"diverged at step {err.step}: ") and "/v1/chat/completions" in str(err)
    assert str(err).count("diverged at step") == 1 and err.candidates[0].startswith(f"step {err.step}: ")


def _extra_entropy(api: str, model: str) -> dict:
    out = agent.run_agent(api, model)
    out["extra"] = str(uuid.uuid4())  # a uuid the recording never drew, in a new function
    return out


def test_unrecorded_entropy_is_a_leak_in_strict_and_a_warning_in_relaxed(dataset: Path) -> None:
    with agent.scripted_server() as api, agent.scripted_server() as model:
        original, _, _ = record(dataset, "s1", lambda: agent.run_agent(api, model))
    with pytest.raises(DeterminismLeakError, match=r"uuid\.uuid4"):
        rerun(lambda: _extra_entropy(api, model), dataset=dataset, session_id="s1", governance="strict")
    relaxed = rerun(lambda: _extra_entropy(api, model), dataset=dataset, session_id="s1")
    assert not relaxed.matched and relaxed.divergence is not None
    assert "does not hold" in relaxed.divergence.reason and "uuid.uuid4" in relaxed.divergence.actual
    assert {k: v for k, v in relaxed.output.items() if k != "extra"} == original


def _noisy_helper() -> float:
    return random.random()


def _extra_random_first(api: str, model: str) -> dict:
    _noisy_helper()  # one added random draw, in its own function, before everything else
    return agent.run_agent(api, model)


def test_one_added_random_call_does_not_shift_the_uuids_after_it(dataset: Path) -> None:
    with agent.scripted_server() as api, agent.scripted_server() as model:
        original, _, _ = record(dataset, "s1", lambda: agent.run_agent(api, model))
    result = rerun(lambda: _extra_random_first(api, model), dataset=dataset, session_id="s1")
    assert not result.matched
    assert result.divergence is not None and result.divergence.step == 0
    assert "random.random" in result.divergence.actual and "_noisy_helper" in result.divergence.actual
    # Per-consumer streams: the agent's own draws and uuids are still the recorded ones.
    assert result.output == original


def _quote_twice(api: str) -> list[float]:
    with httpx.Client(base_url=api) as client:
        return [client.get("/quote").json()["price"], client.get("/quote").json()["price"]]


def test_two_identical_requests_get_their_own_two_responses(dataset: Path) -> None:
    with agent.scripted_server() as api:
        original, _, _ = record(dataset, "s1", lambda: _quote_twice(api))
    assert original[0] != original[1]
    result = rerun(lambda: _quote_twice(api), dataset=dataset, session_id="s1")
    assert result.output == original and result.matched


def _quote_three_times(api: str) -> list[float]:
    return [*_quote_twice(api), httpx.get(f"{api}/quote").json()["price"]]


def test_an_unrecorded_request_is_a_mismatch_in_strict_and_refused_as_a_leak_in_relaxed(dataset: Path) -> None:
    with agent.scripted_server() as api:
        record(dataset, "s1", lambda: _quote_twice(api))
        relaxed = rerun(lambda: _quote_three_times(api), dataset=dataset, session_id="s1")
        assert relaxed.error is not None and relaxed.error.startswith("DeterminismLeakError") and not relaxed.matched
        assert relaxed.leaks == [f"unrecorded HTTP GET {api}/quote outside the recording"], relaxed.report()
        assert relaxed.divergence is not None and relaxed.divergence.step == 2
        assert "GET" in relaxed.divergence.actual
        assert "holds 2 such call(s) and this is call 3" in relaxed.divergence.reason
        # Allowed, it runs live (a divergence still, as the recording does not hold it), and is not a leak.
        host_port = api.removeprefix("http://")
        allowed = rerun(lambda: _quote_three_times(api), dataset=dataset, session_id="s1", allow_live=[host_port])
        assert allowed.error is None and not allowed.matched and not allowed.leaks, allowed.report()
        assert allowed.live == [f"unrecorded HTTP GET {api}/quote"] and len(allowed.output) == 3
    with pytest.raises(ReplayMismatchError, match="step 2"):
        rerun(lambda: _quote_three_times(api), dataset=dataset, session_id="s1", governance="strict")


def test_fewer_calls_than_recorded_is_a_divergence_at_the_end(dataset: Path) -> None:
    with agent.scripted_server() as api:
        record(dataset, "s1", lambda: _quote_twice(api))
    result = rerun(lambda: httpx.get(f"{api}/quote").json()["price"], dataset=dataset, session_id="s1")
    assert not result.matched and result.divergence is not None
    assert result.divergence.step == 1 and "1 more call" in result.divergence.reason
    assert "GET" in result.divergence.expected


def test_asyncio_agent_reruns_identically(dataset: Path) -> None:
    with agent.scripted_server() as api, agent.scripted_server() as model:
        original, fingerprint, _ = record(dataset, "s1", lambda: asyncio.run(agent.run_agent_async(api, model)))
    result = rerun(lambda: asyncio.run(agent.run_agent_async(api, model)), dataset=dataset, session_id="s1")
    assert result.error is None, result.report()
    assert result.output == original and result.matched, result.report()
    assert result.fingerprint == fingerprint


def test_the_recording_is_attributed_to_the_current_span(dataset: Path) -> None:
    telemetry = otel_replay.configure(dataset, service_name="t", set_global=False)
    tracer = telemetry.provider.get_tracer("t")
    try:
        with recording("s1"), tracer.start_as_current_span("step-a") as span_a:
            random.random()
            with tracer.start_as_current_span("step-b") as span_b:
                uuid.uuid4()
        telemetry.force_flush()
    finally:
        telemetry.shutdown()
    with otel_replay.open(dataset) as store:
        rows = store.run("rerun_event_list", session_id="s1")
    by_name = {r["name"]: r for r in rows}
    assert by_name["random.random"]["span_id"] == f"{span_a.get_span_context().span_id:016x}"
    assert by_name["uuid.uuid4"]["span_id"] == f"{span_b.get_span_context().span_id:016x}"
    assert [r["seq"] for r in rows] == sorted(r["seq"] for r in rows)


@pytest.mark.slow
def test_the_example_script_runs_end_to_end(tmp_path: Path, zygote: Zygote) -> None:
    # forked from a parent that imported the clients the example's agent uses: their imports are not the point here
    forks = zygote.with_model_clients()
    out = forks.run(SCRIPT, str(EXAMPLES / "example_rerun_agent.py"), str(tmp_path / "ds"), timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rerun: matched; fingerprints equal: True" in out.stdout
    assert "outputs identical: True" in out.stdout
    assert "changed prompt: diverged at step" in out.stdout and "✗ body" in out.stdout
