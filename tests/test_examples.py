from __future__ import annotations

import os
import runpy
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import openai  # noqa: F401 - loaded once here: the forked example children find it imported, as in a full run
from opentelemetry import trace

from otel_replay.demo import run_demo

from ._support import fork

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _in_child(work: Callable[[], object], tmp_path: Path) -> tuple[int, str, str]:
    """Run ``work()`` in a child forked from this process: its exit code, what it printed and its errors.

    The child has the package, ``openai`` and the SDK imported already (a new interpreter spent most of its CPU
    importing them), yet whatever it does (a global provider set, threads started) dies with it. A ``SystemExit``
    gives its code; any other exception is printed to the child's errors and exits 1.
    """
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    pid = fork()
    if pid == 0:  # pragma: no cover - the child reports through its files and exit code
        code = 1
        try:
            with out.open("w") as sys.stdout, err.open("w") as sys.stderr:
                try:
                    work()
                    code = 0
                except SystemExit as stop:
                    code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
                    if not isinstance(stop.code, int | None):
                        print(stop.code, file=sys.stderr)
                except BaseException:
                    traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out.read_text(), err.read_text()


def _run_script(script: Path, *args: str) -> Callable[[], object]:
    """What ``python script args...`` does, for :func:`_in_child`."""

    def run() -> object:
        sys.argv = [str(script), *args]
        sys.path.insert(0, str(script.parent))
        return runpy.run_path(str(script), run_name="__main__")

    return run


def test_an_example_runs_as_a_script_in_a_new_interpreter(tmp_path):
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "example_trading_postmortem.py"), str(tmp_path / "ds")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "position_sizing" in out.stdout and "outcome_correct=False" in out.stdout


def test_the_payment_audit_example_rolls_back_and_restores_the_balance(tmp_path):
    code, stdout, stderr = _in_child(_run_script(EXAMPLES / "example_payment_audit.py", str(tmp_path / "ds")), tmp_path)
    assert code == 0, stdout + stderr
    assert "verdict: ROLLBACK" in stdout and "gate: rolled_back; balance 10,000" in stdout


def test_the_demo_leaves_no_global_tracer_provider_behind(tmp_path):
    """Issue 6 item 17: run_demo installed, then shut down, the process's global provider."""

    def demo() -> None:
        result = run_demo(tmp_path / "demo")
        assert result.outcome.executed == "rolled_back", result.outcome
        provider = trace.get_tracer_provider()
        assert isinstance(provider, trace.ProxyTracerProvider), provider
        print("ok")

    code, stdout, stderr = _in_child(demo, tmp_path)
    assert code == 0 and stdout.strip() == "ok", stdout + stderr


def test_the_governed_refund_bot_refuses_the_second_refund_and_its_backtest_agrees(tmp_path):
    code, stdout, stderr = _in_child(
        _run_script(EXAMPLES / "refund_bot" / "refund_bot.py", str(tmp_path / "ds")), tmp_path
    )
    assert code == 0, stdout + stderr
    lines = stdout.splitlines()
    assert "blocked before it ran: issue_refund (forbidden, loop, phase)" in lines
    assert (
        "tools the model was shown, per request: [['lookup_customer'], ['check_eligibility'], ['issue_refund'], [], []]"
        in lines
    )
    assert "ledger balance 965.00 (one refund committed through the gate)" in lines
    assert "evidence: step 1 allow, step 2 allow, step 3 allow, step 4 reject, step 5 allow" in lines
    assert "backtest: step 4 issue_refund would have been blocked (forbidden, loop, phase)" in lines
    assert "Traceback" not in stderr
