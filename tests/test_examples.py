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
