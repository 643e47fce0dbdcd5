"""Conversion of a WAL segment of many tiny requests: records are converted in runs, not one table each."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_replay.storage.convert import convert_segment
from otel_replay.storage.wal import SEAL_MARK

from .._support import Zygote
from .conftest import expected_rows, make_spans, parquet_rows

_CONVERT = """
import json, sys
import pyarrow as pa
from otel_replay.storage.convert import convert_segment
before = pa.default_memory_pool().max_memory()  # a forked child inherits its parent's peak: it must be none
rows = convert_segment(sys.argv[1], sys.argv[2], "p")
print(json.dumps({"rows": rows, "arrow_peak": pa.default_memory_pool().max_memory(), "before": before}))
"""


def _segment(path: Path, payloads: list[bytes]) -> Path:
    """A sealed segment in the WAL's format (``<u32 length><u32 crc32>`` + payload per record, then the mark)."""
    with open(path, "wb") as handle:
        for payload in payloads:
            handle.write(struct.pack("<II", len(payload), zlib.crc32(payload)) + payload)
        handle.write(SEAL_MARK)
    return path


def _convert_in_a_fresh_process(zygote: Zygote, segment: Path, dataset: Path) -> dict:
    """Rows written and the Arrow memory pool's peak (deterministic for a given input, unlike RSS or time), in a
    process of its own forked from the session's zygote (which imported the package but allocated no Arrow memory)."""
    out = zygote.run(_CONVERT, str(segment), str(dataset))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["before"] == 0, result
    return result


def _one_span_requests(request: ExportTraceServiceRequest) -> list[bytes]:
    """``request`` split into one request a span (its resource and scope with it), as a SimpleSpanProcessor sends."""
    tiny = []
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                one = ExportTraceServiceRequest()
                into = one.resource_spans.add(resource=resource_spans.resource, schema_url=resource_spans.schema_url)
                into.scope_spans.add(scope=scope_spans.scope, schema_url=scope_spans.schema_url, spans=[span])
                tiny.append(one.SerializeToString())
    return tiny


@pytest.mark.slow
def test_many_one_span_records_cost_about_what_one_request_of_them_costs(zygote: Zygote, tmp_path: Path) -> None:
    spans = make_spans(2500)  # 5000 spans
    request = encode_spans(spans)
    tiny_records = _one_span_requests(request)
    assert len(tiny_records) == 5000
    assert tiny_records[:50] == [encode_spans([s]).SerializeToString() for s in spans[:50]]  # what the SDK sends
    one = _convert_in_a_fresh_process(
        zygote, _segment(tmp_path / "one.wal", [request.SerializeToString()]), tmp_path / "one"
    )
    tiny = _convert_in_a_fresh_process(zygote, _segment(tmp_path / "tiny.wal", tiny_records), tmp_path / "tiny")
    assert one["rows"] == tiny["rows"] == 5000
    # One Arrow table per record took 7x the Arrow memory here (83 MiB against 13 MiB at 20k records).
    assert tiny["arrow_peak"] < 2 * one["arrow_peak"], (tiny, one)
    assert parquet_rows(tmp_path / "tiny") == parquet_rows(tmp_path / "one") == expected_rows(spans)


def test_runs_of_records_convert_to_the_same_rows_as_each_record(tmp_path: Path) -> None:
    spans = make_spans(300)
    payloads = [encode_spans(spans[i : i + 7]).SerializeToString() for i in range(0, len(spans), 7)]
    segment = _segment(tmp_path / "seg.wal", payloads)
    assert convert_segment(str(segment), str(tmp_path / "ds"), "p") == 600
    assert parquet_rows(tmp_path / "ds") == expected_rows(spans)
