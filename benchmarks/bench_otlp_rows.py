"""The receiver converter's CPU cost per span: OTLP bytes -> decoded request -> Arrow rows -> Parquet.

Run: python benchmarks/bench_otlp_rows.py [--spans N] [--batch B] [--repeat R] [--profile]

The spans are the ones ``bench_receiver.py`` sends (SDK spans with three
attributes and one event, batches of 512), encoded once by the SDK's OTLP
encoder. Each phase is timed in CPU seconds of this process (``process_time``,
best of R), so other jobs on the machine inflate it less than wall time:

  * decode:    ``ExportTraceServiceRequest.ParseFromString`` (upb) alone;
  * convert:   ``request_to_table`` on decoded requests (what the converter adds);
  * floor:     decode + reading each span's ids, times and attribute values
               into plain lists, no JSON, no Arrow (a lower bound for any
               converter that walks upb messages from Python);
  * sdk peer:  ``spans_to_table`` on the same SDK spans (the in-process exporter's conversion);
  * segment:   ``convert_segment`` on a WAL segment of those requests (read,
               decode, convert, write Parquet): the converter process's rate.

Prints figures; asserts nothing. Target (issue 9): conversion >= 100k spans/s
per converter process.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import shutil
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_replay.exporters.rows import request_to_table, spans_to_table
from otel_replay.server.convert import convert_segment


def build_spans(count: int, rich: bool) -> list[ReadableSpan]:
    """``bench_receiver``'s spans; ``rich`` adds the attributes a recorded decision carries."""
    keep = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "bench"}))
    provider.add_span_processor(SimpleSpanProcessor(keep))
    tracer = provider.get_tracer("bench")
    for i in range(count):
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rich", action="store_true", help="ten attributes per span instead of three")
    parser.add_argument("--profile", action="store_true", help="cProfile the conversion and print the top entries")
    args = parser.parse_args()

    pool = build_spans(min(args.spans, 4096), args.rich)
    batches = [pool[i : i + args.batch] for i in range(0, len(pool), args.batch)]
    encoded = [encode_spans(b).SerializeToString() for b in batches]
    payloads = [encoded[i % len(encoded)] for i in range(args.spans // args.batch)]
    n = len(payloads) * args.batch
    requests = [ExportTraceServiceRequest.FromString(p) for p in payloads]
    sdk_batches = [batches[i % len(batches)] for i in range(len(payloads))]
    print(f"{n} spans in {len(payloads)} requests of {args.batch}; {len(payloads[0]) / args.batch:.0f} bytes/span")
    print(f"python {sys.version.split()[0]}")

    def convert() -> None:
        for request in requests:
            request_to_table(request)

    if args.profile:
        profile = cProfile.Profile()
        profile.runcall(convert)
        pstats.Stats(profile).sort_stats("tottime").print_stats(15)

    t_decode = best(lambda: [ExportTraceServiceRequest.FromString(p) for p in payloads], args.repeat)
    t_convert = best(convert, args.repeat)
    t_floor = best(lambda: floor(payloads), args.repeat)
    t_sdk = best(lambda: [spans_to_table(b) for b in sdk_batches], args.repeat)
    work = Path(tempfile.mkdtemp(prefix="bench-otlp-rows-"))
    try:
        segment_file(payloads, work / "seg.wal")

        def one_segment() -> None:
            shutil.rmtree(work / "ds", ignore_errors=True)
            convert_segment(str(work / "seg.wal"), str(work / "ds"), "bench")

        t_segment = best(one_segment, args.repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def line(label: str, seconds: float) -> None:
        print(f"{label:<44}{seconds / n * 1e6:>7.2f} µs/span  {n / seconds:>10,.0f} spans/CPU-s")

    line("decode (upb ParseFromString)", t_decode)
    line("convert (request_to_table)", t_convert)
    line("decode + convert", t_decode + t_convert)
    line("floor: decode + read fields into lists", t_floor)
    line("sdk peer: spans_to_table", t_sdk)
    line("segment: read + decode + convert + Parquet", t_segment)


if __name__ == "__main__":
    main()
