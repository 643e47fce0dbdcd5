"""OTLP logs on both protocols: the SDK's log exporters into a real serve, the log_records views, hostile input."""

from __future__ import annotations

import gzip
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import otel_replay
from otel_replay.server import Receiver, ServerConfig

from .test_http_errors import post

MiB = 1024 * 1024
LOGS = "/v1/logs"
LOGS_METHOD = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    """One receiver for the module (small request limit, quick sealing)."""
    dataset = tmp_path_factory.mktemp("logs") / "ds"
    config = ServerConfig(
        dataset,
        grpc="127.0.0.1:0",
        http="127.0.0.1:0",
        convert_workers=0,
        flush_seconds=0.1,
        drain_seconds=5.0,
        bomb_delay_seconds=0.0,
        max_request_bytes=4 * MiB,
    )
    receiver = Receiver(config).start()
    yield receiver
    receiver.stop()


def _dataset(receiver: Receiver) -> Path:
    return Path(receiver.config.dataset)


def _log_rows(receiver: Receiver, where: str, count: int) -> list[dict[str, Any]]:
    """The ``log_records`` rows matching ``where`` once ``count`` are converted (or what is there after 60 s)."""
    end = time.monotonic() + 60
    while True:
        with otel_replay.open(_dataset(receiver)) as store:
            found = store.rows(f"SELECT * FROM log_records WHERE {where} ORDER BY observed_time")
        if len(found) >= count or time.monotonic() > end:
            return found
        time.sleep(0.1)


def _record(body: str = "hello", **fields: Any) -> LogRecord:
    record = LogRecord(time_unix_nano=time.time_ns(), observed_time_unix_nano=time.time_ns(), **fields)
    record.body.string_value = body
    return record


def _request(*records: LogRecord, service: str = "hostile") -> ExportLogsServiceRequest:
    request = ExportLogsServiceRequest()
    resource_logs = request.resource_logs.add()
    resource_logs.resource.attributes.add(key="service.name").value.string_value = service
    resource_logs.scope_logs.add().log_records.extend(records)
    return request


def _status(body: bytes) -> str:
    message = Status.FromString(body).message
    assert "\n" not in message
    return message


def _rejected(receiver: Receiver) -> int:
    return receiver.metrics.snapshot()["requests_rejected"]


