"""``otel-replay ingest`` against hostile and changing input: bombs, truncation, growth, bad records, crashes."""

from __future__ import annotations

import fcntl
import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from click.testing import CliRunner

from otel_replay.cli.serve import ingest_command
from otel_replay.errors import ConfigError
from otel_replay.server.ingest import MANIFEST, Ingestor

ROOT = Path(__file__).resolve().parents[2]


def span_line(i: int, **overrides: Any) -> bytes:
    """One JSON line of OTLP/JSON holding one span with a span id made from ``i``."""
    span = {
        "traceId": f"{i + 1:032x}",
        "spanId": f"{i + 1:016x}",
        "name": f"op-{i}",
        "kind": 1,
        "startTimeUnixNano": str(1_700_000_000_000_000_000 + i),
        "endTimeUnixNano": str(1_700_000_000_000_000_500 + i),
        "attributes": [{"key": "i", "value": {"intValue": str(i)}}],
    }
    span.update(overrides)
    doc = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {"name": "t"}, "spans": [span]}]}]}
    return json.dumps(doc).encode() + b"\n"


def lines(start: int, stop: int) -> bytes:
    return b"".join(span_line(i) for i in range(start, stop))


def span_ids(dataset: Path) -> list[str]:
    files = sorted(p for p in (dataset / "spans").rglob("*.parquet") if not p.name.startswith("."))
    if not files:
        return []
    table = pa.concat_tables([pq.read_table(p, columns=["span_id"], partitioning=None) for p in files])
    return [str(v) for v in table.column("span_id").to_pylist()]


def manifest(dataset: Path) -> list[dict[str, Any]]:
    path = dataset / "_ingest" / MANIFEST
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def rle_bomb(byte: bytes, blocks: int) -> bytes:
    """A zstd frame of ``blocks`` RLE blocks of 128 KiB each: 4 bytes per block, 32768:1."""
    block = (131072 << 3 | 1 << 1).to_bytes(3, "little") + byte
    last = (131072 << 3 | 1 << 1 | 1).to_bytes(3, "little") + byte
    return b"\x28\xb5\x2f\xfd\x00\x38" + block * (blocks - 1) + last


# --- item 7: bombs and truncated compressed files ------------------------------------------


@pytest.mark.parametrize("byte", [b"\x00", b" "], ids=["zeros", "spaces"])
def test_a_zstd_bomb_is_refused_without_inflating_it(tmp_path: Path, byte: bytes) -> None:
    source = tmp_path / "bomb.zst"
    source.write_bytes(rle_bomb(byte, 8192 * 2))  # 64 KiB that would expand to 2 GiB
    assert source.stat().st_size < 70_000
    dataset = tmp_path / "ds"
    report = Ingestor(dataset).ingest(source)
    assert report.status == "failed" and report.spans == 0
    # zeros read as a length prefix of 0; spaces are one endless blank "line" that the ratio bound stops.
    expected = "length prefix 0" if byte == b"\x00" else "expands more than 1000 times"
    assert expected in report.error and "nothing from this file was kept" in report.error
    assert manifest(dataset) == [] and span_ids(dataset) == []


