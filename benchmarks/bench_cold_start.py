"""Cold start: what a fresh process pays before it does anything, against the code at ``--base``.

Run: python benchmarks/bench_cold_start.py [--rounds N] [--base COMMIT]

Each case is a new Python process, run for this checkout and for the package
as of ``--base`` (default ``s9-start``, extracted with ``git archive``;
``--base ''`` leaves it out), alternating this, base, this, base ... so both
see the same machine:

* ``python``: ``python -c pass``, the interpreter alone (the floor);
* ``import``: ``import otel_replay``;
* ``--help``: ``python -m otel_replay --help``;
* ``chain``: ``python -m otel_replay chain trade ID --json`` on the demo dataset (``otel-replay demo``);
* ``sql``: ``python -m otel_replay sql "SELECT count(*) FROM decisions"`` on the demo dataset;
* ``verify``: ``python -m otel_replay verify`` of the demo dataset;
* ``capture``: ``configure()`` on a new dataset, one ``audit()`` decision (read, model, act) and ``shutdown()``.

Each side has its own bytecode cache, filled by a first round that is not
counted. Prints, per case, the median user + system CPU seconds of the process,
its wall time and its peak RSS over ``--rounds`` runs (each the process's own,
from ``wait4``), and the median of this / base taken round by round. Asserts
nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _support import package_at  # benchmarks/ is on sys.path when a script runs

ROOT = Path(__file__).resolve().parents[1]
BASE = "s9-start"
KEY = "benchmark-signing-key-0123456789"
"""The signing key of every run and of the demo: ``verify`` checks the demo's records with it."""
CAPTURE = """
import sys
import otel_replay
from otel_replay import Action, DependencySnapshot, audit
telemetry = otel_replay.configure(sys.argv[1], service_name="cold-start")
with audit("trade", snapshot=DependencySnapshot(state={"budget": 10}, version="v1")) as d:
    d.read(symbol="ACME")
    d.model("gpt-x", decision_basis="cheap")
    d.act(Action("buy", {"symbol": "ACME"}, cost=5))
telemetry.shutdown()
"""


def _run(tree: Path, args: list[str], cwd: Path, cache: Path) -> tuple[float, float, float]:
    """CPU (user + system) seconds, wall seconds and peak RSS (MiB) of one process running ``python args`` on ``tree``.

    Bytecode goes to ``cache`` (one per tree, filled by the first round), so neither side compiles in the
    counted rounds, as after an install, whatever ``PYTHONDONTWRITEBYTECODE`` and the trees' own caches say.
    The figures are this child's own (``wait4``), not a maximum over every child so far.
    """
    env = {**os.environ, "PYTHONPATH": str(tree), "OTEL_REPLAY_SIGNING_KEY": KEY}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-P", *args], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(args[:3])} failed on {tree}: {err.read().decode()[-2000:]}")
    return usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024


def _demo(tmp: Path) -> tuple[Path, str]:
    """The demo dataset, written by this checkout, and its trade's correlation id."""
    dataset = tmp / "demo"
    out = subprocess.run(
        [sys.executable, "-m", "otel_replay", "demo", "-d", str(dataset)],
        cwd=tmp,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OTEL_REPLAY_SIGNING_KEY": KEY},
        capture_output=True,
        check=True,
        text=True,
    ).stdout
    match = re.search(r"otel-replay chain trade (\S+)", out)
    if match is None:
        raise SystemExit("the demo printed no chain to look at")
    return dataset, match.group(1)


def main() -> None:
    """Run every case for this checkout and the base, alternating, and print figures and ratios."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--base", default=BASE, help="a commit to compare with ('' for none)")
    args = parser.parse_args()
    one, five, _ = os.getloadavg()
    print(f"load {one:.1f} (5 min {five:.1f}) on {os.cpu_count()} cores, {args.rounds} rounds")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        trees = {"this": ROOT}
        if args.base:
            base = package_at(args.base, tmp / "base")
            if base is None:
                print(f"(no peer: git cannot archive {args.base})")
            else:
                trees[args.base] = base
        dataset, cid = _demo(tmp)
        script = tmp / "capture.py"
        script.write_text(CAPTURE)
        cases = {
            "python": lambda n: ["-c", "pass"],
            "import": lambda n: ["-c", "import otel_replay"],
            "--help": lambda n: ["-m", "otel_replay", "--help"],
            "chain": lambda n: ["-m", "otel_replay", "chain", "trade", cid, "-d", str(dataset), "--json"],
            "sql": lambda n: ["-m", "otel_replay", "sql", "SELECT count(*) FROM decisions", "-d", str(dataset)],
            "verify": lambda n: ["-m", "otel_replay", "verify", str(dataset)],
            "capture": lambda n: [str(script), str(tmp / f"capture-{n}")],
        }
        for case, argv in cases.items():
            runs: dict[str, list[tuple[float, float, float]]] = {t: [] for t in trees}
            for n in range(args.rounds + 1):  # the first round warms the file cache and is not counted
                for label, tree in trees.items():
                    figure = _run(tree, argv(f"{label}-{n}"), tmp, tmp / f"bytecode-{label}")
                    if n:
                        runs[label].append(figure)
            line = f"{case:>8}:"
            for label, figures in runs.items():
                cpu = statistics.median(c for c, _, _ in figures)
                wall = statistics.median(w for _, w, _ in figures)
                rss = statistics.median(r for _, _, r in figures)
                line += f"  {label} {cpu:.3f} s CPU, {wall:.3f} s wall, {rss:.0f} MiB;"
            if len(trees) == 2:
                this, base_runs = runs["this"], runs[args.base]
                cpu_ratio = statistics.median(a[0] / b[0] for a, b in zip(this, base_runs, strict=True))
                wall_ratio = statistics.median(a[1] / b[1] for a, b in zip(this, base_runs, strict=True))
                rss_ratio = statistics.median(a[2] / b[2] for a, b in zip(this, base_runs, strict=True))
                line += f"  this / {args.base}: CPU {cpu_ratio:.2f}x, wall {wall_ratio:.2f}x, RSS {rss_ratio:.2f}x"
            print(line)
    print(f"load after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
