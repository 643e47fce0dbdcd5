"""Capture cost per decision vs bare OpenTelemetry spans, and exporter throughput into Parquet.

Run: python benchmarks/bench_capture.py [--decisions N] [--spans N] [--drop-spans N] [--drop-file-rows N]
                                        [--capture-only] [--runs N] [--path drop|configure] [--base COMMIT]

Capture: ``audit()`` and the bare spans run alternately, three times each per
run, and each keeps its best; both wall time and CPU time (``process_time``:
every thread, so the span processor's thread counts, and other jobs on the
machine count less) are shown. ``--runs`` repeats that to show the spread;
``--capture-only`` skips the exporter parts. A second peer, ``bare_keep``,
keeps the newest 10 000 decision spans as ``audit()``'s default sink keeps
the newest 10 000 records (a span holds 12 GC-tracked objects, a record 6, so
it overstates what keeping costs); the target stays against ``bare``.

``--path`` says what both sides run through:

* ``drop`` (default): a ``TracerProvider`` built by hand with the SDK's
  default sampler and a ``BatchSpanProcessor`` whose exporter throws the
  spans away, the same for both (ours adds ``CorrelationSpanProcessor``):
  the cost on the caller's side alone.
* ``configure``: the path users run. Ours is ``otel_replay.configure()``
  (its ``RecordSampler``, span processors, write-ahead processor and
  ``ParquetSpanExporter``) then ``audit()``; the bare spans go through a
  provider with the SDK's default sampler and a ``BatchSpanProcessor`` of the
  same ``ParquetSpanExporter`` (same queue size) into a dataset of their own.
  Both are timed up to the end of their pipeline's shutdown, so every span is
  converted and written to Parquet inside the time (``bare_keep`` is not run).

``--base COMMIT``: each run is two fresh processes, this checkout then the
package as of ``COMMIT`` (``git archive``, put first on the path), each
measuring its ``audit()`` against the bare spans in its own process; the
summary gives each tree's ratios and this tree's ``audit()`` CPU against the
base's.

Prints figures; asserts nothing. Targets (issues 2 and 9): capture within 1.3x of bare
OpenTelemetry spans carrying the same attributes; exporter >= 100k spans/s
into Parquet on one core.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

os.environ.setdefault("OTEL_REPLAY_SIGNING_KEY", "benchmark-signing-key-0123456789")

from _support import package_at  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402

import otel_replay  # noqa: E402
from otel_replay import Action, DependencySnapshot, audit  # noqa: E402
from otel_replay import semconv as sc  # noqa: E402
from otel_replay._json import canonical_json  # noqa: E402
from otel_replay.capture.context import CorrelationSpanProcessor  # noqa: E402
from otel_replay.capture.recorder import Recorder, set_recorder  # noqa: E402
from otel_replay.exporters import ParquetSpanExporter, spans_to_table  # noqa: E402
from otel_replay.settings import CAPTURE_QUEUE_SIZE  # noqa: E402


class DropExporter(SpanExporter):
    """Takes batches and throws them away: isolates the caller-side cost."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


STATE = {"budget_remaining": 10_000, "allow_list": ["acme-supplies", "globex"], "policy_id": "ap-7"}
ARGS = {"recipient": "acme-supplies", "invoice": "INV-4471"}


def provider(exporter: SpanExporter, correlation: bool) -> TracerProvider:
    p = TracerProvider(resource=Resource.create({"service.name": "bench"}))
    if correlation:
        p.add_span_processor(CorrelationSpanProcessor())
    p.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=1 << 20, schedule_delay_millis=60_000))
    return p


BASE = "s7-start"
ROOT = Path(__file__).resolve().parent.parent
PATH = "drop"
"""What ``ours``/``bare`` run through: ``drop`` or ``configure`` (see the module docstring; set by ``--path``)."""


