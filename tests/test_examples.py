from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("script", ["example_payment_audit.py", "example_trading_postmortem.py"])
def test_example_runs(script, tmp_path):
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / script), str(tmp_path / "ds")], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    if script == "example_payment_audit.py":
        assert "verdict: ROLLBACK" in out.stdout and "gate: rolled_back; balance 10,000" in out.stdout
    else:
        assert "position_sizing" in out.stdout and "outcome_correct=False" in out.stdout


def test_the_demo_leaves_no_global_tracer_provider_behind(tmp_path):
    """Issue 6 item 17: run_demo installed, then shut down, the process's global provider."""
    code = (
        "import sys\n"
        "from opentelemetry import trace\n"
        "from otel_replay.demo import run_demo\n"
        "result = run_demo(sys.argv[1])\n"
        "assert result.outcome.executed == 'rolled_back', result.outcome\n"
        "provider = trace.get_tracer_provider()\n"
        "assert isinstance(provider, trace.ProxyTracerProvider), provider\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "demo")], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


def test_the_governed_refund_bot_refuses_the_second_refund_and_its_backtest_agrees(tmp_path):
    script = EXAMPLES / "refund_bot" / "refund_bot.py"
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ds")], capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert "blocked before it ran: issue_refund (forbidden, loop, phase)" in lines
    assert (
        "tools the model was shown, per request: [['lookup_customer'], ['check_eligibility'], ['issue_refund'], [], []]"
        in lines
    )
    assert "ledger balance 965.00 (one refund committed through the gate)" in lines
    assert "evidence: step 1 allow, step 2 allow, step 3 allow, step 4 reject, step 5 allow" in lines
    assert "backtest: step 4 issue_refund would have been blocked (forbidden, loop, phase)" in lines
    assert "Traceback" not in out.stderr
