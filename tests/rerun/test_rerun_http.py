"""The HTTP boundary against real servers: suppression, exporters, compressed bodies, cookies, HEAD and 304."""

from __future__ import annotations

import asyncio
import base64
import contextvars
import gzip
import io
import itertools
import json
import shutil
import socket
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pyarrow.parquet as pq
import pytest
import requests
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult

import otel_replay
from otel_replay.errors import DeterminismLeakError
from otel_replay.rerun import rerun
from otel_replay.rerun.codec import arguments_codec, arguments_hash, redact_headers
from otel_replay.rerun.events import Event, Fingerprint, stream_key
from otel_replay.rerun.http_match import request_arguments
from otel_replay.rerun.interceptor import Interceptor
from otel_replay.rerun.serve import RerunMode

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


def _balances_from_workers(base: str) -> tuple[int, int]:
    """The agent's HTTP under the flag, sent from worker threads that carry the context (no agent frame there)."""

    async def via_to_thread() -> int:
        with suppress_instrumentation():
            response = await asyncio.to_thread(requests.get, f"{base}/balance", timeout=5)
        return int(response.json()["balance"])

    first = asyncio.run(via_to_thread())
    with suppress_instrumentation(), ThreadPoolExecutor(1) as pool:
        context = contextvars.copy_context()  # what ThreadContextInstrumentor does for submit()
        second = pool.submit(context.run, httpx.get, f"{base}/balance").result().json()["balance"]
    return first, int(second)


def test_http_the_agent_sends_from_a_worker_thread_under_suppress_instrumentation_is_recorded(dataset: Path) -> None:
    counter = itertools.count(1)
    hits: list[str] = []

    def handle(h: BaseHTTPRequestHandler) -> None:
        hits.append(h.path)
        _reply(h, 200, b'{"balance": %d}' % (next(counter) * 1000), [("Content-Type", "application/json")])

    with _server(handle) as base:
        original, _, events = record(dataset, "workers", lambda: _balances_from_workers(base))
        assert original == (1000, 2000) and events == 2
        result = rerun(lambda: _balances_from_workers(base), dataset=dataset, session_id="workers", governance="strict")
    assert len(hits) == 2  # both answers were served in the rerun
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
    with tracer.start_as_current_span("step") as span:  # ends here: the simple processors export on this thread
        quote = int(httpx.get(f"{base}/quote").json()["quote"])
    provider.force_flush()  # the batch processor exports from its own thread, now
    # A hand-rolled export from a thread of the agent's own (no SDK processor on the stack).
    own = threading.Thread(target=_export_by_hand, args=(_HttpxExporter(f"{base}/by-hand"), span))
    own.start()
    own.join(10)
    return quote


def _export_by_hand(exporter: SpanExporter, span: Any) -> None:
    with suppress_instrumentation():
        exporter.export([span])


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
            assert sorted(exported) == ["/by-hand", "/custom", "/v1/batch", "/v1/traces"]
            result = rerun(lambda: _traced(provider, base), dataset=dataset, session_id="exports", governance="strict")
        finally:
            provider.shutdown()
    assert sorted(exported) == sorted(["/by-hand", "/custom", "/v1/batch", "/v1/traces"] * 2)
    assert result.output == 7 and result.matched and not result.leaks, result.report()


# --- finding 3: compressed bodies are stored decoded and redacted ---------------------------------

_SECRET = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
_TOKEN = json.dumps({"access_token": _SECRET, "token_type": "bearer", "pad": "x" * 300}).encode()


def _encoded(h: BaseHTTPRequestHandler) -> None:
    coding = h.path.rsplit("/", 1)[-1]
    if coding == "gzip":
        body = gzip.compress(_TOKEN)
    elif coding == "deflate":
        body = zlib.compress(_TOKEN)
    elif coding == "br":  # a coding none of the clients here decode: the agent gets these bytes as they are
        body = zlib.compress(_TOKEN)
    else:  # "broken": says gzip, is not
        body, coding = b"\x1f\x8b\x08\x00garbage-that-does-not-inflate", "gzip"
    _reply(h, 200, body, [("Content-Type", "application/json"), ("Content-Encoding", coding)])