def ours(n: int) -> tuple[float, float]:
    if PATH == "configure":
        with tempfile.TemporaryDirectory() as tmp:
            telemetry = otel_replay.configure(os.path.join(tmp, "ours"), service_name="bench", set_global=False)
            start, cpu = time.perf_counter(), time.process_time()
            _decisions(n)
            telemetry.shutdown()  # inside the time: every span converted and written, as for the bare peer
            return time.perf_counter() - start, time.process_time() - cpu
    p = provider(DropExporter(), correlation=True)
    previous = set_recorder(Recorder(p.get_tracer(sc.INSTRUMENTATION_NAME)))
    start, cpu = time.perf_counter(), time.process_time()
    _decisions(n)
    elapsed = time.perf_counter() - start, time.process_time() - cpu
    set_recorder(previous)
    p.shutdown()
    return elapsed


def _decisions(n: int) -> None:
    snapshot = DependencySnapshot(STATE, version="v7")
    for i in range(n):
        with audit("vendor_payment", snapshot=snapshot, correlation_id="c-1", agent_id="ap") as d:
            d.read(invoice=f"INV-{i}")
            d.model("gpt-x", decision_basis="PO match")
            d.act(Action("vendor_payment", ARGS, cost=4200))


def bare(n: int, keep: deque[Any] | None = None) -> tuple[float, float]:
    """The same four spans with the same attributes, made by hand with the OTel API.

    ``keep``: append each finished decision span to it, as ``audit()``'s
    default ``MemorySink`` keeps each record (the fairer peer; see ``bare_keep``).
    """
    if PATH == "configure":
        with tempfile.TemporaryDirectory() as tmp:
            exporter = ParquetSpanExporter(os.path.join(tmp, "bare"))
            p = TracerProvider(resource=Resource.create({"service.name": "bench"}))
            p.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=CAPTURE_QUEUE_SIZE))
            return _bare(p, n, keep)
    return _bare(provider(DropExporter(), correlation=False), n, keep)


def _bare(p: TracerProvider, n: int, keep: deque[Any] | None) -> tuple[float, float]:
    tracer = p.get_tracer("bare")
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(n):
        state = canonical_json(STATE, where="state")
        args = canonical_json(ARGS, where="args")
        inputs = canonical_json({"invoice": f"INV-{i}"}, where="inputs")
        models = canonical_json([{"model_id": "gpt-x", "decision_basis": "PO match", "output": None}], where="m")
        root = tracer.start_span(
            sc.SPAN_DECISION,
            attributes={
                sc.KIND: "decision",
                sc.RECORD_ID: "r" * 32,
                sc.RECORD_SOURCE: "audit",
                sc.DECISION_TYPE: "vendor_payment",
                sc.CORRELATION_ID: "c-1",
                sc.AGENT_ID: "ap",
            },
        )
        ctx = trace.set_span_in_context(root)
        ids = {sc.CORRELATION_ID: "c-1", sc.AGENT_ID: "ap"}
        read = tracer.start_span(
            sc.SPAN_READ,
            context=ctx,
            attributes={**ids, sc.KIND: "read", sc.RECORD_ID: "r" * 32, sc.READ_INPUTS: inputs},
        )
        model = tracer.start_span(
            sc.SPAN_MODEL,
            context=ctx,
            attributes={
                **ids,
                sc.KIND: "model",
                sc.RECORD_ID: "r" * 32,
                sc.GEN_AI_REQUEST_MODEL: "gpt-x",
                sc.MODEL_DECISION_BASIS: "PO match",
            },
        )
        act = tracer.start_span(
            sc.SPAN_ACT,
            context=ctx,
            attributes={
                **ids,
                sc.KIND: "act",
                sc.RECORD_ID: "r" * 32,
                sc.ACTION_TYPE: "vendor_payment",
                sc.ACTION_ARGUMENTS: args,
                sc.ACTION_COST: 4200,
            },
        )
        for child in (read, model, act):
            child.end()
        root.set_attributes(
            {
                sc.DECISION_INPUTS: inputs,
                sc.DECISION_MODELS: models,
                sc.SNAPSHOT_STATE: state,
                sc.SNAPSHOT_VERSION: "v7",
                sc.ACTION_TYPE: "vendor_payment",
                sc.ACTION_ARGUMENTS: args,
                sc.ACTION_COST: 4200,
                sc.RECORD_CHAIN_ID: "c" * 32,
                sc.RECORD_SEQ: i,
                sc.RECORD_PREV_ID: "p" * 32,
                sc.RECORD_PREV_HASH: "0" * 64,
                sc.RECORD_KEY_ID: "k" * 16,
                sc.RECORD_HASH: "h" * 64,
                sc.RECORD_SIGNATURE: "s" * 64,
                sc.RECORD_SPAN: "t" * 32 + "-" + "u" * 16,
            }
        )
        root.end()
        if keep is not None:
            keep.append(root)
    if PATH == "configure":
        p.shutdown()  # inside the time, as ours: every span converted and written
        return time.perf_counter() - start, time.process_time() - cpu
    elapsed = time.perf_counter() - start, time.process_time() - cpu
    p.shutdown()
    return elapsed


