"""Many small files: compaction and a cold chain on a day no compaction has touched yet.

Usage: python benchmarks/bench_many_files.py DIR [--files 20654] [--rows-per-file 10] [--skip-generate]
           [--base CHECKOUT] [--rounds 1] [--phases chain,footers,floor,compact,after]

Generates (once, in ``DIR/day``) a day of ``--files`` arrival-order files of
``--rows-per-file`` spans each through the project's row builder and
DatasetWriter (benchmarks/gen_dataset.py, one flush per file: what many
short-lived processes or a flush per commit leave; each carries the
writer's checksum, so this code's compaction reads it a DuckDB chunk at a
time, and a peer that does not know the checksum reads it as before), then, each in a fresh
child process (peak RSS from ``getrusage`` of the child):

- ``chain``: ``otel-replay chain trade <id> -d DIR/day`` on the uncompacted day
  (the first process to open it: no side index, no tail index yet; the
  partitions' key logs, ``_id_keys.log``, as the writer left them);
- ``footers`` (not run by default): the same chain with the key logs removed,
  as on a day an older otel-replay wrote: every file's footer is read;
- ``floor`` (with ``compact``, once a round, before it): the cheapest the
  readers themselves read these files, no dedup, no sort, no write: one
  DuckDB ``read_parquet([every file])`` query to Arrow on 1 and on 2 DuckDB
  threads, and ``pyarrow.dataset`` ``to_table()`` over the same list without
  and with threads, each in a child process (the read's own wall and CPU
  seconds from inside the child, and the whole child's CPU, process start
  and imports included);
- ``compact``: ``otel-replay compact`` of a copy of the day (``--grace 0``),
  spans/s and peak RSS, and its time and CPU as ratios of the floor's;
- ``chain after``: the same chain on the compacted copy.

With ``--base CHECKOUT`` (a checkout of an earlier commit, e.g. a git
worktree), the chain and the compaction also run with that checkout's
``otel_replay`` first on ``PYTHONPATH``, alternating with this one, on copies
of the same day: the peer in the same run. ``--rounds`` repeats the pairs.
Each checkout's package is compiled to bytecode first (``compileall``), so no
counted run pays for compiling, as after an install.

Issue 20's targets: compaction of 20,000 small files under 1 GB peak RSS at
>= 100k spans/s; the cold chain under 2 s. Nothing is asserted; the load
average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _support import generator  # noqa: E402

HERE = Path(__file__).resolve().parent


def _child(*args: str, code: Path | None = None) -> dict[str, Any]:
    """Run ``otel-replay ARGS`` in a child process: wall and CPU seconds, the child's peak RSS (MB), its exit code.

    CPU seconds (user + system) are the fairer figure on a machine shared with other work. ``code``: a checkout
    whose ``otel_replay`` the child imports (default: this one's; ``-P``: not the working directory's). The
    figures are this child's own (``wait4``).
    """
    env = dict(os.environ, PYTHONPATH=str(code or HERE.parent))
    return _run([sys.executable, "-P", "-m", "otel_replay", *args], env)


def _run(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run ``argv`` in a child process: as :func:`_child` says."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        child = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - t0
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if child.returncode != 0:
        print(stderr[-2000:], file=sys.stderr)
    return {
        "seconds": round(seconds, 2),
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "rc": child.returncode,
        "out": stdout,
    }


_FLOOR = r"""
import json, os, sys, time
reader, threads, listing = sys.argv[1], int(sys.argv[2]), sys.argv[3]
files = open(listing).read().splitlines()
if reader == "duckdb":
    import duckdb
    con = duckdb.connect()
    con.execute(f"SET threads = {threads}")
    con.execute("SET enable_progress_bar = false")
else:
    import pyarrow as pa
    import pyarrow.dataset as ds
    pa.set_cpu_count(max(threads, 1))
t0, c0 = time.perf_counter(), os.times()
if reader == "duckdb":
    query = "SELECT * FROM read_parquet($files, hive_partitioning = false)"
    table = con.sql(query, params={"files": files}).to_arrow_table()
else:
    table = ds.dataset(files, format="parquet").to_table(use_threads=threads > 1)
