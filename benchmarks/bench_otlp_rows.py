"""The receiver converter's CPU cost per span: OTLP bytes -> decoded request -> Arrow rows -> Parquet.

Run: python benchmarks/bench_otlp_rows.py [--spans N] [--batch B] [--repeat R] [--rich] [--unique]
         [--before DIR] [--freeze] [--profile]

The spans are the ones ``bench_receiver.py`` sends (SDK spans with three
attributes and one event, batches of 512), encoded once by the SDK's OTLP
encoder. Each phase is timed in CPU seconds of this process (``process_time``,
best of R, phases interleaved), so other jobs on the machine inflate it less than wall time:

  * decode:    ``ExportTraceServiceRequest.ParseFromString`` (upb) alone;
  * convert:   ``request_to_table`` on decoded requests (what the converter adds);
  * floor:     decode + reading each span's ids, times and attribute values
               into plain lists, no JSON, no Arrow (a lower bound for any
               converter that walks upb messages from Python);
  * sdk peer:  ``spans_to_table`` on the same SDK spans (the in-process exporter's conversion);
  * segment:   ``convert_segment`` on a WAL segment of those requests (read,
               decode, convert, write Parquet): the converter process's rate.

``--before DIR`` loads ``DIR/otel_replay/exporters/rows.py`` (e.g. a checkout
of the previous code) beside the current one and times its ``request_to_table``
and its segment conversion (decode, convert, the same ``ChunkWriter``) in the
same run, interleaved. ``--unique`` gives every span its own attribute values
(the default pool of 4,096 spans repeats, as ``bench_receiver.py`` sends it);
``--freeze`` freezes the GC after setup, as the converter process does.

Prints figures; asserts nothing. Target (issue 9): conversion >= 100k spans/s
per converter process.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import importlib.util
import pstats
import shutil
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_replay.exporters.rows import request_to_table, spans_to_table
from otel_replay.storage.convert import ChunkWriter, convert_segment
from otel_replay.storage.wal import read_records


def build_spans(count: int, rich: bool, offset: int = 0) -> list[ReadableSpan]:
    """``bench_receiver``'s spans; ``rich`` adds the attributes a recorded decision carries."""
    keep = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "bench"}))
    provider.add_span_processor(SimpleSpanProcessor(keep))
    tracer = provider.get_tracer("bench")
    for i in range(offset, offset + count):
        attributes: dict[str, Any] = {"step": i, "replay.kind": "read", "model": "m-1"}
        if rich:
            attributes.update(
                {
                    "replay.correlation_id": f"c-{i // 7}",
                    "replay.session_id": f"s-{i // 50}",
                    "replay.record.id": f"r-{i}",
                    "gen_ai.usage.input_tokens": i % 900,
                    "score": i / 7,
                    "ok": i % 3 == 0,
                    "tags": ("a", "b"),
                }
            )
        with tracer.start_as_current_span("agent.step", attributes=attributes) as span:
            span.add_event("tool.call", {"tool": "search"})
    provider.shutdown()
    return list(keep.get_finished_spans())


def floor(payloads: list[bytes]) -> int:
    """Decode and read every field a row needs into lists (no JSON, no Arrow)."""
    n = 0
    for payload in payloads:
        request = ExportTraceServiceRequest.FromString(payload)
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                spans = ss.spans
                ids = [s.trace_id for s in spans]
                sids = [s.span_id for s in spans]
                starts = [s.start_time_unix_nano for s in spans]
                ends = [s.end_time_unix_nano for s in spans]
                names = [s.name for s in spans]
                values = [[kv.value for kv in s.attributes] for s in spans]
                n += len(ids) + len(sids) + len(starts) + len(ends) + len(names) + len(values) - 5 * len(spans)
                n += len(spans)
    return n


def best(fn: Callable[[], Any], repeat: int) -> float:
    """Least CPU seconds of ``repeat`` runs of ``fn``."""
    times = []
    for _ in range(repeat):
        gc.collect()
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return min(times)


def segment_file(payloads: list[bytes], path: Path) -> None:
    """Write ``payloads`` as one WAL segment (the receiver's record framing)."""
    with open(path, "wb") as handle:
        for payload in payloads:
            handle.write(struct.pack("<II", len(payload), zlib.crc32(payload)) + payload)