def bare_keep(n: int) -> tuple[float, float]:
    """``bare`` that also keeps the newest 10 000 decision spans, as ``audit()``'s default sink keeps records.

    ``audit()`` retains what it made by design (the recorder's ``MemorySink``,
    newest 10 000); ``bare`` frees everything at once. Retained objects cost
    time in the garbage collector and in fresh memory, so this peer pays the
    same kind of cost; ``bare`` stays the target's peer.
    """
    return bare(n, deque(maxlen=10_000))


def make_spans(n: int) -> list[ReadableSpan]:
    """Record n realistic spans (decision trees) in memory, to feed the exporter."""
    keep = InMemorySpanExporter()
    p = TracerProvider(resource=Resource.create({"service.name": "bench"}))
    p.add_span_processor(
        BatchSpanProcessor(keep, max_queue_size=1 << 22, schedule_delay_millis=60_000, max_export_batch_size=1 << 16)
    )
    previous = set_recorder(Recorder(p.get_tracer(sc.INSTRUMENTATION_NAME)))
    snapshot = DependencySnapshot(STATE, version="v7")
    for i in range(n // 4):
        with audit("vendor_payment", snapshot=snapshot, correlation_id=f"c-{i % 97}", agent_id="ap") as d:
            d.read(invoice=f"INV-{i}")
            d.model("gpt-x", decision_basis="PO match")
            d.act(Action("vendor_payment", ARGS, cost=4200))
    set_recorder(previous)
    p.shutdown()
    return list(keep.get_finished_spans())


def capture_run(n: int, repeat: int = 3) -> dict[str, tuple[float, float]]:
    """``ours`` and ``bare`` alternately, ``repeat`` times each: the best wall and CPU seconds of each."""
    peers = (("ours", ours), ("bare", bare), ("bare_keep", bare_keep))
    if PATH == "configure":
        peers = peers[:2]
    times: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in peers}
    for _ in range(repeat):
        for name, fn in peers:
            gc.collect()
            times[name].append(fn(n))
    return {name: (min(w for w, _ in t), min(c for _, c in t)) for name, t in times.items()}


def _worker(n: int) -> dict[str, tuple[float, float]]:
    """One run in this process (its tree is whatever ``otel_replay`` is first on the path)."""
    ours(200), bare(200)  # warm up imports and caches
    if PATH != "configure":
        bare_keep(200)
    return capture_run(n)