c1 = os.times()
seconds = time.perf_counter() - t0
cpu = c1.user + c1.system - c0.user - c0.system
print(json.dumps({"rows": table.num_rows, "read_seconds": round(seconds, 3), "read_cpu_seconds": round(cpu, 3)}))
"""
"""A child that reads every file once with one reader (``duckdb`` or ``pyarrow``) on ``threads`` threads."""

FLOOR_READERS = (("duckdb", 1), ("duckdb", 2), ("pyarrow", 1), ("pyarrow", 2))


def _floor(files: list[Path], listing: Path) -> dict[str, dict[str, Any]]:
    """The floor readers on ``files``, each in a child: their read's wall and CPU seconds and the child's own CPU."""
    listing.write_text("\n".join(str(f) for f in files))
    found: dict[str, dict[str, Any]] = {}
    for reader, threads in FLOOR_READERS:
        result = _run([sys.executable, "-c", _FLOOR, reader, str(threads), str(listing)], dict(os.environ))
        read = json.loads(result.pop("out") or "{}")
        label = f"{reader}, {threads} thread{'s' if threads > 1 else ''}"
        found[label] = {**read, "child_cpu_seconds": result["cpu_seconds"], "peak_rss_mb": result["peak_rss_mb"]}
        per_file = 1000 * read.get("read_cpu_seconds", 0) / len(files)
        print(f"floor {label:18}", json.dumps(found[label]), f"{per_file:.3f} ms of read CPU a file")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--files", type=int, default=20_654)
    parser.add_argument("--rows-per-file", type=int, default=10)
    parser.add_argument("--skip-generate", action="store_true", help="reuse DIR/day")
    parser.add_argument("--phases", default="chain,compact,after")
    parser.add_argument("--base", type=Path, help="a checkout of the code before, run beside this one")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    day = args.dir / "day"
    if not args.skip_generate:
        shutil.rmtree(day, ignore_errors=True)
        spans = args.files * args.rows_per_file
        made = generator().generate(
            day, spans=spans, ids=args.files, days=1, rows_per_file=args.rows_per_file, duplicates=0.001, seed=7
        )
        print("generated", json.dumps(made))
        (args.dir / "generated.json").write_text(json.dumps({"files": args.files, **made}))
    elif (args.dir / "generated.json").exists():  # the chain id comes from the ids the day was made with
        args.files = json.loads((args.dir / "generated.json").read_text())["files"]
    files = sum(1 for _ in (day / "spans").rglob("*.parquet"))
    size = sum(p.stat().st_size for p in (day / "spans").rglob("*.parquet"))
    print(f"{files} files, {size / 2**20:.0f} MiB; load average {os.getloadavg()[0]:.2f}")
    chain_id = f"trade-{args.files // 2:09d}"
    phases = args.phases.split(",")
    codes: list[tuple[str, Path | None]] = [("this code", None)]
    if args.base is not None:
        codes.append((f"base {args.base.name}", args.base.resolve()))
    for _, code in codes:  # bytecode for every module up front: no counted run compiles, on either side
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str((code or HERE.parent) / "otel_replay")], check=True
        )
    chains: dict[str, str] = {}
    day_files = sorted((day / "spans").rglob("*.parquet"))
    for round_ in range(args.rounds):
        floor: dict[str, dict[str, Any]] = {}
        if "floor" in phases or "compact" in phases:
            print(f"-- round {round_ + 1}, the readers' floor, load average {os.getloadavg()[0]:.2f}")
            floor = _floor(day_files, args.dir / "floor-files.txt")
        for label, code in codes:
            print(f"-- round {round_ + 1}, {label}, load average {os.getloadavg()[0]:.2f}")
            for phase in ("chain", "footers"):
                if phase not in phases:
                    continue
                # A copy (times kept: the key logs hold them): the chain must be the first process to open these
                # files (no tail index held anywhere).
                cold = args.dir / "cold"
                shutil.rmtree(cold, ignore_errors=True)
                shutil.copytree(day, cold)
                if phase == "footers":
                    for log in (cold / "spans").glob("date=*/_id_keys.log"):
                        log.unlink()
                os.sync()  # the copy's writeback done before the child runs, not on the CPU beside it
                result = _child("chain", "trade", chain_id, "-d", str(cold), "--json", code=code)
                out = result.pop("out")
                rows = len(json.loads(out or "{}").get("traces", [])) if result["rc"] == 0 else None
                chains[f"{label} {phase}"] = out.replace(str(cold), "DIR")
                what = "key logs kept" if phase == "chain" else "key logs removed"
                print(f"cold chain on the uncompacted day ({what})", json.dumps(result), "decisions", rows)
            work = args.dir / "compacted"
            if "compact" in phases:
                shutil.rmtree(work, ignore_errors=True)
                shutil.copytree(day, work)
                result = _child("compact", str(work), "--grace", "0", "--json", code=code)
                report = json.loads(result.pop("out") or "{}")
                spans = report.get("input_rows") or 0
                rate = round(spans / result["seconds"]) if result["seconds"] else None
                per_cpu = round(spans / result["cpu_seconds"]) if result["cpu_seconds"] else None
                print(
                    "compact",
                    json.dumps(result),
                    f"input_rows {spans}, {rate} spans/s wall, {per_cpu} spans per CPU second (process start included)",
                )
                reported = {k: report.get(k) for k in ("seconds", "peak_rss_bytes", "output_rows")}
                print("  reported", json.dumps(reported))
                for reader, read in floor.items():  # compaction's child against the floor's, and in-process times
                    if not read.get("read_seconds") or not read.get("read_cpu_seconds"):
                        continue
                    print(
                        f"  against {reader:18}: CPU {result['cpu_seconds'] / read['child_cpu_seconds']:.2f}x its "
                        f"child's ({result['cpu_seconds'] / read['read_cpu_seconds']:.2f}x its read's); wall "
                        f"{result['seconds'] / read['read_seconds']:.2f}x its read's, in process "
                        f"{(report.get('seconds') or 0) / read['read_seconds']:.2f}x"
                    )
            if "after" in phases and work.exists():
                result = _child("chain", "trade", chain_id, "-d", str(work), "--json", code=code)
                result.pop("out")
                print("chain after compaction", json.dumps(result))
    if len(set(chains.values())) > 1:
        print("the chains differ between the codes or phases", file=sys.stderr)
    elif len(chains) > 1:
        print("the same chain from every code and phase")
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
