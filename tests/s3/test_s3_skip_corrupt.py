"""A damaged object in an s3:// dataset: named by a query, left out (and listed) with skip_corrupt."""

from __future__ import annotations

import io
from typing import Any

import pyarrow.parquet as pq
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from otel_replay.errors import CorruptFileError
from otel_replay.exporters import ParquetSpanExporter
from otel_replay.store import Store


def _damaged_copy(s3: Any, bucket: str, key: str) -> str:
    data = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    meta = pq.read_metadata(io.BytesIO(bytes(data))).row_group(0)
    for i in range(meta.num_columns):  # the footer stays intact: only a query decoding the pages finds it
        offset = meta.column(i).data_page_offset
        data[offset : offset + 4] = b"\xff\xff\xff\xff"
    bad = key.rsplit("/", 1)[0] + "/part-damaged.parquet"
    s3.put_object(Bucket=bucket, Key=bad, Body=bytes(data))
    return bad


def test_a_damaged_object_is_named_then_skipped_and_listed(s3: Any, bucket: str) -> None:
    uri = f"s3://{bucket}/traces"
    exporter = ParquetSpanExporter(uri, max_age_seconds=60)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for i in range(5):
        with provider.get_tracer("t").start_as_current_span(f"span-{i}"):
            pass
    provider.shutdown()
    [good] = [k for k in (o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]) if k.endswith(".parquet")]
    bad = _damaged_copy(s3, bucket, good)

    with Store(uri) as store, pytest.raises(CorruptFileError, match="part-damaged.parquet"):
        store.rows("SELECT * FROM spans")
    with Store(uri, skip_corrupt=True) as store:
        rows = store.rows("SELECT name FROM spans ORDER BY name")
        assert [r["name"] for r in rows] == [f"span-{i}" for i in range(5)]  # the good object's rows, once
        assert [problem.path for problem in store.skipped] == [f"s3://{bucket}/{bad}"]
        assert store.rows("SELECT count(*) AS n FROM spans") == [{"n": 5}]  # and it stays left out
