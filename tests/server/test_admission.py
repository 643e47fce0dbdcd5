"""Admission refuses exactly what the row conversion would refuse: every acknowledged span reaches Parquet.

The property test mutates valid requests (bytes, field values, unknown fields
of every wire type inside spans, events, links and attributes) and checks
that whatever :func:`admit_spans` keeps converts, whole, with no span lost.
"""

from __future__ import annotations

import http.client
import random
from collections.abc import Callable

import pytest
from google.protobuf.message import DecodeError
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from otel_replay.exporters.rows import payload_to_table
from otel_replay.server import Receiver
from otel_replay.storage.convert import MAX_DATES_PER_REQUEST, admit_spans

from .conftest import make_spans, parquet_rows

_DAY_NS = 86_400 * 10**9


def _post(receiver: Receiver, body: bytes) -> tuple[int, ExportTraceServiceResponse]:
    assert receiver.http_address is not None
    conn = http.client.HTTPConnection("127.0.0.1", receiver.http_address[1], timeout=30)
    try:
        conn.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
        response = conn.getresponse()
        return response.status, ExportTraceServiceResponse.FromString(response.read())
    finally:
        conn.close()


def _spans(request: ExportTraceServiceRequest) -> list:
    return [span for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _unknown_field(rnd: random.Random) -> bytes:
    """One well-formed field of a random number (often one the message defines) and wire type."""
    number = rnd.choice([1, 2, 3, 4, 5, 7, 9, 10, 11, 12, 13, 15, 16, 99])
    wire = rnd.choice([0, 1, 2, 5])
    tag = _varint(number << 3 | wire)
    if wire == 0:
        return tag + _varint(rnd.choice([0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1]))
    if wire == 1:
        return tag + rnd.randbytes(8)
    if wire == 5:
        return tag + rnd.randbytes(4)
    payload = rnd.choice([b"", b"abc", rnd.randbytes(rnd.randrange(1, 20)), b"\x09" + bytes(8), b"\x0a\x01x"])
    return tag + _varint(len(payload)) + payload


def _merge_unknown(message: object, rnd: random.Random) -> None:
    try:
        message.MergeFromString(_unknown_field(rnd))  # type: ignore[attr-defined]
    except DecodeError:
        pass  # it names a field of the message whose content it does not fit: not a request anyone can send


def _mutate_fields(request: ExportTraceServiceRequest, rnd: random.Random) -> None:
    spans = _spans(request)
    for _ in range(rnd.randint(1, 3)):
        span = rnd.choice(spans)
        choice = rnd.randrange(9)
        if choice == 0:
            field = rnd.choice(["dropped_attributes_count", "dropped_events_count", "dropped_links_count"])
            setattr(span, field, rnd.choice([2**31 - 1, 2**31, 2**32 - 1, 7]))
        elif choice == 1:
            span.trace_id = rnd.choice([bytes(16), rnd.randbytes(16), rnd.randbytes(15), b""])
        elif choice == 2:
            span.span_id = rnd.choice([bytes(8), rnd.randbytes(8), rnd.randbytes(9)])
        elif choice == 3:
            field = rnd.choice(["start_time_unix_nano", "end_time_unix_nano"])
            setattr(span, field, rnd.choice([0, 2**63 - 2, 2**63 - 1, 2**64 - 1, rnd.randrange(2**63)]))
        elif choice == 4 and span.events:
            _merge_unknown(span.events[rnd.randrange(len(span.events))], rnd)
        elif choice == 5 and span.links:
            _merge_unknown(span.links[0], rnd)
        elif choice == 6 and span.attributes:
            _merge_unknown(span.attributes[rnd.randrange(len(span.attributes))], rnd)
        elif choice == 7:
            event = span.events.add(name="x", time_unix_nano=rnd.randrange(2**63))
            _merge_unknown(event, rnd)
        else:
            _merge_unknown(span, rnd)


def _mutate_bytes(payload: bytes, rnd: random.Random) -> bytes:
    data = bytearray(payload)
    for _ in range(rnd.randint(1, 4)):
        at = rnd.randrange(len(data))
        op = rnd.random()
        if op < 0.5:
            data[at] = rnd.randrange(256)
        elif op < 0.75:
            del data[at]
        else:
            data.insert(at, rnd.randrange(256))
    return bytes(data)


@pytest.mark.slow
def test_every_admitted_span_of_mutated_requests_converts() -> None:
    base = encode_spans(make_spans(3))
    rnd = random.Random(20261126)
    admitted = refused = 0
    for round_ in range(3000):
        request = ExportTraceServiceRequest()
        request.CopyFrom(base)
        _mutate_fields(request, rnd)
        payload = request.SerializeToString()
        if round_ % 2:
            payload = _mutate_bytes(payload, rnd)
        try:
            request = ExportTraceServiceRequest.FromString(payload)
        except DecodeError:
            continue  # a 400: nothing acknowledged
        result = admit_spans(request, max_dates=MAX_DATES_PER_REQUEST)
        refused += result.rejected
        if not result.accepted:
            continue
        admitted += result.accepted
        kept = request.SerializeToString()  # what the WAL holds
        table = payload_to_table(kept)  # no ``rejected`` list: any refusal raises
        assert table.num_rows == result.accepted, payload.hex()
        expected = sorted(span.span_id.hex() for span in _spans(request))
        assert sorted(table.column("span_id").to_pylist()) == expected, payload.hex()
    assert admitted > 5_000 and refused > 500  # both sides were exercised


def test_spans_the_conversion_would_refuse_are_refused_at_admission_not_lost(
    make_receiver: Callable[..., Receiver],
) -> None:
    receiver = make_receiver()
    request = encode_spans(make_spans(2))
    spans = _spans(request)
    spans[0].dropped_attributes_count = 2**31  # a valid uint32, past the int32 column
    spans[1].trace_id = bytes(16)  # all zero: invalid in OTLP
    event = spans[2].events.add(name="e", time_unix_nano=spans[2].start_time_unix_nano)
    event.MergeFromString(b"\x0a\x03abc")  # an unknown field 1 of wire type 2: the real parser keeps it
    status, response = _post(receiver, request.SerializeToString())
    assert status == 200 and response.partial_success.rejected_spans == 2
    assert "dropped counts" in response.partial_success.error_message
    receiver.stop()
    metrics = receiver.metrics.snapshot()
    assert metrics["spans_rejected_bad_count"] == 1 and metrics["spans_rejected_bad_id"] == 1
    assert metrics["segments_quarantined"] == 0
    rows = parquet_rows(receiver.config.dataset)
    assert len(rows) == len(spans) - 2 == metrics["spans_written"]
    assert spans[2].span_id.hex() in {row["span_id"] for row in rows}


def test_a_request_fanning_out_over_many_dates_is_cut_at_the_date_limit(
    make_receiver: Callable[..., Receiver],
) -> None:
    receiver = make_receiver()
    request = encode_spans(make_spans(1))
    template = _spans(request)[0]
    scope_spans = request.resource_spans[0].scope_spans[0]
    scope_spans.ClearField("spans")
    days = MAX_DATES_PER_REQUEST + 40
    for day in range(days):
        span = scope_spans.spans.add()
        span.CopyFrom(template)
        span.span_id = (day + 1).to_bytes(8, "big")
        span.start_time_unix_nano = span.end_time_unix_nano = 1_700_000_000 * 10**9 + day * _DAY_NS
    status, response = _post(receiver, request.SerializeToString())
    assert status == 200 and response.partial_success.rejected_spans == 40
    assert "distinct start dates" in response.partial_success.error_message
    receiver.stop()
    assert receiver.metrics.snapshot()["spans_rejected_too_many_dates"] == 40
    dirs = list((receiver.config.dataset / "spans").glob("date=*"))
    assert len(dirs) == MAX_DATES_PER_REQUEST
    assert len(parquet_rows(receiver.config.dataset)) == MAX_DATES_PER_REQUEST


def test_refused_spans_are_removed_keeping_the_order_of_the_rest() -> None:
    request = encode_spans(make_spans(50))
    spans = _spans(request)
    for span in spans[::3]:
        span.span_id = b"short"
    expected = [span.span_id for span in spans if len(span.span_id) == 8]
    result = admit_spans(request)
    assert result.rejected == len(spans[::3]) and result.bad_ids == result.rejected
    assert [span.span_id for span in _spans(request)] == expected


def test_resource_and_scope_repeated_per_span_are_bounded_per_request() -> None:
    request = encode_spans(make_spans(30))
    resource = request.resource_spans[0].resource
    big = resource.attributes.add()
    big.key, big.value.string_value = "blob", "x" * 4096
    spans = _spans(request)
    per_span = resource.ByteSize() + request.resource_spans[0].scope_spans[0].scope.ByteSize()
    limit = per_span * 10 + per_span // 2  # room for ten spans
    result = admit_spans(request, max_shared_bytes=limit)
    assert result.accepted == 10 and result.too_much_shared == result.rejected == len(spans) - 10
    assert "resource and scope" in result.message
    assert len(_spans(request)) == 10


def test_a_small_request_with_a_large_resource_is_cut_before_it_is_acknowledged(
    make_receiver: Callable[..., Receiver],
) -> None:
    from otel_replay.storage.convert import MAX_SHARED_BYTES_PER_REQUEST

    receiver = make_receiver()
    request = encode_spans(make_spans(1))
    big = request.resource_spans[0].resource.attributes.add()
    big.key, big.value.string_value = "blob", "x" * (MAX_SHARED_BYTES_PER_REQUEST // 8)
    scope_spans = request.resource_spans[0].scope_spans[0]
    template = scope_spans.spans[0]
    for i in range(20):
        span = scope_spans.spans.add()
        span.CopyFrom(template)
        span.span_id = (1000 + i).to_bytes(8, "big")
    spans = len(_spans(request))
    status, response = _post(receiver, request.SerializeToString())
    assert status == 200 and response.partial_success.rejected_spans == spans - 7  # 8 x (1/8 + a few bytes) > limit
    receiver.stop()
    assert receiver.metrics.snapshot()["spans_rejected_resource_too_large"] == spans - 7
    assert len(parquet_rows(receiver.config.dataset)) == 7
