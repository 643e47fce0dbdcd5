"""HTTP reads through the contrib requests/httpx instrumentations, with bodies only under the capture switch."""

from __future__ import annotations

import json
from datetime import timedelta

import httpx
import pytest
import requests

from otel_replay import semconv as sc
from otel_replay.instrumentation import scripted as s
from otel_replay.instrumentation.http_bodies import instrument_http, uninstrument_http

from .conftest import Pipeline


@pytest.fixture
def http_on(pipeline: Pipeline, request):
    turned_on = instrument_http(tracer_provider=pipeline.provider, capture_content=request.param)
    assert set(turned_on) == {"RequestsInstrumentor", "HTTPXClientInstrumentor"}
    yield pipeline
    uninstrument_http()


def client_spans(pipeline: Pipeline) -> list:
    return [sp for sp in pipeline.spans() if sp.kind.name == "CLIENT"]


@pytest.mark.parametrize("http_on", [True], indirect=True)
def test_bodies_are_recorded_redacted_with_capture_on(server, http_on: Pipeline):
    server.enqueue(s.Reply(200, {"quote": 1.1, "session_token": "tok_live_abcdef123456"}), s.Reply(200, {"ok": True}))
    got = requests.post(
        f"{server.root_url}/rates", json={"pair": "EURUSD", "api_key": "sk-live-abcdefghijklmnopqrstu"}, timeout=10
    )
    assert got.json()["quote"] == 1.1
    with httpx.Client() as c:
        assert c.post(f"{server.root_url}/orders", content=b'{"qty": 3, "password": "hunter22"}').json() == {"ok": True}
    first, second = client_spans(http_on)
    sent, received = first.attributes[sc.HTTP_REQUEST_BODY], first.attributes[sc.HTTP_RESPONSE_BODY]
    assert json.loads(sent)["pair"] == "EURUSD" and "abcdefghijklmnopqrstu" not in sent
    assert "1.1" in received and "tok_live_abcdef123456" not in received
    assert (
        '"qty": 3' in second.attributes[sc.HTTP_REQUEST_BODY]
        and "hunter22" not in second.attributes[sc.HTTP_REQUEST_BODY]
    )


@pytest.mark.parametrize("http_on", [False], indirect=True)
def test_no_bodies_with_capture_off_and_streams_are_never_consumed(server, http_on: Pipeline):
    server.enqueue(s.Reply(200, {"a": 1}), s.Reply(200, {"streamed": True}))
    requests.post(f"{server.root_url}/x", json={"secret": "x"}, timeout=10)
    streamed = requests.get(f"{server.root_url}/y", stream=True, timeout=10)
    assert streamed.json() == {"streamed": True}  # the caller still reads the whole body
    spans = client_spans(http_on)
    assert len(spans) == 2
    assert all(sc.HTTP_REQUEST_BODY not in sp.attributes and sc.HTTP_RESPONSE_BODY not in sp.attributes for sp in spans)


def _httpx_span(pipeline: Pipeline):
    (span,) = [sp for sp in client_spans(pipeline) if sp.instrumentation_scope.name.endswith("httpx")]
    return span


@pytest.mark.parametrize("http_on", [True], indirect=True)
def test_httpx_response_body_is_recorded_and_the_caller_gets_the_same_response(server, http_on: Pipeline):
    server.enqueue(s.Reply(200, {"quote": 1.25, "session_token": "tok_live_abcdef123456"}))
    with httpx.Client() as c:
        got = c.get(f"{server.root_url}/rates")
    assert got.json() == {"quote": 1.25, "session_token": "tok_live_abcdef123456"}  # unredacted for the caller
    assert got.is_stream_consumed and got.is_closed  # the client still read and closed the response itself
    assert got.elapsed > timedelta(0)  # and timed it (httpx sets ``elapsed`` when it closes the response)
    recorded = _httpx_span(http_on).attributes[sc.HTTP_RESPONSE_BODY]
    assert "1.25" in recorded and "tok_live_abcdef123456" not in recorded


@pytest.mark.parametrize("http_on", [True], indirect=True)
def test_httpx_async_response_body_is_recorded(server, http_on: Pipeline):
    import asyncio

    server.enqueue(s.Reply(200, {"async": True}))

    async def call() -> dict:
        async with httpx.AsyncClient() as c:
            return (await c.get(f"{server.root_url}/a")).json()

    assert asyncio.run(call()) == {"async": True}
    assert json.loads(_httpx_span(http_on).attributes[sc.HTTP_RESPONSE_BODY]) == {"async": True}


