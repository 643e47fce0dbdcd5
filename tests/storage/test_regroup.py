"""One-span requests regrouped by resource and scope convert to the rows they give one by one."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_replay
from otel_replay import Action, ActionGate, DependencySnapshot, ReferenceLedger, audit
from otel_replay.capture.write_ahead import _RequestEncoder, convert_log_segment
from otel_replay.exporters.rows import payload_to_table
from otel_replay.storage.convert import convert_segment
from otel_replay.storage.regroup import regrouped


def _spans() -> list:
    """Spans of two resources and three scopes (schema URLs on some), interleaved as an agent would end them."""
    spans = []
    for service, url in (("one", ""), ("tw\u00f6", "https://r/1")):
        exporter = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({"service.name": service, "n": 3}, schema_url=url))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        for scope, scope_url in (("a", None), ("b \u00e9", "https://s/2")):
            tracer = provider.get_tracer(scope, "1.0", schema_url=scope_url)
            for i in range(3):
                span = tracer.start_span(f"{service}/{scope}/{i}", attributes={"i": i, "text": "x" * (i * 700)})
                span.add_event("e", {"k": i})
                span.end()
        spans += exporter.get_finished_spans()
    order = [0, 1, 6, 7, 2, 3, 4, 5, 8, 9, 10, 11, 9]  # runs of one resource and scope, broken up; one span twice
    return [spans[i] for i in order]


def _records(spans: list) -> list[bytes]:
    """Each span as its own record, as the log writes them (its own encoder, and the SDK's for some)."""
    encoder = _RequestEncoder()
    return [
        encode_spans([span]).SerializeToString() if i % 3 == 2 else encoder.encode([span])
        for i, span in enumerate(spans)
    ]


class _Rows:
    """The rows ``payloads`` convert to, in order; equal when every column's values are."""

    def __init__(self, payloads: list[bytes]) -> None:
        tables = []
        for payload in payloads:
            ExportTraceServiceRequest.FromString(payload)  # each is a request the real parser accepts
            tables.append(payload_to_table(payload))
        self.table = pa.concat_tables(tables).combine_chunks() if tables else None

    def __eq__(self, other: object) -> bool:
        assert isinstance(other, _Rows)
        if self.table is None or other.table is None:
            return self.table is other.table
        return self.table.num_rows > 0 and self.table.equals(other.table)


_rows = _Rows


@pytest.mark.parametrize("limit", [1 << 20, 2_000, 1])
def test_regrouped_requests_give_the_rows_of_the_requests_one_by_one_in_their_order(limit):
    records = _records(_spans())
    out = list(regrouped(records, limit))
    assert _rows(out) == _rows(records)
    if limit == 1 << 20:  # six runs of one resource and scope: one request each
        assert len(out) == 6
        assert [len(ExportTraceServiceRequest.FromString(p).resource_spans) for p in out] == [1] * 6
    for payload in out:  # a request past the limit holds one span
        request = ExportTraceServiceRequest.FromString(payload)
        if len(payload) > limit + 200:
            assert sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans) == 1


def _field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2, len(payload)]) + payload


@pytest.mark.parametrize(
    "hostile",
    [
        b"",  # no span at all: no row
        b"\x0a",  # a length missing
        b"\x0a\x05ab",  # a field past the end
        b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # a varint past 64 bits
        b"\x08\x01",  # a varint field where a message belongs
        _field(5, b"x"),  # a request field of another number
        _field(1, _field(1, b"") + _field(1, b"")),  # the resource twice: left to the parser, which merges
        _field(1, _field(2, _field(1, b"") + _field(1, b""))),  # the scope twice
        _field(1, _field(7, b"zz")),  # a ResourceSpans field of another number
        _field(1, _field(2, _field(4, b"zz"))),  # a ScopeSpans field of another number
        _field(1, _field(2, b"\x10\x01")),  # a varint inside ScopeSpans
    ],
)
def test_a_request_it_does_not_regroup_is_passed_on_whole_in_its_place(hostile):
    records = _records(_spans()[:4])
    out = list(regrouped([*records[:2], hostile, *records[2:]], 1 << 20))
    if hostile == b"":  # an empty request holds no span: nothing to keep in place
        assert b"" not in out and _rows(out) == _rows(records)
    else:
        assert hostile in out
        at = out.index(hostile)
        assert _rows(out[:at]) == _rows(records[:2]) and _rows(out[at + 1 :]) == _rows(records[2:])


def test_a_capture_logs_segment_converts_to_the_same_rows_either_way(tmp_path, monkeypatch):
    """Through the real path: gated trades, their segment converted regrouped and as the receiver converts it."""
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", "regroup-test-key-0123456789abcdef")
    dataset = tmp_path / "traces"
    telemetry = otel_replay.configure(dataset, set_global=False)
    assert telemetry.log is not None
    telemetry.log.seal_seconds = 3600  # the test converts the segment itself
    gate = ActionGate(ReferenceLedger(balance=100.0), dataset=dataset)
    snapshot = DependencySnapshot({"balance": 100}, version="v1")
    for i in range(6):
        with audit("refund", snapshot=snapshot, correlation_id=f"c-{i}") as d:
            action = Action("refund", {"order": f"o-{i}", "note": "caf\u00e9 \U0001f600"}, cost=1.0)
            d.act(action)
            gate.commit(action, record_id=d.record_id)
    wal = telemetry.log._wal
    with telemetry.log._lock:
        wal.rotate()
        [segment] = wal.sealed()
        kept = tmp_path / "segment.wal"
        shutil.copy(segment.path, kept)
    telemetry.shutdown()
    tables = {}
    for name, convert in (("regrouped", convert_log_segment), ("one by one", convert_segment)):
        out = tmp_path / name
        # an intent and a commit record a trade, and the five decisions the next trades' intents carried
        assert convert(kept if name == "regrouped" else str(kept), str(out), "seg") == 17
        [file] = (out / "spans").rglob("seg-*.parquet")
        tables[name] = pq.read_table(file)
    assert tables["regrouped"].equals(tables["one by one"])
    assert os.path.exists(kept)  # converting never releases the segment: the log does, once written


def test_a_damaged_capture_segment_fails_whole_as_the_receivers_converter_fails_it(tmp_path):
    records = _records(_spans()[:3])
    segment = tmp_path / "damaged.wal"
    from otel_replay.storage.wal import WriteAheadLog

    wal = WriteAheadLog(tmp_path / "log")
    for record in records:
        wal.append(record)
    wal.close()
    [written] = list((tmp_path / "log").glob("*.wal"))
    data = bytearray(written.read_bytes())
    data[20] ^= 0xFF  # inside the first record: whole records follow, so damage, not a torn tail
    segment.write_bytes(bytes(data))
    errors = []
    for convert in (convert_log_segment, convert_segment):
        with pytest.raises(Exception) as caught:
            convert(segment if convert is convert_log_segment else str(segment), str(tmp_path / "out"), "x")
        errors.append(type(caught.value))
    assert errors[0] is errors[1]
    assert not list(Path(tmp_path / "out").rglob("*.parquet"))
