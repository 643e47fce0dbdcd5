from __future__ import annotations

import pytest
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


def test_record_hash_and_signature_bytes_are_pinned():
    """The fast framing (orjson) and the prepared HMAC write exactly what verify has always checked."""
    from otel_replay.integrity import SigningKey, record_hash

    attrs = {
        "replay.s": "é\u2028\"\\\n", "replay.i": -5, "replay.big": 2**70, "replay.f": 1e20, "replay.g": 0.1,
        "replay.b": True, "replay.l": ["a", 1, 2.5], "replay.t": ("x",), "replay.j": {"k": [1, None]},
        "other": "ignored", "replay.record.hash": "h", "replay.record.signature": "s", "replay.record.seq": 3,
    }  # fmt: skip
    expected = "9b75ab8195446fe0e7d98ce966bcf39634d3dc7b8027bbde8cdcf5a9ceaf166b"
    assert record_hash("replay.decision", 1_767_225_600_000_000_123, attrs) == expected
    key = SigningKey(b"pinned-key-0123456789")
    signature = "b66dce95e51b3d44b71ba2b0699325828fe11e5d90851bc59c58c65f24b0ffa9"
    assert key.sign("ab" * 32) == signature and key.check("ab" * 32, signature)
    assert not key.check("ab" * 32, "0" * 64)


def _hostile_value(rnd, depth=0):
    import struct

    pick = rnd.random()
    if depth < 3 and pick < 0.1:
        keys = ["a", "é", "z", "\u2028", "A", "😀", "bbb", "\x00", "\ud800"]
        return {
            rnd.choice(keys) + str(rnd.randint(0, 9)): _hostile_value(rnd, depth + 1) for _ in range(rnd.randint(0, 4))
        }
    if depth < 3 and pick < 0.2:
        return [_hostile_value(rnd, depth + 1) for _ in range(rnd.randint(0, 4))]
    if depth < 3 and pick < 0.25:
        return tuple(_hostile_value(rnd, depth + 1) for _ in range(rnd.randint(0, 3)))
    choice = rnd.randint(0, 8)
    if choice == 0:
        return rnd.randint(-(2**70), 2**70)  # past 64 bits: orjson refuses, json writes it
    if choice == 1:
        return struct.unpack("d", rnd.getrandbits(64).to_bytes(8, "little"))[0]  # any double, NaN included
    if choice == 2:
        return rnd.random() * 10 ** rnd.randint(-8, 20)  # both sides of the exponent boundaries
    if choice == 3:
        return rnd.choice([True, False, None, float("nan"), float("inf"), -0.0, 1e16, 1e-4, 9.999e-5, 1e15])
    if choice == 4:
        ranges = [(0, 0x7F), (0x80, 0xFFFF), (0x10000, 0x10FFFF)]  # control chars, lone surrogates, astral
        return "".join(chr(rnd.randint(*rnd.choice(ranges))) for _ in range(rnd.randint(0, 8)))
    if choice == 5:
        return b"\x00\xff" * rnd.randint(0, 3)
    if choice == 6:
        import enum

        return enum.IntEnum("E", "A B")(1)  # an int subclass
    if choice == 7:
        return type("S", (str,), {})("sub")  # a str subclass
    return "plain"


@pytest.mark.slow
def test_fast_json_writes_exactly_what_json_writes_or_fails_the_same_way():
    """The stored attribute bytes and the canonical (hashed) form do not depend on whether orjson is present."""
    import json
    import random

    from otel_replay import _json
    from otel_replay.errors import CaptureError

    assert _json._orjson is not None, "orjson is a dependency: the fast path must be the one tested"
    compact = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=_json._bytes_default).encode
    canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode

    def outcome(fn, value):
        try:
            return fn(value)
        except Exception as exc:
            return type(exc)

    rnd = random.Random(9)
    fast_used = 0
    for _ in range(20_000):
        value = {f"k{j}": _hostile_value(rnd) for j in range(rnd.randint(0, 6))}
        assert outcome(_json.compact_json, value) == outcome(compact, value), value
        assert outcome(_json.compact_json_bytes, value) == outcome(lambda v: compact(v).encode(), value), value
        expected = outcome(canonical, value)
        got = outcome(lambda v: _json.canonical_json(v, where="fuzz"), value)
        assert got == expected or (isinstance(expected, type) and got is CaptureError), (value, got, expected)
        fast_used += _json._same_bytes(value)
    assert fast_used > 5_000  # the fast path was exercised, not just the fallback


