"""``otel-replay ingest``: file-exporter formats, idempotency, malformed lines."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import click
import zstandard
from click.testing import CliRunner
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from otel_replay.cli.serve import ingest_command
from otel_replay.server.ingest import Ingestor
from otel_replay.server.otlp_json import request_to_obj

from .conftest import expected_rows, make_spans, parquet_rows


def json_lines(batches: list) -> bytes:
    return b"".join(json.dumps(request_to_obj(encode_spans(b))).encode() + b"\n" for b in batches)


def framed(payloads: list[bytes]) -> bytes:
    return b"".join(struct.pack(">I", len(p)) + p for p in payloads)


def test_json_lines_idempotent_and_malformed_lines_reported(tmp_path: Path) -> None:
    spans = make_spans(30)
    batches = [spans[i : i + 20] for i in range(0, len(spans), 20)]
    lines = json_lines(batches).splitlines(keepends=True)
    lines.insert(1, b'{"resourceSpans": [ broken\n')
    lines.insert(3, b"\n")
    source = tmp_path / "traces.jsonl"
    source.write_bytes(b"".join(lines))
    dataset = tmp_path / "ds"

    result = CliRunner().invoke(ingest_command, [str(source), "--dataset", str(dataset), "--quiet"])
    # Exit status for skipped lines: see test_ingest_hostile.test_cli_exit_code_and_one_line_errors.
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert f"{source}:line 2: invalid JSON" in result.output
    assert "60 spans" in result.output and "1 malformed record(s) skipped" in result.output
    assert parquet_rows(dataset) == expected_rows(spans)

    again = CliRunner().invoke(ingest_command, [str(source), "--dataset", str(dataset), "--quiet"])
    assert again.exit_code == 0 and "skipped, already ingested" in again.output
    assert len(parquet_rows(dataset)) == 60

    # The file exporter appends: only the new lines are ingested.
    more = make_spans(5)
    with open(source, "ab") as handle:
        handle.write(json_lines([more]))
    report = Ingestor(dataset).ingest(source)
    assert report.status == "ingested" and report.spans == 10 and report.start_offset > 0
    assert parquet_rows(dataset) == expected_rows(spans + more)


def test_proto_zstd_and_document_forms(tmp_path: Path) -> None:
    a, b, c, d = make_spans(3, "a"), make_spans(4, "b"), make_spans(5, "c"), make_spans(2, "d")
    zstd = zstandard.ZstdCompressor()
    proto_file = tmp_path / "traces.binpb"  # format: proto
    proto_file.write_bytes(framed([encode_spans(a).SerializeToString(), encode_spans(b).SerializeToString()]))
    zstd_frames = tmp_path / "traces.zst"  # format: json + compression: zstd (each record compressed)
    zstd_frames.write_bytes(framed([zstd.compress(json.dumps(request_to_obj(encode_spans(c))).encode())]))
    whole = tmp_path / "whole.jsonl.zst"  # a JSON lines file compressed as a whole
    whole.write_bytes(zstd.compress(json_lines([d])))
    document = tmp_path / "export.json"  # one pretty-printed OTLP/JSON document
    pretty = make_spans(1, "e")
    document.write_text(json.dumps(request_to_obj(encode_spans(pretty)), indent=2))

    dataset = tmp_path / "ds"
    result = CliRunner().invoke(ingest_command, [str(tmp_path), "--dataset", str(dataset), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "ingested 30 spans from 4 file(s)" in result.output
    assert parquet_rows(dataset) == expected_rows(a + b + c + d + pretty)


def test_truncated_and_garbage_records_are_reported(tmp_path: Path) -> None:
    good = encode_spans(make_spans(2)).SerializeToString()
    source = tmp_path / "bad.binpb"
    source.write_bytes(framed([good, b"\xff\xff\xff\x0f nope", good[:10]]) + struct.pack(">I", len(good)) + good[:7])
    report = Ingestor(tmp_path / "ds").ingest(source)
    assert report.spans == 4  # the first record
    wheres = [w for w, _ in report.malformed]
    assert wheres == ["record 2", "record 3"]
    # The last record is cut short: a writer may still be appending it, so it is
    # not "malformed" but left for the next run.
    assert report.message.startswith("record 4: record cut short") and "next ingest" in report.message


def test_unfinished_last_line_is_resumed_not_lost(tmp_path: Path) -> None:
    first, second = make_spans(3, "a"), make_spans(4, "b")
    line_a, line_b = json_lines([first]), json_lines([second])
    source = tmp_path / "growing.jsonl"
    source.write_bytes(line_a + line_b[: len(line_b) // 2])  # the exporter is mid-way through line 2
    dataset = tmp_path / "ds"
    report = Ingestor(dataset).ingest(source)
    assert report.spans == 6 and report.malformed == [] and "line 2" in report.message  # 2 spans per make_spans(1)
    source.write_bytes(line_a + line_b)  # the line is finished ...
    more = make_spans(2, "c")
    with open(source, "ab") as handle:  # ... and another appended
        handle.write(json_lines([more]))
    again = Ingestor(dataset).ingest(source)
    assert again.start_offset == len(line_a) and again.spans == 12 and again.malformed == []
    assert parquet_rows(dataset) == expected_rows(first + second + more)
    assert Ingestor(dataset).ingest(source).status == "skipped"


def test_a_bad_first_line_does_not_hide_the_rest(tmp_path: Path) -> None:
    spans = make_spans(5)
    source = tmp_path / "traces.jsonl"
    source.write_bytes(b"garbage that is not json\n" + json_lines([spans[:2], spans[2:]]))
    report = Ingestor(tmp_path / "ds").ingest(source)
    assert report.spans == 10 and [w for w, _ in report.malformed] == ["line 1"]


def test_commands_are_registered_on_the_main_cli(tmp_path: Path) -> None:
    from otel_replay.cli import main

    ctx = click.Context(main)
    assert main.get_command(ctx, "serve") is not None and main.get_command(ctx, "ingest") is ingest_command
    result = CliRunner().invoke(main, ["serve", "--dataset", str(tmp_path / "ds"), "--grpc", "nonsense"])
    assert result.exit_code != 0 and "must look like HOST:PORT" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "ds").exists()
