"""Object storage benchmark: the same dataset on local disk and on a local S3-compatible server (moto).

Usage: python benchmarks/bench_s3.py [--spans 100000] [--ids 10000]

Starts moto in server mode on a free loopback port (never the internet),
writes the same generated dataset (benchmarks/gen_dataset.py, the project's
DatasetWriter) to a local directory and to ``s3://bench/ds``, and prints, per
location, in the same run:

- write: generation through DatasetWriter (spans/s);
- open: ``Store(dataset)`` (listing, manifests, footer checks);
- scan: ``SELECT count(*), count(DISTINCT correlation_id) FROM spans``;
- chain: the trade chain of one id through ``Store.run_for`` (median of 10);
- compact: ``otel_replay.storage.compact`` (spans/s);
- the same scan after compaction, and a chain narrowed by the side index;
- for the S3 read path, the alternative that was not chosen: a pyarrow
  dataset over the same objects scanned by DuckDB as an Arrow stream.

moto keeps objects in memory and answers over HTTP on loopback: the S3
figures measure the client path (pyarrow's S3 filesystem, fsspec, DuckDB),
not a real network or a real object store. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _support import generator, local_s3  # noqa: E402

HERE = Path(__file__).resolve().parent


def _timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _measure(dataset: str, spans: int, ids: int) -> dict[str, Any]:
    from otel_replay.query.store import Store
    from otel_replay.storage import compact

    out: dict[str, Any] = {}
    seconds, figures = _timed(
        lambda: generator().generate(dataset, spans=spans, ids=ids, days=2, rows_per_file=5000, seed=7)
    )
    out["write spans/s"] = round(figures["spans_written"] / seconds)
    out["files"] = figures["files"]
    scan = "SELECT count(*) AS n, count(DISTINCT correlation_id) AS c FROM spans"

    def chains(store: Any) -> float:
        times = []
        for n in range(10):
            cid = f"trade-{(n * 7919) % ids:09d}"
            t, _ = _timed(lambda cid=cid: store.run_for("chains/trade", {"correlation_id": cid}, chain_id=cid))
            times.append(t)
        return statistics.median(times[1:])

    out["open s"], store = _timed(lambda: Store(dataset))
    with store:
        out["scan s"], _ = _timed(lambda: store.rows(scan))
        out["chain ms (median)"] = round(chains(store) * 1000, 1)
    seconds, report = _timed(lambda: compact(dataset, grace_seconds=0))
    out["compact spans/s"] = round(report.input_rows / seconds)
    with Store(dataset) as store:
        out["scan after compaction s"], _ = _timed(lambda: store.rows(scan))
        out["chain after compaction ms (median)"] = round(chains(store) * 1000, 1)
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}


def _arrow_scan(dataset: str) -> float:
    """The alternative read path: a pyarrow dataset over the live files, scanned by DuckDB as an Arrow stream."""
    import duckdb
    import pyarrow.dataset as pads

    from otel_replay.location import resolve
    from otel_replay.storage import live_files

    location = resolve(dataset)
    t0 = time.perf_counter()
    files = [location.fs_path(f) for f in live_files(dataset)]
    arrow = pads.dataset(files, format="parquet", filesystem=location.fs)
    con = duckdb.connect()
    con.register("spans_arrow", arrow)
    con.sql("SELECT count(*), count(DISTINCT correlation_id) FROM spans_arrow").fetchall()
    return round(time.perf_counter() - t0, 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=100_000)
    parser.add_argument("--ids", type=int, default=10_000)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE.parent))
    with local_s3(OTEL_REPLAY_SIGNING_KEY=os.environ.get("OTEL_REPLAY_SIGNING_KEY", "bench-signing-key-0123456789")):
        import boto3

        boto3.client("s3").create_bucket(Bucket="bench")
        print(f"load average at start: {os.getloadavg()[0]:.2f}; {args.spans} spans, {args.ids} ids")
        with tempfile.TemporaryDirectory() as tmp:
            local = _measure(str(Path(tmp) / "ds"), args.spans, args.ids)
        remote = _measure("s3://bench/ds", args.spans, args.ids)
        print(f"{'':40} {'local disk':>14} {'S3 (moto)':>14} {'S3/local':>9}")
        for key in local:
            a, b = local[key], remote[key]
            ratio = f"{b / a:.2f}x" if isinstance(a, (int, float)) and a else ""
            print(f"{key:40} {a:>14} {b:>14} {ratio:>9}")
        alternative = _arrow_scan("s3://bench/ds")
        print(f"alternative S3 read path (pyarrow dataset -> DuckDB Arrow scan), compacted scan: {alternative} s")
        print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