def test_sdk_log_records_over_http_and_grpc_land_linked_to_their_span(serve: Receiver) -> None:
    http, grpc_port = serve.http_address, serve.grpc_address
    assert http is not None and grpc_port is not None
    resource = Resource.create({"service.name": "agent-logs"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{http[1]}/v1/traces", timeout=10))
    )
    logger_provider = LoggerProvider(resource=resource)
    for exporter in (
        HttpLogExporter(endpoint=f"http://127.0.0.1:{http[1]}{LOGS}", compression=Compression.Gzip, timeout=10),
        GrpcLogExporter(endpoint=f"127.0.0.1:{grpc_port[1]}", insecure=True, timeout=10),
    ):
        logger_provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    logger = logger_provider.get_logger("tests.logs", "0.1")
    with tracer_provider.get_tracer("tests.logs").start_as_current_span("chat gpt-x") as span:
        logger.emit(
            event_name="gen_ai.choice",
            body={"index": 0, "message": {"role": "assistant", "content": "hi", "api_key": "sk-live-0123456789abcdef"}},
            attributes={"gen_ai.provider.name": "openai", "gen_ai.operation.name": "chat"},
        )
    logger.emit(body="outside any span", attributes={"event.name": "app.note"}, severity_text="INFO")
    tracer_provider.shutdown()
    logger_provider.shutdown()
    trace_id, span_id = f"{span.get_span_context().trace_id:032x}", f"{span.get_span_context().span_id:016x}"

    rows = _log_rows(serve, "service_name = 'agent-logs'", 4)  # each record once per protocol
    assert len(rows) == 4
    choices = [r for r in rows if r["event_name"] == "gen_ai.choice"]
    assert len(choices) == 2 and {(r["trace_id"], r["span_id"]) for r in choices} == {(trace_id, span_id)}
    body = json.loads(choices[0]["body"])
    assert body["message"]["content"] == "hi" and body["message"]["api_key"] == "[REDACTED]"
    notes = [r for r in rows if r["event_name"] == "app.note"]  # the event.name attribute, for older SDKs
    assert len(notes) == 2 and notes[0]["trace_id"] is None and json.loads(notes[0]["body"]) == "outside any span"
    with otel_replay.open(_dataset(serve)) as store:
        joined = store.rows(
            "SELECT g.provider, g.operation, s.name FROM genai_events g JOIN spans s USING (trace_id, span_id) "
            "WHERE g.service_name = 'agent-logs'"
        )
    assert joined == [{"provider": "openai", "operation": "chat", "name": "chat gpt-x"}] * 2


def test_wrong_length_ids_are_dropped_and_reported_as_partial_success(serve: Receiver) -> None:
    good = _record("kept", trace_id=bytes(range(1, 17)), span_id=bytes(range(1, 9)))
    short = _record("short id", trace_id=b"\x01" * 15)
    long = _record("long span id", trace_id=b"\x02" * 16, span_id=b"\x03" * 9)
    orphan = _record("span id alone", span_id=b"\x04" * 8)
    before = serve.metrics.snapshot()["log_records_rejected"]
    status, _, body = post(serve, _request(good, short, long, orphan, service="ids").SerializeToString(), path=LOGS)
    assert status == 200
    partial = ExportLogsServiceResponse.FromString(body).partial_success
    assert partial.rejected_log_records == 3
    assert "log record 1" in partial.error_message and "got 15 and 0" in partial.error_message
    assert serve.metrics.snapshot()["log_records_rejected"] - before == 3
    rows = _log_rows(serve, "service_name = 'ids'", 1)
    assert [(r["trace_id"], r["span_id"]) for r in rows] == [(bytes(range(1, 17)).hex(), bytes(range(1, 9)).hex())]
    # rows written are counted once their segment is converted: every accepted record, no rejected one
    end = time.monotonic() + 60
    while (m := serve.metrics.snapshot())["log_rows_written"] < m["log_records_accepted"] and time.monotonic() < end:
        time.sleep(0.05)
    assert m["log_rows_written"] == m["log_records_accepted"] > 0
    assert "otel_replay_log_rows_written_total " in serve.metrics_text() and "logs_written=" in serve.metrics_line()


def test_otlp_json_logs_with_hex_ids(serve: Receiver) -> None:
    document = {
        "resourceLogs": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "json-logs"}}]},
                "scopeLogs": [
                    {
                        "scope": {"name": "j"},
                        "logRecords": [
                            {
                                "timeUnixNano": str(time.time_ns()),
                                "severityNumber": 9,
                                "severityText": "INFO",
                                "eventName": "gen_ai.user.message",
                                "body": _KV_BODY,
                                # the deprecated name the contrib instrumentor still sends by default
                                "attributes": [{"key": "gen_ai.system", "value": {"stringValue": "openai"}}],
                                "traceId": "5b8efff798038103d269b633813fc60c",
                                "spanId": "eee19b7ec3c1b174",
                            }
                        ],
                    }
                ],
            }
        ]
    }
    status, headers, body = post(serve, json.dumps(document).encode(), ctype="application/json", path=LOGS)
    assert status == 200 and headers["Content-Type"] == "application/json" and json.loads(body) == {}
    (row,) = _log_rows(serve, "service_name = 'json-logs'", 1)
    assert row["trace_id"] == "5b8efff798038103d269b633813fc60c" and row["span_id"] == "eee19b7ec3c1b174"
    assert row["severity_number"] == 9 and row["event_name"] == "gen_ai.user.message"
    assert json.loads(row["body"]) == {"content": "q"}
    with otel_replay.open(_dataset(serve)) as store:
        events = store.rows("SELECT provider FROM genai_events WHERE service_name = 'json-logs'")
    assert events == [{"provider": "openai"}]


_LOG = {"timeUnixNano": "1", "body": {"stringValue": "x"}}
_KV_BODY = {"kvlistValue": {"values": [{"key": "content", "value": {"stringValue": "q"}}]}}


