"""Log record rows: what is admitted, how bodies are kept (JSON, redacted, cut), where the rows land."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

from otel_replay.redaction import MAX_CONTENT_CHARS
from otel_replay.storage.logs import LogWriter, admit_logs, body_json, logs_to_table

_DAY = 86_400 * 10**9


def _request(*records: LogRecord) -> ExportLogsServiceRequest:
    request = ExportLogsServiceRequest()
    resource_logs = request.resource_logs.add()
    resource_logs.resource.attributes.add(key="service.name").value.string_value = "rows"
    resource_logs.scope_logs.add().log_records.extend(records)
    return request


@pytest.mark.parametrize(
    ("record", "counter"),
    [
        (LogRecord(time_unix_nano=2**63), "bad_times"),
        (LogRecord(observed_time_unix_nano=2**64 - 1), "bad_times"),
        (LogRecord(trace_id=bytes(16), span_id=b"\x01" * 8), "bad_ids"),
        (LogRecord(trace_id=b"\x01" * 16, span_id=bytes(8)), "bad_ids"),
        (LogRecord(trace_id=b"\x01" * 17), "bad_ids"),
        (LogRecord(dropped_attributes_count=2**32 - 1), "bad_counts"),
    ],
    ids=["time", "observed", "zero-trace", "zero-span", "long-trace", "count"],
)
def test_unstorable_records_are_dropped_counted_and_named(record: LogRecord, counter: str) -> None:
    request = _request(LogRecord(time_unix_nano=1), record)
    result = admit_logs(request)
    assert (result.accepted, result.rejected, getattr(result, counter)) == (1, 1, 1)
    assert result.message.startswith("log record 1 (resource_logs[0].scope_logs[0]): ")
    assert len(request.resource_logs[0].scope_logs[0].log_records) == 1
    assert logs_to_table(request).num_rows == 1  # what is admitted converts


def test_dates_past_the_per_request_bound_are_refused() -> None:
    request = _request(*(LogRecord(time_unix_nano=day * _DAY + 1) for day in range(5)))
    result = admit_logs(request, max_dates=3)
    assert (result.accepted, result.too_many_dates) == (3, 2) and result.days == {0, 1, 2}


def test_bodies_are_json_redacted_and_cut() -> None:
    assert json.loads(body_json({"token": "abc", "n": [1, 2.5, None, True]})) == {
        "token": "[REDACTED]",
        "n": [1, 2.5, None, True],
    }
    cut = json.loads(body_json("Bearer abcdefghijklmnopqrstuvwxyz0123 " + "y" * (3 * MAX_CONTENT_CHARS)))
    assert isinstance(cut, str) and "abcdefghijklmnop" not in cut and cut.endswith("chars cut]")
    assert len(cut) < MAX_CONTENT_CHARS + 40
    odd = json.loads(body_json({"x": math.nan, "y": [math.inf]}))  # strict JSON, no NaN literal
    assert odd == {"x": "nan", "y": ["inf"]}
    assert json.loads(body_json("ünïcode \u2028 \x00")) == "ünïcode \u2028 \x00"


def test_rows_carry_ids_event_names_and_dates() -> None:
    record = LogRecord(
        time_unix_nano=0,
        observed_time_unix_nano=3 * _DAY,
        severity_number=17,
        trace_id=b"\xab" * 16,
        span_id=b"\xcd" * 8,
    )
    record.attributes.add(key="event.name").value.string_value = "gen_ai.choice"
    record.attributes.add(key="api_key").value.string_value = "secret-value"
    named = LogRecord(time_unix_nano=_DAY, event_name="gen_ai.user.message")
    named.attributes.add(key="event.name").value.string_value = "ignored"  # the field wins
    table = logs_to_table(_request(record, named))
    rows = table.to_pydict()
    assert rows["event_name"] == ["gen_ai.choice", "gen_ai.user.message"]
    assert rows["trace_id"] == ["ab" * 16, None] and rows["span_id"] == ["cd" * 8, None]
    assert rows["date"] == ["1970-01-04", "1970-01-02"]  # the time, else the observed time
    assert rows["body"] == [None, None] and rows["severity_number"] == [17, None]
    assert json.loads(rows["attributes"][0])["api_key"] == "[REDACTED]"
    assert rows["service_name"] == ["rows", "rows"]


def test_chunks_are_bounded_and_named_the_same_every_time(tmp_path: Path) -> None:
    payloads = [_request(LogRecord(time_unix_nano=_DAY + n)).SerializeToString() for n in range(5)]
    for _ in range(2):  # converting the same records again rewrites the same files
        writer = LogWriter(tmp_path, "seg", chunk_rows=2)
        for payload in payloads:
            writer.add_payload(payload)
        writer.flush()
        assert writer.rows_written == 5
    files = sorted((tmp_path / "logs" / "date=1970-01-02").glob("*.parquet"))
    assert [f.name for f in files] == ["seg-00000.parquet", "seg-00001.parquet", "seg-00002.parquet"]
    assert [pq.read_metadata(f).num_rows for f in files] == [2, 2, 1]
    assert pq.read_schema(files[0]).metadata[b"otel_replay.schema_version"] == b"1"
