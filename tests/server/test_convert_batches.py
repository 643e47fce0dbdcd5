"""Conversion of a WAL segment of many tiny requests: records are converted in runs, not one table each."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from otel_replay.storage.convert import convert_segment
from otel_replay.storage.wal import SEAL_MARK

from .conftest import expected_rows, make_spans, parquet_rows

_CONVERT = """
import json, sys
import pyarrow as pa
from otel_replay.storage.convert import convert_segment
rows = convert_segment(sys.argv[1], sys.argv[2], "p")
print(json.dumps({"rows": rows, "arrow_peak": pa.default_memory_pool().max_memory()}))
"""


def _segment(path: Path, payloads: list[bytes]) -> Path:
    """A sealed segment in the WAL's format (``<u32 length><u32 crc32>`` + payload per record, then the mark)."""
    with open(path, "wb") as handle:
        for payload in payloads:
            handle.write(struct.pack("<II", len(payload), zlib.crc32(payload)) + payload)
        handle.write(SEAL_MARK)
    return path


def _convert_in_a_fresh_process(segment: Path, dataset: Path) -> dict:
    """Rows written and the Arrow memory pool's peak (deterministic for a given input, unlike RSS or time)."""
    out = subprocess.run(
        [sys.executable, "-c", _CONVERT, str(segment), str(dataset)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


@pytest.mark.slow
def test_many_one_span_records_cost_about_what_one_request_of_them_costs(tmp_path: Path) -> None:
    spans = make_spans(2500)  # 5000 spans
    one = _convert_in_a_fresh_process(
        _segment(tmp_path / "one.wal", [encode_spans(spans).SerializeToString()]), tmp_path / "one"
    )
    tiny = _convert_in_a_fresh_process(
        _segment(tmp_path / "tiny.wal", [encode_spans([s]).SerializeToString() for s in spans]), tmp_path / "tiny"
    )
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