@pytest.mark.parametrize(
    ("body", "ctype", "reason"),
    [
        (b"\xff\xfe garbage \x00\x01", "application/x-protobuf", "malformed protobuf ExportLogsServiceRequest"),
        (
            # a body string that is not UTF-8: protobuf refuses the whole request
            _request(_record("UTF8HERE")).SerializeToString().replace(b"UTF8HERE", b"\xff\xfe\xfd\xfcabcd"),
            "application/x-protobuf",
            "malformed protobuf ExportLogsServiceRequest",
        ),
        (b'{"resourceLogs": 5}', "application/json", "must be a JSON array"),
        (
            json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [{**_LOG, "severityNumber": "loud"}]}]}]}),
            "application/json",
            "severityNumber",
        ),
        (
            json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [{**_LOG, "timeUnixNano": {"n": 1}}]}]}]}),
            "application/json",
            "timeUnixNano",
        ),
        (
            json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [{**_LOG, "traceId": "not-hex"}]}]}]}),
            "application/json",
            "is not a hex string",
        ),
        (b'{"resourceLogs": [], "resource_logs": []}', "application/json", "are the same field"),
        (b"\xc3\x28 not utf-8", "application/json", "invalid JSON"),
    ],
    ids=["garbage", "body-not-utf8", "json-not-array", "json-enum", "json-time", "json-hex", "json-dup", "json-utf8"],
)
def test_malformed_log_requests_are_400_with_one_line(
    serve: Receiver, body: bytes | str, ctype: str, reason: str
) -> None:
    before = _rejected(serve)
    data = body.encode() if isinstance(body, str) else body
    status, _, reply = post(serve, data, ctype=ctype, path=LOGS)
    assert status == 400
    if ctype == "application/json":
        message = json.loads(reply)["message"]
        assert "\n" not in message
    else:
        message = _status(reply)
    assert reason in message
    assert _rejected(serve) - before == 1


def test_ten_thousand_attributes_are_stored(serve: Receiver) -> None:
    record = _record("wide")
    record.attributes.extend(KeyValue(key=f"k{i}") for i in range(10_000))
    for i, kv in enumerate(record.attributes):
        kv.value.int_value = i
    status, _, body = post(serve, _request(record, service="wide").SerializeToString(), path=LOGS)
    assert status == 200 and not ExportLogsServiceResponse.FromString(body).HasField("partial_success")
    (row,) = _log_rows(serve, "service_name = 'wide'", 1)
    attributes = json.loads(row["attributes"])
    assert len(attributes) == 10_000 and attributes["k9999"] == 9999


def test_a_long_body_is_cut_to_valid_json_and_a_secret_in_it_redacted(serve: Receiver) -> None:
    record = _record("password=hunter2-secret " + "x" * 100_000)
    status, _, _ = post(serve, _request(record, service="long").SerializeToString(), path=LOGS)
    assert status == 200
    (row,) = _log_rows(serve, "service_name = 'long'", 1)
    text = json.loads(row["body"])
    assert "hunter2" not in text and "chars cut]" in text and len(text) < 40_000


def test_oversized_and_bomb_bodies_are_413_and_nothing_is_lost(serve: Receiver) -> None:
    http = serve.http_address
    assert http is not None
    with socket.create_connection(("127.0.0.1", http[1]), timeout=10) as sock:  # a 100 MB body, declared
        head = f"POST {LOGS} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: {100 * MiB}"
        sock.sendall(head.encode() + b"\r\n\r\n" + b"\0" * 4096)
        reply = b""
        while chunk := sock.recv(4096):  # the server closes the connection after its reply
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and "exceeds the 4194304 byte limit" in _status(body)
    bomb = gzip.compress(_request(_record("z" * (8 * MiB))).SerializeToString(), compresslevel=1)
    status, _, _ = post(serve, bomb, path=LOGS, **{"Content-Encoding": "gzip"})
    assert status == 413
    status, _, _ = post(serve, _request(_record("after"), service="after-413").SerializeToString(), path=LOGS)
    assert status == 200 and len(_log_rows(serve, "service_name = 'after-413'", 1)) == 1


def test_grpc_logs_service_refuses_garbage_and_stores_a_good_request(serve: Receiver) -> None:
    address = serve.grpc_address
    assert address is not None
    before = _rejected(serve)
    with grpc.insecure_channel(f"127.0.0.1:{address[1]}") as channel:
        call = channel.unary_unary(LOGS_METHOD, response_deserializer=ExportLogsServiceResponse.FromString)
        with pytest.raises(grpc.RpcError) as refused:
            call(b"\x0a\xff\xff\xff\xff\x0f garbage", timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed ExportLogsServiceRequest" in (refused.value.details() or "")
        with pytest.raises(grpc.RpcError) as too_large:  # past the 4 MiB request limit
            call(_request(_record("w" * (5 * MiB))).SerializeToString(), timeout=30)
        assert too_large.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        bad_id = _record("bad", trace_id=b"\x01" * 3)
        response = call(_request(_record("via grpc"), bad_id, service="grpc-raw").SerializeToString(), timeout=10)
    assert response.partial_success.rejected_log_records == 1
    assert _rejected(serve) - before == 1
    assert [r["body"] for r in _log_rows(serve, "service_name = 'grpc-raw'", 1)] == ['"via grpc"']
