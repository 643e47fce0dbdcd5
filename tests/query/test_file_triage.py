"""The check at open reads each small file once: damaged files among many are named, footers past one read are found."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from otel_replay.errors import CorruptFileError
from otel_replay.exporters.id_keys import footer_keys, id_key
from otel_replay.exporters.key_log import parse_lines
from otel_replay.location import resolve
from otel_replay.query.files import FileTriage, footer_value
from otel_replay.query.keys import probe_array

from ..storage.conftest import load_generator


@pytest.fixture
def small_day(tmp_path: Path) -> Path:
    """A dataset of 40 files of 5 spans, one flush per file (what many short-lived writers leave)."""
    path = tmp_path / "ds"
    load_generator().generate(path, spans=200, ids=40, days=1, rows_per_file=5, duplicates=0.0, seed=5)
    return path


def _files(dataset: Path) -> list[Path]:
    return sorted((dataset / "spans").rglob("*.parquet"))


def test_damaged_files_among_many_are_each_named_and_the_rest_keep_their_keys(small_day: Path) -> None:
    files = _files(small_day)
    truncated, garbage, lying, short = files[3], files[10], files[20], files[30]
    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])  # a writer killed mid-file (no tail magic)
    garbage.write_bytes(b"PAR1" + os.urandom(3000) + b"PAR1")  # magic at both ends, a footer length that is noise
    body = bytearray(lying.read_bytes())
    body[-8:-4] = (len(body) + 1).to_bytes(4, "little")  # a footer longer than the file
    lying.write_bytes(bytes(body))
    short.write_bytes(b"PAR1PAR1")
    triage = FileTriage(resolve(small_day))
    good, skipped, vanished = triage.live(set(), skip_corrupt=True)
    named = {Path(problem.path).name: str(problem) for problem in skipped}
    assert set(named) == {p.name for p in (truncated, garbage, lying, short)}
    assert "no Parquet magic" in named[truncated.name]
    assert "does not fit" in named[lying.name]
    assert "too short" in named[short.name]
    assert not vanished and len(good) == len(files) - 4
    # Every readable file keeps the keys its footer carries, as a parse of the footer gives them.
    for path in good:
        footer = pq.ParquetFile(path).metadata.metadata or {}
        assert triage.keys_of(path) == footer_keys_of(Path(path))
        assert b"otel_replay.id_keys" in footer
    with pytest.raises(CorruptFileError, match=truncated.name):
        FileTriage(resolve(small_day)).live(set(), skip_corrupt=False)


def footer_keys_of(path: Path) -> frozenset[int] | None:
    """The keys of ``path``'s footer, read with seeks the plain way (the reference for the one-read path)."""
    data = path.read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    return footer_keys(data[-8 - length : -8])


def test_a_footer_longer_than_one_read_is_read_whole(tmp_path: Path, small_day: Path) -> None:
    source = _files(small_day)[0]
    table = pq.read_table(source)
    metadata = dict(table.schema.metadata or {})
    metadata[b"padding"] = b"x" * 200_000  # a footer of ~200 KB, beyond the one read of a file's end
    big = source.parent / "part-padded.parquet"
    pq.write_table(table.replace_schema_metadata(metadata), big)
    triage = FileTriage(resolve(small_day))
    assert triage.check(str(big)) is None
    data = big.read_bytes()
    footer = data[-8 - int.from_bytes(data[-8:-4], "little") : -8]
    assert len(footer) > 64 * 1024
    assert footer_value(footer, b"padding") == b"x" * 200_000


def test_the_same_footer_tail_gives_the_same_keys_and_a_forged_tail_gives_none(small_day: Path) -> None:
    files = _files(small_day)
    keys = [footer_keys_of(p) for p in files]
    assert all(k for k in keys)  # one writer: every file's tail is the known one, and each its own keys
    assert len(set(keys)) == len(files)
    trace = pq.read_table(files[0], columns=["trace_id"]).column(0)[0].as_py()
    first = keys[0]
    assert first is not None and id_key("trace_id", trace) in first
    data = files[1].read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    footer = data[-8 - length : -8]
    forged = footer[:-2] + b"\x01" + footer[-1:]  # the last column order's bytes changed: not this writer's tail
    assert footer_keys(forged) is None
    assert footer_keys(footer) == keys[1]


def _damage_keeping_stamp(path: Path) -> None:
    """Break ``path``'s closing magic, keeping its size and modification time (what its key log line records)."""
    info = path.stat()
    data = path.read_bytes()
    path.write_bytes(data[:-4] + b"PAR2")
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


