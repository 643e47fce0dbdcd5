"""HTTP reads through the contrib requests/httpx instrumentations, with bodies only under the capture switch."""

from __future__ import annotations

import json

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
