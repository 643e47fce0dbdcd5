"""Any engine reads the dataset: Apache Spark (local mode) runs the trade chain and gets DuckDB's rows.

Skipped unless ``pyspark`` is importable and a JDK is on PATH. pyspark is not a
project dependency; run this with an interpreter that has it, e.g. a separate
venv with pyspark whose ``.pth`` adds this project's site-packages.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from otel_replay.query.store import Store
from otel_replay.storage import compact, live_files
from otel_replay.storage.manifest import partition_dirs

pyspark = pytest.importorskip("pyspark")
if shutil.which("java") is None:
    pytest.skip("no java on PATH for Spark", allow_module_level=True)

from pyspark.sql import SparkSession  # noqa: E402

CHAINS = ("trade-000000000", "trade-000000007", "trade-000000123", "trade-000000299", "no-such-trade")
FIELDS = ("outcome_id", "outcome_correct", "decision_type", "event_type", "payload", "confidence", "action_cost")


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = (
        SparkSession.builder.master("local[1]")
        .appName("otel-replay-test")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.legacy.parquet.nanosAsLong", "true")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    yield session
    session.stop()


def _micros(value: dt.datetime | None) -> int | None:
    if value is None:
        return None
    return (value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)


def _comparable(body: str) -> dict[str, Any]:
    doc = json.loads(body)
    return {k: doc.get(k) for k in FIELDS if doc.get(k) is not None}


def test_spark_trade_chain_matches_duckdb(make_dataset, spark: Any) -> None:
    path, _ = make_dataset(spans=3000, ids=300, duplicates=0.02)
    # one partition compacted with its old files still on disk (grace), one left in arrival order:
    # Spark reads exactly the live files, as every reader must.
    compact(path, partitions=[partition_dirs(path)[0].name], grace_seconds=3600)
    files = live_files(path)
    frame = spark.read.option("basePath", str(path / "spans")).parquet(*files)
    assert dict(frame.dtypes)["start_time"] == "bigint"  # nanoseconds, as the Spark SQL expects
    frame.createOrReplaceTempView("spans")
    chain_sql = resources.files("otel_replay.queries").joinpath("chains/trade.spark.sql").read_text()
    wrapped = f"SELECT layer, unix_micros(event_time) AS t, record_id, body FROM ({chain_sql})"
    compared = 0
    with Store(path) as store:
        for chain_id in CHAINS:
            duck = store.run("chains/trade", chain_id=chain_id, chain_limit=101)
            rows = spark.sql(wrapped, args={"chain_id": chain_id, "chain_limit": 101}).collect()
            assert [(r["layer"], _micros(r["event_time"]), r["record_id"]) for r in duck] == [
                (r["layer"], r["t"], r["record_id"]) for r in rows
            ], chain_id
            assert [_comparable(r["body"]) for r in duck] == [_comparable(r["body"]) for r in rows], chain_id
            compared += len(rows)
    assert compared >= 4 * 6


def test_spark_reads_a_dataset_mixing_storage_schema_versions(make_dataset, spark: Any) -> None:
    from tests._versions import rewrite_as_version_1

    path, _ = make_dataset(spans=1500, ids=150, duplicates=0)
    files = live_files(path)
    for file in files[::2]:  # every other file as a version 1 writer stored it (typed values in the JSON)
        rewrite_as_version_1(Path(file))
    frame = spark.read.option("basePath", str(path / "spans")).option("mergeSchema", "true").parquet(*files)
    frame.createOrReplaceTempView("spans")
    chain_sql = resources.files("otel_replay.queries").joinpath("chains/trade.spark.sql").read_text()
    wrapped = f"SELECT layer, unix_micros(event_time) AS t, record_id, body FROM ({chain_sql})"
    compared = 0
    with Store(path) as store:
        for chain_id in ("trade-000000000", "trade-000000001", "trade-000000077", "trade-000000149"):
            duck = store.run("chains/trade", chain_id=chain_id, chain_limit=101)
            rows = spark.sql(wrapped, args={"chain_id": chain_id, "chain_limit": 101}).collect()
            assert [(r["layer"], _micros(r["event_time"]), r["record_id"]) for r in duck] == [
                (r["layer"], r["t"], r["record_id"]) for r in rows
            ], chain_id
            assert [_comparable(r["body"]) for r in duck] == [_comparable(r["body"]) for r in rows], chain_id
            compared += sum(1 for r in rows if _comparable(r["body"]).get("outcome_id"))
    assert compared >= 2  # outcomes found in both versions' files


def test_spark_and_duckdb_leave_out_copies_stored_at_another_span_than_sealed(make_dataset, spark: Any) -> None:
    """A record row whose sealed ``replay.record.span`` names another span is a copy: neither engine shows it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from otel_replay import semconv as sc

    path, _ = make_dataset(spans=1500, ids=150, duplicates=0)
    chain_id = "trade-000000007"
    tables = [pq.read_table(f, partitioning=None) for f in live_files(path)]
    rows = [r for t in tables for r in t.to_pylist() if r["correlation_id"] == chain_id]
    records = [r for r in rows if r["replay_kind"] in ("decision", "audit_entry", "outcome")]
    assert {r["replay_kind"] for r in records} >= {"decision", "audit_entry"}
    added = []
    for i, row in enumerate(records):
        attrs = json.loads(row["attributes"])
        place = f"{row['trace_id']}-{row['span_id']}"
        sealed = dict(row, attributes=json.dumps({**attrs, sc.RECORD_SPAN: place}))  # the record, in its place
        copy = dict(sealed, trace_id=f"{i + 1:032x}", span_id=f"{i + 1:016x}")  # the same bytes, elsewhere
        added += [sealed, copy]
    schema = tables[0].schema
    out = Path(live_files(path)[0]).parent / "sealed-and-copied.parquet"
    pq.write_table(pa.Table.from_pylist(added, schema=schema), out)
    files = live_files(path)
    frame = spark.read.option("basePath", str(path / "spans")).parquet(*files)
    frame.createOrReplaceTempView("spans")
    chain_sql = resources.files("otel_replay.queries").joinpath("chains/trade.spark.sql").read_text()
    wrapped = f"SELECT layer, unix_micros(event_time) AS t, record_id, body FROM ({chain_sql})"
    with Store(path) as store:
        duck = store.run("chains/trade", chain_id=chain_id, chain_limit=101)
        spark_rows = spark.sql(wrapped, args={"chain_id": chain_id, "chain_limit": 101}).collect()
    assert [(r["layer"], _micros(r["event_time"]), r["record_id"]) for r in duck] == [
        (r["layer"], r["t"], r["record_id"]) for r in spark_rows
    ]
    shown = {(json.loads(r["body"])["trace_id"], json.loads(r["body"])["span_id"]) for r in duck}
    copies = {(r["trace_id"], r["span_id"]) for r in added[1::2]}
    assert shown and not shown & copies  # only the rows in their sealed place (or sealed before places were)
    layers = [r["layer"] for r in duck]
    decisions = sum(1 for r in records if r["replay_kind"] == "decision")
    assert layers.count("trace") == decisions  # each decision once (its stored row and the sealed one share a span)
