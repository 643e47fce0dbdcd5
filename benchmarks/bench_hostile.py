"""Benchmark `otel-replay serve` under hostile clients: slowloris, gzip bombs and large requests.

Runs `serve` as a subprocess with its default limits and measures, with a
well-behaved OTLP/HTTP client (one keep-alive connection, protobuf requests):

  * its request rate in windows alternating unloaded and loaded (machine noise hits both alike);
  * its rate while S slowloris connections declare 32 MiB bodies and trickle one byte at a time;
  * its rate while B parallel clients send 1 MiB gzip bodies that inflate to 1 GiB of zeros;
  * the server's peak RSS in each phase, and with 4 concurrent ~25 MB requests (the memory bound);

and prints them beside the configured in-flight budget and the measured
baseline (the server's RSS after start-up and a warm-up). Targets: the
well-behaved rate under load >= 90% of unloaded; peak RSS < 2 x budget + baseline.
A control run (the same alternation with no attack) prints how far the
machine's own noise moves the ratio; on a shared machine, read the attack
ratios against it.

    python benchmarks/bench_hostile.py                 # about 2 minutes
    python benchmarks/bench_hostile.py --seconds 10 --slowloris 64 --bombs 60
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing as mp
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import psutil

MiB = 1024 * 1024
_READY = re.compile(r"grpc (\S+) http 127\.0\.0\.1:(\d+)")


def build_request(spans: int) -> bytes:
    """A protobuf ExportTraceServiceRequest of ``spans`` SDK spans."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    kept: list = []

    class Keep(SpanExporter):
        def export(self, batch):  # type: ignore[no-untyped-def]
            kept.extend(batch)
            return SpanExportResult.SUCCESS

    provider = TracerProvider(resource=Resource.create({"service.name": "bench-hostile"}))
    provider.add_span_processor(SimpleSpanProcessor(Keep()))
    tracer = provider.get_tracer("bench")
    for i in range(spans):
        with tracer.start_as_current_span("agent.step", attributes={"step": i, "model": "m-1", "tool": "search"}) as s:
            s.add_event("tool.call", {"n": i})
    provider.shutdown()
    return encode_spans(kept).SerializeToString()


def post(conn: http.client.HTTPConnection, body: bytes, **headers: str) -> int:
    conn.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf", **headers})
    response = conn.getresponse()
    response.read()
    return response.status


def well_behaved(port: int, jobs: mp.Queue, results: mp.Queue) -> None:  # type: ignore[type-arg]
    """For each window length taken from ``jobs``: post a 100-span request over and over on one keep-alive
    connection for that long, then report (ok, refused, errors). None ends the worker."""
    body = build_request(100)
    results.put("ready")
    while (seconds := jobs.get()) is not None:
        ok = refused = errors = 0
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                status = post(conn, body)
            except (OSError, http.client.HTTPException):
                errors += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                continue
            if status == 200:
                ok += 1
            else:
                refused += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.close()
        results.put((ok, refused, errors))


class Client:
    """The well-behaved client, in its own process, measuring one window at a time."""

    def __init__(self, port: int) -> None:
        self.jobs: mp.Queue = mp.Queue()  # type: ignore[type-arg]
        self.results: mp.Queue = mp.Queue()  # type: ignore[type-arg]
        self.proc = mp.Process(target=well_behaved, args=(port, self.jobs, self.results))
        self.proc.start()
        assert self.results.get() == "ready"

    def window(self, seconds: float) -> tuple[int, int, int]:
        self.jobs.put(seconds)
        return self.results.get()  # type: ignore[no-any-return]

    def close(self) -> None:
        self.jobs.put(None)
        self.proc.join()


class Slowloris:
    """``count`` connections declaring 32 MiB bodies, each trickling one byte a second; reconnect when dropped."""

    def __init__(self, port: int, count: int) -> None:
        self.port, self.count = port, count
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        head = (
            "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            f"Content-Length: {32 * MiB}\r\n\r\n"
        ).encode()
        socks: list[socket.socket | None] = [None] * self.count
        while not self._stop.is_set():
            for i in range(self.count):
                try:
                    sock = socks[i]
                    if sock is None:
                        sock = socks[i] = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                        sock.sendall(head)
                    sock.sendall(b"\0")
                except OSError:
                    if socks[i] is not None:
                        socks[i].close()  # type: ignore[union-attr]
                    socks[i] = None
            self._stop.wait(1.0)
        for sock in socks:
            if sock is not None:
                sock.close()


