"""CPU per span started through the global provider ``configure()`` installs, against the SDK tracer directly.

Run:

    .venv/bin/python benchmarks/bench_global_provider.py [--spans 2000] [--blocks 15] [--base s13-start] [--runs 2]
        [--unsampled]

Each run is a fresh process per tree (this checkout, then ``--base`` as of that git revision, ``git archive``d to a
temporary directory and put first on ``PYTHONPATH``; the module path each child imported is printed). The child calls
``otel_replay.configure(<dataset under /dev/shm>)`` with ``set_global=True`` and times, with the thread's own CPU
clock (the exporter's writer thread is not counted), ``with tracer.start_as_current_span("s"): pass`` in blocks of
``--spans`` spans, the tracers taking turns block by block:

* ``sdk``: ``telemetry.provider.get_tracer(...)``: the pipeline's SDK tracer, no global provider in between;
* ``global``: ``trace.get_tracer(...)`` after ``configure()``, kept: in ``s13-start`` the SDK tracer itself (the
  provider was the global one), here the forwarder's;
* ``early``: ``trace.get_tracer(...)`` before ``configure()``: the API's proxy tracer, in front of either;
* ``sdk/get``, ``global/get``: ``get_tracer(...)`` called again for every span (as code that does not keep it).

Prints the minimum and median µs of CPU per span over the blocks; asserts nothing. The spans are sampled and reach
the pipeline's batch queue (as every span of a configured process does); the queue is flushed between blocks.
``--unsampled``: ``OTEL_TRACES_SAMPLER=always_off``, so the spans are not recorded and what leads to the SDK's tracer
is a larger part of the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _support import ROOT, package_at

CHILD = r"""
import json, statistics, sys, time
import otel_replay
from opentelemetry import trace

dataset, spans, blocks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
early = trace.get_tracer("bench.early")
telemetry = otel_replay.configure(dataset, set_global=True, max_file_age_seconds=3600)
provider = telemetry.provider
kept = {"sdk": provider.get_tracer("bench"), "global": trace.get_tracer("bench"), "early": early}


def kept_tracer(tracer):
    def run():
        for _ in range(spans):
            with tracer.start_as_current_span("s"):
                pass
    return run


def sdk_get():
    for _ in range(spans):
        with provider.get_tracer("bench.get").start_as_current_span("s"):
            pass


def global_get():
    for _ in range(spans):
        with trace.get_tracer("bench.get").start_as_current_span("s"):
            pass


runs = {name: kept_tracer(tracer) for name, tracer in kept.items()}
runs["sdk/get"], runs["global/get"] = sdk_get, global_get
names = list(runs)
for name in names:  # warm: each path's first span (tracer lookups, the forwarder's binding) not counted
    runs[name]()
telemetry.force_flush()
per_span = {name: [] for name in names}
for block in range(blocks):
    for name in names[block % len(names):] + names[:block % len(names)]:  # each takes every place in turn
        start = time.thread_time()
        runs[name]()
        per_span[name].append((time.thread_time() - start) / spans * 1e6)
        telemetry.force_flush()
telemetry.shutdown()
print(json.dumps({
    "module": otel_replay.__file__,
    "global": type(trace.get_tracer_provider()).__name__,
    "min": {n: min(v) for n, v in per_span.items()},
    "median": {n: statistics.median(v) for n, v in per_span.items()},
}))
"""


def run_child(tree: Path, spans: int, blocks: int, unsampled: bool) -> dict[str, object]:
    """One fresh process importing ``otel_replay`` from ``tree``; its figures."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(tree)
    if unsampled:
        env["OTEL_TRACES_SAMPLER"] = "always_off"
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as dataset:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, dataset, str(spans), str(blocks)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            cwd=tree,
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=2000, help="spans per block")
    parser.add_argument("--blocks", type=int, default=15, help="blocks per tracer")
    parser.add_argument("--runs", type=int, default=2, help="fresh processes per tree, alternated")
    parser.add_argument("--unsampled", action="store_true", help="OTEL_TRACES_SAMPLER=always_off: the spans are "
                        "not recorded, so the SDK's part is small and the path to it shows")
    parser.add_argument("--base", help="also measure the package as of this git revision (e.g. s13-start)")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this": ROOT}
        if opts.base:
            base = package_at(opts.base, Path(tmp))
            if base is None:
                sys.exit(f"git cannot archive {opts.base}")
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(base / "otel_replay")], check=True)
            trees[opts.base] = base
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "otel_replay")], check=True)
        print(f"µs of CPU per span (this thread), {opts.blocks} blocks of {opts.spans} spans"
              f"{', unsampled' if opts.unsampled else ''}; min / median; "
              f"load {os.getloadavg()[0]:.1f}")
        for run in range(opts.runs):
            for label, tree in trees.items():
                got = run_child(tree, opts.spans, opts.blocks, opts.unsampled)
                cells = "  ".join(
                    f"{name} {got['min'][name]:.2f}/{got['median'][name]:.2f}"  # type: ignore[index]
                    for name in got["min"]  # type: ignore[union-attr]
                )
                print(f"run {run + 1} {label:>10} ({got['global']}, {got['module']}): {cells}")
        print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
