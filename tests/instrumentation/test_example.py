"""The instrumented-agent example runs end to end (it is also listed for tests/test_examples.py via notes)."""

from __future__ import annotations

from pathlib import Path

from tests._support import Zygote

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "example_instrumented_agent.py"

# ``python EXAMPLE DATASET``: the script run as ``__main__`` with its directory first on ``sys.path``.
_AS_SCRIPT = (
    "import os, runpy, sys\n"
    "sys.argv = sys.argv[1:]\n"
    "sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def test_the_instrumented_agent_example(tmp_path: Path, zygote: Zygote) -> None:
    # A process of its own (its own tracer provider and exit), forked from a parent that imported the package and
    # the model clients the example instruments (their imports are not what this test is about).
    out = zygote.with_model_clients().run(_AS_SCRIPT, str(EXAMPLE), str(tmp_path / "ds"), timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "agent: Paid INV-4471 (4,200 to acme-supplies)." in out.stdout
    assert out.stdout.count("model call: gpt-4o-mini") == 3
    assert "('tool', 'pay_vendor', 'call_2')" in out.stdout
    assert "verdict: ROLLBACK; gate: rolled_back; balance 10,000" in out.stdout
    assert "Traceback" not in out.stderr and "lost" not in out.stderr
