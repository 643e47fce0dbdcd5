"""Outcomes through the real write path: ``configure()`` + ``audit()`` decisions + ``DecisionTracer.record_outcome()``.

Run: python benchmarks/bench_outcomes.py [--outcomes N] [--rounds N] [--threads 1,8] [--base COMMIT]

Each round runs in a fresh process on a fresh dataset written through
:func:`otel_replay.configure`: ``--outcomes`` audited decisions (a read and a
model call each), flushed, then one outcome per decision through one
``DecisionTracer().record_outcome()`` shared by ``--threads`` threads. Only
the outcomes are timed, twice: until every call has returned ("returned"),
and until ``force_flush()`` has put every outcome in Parquet ("stored", what
the calls left to the exporter included); CPU is the process's until
stored, and the calling threads' own until returned ("callers"). Variants run alternately, best of
``--rounds`` each:

* ``this``: this checkout as configured by default (the outcome sealed
  inside its claim's transaction and stored with it, one SQLite commit:
  durable against the process being killed when the call returns);
* ``this, record_outcomes``: the same outcomes through
  ``record_outcomes()``, one call per thread with that thread's share (claims
  and outcomes in shared transactions of up to 1,000);
* ``this, machine sync``: the same with ``OTEL_REPLAY_OUTCOME_SYNC=machine``
  (each commit ``fdatasync``-ed before the call returns, concurrent calls
  sharing a sync: durable against a machine crash);
* ``base``: the package as of ``--base`` (default ``s7-start``: the outcome
  held beside its claim as here, each in a savepoint of the transaction,
  its row named by the conversion),
  extracted with ``git archive`` and put first on the worker's path;
* ``base, record_outcomes``: the base's ``record_outcomes()``, called the same way;
* ``no claim, queued``: this checkout with no claim and the outcome queued
  like any span through the SDK (a floor: sealing and emitting alone).

Then the claims alone (``claim_outcome()`` called directly, no telemetry),
this checkout against the base, on 1 thread and on the most threads given.
Prints figures and ratios; asserts nothing. Target (issue 20): >= 5,000
outcomes/s from one process.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _support import package_at

ROOT = Path(__file__).resolve().parent.parent
BASE = "s7-start"
VARIANTS = ("this", "this, record_outcomes", "base", "base, record_outcomes", "this, machine sync", "no claim, queued")


def _patch(variant: str) -> None:
    """Leave out what ``variant`` leaves out (benchmark only: the path is otherwise the package's own)."""
    # imported here: the worker imports the package of the tree its variant names, after sys.path is set
    from otel_replay.capture import tracer as tracer_module
    from otel_replay.capture.recorder import Recorder

    if variant == "this, machine sync":
        os.environ["OTEL_REPLAY_OUTCOME_SYNC"] = "machine"  # read when the claim store is first opened
    if variant == "no claim, queued":
        tracer_module.claim_outcome = lambda *_: None  # type: ignore[assignment]
        Recorder.held = lambda *_, **__: None  # type: ignore[method-assign]

        def queued(self: Any, name: str, record_id: str, attributes: Any, *, links: Any = ()) -> Any:
            return (*self.emit(name, record_id, attributes, links=links), None)

        Recorder.emit_durable = queued  # type: ignore[method-assign]


def worker_outcomes(variant: str, n: int, threads: int) -> dict[str, float]:
    """One round in this process: seconds until the calls returned and until the outcomes were stored."""
    os.environ.setdefault("OTEL_REPLAY_SIGNING_KEY", "benchmark-signing-key-0123456789")
    import otel_replay  # imported here: after the worker's sys.path names the tree to measure
    from otel_replay import DecisionTracer, DependencySnapshot, audit

    _patch(variant)
    with tempfile.TemporaryDirectory() as tmp:
        telemetry = otel_replay.configure(tmp, set_global=False)
        snapshot = DependencySnapshot({"limit": 100}, version="v1")
        decisions = []
        for i in range(n):
            with audit("approve", snapshot=snapshot, correlation_id=f"c-{i % 97}", agent_id="ap") as d:
                d.read(invoice=f"INV-{i}")
                d.model("gpt-x", decision_basis="PO match", output={"ok": True})
            decisions.append((i, d.record_id))
        telemetry.force_flush()
        tracer = DecisionTracer()
        failed: list[BaseException] = []

        callers: list[float] = []

        def record(part: list[tuple[int, str]]) -> None:
            began = time.thread_time()
            try:
                if variant.endswith("record_outcomes"):
                    done = tracer.record_outcomes([(decision, i % 3 != 0) for i, decision in part])
                    if done.failed:
                        raise next(iter(done.failed.values()))
                    return
                for i, decision in part:
                    tracer.record_outcome(decision, i % 3 != 0)
            except BaseException as exc:  # noqa: BLE001 - reported by the parent
                failed.append(exc)
            finally:
                callers.append(time.thread_time() - began)

        workers = [threading.Thread(target=record, args=(decisions[k::threads],)) for k in range(threads)]
        gc.collect()
        cpu, start = time.process_time(), time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        returned = time.perf_counter() - start
        telemetry.force_flush()
        stored = time.perf_counter() - start
        cpu = time.process_time() - cpu
        telemetry.shutdown()
        if failed:
            raise failed[0]
        files = len(os.listdir(Path(tmp, "_outcomes"))) if Path(tmp, "_outcomes").is_dir() else 0
    return {"returned": returned, "stored": stored, "cpu": cpu, "callers": sum(callers), "files": files}


def worker_claims(n: int, threads: int) -> float:
    """Claims per second of ``claim_outcome()`` called directly by ``threads`` threads on a fresh local dataset."""
    # imported here: see worker_outcomes; before the claim store moved to storage/ it was in capture/
    try:
        from otel_replay.storage.outcome_claims import claim_outcome
    except ImportError:
        from otel_replay.capture.outcome_claims import claim_outcome  # type: ignore[no-redef]

    with tempfile.TemporaryDirectory() as tmp:
        claim_outcome(tmp, "warm-up", "o", True)
        ids = [f"decision-{i:08d}-{os.urandom(8).hex()}" for i in range(n)]

        def claim(part: list[str]) -> None:
            for i, decision in enumerate(part):
                claim_outcome(tmp, decision, f"outcome-{i}", True)

        workers = [threading.Thread(target=claim, args=(ids[k::threads],)) for k in range(threads)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return n / (time.perf_counter() - start)


def _run(tree: Path, *args: str) -> Any:
    """Run this script as a worker with ``tree``'s package first on the path; its JSON answer."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, __file__, "--worker", *args], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"worker {args} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f} (5 min {five:.1f}) on {os.cpu_count()} cores"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outcomes", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", default="1,8", help="comma-separated thread counts")
    parser.add_argument("--base", default=BASE)
    parser.add_argument("--worker", nargs="*", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker is not None:
        kind, *rest = opts.worker
        if kind == "outcomes":
            print(json.dumps(worker_outcomes(rest[0], int(rest[1]), int(rest[2]))))
        else:
            print(json.dumps(worker_claims(int(rest[0]), int(rest[1]))))
        return 0

    counts = [int(t) for t in opts.threads.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        base = package_at(opts.base, Path(tmp))
        trees = {name: ROOT for name in VARIANTS if base is not None or not name.startswith("base")}
        if base is None:
            print(f"(no peer: git cannot archive {opts.base})")
        else:
            trees.update({name: base for name in trees if name.startswith("base")})
        print(f"start: {_load()}")
        runs: dict[tuple[str, int], list[dict[str, float]]] = {(v, t): [] for v in trees for t in counts}
        for _ in range(opts.rounds):
            for threads in counts:
                for variant, tree in trees.items():
                    runs[variant, threads].append(_run(tree, "outcomes", variant, str(opts.outcomes), str(threads)))
        print(f"{opts.outcomes:,} outcomes per round (after as many audited decisions), best of {opts.rounds}")
        n = opts.outcomes
        for threads in counts:
            best = {v: min(runs[v, threads], key=lambda r: r["stored"]) for v in trees}
            print(f" {threads} thread(s):")
            for variant, r in best.items():
                peer = "base, record_outcomes" if variant.endswith("record_outcomes") else "base"
                ratio = f"  {r['stored'] / best[peer]['stored']:5.2f}x {peer}" if peer in best else ""
                print(
                    f"  {variant:24s} returned {n / r['returned']:7,.0f}/s ({r['returned'] / n * 1e3:6.3f} ms)  "
                    f"stored {n / r['stored']:7,.0f}/s ({r['stored'] / n * 1e3:6.3f} ms){ratio}  "
                    f"cpu {r['cpu'] / n * 1e3:.3f} ms/outcome (callers {r.get('callers', 0) / n * 1e3:.3f})  "
                    f"{r['files']:.0f} files in _outcomes/"
                )
        claim_trees = {v: trees[v] for v in ("this", "base") if v in trees}
        for threads in sorted({1, max(counts)}):
            alone = {
                v: max(_run(tree, "claims", str(n), str(threads)) for _ in range(opts.rounds))
                for v, tree in claim_trees.items()
            }
            print(
                f" the claims alone (claim_outcome() called directly, {threads} thread(s)): "
                + ", ".join(f"{v} {rate:,.0f}/s" for v, rate in alone.items())
            )
        print(f"end: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
