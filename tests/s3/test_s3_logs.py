"""OTLP log records on an ``s3://`` dataset: received and converted into the bucket, read, compacted, aged out."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

from otel_replay.query.store import Store
from otel_replay.server import Receiver, ServerConfig
from otel_replay.storage import compact, drop_older_than
from otel_replay.storage.logs import LogWriter

from ..server.test_http_errors import post
from ..storage.test_log_partitions import log_request
from .conftest import keys

_QUERY = "SELECT time, body, trace_id, service_name FROM log_records ORDER BY ALL"


def _rows(uri: str) -> list[dict[str, Any]]:
    with Store(uri) as store:
        return store.rows(_QUERY)


def test_logs_sent_to_serve_land_in_the_bucket_compact_and_age_out(bucket: str, s3: Any, tmp_path: Path) -> None:
    uri = f"s3://{bucket}/received"
    config = ServerConfig(
        uri, http="127.0.0.1:0", grpc=None, convert_workers=0, flush_seconds=0.2, wal_dir=tmp_path / "wal"
    )
    receiver = Receiver(config).start()
    try:
        for day in (0, 1):
            assert post(receiver, log_request(day, 6).SerializeToString(), path="/v1/logs")[0] == 200
        hostile = log_request(1, 2)
        hostile.resource_logs[0].scope_logs[0].log_records.append(LogRecord(trace_id=b"\x01" * 17))
        status, _, body = post(receiver, hostile.SerializeToString(), path="/v1/logs")
        assert status == 200 and b"trace_id must be 16 bytes" in body  # partial success: the bad record named
    finally:
        receiver.stop()  # drains and converts the whole WAL
    metrics = receiver.metrics.snapshot()
    assert (metrics["log_records_rejected"], metrics["log_rows_written"]) == (1, 14)
    # more arrivals of the same dates, in small files, as a second writer would add them
    writer = LogWriter(uri, "late", chunk_rows=2)
    for start in (0, 2):
        writer.add_payload(log_request(0, 2, start).SerializeToString())
    writer.flush()
    stored = keys(s3, bucket, "received/logs/")
    assert len(stored) == 4 and all(k.startswith("received/logs/date=2026-01-0") for k in stored)
    before = _rows(uri)
    assert len(before) == 18 and {r["service_name"] for r in before} == {"svc"}

    report = compact(uri, grace_seconds=0)
    logs = {p.partition: (p.status, p.input_files, p.output_rows) for p in report.partitions}
    assert logs == {"logs/date=2026-01-01": ("compacted", 3, 10), "logs/date=2026-01-02": ("compacted", 1, 8)}
    assert _rows(uri) == before
    left = keys(s3, bucket, "received/logs/")
    assert sorted(k.rsplit("/", 1)[1].split("-g")[0] for k in left) == ["_manifest.json"] * 2 + ["compact"] * 2

    dropped = drop_older_than(uri, 0, today=dt.date(2026, 1, 2), grace_seconds=0)
    assert dropped.dropped == ["logs/date=2026-01-01"] and dropped.log_rows == 10
    assert [r for r in _rows(uri)] == [r for r in before if r["time"].date() == dt.date(2026, 1, 2)]
    assert not keys(s3, bucket, "received/logs/date=2026-01-01/")
