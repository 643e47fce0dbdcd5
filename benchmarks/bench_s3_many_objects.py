"""Compaction on s3:// of the same spans in many small objects and in a few: memory and time per object.

Usage: python benchmarks/bench_s3_many_objects.py [--spans 4000] [--objects 2000,20] [--pythonpath DIR]

Starts moto in server mode on a free loopback port (never the internet),
writes ``--spans`` spans through the project's DatasetWriter
(benchmarks/gen_dataset.py) once per ``--objects`` value (that many objects,
one partition), and compacts each in a child process (``otel-replay compact``,
``--grace 0``), printing wall and CPU seconds and the child's peak RSS.
``--pythonpath`` runs the compaction from another checkout (the code
before, for an A/B in the same run). Issue 20's baseline: 10,000 spans in
5,000 objects took 927 MB and 184 s, 2,000 spans in 5 objects 200 MB and 2 s
(about +150 KB and 35 ms per object). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _support import generator, local_s3  # noqa: E402

HERE = Path(__file__).resolve().parent


def _compact(uri: str, pythonpath: str) -> dict[str, Any]:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0 = usage.ru_utime + usage.ru_stime
    t0 = time.perf_counter()
    # a fresh interpreter per run: ru_maxrss of children is the largest so far, so runs go smallest first
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import resource, sys; from otel_replay.cli import main; "
            "sys.argv = ['otel-replay', 'compact', sys.argv[1], '--grace', '0']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('peak', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)",
            uri,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": pythonpath},
        check=False,
    )
    seconds = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak = [line for line in done.stdout.splitlines() if line.startswith("peak ")]
    return {
        "seconds": round(seconds, 2),
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime - cpu0, 2),
        "peak_rss_mb": round(int(peak[-1].split()[1]) / 1024) if peak else None,
        "rc": done.returncode,
        "err": done.stderr[-300:] if done.returncode else "",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=4000)
    parser.add_argument("--objects", default="2000,20")
    parser.add_argument("--pythonpath", action="append", default=[], help="a checkout to compact with (repeatable)")
    args = parser.parse_args(argv)
    with local_s3():
        import boto3

        checkouts = args.pythonpath or [str(HERE.parent)]
        boto3.client("s3").create_bucket(Bucket="bench")
        print(f"load average at start: {os.getloadavg()[0]:.2f}; {args.spans} spans")
        for objects in sorted(int(n) for n in args.objects.split(",")):
            for n, checkout in enumerate(checkouts):
                uri = f"s3://bench/o{objects}-{n}"
                made = generator().generate(
                    uri, spans=args.spans, ids=objects, days=1, rows_per_file=max(1, args.spans // objects)
                )
                result = _compact(uri, checkout)
                print(f"{made['files']} objects, {checkout}: {result}", flush=True)
        print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
