from __future__ import annotations

import json
import logging
import textwrap
import time

import pyarrow.parquet as pq
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Link

import otel_replay
from otel_replay import ConfigError, DatasetError, audit
from otel_replay.exporters import SPAN_SCHEMA, ParquetSpanExporter
from otel_replay.exporters.key_log import KEY_LOG_NAME
from otel_replay.exporters.schema import SCHEMA_METADATA_KEY

from .._support import payment, snapshot


def _provider(exporter: ParquetSpanExporter) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": "exp-test", "deployment": "ci"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _files(dataset):
    return sorted(p for p in (dataset / "spans").rglob("*") if p.is_file() and p.name != KEY_LOG_NAME)


def test_spans_land_as_typed_rows_with_events_links_and_metadata(dataset):
    exporter = ParquetSpanExporter(dataset)
    provider = _provider(exporter)
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("first") as first:
        pass
    with tracer.start_as_current_span(
        "second",
        links=[Link(first.get_span_context(), {"why": "follows"})],
        attributes={"replay.correlation_id": "c-9", "n": 3, "f": 0.5, "tags": ["a", "b"], "ok": True},
    ) as span:
        span.add_event("checkpoint", {"step": 2})
        with tracer.start_as_current_span("child"):
            pass
    provider.shutdown()
    files = _files(dataset)
    assert len(files) == 1 and files[0].parent.name.startswith("date=")
    assert files[0].suffix == ".parquet" and not files[0].name.startswith(".")
    meta = pq.read_metadata(files[0])
    assert meta.schema.to_arrow_schema().metadata[SCHEMA_METADATA_KEY] == b"2"
    assert meta.row_group(0).column(0).compression == "ZSTD"
    with otel_replay.open(dataset) as store:
        rows = {r["name"]: r for r in store.rows("SELECT * FROM spans")}
    second = rows["second"]
    assert second["correlation_id"] == "c-9"
    assert json.loads(second["attributes"]) == {"n": 3, "f": 0.5, "tags": ["a", "b"], "ok": True}
    assert second["service_name"] == "exp-test"
    assert json.loads(second["resource_attributes"])["deployment"] == "ci"
    assert second["events"][0]["name"] == "checkpoint" and json.loads(second["events"][0]["attributes"]) == {"step": 2}
    assert second["links"][0]["span_id"] == rows["first"]["span_id"]
    assert rows["child"]["parent_span_id"] == second["span_id"]
    assert rows["first"]["parent_span_id"] is None
    assert second["kind"] == "INTERNAL" and second["duration_ns"] >= 0
    assert [f.name for f in pq.read_schema(files[0])] == [f.name for f in SPAN_SCHEMA]


def test_buffer_rolls_by_rows_not_per_batch(dataset):
    exporter = ParquetSpanExporter(dataset, max_rows=50, max_age_seconds=3600)
    provider = _provider(exporter)
    tracer = provider.get_tracer("t")
    for i in range(120):
        tracer.start_span(f"s{i}").end()
    # 120 single-span batches -> 2 files of 50 (written by the writer thread), 20 buffered
    deadline = time.monotonic() + 30
    # the writer thread renames a file into place, then updates its counters: wait for both
    while (len(_files(dataset)) < 2 or exporter.writer.buffered_rows != 20) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(_files(dataset)) == 2
    assert exporter.writer.buffered_rows == 20
    provider.shutdown()
    assert len(_files(dataset)) == 3
    with otel_replay.open(dataset) as store:
        assert store.rows("SELECT count(*) AS n, count(DISTINCT span_id) AS u FROM spans")[0] == {"n": 120, "u": 120}


def test_buffer_rolls_by_age(dataset):
    exporter = ParquetSpanExporter(dataset, max_rows=10_000, max_age_seconds=0.2)
    provider = _provider(exporter)
    provider.get_tracer("t").start_span("lonely").end()
    deadline = time.monotonic() + 10
    while not _files(dataset) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(_files(dataset)) == 1
    provider.shutdown()


def test_export_after_shutdown_fails_without_raising(dataset):
    exporter = ParquetSpanExporter(dataset)
    exporter.shutdown()
    from opentelemetry.sdk.trace.export import SpanExportResult

    from otel_replay.exporters.rows import spans_to_table  # noqa: F401  (import works standalone)

    assert exporter.export([]) is SpanExportResult.FAILURE


