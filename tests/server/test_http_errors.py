"""OTLP/HTTP status codes: malformed bodies, content types, limits, load shedding, disconnects."""

from __future__ import annotations

import gzip
import http.client
import json
import socket

import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from otel_replay.server import Receiver
from otel_replay.server.otlp_json import request_to_obj

from .conftest import make_spans, parquet_rows


def post(
    receiver: Receiver, body: bytes, ctype: str = "application/x-protobuf", path: str = "/v1/traces", **headers: str
) -> tuple[int, dict[str, str], bytes]:
    assert receiver.http_address is not None
    conn = http.client.HTTPConnection("127.0.0.1", receiver.http_address[1], timeout=10)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": ctype, **headers})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def get(receiver: Receiver, path: str) -> tuple[int, bytes]:
    assert receiver.http_address is not None
    conn = http.client.HTTPConnection("127.0.0.1", receiver.http_address[1], timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def payload(count: int = 4) -> bytes:
    return encode_spans(make_spans(count)).SerializeToString()


def test_protobuf_request_gets_protobuf_response(receiver: Receiver) -> None:
    status, headers, body = post(receiver, payload())
    assert status == 200 and headers["Content-Type"] == "application/x-protobuf"
    response = ExportTraceServiceResponse()
    response.ParseFromString(body)
    assert not response.HasField("partial_success")


def test_otlp_json_with_hex_ids_and_partial_success(receiver: Receiver) -> None:
    request = encode_spans(make_spans(3))
    obj = request_to_obj(request)
    spans = obj["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert len(spans[0]["traceId"]) == 32 and len(spans[0]["spanId"]) == 16  # hex, per the OTLP/JSON rules
    spans[1]["spanId"] = "abcd"  # 2 bytes: cannot be stored
    status, headers, body = post(receiver, json.dumps(obj).encode(), "application/json")
    assert status == 200 and headers["Content-Type"] == "application/json"
    partial = json.loads(body)["partialSuccess"]
    assert partial["rejectedSpans"] == "1" and "span_id" in partial["errorMessage"]  # int64 as a string
    receiver.stop()
    got = parquet_rows(receiver.config.dataset)
    assert len(got) == 5 and spans[0]["spanId"] in {r["span_id"] for r in got}
    assert receiver.metrics.snapshot()["spans_rejected"] == 1


@pytest.mark.parametrize(
    ("body", "ctype", "encoding"),
    [
        (b"\xff\xff\xff\x0f garbage", "application/x-protobuf", None),
        (b'{"resourceSpans": [', "application/json", None),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}', "application/json", None),
        (gzip.compress(b"x" * 2000)[:-30], "application/x-protobuf", "gzip"),  # truncated gzip
        (b"not gzip at all", "application/x-protobuf", "gzip"),
    ],
    ids=["protobuf", "json-syntax", "json-bad-hex", "truncated-gzip", "not-gzip"],
)
def test_malformed_bodies_are_400(receiver: Receiver, body: bytes, ctype: str, encoding: str | None) -> None:
    headers = {"Content-Encoding": encoding} if encoding else {}
    status, resp_headers, raw = post(receiver, body, ctype, **headers)
    assert status == 400
    if ctype == "application/x-protobuf":
        error = Status()
        error.ParseFromString(raw)
        assert error.message
    else:
        assert json.loads(raw)["message"]
    receiver.stop()
    assert parquet_rows(receiver.config.dataset) == []
    assert receiver.metrics.snapshot()["requests_rejected"] == 1


def test_gzip_body_is_accepted(receiver: Receiver) -> None:
    status, _, _ = post(receiver, gzip.compress(payload(2)), **{"Content-Encoding": "gzip"})
    assert status == 200
    receiver.stop()
    assert len(parquet_rows(receiver.config.dataset)) == 4


@pytest.mark.parametrize("ctype", ["text/plain", "application/grpc", ""])
def test_wrong_content_type_is_415(receiver: Receiver, ctype: str) -> None:
    status, _, _ = post(receiver, payload(), ctype)
    assert status == 415


def test_unknown_content_encoding_is_415(receiver: Receiver) -> None:
    status, _, _ = post(receiver, payload(), **{"Content-Encoding": "br"})
    assert status == 415


def test_oversized_body_is_413(make_receiver) -> None:
    receiver = make_receiver(max_request_bytes=4096)
    status, _, _ = post(receiver, payload(200))
    assert status == 413
    bomb = gzip.compress(b"\0" * 100_000)  # small on the wire, large inflated
    status, _, _ = post(receiver, bomb, **{"Content-Encoding": "gzip"})
    assert status == 413
    assert post(receiver, payload(1))[0] == 200  # still serving


def test_overload_sheds_with_429_and_retry_after(make_receiver) -> None:
    receiver = make_receiver(max_wal_backlog_bytes=1, flush_seconds=3600)
    assert post(receiver, payload(1))[0] == 200  # fills the (tiny) WAL backlog
    status, headers, _ = post(receiver, payload(1))
    assert status == 429 and headers["Retry-After"] == "1"
    assert receiver.metrics.snapshot()["requests_shed"] == 1


def test_draining_receiver_answers_503(receiver: Receiver) -> None:
    receiver._draining = True
    status, headers, _ = post(receiver, payload(1))
    assert status == 503 and "Retry-After" in headers
    assert get(receiver, "/healthz")[0] == 503
    receiver._draining = False


def test_client_disconnect_mid_body_stores_nothing(receiver: Receiver) -> None:
    assert receiver.http_address is not None
    body = payload(5)
    with socket.create_connection(("127.0.0.1", receiver.http_address[1]), timeout=10) as sock:
        head = (
            "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        sock.sendall(head.encode() + body[: len(body) // 2])
    # The server notices the short body, stores nothing, and keeps serving.
    assert post(receiver, payload(1))[0] == 200
    receiver.stop()
    assert len(parquet_rows(receiver.config.dataset)) == 2
    m = receiver.metrics.snapshot()
    assert m["requests_rejected"] == 1 and m["spans_accepted"] == 2


def test_health_metrics_and_unknown_path(receiver: Receiver) -> None:
    assert post(receiver, payload(2))[0] == 200
    status, body = get(receiver, "/healthz")
    assert status == 200 and json.loads(body)["status"] == "ok"
    status, body = get(receiver, "/metrics")
    text = body.decode()
    assert status == 200
    for name in ("spans_received_total 4", "spans_accepted_total 4", "spans_rejected_total 0", "otel_replay_wal_bytes"):
        assert name in text
    assert post(receiver, payload(1), path="/v1/metrics")[0] == 404
    assert get(receiver, "/nope")[0] == 404