def _tokens(base: str) -> list[Any]:
    import urllib3

    async def via_async() -> Any:
        async with httpx.AsyncClient() as client:
            return (await client.post(f"{base}/token/deflate")).json()

    out: list[Any] = [
        httpx.post(f"{base}/token/gzip").json(),
        asyncio.run(via_async()),
        requests.post(f"{base}/token/gzip", timeout=5).json(),
        json.loads(urllib3.PoolManager().request("POST", f"{base}/token/deflate").data),
        len(httpx.post(f"{base}/token/br").content),
    ]
    try:
        httpx.post(f"{base}/token/broken").read()
    except httpx.DecodingError as exc:
        out.append(type(exc).__name__)
    return out


def _stored_events(dataset: Path, session_id: str) -> list[dict[str, Any]]:
    with otel_replay.open(dataset) as store:
        rows = store.run("rerun_event_list", session_id=session_id)
    return [{**row, "value": json.loads(row["value"])} for row in rows]


def test_compressed_bodies_are_stored_decoded_and_redacted_and_served_as_the_agent_read_them(dataset: Path) -> None:
    with _server(_encoded) as base:
        original, _, _ = record(dataset, "gz", lambda: _tokens(base))
        assert [o["access_token"] for o in original[:4]] == [_SECRET] * 4  # recording changes nothing seen
        assert original[4] == len(zlib.compress(_TOKEN)) and original[5] == "DecodingError"
        stored = "".join(str(pq.read_table(p, columns=["attributes"]).to_pylist()) for p in dataset.rglob("*.parquet"))
        assert "AbCdEfGhIjKl" not in stored and base64.b64encode(gzip.compress(_TOKEN))[:40].decode() not in stored
        events = _stored_events(dataset, "gz")
        assert len(events) == 6
        for event in events:
            value = event["value"]
            assert value["format"] == 2 and isinstance(value["body"], str)  # never base64'd compressed bytes
            assert "content-encoding" not in {k.lower() for k, _ in value["headers"]}
            length = dict((k.lower(), v) for k, v in value["headers"])["content-length"]
            assert int(length) == len(value["body"].encode())
        decoded = [e["value"] for e in events[:4]]
        assert all(json.loads(v["body"])["access_token"] == "[REDACTED]" for v in decoded)
        assert all("capped" not in v for v in decoded)
        for undecodable in events[4:]:  # not decodable as the client would: nothing of it is stored
            assert undecodable["value"]["body"] == "" and undecodable["value"]["capped"]["recorded_bytes"] == 0
            assert undecodable["value"]["capped"]["undecodable"]
        result = rerun(lambda: _tokens(base)[:4], dataset=dataset, session_id="gz")
    assert [r["token_type"] for r in result.output] == ["bearer"] * 4
    assert [r["access_token"] for r in result.output] == ["[REDACTED]"] * 4
    assert [r["pad"] for r in result.output] == ["x" * 300] * 4
    assert result.divergence is not None  # the two undecodable answers are not served faithfully: named
    assert "could not be decoded" in result.divergence.reason and "served empty" in result.divergence.reason


# --- finding 4: requests keeps cookies and r.raw while recording, and in a rerun ----------------


def _cookies(h: BaseHTTPRequestHandler) -> None:
    if h.path == "/login":
        _reply(h, 200, b"ok", [("Set-Cookie", "sid=abc123; Path=/")])
    elif h.path == "/file":
        _reply(h, 200, gzip.compress(b"file-bytes" * 100), [("Content-Encoding", "gzip")])
    else:
        known = "sid=" in (h.headers.get("Cookie") or "")
        _reply(h, 200 if known else 401, b"secret-data" if known else b"login first")


def _session(base: str) -> tuple[Any, ...]:
    with requests.Session() as session:
        login = session.post(f"{base}/login", timeout=5)
        data = session.get(f"{base}/data", timeout=5)
        with session.get(f"{base}/file", stream=True, timeout=5) as download:
            copied = io.BytesIO()
            shutil.copyfileobj(download.raw, copied)  # the body as it came over the wire
            raw_length = len(copied.getvalue())
        return data.status_code, data.text, sorted(session.cookies.keys()), raw_length, sorted(login.cookies.keys())


