"""Lookups while new spans arrive after a compaction: does the uncompacted tail slow a chain down?

Usage: python benchmarks/bench_fresh.py [--spans 1000000] [--ids 100000] [--workdir DIR]
           [--tails 0,12,60,240] [--rows-per-file 1000] [--lookups 20]

Issue 9 asks that "uncompacted newest files never make a lookup more than 2×
slower". This benchmark generates a dataset (benchmarks/gen_dataset.py),
compacts it (side index included), then appends arrival-order files of new
trade chains in the same days, as an exporter with 5-second files would
between two background compactions (12 files: one minute; 240: twenty
minutes), and after each step times the trade chain of 20 random ids through
``Store.run_for`` on one warm Store (median; the first lookup after new files
appear is discarded): ids whose rows are all compacted, and ids whose rows are
all in the new files. The ratio against the same lookups with no tail is the
figure the target is about. The chains' rows are checked equal to a plain
``Store.run`` over every file at the largest tail.

Figures are printed; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gen_dataset import _BASE_NS, _SECOND, _chain, generate  # noqa: E402

from otel_replay.exporters.rows import RowBuilder  # noqa: E402
from otel_replay.exporters.writer import DatasetWriter  # noqa: E402
from otel_replay.query.store import Store  # noqa: E402
from otel_replay.storage import compact, live_files  # noqa: E402


def _append_tail(dataset: Path, first_id: int, files: int, rows_per_file: int, days: int, seed: int) -> list[str]:
    """Write ``files`` arrival files of new chains (ids from ``first_id``); the new correlation ids."""
    rng = random.Random(seed)
    writer = DatasetWriter(dataset, max_rows=rows_per_file, max_age_seconds=86_400)
    ids: list[str] = []
    index = first_id
    try:
        for _ in range(files):
            builder = RowBuilder()
            rows = 0
            while rows < rows_per_file:
                start = _BASE_NS + rng.randrange(days * 86_400) * _SECOND
                for kwargs in _chain(rng, index, start, 10):
                    builder.add(**{**kwargs, "attributes": dict(kwargs["attributes"])})
                    rows += 1
                ids.append(f"trade-{index:09d}")
                index += 1
            writer.append(builder.table())
            writer.flush()
    finally:
        writer.close()
    return ids


def _median_ms(store: Store, ids: list[str]) -> float:
    def one(cid: str) -> int:
        return len(store.run_for("chains/trade", {"correlation_id": cid}, chain_id=cid, chain_limit=101))

    one(ids[0])  # the first lookup after the files changed pays for noticing them
    samples = []
    for cid in ids:
        t0 = time.perf_counter()
        one(cid)
        samples.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(samples), 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--ids", type=int, default=100_000)
    parser.add_argument("--days", type=int, default=4)
    parser.add_argument("--tails", default="0,12,60,240", help="cumulative new-file counts to measure at")
    parser.add_argument("--rows-per-file", type=int, default=1000)
    parser.add_argument("--lookups", type=int, default=20)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--from-dataset", type=Path, help="copy this uncompacted dataset instead of generating one")
    ns = parser.parse_args(argv)
    tails = sorted({int(x) for x in ns.tails.split(",")})
    if not tails or tails[0] < 0:
        parser.error("--tails: comma-separated counts >= 0")
    workdir = ns.workdir or Path(tempfile.mkdtemp(prefix="otel-replay-fresh-"))
    dataset = workdir / "dataset"
    shutil.rmtree(dataset, ignore_errors=True)
    results: dict[str, Any] = {"spans": ns.spans, "ids": ns.ids, "cpus": os.cpu_count(), "load": os.getloadavg()[0]}
    try:
        if ns.from_dataset:
            shutil.copytree(ns.from_dataset, dataset)
        else:
            print(f"generating {ns.spans:,} spans ...", file=sys.stderr)
            generate(dataset, spans=ns.spans, ids=ns.ids, days=ns.days)
        print("compacting ...", file=sys.stderr)
        compact(dataset, grace_seconds=0)
        rng = random.Random(20)
        old_ids = [f"trade-{rng.randrange(ns.ids):09d}" for _ in range(ns.lookups)]
        new_ids: list[str] = []
        written = 0
        rows: list[dict[str, Any]] = []
        with Store(dataset) as store:
            for tail in tails:
                if tail > written:
                    new_ids += _append_tail(
                        dataset, ns.ids + len(new_ids), tail - written, ns.rows_per_file, ns.days, tail
                    )
                    written = tail
                    store.refresh()
                sample = random.Random(tail).sample(new_ids, min(ns.lookups, len(new_ids))) if new_ids else []
                row: dict[str, Any] = {
                    "new_files": tail,
                    "live_files": len(live_files(dataset)),
                    "chain_ms_compacted_ids": _median_ms(store, old_ids),
                }
                if sample:
                    row["chain_ms_new_ids"] = _median_ms(store, sample)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
            check = old_ids[:5] + new_ids[-5:]
            results["same_rows_as_full_scan"] = all(
                store.run_for("chains/trade", {"correlation_id": c}, chain_id=c, chain_limit=101)
                == store.run("chains/trade", chain_id=c, chain_limit=101)
                for c in check
            )
        base = rows[0]["chain_ms_compacted_ids"]
        for row in rows:
            row["slowdown_vs_no_tail"] = round(row["chain_ms_compacted_ids"] / base, 2) if base else None
        results["steps"] = rows
    finally:
        if ns.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            shutil.rmtree(dataset, ignore_errors=True)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
