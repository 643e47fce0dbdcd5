"""OTLP/JSON decoding refuses hostile documents with one-line PayloadErrors, never a crash."""

from __future__ import annotations

import json
from typing import Any

import pytest

from otel_replay.errors import PayloadError
from otel_replay.server.otlp_json import request_from_json, request_from_obj, request_to_obj


def document(span: dict[str, Any] | None = None, value: Any = None) -> dict[str, Any]:
    base: dict[str, Any] = {
        "traceId": "0102030405060708090a0b0c0d0e0f10",
        "spanId": "0102030405060708",
        "name": "op",
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000000000000500",
    }
    base.update(span or {})
    if value is not None:
        base["attributes"] = [{"key": "k", "value": value}]
    return {"resourceSpans": [{"scopeSpans": [{"spans": [base]}]}]}


def nested_value(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"stringValue": "leaf"}
    for _ in range(depth):
        value = {"kvlistValue": {"values": [{"key": "k", "value": value}]}}
    return value


HOSTILE: dict[str, tuple[str | bytes, str]] = {
    "100k-deep array": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "100k-deep object": ('{"a":' * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
    "duplicate top key": ('{"resourceSpans": [], "resourceSpans": []}', "duplicate key 'resourceSpans'"),
    "duplicate span key": (
        json.dumps(document()).replace('"name": "op"', '"name": "op", "name": "evil"'),
        "duplicate key 'name'",
    ),
    "NaN": ('{"resourceSpans": NaN}', "NaN is not JSON"),
    "Infinity value": (json.dumps(document(value={"doubleValue": 1.5})).replace("1.5", "Infinity"), "Infinity"),
    "start 2**64": (json.dumps(document({"startTimeUnixNano": str(2**64)})), "startTimeUnixNano: Value out of range"),
    "start 1e400": (  # refused by the JSON reader itself (it would be read as infinity), with its position
        json.dumps(document({"startTimeUnixNano": 1})).replace(": 1,", ": 1e400,"),
        "the number 1e400 is too large for a float (line 1, column",
    ),
    "negative start": (json.dumps(document({"startTimeUnixNano": "-1"})), "Value out of range: -1"),
    "non-numeric start": (json.dumps(document({"startTimeUnixNano": "tomorrow"})), "'tomorrow'"),
    "intValue 2**63": (json.dumps(document(value={"intValue": str(2**63)})), "intValue"),
    "5000-digit integer": (
        json.dumps(document({"startTimeUnixNano": 1})).replace(": 1,", ": " + "9" * 5000 + ","),
        "digits",
    ),
    "non-hex span id": (json.dumps(document({"spanId": "not-hex!"})), "spans[0].spanId is not a hex string"),
    "root is a list": ("[1, 2]", "must be a JSON object"),
    "not UTF-8": (b'{"resourceSpans": "\xff"}', "not UTF-8"),
    "kvlist nested 200 deep": (json.dumps(document(value=nested_value(200))), "invalid OTLP/JSON"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_documents_raise_one_line_payload_errors(name: str) -> None:
    text, expected = HOSTILE[name]
    with pytest.raises(PayloadError) as info:
        request_from_json(text)
    message = str(info.value)
    assert expected in message, message
    assert "\n" not in message and len(message) < 400


def test_nesting_the_protobuf_layer_can_hold_round_trips() -> None:
    """What the decoder accepts also survives protobuf serialisation (the WAL) and parsing (the converter)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = request_from_obj(document(value=nested_value(20)))
    again = ExportTraceServiceRequest()
    again.ParseFromString(request.SerializeToString())
    assert again == request


def test_valid_documents_still_decode_both_ways() -> None:
    doc = document(value={"intValue": str(2**63 - 1)})
    request = request_from_json(json.dumps(doc))
    span = request.resource_spans[0].scope_spans[0].spans[0]
    assert span.span_id.hex() == "0102030405060708" and span.attributes[0].value.int_value == 2**63 - 1
    assert request_to_obj(request)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] == (
        "0102030405060708090a0b0c0d0e0f10"
    )


def test_error_names_where_it_was_read() -> None:
    with pytest.raises(PayloadError, match=r"^hostile\.json: duplicate key 'a'"):
        request_from_json('{"a": 1, "a": 2}', where="hostile.json")


def test_the_http_receiver_answers_hostile_otlp_json_with_400(receiver: Any) -> None:
    import urllib.error
    import urllib.request

    from .conftest import http_url

    for body, expected in [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"resourceSpans": [], "resourceSpans": []}', "duplicate key 'resourceSpans'"),
        (json.dumps(document({"startTimeUnixNano": "-1"})).encode(), "Value out of range: -1"),
    ]:
        request = urllib.request.Request(
            http_url(receiver), data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=10)
        with info.value:
            assert info.value.code == 400
            assert expected in info.value.read().decode()
