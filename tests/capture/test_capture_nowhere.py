"""With no pipeline (no configure(), no SDK TracerProvider) sealed records go nowhere: said once, and flush() is False.

Each case runs in a fresh interpreter: the warning is once per process, and
the global tracer provider cannot be unset once a test installed one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

_NO_PIPELINE = """
    import logging, otel_replay
    from otel_replay import Action, ActionGate, DependencySnapshot, ReferenceLedger, audit
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    ledger = ReferenceLedger(10_000)
    for _ in range(2):
        with audit("vendor_payment", snapshot=DependencySnapshot({"budget": 10_000})) as d:
            d.act(Action("vendor_payment", {"recipient": "acme"}, cost=4200))
    ActionGate(ledger, dataset=@CLAIMS@).commit(Action("vendor_payment", {}, cost=100), record_id=d.record_id)
    print("flush:", otel_replay.get_recorder().flush())
"""

_CONFIGURED = """
    import logging, otel_replay
    from otel_replay import Action, DependencySnapshot, audit
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    with otel_replay.configure(@DATASET@, set_global=False) as telemetry:
        with audit("vendor_payment", snapshot=DependencySnapshot({"budget": 10_000})) as d:
            d.act(Action("vendor_payment", {"recipient": "acme"}, cost=4200))
        print("flush:", otel_replay.get_recorder().flush())
"""


def _run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, env=os.environ, check=True
    )


def test_records_sealed_with_no_pipeline_warn_once_and_flush_says_false(tmp_path: Path) -> None:
    done = _run(_NO_PIPELINE.replace("@CLAIMS@", repr(str(tmp_path / "claims"))))
    assert done.stdout.strip() == "flush: False"
    warnings = [line for line in done.stderr.splitlines() if "not stored anywhere" in line]
    assert len(warnings) == 1, done.stderr  # three records sealed, one warning
    assert "replay.decision record" in warnings[0] and "otel_replay.configure" in warnings[0]


def test_a_configured_pipeline_neither_warns_nor_fails_the_flush(dataset: Path) -> None:
    done = _run(_CONFIGURED.replace("@DATASET@", repr(str(dataset))))
    assert done.stdout.strip() == "flush: True"
    assert "not stored anywhere" not in done.stderr