def test_spans_spanning_two_days_go_to_two_partitions(dataset):
    exporter = ParquetSpanExporter(dataset)
    provider = _provider(exporter)
    tracer = provider.get_tracer("t")
    day = 86_400 * 10**9
    tracer.start_span("yesterday", start_time=1_767_225_600 * 10**9 - day).end(end_time=1_767_225_600 * 10**9 - day + 5)
    tracer.start_span("today", start_time=1_767_225_600 * 10**9).end(end_time=1_767_225_600 * 10**9 + 5)
    provider.shutdown()
    assert sorted(p.parent.name for p in _files(dataset)) == ["date=2025-12-31", "date=2026-01-01"]
    with otel_replay.open(dataset) as store:
        dates = store.rows("SELECT name, CAST(date AS VARCHAR) AS d FROM spans ORDER BY name")
    assert dates == [{"name": "today", "d": "2026-01-01"}, {"name": "yesterday", "d": "2025-12-31"}]


def test_failed_writes_keep_rows_then_drop_and_count(dataset, caplog):
    import logging

    exporter = ParquetSpanExporter(dataset, max_rows=10, max_age_seconds=3600)
    provider = _provider(exporter)
    tracer = provider.get_tracer("t")
    blocker = dataset / "spans"
    # Make the partition directory impossible to create: a file where a directory must go.
    import shutil

    shutil.rmtree(blocker)
    blocker.write_text("not a directory")
    with caplog.at_level(logging.ERROR):
        for i in range(9):
            tracer.start_span(f"s{i}").end()
        assert exporter.force_flush() is False
        assert exporter.stats.write_errors == 1 and exporter.writer.buffered_rows == 9
        for i in range(40):
            tracer.start_span(f"t{i}").end()
        assert exporter.force_flush() is False  # 49 > 4 * max_rows still unwritable: dropped
    assert exporter.stats.rows_dropped > 0
    assert exporter.stats.rows_dropped + exporter.writer.buffered_rows == 49
    assert any("DROPPED" in r.getMessage() for r in caplog.records)
    blocker.unlink()
    blocker.mkdir()
    provider.shutdown()
    with otel_replay.open(dataset) as store:
        written = store.rows("SELECT count(*) AS n FROM spans")[0]["n"]
    assert written + exporter.stats.rows_dropped == 49


def test_a_partition_written_before_a_failure_is_not_written_again(dataset):
    exporter = ParquetSpanExporter(dataset, max_age_seconds=3600)
    provider = _provider(exporter)
    tracer = provider.get_tracer("t")
    day = 86_400 * 10**9
    tracer.start_span("old", start_time=1_767_225_600 * 10**9 - day).end(end_time=1_767_225_600 * 10**9 - day + 5)
    tracer.start_span("new", start_time=1_767_225_600 * 10**9).end(end_time=1_767_225_600 * 10**9 + 5)
    (dataset / "spans" / "date=2026-01-01").write_text("blocks this partition")  # the second date fails
    assert exporter.force_flush() is False
    assert exporter.writer.buffered_rows == 1
    (dataset / "spans" / "date=2026-01-01").unlink()
    provider.shutdown()
    with otel_replay.open(dataset) as store:
        names = [r["name"] for r in store.rows("SELECT name FROM spans ORDER BY name")]
    assert names == ["new", "old"]


def _poison(tracer, how: str) -> None:
    if how == "start":
        tracer.start_span("poison", start_time=2**64 - 1).end()
    elif how == "end":
        tracer.start_span("poison", start_time=1_767_225_600 * 10**9).end(end_time=2**64 - 1)
    elif how == "negative-end":
        tracer.start_span("poison", start_time=1_767_225_600 * 10**9).end(end_time=-(2**63))
    elif how == "event":
        span = tracer.start_span("poison")
        span.add_event("late", timestamp=2**63 - 1)
        span.end()
    else:  # a lone surrogate: passes every check, fails only in Arrow's UTF-8 encoding
        tracer.start_span("poison\ud800").end()


@pytest.mark.parametrize("how", ["start", "end", "negative-end", "event", "surrogate"])
def test_a_poison_span_is_dropped_alone_counted_and_named(dataset, caplog, how):
    """Issue 6 item 5: one unstorable span no longer takes its whole batch (the sealed decision) with it."""
    telemetry = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600)
    other = telemetry.provider.get_tracer("other")
    try:
        with caplog.at_level(logging.ERROR, logger="otel_replay"):
            with audit("vendor_payment", snapshot=snapshot()) as d:
                d.read(invoice="INV-1")
                d.act(payment())
                _poison(other, how)
            # Everything above is one batch for the BatchSpanProcessor.
            assert telemetry.force_flush() is False
        stats = telemetry.exporter.stats
        assert (stats.spans_rejected, stats.rows_dropped) == (1, 1)
        dropped = [r.getMessage() for r in caplog.records if "dropped span" in r.getMessage()]
        assert len(dropped) == 1 and "'poison" in dropped[0], dropped
        # The next flush reports on what came after, and nothing failed since.
        other.start_span("fine").end()
        assert telemetry.force_flush() is True
    finally:
        telemetry.shutdown()
    with otel_replay.open(dataset) as store:
        names = sorted(r["name"] for r in store.rows("SELECT name FROM spans"))
        assert store.record(d.record.record_id) == d.record
    assert names == ["fine", "replay.act", "replay.decision", "replay.read"]


