"""The instrumented-agent example runs end to end (it is also listed for tests/test_examples.py via notes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "example_instrumented_agent.py"


def test_the_instrumented_agent_example(tmp_path):
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), str(tmp_path / "ds")], capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "agent: Paid INV-4471 (4,200 to acme-supplies)." in out.stdout
    assert out.stdout.count("model call: gpt-4o-mini") == 3
    assert "('tool', 'pay_vendor', 'call_2')" in out.stdout
    assert "verdict: ROLLBACK; gate: rolled_back; balance 10,000" in out.stdout
    assert "Traceback" not in out.stderr and "lost" not in out.stderr
