from __future__ import annotations

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, TraceState

from otel_replay.exporters.rows import request_to_table, spans_to_table


def _spans():
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc", "host.cores": 2, "tags": ("a", "b")}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("scope.name", "1.2.3")
    other = provider.get_tracer("no.version")
    with tracer.start_as_current_span("root", kind=SpanKind.SERVER) as root:
        root.set_attributes(
            {
                "replay.correlation_id": "c-1",
                "replay.record.id": "r-1",
                "replay.kind": "decision",
                "replay.session_id": 7,  # not a string: stays in the JSON column
                "s": "ünïcode ✓",
                "i": -3,
                "f": 2.5,
                "b": False,
                "ls": ("x", "y"),
                "li": (1, 2),
                "lf": (0.5,),
                "lb": (True,),
            }
        )
        root.add_event("ev", {"k": "v", "n": 1})
        root.add_event("bare")
        with other.start_as_current_span("child", kind=SpanKind.CLIENT) as child:
            child.set_status(Status(StatusCode.ERROR, "boom"))
    ts = TraceState([("vendor", "value")])
    from opentelemetry.trace import SpanContext, TraceFlags

    linked = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(1), trace_state=ts)
    span = tracer.start_span("linked", links=[Link(linked, {"why": "retry"})], kind=SpanKind.PRODUCER)
    span.set_status(Status(StatusCode.OK))
    span.end()
    tracer.start_span("consumer", kind=SpanKind.CONSUMER).end()
    provider.shutdown()
    return memory.get_finished_spans()


def test_sdk_reader_and_otlp_reader_give_identical_rows():
    spans = _spans()
    direct = spans_to_table(spans)
    via_otlp = request_to_table(encode_spans(spans))
    # The OTLP encoder groups spans by resource and scope; compare in span-id order.
    key = [("span_id", "ascending")]
    a, b = direct.sort_by(key), via_otlp.sort_by(key)
    assert a.drop_columns(["links"]).equals(b.drop_columns(["links"]))
    # The Python SDK's OTLP encoder drops a link's tracestate; the in-process reader keeps it.
    strip = [[{**link, "trace_state": None} for link in links] for links in a.column("links").to_pylist()]
    assert strip == b.column("links").to_pylist()
    rows = {r["name"]: r for r in direct.drop_columns(["start_time", "end_time", "events"]).to_pylist()}
    assert rows["root"]["correlation_id"] == "c-1" and rows["root"]["session_id"] is None
    assert '"replay.session_id":7' in rows["root"]["attributes"]
    assert rows["child"]["status_code"] == "ERROR" and rows["child"]["status_message"] == "boom"
    assert rows["child"]["scope_version"] is None and rows["root"]["scope_version"] == "1.2.3"
    assert rows["linked"]["links"][0]["trace_state"] == "vendor=value"
    assert {r["kind"] for r in rows.values()} == {"SERVER", "CLIENT", "PRODUCER", "CONSUMER"}


def test_row_order_matches_the_schema():
    from otel_replay.exporters.rows import ROW_ORDER
    from otel_replay.exporters.schema import SPAN_SCHEMA

    assert list(ROW_ORDER) == [f.name for f in SPAN_SCHEMA]


def test_span_time_error_names_the_field_and_accepts_the_storable_range():
    from otel_replay.exporters import span_time_error
    from otel_replay.exporters.rows import TIME_LIMIT_NS

    assert span_time_error(0, 0) is None
    assert span_time_error(TIME_LIMIT_NS - 1, 5) is None  # end before start is storable (duration NULL)
    assert "start_time 18446744073709551615" in span_time_error(2**64 - 1, 5)
    assert "end_time" in span_time_error(5, TIME_LIMIT_NS)
    assert "end_time -1" in span_time_error(5, -1)
    assert "event 1 time" in span_time_error(5, 6, [7, 2**64 - 1])


def _request_with_one_poison_span():
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = encode_spans(_spans())
    spans = [span for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]
    assert len(spans) == 4
    spans[0].start_time_unix_nano = 2**64 - 1
    spans[-1].dropped_attributes_count = 2**32 - 1  # int32 column: unstorable too
    return ExportTraceServiceRequest.FromString(request.SerializeToString()), spans[0].name


def test_otlp_reader_leaves_out_unstorable_spans_when_asked_and_refuses_otherwise():
    import pytest

    from otel_replay.errors import PayloadError

    request, poison_name = _request_with_one_poison_span()
    total = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
    rejected: list[str] = []
    table = request_to_table(request, rejected)
    assert table.num_rows == total - 2 and len(rejected) == 2
    assert poison_name in rejected[0] and "start_time 18446744073709551615" in rejected[0]
    assert "dropped counts" in rejected[1]
    with pytest.raises(PayloadError, match="start_time 18446744073709551615 ns is out of range"):
        request_to_table(request)
