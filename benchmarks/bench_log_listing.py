"""What listing ``logs/`` costs a store on an object store, and what a store that never reads logs saves.

Usage: python benchmarks/bench_log_listing.py [--dates 30] [--files-per-date 20] [--rounds 5]

Starts moto in server mode on a free loopback port (never the internet),
uploads a small span dataset (benchmarks/gen_dataset.py) and ``dates`` x
``files-per-date`` small log record files (the receiver's LogWriter) to
``s3://bench/ds``, then times, in the same run, alternating three times:

- spans only: ``Store`` opened, then ``rounds`` x (a span query, ``refresh()``);
- with logs: the same after one ``log_records`` query, so every refresh lists
  ``logs/`` (its partitions, manifests and files) as well.

The log views list ``logs/`` only once a query names them; the second figure
is what every store paid before. moto answers over HTTP on loopback: the
figures measure the client path, not a real object store. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _support import generator, local_s3  # noqa: E402
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

DAY_NS = 86_400 * 10**9
JAN_1_NS = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z


def _logs(day: int, start: int, count: int) -> bytes:
    request = ExportLogsServiceRequest()
    records = request.resource_logs.add().scope_logs.add().log_records
    for i in range(start, start + count):
        record = records.add(time_unix_nano=JAN_1_NS + day * DAY_NS + i)
        record.body.string_value = f"line {i}"
    return request.SerializeToString()


def _timed(uri: str, rounds: int, *, with_logs: bool) -> float:
    from otel_replay.query.store import Store

    t0 = time.perf_counter()
    with Store(uri) as store:
        if with_logs:
            store.rows("SELECT count(*) FROM log_records")
        for _ in range(rounds):
            store.rows("SELECT count(*) FROM spans")
            store.refresh()
    return time.perf_counter() - t0


def main() -> None:
    """Build the dataset, time both ways alternately, print the figures and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dates", type=int, default=30)
    parser.add_argument("--files-per-date", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with local_s3():
        import boto3

        from otel_replay.storage.logs import LogWriter

        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="bench")
        local = Path(tempfile.mkdtemp()) / "ds"
        generator().generate(local, spans=2000, ids=200, days=2, rows_per_file=500, duplicates=0.0, seed=3)
        writer = LogWriter(local, "bench", chunk_rows=2)
        for day in range(args.dates):
            for n in range(args.files_per_date):
                writer.add_payload(_logs(day, 2 * n, 2))
        writer.flush()
        files = sorted(local.rglob("*.parquet"))
        for path in files:
            s3.upload_file(str(path), "bench", f"ds/{path.relative_to(local).as_posix()}")
        print(f"{len(files)} objects, {len(writer.paths)} of them log record files")
        uri = "s3://bench/ds"
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(3):
            for with_logs in (False, True):
                times[with_logs].append(_timed(uri, args.rounds, with_logs=with_logs))
        spans_only, with_logs = min(times[False]), min(times[True])
        print(f"spans only: {spans_only:.2f} s (runs {', '.join(f'{t:.2f}' for t in times[False])})")
        print(f"with logs:  {with_logs:.2f} s (runs {', '.join(f'{t:.2f}' for t in times[True])})")
        print(f"ratio: {with_logs / spans_only:.2f}x")


if __name__ == "__main__":
    main()
