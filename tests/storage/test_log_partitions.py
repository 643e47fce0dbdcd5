"""Log record partitions (``logs/date=…``) go through compaction and retention the way span partitions do."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

import otel_replay
from otel_replay.cli.storage import compact_command
from otel_replay.errors import CorruptFileError
from otel_replay.exporters.schema import LOGS_DIR
from otel_replay.storage import PartitionLease, compact, drop_older_than
from otel_replay.storage.kinds import LOGS
from otel_replay.storage.logs import LogWriter
from otel_replay.storage.manifest import live_files, partition_dirs, read_manifest

_DAY = 86_400 * 10**9
_JAN_1 = dt.date(2026, 1, 1)
_COLUMNS = "time, observed_time, body, attributes, event_name, trace_id, span_id, service_name"


def log_request(day: int, count: int, start: int = 0) -> ExportLogsServiceRequest:
    """``count`` records on day ``day`` after 2026-01-01; two of each pair are equal (both must be kept)."""
    base = (dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp() * 10**9) // 1 + day * _DAY
    request = ExportLogsServiceRequest()
    rl = request.resource_logs.add()
    rl.resource.attributes.add(key="service.name").value.string_value = "svc"
    records = rl.scope_logs.add().log_records
    for i in range(start, start + count):
        record = LogRecord(time_unix_nano=int(base) + (i // 2) * 1000, trace_id=bytes([1 + i // 2 % 7]) * 16)
        record.body.string_value = f"line {i // 2}"
        record.attributes.add(key="event.name").value.string_value = "gen_ai.choice"
        records.append(record)
    return request


def _logs_dataset(path: Path, *, days: int = 2, per_day: int = 24, chunk_rows: int = 4) -> Path:
    """Log records written by the receiver's writer in small chunks: many small files per date."""
    writer = LogWriter(path, "seg-00001", chunk_rows=chunk_rows)
    for day in range(days):
        for start in range(0, per_day, 4):
            writer.add_payload(log_request(day, 4, start).SerializeToString())
    writer.flush()
    return path


def _rows(path: Path) -> Counter[tuple[Any, ...]]:
    """The live log rows, read by the reader rule the ``log_records`` view uses."""
    files = live_files(path, directory=LOGS_DIR)
    if not files:
        return Counter()
    with duckdb.connect() as con:
        return Counter(con.execute(f"SELECT {_COLUMNS} FROM read_parquet(?)", [files]).fetchall())


def _view_rows(path: Path) -> Counter[tuple[Any, ...]]:
    with otel_replay.open(path) as store:
        return Counter(tuple(row.values()) for row in store.rows(f"SELECT {_COLUMNS} FROM log_records"))


def test_compaction_rewrites_many_small_log_files_into_few_with_every_row_kept(tmp_path: Path) -> None:
    path = _logs_dataset(tmp_path / "ds")
    before = _view_rows(path)
    files_before = live_files(path, directory=LOGS_DIR)
    assert sum(before.values()) == 48 and len(files_before) == 12 and max(before.values()) == 2  # equal pairs
    report = compact(path, grace_seconds=600)
    logs = [p for p in report.partitions if p.rows == "log records"]
    assert [p.partition for p in logs] == ["logs/date=2026-01-01", "logs/date=2026-01-02"]
    done = [(p.status, p.input_rows, p.output_rows, p.duplicates_removed) for p in logs]
    assert done == [("compacted", 24, 24, 0)] * 2
    assert report.log_rows == 48 and report.output_rows == 0  # no span was there
    after = live_files(path, directory=LOGS_DIR)
    assert len(after) == 2 and all("/compact-g1-" in f for f in after)
    assert _view_rows(path) == before == _rows(path)  # the superseded files are still on disk, not read twice
    assert all(Path(f).exists() for f in files_before)
    times = pq.read_table(after[0], columns=["time"]).column("time").to_pylist()
    assert times == sorted(times)
    again = compact(path)
    assert {p.status for p in again.partitions} == {"current"}


