"""OTLP/gRPC with gzip: grpc core hands the service the compressed bytes, inflated within the budget and ratio."""

from __future__ import annotations

import random

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_replay.server import Receiver

from .conftest import expected_rows, make_spans, parquet_rows

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
MiB = 1 << 20


def _call(receiver: Receiver, body: bytes, compression: grpc.Compression) -> ExportTraceServiceResponse:
    assert receiver.grpc_address is not None
    with grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_address[1]}", compression=compression) as channel:
        call = channel.unary_unary(
            METHOD, request_serializer=None, response_deserializer=ExportTraceServiceResponse.FromString
        )
        return call(body, timeout=30)


@pytest.mark.parametrize(
    "compression", [grpc.Compression.Gzip, grpc.Compression.Deflate, grpc.Compression.NoCompression]
)
def test_sdk_grpc_exporter_with_and_without_gzip_stores_every_span(make_receiver, compression) -> None:
    receiver = make_receiver(http=None)
    spans = make_spans(300)  # ~100 KiB of protobuf: gzip shrinks it, so it really travels compressed
    assert receiver.grpc_address is not None
    exporter = GrpcExporter(
        endpoint=f"127.0.0.1:{receiver.grpc_address[1]}", insecure=True, timeout=10, compression=compression
    )
    try:
        assert exporter.export(spans) == SpanExportResult.SUCCESS
        assert exporter.export(spans[:1]) == SpanExportResult.SUCCESS  # tiny: grpc core sends it plain
    finally:
        exporter.shutdown()
    receiver.stop()
    assert parquet_rows(receiver.config.dataset) == sorted(
        expected_rows(spans) + expected_rows(spans[:1]), key=lambda r: (r["trace_id"], r["span_id"])
    )


@pytest.mark.parametrize("compression", [grpc.Compression.Gzip, grpc.Compression.Deflate])
def test_bomb_is_refused_after_a_few_steps_as_invalid_argument(make_receiver, compression) -> None:
    # 30 MiB of zeros after a valid start: ~30 KiB on the wire, inside max_receive_message_length (32 MiB).
    receiver = make_receiver(http=None, bomb_delay_seconds=0)
    with pytest.raises(grpc.RpcError) as info:
        _call(receiver, b"\x0a\x00" + bytes(30 * MiB), compression)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # permanent: no client retries a bomb
    kind = "gzip" if compression == grpc.Compression.Gzip else "deflate"
    assert "200:1" in info.value.details() and f"{kind} message" in info.value.details()
    # Before the fix grpc core inflated it whole and the service charged 7 x 30 MiB.
    assert receiver._inflight_peak < 2 * MiB
    assert receiver.metrics.snapshot()["requests_too_large"] == 1
    # The service still takes a normal gzip request afterwards.
    body = encode_spans(make_spans(50)).SerializeToString()
    assert _call(receiver, body, compression) == ExportTraceServiceResponse()


def test_gzip_message_inflating_past_the_request_limit_is_resource_exhausted(make_receiver) -> None:
    receiver = make_receiver(http=None, max_request_bytes=1 * MiB, bomb_delay_seconds=0)
    request = encode_spans(make_spans(1))
    text = "".join(random.Random(7).choices("ab", k=3 * MiB))  # compresses well under 200:1, to ~0.4 MiB
    request.resource_spans[0].scope_spans[0].spans[0].name = text
    with pytest.raises(grpc.RpcError) as info:
        _call(receiver, request.SerializeToString(), grpc.Compression.Gzip)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"past the {MiB} byte limit" in info.value.details()
    assert receiver._inflight_peak < 16 * MiB


def test_invalid_gzip_is_invalid_argument_naming_the_byte(receiver: Receiver) -> None:
    # A message that starts like gzip but is not: grpc core never inflated such a message before either.
    with pytest.raises(grpc.RpcError) as info:
        _call(receiver, b"\x1f\x8b\x08\x00garbage", grpc.Compression.NoCompression)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "gzip message" in info.value.details()


def test_concurrent_calls_on_one_connection_with_a_budget_of_one_request_all_succeed(make_receiver) -> None:
    receiver = make_receiver(http=None, max_request_bytes=1 * MiB, max_inflight_bytes=1 * MiB)
    assert receiver.grpc_address is not None
    bodies = [encode_spans(make_spans(20, service=f"s{i}")).SerializeToString() for i in range(8)]
    with grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_address[1]}") as channel:
        call = channel.unary_unary(
            METHOD, request_serializer=None, response_deserializer=ExportTraceServiceResponse.FromString
        )
        futures = [call.future(body, timeout=30) for body in bodies]
        assert [f.result() for f in futures] == [ExportTraceServiceResponse()] * 8
    receiver.stop()
    assert len(parquet_rows(receiver.config.dataset)) == 8 * 40
