"""Compaction throughput against its floors, in the same run.

Usage: python benchmarks/bench_compact.py [--spans 300000] [--ids 30000] [--threads 2,1]

Generates a dataset (benchmarks/gen_dataset.py, 5,000-row arrival-order files)
and prints spans/s for, on copies of the same files:

- read: pyarrow reads every partition's files into memory (the input floor);
- read + write: the same, then one zstd Parquet write per partition, unsorted
  (what any rewrite costs with pyarrow);
- read + sort + write: plus the sort compaction does;
- compact: ``otel_replay.storage.compact`` (dedup, sort, row groups, bloom
  filters, dictionary columns, side index, facts, manifest swap), once per
  ``--threads`` value (its worker threads), each on a fresh copy.

Nothing is asserted; the load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
from _support import generator  # noqa: E402

HERE = Path(__file__).resolve().parent


def _partitions(root: Path) -> list[list[str]]:
    return [sorted(str(f) for f in p.glob("*.parquet")) for p in sorted((root / "spans").glob("date=*"))]


def _floor(root: Path, out: Path, *, write: bool, sort: bool) -> int:
    rows = 0
    out.mkdir(parents=True, exist_ok=True)
    for n, files in enumerate(_partitions(root)):
        table = pq.read_table(files, partitioning=None).combine_chunks()
        rows += table.num_rows
        if sort:
            keys = [(c, "ascending", "at_end") for c in ("correlation_id", "trace_id", "start_time", "span_id")]
            table = table.take(pc.sort_indices(table, sort_keys=keys))
        if write:
            pq.write_table(table, out / f"p{n}.parquet", compression="zstd", row_group_size=16_384)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=300_000)
    parser.add_argument("--ids", type=int, default=30_000)
    parser.add_argument("--threads", default="2,1", help="compact's worker threads, one run per value")
    args = parser.parse_args()
    from otel_replay.storage import compact

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        generator().generate(base, spans=args.spans, ids=args.ids, days=2, rows_per_file=5000, seed=7)
        print(f"{args.spans} spans; load average {os.getloadavg()[0]:.2f}")
        _floor(base, Path(tmp) / "warm", write=False, sort=False)  # page cache and pyarrow's thread pool
        for label, kwargs in (
            ("read", {"write": False, "sort": False}),
            ("read + write", {"write": True, "sort": False}),
            ("read + sort + write", {"write": True, "sort": True}),
        ):
            t0 = time.perf_counter()
            rows = _floor(base, Path(tmp) / label.replace(" ", ""), **kwargs)
            print(f"{label:22} {rows / (time.perf_counter() - t0):>10,.0f} spans/s")
        for threads in [int(t) for t in args.threads.split(",")]:
            work = Path(tmp) / f"work{threads}"
            shutil.copytree(base, work)
            t0 = time.perf_counter()
            report = compact(work, grace_seconds=0, threads=threads)
            seconds = time.perf_counter() - t0
            label = f"compact, {threads} thread{'s' if threads > 1 else ''}"
            print(
                f"{label:22} {report.input_rows / seconds:>10,.0f} spans/s "
                f"(peak RSS {report.peak_rss_bytes >> 20} MiB, load {os.getloadavg()[0]:.2f})"
            )
        print(f"load average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