@pytest.mark.slow
def test_bomb_memory_stays_bounded(tmp_path: Path) -> None:
    """In a fresh process (its own peak RSS), a 1 GiB-expanding line costs far less than 1 GiB."""
    source = tmp_path / "bomb.zst"
    # A JSON line that opens a string and never ends: 1 GiB of "a" behind a valid start.
    start = zstandard.ZstdCompressor().compress(b'{"resourceSpans": [], "x": "')
    source.write_bytes(start + rle_bomb(b"a", 8192))
    script = textwrap.dedent(
        f"""
        import resource, sys
        from otel_replay.server.ingest import Ingestor
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        report = Ingestor({str(tmp_path / "ds")!r}).ingest({str(source)!r})
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(report.status, (peak - base) // 1024, report.error)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    status, grown_mib, error = out.stdout.split(" ", 2)
    assert status == "failed" and "decompression bomb" in error, out.stdout
    assert int(grown_mib) < 300, f"peak RSS grew by {grown_mib} MiB while refusing a 1 GiB line"


def test_an_over_long_line_is_skipped_and_named(tmp_path: Path) -> None:
    source = tmp_path / "long.jsonl"
    long_line = b'{"resourceSpans": [], "pad": "' + b"x" * 5000 + b'"}\n'
    source.write_bytes(span_line(0) + long_line + span_line(1))
    report = Ingestor(tmp_path / "ds", max_line=2000).ingest(source)
    assert report.spans == 2 and report.status == "ingested"
    assert report.malformed == [("line 2", f"longer than the 2000-byte line limit ({len(long_line)} bytes); skipped")]
    assert report.end_offset == source.stat().st_size  # the skipped line counts as read: it is not retried


def test_an_over_long_length_prefixed_record_stops_the_file_with_an_error(tmp_path: Path) -> None:
    from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

    good = TracesData()
    good.resource_spans.add().scope_spans.add().spans.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="a")
    payload = good.SerializeToString()
    source = tmp_path / "t.binpb"
    source.write_bytes(len(payload).to_bytes(4, "big") + payload + (3000).to_bytes(4, "big") + b"\x0a" * 3000)
    report = Ingestor(tmp_path / "ds", max_line=2000).ingest(source)
    assert report.spans == 1
    assert report.error.startswith("record 2: length prefix 3000 is over the 2000-byte record limit")
    assert report.end_offset == 4 + len(payload)  # recorded up to the bad record: the next run reports it again
    again = Ingestor(tmp_path / "ds", max_line=2000).ingest(source)
    assert again.start_offset == 4 + len(payload) and again.spans == 0 and again.error.startswith("record 1:")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["zstd", "gzip"])
def test_a_truncated_compressed_file_is_an_error_and_not_recorded(tmp_path: Path, kind: str) -> None:
    whole = lines(0, 200)
    packed = zstandard.ZstdCompressor().compress(whole) if kind == "zstd" else gzip.compress(whole)
    source = tmp_path / f"traces.jsonl.{kind}"
    source.write_bytes(packed[: len(packed) - 40])
    dataset = tmp_path / "ds"

    result = CliRunner().invoke(ingest_command, [str(source), "--dataset", str(dataset), "--quiet"])
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.output
    report = Ingestor(dataset).ingest(source)
    assert report.status == "failed" and f"{kind} stream is truncated" in report.error, report
    assert manifest(dataset) == [] and span_ids(dataset) == []  # no rows from half a file

    source.write_bytes(packed)  # the whole file arrives: all of it is ingested, once
    assert Ingestor(dataset).ingest(source).spans == 200
    assert Ingestor(dataset).ingest(source).status == "skipped"
    ids = span_ids(dataset)
    assert len(ids) == len(set(ids)) == 200


def test_every_gzip_member_and_zstd_frame_is_read(tmp_path: Path) -> None:
    members = tmp_path / "multi.jsonl.gz"
    members.write_bytes(gzip.compress(lines(0, 10)) + gzip.compress(lines(10, 25)))
    frames = tmp_path / "multi.jsonl.zst"
    zstd = zstandard.ZstdCompressor()
    frames.write_bytes(zstd.compress(lines(100, 110)) + zstd.compress(lines(110, 130)))
    dataset = tmp_path / "ds"
    assert Ingestor(dataset).ingest(members).spans == 25
    assert Ingestor(dataset).ingest(frames).spans == 30
    garbage = tmp_path / "trailing.jsonl.gz"
    garbage.write_bytes(gzip.compress(lines(200, 205)) + b"not gzip at all")
    report = Ingestor(dataset).ingest(garbage)
    assert report.status == "failed" and "bytes after frame 1 are not gzip data" in report.error
    assert len(span_ids(dataset)) == 55


# --- item 8: a file appended to while it is read -----------------------------------------------


def test_appends_during_the_run_are_left_for_the_next_run(tmp_path: Path) -> None:
    source = tmp_path / "growing.jsonl"
    source.write_bytes(lines(0, 300))
    written = 300

    def append_while_reading(n: int) -> None:
        nonlocal written
        if n and written < 600:  # each read the ingest makes, the exporter appends more
            with open(source, "ab") as handle:
                handle.write(lines(written, written + 100))
            written += 100

    dataset = tmp_path / "ds"
    first = Ingestor(dataset).ingest(source, append_while_reading)
    assert first.spans == 300 and first.end_offset == len(lines(0, 300))
    second = Ingestor(dataset).ingest(source)
    assert second.start_offset == first.end_offset and second.spans == written - 300
    ids = span_ids(dataset)
    assert len(ids) == len(set(ids)) == written


@pytest.mark.slow
def test_a_concurrent_writer_never_causes_duplicates_or_loss(tmp_path: Path) -> None:
    """Three runs while an exporter appends; each run starts while the exporter is in the middle of a line."""
    source = tmp_path / "growing.jsonl"
    source.write_bytes(lines(0, 400))
    stop = threading.Event()
    count = [400]
    allowed = [0]  # lines the exporter may still append: each read of a run lets it write 100 more meanwhile
    halves = [0, 0]  # lines the exporter has written half of, and of those the ones it may finish
    turn = threading.Condition()

    def exporter() -> None:  # appends whole lines, and every 7th in two pieces, so a run may see half a line
        with open(source, "ab", buffering=0) as handle:
            while True:
                with turn:
                    turn.wait_for(lambda: allowed[0] > 0 or stop.is_set())
                    if stop.is_set():
                        return
                    allowed[0] -= 1
                line = span_line(count[0])
                cut = 50 if count[0] % 7 == 0 else len(line)
                handle.write(line[:cut])
                if cut < len(line):
                    with turn:  # held here until a run that saw this half line has started reading
                        halves[0] += 1
                        turn.notify_all()
                        turn.wait_for(lambda: halves[1] >= halves[0] or stop.is_set())
                handle.write(line[cut:])
                with turn:
                    count[0] += 1

    def reading(_: int) -> None:
        with turn:
            allowed[0] += 100
            halves[1] = halves[0]
            turn.notify_all()

    dataset = tmp_path / "ds"
    thread = threading.Thread(target=exporter)
    thread.start()
    try:
        runs = []
        for _ in range(3):
            with turn:  # the exporter stops half-way through a line: the run's end is there
                allowed[0] += 100
                turn.notify_all()
                turn.wait_for(lambda: halves[0] > halves[1])
            runs.append(Ingestor(dataset).ingest(source, reading))
    finally:
        stop.set()
        with turn:
            turn.notify_all()
        thread.join()
    assert all("it is read on the next ingest" in run.message for run in runs), [run.message for run in runs]
    runs.append(Ingestor(dataset).ingest(source))
    assert sum(r.spans for r in runs) == count[0]
    ids = span_ids(dataset)
    assert len(ids) == len(set(ids)) == count[0]
    assert [r.start_offset for r in runs[1:]] == [r.end_offset for r in runs[:-1]]


# --- item 11: bad records are skipped and reported, the rest ingested --------------------------


HOSTILE = [
    ("good", span_line(0)),
    ("2**64-1", span_line(1, startTimeUnixNano=str(2**64 - 1))),
    ("negative", span_line(2, startTimeUnixNano="-5")),
    ("not a number", span_line(3, startTimeUnixNano="soon")),
    ("2**64", span_line(4, endTimeUnixNano=str(2**64))),
    ("deep", b"[" * 50_000 + b"]" * 50_000 + b"\n"),
    ("duplicate key", b'{"resourceSpans": [], "resourceSpans": []}\n'),
    ("NaN", b'{"resourceSpans": NaN}\n'),
    ("binary", bytes(range(256)).replace(b"\n", b"") + b"\n"),
    ("bad id", span_line(5, spanId="zz")),
    ("good", span_line(6)),
]


def test_each_bad_line_is_skipped_reported_and_the_rest_ingested(tmp_path: Path) -> None:
    source = tmp_path / "hostile.jsonl"
    source.write_bytes(b"".join(line for _, line in HOSTILE))
    report = Ingestor(tmp_path / "ds").ingest(source)
    assert report.spans == 2 and report.rejected == 1 and report.status == "ingested"
    reasons = dict(report.malformed)
    assert list(reasons) == [f"line {n}" for n in range(2, 11)]
    assert "start_time_unix_nano 18446744073709551615 is out of range" in reasons["line 2"]
    assert "startTimeUnixNano: Value out of range: -5" in reasons["line 3"]
    assert "startTimeUnixNano" in reasons["line 4"] and "soon" in reasons["line 4"]
    assert "endTimeUnixNano: Value out of range: 18446744073709551616" in reasons["line 5"]
    assert reasons["line 6"] == "invalid JSON: nested too deeply to parse"
    assert reasons["line 7"] == "invalid JSON: duplicate key 'resourceSpans' (a key may appear once per object)"
    assert "NaN is not JSON" in reasons["line 8"]
    assert "not UTF-8" in reasons["line 9"]
    assert "spanId is not a hex string" in reasons["line 10"]
    assert all("\n" not in reason for reason in reasons.values())
    assert len(span_ids(tmp_path / "ds")) == 2


def test_cli_reports_bad_lines_and_random_binary_without_a_traceback(tmp_path: Path) -> None:
    hostile = tmp_path / "hostile.jsonl"
    hostile.write_bytes(b"".join(line for _, line in HOSTILE))
    noise = tmp_path / "noise.bin"
    noise.write_bytes(os.urandom(1) + bytes(range(256)) * 40)
    dataset = tmp_path / "ds"
    result = CliRunner().invoke(ingest_command, [str(hostile), str(noise), "--dataset", str(dataset), "--quiet"])
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.output
    assert f"{hostile}:line 6: invalid JSON: nested too deeply to parse" in result.output
    assert f"{hostile}:line 2: 1 span(s) dropped" in result.output
    assert "Traceback" not in result.output


def test_random_binary_files_never_raise(tmp_path: Path) -> None:
    import random

    rng = random.Random(6)
    dataset = tmp_path / "ds"
    for n in range(60):
        body = rng.randbytes(rng.randint(1, 3000))
        if n % 3 == 0:
            body = len(body).to_bytes(4, "big") + body  # a plausible length prefix, garbage inside
        elif n % 3 == 1:
            body = zstandard.ZstdCompressor().compress(body)[: rng.randint(4, 60)]
        source = tmp_path / f"noise-{n}"
        source.write_bytes(body)
        report = Ingestor(dataset).ingest(source)  # must not raise
        assert report.spans == 0
        assert report.error or report.malformed or report.message, report


def test_cli_exit_code_and_one_line_errors(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_bytes(lines(0, 5))
    dataset = tmp_path / "ds"
    clean = CliRunner().invoke(ingest_command, [str(good), "--dataset", str(dataset), "--quiet"])
    assert clean.exit_code == 0, clean.output
    hostile = tmp_path / "hostile.jsonl"
    hostile.write_bytes(b"".join(line for _, line in HOSTILE))
    truncated = tmp_path / "cut.jsonl.zst"
    truncated.write_bytes(zstandard.ZstdCompressor().compress(lines(10, 50))[:-30])
    result = CliRunner().invoke(ingest_command, [str(hostile), str(truncated), "--dataset", str(dataset), "-q"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert f"{truncated}: error: zstd stream is truncated" in result.output
    assert "everything else was ingested" in result.output


def test_ingest_falls_back_to_otel_replay_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = tmp_path / "good.jsonl.gz"
    good.write_bytes(gzip.compress(lines(0, 3)))
    monkeypatch.setenv("OTEL_REPLAY_DATASET", str(tmp_path / "from-env"))
    result = CliRunner().invoke(ingest_command, [str(good), "-q"])
    assert result.exit_code == 0 and result.exception is None, result.output
    assert list((tmp_path / "from-env" / "spans").rglob("*.parquet"))
    flag = CliRunner().invoke(ingest_command, [str(good), "--dataset", str(tmp_path / "flag"), "-q"])
    assert flag.exit_code == 0 and list((tmp_path / "flag" / "spans").rglob("*.parquet")), flag.output


# --- the manifest: crashes, torn lines, concurrent processes -----------------------------------


_CHILD = """
import os, signal, sys
from pathlib import Path
from otel_replay.server.ingest import Ingestor
dataset, source, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
if mode == "crash":  # killed once the first chunk's file is written, the rest of the file still to read
    from otel_replay.storage import convert
    flush = convert.ChunkWriter.flush
    def flush_then_die(self):
        flush(self)
        if self.paths:
            os.kill(os.getpid(), signal.SIGKILL)
    convert.ChunkWriter.flush = flush_then_die
if mode == "turns":  # imported and about to ingest: the test lets all of them at the lock at once
    print("ready", flush=True)
report = Ingestor(dataset, chunk_rows=50).ingest(source)
print(report.status, report.spans, report.start_offset, report.end_offset)
"""


def _child(dataset: Path, source: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(dataset), str(source), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


@pytest.mark.slow
def test_an_ingest_killed_mid_file_is_redone_not_duplicated(tmp_path: Path) -> None:
    source = tmp_path / "traces.jsonl"
    source.write_bytes(lines(0, 300))  # six chunks of 50
    dataset = tmp_path / "ds"
    child = _child(dataset, source, "crash")
    _, err = child.communicate(timeout=120)
    assert child.returncode == -signal.SIGKILL, err
    assert span_ids(dataset) and manifest(dataset) == []  # files written, nothing recorded
    assert list((dataset / "_ingest" / "pending").iterdir())
    with open(source, "ab") as handle:  # the exporter appended meanwhile
        handle.write(lines(300, 400))
    ingestor = Ingestor(dataset)
    report = ingestor.ingest(source)
    assert report.spans == 400 and len(ingestor.recovered) == 1
    ids = span_ids(dataset)
    assert len(ids) == len(set(ids)) == 400
    assert not list((dataset / "_ingest" / "pending").iterdir())


def test_a_marker_left_after_the_manifest_entry_removes_nothing(tmp_path: Path) -> None:
    source = tmp_path / "traces.jsonl"
    source.write_bytes(lines(0, 40))
    dataset = tmp_path / "ds"
    Ingestor(dataset).ingest(source)
    (token,) = [entry["token"] for entry in manifest(dataset)]
    # A crash between the manifest's fsync and the marker's removal leaves the marker behind.
    (dataset / "_ingest" / "pending" / f"{token}.json").write_text("{}")
    ingestor = Ingestor(dataset)
    assert ingestor.ingest(source).status == "skipped" and ingestor.recovered == []
    assert len(span_ids(dataset)) == 40


def test_a_torn_manifest_line_does_not_swallow_the_next_entry(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(lines(0, 5))
    b.write_bytes(lines(5, 12))
    dataset = tmp_path / "ds"
    Ingestor(dataset).ingest(a)
    with open(dataset / "_ingest" / MANIFEST, "ab") as handle:
        handle.write(b'{"sha256": "ab')  # a crash in the middle of writing an entry
    assert Ingestor(dataset).ingest(b).spans == 7
    assert Ingestor(dataset).ingest(b).status == "skipped"
    assert Ingestor(dataset).ingest(a).status == "skipped"
    assert len(span_ids(dataset)) == 12


@pytest.mark.slow
def test_concurrent_ingest_processes_on_one_dataset_take_turns(tmp_path: Path) -> None:
    source = tmp_path / "traces.jsonl"
    source.write_bytes(lines(0, 200))  # four chunks of 50: each process has files to write, so turns matter
    dataset = tmp_path / "ds"
    (dataset / "_ingest").mkdir(parents=True)
    # The test holds the ingest lock until every process has started, so all three reach it together however
    # slowly a loaded machine starts them; none can have finished before the last one begins.
    lock = os.open(dataset / "_ingest" / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        children = [_child(dataset, source, "turns") for _ in range(3)]
        for child in children:
            assert child.stdout is not None and child.stdout.readline() == "ready\n", child.communicate()
    finally:
        os.close(lock)
    outputs = [child.communicate(timeout=600) for child in children]
    assert all(child.returncode == 0 for child in children), outputs
    statuses = sorted(out.split()[0] for out, _ in outputs)
    assert statuses == ["ingested", "skipped", "skipped"], outputs
    ids = span_ids(dataset)
    assert len(ids) == len(set(ids)) == 200
    assert len(manifest(dataset)) == 1


def test_two_bad_first_lines_do_not_turn_json_lines_into_one_document(tmp_path: Path) -> None:
    source = tmp_path / "traces.jsonl"
    source.write_bytes(b"not json\r at all\n{broken\n" + lines(0, 5))
    report = Ingestor(tmp_path / "ds").ingest(source)
    assert report.spans == 5 and [w for w, _ in report.malformed] == ["line 1", "line 2"]
    pretty = tmp_path / "export.json"
    pretty.write_text(json.dumps({"resourceSpans": [], "x": 1}, indent=2).replace('"x": 1', '"x": 1, "x": 2'))
    report = Ingestor(tmp_path / "ds").ingest(pretty)
    assert report.malformed == [("document", "invalid JSON: duplicate key 'x' (a key may appear once per object)")]


@pytest.mark.parametrize("kind", ["zstd", "gzip"])
def test_a_compressed_file_with_frames_appended_resumes_after_what_was_read(tmp_path: Path, kind: str) -> None:
    def pack(data: bytes) -> bytes:
        return zstandard.ZstdCompressor().compress(data) if kind == "zstd" else gzip.compress(data)

    source = tmp_path / f"spool.jsonl.{kind}"
    source.write_bytes(pack(lines(0, 30)))
    dataset = tmp_path / "ds"
    assert Ingestor(dataset).ingest(source).spans == 30
    with open(source, "ab") as handle:  # a writer that appends one frame/member per batch
        handle.write(pack(lines(30, 45)))
    report = Ingestor(dataset).ingest(source)
    assert report.spans == 15 and report.start_offset > 0
    ids = span_ids(dataset)
    assert len(ids) == len(set(ids)) == 45


def test_files_inside_the_dataset_are_not_ingested(tmp_path: Path) -> None:
    source = tmp_path / "traces.jsonl"
    source.write_bytes(lines(0, 3))
    dataset = tmp_path / "ds"
    Ingestor(dataset).ingest(source)
    report = Ingestor(dataset).ingest(dataset / "_ingest" / MANIFEST)
    assert report.status == "skipped" and report.message == "inside the dataset itself"
    assert len(span_ids(dataset)) == 3


def test_a_record_whose_header_alone_is_written_is_waited_for(tmp_path: Path) -> None:
    from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

    data = TracesData()
    data.resource_spans.add().scope_spans.add().spans.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="a")
    payload = data.SerializeToString()
    record = len(payload).to_bytes(4, "big") + payload
    source = tmp_path / "t.binpb"
    source.write_bytes(record + record[:4])  # the exporter has written the next length prefix only
    dataset = tmp_path / "ds"
    report = Ingestor(dataset).ingest(source)
    assert report.spans == 1 and not report.error and "record 2: record cut short" in report.message
    source.write_bytes(record + record.replace(b"\x02" * 8, b"\x03" * 8))
    again = Ingestor(dataset).ingest(source)
    assert again.start_offset == len(record) and again.spans == 1 and again.clean
    assert sorted(span_ids(dataset)) == ["0202020202020202", "0303030303030303"]


def test_an_oversized_json_lines_file_with_two_bad_first_lines_is_still_read_as_lines(tmp_path: Path) -> None:
    source = tmp_path / "traces.jsonl"
    source.write_bytes(b"{\n[ broken\n" + lines(0, 40))
    report = Ingestor(tmp_path / "ds", max_line=3000).ingest(source)  # the file is past the document limit
    assert report.spans == 40 and [w for w, _ in report.malformed] == ["line 1", "line 2"]


@pytest.mark.parametrize(
    ("argument", "value", "message"),
    [
        ("max_line", 0, "max_line=0 must be a finite number above 0"),
        ("max_line", -5, "above 0"),
        ("max_line", 2**70, "max_line=.* must be at most"),
        ("max_line", "32", "is not a number"),
        ("max_ratio", float("inf"), "max_ratio=inf must be a finite number"),
        ("chunk_rows", 0, "chunk_rows=0"),
        ("chunk_rows", 10.5, "must be a whole number"),
    ],
)
def test_ingestor_arguments_out_of_range_are_refused_by_name(tmp_path, argument, value, message):
    """From Python as from the environment: 0 meant "the default" and 2**70 overflowed readline() later."""
    with pytest.raises(ConfigError, match=message):
        Ingestor(tmp_path / "ds", **{argument: value})


def test_a_fifo_is_refused_by_name_without_waiting_for_a_writer(tmp_path: Path) -> None:
    # A FIFO blocked the run in open() until some process wrote to it (forever, from a shell); then its size, 0,
    # made it "skipped, empty file". The stand-in writer below unblocks a run that waits, so the test ends either way.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    done = threading.Event()

    def stand_in_writer() -> None:
        if not done.wait(5):
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # nobody is reading: the run did not wait
                pass

    writer = threading.Thread(target=stand_in_writer)
    writer.start()
    try:
        with pytest.raises(OSError, match="not a regular file"):
            Ingestor(tmp_path / "ds").ingest(fifo)
    finally:
        done.set()
        writer.join()
    result = CliRunner().invoke(ingest_command, [str(fifo), "--dataset", str(tmp_path / "ds"), "-q"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"{fifo}: cannot ingest: not a regular file (a FIFO)" in result.output
