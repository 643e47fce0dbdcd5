"""``otel-replay ingest`` reads the file exporter's LogsData (JSON lines, proto records) into ``logs/``."""

from __future__ import annotations

import json
from pathlib import Path

import zstandard
from click.testing import CliRunner
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

import otel_replay
from otel_replay.cli.serve import ingest_command
from otel_replay.server.ingest import Ingestor
from otel_replay.server.otlp_json import request_to_obj
from otel_replay.server.signals import is_logs_payload, otlp_from_proto

from ..storage.test_log_partitions import log_request
from .conftest import make_spans
from .test_ingest import framed, json_lines


def _logs_line(request: ExportLogsServiceRequest) -> bytes:
    return json.dumps(request_to_obj(request)).encode() + b"\n"


def _log_rows(dataset: Path) -> list[dict[str, object]]:
    with otel_replay.open(dataset) as store:
        return store.rows("SELECT body, trace_id, event_name FROM log_records ORDER BY time, body")


def _span_count(dataset: Path) -> int:
    with otel_replay.open(dataset) as store:
        return int(store.rows("SELECT count(*) AS n FROM spans")[0]["n"])


def test_json_lines_of_traces_and_logs_land_each_in_their_place(tmp_path: Path) -> None:
    source = tmp_path / "otlp.jsonl"
    spans = make_spans(5)
    hostile = log_request(0, 1)
    hostile.resource_logs[0].scope_logs[0].log_records.append(LogRecord(trace_id=b"\x01" * 17))
    source.write_bytes(
        json_lines([spans])
        + _logs_line(log_request(0, 4))
        + b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"severityNumber": "NOT_A_LEVEL"}]}]}]}\n'
        + _logs_line(hostile)
    )
    dataset = tmp_path / "ds"
    report = Ingestor(dataset).ingest(source)
    assert (report.spans, report.log_records, report.log_records_rejected) == (len(spans), 5, 1)
    assert [where for where, _ in report.malformed] == ["line 3", "line 4"]
    assert "NOT_A_LEVEL" in report.malformed[0][1] and "trace_id must be 16 bytes" in report.malformed[1][1]
    assert not report.clean
    rows = _log_rows(dataset)
    assert len(rows) == 5 and {r["event_name"] for r in rows} == {"gen_ai.choice"}
    assert _span_count(dataset) == len(spans)
    entry = json.loads((dataset / "_ingest" / "manifest.jsonl").read_text())
    assert entry["log_records"] == 5 and any(f.startswith("logs/date=2026-01-01/ingest-") for f in entry["files"])
    again = Ingestor(dataset).ingest(source)  # the same content: nothing twice
    assert again.status == "skipped" and len(_log_rows(dataset)) == 5


def test_proto_records_of_logs_plain_and_zstd_and_the_command_line(tmp_path: Path) -> None:
    spans = make_spans(1)
    payloads = [log_request(0, 3).SerializeToString(), encode_spans(spans).SerializeToString()]
    payloads.append(zstandard.ZstdCompressor().compress(log_request(1, 2).SerializeToString()))
    source = tmp_path / "otlp.binpb"
    source.write_bytes(framed(payloads))
    dataset = tmp_path / "ds"
    result = CliRunner().invoke(ingest_command, [str(source), "--dataset", str(dataset), "--quiet"])
    assert result.exit_code == 0, result.output
    assert f"{source}: {len(spans)} spans, 5 log records" in result.output
    assert f"ingested {len(spans)} spans and 5 log records from 1 file(s)" in result.output
    assert len(_log_rows(dataset)) == 5 and _span_count(dataset) == len(spans)


def test_an_interrupted_ingest_of_logs_is_redone_not_counted_twice(tmp_path: Path) -> None:
    source = tmp_path / "logs.jsonl"
    source.write_bytes(b"".join(_logs_line(log_request(0, 3, start)) for start in (0, 3)))
    dataset = tmp_path / "ds"
    Ingestor(dataset).ingest(source)
    manifest = dataset / "_ingest" / "manifest.jsonl"
    (token,) = [json.loads(line)["token"] for line in manifest.read_text().splitlines()]
    # What a run killed after writing its files and before its manifest entry leaves: files, a marker, no entry.
    manifest.write_text("")
    (dataset / "_ingest" / "pending" / f"{token}.json").write_text("{}")
    ingestor = Ingestor(dataset)
    report = ingestor.ingest(source)
    assert ingestor.recovered == [f"ingest-{token}"] and report.log_records == 6
    assert len(_log_rows(dataset)) == 6
    assert not list((dataset / "logs").rglob(f"ingest-{token}-*"))


def test_the_signal_is_told_by_the_first_records_wire_types() -> None:
    logs = log_request(0, 1).SerializeToString()
    traces = encode_spans(make_spans(1)).SerializeToString()
    assert is_logs_payload(logs) and not is_logs_payload(traces)
    assert isinstance(otlp_from_proto(logs), ExportLogsServiceRequest)
    late = ExportLogsServiceRequest()
    late.resource_logs.add().scope_logs.add()  # an empty resource and scope before the records
    late.resource_logs.extend(log_request(0, 1).resource_logs)
    assert is_logs_payload(late.SerializeToString())
    body_only = ExportLogsServiceRequest()
    body_only.resource_logs.add().scope_logs.add().log_records.add().body.string_value = "x"  # fits both: spans
    endless = b"\x0a" + b"\xff" * 10 + b"\x01"  # a length varint past ten bytes
    for hostile in (b"", b"\x0a", endless, logs[:7], body_only.SerializeToString()):
        assert not is_logs_payload(hostile)