def test_float_and_unicode_attributes_store_the_same_bytes_on_both_paths():
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc", "r": 1e16}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    values = {"big": 1e16, "small": 1e-5, "edge": 1e-4, "nan": float("nan"), "inf": float("-inf"), "neg0": -0.0,
              "u": "\u2028\x00\x1f\"\\é😀", "floats": (1e300, 0.1), "bytes": b"\x00\xff", "i": 2**63 - 1}  # fmt: skip
    tracer.start_span("floats", attributes=values).end()
    provider.shutdown()
    spans = memory.get_finished_spans()
    direct, via_otlp = spans_to_table(spans), request_to_table(encode_spans(spans))
    assert direct.equals(via_otlp)
    text = direct.column("attributes")[0].as_py()
    assert '"big":1e+16' in text and '"small":1e-05' in text and '"nan":NaN' in text and '"bytes":"AP8="' in text


def test_a_bad_span_in_a_bulk_batch_is_refused_alone_on_the_sdk_path():
    import pytest

    from otel_replay.errors import PayloadError

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    for i in range(5):
        span = tracer.start_span(f"ok{i}", attributes={"replay.correlation_id": f"c{i}"})
        span.add_event("e", {"n": i})
        span.end()
    bad = tracer.start_span("bad")
    bad.add_event("late", timestamp=2**64 - 1)
    bad.end()
    provider.shutdown()
    spans = list(memory.get_finished_spans())
    spans.insert(2, spans.pop())  # the bad one in the middle of the batch
    rejected: list[str] = []
    table = spans_to_table(spans, rejected)
    assert table.column("name").to_pylist() == ["ok0", "ok1", "ok2", "ok3", "ok4"]
    events = table.column("events").combine_chunks().flatten()
    assert events.field("attributes").to_pylist() == [f'{{"n":{i}}}' for i in range(5)]
    assert table.column("correlation_id").to_pylist() == [f"c{i}" for i in range(5)]
    assert len(rejected) == 1 and "'bad'" in rejected[0] and "event 0 time 18446744073709551615" in rejected[0]
    with pytest.raises(PayloadError, match="event 0 time"):
        spans_to_table(spans)


def test_row_builder_add_by_keyword_builds_typed_rows_with_dates_durations_events_links():
    from otel_replay.exporters.rows import RowBuilder

    def span(i):
        return dict(
            trace_id=f"{i:032x}", span_id=f"{i:016x}", parent_span_id=None if i % 2 else f"{i + 1:016x}",
            trace_state=None, name=f"s{i}", kind="INTERNAL", resource=("svc", '{"service.name":"svc"}'),
            scope=("sc", None), start=86_400 * 10**9 * (20_000 + i % 2), end=86_400 * 10**9 * 20_000 + 5 - i,
            status=("OK", None), attributes={"replay.kind": "decision", "n": i, "replay.session_id": i},
            events=[{"time": 7, "name": "e", "attributes": "{}"}] * (i % 3),
            links=[{"trace_id": "ab" * 16, "span_id": "cd" * 8, "trace_state": "v=1", "attributes": "{}"}] * (i % 2),
            dropped=(i, 0, 1),
        )  # fmt: skip

    one = RowBuilder()
    for i in range(4):
        assert one.add(**span(i))
    table = one.table()
    assert table.num_rows == 4 and len(one) == 4
    rows = table.drop_columns(["start_time", "end_time", "events"]).to_pylist()
    events = table.column("events").combine_chunks().flatten().field("name").to_pylist()
    assert events == ["e"] * 3
    assert [r["date"] for r in rows] == ["2024-10-04", "2024-10-05", "2024-10-04", "2024-10-05"]
    assert [r["duration_ns"] for r in rows] == [5, None, 3, None]  # an end before its start: NULL
    assert table.column("events").combine_chunks().value_lengths().to_pylist() == [0, 1, 2, 0]
    assert [len(r["links"]) for r in rows] == [0, 1, 0, 1] and rows[1]["links"][0]["trace_state"] == "v=1"
    assert rows[1]["replay_kind"] == "decision" and rows[1]["attributes"] == '{"n":1,"replay.session_id":1}'
    assert rows[3]["dropped_attributes_count"] == 3 and rows[0]["parent_span_id"] == f"{1:016x}"


# --- the OTLP reader (otlp_wire) against a plain message-by-message reference --------------------


