"""The boto3 client behind every s3:// operation: built per call (before) or once per process (after), same run.

Usage: python benchmarks/bench_s3_clients.py [--base s14-start] [--rounds 3] [--spans 3000] [--objects 300]
           [--claims 200] [--chains 5]

Starts the S3 server the tests start (moto's S3 application alone, behind
werkzeug, on a free loopback port: never the internet) in a process of its
own, writes one dataset of ``--objects`` small objects, and then, in a fresh
interpreter per measurement, with this code and the code at ``--base`` in
turn (a round each, alternated), measures CPU (the worker's process time, all
its threads) and wall seconds of:

- open + chain: ``otel_replay.open("s3://...")`` and one trade chain, the
  first in a new process (both pay one client build: boto3 loads its S3 model
  then), then ``--chains`` more in the same process;
- compact: ``otel_replay.storage.compact`` of a copy of that dataset (made
  server-side before the worker starts), ``--grace 0``;
- claims: ``--claims`` outcome claims on s3:// (``claim_outcome``: a
  conditional PUT each), one process;
- client(): ``objects.client`` alone, 200 calls after the first.

moto answers over loopback with ``Connection: close``, so no run reuses a
connection: the figures are the client's CPU, not the network's. Nothing is
asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _support import aws_at, generator, package_at  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

_SERVER = """
import logging, sys
from moto.moto_server import werkzeug_app
from werkzeug import serving
logging.getLogger("werkzeug").setLevel(logging.ERROR)
app = werkzeug_app.create_backend_app("s3")
server = serving.make_server(
    "127.0.0.1", int(sys.argv[1]), app, threaded=True, request_handler=werkzeug_app.MotoRequestHandler
)
print("ready", flush=True)
server.serve_forever()
"""

_WORKER = """
import json, os, sys, time
import otel_replay
from otel_replay.location import resolve
from otel_replay.storage import compact, objects
from otel_replay.storage.outcome_claims import claim_outcome

what, uri, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = {"package": otel_replay.__file__}

def timed(fn):
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall

def chain(n):
    cid = f"trade-{(n * 7919) % 300:09d}"
    with otel_replay.open(uri) as store:
        store.run_for("chains/trade", {"correlation_id": cid}, chain_id=cid)

if what == "chain":
    out["first"] = timed(lambda: chain(0))
    out["more"] = [timed(lambda n=n: chain(n)) for n in range(1, count + 1)]
elif what == "compact":
    out["first"] = timed(lambda: compact(uri, grace_seconds=0))
elif what == "claims":
    out["first"] = timed(lambda: claim_outcome(uri, "d-warm", "o", True))
    out["more"] = [timed(lambda n=n: claim_outcome(uri, f"d{n}", "o", True)) for n in range(count)]
elif what == "client":
    location = resolve(uri)
    out["first"] = timed(lambda: objects.client(location))
    out["more"] = [timed(lambda: objects.client(location)) for _ in range(count)]
print(json.dumps(out))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker(tree: str, what: str, uri: str, count: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, what, uri, str(count)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": tree},
        cwd=tree,  # `python -c` puts the working directory first on sys.path: the tree's own package, not ours
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"{what} with {tree} failed:\n{done.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    if not out["package"].startswith(tree):
        raise SystemExit(f"{what}: imported {out['package']}, not the tree {tree}")
    return out


def _copy(s3: Any, source: str, target: str) -> None:
    """Every object under ``source`` copied to ``target`` in the bucket ``bench`` (server-side)."""
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket="bench", Prefix=f"{source}/"):
        for item in page.get("Contents", []):
            key = f"{target}/{item['Key'][len(source) + 1 :]}"
            s3.copy_object(Bucket="bench", Key=key, CopySource={"Bucket": "bench", "Key": item["Key"]})


def _ms(pairs: list[list[float]]) -> str:
    """Median CPU / wall ms of ``pairs`` (cpu, wall) seconds."""
    return f"{statistics.median(p[0] for p in pairs) * 1e3:.2f} / {statistics.median(p[1] for p in pairs) * 1e3:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="s14-start", help="a git ref, or a directory holding its otel_replay")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spans", type=int, default=3000)
    parser.add_argument("--objects", type=int, default=300)
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--chains", type=int, default=5)
    args = parser.parse_args(argv)
    port = _free_port()
    aws_at(port)
    server = subprocess.Popen([sys.executable, "-c", _SERVER, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline() == "ready\n"
        with tempfile.TemporaryDirectory() as tmp:
            base = args.base if Path(args.base, "otel_replay").is_dir() else str(package_at(args.base, Path(tmp)))
            trees = {"this": str(ROOT), args.base: base}
            for tree in trees.values():
                subprocess.run([sys.executable, "-m", "compileall", "-q", f"{tree}/otel_replay"], check=True)
            _measure(args, trees)
    finally:
        server.terminate()
        server.wait()
    return 0


def _measure(args: argparse.Namespace, trees: dict[str, str]) -> None:
    import boto3

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="bench")
    sys.path.insert(0, str(ROOT))
    made = generator().generate(
        "s3://bench/read", spans=args.spans, ids=300, days=1, rows_per_file=max(1, args.spans // args.objects), seed=7
    )
    print(f"load average at start: {os.getloadavg()[0]:.2f}; {made['files']} objects, {args.spans} spans")
    results: dict[str, dict[str, list[Any]]] = {name: {} for name in trees}
    for round_ in range(args.rounds):
        order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
        for name in order:
            tree, got = trees[name], results[name]
            _copy(s3, "read", f"c-{name}-{round_}")
            runs = {
                "chain": _worker(tree, "chain", "s3://bench/read", args.chains),
                "compact": _worker(tree, "compact", f"s3://bench/c-{name}-{round_}", 0),
                "claims": _worker(tree, "claims", f"s3://bench/claims-{name}-{round_}", args.claims),
                "client": _worker(tree, "client", "s3://bench/read", 200),
            }
            for what, out in runs.items():
                got.setdefault(f"{what} first", []).append(out["first"])
                got.setdefault(f"{what} more", []).extend(out.get("more", []))
            firsts = ", ".join(f"{what} {out['first'][0] * 1e3:.0f}" for what, out in runs.items())
            print(f"round {round_ + 1} {name}, CPU ms: {firsts}", flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    print(f"{'CPU / wall ms (median over runs)':44} " + " ".join(f"{name:>22}" for name in trees))
    for key in next(iter(results.values())):
        if all(results[name][key] for name in trees):
            print(f"{key:44} " + " ".join(f"{_ms(results[name][key]):>22}" for name in trees))


if __name__ == "__main__":
    raise SystemExit(main())
