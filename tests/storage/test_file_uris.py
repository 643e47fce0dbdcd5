"""A ``file:///abs/path`` dataset URI means the same directory to every command, not ``./file:/abs/path``."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_replay.cli.rerun import rerun_command
from otel_replay.cli.storage import compact_command
from otel_replay.server.config import ServerConfig
from otel_replay.server.ingest import Ingestor
from otel_replay.storage import live_files
from otel_replay.storage.convert import ChunkWriter

from .conftest import count_rows


def test_compact_takes_a_file_uri(make_dataset) -> None:
    path, _ = make_dataset(spans=600, ids=60)
    before = count_rows(live_files(path))[1]
    result = CliRunner().invoke(compact_command, [f"file://{path}", "--grace", "0", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["output_rows"] == before
    assert count_rows(live_files(path))[1] == before


def test_serve_and_ingest_resolve_a_file_uri_to_the_directory(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "data"
    assert ServerConfig(dataset=f"file://{target}").dataset == target
    assert Ingestor(f"file://{target}").dataset == target
    assert not (tmp_path / "file:").exists()


def test_rerun_names_a_missing_file_uri_dataset_in_one_line(tmp_path: Path) -> None:
    args = ["some-session", "--entrypoint", "agents:run", "--dataset", f"file://{tmp_path}/nope"]
    result = CliRunner().invoke(rerun_command, args)
    assert result.exit_code == 1 and "does not exist" in result.output and "Traceback" not in result.output


def test_converted_spans_of_a_file_uri_dataset_land_in_its_directory(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name, span.start_time_unix_nano = b"\x01" * 16, b"\x02" * 8, "s", 10**18
    writer = ChunkWriter(f"file://{tmp_path}/data", "seg")
    writer.add_request(request)
    writer.flush()
    assert writer.rows_written == 1
    assert [Path(p).parent.parent for p in writer.paths] == [tmp_path / "data" / "spans"]
    assert live_files(tmp_path / "data") == [str(p) for p in writer.paths]
    assert not (tmp_path / "file:").exists()
