"""The HTTP boundary against real servers: suppression, exporters, compressed bodies, cookies, HEAD and 304."""

from __future__ import annotations

import itertools
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import requests
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult

from otel_replay.errors import DeterminismLeakError
from otel_replay.rerun import rerun

from .conftest import record

Handler = Callable[[BaseHTTPRequestHandler], None]


@contextmanager
def _server(handle: Handler) -> Iterator[str]:
    """A local HTTP/1.1 server answering every method through ``handle``; stopped on exit."""

    class _H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            handle(self)

        do_POST = do_HEAD = do_GET

    server = ThreadingHTTPServer(("127.0.0.1", 0), _H)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _reply(h: BaseHTTPRequestHandler, status: int, body: bytes, headers: Sequence[tuple[str, str]] = ()) -> None:
    length = int(h.headers.get("Content-Length") or 0)
    if length:
        h.rfile.read(length)
    h.send_response(status)
    for key, value in headers:
        h.send_header(key, value)
    if not any(k.lower() == "content-length" for k, _ in headers):
        h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    if h.command != "HEAD":
        h.wfile.write(body)


# --- finding 1: suppress_instrumentation() in the agent's code ------------------------------------


def _balances(base: str) -> tuple[str, int, int]:
    with suppress_instrumentation():  # what agents and frameworks do to keep noisy spans out
        first = httpx.get(f"{base}/balance").json()["balance"]
        second = requests.get(f"{base}/balance", timeout=5).json()["balance"]
    return ("pay" if first < 1500 else "hold"), first, second


def test_http_the_agent_makes_under_suppress_instrumentation_is_recorded_and_served(dataset: Path) -> None:
    counter = itertools.count(1)
    hits: list[str] = []

    def handle(h: BaseHTTPRequestHandler) -> None:
        hits.append(h.path)
        _reply(h, 200, b'{"balance": %d}' % (next(counter) * 1000), [("Content-Type", "application/json")])

    with _server(handle) as base:
        original, _, events = record(dataset, "quiet", lambda: _balances(base))
        assert original == ("pay", 1000, 2000) and events == 2
        result = rerun(lambda: _balances(base), dataset=dataset, session_id="quiet", governance="strict")
    assert len(hits) == 2  # the rerun never reached the server: both answers were served
    assert result.output == original and result.matched and not result.leaks, result.report()


def _dials(port: int) -> None:
    with suppress_instrumentation(), socket.create_connection(("127.0.0.1", port), timeout=5):
        pass


def test_a_socket_the_agent_opens_under_suppress_instrumentation_is_a_leak(dataset: Path) -> None:
    with _server(lambda h: _reply(h, 200, b"")) as base:
        port = int(urlsplit(base).port or 0)
        record(dataset, "dial", lambda: _dials(port))
        with pytest.raises(DeterminismLeakError, match="(DNS lookup|socket connect).*outside the recording"):
            rerun(lambda: _dials(port), dataset=dataset, session_id="dial", governance="strict")


class _HttpxExporter(SpanExporter):
    """A custom exporter in the agent's own package: its traffic is the exporter's, not the agent's."""

    def __init__(self, url: str) -> None:
        self.url = url

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        httpx.post(self.url, json=[span.name for span in spans])
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _traced(provider: TracerProvider, base: str) -> int:
    tracer = provider.get_tracer("agent-under-test")
    with tracer.start_as_current_span("step"):  # ends here: the simple processors export on this thread
        quote = int(httpx.get(f"{base}/quote").json()["quote"])
    provider.force_flush()  # the batch processor exports from its own thread, now
    return quote


def test_an_exporter_exporting_during_a_recording_is_neither_recorded_nor_a_leak(dataset: Path) -> None:
    exported: list[str] = []

    def handle(h: BaseHTTPRequestHandler) -> None:
        if h.path == "/quote":
            _reply(h, 200, b'{"quote": 7}', [("Content-Type", "application/json")])
        else:
            exported.append(h.path)
            _reply(h, 200, b"", [("Content-Type", "application/x-protobuf")])

    with _server(handle) as base:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{base}/v1/traces")))
        provider.add_span_processor(SimpleSpanProcessor(_HttpxExporter(f"{base}/custom")))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{base}/v1/batch")))
        try:
            original, _, events = record(dataset, "exports", lambda: _traced(provider, base))
            assert original == 7 and events == 1  # the agent's GET alone
            assert sorted(exported) == ["/custom", "/v1/batch", "/v1/traces"]
            result = rerun(lambda: _traced(provider, base), dataset=dataset, session_id="exports", governance="strict")
        finally:
            provider.shutdown()
    assert sorted(exported) == ["/custom", "/custom", "/v1/batch", "/v1/batch", "/v1/traces", "/v1/traces"]
    assert result.output == 7 and result.matched and not result.leaks, result.report()