def _in_process(tree: Path, n: int) -> dict[str, tuple[float, float]]:
    """A fresh process running ``_worker`` with ``tree``'s package first on its path."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, __file__, "--worker", "--path", PATH, "--decisions", str(n)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"worker for {tree} failed:\n{done.stderr[-2000:]}")
    return {k: tuple(v) for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}  # type: ignore[misc]


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f} (5 min {five:.1f}) on {os.cpu_count()} cores"


def compare_with_base(base: str, n: int, runs: int) -> None:
    """``--base``: each run, this checkout then ``base`` in fresh processes; their ratios, then this against base."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = package_at(base, Path(tmp))
        if tree is None:
            print(f"(no base: git cannot archive {base})")
            return
        trees = {"this": ROOT, "base": tree}
        print(f"capture, path {PATH!r}: {n} decisions (4 spans each); per process, best of 3 alternating; "
              f"this checkout and {base} in alternating fresh processes; start: {_load()}")
        print("  run  tree   audit() wall / CPU us    bare wall / CPU us    ratio wall / CPU")
        ratios: dict[str, list[float]] = {"this": [], "base": []}
        ours_cpu: dict[str, list[float]] = {"this": [], "base": []}
        for run in range(runs):
            for name, path in trees.items():
                r = _in_process(path, n)
                (ow, oc), (bw, bc) = r["ours"], r["bare"]
                ratios[name].append(oc / bc)
                ours_cpu[name].append(oc / n * 1e6)
                print(f"  {run + 1:3d}  {name:5s} {ow / n * 1e6:8.1f} / {oc / n * 1e6:7.1f}    "
                      f"{bw / n * 1e6:8.1f} / {bc / n * 1e6:7.1f}     {ow / bw:5.2f}x / {oc / bc:5.2f}x")
        for name in trees:
            cpus = sorted(ratios[name])
            median = statistics.median(cpus)
            print(f"  {name:5s}: audit()/bare CPU {cpus[0]:.2f}-{cpus[-1]:.2f}x (median {median:.2f}x); "
                  f"audit() {min(ours_cpu[name]):.1f}-{max(ours_cpu[name]):.1f} us/decision CPU")
        pairs = [t / b for t, b in zip(ours_cpu["this"], ours_cpu["base"], strict=True)]
        print(f"  audit() CPU, this / base, run by run: {', '.join(f'{x:.2f}x' for x in pairs)} "
              f"(median {statistics.median(pairs):.2f}x); end: {_load()}")


def exporter_run(batches: list[list[ReadableSpan]] | list[list[None]], fresh: bool) -> dict[str, float]:
    """Export every batch; CPU seconds of conversion (export calls) and of the one Parquet write.

    max_rows and max_bytes above the batch: the only write is the final flush, on this
    thread, so process_time() around it is the write's cost alone.
    ``fresh``: each batch is recorded right before it is exported (as the
    BatchSpanProcessor hands over spans that just ended); otherwise all spans
    were recorded first and are cold in the CPU caches.
    """
    n = sum(map(len, batches))
    with tempfile.TemporaryDirectory() as tmp:
        exporter = ParquetSpanExporter(tmp, max_rows=n + 1, max_bytes=2**62, max_age_seconds=3600)
        convert = 0.0
        wall = 0.0
        for batch in batches:
            if fresh:
                batch = make_spans(len(batch))  # noqa: PLW2901
            cpu, w = time.process_time(), time.perf_counter()
            exporter.export(batch)
            convert += time.process_time() - cpu
            wall += time.perf_counter() - w
        cpu, w = time.process_time(), time.perf_counter()
        exporter.force_flush()
        write = time.process_time() - cpu
        wall += time.perf_counter() - w
        exporter.shutdown()
        with otel_replay.open(tmp) as store:
            counted = store.rows("SELECT count(*) AS n FROM spans")[0]["n"]
        size = sum(f.stat().st_size for f in Path(tmp, "spans").rglob("*.parquet"))
    return {"convert": convert, "write": write, "wall": wall, "bytes": size, "read_back": counted}