def zeros_gzip(total: int) -> bytes:
    """gzip of ``total`` zero bytes, built a MiB at a time."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(MiB)
    return b"".join(packer.compress(block) for _ in range(total // MiB)) + packer.flush()


def bomber(port: int, threads: int, active: Any, done: Any, results: mp.Queue) -> None:  # type: ignore[type-arg]
    """``threads`` parallel clients posting gzip bombs (1 GiB of zeros) back to back while ``active`` is set."""
    bomb = zeros_gzip(1024 * MiB)
    counts: dict[str, int] = {}
    lock = threading.Lock()

    def run() -> None:
        while not done.is_set():
            if not active.wait(0.1):
                continue
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                status = str(post(conn, bomb, **{"Content-Encoding": "gzip"}))
            except (OSError, http.client.HTTPException) as exc:
                status = type(exc).__name__
            finally:
                conn.close()
            with lock:
                counts[status] = counts.get(status, 0) + 1

    workers = [threading.Thread(target=run) for _ in range(threads)]
    results.put(len(bomb))
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    results.put(counts)


class PeakRss:
    """Samples the RSS of a process and of its children every 20 ms, all the time (so the sampling costs the
    machine the same in unloaded and loaded windows); :meth:`reset` starts a new peak."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.server = self.children = 0
        self._kids: list[psutil.Process] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        refreshed = 0.0
        while not self._stop.wait(0.02):
            try:
                if time.monotonic() - refreshed > 2.0:  # listing children walks /proc: not every sample
                    self._kids, refreshed = self.proc.children(recursive=True), time.monotonic()
                self.server = max(self.server, self.proc.memory_info().rss)
                kids = 0
                for kid in self._kids:
                    try:
                        kids += kid.memory_info().rss
                    except psutil.Error:
                        refreshed = 0.0
                self.children = max(self.children, kids)
            except psutil.Error:
                return

    def reset(self) -> None:
        self.server = self.children = 0

    def peak(self) -> tuple[int, int]:
        return self.server, self.children

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def metric(port: int, name: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    match = re.search(rf"^otel_replay_{name} (\d+)$", text, re.M)
    return int(match.group(1)) if match else -1


def large_requests(port: int, body: bytes, parallel: int) -> dict[str, int]:
    """``parallel`` clients each get one ~25 MB request accepted (retrying on 429)."""
    counts: dict[str, int] = {}
    lock = threading.Lock()

    def run() -> None:
        for _ in range(200):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            try:
                status = post(conn, body)
            except (OSError, http.client.HTTPException):
                status = -1
            finally:
                conn.close()
            with lock:
                counts[str(status)] = counts.get(str(status), 0) + 1
            if status == 200:
                return
            time.sleep(0.05)

    workers = [threading.Thread(target=run) for _ in range(parallel)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return counts


def alternate(client: Client, args: argparse.Namespace, rss: PeakRss, load_on: Any, load_off: Any) -> tuple:
    """Alternate unloaded and loaded windows (the machine's own noise hits both alike) and sum each side.

    Returns (loaded req/s, unloaded req/s, refused under load, errors under load, peak server RSS under load).
    """
    ok_unloaded = ok_loaded = refused = errors = peak = 0
    for _ in range(args.rounds):
        ok_unloaded += client.window(args.seconds)[0]
        load_on()
        time.sleep(1.0)
        rss.reset()
        ok, bad, failed = client.window(args.seconds)
        peak = max(peak, rss.peak()[0])
        load_off()
        ok_loaded, refused, errors = ok_loaded + ok, refused + bad, errors + failed
    span = args.rounds * args.seconds
    return ok_loaded / span, ok_unloaded / span, refused, errors, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each measured window")
    parser.add_argument("--rounds", type=int, default=6, help="unloaded/loaded window pairs per attack")
    parser.add_argument("--slowloris", type=int, default=32, help="slowloris connections (cap: 128)")
    parser.add_argument("--bombs", type=int, default=60, help="parallel gzip-bomb clients")
    parser.add_argument("--no-control", dest="control", action="store_false", help="skip the no-attack control")
    parser.add_argument("--large-mb", type=int, default=25, help="size of each of the 4 large requests (0: skip)")
    args = parser.parse_args()
    budget_mib = 128
    work = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    command = [sys.executable, "-m", "otel_replay", "serve", "--dataset", str(work / "ds"), "--grpc", "off"]
    command += ["--http", "127.0.0.1:0", "--max-inflight-mib", str(budget_mib), "--flush-seconds", "1"]
    # run from the checkout this script belongs to: `-m` imports the package from the working directory first
    checkout = Path(__file__).resolve().parent.parent
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=checkout)
    try:
        assert server.stdout is not None
        match = _READY.search(server.stdout.readline())
        assert match, "serve did not start"
        port = int(match.group(2))
        client = Client(port)
        client.window(1.0)  # warm-up: first WAL segment, converter process
        time.sleep(1.5)
        baseline = psutil.Process(server.pid).memory_info().rss
        limit = 2 * budget_mib * MiB + baseline
        rss = PeakRss(server.pid)
        print(f"in-flight budget: {budget_mib} MiB; baseline (server RSS after start-up and warm-up): "
              f"{baseline / MiB:.0f} MiB; RSS target < 2 x budget + baseline = {limit / MiB:.0f} MiB")

        if args.control:
            rate, unloaded, _, _, _ = alternate(client, args, rss, lambda: None, lambda: None)
            print(f"control (no attack in either window): {rate:6.1f} vs {unloaded:6.1f} req/s = "
                  f"{100 * rate / unloaded:5.1f}% -- how far this machine's own noise moves the ratio")

        loris = Slowloris(port, args.slowloris)
        rate, unloaded, refused, errors, peak = alternate(client, args, rss, loris.start, loris.stop)
        print(f"{args.slowloris} slowloris: {rate:6.1f} req/s under load vs {unloaded:6.1f} unloaded = "
              f"{100 * rate / unloaded:5.1f}% ({'met' if rate >= 0.9 * unloaded else 'NOT met'}: >= 90%); "
              f"refused {refused}, errors {errors}; server peak RSS {peak / MiB:.0f} MiB")

        results: mp.Queue = mp.Queue()  # type: ignore[type-arg]
        active, done = mp.Event(), mp.Event()
        bombs = mp.Process(target=bomber, args=(port, args.bombs, active, done, results))
        bombs.start()
        bomb_size = results.get()
        rate, unloaded, refused, errors, peak = alternate(client, args, rss, active.set, active.clear)
        done.set()
        counts = results.get()
        bombs.join()
        client.close()
        print(f"{args.bombs} gzip bombs: {rate:6.1f} req/s under load vs {unloaded:6.1f} unloaded = "
              f"{100 * rate / unloaded:5.1f}% ({'met' if rate >= 0.9 * unloaded else 'NOT met'}: >= 90%); "
              f"refused {refused}, errors {errors}; server peak RSS {peak / MiB:.0f} MiB "
              f"({'met' if peak < limit else 'NOT met'}: < 2 x budget + baseline); "
              f"{bomb_size / MiB:.1f} MiB bombs (1 GiB inflated) answered {counts}")

        if args.large_mb:
            one = build_request(2000)
            body = one * max(1, (args.large_mb * MiB) // len(one))  # concatenated requests merge into one
            rss.reset()
            counts = large_requests(port, body, 4)
            peak, converter = rss.peak()
            print(f"4 x {len(body) / MiB:.0f} MiB requests: answered {counts}; server peak RSS {peak / MiB:.0f} MiB "
                  f"= baseline + {(peak - baseline) / MiB:.0f} MiB = baseline + "
                  f"{(peak - baseline) / (budget_mib * MiB):.2f} x budget "
                  f"({'met' if peak < limit else 'NOT met'}); in-flight peak "
                  f"{metric(port, 'inflight_bytes_peak') / MiB:.0f} MiB; converter peak RSS {converter / MiB:.0f} MiB")

        print(f"slow clients dropped: {metric(port, 'connections_timed_out_total')}, "
              f"connections refused at the cap: {metric(port, 'connections_refused_total')}, "
              f"requests too large (413): {metric(port, 'requests_too_large_total')}, "
              f"shed (429): {metric(port, 'requests_shed_total')}")
        rss.stop()
        started = time.perf_counter()
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=300)
        print(f"SIGTERM -> exit {code} in {time.perf_counter() - started:.2f} s (drains and converts the WAL)")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        shutil.rmtree(work, ignore_errors=True)


def teardown_ms() -> float:
    """How long stopping an idle in-process HTTP service takes (the accept loop wakes on a pipe, no poll)."""
    from otel_replay.server import Receiver, ServerConfig

    with tempfile.TemporaryDirectory() as tmp:
        receiver = Receiver(ServerConfig(Path(tmp), grpc=None, http="127.0.0.1:0", convert_workers=0)).start()
        time.sleep(0.3)
        started = time.perf_counter()
        receiver.stop()
        return (time.perf_counter() - started) * 1000


if __name__ == "__main__":
    main()
    print(f"in-process Receiver.stop() of an idle HTTP receiver: {teardown_ms():.1f} ms")
