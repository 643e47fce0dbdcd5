"""Capture cost per decision vs bare OpenTelemetry spans, and exporter throughput into Parquet.

Run: python benchmarks/bench_capture.py [--decisions N] [--spans N] [--drop-spans N] [--drop-file-rows N]
                                        [--capture-only] [--runs N] [--rounds N] [--no-freeze]
                                        [--path drop|configure] [--base COMMIT]

Capture: ``audit()`` and the bare spans run in interleaved rounds in one
process (``--rounds``, default 7; the order flips every round, so neither side
always runs first). The figure is the **ratio of the bests**: ``audit()``'s
best round over the bare spans' best round (other jobs on the machine only
ever add CPU time, so each side's least is its cost with the least
interference); beside it the median of the per-round ratios with its
spread. CPU time is ``process_time`` (every thread, so the span
processor's thread counts, and other jobs on the machine count less); wall
time is shown too. ``--runs`` repeats that to show the spread between
processes; ``--capture-only`` skips the exporter parts.

Each timed block starts from the same collector state, the same for both
sides: just before its clock starts, everything alive is collected and then
frozen (``gc.unfreeze(); gc.collect(); gc.freeze()``), so a block's
collections walk only what that block made and kept (``audit()``'s kept
records included), never the imported modules, and no block inherits a
half-full generation or a pending full collection from the one before. Without
this, whether a full collection over the whole heap (10-20 ms, 3-7 us per
decision at 3,000 decisions) fell inside a block depended on the process's
history: one reason the bare side moved between processes (the other, larger
on a shared machine, is other jobs, which the bests and the interleaving
answer).
``--no-freeze`` keeps the collect but not the freeze (a full collection then
walks the whole heap, as in an application with a large one: ``audit()``'s
kept records make it run more often). Child processes get
``PYTHONHASHSEED=0`` (unless set), so dict and set layouts do not differ
between them. A second peer, ``bare_keep``,
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
measuring its ``audit()`` against the bare spans in its own process (the same
rounds); the summary gives each tree's median ratios and this tree's
``audit()`` CPU against the base's.

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
FREEZE = True
"""Freeze what is alive before each timed block (see the module docstring; ``--no-freeze`` clears it)."""


def _clock() -> tuple[float, float, float]:
    """Wall, process CPU (every thread) and this thread's CPU, in seconds."""
    return time.perf_counter(), time.process_time(), time.thread_time()


def _since(start: tuple[float, float, float]) -> tuple[float, float, float]:
    """Wall, process CPU and caller-thread CPU seconds since ``start`` (from :func:`_clock`)."""
    now = _clock()
    return now[0] - start[0], now[1] - start[1], now[2] - start[2]


def _settle() -> None:
    """Right before a block's clock starts: the same collector state for every block, whichever side it is."""
    gc.unfreeze()  # what the previous block froze is collectable again
    gc.collect()
    if FREEZE:
        gc.freeze()  # the collections inside the block walk only what the block makes


def ours(n: int) -> tuple[float, ...]:
    if PATH == "configure":
        with tempfile.TemporaryDirectory() as tmp:
            telemetry = otel_replay.configure(os.path.join(tmp, "ours"), service_name="bench", set_global=False)
            _settle()
            start = _clock()
            _decisions(n)
            telemetry.shutdown()  # inside the time: every span converted and written, as for the bare peer
            return _since(start)
    p = provider(DropExporter(), correlation=True)
    previous = set_recorder(Recorder(p.get_tracer(sc.INSTRUMENTATION_NAME)))
    _settle()
    start = _clock()
    _decisions(n)
    elapsed = _since(start)
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


def bare(n: int, keep: deque[Any] | None = None) -> tuple[float, ...]:
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


def _bare(p: TracerProvider, n: int, keep: deque[Any] | None) -> tuple[float, ...]:
    tracer = p.get_tracer("bare")
    _settle()
    start = _clock()
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
        return _since(start)
    elapsed = _since(start)
    p.shutdown()
    return elapsed


def bare_keep(n: int) -> tuple[float, ...]:
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


ROUNDS = 7
"""Interleaved rounds per process (``--rounds``)."""


def capture_run(n: int, rounds: int | None = None) -> dict[str, list[tuple[float, ...]]]:
    """``ours`` and ``bare`` (and ``bare_keep`` on the drop path) in ``rounds`` interleaved rounds.

    The order rotates every round, so no side always runs first or right
    after the same peer. Each peer's (wall, CPU) seconds, round by round.
    """
    peers = [("ours", ours), ("bare", bare), ("bare_keep", bare_keep)]
    if PATH == "configure":
        peers = peers[:2]
    times: dict[str, list[tuple[float, ...]]] = {name: [] for name, _ in peers}
    for r in range(rounds or ROUNDS):
        shift = r % len(peers)
        order = peers[shift:] + peers[:shift]
        if r % 2:
            order.reverse()
        for name, fn in order:
            times[name].append(fn(n))
    return times


def _ratios(times: dict[str, list[tuple[float, ...]]], peer: str = "bare", i: int = 1) -> list[float]:
    """``ours`` over ``peer``, round by round: ``i`` 0 wall, 1 process CPU, 2 the caller's thread's CPU."""
    return [o[i] / b[i] for o, b in zip(times["ours"], times[peer], strict=True)]


def _spread(values: list[float]) -> str:
    """``median (quartiles q1-q3, range lo-hi)`` of ``values``."""
    v = sorted(values)
    q1, _, q3 = statistics.quantiles(v, n=4, method="inclusive") if len(v) > 1 else (v[0], v[0], v[0])
    return f"{statistics.median(v):.3f}x (quartiles {q1:.3f}-{q3:.3f}, range {v[0]:.3f}-{v[-1]:.3f})"