def test_a_requests_session_keeps_its_cookies_and_raw_body_while_recorded_and_rerun(dataset: Path) -> None:
    with _server(_cookies) as base:
        plain = _session(base)
        assert plain == (200, "secret-data", ["sid"], len(gzip.compress(b"file-bytes" * 100)), ["sid"])
        original, _, events = record(dataset, "jar", lambda: _session(base))
        assert original == plain and events == 3  # recording changes nothing the program sees
        result = rerun(lambda: _session(base), dataset=dataset, session_id="jar", governance="strict")
    # Served: the login's Set-Cookie is stored with its value redacted, and reaches the session's cookie jar
    # under its own name; the download is stored decoded (never the compressed bytes), so r.raw gives the
    # decoded file.
    assert result.output[:2] == (200, "secret-data") and result.output[2] == ["sid"]
    assert result.output[3] == len(b"file-bytes" * 100)
    assert result.output[4] == ["sid"]  # the login response's own jar (r.cookies) too, not only the session's
    assert result.matched, result.report()


# --- finding 6b: the length of a body never sent (HEAD, 304) is served as recorded -----------------


def _sizes(h: BaseHTTPRequestHandler) -> None:
    if h.path == "/cached":
        h.send_response(304)
        h.send_header("Content-Length", "512")
        h.send_header("ETag", '"v1"')
        h.end_headers()
    else:
        _reply(h, 200, b"", [("Content-Length", "7340032")])


def _heads(base: str) -> list[Any]:
    import urllib3

    return [
        httpx.head(f"{base}/report.pdf").headers["content-length"],
        requests.head(f"{base}/report.pdf", timeout=5).headers["content-length"],
        urllib3.PoolManager().request("HEAD", f"{base}/report.pdf").headers["content-length"],
        httpx.get(f"{base}/cached").headers["content-length"],
    ]


def test_head_and_304_answers_keep_their_content_length(dataset: Path) -> None:
    with _server(_sizes) as base:
        original, _, _ = record(dataset, "head", lambda: _heads(base))
        assert original == ["7340032"] * 3 + ["512"]
        result = rerun(lambda: _heads(base), dataset=dataset, session_id="head", governance="strict")
    assert result.output == original and result.matched, result.report()


# --- recordings made before the response format was versioned ------------------------------------


def _format_1_event(seq: int, method: str, url: str, value: dict[str, Any]) -> Event:
    """An HTTP event as recordings made before RESPONSE_FORMAT 2 hold it (no "format" key)."""
    name = f"{method} {url}"
    text = request_arguments(method, url, b"")
    return Event(seq, "http", name, stream_key("http", name), text, arguments_hash("http", name, text), value)


def _old_calls(base: str) -> list[Any]:
    out: list[Any] = []
    for get in (httpx.request, lambda method, url: requests.request(method, url, timeout=5)):
        redacted = get("GET", f"{base}/redacted")
        out.append([redacted.headers["content-length"], redacted.json()])
        out.append(get("HEAD", f"{base}/big").headers["content-length"])
    out.append(httpx.get(f"{base}/gz").json())
    return out


def test_a_recording_of_the_first_response_format_still_reruns(dataset: Path) -> None:
    base = "http://old.example"
    redacted = {"status": 200, "reason": "OK", "body": '{"password":"[REDACTED]"}'}
    redacted["headers"] = [["Content-Type", "application/json"], ["Content-Length", "31"]]  # as the server sent
    head = {"status": 200, "reason": "OK", "headers": [["Content-Length", "7340032"]], "body": ""}
    gz = gzip.compress(b'{"n": 1}')
    encoded = {"status": 200, "reason": "OK", "body": {"$b64": base64.b64encode(gz).decode()}}
    encoded["headers"] = [["Content-Encoding", "gzip"], ["Content-Length", str(len(gz))]]
    values = [("GET", "/redacted", redacted), ("HEAD", "/big", head)] * 2 + [("GET", "/gz", encoded)]
    with arguments_codec(2):  # made before format 3, they rerun with the rules of codec 2
        events = [_format_1_event(i, m, f"{base}{path}", v) for i, (m, path, v) in enumerate(values)]
        mode = RerunMode(events, governance="strict")
        with Interceptor(mode, rerun=True):
            served = _old_calls(base)
        mode.close()
    assert served == [["25", {"password": "[REDACTED]"}], "7340032"] * 2 + [{"n": 1}]
    assert mode.divergence is None and mode.fingerprint.hexdigest() == Fingerprint.of(events).hexdigest()