@pytest.mark.parametrize("crash_at", ["written", "renamed", "indexed"])
def test_a_log_compaction_that_dies_before_its_swap_changes_nothing_readers_see(tmp_path: Path, crash_at: str) -> None:
    path = _logs_dataset(tmp_path / "ds", days=1)
    before = _rows(path)

    def die(step: str) -> None:
        if step == crash_at:
            raise KeyboardInterrupt(step)

    with pytest.raises(KeyboardInterrupt):
        compact(path, _on_step=die)
    assert _rows(path) == before
    partition = partition_dirs(path, LOGS_DIR)[0]
    assert not [n for n in partition.iterdir() if n.name.startswith(("compact-", ".compact-"))]
    report = compact(path, grace_seconds=0)
    assert [p.status for p in report.partitions] == ["compacted"] and _rows(path) == before
    manifest = read_manifest(partition)
    assert manifest is not None and manifest.index is None and manifest.pending == {}
    assert sorted(n.name for n in partition.glob("*.parquet")) == manifest.files  # grace 0: the arrivals are gone


def test_a_log_partition_holding_a_foreign_file_is_refused_by_name_and_left_as_it_was(tmp_path: Path) -> None:
    path = _logs_dataset(tmp_path / "ds", days=1)
    partition = partition_dirs(path, LOGS_DIR)[0]
    foreign = partition / "stray.parquet"
    pq.write_table(pa.table({"time": [1], "body": [[1, 2]]}), foreign)  # no ids; a nested body
    listing = sorted(n.name for n in partition.iterdir())
    with pytest.raises(CorruptFileError, match=r"stray\.parquet.*not a log record file: no observed_time column"):
        compact(path)
    assert sorted(n.name for n in partition.iterdir()) == listing
    pq.write_table(pa.table({k: [None] for k in ("time", "observed_time", "trace_id", "span_id")}), foreign)
    nested = pa.table({"time": [1], "observed_time": [1], "trace_id": ["a"], "span_id": ["b"], "body": [[1]]})
    pq.write_table(nested, foreign)
    with pytest.raises(CorruptFileError, match=r"stray\.parquet.*column time is int64"):
        compact(path)


def test_retention_drops_old_log_partitions_by_the_span_rule_and_counts_them(tmp_path: Path) -> None:
    path = _logs_dataset(tmp_path / "ds", days=3)
    (path / LOGS_DIR / "date=2026-13-45").mkdir()  # named like a partition, no such date: never dropped
    report = drop_older_than(path, 1, today=_JAN_1 + dt.timedelta(days=3))
    assert report.dropped == ["logs/date=2026-01-01", "logs/date=2026-01-02"]
    assert (report.log_rows, report.rows, report.files) == (48, 0, 12)
    assert report.not_partitions == ["logs/date=2026-13-45"] and report.checkpoints == 0
    assert [p.name for p in partition_dirs(path, LOGS_DIR)] == ["date=2026-01-03"]
    assert sum(_rows(path).values()) == 24
    assert (path / LOGS_DIR / "date=2026-13-45").is_dir()


def test_a_log_partition_under_its_lease_is_left_and_reported_busy(tmp_path: Path) -> None:
    path = _logs_dataset(tmp_path / "ds", days=1)
    lease = PartitionLease(path, LOGS.lease_name("date=2026-01-01"))
    assert lease.acquire()
    try:
        assert drop_older_than(path, 0, today=_JAN_1 + dt.timedelta(days=9)).busy == ["logs/date=2026-01-01"]
        assert compact(path).busy == ["logs/date=2026-01-01"]
    finally:
        lease.release()
    assert PartitionLease(path, "date=2026-01-01").acquire()  # the span partition's lease is another one


def test_the_command_compacts_and_ages_out_log_partitions(tmp_path: Path) -> None:
    path = _logs_dataset(tmp_path / "ds")
    result = CliRunner().invoke(compact_command, [str(path), "--partition", "2026-01-02", "--grace", "0"])
    assert result.exit_code == 0, result.output
    assert "logs/date=2026-01-02: compacted, 24 log records in 6 files -> 24 in 1 files" in result.output
    assert "0 -> 0 spans, 24 log records" in result.output
    result = CliRunner().invoke(compact_command, [str(path), "--older-than", "0", "--partition", "2026-01-01"])
    assert result.exit_code == 0, result.output
    assert "dropped 2 partition(s) older than 0 days (7 files, 0 spans, 48 log records)" in result.output
    assert partition_dirs(path, LOGS_DIR) == []