def _best(times: dict[str, list[tuple[float, ...]]], peer: str = "bare", i: int = 1) -> float:
    """``ours``' best round over ``peer``'s best round (other jobs on the machine only ever add time)."""
    return min(t[i] for t in times["ours"]) / min(t[i] for t in times[peer])


def _us(times: list[tuple[float, ...]], n: int, i: int = 1) -> float:
    """The median of a peer's rounds, in us per decision (``i`` as for :func:`_ratios`)."""
    return statistics.median(t[i] for t in times) / n * 1e6


def _worker(n: int) -> dict[str, list[tuple[float, ...]]]:
    """One run in this process (its tree is whatever ``otel_replay`` is first on the path)."""
    ours(200), bare(200)  # warm up imports and caches
    if PATH != "configure":
        bare_keep(200)
    return capture_run(n)


def _in_process(tree: Path, n: int) -> dict[str, list[tuple[float, ...]]]:
    """A fresh process running ``_worker`` with ``tree``'s package first on its path."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.setdefault("PYTHONHASHSEED", "0")  # the same dict and set layouts in every child
    argv = [sys.executable, __file__, "--worker", "--path", PATH, "--decisions", str(n), "--rounds", str(ROUNDS)]
    if not FREEZE:
        argv.append("--no-freeze")
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"worker for {tree} failed:\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {k: [tuple(t) for t in v] for k, v in result.items()}


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
        print(f"capture, path {PATH!r}: {n} decisions (4 spans each); per process {ROUNDS} interleaved rounds, "
              f"collector {'frozen' if FREEZE else 'collected'} before each block; this checkout and {base} in "
              f"alternating fresh processes; start: {_load()}")
        print("  run  tree   best audit() / bare CPU us   ratio of the bests   median of the rounds' ratios (spread)")
        bests: dict[str, list[float]] = {"this": [], "base": []}
        medians: dict[str, list[float]] = {"this": [], "base": []}
        ours_cpu: dict[str, list[float]] = {"this": [], "base": []}
        for run in range(runs):
            for name, path in trees.items():
                r = _in_process(path, n)
                per_round = _ratios(r)
                bests[name].append(_best(r))
                medians[name].append(statistics.median(per_round))
                ours_cpu[name].append(min(t[1] for t in r["ours"]) / n * 1e6)
                bare_us = min(t[1] for t in r["bare"]) / n * 1e6
                print(f"  {run + 1:3d}  {name:5s} {ours_cpu[name][-1]:9.1f} / {bare_us:7.1f}   {_best(r):7.3f}x   "
                      f"{_spread(per_round)}; caller's thread {_best(r, i=2):.3f}x")
        for name in trees:
            b, m = sorted(bests[name]), sorted(medians[name])
            print(f"  {name:5s}: audit()/bare CPU, ratio of the bests {b[0]:.3f}-{b[-1]:.3f}x (median "
                  f"{statistics.median(b):.3f}x), median of the rounds {m[0]:.3f}-{m[-1]:.3f}x (median "
                  f"{statistics.median(m):.3f}x); best audit() {min(ours_cpu[name]):.1f}-{max(ours_cpu[name]):.1f} "
                  "us/decision CPU")
        pairs = [t / b for t, b in zip(ours_cpu["this"], ours_cpu["base"], strict=True)]
        print(f"  best audit() CPU, this / base, run by run: {', '.join(f'{x:.3f}x' for x in pairs)} "
              f"(median {statistics.median(pairs):.3f}x); end: {_load()}")


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
    global PATH, ROUNDS, FREEZE
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
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved rounds per process (default 7)")
    parser.add_argument("--no-freeze", action="store_true",
                        help="collect, but do not freeze, what is alive before each timed block")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    PATH, ROUNDS, FREEZE = opts.path, opts.rounds, not opts.no_freeze
    if opts.worker:
        print(json.dumps(_worker(opts.decisions)))
        return 0
    if opts.base:
        compare_with_base(opts.base, opts.decisions, opts.runs)
        return 0
    n = opts.decisions
    ours(200), bare(200)  # warm up imports and caches
    if PATH != "configure":
        bare_keep(200)
    print(f"capture, path {PATH!r}: {n} decisions (4 spans each); {ROUNDS} interleaved rounds per run, collector "
          f"{'frozen' if FREEZE else 'collected'} before each block; us/decision, medians of the rounds; {_load()}")
    bests: list[float] = []
    for run in range(opts.runs):
        r = capture_run(n)
        per_round = _ratios(r)
        bests.append(_best(r))
        line = (f"  {run + 1:3d}  audit() {_us(r['ours'], n, 0):7.1f} / {_us(r['ours'], n):7.1f}   "
                f"bare {_us(r['bare'], n, 0):7.1f} / {_us(r['bare'], n):7.1f} wall / CPU   "
                f"audit()/bare CPU: ratio of the bests {_best(r):.3f}x, median of the rounds {_spread(per_round)}; "
                f"caller's thread {_best(r, i=2):.3f}x")
        if "bare_keep" in r:
            line += f"; against the kept bare spans {_best(r, 'bare_keep'):.3f}x"
        print(line + "   (target <= 1.30x)")
    if opts.runs > 1:
        print(f"  the runs' ratios of the bests: {', '.join(f'{m:.3f}x' for m in bests)}")
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
