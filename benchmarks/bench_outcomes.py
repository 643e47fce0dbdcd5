"""Outcomes through the real write path: ``configure()`` + ``audit()`` decisions + ``DecisionTracer.record_outcome()``.

Run: python benchmarks/bench_outcomes.py [--outcomes N] [--rounds N] [--base COMMIT]

Each round writes a fresh dataset through :func:`otel_replay.configure`:
``--outcomes`` audited decisions (a read and a model call each), then one
outcome per decision through ``DecisionTracer().record_outcome()``, which
takes the decision's claim in the dataset before it emits the outcome. Only
the outcomes are timed. Three variants run alternately in the same process,
best of ``--rounds`` each:

* ``claim store``: this checkout (one SQLite claim store per dataset);
* ``claim files``: the claim module of ``--base`` (default: the commit before
  the claim store, one fsynced ``_outcomes/<id>.json`` per outcome), read with
  ``git show`` and put in place of this one for its rounds;
* ``no claim``: the same path with the claim left out (what the claim costs).

Shown per variant: ms per outcome, outcomes/s, and the files left in
``_outcomes/``; then the claims alone (``claim_outcome()`` called directly,
no telemetry) for the two claim variants: claims/s. Prints figures; asserts nothing. Target (issue 20): >= 5,000
outcomes/s from one process.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OTEL_REPLAY_SIGNING_KEY", "benchmark-signing-key-0123456789")

import otel_replay  # noqa: E402
from otel_replay import DecisionTracer, DependencySnapshot, audit  # noqa: E402
from otel_replay.capture import tracer as tracer_module  # noqa: E402

BASE = "bba12d0"  # the last commit with one claim file per outcome
ROOT = Path(__file__).resolve().parent.parent


def old_claims(base: str) -> Callable[..., Any] | None:
    """``claim_outcome`` as of ``base`` (one claim file per outcome), or None when git cannot show it."""
    try:
        source = subprocess.run(
            ["git", "show", f"{base}:otel_replay/capture/outcome_claims.py"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    module = types.ModuleType("outcome_claims_as_of_base")
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(source, f"{base}:outcome_claims.py", "exec"), module.__dict__)  # noqa: S102 - our own file
    return module.claim_outcome  # type: ignore[no-any-return]


def no_claim(*_: Any) -> None:
    """The claim left out: ``record_outcome`` emits without one."""
    return None


def round_(n: int, claim: Callable[..., Any]) -> dict[str, float]:
    """One round on a fresh dataset with ``claim`` as the tracer's claim; the outcomes' wall seconds and files."""
    saved = tracer_module.claim_outcome
    tracer_module.claim_outcome = claim
    try:
        with tempfile.TemporaryDirectory() as tmp:
            telemetry = otel_replay.configure(tmp, set_global=False)
            snapshot = DependencySnapshot({"limit": 100}, version="v1")
            decisions = []
            for i in range(n):
                with audit("approve", snapshot=snapshot, correlation_id=f"c-{i % 97}", agent_id="ap") as d:
                    d.read(invoice=f"INV-{i}")
                    d.model("gpt-x", decision_basis="PO match", output={"ok": True})
                decisions.append(d.record_id)
            tracer = DecisionTracer()
            gc.collect()
            start = time.perf_counter()
            for i, decision in enumerate(decisions):
                tracer.record_outcome(decision, i % 3 != 0)
            wall = time.perf_counter() - start
            telemetry.shutdown()
            claims = Path(tmp, "_outcomes")
            files = len(list(claims.iterdir())) if claims.is_dir() else 0
            return {"n": n, "wall": wall, "files": files}
    finally:
        tracer_module.claim_outcome = saved


def claims_alone(n: int, claim: Callable[..., Any]) -> float:
    """Claims per second of ``claim`` called directly on a fresh local dataset (no telemetry, no emit)."""
    with tempfile.TemporaryDirectory() as tmp:
        claim(tmp, "warm-up", "o", True)
        ids = [f"decision-{i:08d}-{os.urandom(8).hex()}" for i in range(n)]
        start = time.perf_counter()
        for i, decision in enumerate(ids):
            claim(tmp, decision, f"outcome-{i}", True)
        return n / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outcomes", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--base", default=BASE)
    opts = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)

    variants: dict[str, Callable[..., Any]] = {"claim store": tracer_module.claim_outcome}
    old = old_claims(opts.base)
    if old is not None:
        variants["claim files"] = old
    else:
        print(f"(no peer: git cannot show {opts.base}:otel_replay/capture/outcome_claims.py)")
    variants["no claim"] = no_claim
    for claim in variants.values():
        round_(200, claim)  # warm up imports and caches
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for _ in range(opts.rounds):
        for name, claim in variants.items():
            runs[name].append(round_(opts.outcomes, claim))
    print(f"{opts.outcomes:,} outcomes per round (after as many audited decisions), best of {opts.rounds}")
    for name, results in runs.items():
        r = min(results, key=lambda x: x["wall"])
        print(
            f"  {name:12s} {r['wall'] / r['n'] * 1e3:7.3f} ms/outcome  {r['n'] / r['wall']:9,.0f} outcomes/s  "
            f"{r['files']:6.0f} files in _outcomes/"
        )
    alone = {
        name: max(claims_alone(opts.outcomes, claim) for _ in range(opts.rounds))
        for name, claim in variants.items()
        if name != "no claim"
    }
    print(
        "  the claims alone (claim_outcome() called directly): "
        + ", ".join(f"{name} {rate:,.0f} claims/s" for name, rate in alone.items())
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