def load_rows(directory: str) -> ModuleType:
    """``directory``'s ``otel_replay/exporters/rows.py`` as a module beside the current one."""
    path = Path(directory) / "otel_replay" / "exporters" / "rows.py"
    spec = importlib.util.spec_from_file_location("otel_replay.exporters._rows_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def before_segment(module: ModuleType, path: Path, dataset: Path) -> int:
    """The previous ``convert_segment``: decode each record, ``request_to_table``, the same ``ChunkWriter``."""
    writer = ChunkWriter(dataset, "before")
    for payload in read_records(path):
        writer.add(module.request_to_table(ExportTraceServiceRequest.FromString(payload)))
    writer.flush()
    return writer.rows_written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rich", action="store_true", help="ten attributes per span instead of three")
    parser.add_argument("--unique", action="store_true", help="every span distinct (no repeating pool)")
    parser.add_argument("--before", metavar="DIR", help="also time DIR's rows.py, interleaved (the same run)")
    parser.add_argument("--freeze", action="store_true", help="gc.freeze() after setup (as the converter process)")
    parser.add_argument("--profile", action="store_true", help="cProfile the conversion and print the top entries")
    args = parser.parse_args()

    pool = build_spans(args.spans if args.unique else min(args.spans, 4096), args.rich)
    batches = [pool[i : i + args.batch] for i in range(0, len(pool), args.batch)]
    encoded = [encode_spans(b).SerializeToString() for b in batches]
    payloads = [encoded[i % len(encoded)] for i in range(args.spans // args.batch)]
    n = len(payloads) * args.batch
    sdk_batches = [batches[i % len(batches)] for i in range(len(payloads))]
    before = load_rows(args.before) if args.before else None
    if before is not None:  # the same rows, or the comparison means nothing
        for payload in encoded[:4]:
            request = ExportTraceServiceRequest.FromString(payload)
            assert before.request_to_table(request).equals(request_to_table(request))
    print(f"{n} spans in {len(payloads)} requests of {args.batch}; {len(payloads[0]) / args.batch:.0f} bytes/span")
    print(f"python {sys.version.split()[0]}; unique={args.unique} rich={args.rich} freeze={args.freeze}")
    work = Path(tempfile.mkdtemp(prefix="bench-otlp-rows-"))
    segment = work / "seg.wal"
    segment_file(payloads, segment)
    if args.freeze:
        gc.freeze()

    def decoded() -> list[Any]:
        return [ExportTraceServiceRequest.FromString(p) for p in payloads]

    def convert(module: Any) -> Callable[[], None]:
        def run() -> None:
            for request in requests:
                module.request_to_table(request)

        return run

    def one_segment(module: Any) -> Callable[[], None]:
        def run() -> None:
            shutil.rmtree(work / "ds", ignore_errors=True)
            if module is None:
                convert_segment(str(segment), str(work / "ds"), "bench")
            else:
                before_segment(module, segment, work / "ds")

        return run

    requests = decoded()
    if args.profile:
        profile = cProfile.Profile()
        profile.runcall(convert(sys.modules[request_to_table.__module__]))
        pstats.Stats(profile).sort_stats("tottime").print_stats(15)

    times: dict[str, list[float]] = {}
    phases: list[tuple[str, Callable[[], Any]]] = [
        ("decode (upb ParseFromString)", decoded),
        ("convert (request_to_table)", convert(sys.modules[request_to_table.__module__])),
        ("floor: decode + read fields into lists", lambda: floor(payloads)),
        ("sdk peer: spans_to_table", lambda: [spans_to_table(b) for b in sdk_batches]),
        ("segment: read + decode + convert + Parquet", one_segment(None)),
    ]
    if before is not None:
        phases.insert(2, ("  before: convert (request_to_table)", convert(before)))
        phases.append(("  before: segment", one_segment(before)))
    try:
        for _ in range(args.repeat):
            for label, fn in phases:
                times.setdefault(label, []).append(best(fn, 1))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    for label, _ in phases:
        seconds = min(times[label])
        median = sorted(times[label])[len(times[label]) // 2]
        print(
            f"{label:<44}{seconds / n * 1e6:>7.2f} µs/span  {n / seconds:>10,.0f} spans/CPU-s"
            f"  (median {n / median:,.0f})"
        )


if __name__ == "__main__":
    main()
