"""A partition's key log: one whole line per file the writer renames into place; anything torn or forged is ignored."""

from __future__ import annotations

import os
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.parquet as pq

from otel_replay.exporters.id_keys import decode_keys, footer_keys
from otel_replay.exporters.key_log import KEY_LOG_NAME, parse_lines, rewrite_without
from otel_replay.exporters.writer import write_partitions
from otel_replay.location import resolve
from otel_replay.query.files import FileTriage

from ..storage.conftest import load_generator


def _footer(path: Path) -> bytes:
    data = path.read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    return data[-8 - length : -8]


def _day(path: Path, files: int = 12) -> Path:
    load_generator().generate(path, spans=files * 4, ids=files, days=1, rows_per_file=4, duplicates=0.0, seed=3)
    return path


def _logs(dataset: Path) -> list[Path]:
    return sorted((dataset / "spans").glob(f"date=*/{KEY_LOG_NAME}"))


def test_the_writer_logs_each_file_it_renames_with_its_stamp_and_its_footers_keys(tmp_path: Path) -> None:
    dataset = _day(tmp_path / "ds")
    for log in _logs(dataset):
        lines, used = parse_lines(log.read_bytes())
        assert used == log.stat().st_size  # every line whole
        files = sorted(p for p in log.parent.glob("*.parquet"))
        assert sorted(lines) == [p.name for p in files]
        for path in files:
            info = path.stat()
            assert lines[path.name].stamp == (info.st_size, info.st_mtime_ns)
            assert decode_keys(lines[path.name].keys) == footer_keys(_footer(path))
        assert len({line.digest for line in lines.values()}) == 1  # one writer schema: one footer digest


def _line_of(data: bytes, name: str) -> bytes:
    return next(line for line in data.split(b"\n") if b"\t" + name.encode() + b"\t" in line)


def test_torn_interleaved_and_damaged_lines_are_skipped_and_the_rest_kept(tmp_path: Path) -> None:
    dataset = _day(tmp_path / "ds", files=6)
    log = _logs(dataset)[0]
    data = log.read_bytes()
    names = sorted(parse_lines(data)[0])
    first, second = _line_of(data, names[0]), _line_of(data, names[1])
    body = first[: first.rfind(b"\t")]
    negative = b"k1\tx.parquet\t-1\t1\td\tAAAA"
    hostile = [
        second[: len(second) // 2] + first + b"\n",  # two appends interleaved: one line of 12 fields
        body.replace(b"\t", b"\t9", 1) + b"\t" + f"{zlib.crc32(body):08x}".encode() + b"\n",  # a changed name, old CRC
        negative + b"\t" + f"{zlib.crc32(negative):08x}".encode() + b"\n",  # a size that is no number
        b"k1\t" + os.urandom(64).replace(b"\n", b"") + b"\n",  # noise
        b"k2" + first[2:] + b"\n",  # a format this reader does not know
        b"\x00" * 300 + b"\n",  # what a crash can leave of an append that never reached the disk
        b"k1\tnot-a-crc\t" + b"z" * 100_000 + b"\n",  # a huge line
    ]
    torn = first[: len(first) - 7]  # a crash in the middle of the last append: no newline
    lines, used = parse_lines(data + b"".join(hostile) + torn)
    assert sorted(lines) == names  # only the writer's own whole lines, each once
    assert used == len(data) + sum(len(h) for h in hostile)  # the torn tail is left for when it is whole
    assert parse_lines(b"")[0] == {} and parse_lines(b"\n\n\t\t\n")[0] == {}


def test_writers_appending_to_one_partition_at_once_each_append_whole_lines(tmp_path: Path) -> None:
    dataset = _day(tmp_path / "ds", files=2)
    source = sorted((dataset / "spans").rglob("*.parquet"))[0]
    table = pq.read_table(source)
    table = table.append_column("date", table.column("start_time").cast("date32"))
    start = threading.Barrier(3)

    def write_some(worker: int) -> None:  # each write its own descriptor: what separate processes do
        start.wait()
        for n in range(8):
            write_partitions(table, dataset / "spans", lambda _date, n=n: f"part-{worker}-{n:02d}-aaaaaaaaaaaa.parquet")

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(write_some, range(3)))
    log = _logs(dataset)[0]
    lines, used = parse_lines(log.read_bytes())
    assert used == log.stat().st_size
    written = {p.name for p in log.parent.glob("part-*-*-aaaaaaaaaaaa.parquet")}
    assert len(written) == 24 and written <= set(lines)


def test_pruning_keeps_the_lines_of_the_files_not_replaced_and_an_emptied_or_missing_log_is_gone(tmp_path: Path) -> None:
    dataset = _day(tmp_path / "ds", files=6)
    log = _logs(dataset)[0]
    names = sorted(parse_lines(log.read_bytes())[0])
    rewrite_without(log.parent, names[:4])
    assert sorted(parse_lines(log.read_bytes())[0]) == names[4:]
    assert not [p for p in log.parent.iterdir() if p.name.endswith(".tmp")]
    rewrite_without(log.parent, names)  # no line left: no log
    assert not log.exists()
    rewrite_without(log.parent, names)  # nothing to prune
    assert not log.exists()


def test_a_fifo_or_a_folder_in_the_logs_place_never_holds_a_writer_a_reader_or_a_compaction(tmp_path: Path) -> None:
    dataset = _day(tmp_path / "ds", files=3)
    log = _logs(dataset)[0]
    partition = log.parent
    files = sorted(str(p) for p in (dataset / "spans").rglob("*.parquet"))
    table = pq.read_table(files[0])
    table = table.append_column("date", table.column("start_time").cast("date32"))
    for make in (os.mkfifo, os.mkdir):
        if log.is_dir():
            log.rmdir()
        else:
            log.unlink()
        make(log)
        name = f"part-9-{make.__name__}-bbbbbbbbbbbb.parquet"
        write_partitions(table, dataset / "spans", lambda _date, name=name: name)  # written, no line: no wait
        assert (partition / name).exists()
        triage = FileTriage(resolve(dataset))
        good, skipped, _ = triage.live(set(), skip_corrupt=False)
        assert not skipped and str(partition / name) in good  # every footer read instead
        rewrite_without(partition, [name])  # left alone
        assert log.is_fifo() if make is os.mkfifo else log.is_dir()
