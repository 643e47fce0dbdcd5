"""Capture cost per decision vs bare OpenTelemetry spans, and exporter throughput into Parquet.

Run: python benchmarks/bench_capture.py [--decisions N] [--spans N]

Prints figures; asserts nothing. Targets (issue 2): capture within 1.3x of bare
OpenTelemetry spans carrying the same attributes; exporter >= 100k spans/s
into Parquet on one core.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from collections.abc import Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

os.environ.setdefault("OTEL_REPLAY_SIGNING_KEY", "benchmark-signing-key-0123456789")

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402

import otel_replay  # noqa: E402
from otel_replay import Action, DependencySnapshot, audit  # noqa: E402
from otel_replay import semconv as sc  # noqa: E402
from otel_replay._json import canonical_json  # noqa: E402
from otel_replay.capture.context import CorrelationSpanProcessor  # noqa: E402
from otel_replay.capture.recorder import Recorder, set_recorder  # noqa: E402
from otel_replay.exporters import ParquetSpanExporter  # noqa: E402


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


def ours(n: int) -> float:
    p = provider(DropExporter(), correlation=True)
    previous = set_recorder(Recorder(p.get_tracer(sc.INSTRUMENTATION_NAME)))
    snapshot = DependencySnapshot(STATE, version="v7")
    start = time.perf_counter()
    for i in range(n):
        with audit("vendor_payment", snapshot=snapshot, correlation_id="c-1", agent_id="ap") as d:
            d.read(invoice=f"INV-{i}")
            d.model("gpt-x", decision_basis="PO match")
            d.act(Action("vendor_payment", ARGS, cost=4200))
    elapsed = time.perf_counter() - start
    set_recorder(previous)
    p.shutdown()
    return elapsed


def bare(n: int) -> float:
    """The same four spans with the same attributes, made by hand with the OTel API."""
    p = provider(DropExporter(), correlation=False)
    tracer = p.get_tracer("bare")
    from opentelemetry import trace

    start = time.perf_counter()
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
            }
        )
        root.end()
    elapsed = time.perf_counter() - start
    p.shutdown()
    return elapsed


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


def best(fn, *args, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        times.append(fn(*args))
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=5_000)
    parser.add_argument("--spans", type=int, default=200_000)
    opts = parser.parse_args()

    ours(200), bare(200)  # warm up imports and caches
    t_ours = best(ours, opts.decisions)
    t_bare = best(bare, opts.decisions)
    per_ours = t_ours / opts.decisions * 1e6
    per_bare = t_bare / opts.decisions * 1e6
    print(f"capture: {opts.decisions} decisions (4 spans each), best of 3")
    print(f"  otel-replay audit():          {per_ours:8.1f} us/decision")
    print(f"  bare OTel spans, same attrs:  {per_bare:8.1f} us/decision")
    print(f"  ratio: {per_ours / per_bare:.2f}x  (target <= 1.30x)")

    spans = make_spans(opts.spans)
    batches = [spans[i : i + 512] for i in range(0, len(spans), 512)]
    gc.collect()
    start = time.perf_counter()
    for batch in batches:
        encode_spans(batch)
    t_encode = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        exporter = ParquetSpanExporter(tmp, max_age_seconds=3600)
        gc.collect()
        cpu_start, wall_start = time.process_time(), time.perf_counter()
        for batch in batches:
            exporter.export(batch)
        exporter.shutdown()
        wall = time.perf_counter() - wall_start
        cpu = time.process_time() - cpu_start
        files = sum(1 for _ in os.scandir(next(os.scandir(os.path.join(tmp, "spans"))).path))
        size = sum(e.stat().st_size for e in os.scandir(next(os.scandir(os.path.join(tmp, "spans"))).path))
        with otel_replay.open(tmp) as store:
            counted = store.rows("SELECT count(*) AS n FROM spans")[0]["n"]
    n = len(spans)
    print(f"exporter: {n} spans in batches of 512 -> {files} Parquet file(s), {size / n:.0f} bytes/span, "
          f"{counted} rows read back")
    print(f"  ParquetSpanExporter:          {n / wall:10,.0f} spans/s wall, {n / cpu:10,.0f} spans/s per CPU-second"
          "  (target >= 100,000)")
    print(f"  peer: SDK OTLP encode_spans:  {n / t_encode:10,.0f} spans/s"
          "  (protobuf encoding alone, what the SDK's OTLP exporter does per batch)")
    print(f"  ratio: exporter / peer = {(n / wall) / (n / t_encode):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
