"""OTLP/gRPC status codes: malformed messages, size limit, load shedding, partial success."""

from __future__ import annotations

import grpc
import pytest
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from otel_replay.server import Receiver

from .conftest import make_spans, parquet_rows

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _export_for(receiver: Receiver):
    assert receiver.grpc_address is not None
    channel = grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_address[1]}")
    call = channel.unary_unary(
        METHOD, request_serializer=None, response_deserializer=ExportTraceServiceResponse.FromString
    )

    def send(body: bytes) -> ExportTraceServiceResponse:
        return call(body, timeout=10)

    send.close = channel.close  # type: ignore[attr-defined]
    return send


def test_malformed_protobuf_is_invalid_argument(receiver: Receiver) -> None:
    send = _export_for(receiver)
    try:
        with pytest.raises(grpc.RpcError) as info:
            send(b"\xff\xff\xff\x0f garbage")
        assert info.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)
        assert send(encode_spans(make_spans(1)).SerializeToString()) == ExportTraceServiceResponse()
    finally:
        send.close()
    receiver.stop()
    assert len(parquet_rows(receiver.config.dataset)) == 2


def test_partial_success_for_spans_without_valid_ids(receiver: Receiver) -> None:
    request = encode_spans(make_spans(2))
    request.resource_spans[0].scope_spans[0].spans[0].trace_id = b"\x01\x02"
    send = _export_for(receiver)
    try:
        response = send(request.SerializeToString())
    finally:
        send.close()
    assert response.partial_success.rejected_spans == 1 and "trace_id" in response.partial_success.error_message
    receiver.stop()
    assert len(parquet_rows(receiver.config.dataset)) == 3


def test_oversized_message_is_resource_exhausted(make_receiver) -> None:
    receiver = make_receiver(max_request_bytes=2048)
    send = _export_for(receiver)
    try:
        with pytest.raises(grpc.RpcError) as info:
            send(encode_spans(make_spans(100)).SerializeToString())
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        send.close()


def test_shedding_is_resource_exhausted_with_retry_info(make_receiver) -> None:
    receiver = make_receiver(max_wal_backlog_bytes=1, flush_seconds=3600)
    send = _export_for(receiver)
    body = encode_spans(make_spans(1)).SerializeToString()
    try:
        send(body)
        with pytest.raises(grpc.RpcError) as info:
            send(body)
    finally:
        send.close()
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    retry = RetryInfo()
    retry.ParseFromString(dict(info.value.trailing_metadata())["google.rpc.retryinfo-bin"])
    assert retry.retry_delay.seconds == 1


def test_shedding_carries_retry_info_in_the_grpc_status_details(make_receiver) -> None:
    """What the Collector's otlp exporter reads (grpc-go ``status.Details()``): without it, it drops the batch."""
    receiver = make_receiver(max_wal_backlog_bytes=1, flush_seconds=3600, retry_after_seconds=3)
    send = _export_for(receiver)
    body = encode_spans(make_spans(1)).SerializeToString()
    try:
        send(body)
        with pytest.raises(grpc.RpcError) as info:
            send(body)
    finally:
        send.close()
    trailers = dict(info.value.trailing_metadata())
    status = Status.FromString(trailers["grpc-status-details-bin"])
    assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0] == info.value.code().value[0]
    assert status.message == info.value.details() == "write-ahead log backlog is full; retry later"
    (detail,) = status.details
    retry = RetryInfo()
    assert detail.Unpack(retry) and retry.retry_delay.seconds == 3
    assert RetryInfo.FromString(trailers["google.rpc.retryinfo-bin"]) == retry  # the Python SDK's trailer, kept


def test_calls_that_never_send_their_message_neither_pin_workers_nor_fill_a_cap(make_receiver) -> None:
    """grpcio's concurrent-call cap answered RESOURCE_EXHAUSTED without RetryInfo (a Collector drops the batch)."""
    import threading
    import time

    receiver = make_receiver(grpc_workers=2, http=None)  # the old cap: 8 x 2 = 16 calls; 2 worker threads
    assert receiver.grpc_address is not None
    target = f"127.0.0.1:{receiver.grpc_address[1]}"
    hold = threading.Event()

    def never():  # a request stream that never yields its message
        hold.wait()
        yield from ()

    # Another client, on a connection of its own: on one connection calls past the stream cap
    # (max_inflight_bytes // max_request_bytes) wait in the client for a stream, so they are not refused either.
    idle_channel = grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
    idle = [idle_channel.stream_unary(METHOD).future(never()) for _ in range(40)]
    send = _export_for(receiver)
    try:
        time.sleep(1.0)  # let the idle calls reach the server first (not an assertion on time)
        assert not any(call.done() for call in idle)  # none refused
        body = encode_spans(make_spans(1)).SerializeToString()
        for _ in range(3):
            assert send(body) == ExportTraceServiceResponse()
    finally:
        hold.set()
        for call in idle:
            call.cancel()
        idle_channel.close()
        send.close()
    receiver.stop()
    assert len(parquet_rows(receiver.config.dataset)) == 6
