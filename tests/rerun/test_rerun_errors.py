"""Recorded errors a rerun raises again: cancellations, and errors rebuilt without their constructor (rev-rr2 7)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

import otel_replay
from otel_replay.errors import ReplayMismatchError
from otel_replay.instrumentation import tool
from otel_replay.rerun import recording, rerun

from .conftest import record


@tool
async def slow_lookup(q: str) -> str:
    """Slower than the agent's timeout."""
    await asyncio.sleep(2)
    return "found " + q


async def _with_timeout() -> str:
    try:
        return await asyncio.wait_for(slow_lookup("acme"), 0.05)
    except TimeoutError:
        return "timed out, using the cache"


def _times_out() -> str:
    return asyncio.run(_with_timeout())


def test_a_cancellation_the_recorded_run_caught_is_a_divergence_not_an_escape(dataset: Path) -> None:
    output, _, events = record(dataset, "timeout", _times_out)
    assert output == "timed out, using the cache" and events == 1
    result = rerun(_times_out, dataset=dataset, session_id="timeout")  # CancelledError escaped rerun() before
    assert not result.matched and result.divergence is not None
    assert "cancelled" in result.divergence.reason and "cannot reproduce" in result.divergence.reason
    with pytest.raises(ReplayMismatchError, match="was cancelled"):
        rerun(_times_out, dataset=dataset, session_id="timeout", governance="strict")


async def _cancelled_whole() -> str:
    task = asyncio.ensure_future(slow_lookup("acme"))
    await asyncio.sleep(0.05)
    task.cancel()
    return await task  # nobody catches it: the run ends cancelled


def _cancelled() -> str:
    return asyncio.run(_cancelled_whole())


def test_a_run_that_ended_cancelled_reruns_to_where_it_stopped(dataset: Path) -> None:
    telemetry = otel_replay.configure(dataset, service_name="rerun-tests", set_global=False)
    try:
        with pytest.raises(asyncio.CancelledError), recording("cancelled"):
            _cancelled()
        telemetry.force_flush()
    finally:
        telemetry.shutdown()
    for governance in ("relaxed", "strict"):
        result = rerun(_cancelled, dataset=dataset, session_id="cancelled", governance=governance)  # type: ignore[arg-type]
        assert result.ended_early and result.divergence is None and not result.matched, result.report()


@tool
def run_tests() -> str:
    """A tool running a command with check=True."""
    subprocess.run([sys.executable, "-c", "raise SystemExit(2)"], check=True)
    return "tests passed"


def _tests() -> str:
    try:
        return run_tests()
    except subprocess.CalledProcessError as exc:
        return f"tests failed: {exc}"  # printing the rebuilt error raised AttributeError before


class QuotaError(Exception):
    """A domain error with fields and a formatting __str__."""

    def __init__(self, service: str, limit: int) -> None:
        super().__init__(service, limit)
        self.service, self.limit = service, limit

    def __str__(self) -> str:
        return f"{self.service} quota of {self.limit} calls exceeded"


@tool
def search(q: str) -> str:
    """Over quota."""
    raise QuotaError("search", 10)


def test_an_error_rebuilt_without_its_constructor_prints_its_recorded_message(dataset: Path) -> None:
    output, _, _ = record(dataset, "cpe", _tests)
    assert output.startswith("tests failed: Command") and "exit status 2" in output
    result = rerun(_tests, dataset=dataset, session_id="cpe", governance="strict")
    assert result.matched and result.output == output, result.report()

    telemetry = otel_replay.configure(dataset, service_name="rerun-tests", set_global=False)
    try:
        with pytest.raises(QuotaError), recording("quota"):
            search("acme")
        telemetry.force_flush()
    finally:
        telemetry.shutdown()
    uncaught = rerun(lambda: search("acme"), dataset=dataset, session_id="quota")  # rerun() raised before
    assert uncaught.matched and uncaught.error == "QuotaError: search quota of 10 calls exceeded", uncaught.report()
    shown = rerun(_quota_shown, dataset=dataset, session_id="quota")
    assert shown.output == ("search quota of 10 calls exceeded", True), shown.report()


def _quota_shown() -> tuple[str, bool]:
    try:
        search("acme")
    except QuotaError as exc:
        return str(exc), repr(exc).startswith("QuotaError(")
    return "", False
