"""``ingest`` of a line whose resource is large and shared by many spans: converted in pieces, every span kept."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_replay.storage.convert import split_request

_INGEST = """
import json, sys
import pyarrow as pa
from otel_replay.server.ingest import Ingestor
report = Ingestor(sys.argv[2]).ingest(sys.argv[1])
print(json.dumps({"spans": report.spans, "arrow_peak": pa.default_memory_pool().max_memory()}))
"""


def _line(spans: int, blob: int) -> str:
    attributes = [{"key": "service.name", "value": {"stringValue": "svc"}}]
    attributes.append({"key": "blob", "value": {"stringValue": "x" * blob}})
    items = [
        {
            "traceId": f"{n + 1:032x}",
            "spanId": f"{n + 1:016x}",
            "name": "s",
            "startTimeUnixNano": str(1_700_000_000_000_000_000 + n),
            "endTimeUnixNano": str(1_700_000_000_000_000_001 + n),
        }
        for n in range(spans)
    ]
    scope = {"scope": {"name": "x"}, "spans": items}
    return json.dumps({"resourceSpans": [{"resource": {"attributes": attributes}, "scopeSpans": [scope]}]})


@pytest.mark.slow
def test_a_large_shared_resource_is_converted_in_pieces_and_every_span_lands(tmp_path: Path) -> None:
    source = tmp_path / "big.jsonl"
    source.write_text(_line(3000, 128 * 1024) + "\n")  # 0.4 MiB of JSON; 375 MiB of rows, each with the resource
    out = subprocess.run(
        [sys.executable, "-c", _INGEST, str(source), str(tmp_path / "ds")], capture_output=True, text=True, check=True
    )
    result = json.loads(out.stdout)
    assert result["spans"] == 3000
    assert result["arrow_peak"] < 256 * 1024 * 1024, result  # 513 MiB before: all rows at once
    files = sorted((tmp_path / "ds" / "spans").rglob("*.parquet"))
    stored = [pq.read_table(f, columns=["span_id", "resource_attributes"]) for f in files]
    assert sum(t.num_rows for t in stored) == 3000
    assert len({s for t in stored for s in t.column("span_id").to_pylist()}) == 3000
    resources = stored[0].column("resource_attributes")[:3].to_pylist()
    assert all(len(json.loads(r)["blob"]) == 128 * 1024 for r in resources)


def test_split_request_keeps_every_span_once_in_order() -> None:
    from otel_replay.server.otlp_json import request_from_json

    request: ExportTraceServiceRequest = request_from_json(_line(50, 1000))
    pieces = list(split_request(request, max_shared_bytes=10_000))
    assert len(pieces) > 1
    ids = [s.span_id for p in pieces for rs in p.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert ids == [s.span_id for s in request.resource_spans[0].scope_spans[0].spans]
    assert list(split_request(request, max_shared_bytes=10**9)) == [request]
