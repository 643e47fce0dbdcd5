"""Hostile clients at the protocol layer: ambiguous Content-Length, header floods, idle gRPC calls, decode bombs."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf.internal.encoder import _VarintBytes
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from otel_replay.errors import PayloadError
from otel_replay.server import Receiver
from otel_replay.server.admission import MAX_DECODE_FACTOR, PROTOBUF_EXPANSION, decode_charge
from otel_replay.server.http_service import MAX_HEADER_BYTES
from otel_replay.server.otlp_json import request_from_json
from otel_replay.server.server import MAX_REPLY_MESSAGE

from .conftest import make_spans, parquet_rows
from .test_http_errors import payload, post
from .test_otlp_json import document

MiB = 1024 * 1024
METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _raw_exchange(receiver: Receiver, head: bytes, body: bytes = b"") -> bytes:
    """Send a hand-written request; return everything the server sends back until it closes (or 5 s pass)."""
    assert receiver.http_address is not None
    reply = b""
    with socket.create_connection(("127.0.0.1", receiver.http_address[1]), timeout=5) as sock:
        try:
            sock.sendall(head + body)
            while chunk := sock.recv(65536):
                reply += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass
        except TimeoutError:
            reply += b"<still open>"
    return reply


def _head(*headers: str) -> bytes:
    lines = ["POST /v1/traces HTTP/1.1", "Host: x", "Content-Type: application/x-protobuf", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


# --- Content-Length -----------------------------------------------------------------------------------


def test_conflicting_content_lengths_are_400_and_close(receiver: Receiver) -> None:
    body = payload(3)
    reply = _raw_exchange(receiver, _head("Content-Length: 0", f"Content-Length: {len(body)}"), body)
    assert reply.startswith(b"HTTP/1.1 400"), reply[:80]
    assert b"conflicting Content-Length" in reply
    assert reply.count(b"HTTP/1.1") == 1 and not reply.endswith(b"<still open>")  # the body was not a request
    # Connection: close, so the reply ends when the server closes (a kept-alive one waited out _raw_exchange's 5 s)
    twice = _head(f"Content-Length: {len(body)}", f"Content-Length: {len(body)}", "Connection: close")
    same = _raw_exchange(receiver, twice, body)
    assert same.startswith(b"HTTP/1.1 200"), same[:80]  # the same value twice is not ambiguous
    assert same.count(b"HTTP/1.1") == 1 and not same.endswith(b"<still open>")
    receiver.stop()
    assert len(parquet_rows(receiver.config.dataset)) == 6  # payload(3): three parents, three children


@pytest.mark.parametrize("value", ["\u00b2", "+3", "3 3", "0x10", "-1"])
def test_content_length_that_is_not_ascii_digits_is_400(receiver: Receiver, value: str) -> None:
    reply = _raw_exchange(receiver, _head(f"Content-Length: {value}"), b"\x0a\x00")
    assert reply.startswith(b"HTTP/1.1 400"), reply[:80]
    assert b"bad Content-Length" in reply


def test_transfer_encoding_is_refused(receiver: Receiver) -> None:
    chunked = _raw_exchange(receiver, _head("Transfer-Encoding: chunked"), b"2\r\n\x0a\x00\r\n0\r\n\r\n")
    assert chunked.startswith(b"HTTP/1.1 411"), chunked[:80]
    both = _raw_exchange(receiver, _head("Transfer-Encoding: chunked", "Content-Length: 2"), b"\x0a\x00")
    assert both.startswith(b"HTTP/1.1 400") and b"Transfer-Encoding" in both, both[:80]


# --- header floods ------------------------------------------------------------------------------------


def test_request_head_over_the_cap_is_431_and_closed(receiver: Receiver) -> None:
    pads = [f"X-Pad-{i}: {'a' * 8000}" for i in range(2 * MAX_HEADER_BYTES // 8000)]
    reply = _raw_exchange(receiver, _head("Content-Length: 2", *pads), b"\x0a\x00")
    assert reply.startswith(b"HTTP/1.1 431"), reply[:80]
    assert b"Connection: close" in reply and not reply.endswith(b"<still open>")
    assert receiver.metrics.snapshot()["requests_rejected"] == 1
    long_line = _raw_exchange(receiver, b"POST /" + b"a" * (MAX_HEADER_BYTES + 10) + b" HTTP/1.1\r\n\r\n")
    assert long_line.startswith(b"HTTP/1.1 4"), long_line[:80]  # 414 (stdlib) or 431: refused either way
    body = payload(2)
    pads = [f"X-Pad-{i}: {'a' * 8000}" for i in range(MAX_HEADER_BYTES // 8000 - 1)]
    fits = _raw_exchange(receiver, _head(f"Content-Length: {len(body)}", "Connection: close", *pads), body)
    assert fits.startswith(b"HTTP/1.1 200"), fits[:80]  # just under the cap: served


# --- gRPC: idle calls ---------------------------------------------------------------------------------


def test_idle_grpc_calls_do_not_starve_the_service(make_receiver) -> None:
    # Calls that send headers and never their message each hold a worker thread; with every worker held,
    # a well-behaved Export waited for ever (DEADLINE_EXCEEDED). Connections are now cut at read-timeout age
    # plus the same grace, which cancels the stuck calls and frees their threads.
    receiver = make_receiver(grpc_workers=2, read_timeout_seconds=1.0)
    assert receiver.grpc_address is not None
    target = f"127.0.0.1:{receiver.grpc_address[1]}"
    hold = threading.Event()

    def never() -> Iterator[bytes]:
        hold.wait(30)
        return
        yield b""

    attacker = grpc.insecure_channel(target)
    good = grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])  # its own connection
    try:
        stuck = [attacker.stream_unary(METHOD).future(never()) for _ in range(2)]
        time.sleep(0.5)
        export = good.unary_unary(METHOD, response_deserializer=ExportTraceServiceResponse.FromString)
        assert export(payload(2), timeout=15) == ExportTraceServiceResponse()
        for call in stuck:
            assert call.exception(timeout=15) is not None  # cut by the server, not left open
    finally:
        hold.set()
        attacker.close()
        good.close()
    receiver.stop()
    assert len(parquet_rows(receiver.config.dataset)) == 4


# --- decode bombs: charged before decoding, by structure ------------------------------------------------


def _ld(tag: int, data: bytes) -> bytes:
    return bytes([tag]) + _VarintBytes(len(data)) + data


def _empty_values(count: int) -> bytes:
    """A request whose one span holds an array attribute of ``count`` empty AnyValues (2 bytes each)."""
    span = encode_spans(make_spans(1)).resource_spans[0].scope_spans[0].spans[0].SerializeToString()
    attribute = _ld(0x0A, b"a") + _ld(0x12, _ld(0x2A, b"\x0a\x00" * count))
    return _ld(0x0A, _ld(0x12, _ld(0x12, span + _ld(0x4A, attribute))))


def test_decode_charge_covers_bodies_of_tiny_messages() -> None:
    # Measured: an empty AnyValue decodes to ~42 bytes, i.e. 21x its 2 wire bytes; a flat 7x let a 28 MiB body
    # take 760 MiB. Padded tags (0x8a 0x00 for 0x0a) must be counted too.
    values = _empty_values(100_000)
    assert decode_charge(values, as_json=False) >= 21 * len(values)
    padded = values.replace(b"\x0a\x00" * 100_000, b"\x8a\x00\x00" * 100_000)
    assert decode_charge(padded, as_json=False) >= 14 * len(padded)
    sdk = encode_spans(make_spans(500)).SerializeToString()
    # SDK spans stay under the cap (MAX_DECODE_FACTOR) with room: their random ids and values move the charge
    # (17.9x-20.3x over 360 samples), so the bound is 22x, not the median
    charge = decode_charge(sdk, as_json=False)
    assert PROTOBUF_EXPANSION * len(sdk) <= charge <= 22 * len(sdk) < MAX_DECODE_FACTOR * len(sdk)
    empties = ("[" + ",".join(["{}"] * 100_000) + "]").encode()
    assert decode_charge(empties, as_json=True) >= 38 * len(empties)  # measured: 38x its size once parsed


def _peak(receiver: Receiver) -> int:
    text = receiver.metrics_text()
    return next(int(line.split()[1]) for line in text.splitlines() if line.startswith("otel_replay_inflight_bytes_pe"))


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_a_body_of_tiny_messages_is_charged_by_structure(make_receiver, transport: str) -> None:
    receiver = make_receiver()
    body = _empty_values(200_000)
    if transport == "grpc":
        assert receiver.grpc_address is not None
        with grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_address[1]}") as channel:
            channel.unary_unary(METHOD)(body, timeout=30)
    else:
        assert post(receiver, body)[0] == 200
    assert _peak(receiver) >= decode_charge(body, as_json=False) >= 20 * len(body)


def test_a_body_that_would_decode_past_the_cap_is_refused(make_receiver) -> None:
    # One request alone in flight is always let through; the cap keeps its decoding bounded all the same.
    receiver = make_receiver(max_request_bytes=MiB)
    body = _empty_values(480_000)  # 0.9 MiB, under the size limit; charged ~31 MiB (cap: 24 MiB)
    assert len(body) < MiB < decode_charge(body, as_json=False) // MAX_DECODE_FACTOR
    status, _, raw = post(receiver, body)
    assert status == 413 and b"would decode to about" in raw
    assert receiver.grpc_address is not None
    with grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_address[1]}") as channel:
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary(METHOD)(body, timeout=30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert receiver.metrics.snapshot()["requests_too_large"] == 2
    sdk = encode_spans(make_spans(1000)).SerializeToString()
    assert len(sdk) < MiB and post(receiver, sdk)[0] == 200  # SDK spans near the size limit still pass


def test_grpc_garbage_is_invalid_argument_and_counted(receiver: Receiver) -> None:
    assert receiver.grpc_address is not None
    with grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_address[1]}") as channel:
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary(METHOD)(b"\xff\xff\xff\x0f garbage", timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed ExportTraceServiceRequest" in (info.value.details() or "")
    assert receiver.metrics.snapshot()["requests_rejected"] == 1


def test_refused_span_with_a_huge_name_gets_a_short_reply(receiver: Receiver) -> None:
    request = encode_spans(make_spans(1))
    span = request.resource_spans[0].scope_spans[0].spans[0]
    span.span_id = b"\x01"  # refused: wrong length; its name is quoted in the message
    span.name = "\x00" * (1 << 20)
    status, _, raw = post(receiver, request.SerializeToString())
    assert status == 200
    response = ExportTraceServiceResponse.FromString(raw)
    assert response.partial_success.rejected_spans == 1
    assert len(response.partial_success.error_message) <= MAX_REPLY_MESSAGE + 40
    assert len(raw) < 2 * MAX_REPLY_MESSAGE


# --- OTLP/JSON: one field, two spellings; values json_format would silently change ----------------------


def test_one_field_spelled_twice_is_refused() -> None:
    spans = document()
    both_lists = {"resourceSpans": spans["resourceSpans"], "resource_spans": []}
    with pytest.raises(PayloadError, match=r"request: 'resourceSpans' and 'resource_spans' are the same field"):
        request_from_json(json.dumps(both_lists))
    with pytest.raises(PayloadError, match=r"spans\[0\]: 'traceId' and 'trace_id' are the same field"):
        request_from_json(json.dumps(document({"trace_id": "bb" * 16})))


@pytest.mark.parametrize(
    ("span", "expected"),
    [
        ({"kind": 2**40}, "spans[0].kind: enum value 1099511627776 is out of range"),
        ({"status": {"code": -(2**31) - 1}}, "status.code: enum value"),
        # Not JSON integers: json_format applies int() and the 32-bit store wraps (200, stored as another value)
        ({"status": {"code": "4294967297"}}, "spans[0].status.code: enum value 4294967297 is out of range"),
        ({"status": {"code": 4294967298.0}}, "spans[0].status.code: enum value 4294967298 is out of range"),
        ({"kind": "1099511627776"}, "spans[0].kind: enum value 1099511627776 is out of range"),
        ({"kind": 4294967298.0}, "spans[0].kind: enum value 4294967298 is out of range"),
        ({"kind": 1.9}, "spans[0].kind: enum value 1.9 is not an integer"),
        ({"status": {"code": True}}, "spans[0].status.code: enum value True must be a number or a name"),
        ({"attributes": [{"key": "b", "value": {"bytesValue": "!!!"}}]}, "bytesValue is not base64: '!!!'"),
        ({"attributes": [{"key": "b", "value": {"bytesValue": "QUJD="}}]}, "is not base64"),
    ],
)
def test_values_json_format_would_change_are_refused(span: dict[str, object], expected: str) -> None:
    with pytest.raises(PayloadError) as info:
        request_from_json(json.dumps(document(span)))
    assert expected in str(info.value)


def test_valid_enum_names_and_base64_spellings_still_decode() -> None:
    values = [{"key": k, "value": {"bytesValue": v}} for k, v in (("std", "+/8="), ("url", "-_8"), ("e", ""))]
    request = request_from_json(json.dumps(document({"kind": "SPAN_KIND_SERVER", "attributes": values})))
    span = request.resource_spans[0].scope_spans[0].spans[0]
    assert span.kind == 2
    for spelling in (3, 3.0, "3", "SPAN_KIND_CLIENT"):  # in range, integral: what json_format reads as it is
        decoded = request_from_json(json.dumps(document({"kind": spelling})))
        assert decoded.resource_spans[0].scope_spans[0].spans[0].kind == 3
    assert [a.value.bytes_value for a in span.attributes] == [b"\xfb\xff", b"\xfb\xff", b""]
    assert span.trace_id.hex() == "0102030405060708090a0b0c0d0e0f10"


def test_the_http_receiver_refuses_a_field_spelled_twice(receiver: Receiver) -> None:
    body = json.dumps({**document(), "resource_spans": []}).encode()
    status, _, raw = post(receiver, body, ctype="application/json")
    assert status == 400 and b"are the same field" in raw
    receiver.stop()
    assert parquet_rows(receiver.config.dataset) == []
