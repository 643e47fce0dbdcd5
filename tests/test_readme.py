"""README as a user runs it: every ```python block, in order, in one fresh interpreter."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from .conftest import TEST_KEY

README = Path(__file__).resolve().parents[1] / "README.md"

_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
_HEADING = re.compile(r"^#{2,3} (.+)$", re.MULTILINE)

# Runs the blocks one after another in a single namespace, as a user pasting them
# into one session would, and names the block (by its section) that failed.
_DRIVER = """
import json, sys, traceback
blocks = json.loads(sys.stdin.read())
namespace = {"__name__": "__main__"}
for index, (section, code) in enumerate(blocks["blocks"]):
    try:
        exec(compile(code, f"README block {index + 1} ({section})", "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print(f"FAILED: README block {index + 1} in section {section!r}", file=sys.stderr)
        sys.exit(3)
exec(compile(blocks["after"], "checks after the README", "exec"), namespace)
"""


def python_blocks(text: str) -> list[tuple[str, str]]:
    """``(section heading, code)`` for every ```python block of ``text``, in order."""
    headings = [(m.start(), m.group(1)) for m in _HEADING.finditer(text)]
    blocks = []
    for match in _BLOCK.finditer(text):
        section = [h for pos, h in headings if pos < match.start()]
        blocks.append((section[-1] if section else "(top)", match.group(1)))
    return blocks


def _run(cwd: Path, blocks: list[tuple[str, str]], after: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTEST"))}
    env.update(OTEL_REPLAY_SIGNING_KEY=TEST_KEY, HOME=str(cwd / "home"))
    return subprocess.run(
        [sys.executable, "-c", _DRIVER],
        input=json.dumps({"blocks": blocks, "after": after}),
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=180,
    )


# What the sections promise, checked in the same namespace after the last block.
_AFTER = """
from otel_replay import Store
from otel_replay.capture import get_recorder
assert outcome.executed == "rolled_back", outcome
assert chain.traces and chain.traces[0]["decision_type"] == "position_sizing", chain.traces
assert get_recorder().stats.dropped_after_shutdown == 0
with Store("./traces") as fresh:
    gates = fresh.rows("SELECT executed FROM gates WHERE decision_id = ?", [record.record_id])
    assert sorted(g["executed"] for g in gates) == ["committed", "intent", "rolled_back"], gates
    assert fresh.record(record.record_id) == record
print("README OK")
"""


def test_readme_has_the_sections_the_issue_names():
    sections = [section for section, _ in python_blocks(README.read_text(encoding="utf-8"))]
    for name in (
        "Capturing decisions",
        "Replay and the gate",
        "Replay chains and SQL",
        "Instrumenting an existing OpenTelemetry setup",
    ):
        assert name in sections, sections


def test_every_python_block_runs_in_order(tmp_path):
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    out = _run(tmp_path, blocks, _AFTER)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "README OK" in out.stdout
    # Nothing went to the log either: no lost record, no dataset-less gate, no failed flush.
    assert "otel-replay:" not in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_instrumenting_block_works_on_a_fresh_proxy_provider(tmp_path):
    """The block alone, where the global provider is still the API's ProxyTracerProvider."""
    blocks = dict((section, code) for section, code in python_blocks(README.read_text(encoding="utf-8")))
    code = blocks["Instrumenting an existing OpenTelemetry setup"]
    after = """
from opentelemetry import trace as _trace
from otel_replay import Action, DependencySnapshot, audit, correlation, open as _open
from otel_replay.capture import get_recorder
with correlation("c-proxy"), audit("pay", snapshot=DependencySnapshot({"b": 1})) as d:
    d.act(Action("pay", {"to": "x"}, cost=1))
    with _trace.get_tracer("someone.else").start_as_current_span("http-call"):
        pass
assert get_recorder().flush() is True
with _open("./traces") as store:
    names = {r["name"]: r["correlation_id"] for r in store.rows("SELECT name, correlation_id FROM spans")}
    assert names["http-call"] == "c-proxy" and names["replay.decision"] == "c-proxy", names
    assert store.record(d.record.record_id) == d.record
print("README OK")
"""
    out = _run(tmp_path, [("Instrumenting an existing OpenTelemetry setup", code)], after)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "README OK" in out.stdout


def test_the_old_readme_order_fails_loudly_not_silently(tmp_path):
    """Shutting down, then using the gate: the gate record is reported lost, never dropped unseen."""
    setup = """
import otel_replay
from otel_replay import Action, ActionGate, DependencySnapshot, FixAction, ReferenceLedger, Verdict, audit
telemetry = otel_replay.configure("./traces")
gate = ActionGate(ReferenceLedger(balance=10_000))
with audit("pay", snapshot=DependencySnapshot({"b": 1})) as d:
    receipt = gate.commit(Action("pay", {"to": "x"}, cost=1), record_id=d.record_id)
telemetry.shutdown()
"""
    after = """
from otel_replay import CaptureError
from otel_replay.capture import get_recorder
gate.enforce_post_commit(Verdict(FixAction.ROLLBACK, False, "stale", d.record_id), receipt=receipt)
assert get_recorder().stats.dropped_after_shutdown == 1, get_recorder().stats
try:
    with audit("pay", snapshot=DependencySnapshot({"b": 1})):
        raise AssertionError("the block must not run")
except CaptureError as exc:
    assert "shut down" in str(exc)
print("README OK")
"""
    out = _run(tmp_path, [("setup", setup)], after)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "README OK" in out.stdout
    assert out.stderr.count("emitted after the telemetry pipeline was shut down") == 1, out.stderr


def test_readme_gives_the_rerun_divergence_exit_code_the_command_uses():
    from otel_replay.cli.rerun import DIVERGED

    text = README.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `otel-replay rerun "))
    assert f"{DIVERGED} a rerun did not match" in row
    assert "2 a rerun did not match" not in text
