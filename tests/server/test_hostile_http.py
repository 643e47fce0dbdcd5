"""Hostile OTLP/HTTP clients: slowloris, connection floods, gzip bombs, multi-member gzip, deep JSON, hang-ups."""

from __future__ import annotations

import gzip
import json
import logging
import socket
import struct
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest
from google.rpc import code_pb2
from google.rpc.status_pb2 import Status
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from otel_replay.server import Receiver
from otel_replay.server.admission import PROTOBUF_EXPANSION

from .conftest import make_spans, parquet_rows
from .test_http_errors import get, payload, post

MiB = 1024 * 1024
METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _port(receiver: Receiver) -> int:
    assert receiver.http_address is not None
    return receiver.http_address[1]


def _grpc_export(receiver: Receiver, body: bytes) -> ExportTraceServiceResponse:
    assert receiver.grpc_address is not None
    with grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_address[1]}") as channel:
        call = channel.unary_unary(METHOD, response_deserializer=ExportTraceServiceResponse.FromString)
        return call(body, timeout=10)


@contextmanager
def trickling(receiver: Receiver, count: int, declared: int = 32 * MiB) -> Iterator[list[socket.socket]]:
    """``count`` connections that declare a ``declared``-byte body and send only its first bytes."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", _port(receiver)), timeout=10)
            head = (
                "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                f"Content-Length: {declared}\r\n\r\n"
            )
            sock.sendall(head.encode() + b"\n")
            socks.append(sock)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def _closed_by_server(sock: socket.socket, within: float = 30.0) -> bool:
    """True once the server closes ``sock`` (recv returns EOF or a reset)."""
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def _metric(receiver: Receiver, name: str) -> int:
    return receiver.metrics.snapshot()[name]


# --- item 6: starvation -----------------------------------------------------------------------------


def test_trickling_connections_do_not_hold_the_inflight_budget(make_receiver) -> None:
    # The reproduction: the default budget (128 MiB) and limit (32 MiB); four connections declare
    # 32 MiB each and trickle. Budgeting declared lengths made every other request 429 / RESOURCE_EXHAUSTED.
    receiver = make_receiver()
    assert receiver.config.max_inflight_bytes == 4 * receiver.config.max_request_bytes
    with trickling(receiver, 4) as socks:
        time.sleep(0.3)  # let the server read the headers and the first byte of each
        for sock in socks:
            sock.sendall(b"\n")
        status, _, _ = post(receiver, payload(3))
        assert status == 200
        assert _grpc_export(receiver, payload(2)) == ExportTraceServiceResponse()
        assert _metric(receiver, "requests_shed") == 0
    receiver.stop()
    assert len(parquet_rows(receiver.config.dataset)) == 10


def test_slow_client_is_dropped_at_the_read_timeout_and_counted(make_receiver) -> None:
    receiver = make_receiver(read_timeout_seconds=1.0)
    with trickling(receiver, 1, declared=1000) as (body_sock,):
        header_sock = socket.create_connection(("127.0.0.1", _port(receiver)), timeout=10)
        header_sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")  # headers never finish
        try:
            assert _closed_by_server(body_sock)
            assert _closed_by_server(header_sock)
        finally:
            header_sock.close()
    assert _metric(receiver, "connections_timed_out") == 2
    assert post(receiver, payload(1))[0] == 200  # a well-behaved client is unaffected
    receiver.stop()
    assert len(parquet_rows(receiver.config.dataset)) == 2  # nothing of the slow bodies was stored


def test_connections_over_the_cap_get_503_with_retry_after(make_receiver) -> None:
    receiver = make_receiver(max_connections=3)
    with trickling(receiver, 3, declared=1000):
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", _port(receiver)), timeout=10) as extra:
            reply = b""
            while chunk := extra.recv(4096):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in reply
        assert _metric(receiver, "connections_refused") == 1
    end = time.monotonic() + 10
    while True:  # the trickling connections' slots free up once they hang up
        try:
            if post(receiver, payload(1))[0] == 200:
                break
        except OSError:  # refused at the cap while still sending
            pass
        assert time.monotonic() < end, "connection slots were never released"
        time.sleep(0.05)


# --- item 7: decompression bombs and multi-member gzip -----------------------------------------------


def _zeros_gzip(total: int) -> bytes:
    """gzip of ``total`` zero bytes, built without holding them in memory."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(MiB)
    parts = [packer.compress(block) for _ in range(total // MiB)]
    return b"".join(parts) + packer.flush()


@pytest.mark.slow
@pytest.mark.parametrize("ratio", [200, 0], ids=["ratio-limit", "size-limit-only"])
def test_gzip_bomb_is_413_without_inflating_past_the_limit(make_receiver, ratio: int) -> None:
    limit = 4 * MiB
    receiver = make_receiver(max_request_bytes=limit, max_inflate_ratio=ratio, bomb_delay_seconds=0.1)
    bomb = _zeros_gzip(256 * MiB)  # ~250 KiB on the wire
    assert len(bomb) < limit
    status, _, raw = post(receiver, bomb, **{"Content-Encoding": "gzip"})
    assert status == 413
    error = Status.FromString(raw)
    assert error.code == code_pb2.RESOURCE_EXHAUSTED and "inflates" in error.message
    # Inflation stopped at the limit: the request was charged for at most the limit (x the decoding factor)
    # plus one read step; inflating the whole bomb would have charged 256 MiB x the factor.
    text = get(receiver, "/metrics")[1].decode()
    peak = next(int(line.split()[1]) for line in text.splitlines() if line.startswith("otel_replay_inflight_bytes_pe"))
    assert 0 < peak <= PROTOBUF_EXPANSION * limit + 64 * 1024
    assert _metric(receiver, "requests_too_large") == 1
    assert post(receiver, payload(1))[0] == 200


def test_multi_member_gzip_stores_every_member(receiver: Receiver) -> None:
    first, second = payload(2), payload(3)  # concatenated protobuf messages merge their repeated fields
    body = gzip.compress(first) + gzip.compress(second)
    status, _, raw = post(receiver, body, **{"Content-Encoding": "gzip"})
    assert status == 200 and not ExportTraceServiceResponse.FromString(raw).HasField("partial_success")
    receiver.stop()
    assert len(parquet_rows(receiver.config.dataset)) == 10


def test_gzip_member_followed_by_garbage_is_400_and_stores_nothing(receiver: Receiver) -> None:
    body = gzip.compress(payload(2)) + b"this is not gzip"
    status, _, _ = post(receiver, body, **{"Content-Encoding": "gzip"})
    assert status == 400
    receiver.stop()
    assert parquet_rows(receiver.config.dataset) == []


# --- item 11: deep JSON, hang-ups, one line per failure ----------------------------------------------


def test_deeply_nested_otlp_json_is_400(receiver: Receiver) -> None:
    depth = 100_000
    body = ('{"resourceSpans":' + "[" * depth + "]" * depth + "}").encode()
    status, _, raw = post(receiver, body, "application/json")
    assert status == 400
    assert json.loads(raw)["code"] == code_pb2.INVALID_ARGUMENT
    assert post(receiver, payload(1))[0] == 200


def test_clients_hanging_up_leave_no_traceback(
    receiver: Receiver, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    body = payload(50)
    head = (
        "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    pipelined = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 3000  # replies fill the socket buffers: writes block
    with caplog.at_level(logging.DEBUG, logger="otel_replay.server"):
        for n in range(12):
            sock = socket.create_connection(("127.0.0.1", _port(receiver)), timeout=10)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset
            sock.sendall(pipelined if n % 3 == 0 else head + (body if n % 3 == 1 else body[:100]))
            time.sleep(0.1)
            sock.close()  # the server is mid-write (BrokenPipe / ConnectionReset) or mid-read
        assert post(receiver, payload(1))[0] == 200
        receiver.stop()
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert "Traceback" not in capfd.readouterr().err


def test_http_error_bodies_use_google_rpc_code_names(make_receiver) -> None:
    receiver = make_receiver(max_wal_backlog_bytes=1, flush_seconds=3600)
    assert post(receiver, payload(1))[0] == 200
    status, headers, raw = post(receiver, payload(1))
    assert status == 429 and Status.FromString(raw).code == code_pb2.RESOURCE_EXHAUSTED


def test_out_of_range_times_are_refused_per_span_over_http_json(receiver: Receiver) -> None:
    from otel_replay.server.otlp_json import request_to_obj

    request = encode_spans(make_spans(2))
    obj = request_to_obj(request)
    spans = obj["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans[0]["startTimeUnixNano"] = str(2**64 - 1)
    status, _, raw = post(receiver, json.dumps(obj).encode(), "application/json")
    assert status == 200
    partial = json.loads(raw)["partialSuccess"]
    assert partial["rejectedSpans"] == "1" and "start_time_unix_nano" in partial["errorMessage"]
    receiver.stop()
    assert len(parquet_rows(receiver.config.dataset)) == 3