@pytest.mark.parametrize("http_on", [True], indirect=True)
def test_httpx_streamed_response_is_never_buffered(server, http_on: Pipeline):
    events = [(None, {"n": i}) for i in range(3)]
    server.enqueue(s.Reply(200, events=events))
    with httpx.Client() as c, c.stream("GET", f"{server.root_url}/sse") as response:
        # the first line arrives before the body is complete: nothing read it ahead of the caller
        assert type(response.stream).__name__ != "BufferedStream"
        lines = [line for line in response.iter_lines() if line]
    assert lines == ['data: {"n":0}', 'data: {"n":1}', 'data: {"n":2}']
    assert sc.HTTP_RESPONSE_BODY not in _httpx_span(http_on).attributes


@pytest.mark.parametrize("http_on", [True], indirect=True)
def test_httpx_body_cut_mid_response_raises_to_the_caller_as_before(server, http_on: Pipeline):
    server.enqueue(s.Reply(200, events=[(None, {"n": i}) for i in range(5)], cut_after=2))
    with httpx.Client() as c, pytest.raises(httpx.RemoteProtocolError):
        c.get(f"{server.root_url}/cut")
    span = _httpx_span(http_on)
    assert span.status.status_code.name == "ERROR" and sc.HTTP_RESPONSE_BODY not in span.attributes


@pytest.mark.parametrize("http_on", [True], indirect=True)
def test_httpx_gzip_body_is_recorded_decoded_and_a_bomb_only_up_to_the_cap(http_on: Pipeline):
    import gzip
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    bodies = [gzip.compress(b'{"zipped": "yes"}'), gzip.compress(b"0" * (64 << 20))]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            payload = bodies.pop(0)
            self.send_response(200)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        with httpx.Client() as c:
            assert c.get(f"http://127.0.0.1:{httpd.server_port}/z").json() == {"zipped": "yes"}
            big = c.get(f"http://127.0.0.1:{httpd.server_port}/bomb")
        assert len(big.content) == 64 << 20  # the caller still gets all of it
    finally:
        httpd.shutdown()
        httpd.server_close()
    small, bomb = [sp for sp in client_spans(http_on) if sp.instrumentation_scope.name.endswith("httpx")]
    assert json.loads(small.attributes[sc.HTTP_RESPONSE_BODY]) == {"zipped": "yes"}
    assert 0 < len(bomb.attributes[sc.HTTP_RESPONSE_BODY]) <= 64 << 10


def test_uninstrument_restores_the_httpx_originals_exactly(pipeline: Pipeline):
    originals = (
        httpx.Client.__dict__["send"],
        httpx.AsyncClient.__dict__["send"],
        httpx.HTTPTransport.__dict__["handle_request"],
        httpx.AsyncHTTPTransport.__dict__["handle_async_request"],
    )
    instrument_http(tracer_provider=pipeline.provider, capture_content=True)
    assert httpx.Client.__dict__["send"] is not originals[0]
    uninstrument_http()
    assert (
        httpx.Client.__dict__["send"],
        httpx.AsyncClient.__dict__["send"],
        httpx.HTTPTransport.__dict__["handle_request"],
        httpx.AsyncHTTPTransport.__dict__["handle_async_request"],
    ) == originals


@pytest.mark.parametrize("http_on", [False], indirect=True)
def test_secrets_in_request_urls_are_redacted_on_the_http_spans(server, http_on: Pipeline):
    server.enqueue(s.Reply(200, {"a": 1}), s.Reply(200, {"b": 2}), s.Reply(200, {"c": 3}))
    secret_url = f"{server.root_url}/rates?pair=EURUSD&api_key=sk-live-abcdefghijklmnopqrstu&token=tok_9f8e7d6c5b4a"
    assert requests.get(secret_url, timeout=10).json() == {"a": 1}  # the request itself goes out unchanged
    with httpx.Client() as c:
        assert c.get(secret_url).json() == {"b": 2}
        assert c.get(f"{server.root_url}/plain?pair=EURUSD").json() == {"c": 3}
    first, second, plain = client_spans(http_on)
    for span in (first, second):
        url = span.attributes.get("url.full") or span.attributes.get("http.url")
        assert "pair=EURUSD" in url and "[REDACTED]" in url, url
        assert "abcdefghijklmnopqrstu" not in url and "tok_9f8e7d6c5b4a" not in url
    assert (plain.attributes.get("url.full") or plain.attributes.get("http.url")).endswith("/plain?pair=EURUSD")
    requests_seen = [r["path"] for r in server.requests]
    assert any("api_key=sk-live-abcdefghijklmnopqrstu" in path for path in requests_seen)