def test_limits_from_arguments_are_checked(dataset):
    for bad in ({"max_rows": 0}, {"max_bytes": -1}, {"max_age_seconds": float("nan")}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            ParquetSpanExporter(dataset, **bad)


def test_a_dataset_path_that_is_a_file_is_one_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(DatasetError, match=r"cannot create the dataset directory .*file/spans"):
        ParquetSpanExporter(blocker)


def test_export_after_shutdown_is_counted_as_dropped(dataset):
    exporter = ParquetSpanExporter(dataset)
    provider = _provider(exporter)
    provider.get_tracer("t").start_span("early").end()
    exporter.shutdown()
    provider.get_tracer("t").start_span("late").end()  # SimpleSpanProcessor still hands it over
    assert exporter.stats.rows_dropped == 1 and exporter.stats.rows_written == 1


def test_a_slow_write_never_backs_up_the_sdk_queue_and_loses_nothing(dataset, caplog):
    """Issue 9: a large-file exporter whose write takes long must not make the SDK drop spans."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporter = ParquetSpanExporter(dataset, max_rows=2_000, max_age_seconds=3600)
    provider = TracerProvider(resource=Resource.create({"service.name": "slow-disk"}))
    provider.add_span_processor(
        BatchSpanProcessor(exporter, max_queue_size=256, max_export_batch_size=128, schedule_delay_millis=5)
    )
    tracer = provider.get_tracer("t")
    bursts, per_burst = 40, 200
    with caplog.at_level(logging.WARNING):
        # Holding the writer's write lock stalls every Parquet write for as long as this block runs:
        # a disk that takes seconds per file. Export must go on handing rows over regardless.
        with exporter.writer._write_lock:
            for burst in range(bursts):
                for i in range(per_burst):
                    tracer.start_span(f"s{burst}-{i}").end()
                assert provider.force_flush(30_000)  # the SDK queue drains although nothing can be written
            assert exporter.writer.buffered_rows == bursts * per_burst and not _files(dataset)
        assert exporter.force_flush() is True  # durable in Parquet on return
        provider.shutdown()
    assert not [r.getMessage() for r in caplog.records if "Queue full" in r.getMessage()]
    assert exporter.stats.rows_dropped == 0 and exporter.stats.rows_written == bursts * per_burst
    with otel_replay.open(dataset) as store:
        assert store.rows("SELECT count(DISTINCT span_id) AS n FROM spans")[0]["n"] == bursts * per_burst


def test_the_hand_off_is_bounded_and_counts_what_it_drops(dataset, caplog):
    from otel_replay.exporters.rows import RowBuilder

    def table(n: int, offset: int):
        builder = RowBuilder()
        for i in range(offset, offset + n):
            builder.add(
                trace_id=f"{i:032x}", span_id=f"{i:016x}", parent_span_id=None, trace_state=None, name="s",
                kind="INTERNAL", resource=("svc", "{}"), scope=(None, None), start=10**18 + i, end=10**18 + i,
                status=("UNSET", None), attributes={}, events=[], links=[], dropped=(0, 0, 0),
            )
        return builder.table()

    writer = ParquetSpanExporter(dataset, max_rows=10, max_age_seconds=3600).writer
    offered = accepted = 0
    with caplog.at_level(logging.ERROR), writer._write_lock:  # the disk is stuck
        for batch in range(12):
            offered += 5
            accepted += 5 * writer.offer(table(5, batch * 5))
    assert 40 <= accepted < offered  # four full files wait; then new rows are refused
    assert writer.stats.rows_dropped == offered - accepted
    assert sum("DROPPED" in r.getMessage() for r in caplog.records) == 1  # logged once, counted always
    writer.close()
    assert writer.stats.rows_written == accepted
    with otel_replay.open(dataset) as store:
        assert store.rows("SELECT count(*) AS n FROM spans")[0]["n"] == accepted


def test_a_batch_writer_waits_for_the_disk_instead_of_dropping(dataset):
    import threading

    from otel_replay.exporters.rows import RowBuilder
    from otel_replay.exporters.writer import DatasetWriter

    def table(offset: int):
        builder = RowBuilder()
        for i in range(offset, offset + 5):
            builder.add(
                trace_id=f"{i:032x}", span_id=f"{i:016x}", parent_span_id=None, trace_state=None, name="s",
                kind="INTERNAL", resource=("svc", "{}"), scope=(None, None), start=10**18 + i, end=10**18 + i,
                status=("UNSET", None), attributes={}, events=[], links=[], dropped=(0, 0, 0),
            )  # fmt: skip
        return builder.table()

    writer = DatasetWriter(dataset, max_rows=10, max_age_seconds=3600)  # when_full="wait"
    results: list[bool] = []
    producer = threading.Thread(target=lambda: results.extend(writer.offer(table(5 * b)) for b in range(12)))
    with writer._write_lock:  # the disk is stuck: the producer fills four files, then waits
        producer.start()
        deadline = time.monotonic() + 30
        while writer.buffered_rows < 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert writer.buffered_rows == 40 and producer.is_alive() and writer.stats.rows_dropped == 0
    producer.join(timeout=60)
    assert not producer.is_alive() and results == [True] * 12
    writer.close()
    assert (writer.stats.rows_written, writer.stats.rows_dropped) == (60, 0)
    with pytest.raises(ConfigError, match="when_full"):
        DatasetWriter(dataset, when_full="block")


def test_write_partitions_splits_interleaved_dates_keeping_row_order(tmp_path):
    from otel_replay.exporters.rows import RowBuilder
    from otel_replay.exporters.writer import write_partitions

    day_ns = 86_400 * 10**9
    n = 300
    day_of = [i * 7 % 3 for i in range(n)]  # interleaved: 0, 1, 2, 0, ...
    builder = RowBuilder()
    for i in range(n):
        builder.add(
            trace_id=f"{i + 1:032x}", span_id=f"{i + 1:016x}", parent_span_id=None, trace_state=None, name=f"s{i}",
            kind="INTERNAL", resource=("svc", "{}"), scope=(None, None), start=day_ns * (20_000 + day_of[i]) + i,
            end=day_ns * (20_000 + day_of[i]) + i, status=("UNSET", None), attributes={}, events=[], links=[],
            dropped=(0, 0, 0),
        )  # fmt: skip
    paths = write_partitions(builder.table(), tmp_path, lambda date: "f.parquet")
    assert [p.parent.name for p in paths] == ["date=2024-10-04", "date=2024-10-05", "date=2024-10-06"]
    for day, path in enumerate(paths):
        got = pq.read_table(path, partitioning=None)
        assert got.column("name").to_pylist() == [f"s{i}" for i in range(n) if day_of[i] == day]
        assert got.schema.metadata[SCHEMA_METADATA_KEY] == SPAN_SCHEMA.metadata[SCHEMA_METADATA_KEY]


_FORKED_WITH_ROWS_IN_THE_WRITER = textwrap.dedent(
    """
    import os, sys, warnings
    import otel_replay
    from otel_replay import DependencySnapshot, audit

    warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded, fork() may deadlock"
    dataset = sys.argv[1]
    telemetry = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600)
    with audit("refund", snapshot=DependencySnapshot({"balance": 1}), correlation_id="parent"):
        pass
    telemetry.provider.force_flush()  # handed to the exporter's writer: buffered there, not yet in a file
    assert telemetry.exporter.writer.buffered_rows
    pid = os.fork()
    if pid == 0:
        with audit("refund", snapshot=DependencySnapshot({"balance": 2}), correlation_id="child"):
            pass
        telemetry.shutdown()  # the child's rows only: the parent's buffered ones are the parent's to write
        os._exit(0)
    os.waitpid(pid, 0)
    telemetry.shutdown()
    """
)


def test_a_forked_child_writes_only_its_own_spans_not_those_its_parent_had_buffered(zygote, dataset):
    child = zygote.run(_FORKED_WITH_ROWS_IN_THE_WRITER, str(dataset))
    assert child.returncode == 0, child.stderr
    with otel_replay.open(dataset) as store:
        twice = store.rows("SELECT span_id, count(*) AS n FROM spans GROUP BY span_id HAVING count(*) > 1")
        assert twice == []  # was: the parent's decision span written by both processes
        rows = store.rows("SELECT correlation_id FROM decisions ORDER BY correlation_id")
        assert [r["correlation_id"] for r in rows] == ["child", "parent"]