def _reference_table(request, rejected=None):
    """The rows a plain reader makes of a decoded request: every field read from the real messages, span by span."""
    from otel_replay._json import compact_json
    from otel_replay.exporters.rows import RowBuilder, any_value

    def attrs(kvs):
        out = {}
        for kv in kvs:
            out[kv.key] = any_value(kv.value)
        return out

    def name(names, value):
        return names[value] if 0 <= value < len(names) else str(value)

    kinds = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
    builder = RowBuilder(rejected)
    for rs in request.resource_spans:
        resource = attrs(rs.resource.attributes)
        service = resource.get("service.name")
        resource_row = (service if isinstance(service, str) else None, compact_json(resource))
        for ss in rs.scope_spans:
            for s in ss.spans:
                builder.add(
                    trace_id=s.trace_id.hex(), span_id=s.span_id.hex(), parent_span_id=s.parent_span_id.hex() or None,
                    trace_state=s.trace_state or None, name=s.name, kind=name(kinds, s.kind), resource=resource_row,
                    scope=(ss.scope.name or None, ss.scope.version or None), start=s.start_time_unix_nano,
                    end=s.end_time_unix_nano, status=(name(("UNSET", "OK", "ERROR"), s.status.code),
                                                      s.status.message or None),
                    attributes=attrs(s.attributes),
                    events=[{"time": e.time_unix_nano, "name": e.name, "attributes": compact_json(attrs(e.attributes))}
                            for e in s.events],
                    links=[{"trace_id": k.trace_id.hex(), "span_id": k.span_id.hex(),
                            "trace_state": k.trace_state or None, "attributes": compact_json(attrs(k.attributes))}
                           for k in s.links],
                    dropped=(s.dropped_attributes_count, s.dropped_events_count, s.dropped_links_count),
                )  # fmt: skip
    return builder.table()


def _varint(n):
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number, payload):
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _request_of_spans(span_bytes, resource=b"", scope=b""):
    """A serialized request of one ResourceSpans and one ScopeSpans holding the given encoded spans."""
    ss = (_field(1, scope) if scope else b"") + b"".join(_field(2, s) for s in span_bytes)
    rs = (_field(1, resource) if resource else b"") + _field(2, ss)
    return _field(1, rs)


