"""Benchmark `otel-replay serve`: SDK gRPC exporters in several processes -> receiver -> WAL -> Parquet.

Prints, for N spans sent by P client processes:
  * SDK ceiling:  the same clients against a null gRPC sink (encode + send only);
  * durable:      spans/s acknowledged by `otel-replay serve` (fsynced to its WAL);
  * in Parquet:   spans/s until every span is a Parquet row (end to end);
  * raw capacity: pre-encoded requests (no SDK encoding) -> receiver, acknowledged;
  * peak RSS of the server process and of its converter process(es), and the
    converters' CPU seconds (spans per converter CPU-second: the per-process rate).

    python benchmarks/bench_receiver.py --spans 200000 --clients 2 [--convert-workers W] [--raw-only]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent import futures
from pathlib import Path

HERE = Path(__file__).resolve().parent
BATCH = 512
POOL = 4096  # distinct spans each client builds, then sends repeatedly


def build_spans(count: int) -> list:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    keep = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "bench"}))
    provider.add_span_processor(SimpleSpanProcessor(keep))
    tracer = provider.get_tracer("bench")
    for i in range(count):
        with tracer.start_as_current_span(
            "agent.step", attributes={"step": i, "replay.kind": "read", "model": "m-1"}
        ) as s:
            s.add_event("tool.call", {"tool": "search"})
    provider.shutdown()
    return list(keep.get_finished_spans())


def client(endpoint: str, count: int, raw: bool, ready: mp.Barrier, results: mp.Queue) -> None:  # type: ignore[type-arg]
    import grpc
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    spans = build_spans(POOL)
    batches = [spans[i : i + BATCH] for i in range(0, POOL, BATCH)]
    sent = failed = 0
    if raw:
        bodies = [encode_spans(b).SerializeToString() for b in batches]
        channel = grpc.insecure_channel(endpoint)
        call = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        with futures.ThreadPoolExecutor(4) as pool:
            ready.wait()
            start = time.perf_counter()
            jobs = [pool.submit(call, bodies[n % len(bodies)], timeout=60) for n in range(count // BATCH)]
            for job in jobs:
                try:
                    job.result()
                    sent += BATCH
                except grpc.RpcError:
                    failed += BATCH
        channel.close()
    else:
        exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=60)
        ready.wait()
        start = time.perf_counter()
        for n in range(count // BATCH):
            if exporter.export(batches[n % len(batches)]) == SpanExportResult.SUCCESS:
                sent += BATCH
            else:
                failed += BATCH
        exporter.shutdown()
    results.put((sent, failed, time.perf_counter() - start))


def run_clients(endpoint: str, total: int, clients: int, raw: bool) -> tuple[int, int, float]:
    ctx = mp.get_context("spawn")
    ready, results = ctx.Barrier(clients + 1), ctx.Queue()
    procs = [ctx.Process(target=client, args=(endpoint, total // clients, raw, ready, results)) for _ in range(clients)]
    for p in procs:
        p.start()
    ready.wait()
    start = time.perf_counter()
    out = [results.get() for _ in procs]
    elapsed = time.perf_counter() - start
    for p in procs:
        p.join()
    return sum(o[0] for o in out), sum(o[1] for o in out), elapsed


def null_sink() -> tuple[object, int]:
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    class Null(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
            return ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(8), options=[("grpc.max_receive_message_length", 64 << 20)])
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Null(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def hwm_kib(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    match = re.search(r"VmHWM:\s+(\d+)", text)
    return int(match.group(1)) if match else 0


def children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            pass
    return kids


def metric(port: int, name: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    match = re.search(rf"^otel_replay_{name} (\d+)$", text, re.M)
    return int(match.group(1)) if match else 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    def __init__(self, dataset: Path, convert_workers: int = 1) -> None:
        command = [sys.executable, "-m", "otel_replay", "serve", "--dataset", str(dataset)]
        command += ["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--flush-seconds", "2"]
        command += ["--convert-workers", str(convert_workers)]
        # `-m` imports the package from the working directory first: run the server from the checkout this
        # script belongs to, so an A/B run of another checkout's script measures that checkout's server.
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=HERE.parent)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        match = re.search(r"grpc 127\.0\.0\.1:(\d+) http 127\.0\.0\.1:(\d+)", line)
        if not match:
            raise SystemExit(f"server did not start: {line!r}")
        self.grpc, self.http = int(match.group(1)), int(match.group(2))
        self.peak_server = self.peak_converter = 0
        self.converter_cpu: dict[int, float] = {}

    def sample(self) -> None:
        self.peak_server = max(self.peak_server, hwm_kib(self.proc.pid))
        for kid in children(self.proc.pid):
            self.peak_converter = max(self.peak_converter, hwm_kib(kid))
            self.converter_cpu[kid] = max(self.converter_cpu.get(kid, 0.0), cpu_seconds(kid))

    def wait_written(self, total: int) -> float:
        start = time.perf_counter()
        while metric(self.http, "spans_written_total") < total:
            self.sample()
            time.sleep(0.1)
        self.sample()
        return time.perf_counter() - start

    def stop(self) -> None:
        self.sample()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=600)
        self.proc.stdout.close()  # type: ignore[union-attr]


def phase(dataset: Path, total: int, clients: int, *, raw: bool, label: str, workers: int) -> None:
    """Send ``total`` spans to a fresh receiver; print the ack rate, the Parquet rate and peak RSS."""
    server = Server(dataset, workers)
    time.sleep(1.0)  # the converter pool starts its processes (imports) before the clients send
    server.sample()
    cpu_before = sum(server.converter_cpu.values())
    server_cpu = cpu_seconds(server.proc.pid)
    start = time.perf_counter()
    sent, failed, secs = run_clients(f"127.0.0.1:{server.grpc}", total, clients, raw=raw)
    server_cpu = cpu_seconds(server.proc.pid) - server_cpu  # the ack path (and the converter thread's waiting)
    server.sample()
    lag = server.wait_written(sent)
    landed = time.perf_counter() - start
    converter_cpu = sum(server.converter_cpu.values()) - cpu_before
    server.stop()
    print(f"{label + ':':<34}{sent / secs:>10,.0f} spans/s  ({sent} acked, {failed} shed/failed, {secs:.1f}s)")
    print(f"{'  in Parquet (end to end):':<34}{sent / landed:>10,.0f} spans/s  (+{lag:.1f}s converter lag)")
    print(f"{'  server CPU while acking:':<34}{server_cpu / sent * 1e6:>10.1f} µs/span  ({server_cpu:.1f} CPU-s)")
    if converter_cpu > 0:
        print(
            f"{'  per converter CPU-second:':<34}{sent / converter_cpu:>10,.0f} spans  "
            f"({converter_cpu:.1f} CPU-s in {workers} converter process(es))"
        )
    print(f"  peak RSS: server {server.peak_server / 1024:.0f} MiB, converter {server.peak_converter / 1024:.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=200_000, help="spans per phase (N)")
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument("--no-raw", action="store_true", help="skip the pre-encoded capacity phase")
    parser.add_argument("--raw-only", action="store_true", help="only the pre-encoded phase (no SDK encoding)")
    parser.add_argument("--convert-workers", type=int, default=1, help="serve --convert-workers")
    args = parser.parse_args()
    total = args.spans - args.spans % (BATCH * args.clients)
    print(f"N={total} spans, {args.clients} client processes, batches of {BATCH}, {args.convert_workers} converter(s)")

    if not args.raw_only:
        sink, port = null_sink()
        sent, _, secs = run_clients(f"127.0.0.1:{port}", total, args.clients, raw=False)
        sink.stop(0)  # type: ignore[attr-defined]
        print(f"SDK ceiling (null gRPC sink):    {sent / secs:>10,.0f} spans/s  ({sent} in {secs:.1f}s)")

    work = Path(tempfile.mkdtemp(prefix="bench-receiver-"))
    workers = args.convert_workers
    try:
        if not args.raw_only:
            phase(work / "sdk", total, args.clients, raw=False, label="durable (acked, WAL fsynced)", workers=workers)
        if not args.no_raw:
            label = "raw capacity (pre-encoded, acked)"
            phase(work / "raw", total, args.clients, raw=True, label=label, workers=workers)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
