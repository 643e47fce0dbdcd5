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
from otel_replay.query.store import Store


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


def test_an_object_with_times_past_nanoseconds_is_refused_skipped_and_stops_compaction(s3: Any, bucket: str) -> None:
    """A foreign object whose start_time is microseconds at 9999-12-31: named at open, skipped, compaction refused."""
    import pyarrow as pa

    from otel_replay.storage import compact

    uri = f"s3://{bucket}/traces"
    exporter = ParquetSpanExporter(uri, max_age_seconds=60)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for i in range(5):
        with provider.get_tracer("t").start_as_current_span(f"span-{i}"):
            pass
    provider.shutdown()
    [good] = [k for k in (o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]) if k.endswith(".parquet")]
    table = pq.read_table(io.BytesIO(s3.get_object(Bucket=bucket, Key=good)["Body"].read()))
    far = pa.array([253_402_300_799_000_000] * table.num_rows, pa.timestamp("us", "UTC"))
    at = table.schema.get_field_index("start_time")
    body = io.BytesIO()
    pq.write_table(table.set_column(at, pa.field("start_time", far.type), far), body)
    bad = good.rsplit("/", 1)[0] + "/part-far.parquet"
    s3.put_object(Bucket=bucket, Key=bad, Body=body.getvalue())
    before = {o["Key"]: o["ETag"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}

    with pytest.raises(CorruptFileError, match=r"part-far\.parquet: column start_time holds 9999-12-31T23:59:59Z"):
        Store(uri)
    with Store(uri, skip_corrupt=True) as store:
        assert [problem.path for problem in store.skipped] == [f"s3://{bucket}/{bad}"]
        assert store.rows("SELECT count(*) AS n FROM spans") == [{"n": 5}]
    with pytest.raises(CorruptFileError, match=r"part-far\.parquet: column start_time holds 9999-12-31T23:59:59Z"):
        compact(uri, grace_seconds=0)
    assert {o["Key"]: o["ETag"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]} == before