def _hostile_request():
    """Spans exercising every reader path: all AnyValue kinds, repeated keys, odd enums, merges on the wire."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

    def kv(key, **value):
        return KeyValue(key=key, value=AnyValue(**value))

    nested = AnyValue(string_value="leaf")
    for _ in range(40):  # deep, but inside the real parser's limit (it refuses about 47 levels in a request)
        nested = AnyValue(array_value={"values": [nested, AnyValue(int_value=1)]})
    attributes = [
        kv("s", string_value="ünï\u2028\x00\"\\😀"), kv("i", int_value=-(2**63)), kv("b", bool_value=True),
        kv("f", double_value=1e16), kv("nan", double_value=float("nan")), kv("small", double_value=1e-5),
        kv("bytes", bytes_value=b"\x00\xff"), KeyValue(key="empty"), kv("s", int_value=2),  # "s" again: last wins
        kv("arr", array_value={"values": [AnyValue(string_value="x"), AnyValue(double_value=0.5), AnyValue()]}),
        kv("kv", kvlist_value={"values": [kv("a", bool_value=False), kv("a", string_value="again")]}),
        kv("deep", **{"array_value": nested.array_value}), kv("replay.correlation_id", string_value="c-1"),
        kv("replay.kind", int_value=5),  # a promoted key that is not a string: stays in the JSON
        KeyValue(key="strindex", key_strindex=3, value=AnyValue(string_value="v")),
    ]  # fmt: skip
    spans = []
    for i, (kind, code) in enumerate([(1, 0), (99, 7), (-1, 2), (5, 1), (0, 0)]):
        span = Span(
            trace_id=bytes([i + 1]) * 16, span_id=bytes([i + 1]) * 8, parent_span_id=b"\x09" * 8 if i % 2 else b"",
            trace_state="k=v" if i == 1 else "", name=f"span-{i}", kind=kind, start_time_unix_nano=10**18 + i,
            end_time_unix_nano=10**18 + i * 7 - 3, status=Status(code=code, message="boom" if code == 2 else ""),
            attributes=attributes[i:] if i < 3 else [], dropped_attributes_count=i, dropped_events_count=2 * i,
            dropped_links_count=3 * i,
        )  # fmt: skip
        if i in (0, 2):
            span.events.add(time_unix_nano=10**18 + 5, name="ev", attributes=[kv("tool", string_value="search")])
            span.events.add(time_unix_nano=10**18 + 6, name="ev", attributes=[kv("tool", string_value="search")])
            span.events.add(time_unix_nano=0, name="at zero")  # no time field on the wire
            span.events.add(time_unix_nano=7, name="odd", attributes=attributes[:9])
        if i == 1:
            span.links.add(trace_id=b"\x07" * 16, span_id=b"\x08" * 8, trace_state="a=b", attributes=attributes[:3])
        raw = span.SerializeToString()
        if i == 3:  # a second status on the wire: protobuf merges the two (code from this one, message from the first)
            raw = (
                Span(status=Status(code=2, message="first")).SerializeToString()
                + raw
                + Span(status=Status(code=1)).SerializeToString()
            )
        if i == 4:  # an event whose time field repeats after its name: the last one counts
            event = Span.Event(time_unix_nano=11, name="twice").SerializeToString() + _varint(1 << 3 | 1)
            raw += _field(11, event + (22).to_bytes(8, "little"))
        spans.append(raw)
    resource = b"".join(_field(1, kv(k, string_value=v).SerializeToString()) for k, v in [("service.name", "svc")])
    resource += _field(1, kv("tags", array_value={"values": [AnyValue(string_value="a")]}).SerializeToString())
    scope = _field(1, b"scope.name") + _field(2, b"9.9")
    payload = _request_of_spans(spans[:3], resource, scope) + _request_of_spans(spans[3:], scope=_field(1, b"other"))
    return payload, ExportTraceServiceRequest.FromString(payload)


def test_otlp_reader_matches_a_plain_message_reader_on_hostile_spans():
    from otel_replay.exporters.rows import payload_to_table, resource_spans_to_table

    payload, request = _hostile_request()
    expected = _reference_table(request)
    assert expected.num_rows == 5
    for _ in range(2):  # cold, then with every KeyValue and event remembered
        assert request_to_table(request).equals(expected)
        assert payload_to_table(payload).equals(expected)
        assert resource_spans_to_table(request.resource_spans).equals(expected)
    rows = {r["name"]: r for r in expected.drop_columns(["start_time", "end_time", "events"]).to_pylist()}
    assert rows["span-3"]["status_code"] == "OK" and rows["span-3"]["status_message"] == "first"  # merged
    events = expected.column("events").combine_chunks().flatten()
    times = events.field("time").cast("int64").to_pylist()
    assert list(zip(events.field("name").to_pylist(), times, strict=True))[-1] == ("twice", 22)
    assert times[:4] == [10**18 + 5, 10**18 + 6, 0, 7]
    assert rows["span-1"]["kind"] == "99" and rows["span-2"]["kind"] == "-1" and rows["span-1"]["status_code"] == "7"
    assert '"s":2' in rows["span-0"]["attributes"] and '"kv":{"a":"again"}' in rows["span-0"]["attributes"]
    assert rows["span-0"]["correlation_id"] == "c-1" and '"replay.kind":5' in rows["span-0"]["attributes"]


def test_otlp_reader_memory_stays_bounded_and_exact_with_unique_values(monkeypatch):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    from otel_replay.exporters import otlp_wire
    from otel_replay.exporters.rows import payload_to_table

    monkeypatch.setattr(otlp_wire, "_CACHE_ENTRIES", 16)
    spans = []
    for i in range(300):
        span = Span(trace_id=b"\x01" * 16, span_id=i.to_bytes(8, "big"), name="s", start_time_unix_nano=i + 1)
        span.attributes.add(key="step", value=AnyValue(int_value=i))
        span.attributes.add(key="same", value=AnyValue(string_value="x"))
        span.events.add(time_unix_nano=i + 1, name="e", attributes=[KeyValue(key="n", value=AnyValue(int_value=i))])
        span.attributes.add(key="long", value=AnyValue(string_value="x" * 300))  # decoded each time, never kept
        long_event = [KeyValue(key="t", value=AnyValue(string_value="y" * 300))]
        span.events.add(time_unix_nano=i + 1, name="trace", attributes=long_event)
        spans.append(span.SerializeToString())
    payload = _request_of_spans(spans)
    table = payload_to_table(payload)
    assert table.equals(_reference_table(ExportTraceServiceRequest.FromString(payload)))
    assert len(otlp_wire.KEY_VALUES) <= 16 and len(otlp_wire._EVENT_TAILS) <= 16
    assert all(len(raw) <= otlp_wire._CACHE_BYTES for raw in [*otlp_wire.KEY_VALUES, *otlp_wire._EVENT_TAILS])
    assert table.column("attributes").to_pylist()[299] == '{"step":299,"same":"x","long":"' + "x" * 300 + '"}'


def test_converter_refuses_what_the_real_parser_refuses_before_reading_rows(tmp_path):
    """The WAL reader converts from the bytes, but only after the real parser accepted them (its depth limit here)."""
    import pytest
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    from otel_replay.storage.convert import ChunkWriter

    value = b"\x0a\x01x"  # AnyValue{string_value: "x"}
    for _ in range(60):
        value = _field(5, _field(1, value))  # AnyValue{array_value: {values: [value]}}
    kv = _field(1, b"deep") + _field(2, value)
    span = Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="deep", start_time_unix_nano=1).SerializeToString()
    writer = ChunkWriter(tmp_path, "t")
    with pytest.raises(DecodeError):
        writer.add_payload(_request_of_spans([span + _field(9, kv)]))
    writer.add_payload(_request_of_spans([span]))
    writer.flush()
    assert writer.rows_written == 1


@pytest.mark.slow
def test_short_keyvalue_decoding_equals_the_real_class_on_mutated_encodings():
    import math
    import random
    import struct

    from google.protobuf.message import DecodeError
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    from otel_replay.exporters.otlp_wire import _short_scalar

    def real(raw):
        kv = KeyValue.FromString(raw)
        kind = kv.value.WhichOneof("value")
        return kv.key, getattr(kv.value, kind) if kind else None

    rnd = random.Random(7)
    fast = 0
    for _ in range(30_000):
        key = "".join(chr(rnd.choice([rnd.randint(32, 126), rnd.randint(0x80, 0xD7FF), rnd.randint(0x10000, 0x10FFFF)]))
                      for _ in range(rnd.randint(0, 50)))  # fmt: skip
        value = rnd.choice([
            AnyValue(string_value="".join(chr(rnd.randint(0, 0xD7FF)) for _ in range(rnd.randint(0, 70)))),
            AnyValue(int_value=rnd.choice([0, 1, -1, 2**63 - 1, -(2**63), rnd.randint(-(2**63), 2**63 - 1)])),
            AnyValue(bool_value=rnd.random() < 0.5),
            AnyValue(double_value=struct.unpack("<d", rnd.getrandbits(64).to_bytes(8, "little"))[0]),
            AnyValue(bytes_value=b"ab"), AnyValue(), AnyValue(array_value={"values": [AnyValue(int_value=1)]}),
        ])  # fmt: skip
        raw = bytearray(KeyValue(key=key, value=value).SerializeToString())
        if rnd.random() < 0.3:
            raw[rnd.randrange(len(raw))] = rnd.randrange(256)  # a flipped byte: length, tag or content
        elif rnd.random() < 0.2:
            raw += bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 3)))  # trailing fields or garbage
        raw = bytes(raw)
        try:
            expected = real(raw)
        except (DecodeError, UnicodeDecodeError):  # (the pure-Python protobuf raises the latter for bad UTF-8)
            continue  # the real parser refuses it: the readers never see such bytes (they are decoded first)
        try:
            got = _short_scalar(raw)
        except UnicodeDecodeError:
            got = None
        if got is None:
            continue  # left to the real class
        fast += 1
        assert got[0] == expected[0] and type(got[1]) is type(expected[1]), (raw, got, expected)
        assert got[1] == expected[1] or (math.isnan(got[1]) and math.isnan(expected[1])), (raw, got, expected)
    assert fast > 8_000


def test_chunk_writer_starts_a_new_chunk_by_bytes_as_well_as_rows(tmp_path):
    from pathlib import Path

    from otel_replay.storage.convert import ChunkWriter

    table = request_to_table(encode_spans(_spans()))
    writer = ChunkWriter(tmp_path, "t", chunk_rows=10**6, chunk_bytes=table.nbytes * 2 - 1)
    for _ in range(5):
        writer.add(table)
    writer.flush()
    names = sorted({Path(p).name for p in writer.paths})
    assert names == ["t-00000.parquet", "t-00001.parquet", "t-00002.parquet"]  # 2 + 2 + 1 tables
    assert writer.rows_written == 5 * table.num_rows