def pyarrow_floor(batches: list[list[ReadableSpan]]) -> float:
    """CPU seconds for pyarrow alone to write the same rows (already Arrow) as one zstd Parquet file."""
    table = pa.concat_tables([spans_to_table(b) for b in batches]).drop_columns(["date"])
    with tempfile.TemporaryDirectory() as tmp:
        cpu = time.process_time()
        pq.write_table(table, os.path.join(tmp, "floor.parquet"), compression="zstd")
        return time.process_time() - cpu


def slow_flush_drops(spans: int, max_rows: int) -> dict[str, int]:
    """Issue 9's case: large files, SDK defaults, a steady stream of spans; what was lost, and whether it was counted.

    The stream is paced (bursts of 500, then 10 ms) so that converting keeps up
    on average: a span lost here was lost because export() waited for a write.
    """
    lost = {"queue_full": 0}

    class Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "Queue full" in record.getMessage():
                lost["queue_full"] += 1

    handler = Count()
    logging.getLogger("opentelemetry").addHandler(handler)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            exporter = ParquetSpanExporter(tmp, max_rows=max_rows, max_age_seconds=3600)
            p = TracerProvider(resource=Resource.create({"service.name": "bench"}))
            p.add_span_processor(BatchSpanProcessor(exporter))  # SDK defaults: queue 2048, batch 512
            tracer = p.get_tracer("bench")
            for i in range(spans):
                tracer.start_span("s", attributes={"i": i, "replay.correlation_id": f"c-{i % 97}"}).end()
                if i % 500 == 499:
                    time.sleep(0.01)  # paced below the exporter's rate: only a stalled export can lose spans
            p.shutdown()
            with otel_replay.open(tmp) as store:
                stored = store.rows("SELECT count(*) AS n FROM spans")[0]["n"]
            return {
                "stored": stored,
                "sdk_queue_full_logged": lost["queue_full"],
                "exporter_rows_dropped": exporter.stats.rows_dropped,
                "files": exporter.stats.files_written,
            }
    finally:
        logging.getLogger("opentelemetry").removeHandler(handler)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=5_000)
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--drop-spans", type=int, default=200_000)
    parser.add_argument("--drop-file-rows", type=int, default=120_000)
    parser.add_argument("--capture-only", action="store_true", help="skip the exporter and slow-flush parts")
    parser.add_argument("--runs", type=int, default=1, help="repeat the capture comparison this many times")
    parser.add_argument("--path", choices=("drop", "configure"), default="drop",
                        help="what both sides run through (see the module docstring)")
    parser.add_argument("--base", help="also measure the package as of this git revision (e.g. s7-start), "
                        "in alternating fresh processes")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    global PATH
    PATH = opts.path
    if opts.worker:
        print(json.dumps(_worker(opts.decisions)))
        return 0
    if opts.base:
        compare_with_base(opts.base, opts.decisions, opts.runs)
        return 0
    if PATH == "configure":
        ours(200), bare(200)  # warm up imports and caches
        for run in range(opts.runs):
            r = capture_run(opts.decisions)
            (ow, oc), (bw, bc) = r["ours"], r["bare"]
            n = opts.decisions
            print(f"  {run + 1:3d}  configure() + audit() {ow / n * 1e6:7.1f} / {oc / n * 1e6:7.1f} us   "
                  f"bare + ParquetSpanExporter {bw / n * 1e6:7.1f} / {bc / n * 1e6:7.1f} us   "
                  f"{ow / bw:5.2f}x / {oc / bc:5.2f}x wall / CPU")
        return 0

    ours(200), bare(200), bare_keep(200)  # warm up imports and caches
    n = opts.decisions
    print(f"capture: {n} decisions (4 spans each); per run, best of 3 alternating; us/decision")
    print("  run   audit() wall / CPU    bare spans wall / CPU    ratio wall / CPU   (target <= 1.30x)"
          "   | bare spans kept (newest 10k) wall / CPU   ratio CPU")
    ratios: list[tuple[float, float]] = []
    keep_ratios: list[float] = []
    for run in range(opts.runs):
        r = capture_run(n)
        (ow, oc), (bw, bc) = r["ours"], r["bare"]
        kw, kc = r["bare_keep"]
        ratios.append((ow / bw, oc / bc))
        keep_ratios.append(oc / kc)
        us = [t / n * 1e6 for t in (ow, oc, bw, bc, kw, kc)]
        print(f"  {run + 1:3d}   {us[0]:7.1f} / {us[1]:7.1f}      {us[2]:7.1f} / {us[3]:7.1f}"
              f"        {ow / bw:5.2f}x / {oc / bc:5.2f}x"
              f"    |       {us[4]:7.1f} / {us[5]:7.1f}             {oc / kc:5.2f}x")
    if opts.runs > 1:
        walls, cpus = sorted(w for w, _ in ratios), sorted(c for _, c in ratios)
        mw, mc = statistics.median(walls), statistics.median(cpus)
        print(f"  ratio over {opts.runs} runs: wall {walls[0]:.2f}-{walls[-1]:.2f}x (median {mw:.2f}x), "
              f"CPU {cpus[0]:.2f}-{cpus[-1]:.2f}x (median {mc:.2f}x); against the kept bare spans CPU "
              f"{min(keep_ratios):.2f}-{max(keep_ratios):.2f}x (median {statistics.median(keep_ratios):.2f}x)")
    if opts.capture_only:
        return 0

    spans = make_spans(opts.spans)
    batches = [spans[i : i + 512] for i in range(0, len(spans), 512)]
    n = len(spans)
    gc.collect()
    cpu = time.process_time()
    for batch in batches:
        encode_spans(batch)
    t_encode = time.process_time() - cpu
    t_floor = pyarrow_floor(batches)
    cold = exporter_run(batches, fresh=False)
    sizes = [[None] * len(b) for b in batches]  # only the sizes: the cold spans must not stay alive for the GC
    del spans, batches
    gc.collect()
    warm = exporter_run(sizes, fresh=True)
    print(f"exporter: {n} spans in batches of 512, one thread; CPU seconds (process_time), so other load on the "
          "machine does not count")
    for label, run in (("cold", cold), ("fresh", warm)):
        total = run["convert"] + run["write"]
        print(f"  ParquetSpanExporter ({label:5s}): {n / total:10,.0f} spans/CPU-s  "
              f"(convert {run['convert'] / n * 1e6:.2f} us/span, write {run['write'] / n * 1e6:.2f} us/span; "
              f"{n / run['wall']:,.0f} spans/s wall; {run['bytes'] / n:.0f} bytes/span; "
              f"{run['read_back']} rows read back)  target >= 100,000")
    print(f"  floor: pyarrow write alone:   {n / t_floor:10,.0f} spans/CPU-s")
    print(f"  peer: SDK OTLP encode_spans:  {n / t_encode:10,.0f} spans/CPU-s  (protobuf encoding alone)")
    fresh_rate = n / (warm["convert"] + warm["write"])
    print(f"  ratios: exporter(fresh) / floor = {fresh_rate / (n / t_floor):.2f}x, "
          f"exporter(fresh) / OTLP encode = {fresh_rate / (n / t_encode):.2f}x")
    drops = slow_flush_drops(opts.drop_spans, opts.drop_file_rows)
    print(f"slow flush: {opts.drop_spans} spans through a BatchSpanProcessor with SDK defaults, "
          f"files of {opts.drop_file_rows} rows, age 3600 s")
    print(f"  stored {drops['stored']} in {drops['files']} file(s); SDK 'Queue full' drops logged: "
          f"{drops['sdk_queue_full_logged']}; exporter rows_dropped: {drops['exporter_rows_dropped']}; "
          f"unaccounted: {opts.drop_spans - drops['stored'] - drops['exporter_rows_dropped']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
