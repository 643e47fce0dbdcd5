"""A span file's own CRC-32 in its footer: written by every local writer, matched only by the bytes it was made of."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from otel_replay.exporters.checksum import CHECKSUM_KEY, UNSTAMPED, checksum_matches, parquet_bytes, stamp
from otel_replay.exporters.id_keys import KEY_KINDS, footer_keys
from otel_replay.exporters.writer import write_atomic, write_partitions


def _table() -> pa.Table:
    ids = {kind: ["x1", "x2", None] for kind in KEY_KINDS[:-1]}  # the id columns whose keys the footer carries
    table = pa.table({**ids, "span_id": ["a", "b", "c"], "n": [1, 2, 3]})
    return table.replace_schema_metadata({b"otel_replay.schema_version": b"2"})


def _footer(path: Path) -> bytes:
    data = path.read_bytes()
    return data[-8 - int.from_bytes(data[-8:-4], "little") : -8]


def test_a_file_written_by_the_writer_carries_its_checksum_and_reads_as_before(tmp_path) -> None:
    table = _table().append_column("date", pa.array(["2026-01-01"] * 3))
    (path,) = write_partitions(table, tmp_path / "spans", lambda date: "part-1.parquet")
    assert isinstance(path, Path) and checksum_matches(path)
    read = pq.read_table(path, partitioning=None)
    assert read.equals(_table()) and read.schema.metadata == _table().schema.metadata  # the pair: not in the schema
    assert len(pq.read_metadata(path).metadata[CHECKSUM_KEY]) == 8
    assert duckdb.sql("SELECT n FROM read_parquet($f)", params={"f": str(path)}).fetchall() == [(1,), (2,), (3,)]
    assert footer_keys(_footer(path))  # the id keys are found after it as before


def test_any_flipped_bit_a_cut_or_an_appended_byte_breaks_the_match(tmp_path) -> None:
    path = tmp_path / "f.parquet"
    write_atomic(_table(), path, footer={b"otel_replay.id_keys": b"QUJD"})
    data = path.read_bytes()
    fd = os.open(path, os.O_RDWR)
    try:
        for at in range(len(data)):  # every byte, footer and the digits themselves included
            bit = 1 << (at % 8)
            os.pwrite(fd, bytes([data[at] ^ bit]), at)
            assert not checksum_matches(path), at
            os.pwrite(fd, data[at : at + 1], at)
    finally:
        os.close(fd)
    assert checksum_matches(path)
    path.write_bytes(data[:-1])
    assert not checksum_matches(path)
    path.write_bytes(b"\x00" + data)
    assert not checksum_matches(path)


def test_files_of_other_writers_have_no_checksum_to_match(tmp_path) -> None:
    plain = tmp_path / "plain.parquet"
    pq.write_table(_table(), plain)
    assert not checksum_matches(plain)
    assert not checksum_matches(tmp_path / "absent.parquet")
    (tmp_path / "tiny.parquet").write_bytes(b"PAR1")
    assert not checksum_matches(tmp_path / "tiny.parquet")
    rewritten = tmp_path / "rewritten.parquet"  # our pair copied into another writer's file: stale
    rewritten.write_bytes(parquet_bytes(_table(), "zstd"))
    pair = {CHECKSUM_KEY: pq.read_metadata(rewritten).metadata[CHECKSUM_KEY]}
    pq.write_table(_table().replace_schema_metadata({**_table().schema.metadata, **pair}), rewritten)
    assert not checksum_matches(rewritten)


def test_a_stale_pair_in_the_table_is_not_written_beside_the_files_own(tmp_path) -> None:
    """A table carrying the pair in its schema metadata (another file's): the file holds one pair, its own (pyarrow
    keeps one value a key; a writer that added its pair beside the schema's would leave two)."""
    path = tmp_path / "f.parquet"
    stale = {**_table().schema.metadata, CHECKSUM_KEY: b"0123abcd"}
    write_atomic(_table().replace_schema_metadata(stale), path)
    assert checksum_matches(path) and path.read_bytes().count(CHECKSUM_KEY) == 1
    assert pq.read_table(path).equals(_table())


def test_a_streamed_file_is_stamped_in_place_and_one_without_the_pair_is_left_as_it_is(tmp_path) -> None:
    """A file a streaming writer wrote with the placeholder pair (compaction's) gets its CRC-32 put in, in place; the
    same bytes as if built in memory but for nothing. A file without the pair is not touched."""
    path = tmp_path / "streamed.parquet"
    with open(path, "w+b") as handle:
        with pq.ParquetWriter(handle, _table().schema, compression="zstd") as writer:
            writer.write_table(_table())
            writer.add_key_value_metadata(UNSTAMPED)
        assert not checksum_matches(path)  # placeholder digits
        assert stamp(handle)
    assert checksum_matches(path) and pq.read_table(path).equals(_table())
    assert path.read_bytes().count(CHECKSUM_KEY) == 1
    plain = tmp_path / "plain.parquet"
    pq.write_table(_table(), plain)
    before = plain.read_bytes()
    with open(plain, "r+b") as handle:
        assert not stamp(handle)
    assert plain.read_bytes() == before
