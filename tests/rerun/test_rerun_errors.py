"""Recorded errors a rerun raises again: cancellations, and errors rebuilt without their constructor (rev-rr2 7)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

import otel_replay
from otel_replay.errors import ReplayMismatchError
from otel_replay.instrumentation import tool
from otel_replay.query.store import Store
from otel_replay.rerun import recording, rerun
from otel_replay.rerun.load import load_recording
from tests._support import Zygote

from .conftest import record, run_script


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


# --- rev-rr2 finding 8: how a whole process ended, with its own excepthook or sys.exit(0) ------------

_AGENT = """
import random, sys

CRASH = True


def main() -> None:
    random.random()
    if sys.argv[-1] == "own-hook" and CRASH:
        sys.excepthook = lambda *exc_info: print("the agent's own hook", file=sys.stderr)  # not chained
        raise RuntimeError("agent crashed")
    if sys.argv[-1] == "exit0":
        sys.exit(0)  # click's standalone mode, sys.exit(main()) scripts
"""

_WHOLE = """
import sys, otel_replay
from otel_replay.rerun.autostart import RecordingInstrumentor
otel_replay.configure(sys.argv[1], service_name="whole-process", set_global=True)
RecordingInstrumentor().instrument()
sys.path.insert(0, sys.argv[2])
import agent_whole
agent_whole.main()
"""


@pytest.mark.parametrize(
    ("how", "code", "outcome"),
    [("own-hook", 1, "raised builtins:RuntimeError: agent crashed"), ("exit0", 0, "returned")],
)
def test_a_whole_process_outcome_survives_its_own_excepthook_and_a_clean_exit_matches(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zygote: Zygote, how: str, code: int, outcome: str
) -> None:
    (tmp_path / "agent_whole.py").write_text(_AGENT)
    env = {**os.environ, "OTEL_REPLAY_RECORD_SESSION": "whole"}
    done = run_script(zygote, _WHOLE, str(dataset), str(tmp_path), how, env=env, raises=how == "own-hook")
    assert done.returncode == code, done.stderr
    with Store(dataset) as store:
        assert load_recording(store, "whole").outcome == outcome  # 'returned' for the crash before
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["agent_whole", how])
    monkeypatch.delitem(sys.modules, "agent_whole", raising=False)
    import agent_whole  # type: ignore[import-not-found]

    try:
        if how == "own-hook":
            agent_whole.CRASH = False  # a changed agent that no longer crashes: not the recorded run
            fixed = rerun(agent_whole.main, dataset=dataset, session_id="whole")
            assert not fixed.matched and "outcome differs" in fixed.report(), fixed.report()
        else:  # the same program ends in SystemExit: 0 again: it returned, as recorded
            same = rerun(agent_whole.main, dataset=dataset, session_id="whole")
            assert same.matched and same.error == "SystemExit: 0", same.report()
    finally:
        sys.modules.pop("agent_whole", None)


# --- rev-rr2 (suspected): an interruption the agent caught, then the rerun's stop it caught too --------


@tool
def interrupted() -> str:
    """Interrupted while recorded (Ctrl-C during the call)."""
    raise KeyboardInterrupt


@tool
def after() -> str:
    """A call made after the agent swallowed the interruption."""
    return "after"


def _swallows() -> str:
    try:
        interrupted()
    except (KeyboardInterrupt, Exception):  # a broad handler: also takes the rerun's ReplayMismatchError
        pass
    return after()


def test_a_rerun_stopped_where_the_recording_was_interrupted_never_matches(dataset: Path) -> None:
    output, _, events = record(dataset, "swallowed", _swallows)
    assert output == "after" and events == 2
    result = rerun(_swallows, dataset=dataset, session_id="swallowed")
    assert result.ended_early and not result.matched, result.report()  # ended early and matched, before


# --- an error whose __str__ is broken: one reading, the same note everywhere -------------------------------


class _Unprintable(Exception):
    """An error whose ``__str__`` raises (fields it never got)."""

    def __str__(self) -> str:
        raise KeyError("missing field")


class _NotText(Exception):
    """An error whose ``__str__`` returns no string at all."""

    def __str__(self) -> str:
        return 42  # type: ignore[return-value]


class _Secretive(Exception):
    pass


@pytest.mark.parametrize(
    ("error", "note"),
    [(_Unprintable(), "(KeyError while reading the message)"), (_NotText(), "(TypeError while reading the message)")],
)
def test_a_broken_error_message_reads_the_same_through_every_writer(
    dataset: Path, error: BaseException, note: str
) -> None:
    from otel_replay.redaction import message_of, redact_error
    from otel_replay.rerun.record import error_of, outcome_of

    assert message_of(error) == note
    assert redact_error(error, capture=True) == note and redact_error(error, capture=False) is None
    assert error_of(error)["message"] == note
    assert outcome_of(error).endswith(f":{type(error).__qualname__}: {note}")

    def fails() -> None:
        raise error

    record(dataset, "broken", lambda: None)
    result = rerun(fails, dataset=dataset, session_id="broken")
    assert result.error == f"{type(error).__name__}: {note}", result.report()


def test_a_readable_error_message_is_read_as_is_and_redacted_only_where_it_is_stored() -> None:
    from otel_replay.redaction import message_of, redact_error
    from otel_replay.rerun.record import error_of

    secret = "Authorization: Bearer sk-live-0123456789abcdef0123456789"
    error = _Secretive(f"declined ✗ {secret}")
    assert message_of(error) == f"declined ✗ {secret}"
    for stored in (redact_error(error, capture=True), error_of(error)["message"]):
        assert stored is not None and stored.startswith("declined ✗") and "sk-live" not in stored, stored