# --- finding 10: a long or endless stream reaches the agent after at most the cap -----------------

_LINE = b"data: " + b"x" * 1017 + b"\n"  # 1 KiB a line


def _endless(release: threading.Event, served: list[str]) -> Handler:
    def handle(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        try:
            for _ in range(16):  # 16 KiB now, four times the cap of these tests
                h.wfile.write(b"%x\r\n%s\r\n" % (len(_LINE), _LINE))
            h.wfile.flush()
            release.wait(20)  # ... and the rest only when the test says so: a watch that stays open
            served.append("rest")
            h.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(_LINE), _LINE))
        except OSError:
            served.append("closed early")

    return handle


def _first_lines(base: str) -> list[bytes]:
    import urllib3

    async def via_async() -> bytes:
        async with httpx.AsyncClient() as client, client.stream("GET", f"{base}/async") as r:
            async for line in r.aiter_lines():
                return line.encode()
        return b""

    out = []
    with httpx.Client() as client, client.stream("GET", f"{base}/sync") as r:
        out.append(next(r.iter_lines()).encode())
    out.append(asyncio.run(via_async()))
    with requests.get(f"{base}/requests", stream=True, timeout=20) as r:
        out.append(next(r.iter_lines()))
    direct = urllib3.PoolManager().request("GET", f"{base}/urllib3", preload_content=False)
    out.append(direct.readline().rstrip(b"\n"))
    direct.release_conn()
    direct.close()
    return out