def test_keys_come_from_the_key_log_for_files_whose_stamp_it_records_after_one_footer_of_their_writer(
    small_day: Path,
) -> None:
    files = _files(small_day)
    keys = {str(p): footer_keys_of(p) for p in files}
    first, vouched, touched = files[0], files[7], files[8]
    for path in (first, vouched, touched):
        _damage_keeping_stamp(path)
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 1))  # changed since logged
    triage = FileTriage(resolve(small_day))
    good, skipped, _ = triage.live(set(), skip_corrupt=True)
    # The first file of a writer schema is always checked through its footer; a later one whose size and time are
    # those its line records is taken from the line (its damage is named by the query that reads it); one
    # changed since is checked through its footer again.
    assert {Path(problem.path).name for problem in skipped} == {first.name, touched.name}
    assert str(vouched) in good
    for path in good:
        assert triage.keys_of(path) == keys[path]
    (small_day / "spans").joinpath(first.parent.name, "_id_keys.log").unlink()
    _, skipped, _ = FileTriage(resolve(small_day)).live(set(), skip_corrupt=True)
    assert {Path(problem.path).name for problem in skipped} == {first.name, vouched.name, touched.name}


def test_a_key_log_of_noise_or_of_lines_that_lie_about_other_files_changes_no_verdict_and_no_key(
    small_day: Path,
) -> None:
    every = _files(small_day)
    log = every[0].parent / "_id_keys.log"
    lines = log.read_bytes().split(b"\n")
    files = [p for p in every if p.parent == log.parent]
    # Each line moved onto the next file's name: a stamp that is not that file's, so never taken.
    names = [p.name.encode() for p in files]
    stamps = [(p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    by_name = {line.split(b"\t")[1]: line for line in lines[:-1]}
    shifted = [
        by_name[names[i]].replace(names[i], names[(i + 1) % len(names)])
        for i in range(len(names))
        if stamps[i] != stamps[(i + 1) % len(names)]  # (two files of one size written in one clock tick: left out)
    ]
    assert len(shifted) > len(names) // 2
    for content in (os.urandom(5000), b"\n".join(shifted) + b"\n", b"k1\t" * 10_000):
        log.write_bytes(content)
        triage = FileTriage(resolve(small_day))
        good, skipped, _ = triage.live(set(), skip_corrupt=False)
        assert not skipped and good == [str(p) for p in every]
        for path in good:
            assert triage.keys_of(path) == footer_keys_of(Path(path))


def test_files_vouched_by_the_key_log_are_searched_through_one_table_that_finds_exactly_their_holders(
    small_day: Path,
) -> None:
    files = [str(p) for p in _files(small_day)]
    triage = FileTriage(resolve(small_day))
    good, _, _ = triage.live(set(), skip_corrupt=False)
    assert good == files
    tabled = [path for path in files if path in triage.key_tables]
    assert len(tabled) >= len(files) - 2  # all but the first file of each partition's writer schema
    keys = {path: footer_keys_of(Path(path)) for path in files}
    trace = pq.read_table(files[5], columns=["trace_id"]).column(0)[0].as_py()
    held, rest = triage.narrow(files, probe_array([("trace_id", trace)]))
    expected = sorted(path for path in tabled if id_key("trace_id", trace) in (keys[path] or ()))
    assert sorted(held) == expected and files[5] in expected
    assert sorted(rest) == sorted(set(files) - set(tabled))
    assert triage.narrow(files, probe_array([("trace_id", "no-such-trace")]))[0] == []
    # A file rewritten since: checked again through its footer, answered from its new keys, never the table's.
    victim = Path(files[5])
    table = pq.read_table(victim)
    pq.write_table(table.slice(1), victim)  # another size, another time, other keys
    assert triage.check(str(victim)) is None
    assert str(victim) not in triage.key_tables
    assert triage.keys_of(str(victim)) == footer_keys_of(victim)


def test_a_key_log_line_with_a_whole_crc_but_keys_or_numbers_no_writer_makes_is_never_taken(small_day: Path) -> None:
    every = _files(small_day)
    log = every[0].parent / "_id_keys.log"
    files = [p for p in every if p.parent == log.parent]
    lines = {line.split(b"\t")[1]: line for line in log.read_bytes().split(b"\n")[:-1]}

    def resealed(line: bytes, field: int, value: bytes) -> bytes:
        fields = line.split(b"\t")[:-1]
        fields[field] = value
        body = b"\t".join(fields)
        return body + b"\t" + f"{zlib.crc32(body):08x}".encode()

    bad_base64, bad_length, huge = files[2], files[3], files[4]
    forged = dict(lines)
    forged[bad_base64.name.encode()] = resealed(lines[bad_base64.name.encode()], 5, b"!!not base64!!")
    forged[bad_length.name.encode()] = resealed(lines[bad_length.name.encode()], 5, b"AAAA")  # 3 bytes: no key
    forged[huge.name.encode()] = resealed(lines[huge.name.encode()], 2, b"9" * 5000)  # no size a file has
    log.write_bytes(b"\n".join(forged.values()) + b"\n")
    assert huge.name not in parse_lines(log.read_bytes())[0]
    triage = FileTriage(resolve(small_day))
    good, skipped, _ = triage.live(set(), skip_corrupt=False)
    assert not skipped and good == [str(p) for p in every]
    for path in (bad_base64, bad_length, huge):
        assert str(path) not in triage.key_tables  # read through its footer instead
        assert triage.keys_of(str(path)) == footer_keys_of(path)
