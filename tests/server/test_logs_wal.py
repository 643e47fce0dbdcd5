"""Log records in the write-ahead log: mixed with spans, after damage, and after a ``kill -9`` of serve."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, LogRecordExportResult, SimpleLogRecordProcessor

from otel_replay.storage.convert import Converted, convert_segment, convert_segment_rows, salvage_segment
from otel_replay.storage.logs import logs_payload, wrap_logs
from otel_replay.storage.wal import WriteAheadLog

from .._support import Zygote
from .conftest import make_spans, parquet_rows, stop_forked
from .test_kill9 import start_server


def _logs(*bodies: str, service: str = "wal") -> bytes:
    request = ExportLogsServiceRequest()
    resource_logs = request.resource_logs.add()
    resource_logs.resource.attributes.add(key="service.name").value.string_value = service
    records = resource_logs.scope_logs.add().log_records
    for n, body in enumerate(bodies):
        record = records.add(time_unix_nano=1_700_000_000_000_000_000 + n)
        record.body.string_value = body
    return request.SerializeToString()


def _log_bodies(dataset: Path) -> list[str]:
    files = sorted(p for p in (dataset / "logs").rglob("*.parquet") if not p.name.startswith("."))
    return sorted(body for p in files for body in pq.read_table(p, partitioning=None).column("body").to_pylist())


def _segment(tmp_path: Path, *records: bytes) -> Path:
    wal = WriteAheadLog(tmp_path / "wal")
    for record in records:
        wal.append(record)
    wal.close()
    (segment,) = wal.sealed() or list((tmp_path / "wal").glob("*.wal"))
    return segment if isinstance(segment, Path) else segment.path


def test_wrapping_is_recognised_and_nothing_else_is() -> None:
    payload = _logs("a")
    assert logs_payload(wrap_logs(payload)) == payload
    spans = encode_spans(make_spans(1)).SerializeToString()
    assert logs_payload(spans) is None
    assert logs_payload(wrap_logs(payload)[:-1]) is None  # cut short: not a whole wrapped request
    assert logs_payload(b"\x12\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff") is None  # a varint that never ends


def test_a_segment_of_spans_and_logs_converts_each_to_its_own_files(tmp_path: Path) -> None:
    spans = encode_spans(make_spans(3)).SerializeToString()
    path = _segment(tmp_path, spans, wrap_logs(_logs("one", "two")), spans, wrap_logs(_logs("three")))
    dataset = tmp_path / "ds"
    rows = convert_segment(str(path), str(dataset), "seg")
    assert rows == 12  # span rows: 6 spans twice (the log records are not spans)
    assert len(parquet_rows(dataset)) == 12
    assert _log_bodies(dataset) == ['"one"', '"three"', '"two"']
    # again (a restart after a crash): the same files, no more rows; the log rows counted apart
    assert convert_segment_rows(str(path), str(dataset), "seg") == Converted(spans=12, logs=3)
    assert _log_bodies(dataset) == ['"one"', '"three"', '"two"']


def test_salvage_finds_log_records_after_damage(tmp_path: Path) -> None:
    spans = encode_spans(make_spans(2)).SerializeToString()
    path = _segment(tmp_path, wrap_logs(_logs("before")), spans, wrap_logs(_logs("after")))
    data = bytearray(path.read_bytes())
    first = int.from_bytes(data[:4], "little")
    data[8 + first + 20] ^= 0xFF  # inside the span record: its checksum fails
    path.write_bytes(bytes(data))
    dataset = tmp_path / "ds"
    report = salvage_segment(str(path), str(dataset), "seg")
    assert report.records_dropped == 1 and report.rows == 0  # the span record is lost, and counted
    assert report.log_rows == 2
    assert _log_bodies(dataset) == ['"after"', '"before"']


@pytest.mark.slow
def test_sigkill_after_the_ack_keeps_the_log_records(zygote: Zygote, tmp_path: Path) -> None:
    dataset = tmp_path / "ds"
    proc, port = start_server(zygote, dataset, flush_seconds=3600)  # everything acknowledged stays in the WAL
    try:
        collect = InMemoryLogRecordExporter()
        provider = LoggerProvider()
        provider.add_log_record_processor(SimpleLogRecordProcessor(collect))
        logger = provider.get_logger("kill9")
        for n in range(20):
            logger.emit(body=f"kept {n}", event_name="gen_ai.choice")
        records = list(collect.get_finished_logs())
        exporter = OTLPLogExporter(endpoint=f"127.0.0.1:{port}", insecure=True, timeout=10)
        results = [exporter.export(records[n : n + 5]) for n in range(0, 20, 5)]  # four acknowledged exports
        assert results == [LogRecordExportResult.SUCCESS] * 4
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        stop_forked(proc, signal.SIGKILL)
    assert _log_bodies(dataset) == [] and list((dataset / "_wal" / "default").glob("*.wal"))
    restarted, _ = start_server(zygote, dataset)  # replays the WAL into Parquet
    try:
        end = time.monotonic() + 60
        while len(_log_bodies(dataset)) < 20 and time.monotonic() < end:
            time.sleep(0.2)
    finally:
        assert stop_forked(restarted, signal.SIGTERM) == 0
    assert _log_bodies(dataset) == sorted(f'"kept {n}"' for n in range(20))