def test_a_stream_longer_than_the_cap_reaches_the_agent_before_it_ends(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_REPLAY_RERUN_MAX_BODY", "4096")
    release = threading.Event()
    served: list[str] = []
    with _server(_endless(release, served)) as base:
        try:
            original, _, events = record(dataset, "watch", lambda: _first_lines(base))
            ended_before = list(served)
        finally:
            release.set()
    assert original == [_LINE.rstrip(b"\n")] * 4
    assert "rest" not in ended_before  # the agent had its lines while every stream was still open
    stored = [e["value"] for e in _stored_events(dataset, "watch")]
    assert len(stored) == events == 4
    for value in stored:
        assert len(value["body"].encode()) == 4096
        assert value["capped"]["recorded_bytes"] == 4096 and value["capped"]["at_least"] is True
        assert value["capped"]["original_bytes"] > 4096


def _whole(base: str) -> list[bytes]:
    import urllib3

    async def via_async() -> bytes:
        async with httpx.AsyncClient() as client:
            return (await client.get(f"{base}/async")).content

    return [
        httpx.get(f"{base}/sync").content,
        asyncio.run(via_async()),
        requests.get(f"{base}/requests", timeout=20).content,
        urllib3.PoolManager().request("GET", f"{base}/urllib3").data,
    ]


def test_a_body_longer_than_the_cap_is_read_whole_by_the_agent_and_recorded_cut(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_REPLAY_RERUN_MAX_BODY", "4096")
    release = threading.Event()
    release.set()
    served: list[str] = []
    with _server(_endless(release, served)) as base:
        plain = _whole(base)
        original, _, _ = record(dataset, "long", lambda: _whole(base))
        result = rerun(lambda: _whole(base), dataset=dataset, session_id="long")
    assert original == plain == [_LINE * 17] * 4  # recording changes nothing the agent reads
    assert result.output == [_LINE * 4] * 4  # served cut short, and said so
    assert result.divergence is not None and "capped at 4096 of" in result.divergence.reason


def test_set_cookie_values_are_redacted_and_names_kept_also_when_headers_are_joined() -> None:
    joined = "sid=abc123; Path=/; Expires=Wed, 21 Oct 2015 07:28:00 GMT, refresh=zzz999; HttpOnly"
    stored = redact_headers([("Set-Cookie", joined), ("set-cookie", "no-equals-sign"), ("Set-Cookie", "k=v")])
    assert stored == [
        ["Set-Cookie", "sid=[REDACTED]; Path=/; Expires=Wed, 21 Oct 2015 07:28:00 GMT, refresh=[REDACTED]; HttpOnly"],
        ["set-cookie", "[REDACTED]"],
        ["Set-Cookie", "k=[REDACTED]"],
    ]


# --- rev-rr2 finding 6: a chained Content-Encoding is decoded one bounded layer at a time ---------


def _gzip_bomb(mib: int) -> bytes:
    """``mib`` MiB of zeros, gzipped (about 1000:1)."""
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    return b"".join(squeeze.compress(zeros) for _ in range(mib)) + squeeze.flush()


@pytest.mark.parametrize("client", ["httpx", "urllib3"])
def test_a_chained_encoding_is_decoded_a_bounded_slice_at_a_time(client: str) -> None:
    from otel_replay.rerun.http_decode import COUNT_LIMIT, decode_bounded, httpx_decoder, urllib3_decoder

    body = gzip.compress(_gzip_bomb(96))  # 96 MiB inside, 100 KB inside that, a few hundred bytes on the wire
    header = "gzip, gzip"
    decode = (
        httpx_decoder(httpx, [(b"content-encoding", header.encode())])
        if client == "httpx"
        else urllib3_decoder([("content-encoding", header)])
    )
    biggest = [0]

    def watched(pieces: Any) -> Any:
        for piece in pieces:
            biggest[0] = max(biggest[0], len(piece))
            yield piece

    cap = 4096
    decoded = decode_bounded(watched(decode(body, cap)), cap)
    assert decoded.kept == bytes(cap) and not decoded.complete
    assert decoded.total <= 16 * 1024 * COUNT_LIMIT + (17 << 20)  # stopped near the limit, not at 96 MiB
    assert biggest[0] <= 17 << 20  # the inner layer was fed slices: its whole 96 MiB never came at once


def _chained(h: BaseHTTPRequestHandler) -> None:
    _reply(
        h,
        200,
        gzip.compress(gzip.compress(_TOKEN)),
        [("Content-Type", "application/json"), ("Content-Encoding", "gzip, gzip")],
    )


def test_a_chained_encoding_is_stored_decoded_and_redacted_through_both_clients(dataset: Path) -> None:
    def fetch(base: str) -> list[Any]:
        return [httpx.get(f"{base}/t").json(), requests.get(f"{base}/t", timeout=5).json()]

    with _server(_chained) as base:
        original, _, _ = record(dataset, "chain", lambda: fetch(base))
        assert [o["access_token"] for o in original] == [_SECRET, _SECRET]
        for event in _stored_events(dataset, "chain"):
            assert json.loads(event["value"]["body"])["access_token"] == "[REDACTED]" and "capped" not in event["value"]
        result = rerun(lambda: fetch(base), dataset=dataset, session_id="chain", governance="strict")
    assert result.matched and [o["pad"] for o in result.output] == ["x" * 300] * 2, result.report()


# --- rev-rr2: a response header that is not ASCII (raw UTF-8) ------------------------------------


def _download(h: BaseHTTPRequestHandler) -> None:
    disposition = 'attachment; filename="résumé.pdf"'.encode().decode("latin-1")  # sent as raw UTF-8 bytes
    _reply(h, 200, b"%PDF-1.4 ...", [("Content-Type", "application/pdf"), ("Content-Disposition", disposition)])


def test_a_response_header_with_raw_utf8_bytes_is_served_as_it_came_through_httpx(dataset: Path) -> None:
    def fetch(base: str) -> tuple[int, str, bytes]:
        response = httpx.get(f"{base}/cv")
        return response.status_code, response.headers["content-disposition"], response.content

    with _server(_download) as base:
        original, _, _ = record(dataset, "utf8", lambda: fetch(base))
        assert "sum" in original[1] and original[2] == b"%PDF-1.4 ..."
        result = rerun(lambda: fetch(base), dataset=dataset, session_id="utf8", governance="strict")
    assert result.matched and result.output == original, result.report()  # UnicodeEncodeError in the agent before
