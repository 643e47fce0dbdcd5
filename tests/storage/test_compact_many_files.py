"""Compaction of many small files: each footer parsed once, files read a few at a time, whatever their number."""

from __future__ import annotations

import datetime as dt
import decimal
import importlib
import math
import os
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from otel_replay.errors import CorruptFileError
from otel_replay.exporters.checksum import CHECKSUM_KEY, checksum_matches, parquet_bytes
from otel_replay.exporters.schema import SCHEMA_METADATA_KEY
from otel_replay.storage import compact, live_files
from otel_replay.storage.compact_duck import duck_read
from otel_replay.storage.manifest import MANIFEST_NAME, is_compacted_name, partition_dirs

from .conftest import ReadWatch, count_rows

compact_module = importlib.import_module("otel_replay.storage.compact_steps")


def _written(table: pa.Table, path: str | Path, **options: Any) -> None:
    """``table`` written to ``path`` by pyarrow with ``options``, its footer holding the checksum the exporter's files
    carry: a chunk of such files is DuckDB's to read (a file without one is read by pyarrow)."""
    Path(path).write_bytes(parquet_bytes(table, options.pop("compression", "snappy"), **options))


def _many(make_dataset: Any) -> tuple[Path, dict[str, Any]]:
    """150 files of 3 spans in two partitions (75 in each, compacted as one batch each unless told otherwise),
    generated once per test process for every test here."""
    return _many_as(make_dataset, "ds")


def _many_as(make_dataset: Any, name: str) -> tuple[Path, dict[str, Any]]:
    """:func:`_many`'s dataset at ``name`` (a test comparing two copies)."""
    return make_dataset(name, spans=450, ids=150, rows_per_file=3, duplicates=0.02)


def _small_bounds(monkeypatch: pytest.MonkeyPatch) -> int:
    """Compaction's read bounds made small, so 150 files are several times them; the most files compaction may
    then hold as tables at once (``GATHER_FILES + READ_AHEAD + 2``: a gathered piece, the files read ahead, the
    one in hand)."""
    monkeypatch.setattr(compact_module, "GATHER_FILES", 8)
    monkeypatch.setattr(compact_module, "READ_AHEAD", 4)
    return compact_module.GATHER_FILES + compact_module.READ_AHEAD + 2


class ChunkWatch:
    """Turns compaction's DuckDB chunk reads on (``DUCK_CHUNKS``, as by default) and records the files it hands to
    DuckDB, a chunk at a time (``duck_read``), and whether DuckDB's answer was taken (``taken``); ``refuse``: it
    answers None, as for a chunk it cannot read exactly, so every file is read on its own."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, refuse: bool = False) -> None:
        monkeypatch.setattr(compact_module, "DUCK_CHUNKS", True)
        self.chunks: list[list[str]] = []
        self.taken: list[bool] = []
        real = compact_module.duck_read

        def scanning(paths: Any, schema: Any, rows: int) -> Any:
            self.chunks.append([str(p) for p in paths])
            answer = None if refuse else real(paths, schema, rows)
            self.taken.append(answer is not None)
            return answer

        monkeypatch.setattr(compact_module, "duck_read", scanning)

    @property
    def scanned(self) -> list[str]:
        return [p for chunk in self.chunks for p in chunk]


@pytest.mark.slow
@pytest.mark.parametrize("duck", ["reads chunks", "refuses"])
def test_many_small_files_are_read_in_bounded_chunks_or_one_by_one_never_all_at_once(
    make_dataset, monkeypatch, duck
) -> None:
    path, figures = _many(make_dataset)
    inputs = live_files(path)
    held = _small_bounds(monkeypatch)
    monkeypatch.setattr(compact_module, "DUCK_FILES", 8)
    assert len(inputs) > 3 * held  # so holding one table per file would show
    watch = ReadWatch(monkeypatch)
    chunks = ChunkWatch(monkeypatch, refuse=duck == "refuses")
    report = compact(path, grace_seconds=0, threads=2)
    assert chunks.chunks and max(len(chunk) for chunk in chunks.chunks) <= 8 - 1  # a chunk's first file: pyarrow
    if duck == "refuses":  # every file then read on its own, exactly once
        assert sorted(watch.read) == sorted(inputs)
    else:  # every file read once: alone (a chunk's first) or in one DuckDB chunk
        assert sorted(watch.read + chunks.scanned) == sorted(inputs)
        assert len(watch.read) < len(inputs) // 4
    # a batch of ~75 files never holds them all as tables: a gathered piece, the files read ahead, the one in hand
    assert watch.peak <= held
    assert report.duplicates_removed == figures["duplicates_written"]
    after = live_files(path)
    assert all(is_compacted_name(Path(f).name) for f in after)
    assert count_rows(after) == (figures["unique_spans"],) * 2


@pytest.mark.slow
def test_each_footer_is_parsed_once_and_most_by_their_bytes_before_the_rows_are_read(make_dataset, monkeypatch) -> None:
    path, _ = _many(make_dataset)
    inputs = live_files(path)
    opened: list[str] = []
    real = compact_module.ParquetReader

    class Counting(real):  # type: ignore[misc, valid-type]
        def open(self, source: Any, *args: Any, **kwargs: Any) -> Any:
            opened.append(str(source))
            return super().open(source, *args, **kwargs)

    def no_metadata(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("a footer read again to count rows")

    monkeypatch.setattr(compact_module, "ParquetReader", Counting)
    monkeypatch.setattr(compact_module.pq, "read_metadata", no_metadata)
    monkeypatch.setattr(compact_module.pq, "read_schema", no_metadata)
    chunks = ChunkWatch(monkeypatch)
    compact(path, grace_seconds=0, max_batch_rows=50)  # many batches: their rows come from the first pass
    # Once for the rows (by pyarrow, or by DuckDB in a chunk); the schema check parses with pyarrow only the first
    # file of each partition (the rest repeat its schema's bytes, compared raw: storage/compact_footer.py).
    assert chunks.scanned and not set(chunks.scanned) & set(opened)
    assert sorted(set(opened) | set(chunks.scanned)) == sorted(inputs)
    twice = [path for path in set(opened) if opened.count(path) == 2]
    assert len(opened) == len(set(opened)) + len(twice) and len(twice) == len(partition_dirs(path))


def _hostile(like: pa.Table) -> pa.Table:
    """Rows of ``like``'s schema holding values a decoder may get wrong: bounds, NaN, NUL, empty and null lists."""
    rows = [dict(like.slice(0, 1).to_pylist()[0]) for _ in range(6)]
    utc = dt.UTC
    rows[0] |= {"events": [], "links": None, "decision_confidence": math.nan, "attributes": "nul\x00 é 😀"}
    rows[1] |= {"events": None, "links": [], "decision_confidence": -0.0, "outcome_correct": None}
    rows[2] |= {"events": [{"time": None, "name": None, "attributes": None}], "status_message": ""}
    rows[3] |= {"start_time": dt.datetime(1677, 9, 22, tzinfo=utc), "end_time": dt.datetime(2262, 4, 11, tzinfo=utc)}
    rows[4] |= {"decision_confidence": math.inf, "dropped_attributes_count": -(2**31), "duration_ns": 2**63 - 1}
    rows[5] |= {"parent_span_id": None, "correlation_id": None, "resource_attributes": "{" * 500}
    for i, row in enumerate(rows):
        row["span_id"] = f"hostile{i}"
    return pa.Table.from_pylist(rows, schema=like.schema)


def test_a_chunk_read_by_duckdb_is_exactly_what_the_file_by_file_read_gives(make_dataset, monkeypatch) -> None:
    path, _ = _many(make_dataset)
    files = sorted(str(p) for p in partition_dirs(path)[0].glob("*.parquet"))
    first = pq.read_table(files[0])
    first_ns = first.column("start_time").cast(pa.int64())[0].as_py() + 1  # a nanosecond DuckDB must not round
    for i in (5, 17, 30):  # hostile rows among ordinary ones, written as the writer writes a file
        table = pq.read_table(files[i])
        _written(pa.concat_tables([table, _hostile(first)]), files[i], compression="zstd")
    odd = pq.read_table(files[9])
    times = pa.array([first_ns] * odd.num_rows, pa.int64()).cast(odd.schema.field("end_time").type)
    _written(odd.set_column(odd.schema.get_field_index("end_time"), "end_time", times), files[9])
    rows = {f: pq.read_metadata(f).num_rows for f in files}
    expected = compact_module.read_files(files)  # file by file
    chunks = ChunkWatch(monkeypatch)
    for threads in (1, 2):
        scanned = compact_module.read_files(files, workers=compact_module.Workers(threads), rows=rows)
        assert scanned.schema.equals(expected.schema, check_metadata=True)
        assert scanned.num_rows == expected.num_rows == sum(rows.values())
        plain = pa.schema([f.with_type(compact_module._plain_type(f.type)) for f in expected.schema])
        # in order, to the nanosecond; NaN and -0.0 compared by repr
        assert repr(scanned.cast(plain).to_pylist()) == repr(expected.cast(plain).to_pylist())
    assert len(chunks.scanned) == 2 * (len(files) - 1)  # all but the first file, by DuckDB, on each run
    assert all(chunks.taken)  # DuckDB's answers, not the file-by-file read's
    nan = [v for v in scanned.column("decision_confidence").to_pylist() if v is not None and math.isnan(v)]
    assert len(nan) == 3


def test_an_answer_that_is_not_the_chunk_is_refused(make_dataset) -> None:
    path, _ = _many(make_dataset)
    files = sorted(str(p) for p in partition_dirs(path)[0].glob("*.parquet"))
    schema = pq.read_schema(files[0])
    rows = sum(pq.read_metadata(f).num_rows for f in files)
    assert duck_read(files, schema, rows) is not None
    assert duck_read(files, schema, rows + 1) is None  # a row count other than the footers'
    other = schema.set(schema.get_field_index("duration_ns"), pa.field("duration_ns", pa.int8()))
    assert duck_read(files, other, rows) is None  # values the group's type cannot hold: no truncating cast
    Path(files[9]).write_bytes(b"PAR1" + b"\x00" * 64 + b"PAR1")  # a file it cannot read
    assert duck_read(files, schema, rows) is None


def test_a_damaged_page_in_a_chunk_is_named_by_the_file_by_file_read(make_dataset, monkeypatch) -> None:
    path, _ = _many(make_dataset)
    partition = partition_dirs(path)[0]
    names = sorted(n for n in os.listdir(partition) if n.endswith(".parquet"))
    victim = partition / names[len(names) // 2]
    data = bytearray(victim.read_bytes())
    data[4:300] = os.urandom(296)  # its pages are noise; its magic and footer are intact
    victim.write_bytes(bytes(data))
    watch = ReadWatch(monkeypatch)
    chunks = ChunkWatch(monkeypatch)
    before = sorted(os.listdir(partition))
    with pytest.raises(CorruptFileError, match=victim.name):
        compact(path, partitions=[partition.name])
    assert str(victim) in chunks.scanned and watch.read  # DuckDB refused the chunk; the read file by file named it
    left = os.listdir(partition)
    assert sorted(n for n in left if n != MANIFEST_NAME) == sorted(n for n in before if n != MANIFEST_NAME)
    assert MANIFEST_NAME not in left or '"pending": {}' in (partition / MANIFEST_NAME).read_text().replace("\n", "")


@pytest.mark.slow
def test_a_tiny_batch_over_many_files_keeps_every_span_once(make_dataset) -> None:
    path, figures = _many(make_dataset)
    report = compact(path, grace_seconds=0, max_batch_rows=24, target_rows=7)
    assert report.duplicates_removed == figures["duplicates_written"] > 0
    after = live_files(path)
    assert count_rows(after) == (figures["unique_spans"],) * 2
    assert all(pq.read_metadata(f).num_rows <= 7 for f in after)
    assert len({Path(f).name.split("-")[2] for f in after}) > 20  # one sorted run per batch


@pytest.mark.slow
def test_a_truncated_file_among_many_small_files_changes_nothing_and_is_named(make_dataset) -> None:
    path, _ = _many(make_dataset)
    partition = partition_dirs(path)[0]
    names = sorted(os.listdir(partition))
    victim = partition / names[len(names) // 2]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])  # its footer is gone
    before = sorted(os.listdir(partition))
    with pytest.raises(CorruptFileError, match=victim.name):
        compact(path, partitions=[partition.name], threads=2)
    assert sorted(os.listdir(partition)) == before  # no manifest, no output, no temp file


def test_a_file_damaged_past_its_footer_fails_the_run_naming_it_and_leaves_no_output(make_dataset) -> None:
    path, figures = _many(make_dataset)
    partition = partition_dirs(path)[0]
    names = sorted(n for n in os.listdir(partition) if n.endswith(".parquet"))
    victim = partition / names[-3]  # read late: outputs of earlier batches may be written already
    data = bytearray(victim.read_bytes())
    data[4:200] = b"\xff" * 196  # column chunks overwritten; magic and footer intact
    victim.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match=victim.name):
        compact(path, partitions=[partition.name], max_batch_rows=60)
    left = os.listdir(partition)
    assert not [n for n in left if is_compacted_name(n) or n.endswith(".tmp") or n.startswith("_index")]
    assert sorted(n for n in left if n.endswith(".parquet")) == names  # every input still there, still live
    assert sorted(Path(f).name for f in live_files(path) if partition.name in f) == names
    assert MANIFEST_NAME not in left or '"pending": {}' in (partition / MANIFEST_NAME).read_text().replace("\n", "")


@pytest.mark.slow
def test_older_schema_versions_among_many_small_files_stay_apart_and_complete(make_dataset) -> None:
    path, figures = _many(make_dataset)
    partition = partition_dirs(path)[0]
    names = sorted(n for n in os.listdir(partition) if n.endswith(".parquet"))
    old = names[::3]  # every third arrival written by an older writer (storage schema version 1)
    for name in old:
        table = pq.read_table(partition / name)
        pq.write_table(table.replace_schema_metadata({SCHEMA_METADATA_KEY: b"1"}), partition / name)
    rows_before = count_rows(live_files(path))
    compact(path, grace_seconds=0, max_batch_rows=70)
    after = [f for f in live_files(path) if partition.name in f]
    versions = {pq.read_schema(f).metadata[SCHEMA_METADATA_KEY] for f in after}
    assert versions == {b"1", b"2"}  # never merged into one schema
    assert count_rows(live_files(path))[1] == rows_before[1] == figures["unique_spans"]


def _int96_times(table: pa.Table, path: str) -> None:
    """``table`` written as a legacy writer does (Spark, Impala): span times as INT96, which holds nanoseconds (with
    a checksum, so a chunk of them is DuckDB's to read)."""
    _written(table, path, use_deprecated_int96_timestamps=True)


_FOREIGN = {  # a column another writer may add to span files, whose values DuckDB reads another way
    "decimal256": pa.array([decimal.Decimal("1" * 45 + ".5"), None, decimal.Decimal("-0.00001")], pa.decimal256(50, 5)),
    "struct keys differing in case": pa.StructArray.from_arrays(
        [pa.array([1, None, 3]), pa.array([4, 5, 6])], ["a", "A"]
    ),
    "struct key with NUL": pa.StructArray.from_arrays([pa.array([1, None, 3])], ["a\x00b"]),
    "empty struct key": pa.StructArray.from_arrays([pa.array([1, None, 3])], [""]),
}


@pytest.mark.parametrize("kind", [*_FOREIGN, "int96 times", "int96 times after int64 ones"])
def test_a_chunk_of_a_foreign_column_type_gives_the_file_by_file_rows(tmp_path, monkeypatch, kind) -> None:
    monkeypatch.setattr(compact_module, "DUCK_CHUNKS", True)
    files = []
    for i in range(20):  # more than DUCK_MIN_FILES: read a chunk at a time
        zone = "UTC" if kind != "int96 times after int64 ones" else None  # INT96 is read as zoneless, as they are
        times = pa.array([i * 10**9 + 1, -5, None], pa.int64()).cast(pa.timestamp("ns", zone))
        table = pa.table({"i": pa.array([i, i, i], pa.int64()), "t": times})
        path = str(tmp_path / f"f{i:02}.parquet")
        if kind == "int96 times after int64 ones" and i < 3:  # what DuckDB reads first is INT64 nanoseconds
            _written(table, path)
        elif kind.startswith("int96 times"):
            _int96_times(table, path)
        else:
            _written(table.append_column("x", _FOREIGN[kind]), path)
        files.append(path)
    rows = {f: 3 for f in files}
    expected = compact_module.read_files(files)  # file by file
    scanned = compact_module.read_files(files, rows=rows)
    assert scanned.schema.equals(expected.schema)
    assert scanned.equals(expected)  # values, nulls, nanoseconds: what pyarrow reads, never a near value or a NULL


def _rows(files: list[str]) -> list[str]:
    """The rows of ``files`` as sorted reprs (times as integers: nanoseconds compared exactly)."""
    table = pa.concat_tables([pq.read_table(f, partitioning=None) for f in files])
    plain = pa.schema([f.with_type(compact_module._plain_type(f.type)) for f in table.schema])
    return sorted(repr(row) for row in table.cast(plain).to_pylist())


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["struct keys differing in case", "decimal256", "int96 times"])
def test_a_partition_of_foreign_files_compacts_to_what_the_file_by_file_read_gives(
    make_dataset, monkeypatch, kind
) -> None:
    """Files another writer wrote (an extra column DuckDB reads another way, or INT96 times): compacted through DuckDB
    chunks, the partition holds exactly the rows compacting it file by file gives (DuckDB off: the peer)."""
    outputs = []
    for name, duck_min in (("duck", compact_module.DUCK_MIN_FILES), ("peer", 10**9)):
        path, _ = _many_as(make_dataset, name)
        partition = partition_dirs(path)[0]
        for f in sorted(partition.glob("*.parquet")):
            table = pq.read_table(f, partitioning=None)
            at = table.schema.get_field_index("start_time")
            start = pc.add(table.column("start_time").cast(pa.int64()), 7).cast(table.schema.field(at).type)
            table = table.set_column(at, table.schema.field(at), start)  # times with nanoseconds of their own
            if kind == "int96 times":
                _int96_times(table, str(f))
            else:
                foreign = _FOREIGN[kind]
                extra = pa.concat_arrays([foreign] * (table.num_rows // len(foreign) + 1))[: table.num_rows]
                _written(table.append_column("x", extra), f)
        monkeypatch.setattr(compact_module, "DUCK_MIN_FILES", duck_min)
        chunks = ChunkWatch(monkeypatch)
        compact(path, grace_seconds=0, partitions=[partition.name])
        assert bool(chunks.chunks) == (name == "duck")
        outputs.append(_rows([f for f in live_files(path) if partition.name in f]))
    assert outputs[0] == outputs[1]


def _refused_flips(victim: Path, column: str = "trace_id") -> list[int]:
    """Positions in ``column``'s pages of ``victim`` where one flipped bit (0x80) makes pyarrow refuse the file."""
    data = victim.read_bytes()
    chunk = pq.read_metadata(victim).row_group(0).column(pq.read_schema(victim).get_field_index(column))
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    refused = []
    for at in range(start, start + chunk.total_compressed_size):
        damaged = bytearray(data)
        damaged[at] ^= 0x80
        victim.write_bytes(bytes(damaged))
        try:
            compact_module._read_one(victim)
        except CorruptFileError:
            refused.append(at)
    victim.write_bytes(data)
    return refused


def _misread_flips(victim: Path) -> list[int]:
    """Positions of :func:`_refused_flips` where DuckDB itself (no checksum asked) reads the damaged file as its
    footer's number of rows: values pyarrow refuses, read as others."""
    data = victim.read_bytes()
    rows = pq.read_metadata(victim).num_rows
    misread = []
    for at in _refused_flips(victim):
        damaged = bytearray(data)
        damaged[at] ^= 0x80
        victim.write_bytes(bytes(damaged))
        try:
            count = duckdb.sql("SELECT * FROM read_parquet($f)", params={"f": str(victim)}).to_arrow_table().num_rows
        except duckdb.Error:
            continue
        if count == rows:
            misread.append(at)
    victim.write_bytes(data)
    return misread


def test_a_file_pyarrow_refuses_for_a_flipped_bit_in_a_page_is_never_taken_from_duckdb(make_dataset) -> None:
    """DuckDB reads some pages pyarrow refuses as the right number of rows (other trace ids): no chunk holding such a
    file is taken from DuckDB (its checksum no longer matches its bytes)."""
    path, _ = _many(make_dataset)
    files = sorted(partition_dirs(path)[0].glob("*.parquet"))
    victim = files[20]
    data = victim.read_bytes()
    flips = _refused_flips(victim)
    assert flips  # page headers, levels and dictionary indices pyarrow checks
    rows = sum(pq.read_metadata(f).num_rows for f in files[1:])
    assert duck_read(files[1:], pq.read_schema(files[0]), rows) is not None  # intact: DuckDB's to read
    taken = []
    for at in flips:
        damaged = bytearray(data)
        damaged[at] ^= 0x80
        victim.write_bytes(bytes(damaged))
        if duck_read(files[1:], pq.read_schema(files[0]), rows) is not None:
            taken.append(at)
    # else compaction would write what DuckDB made of a damaged page, naming no file
    assert taken == []


_PAGE_WRITERS: dict[str, dict[str, Any]] = {  # the exporter's own settings and three others pyarrow may use
    "the exporter's": {"compression": "zstd"},
    "no dictionary": {"use_dictionary": False, "compression": "zstd"},
    "uncompressed": {"compression": "none"},
    "data page v2": {"data_page_version": "2.0", "compression": "snappy"},
}


@pytest.mark.parametrize("writer", list(_PAGE_WRITERS))
def test_a_flipped_bit_at_any_page_byte_keeps_the_file_from_duckdb(make_dataset, writer) -> None:
    """One bit flipped at every byte of a checksummed file's pages (four writers' layouts), the first file DuckDB
    would read of a chunk: the chunk is never DuckDB's, so the file-by-file read judges it."""
    path, _ = _many(make_dataset)
    files = sorted(partition_dirs(path)[0].glob("*.parquet"))[:4]
    for f in files:
        _written(pq.read_table(f, partitioning=None), f, **_PAGE_WRITERS[writer])
    victim, schema = files[1], pq.read_schema(files[0])
    rows = sum(pq.read_metadata(f).num_rows for f in files[1:])
    assert duck_read(files[1:], schema, rows) is not None  # intact: DuckDB's to read
    data = victim.read_bytes()
    pages = range(4, len(data) - 8 - pq.read_metadata(victim).serialized_size)  # after PAR1, before the footer
    assert len(pages) > 1000
    fd = os.open(victim, os.O_RDWR)
    try:
        for at in pages:
            bit = 0x80 if at % 2 else 0x01  # a high bit and a low one, each at every other byte
            os.pwrite(fd, bytes([data[at] ^ bit]), at)
            assert duck_read(files[1:], schema, rows) is None, (at, bit)
            os.pwrite(fd, data[at : at + 1], at)
    finally:
        os.close(fd)
    assert victim.read_bytes() == data


def test_a_flipped_bit_duckdb_reads_as_other_values_is_named_and_changes_nothing(make_dataset) -> None:
    """A bit flipped where pyarrow refuses the file and DuckDB reads it as rows: compaction (DuckDB chunks on) names
    the file and changes nothing; it writes no value DuckDB made up and supersedes nothing."""
    assert compact_module.DUCK_CHUNKS  # on by default
    path, _ = _many(make_dataset)
    partition = partition_dirs(path)[0]
    victim = sorted(partition.glob("*.parquet"))[20]
    data = bytearray(victim.read_bytes())
    misread = _misread_flips(victim)
    assert misread  # DuckDB 2.0.1 reads about a tenth of them
    data[misread[len(misread) // 2]] ^= 0x80
    victim.write_bytes(bytes(data))
    before = {n: (partition / n).read_bytes() for n in os.listdir(partition)}
    with pytest.raises(CorruptFileError, match=victim.name):
        compact(path, partitions=[partition.name], grace_seconds=0)
    after = {n: (partition / n).read_bytes() for n in os.listdir(partition) if n != MANIFEST_NAME}
    assert after == {n: b for n, b in before.items() if n != MANIFEST_NAME}


def test_files_without_a_checksum_are_read_by_pyarrow_and_compact_to_the_same_rows(make_dataset, monkeypatch) -> None:
    """Files of older versions or other writers (no checksum) and a checksummed file rewritten by another writer
    (its pair kept, stale): never DuckDB's; their rows are the file-by-file read's."""
    path, _ = _many(make_dataset)
    files = sorted(str(p) for p in partition_dirs(path)[0].glob("*.parquet"))
    stale = files[1]
    pair = {b"otel_replay.crc32": pq.read_metadata(stale).metadata[b"otel_replay.crc32"]}
    for f in files[1::2]:
        pq.write_table(pq.read_table(f, partitioning=None), f)  # as an older version or the Collector would
    table = pq.read_table(stale, partitioning=None)
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, **pair}), stale, compression="none")
    rows = {f: pq.read_metadata(f).num_rows for f in files}
    expected = compact_module.read_files(files)  # file by file
    monkeypatch.setattr(compact_module, "DUCK_FILES", 3)  # DuckDB's part of each chunk: one checked file, one not
    chunks = ChunkWatch(monkeypatch)
    scanned = compact_module.read_files(files, rows=rows)
    assert chunks.taken and not any(chunks.taken)
    assert scanned.equals(expected)


def _one_span_files(partition: Path, count: int, same_at: range) -> list[Path]:
    """The partition's spans rewritten one a file, ``count`` files cycling through them (so spans repeat, exactly),
    every file in ``same_at`` holding one span, the one just before: duplicates on both sides of a chunk boundary."""
    originals = sorted(partition.glob("*.parquet"))
    table = pa.concat_tables([pq.read_table(f, partitioning=None) for f in originals])
    table = table.replace_schema_metadata({SCHEMA_METADATA_KEY: table.schema.metadata[SCHEMA_METADATA_KEY]})
    for f in originals:
        f.unlink()
    rows = [table.slice(i % table.num_rows, 1) for i in range(count)]
    for i in same_at:
        rows[i] = rows[same_at.start - 1]
    files = [partition / f"part-{10**15 + i}-{i:012x}.parquet" for i in range(count)]
    for file, row in zip(files, rows, strict=True):
        _written(row, file)
    return files


@pytest.mark.slow
@pytest.mark.parametrize("duck", ["DuckDB chunks", "file by file"])
def test_duplicates_on_both_sides_of_the_256_file_boundary_are_kept_once(make_dataset, monkeypatch, duck) -> None:
    path, _ = _many(make_dataset)
    partition = partition_dirs(path)[0]
    boundary = compact_module.DUCK_FILES
    files = _one_span_files(partition, boundary + 44, range(boundary - 2, boundary + 2))
    distinct = count_rows([str(f) for f in files])[1]
    chunks = ChunkWatch(monkeypatch) if duck == "DuckDB chunks" else None
    report = compact(path, partitions=[partition.name], grace_seconds=0)
    assert report.duplicates_removed == len(files) - distinct > 4
    assert count_rows([f for f in live_files(path) if partition.name in f]) == (distinct, distinct)
    if chunks is not None:  # the boundary: the last file of a chunk by DuckDB, the next chunk's first by pyarrow
        assert str(files[boundary - 1]) in chunks.scanned and str(files[boundary]) not in chunks.scanned
        assert str(files[boundary + 1]) in chunks.scanned


@pytest.mark.parametrize("duck", ["DuckDB chunks", "file by file"])
def test_a_file_deleted_between_the_listing_and_the_read_is_named_and_nothing_changes(
    make_dataset, monkeypatch, duck
) -> None:
    path, _ = _many(make_dataset)
    partition = partition_dirs(path)[0]
    victim = sorted(partition.glob("*.parquet"))[30]
    before = {n: (partition / n).read_bytes() for n in os.listdir(partition) if n != victim.name}
    compact_run = importlib.import_module("otel_replay.storage.compact")
    planned = compact_run.plan_batches

    def then_deleted(*args: Any, **kwargs: Any) -> Any:
        batches = planned(*args, **kwargs)
        victim.unlink()  # by another process, after compaction listed the partition and read the footers
        return batches

    monkeypatch.setattr(compact_run, "plan_batches", then_deleted)
    if duck == "DuckDB chunks":
        ChunkWatch(monkeypatch)
    with pytest.raises(CorruptFileError, match=victim.name):
        compact(path, partitions=[partition.name], grace_seconds=0)
    after = {n: (partition / n).read_bytes() for n in os.listdir(partition) if n != MANIFEST_NAME}
    assert after == {n: b for n, b in before.items() if n != MANIFEST_NAME}


_WRITERS: dict[str, dict[str, Any]] = {  # the same schema, written by pyarrow with other options than the exporter's
    "no dictionary": {"use_dictionary": False},
    "uncompressed": {"compression": "none"},
    "gzip": {"compression": "gzip"},
    "data page v2": {"data_page_version": "2.0", "compression": "snappy"},
    "a row group a row": {"row_group_size": 1},
    "zero rows": {},
}


@pytest.mark.parametrize("writer", list(_WRITERS))
def test_files_of_another_writer_or_no_rows_in_a_chunk_give_the_file_by_file_rows(
    make_dataset, monkeypatch, writer
) -> None:
    path, _ = _many(make_dataset)
    files = sorted(str(p) for p in partition_dirs(path)[0].glob("*.parquet"))
    for i in (0, 1, 9, 10, 40):  # a chunk's first file (pyarrow), DuckDB's first, two together, one alone
        table = pq.read_table(files[i], partitioning=None)
        _written(table.slice(0, 0) if writer == "zero rows" else table, files[i], **_WRITERS[writer])
    rows = {f: pq.read_metadata(f).num_rows for f in files}
    expected = compact_module.read_files(files)  # file by file
    chunks = ChunkWatch(monkeypatch)
    scanned = compact_module.read_files(files, rows=rows)
    assert chunks.taken and all(chunks.taken) and scanned.schema.equals(expected.schema, check_metadata=True)
    assert scanned.equals(expected)


@pytest.mark.slow
@pytest.mark.parametrize("duck", ["DuckDB chunks", "file by file"])
def test_files_with_one_column_of_another_type_are_never_compacted_with_the_rest(
    make_dataset, monkeypatch, duck
) -> None:
    path, figures = _many(make_dataset)
    partition = partition_dirs(path)[0]
    names = sorted(partition.glob("*.parquet"))
    for f in names[::2]:  # every other file: duration_ns as int32, the same column names
        table = pq.read_table(f, partitioning=None)
        at = table.schema.get_field_index("duration_ns")
        narrow = pc.divide(table.column(at), 1000).cast(pa.int32())
        _written(table.set_column(at, pa.field("duration_ns", pa.int32()), narrow), f)
    narrow_in = count_rows([str(f) for f in names[::2]])[1]  # distinct spans of each group: what it keeps
    wide_in = count_rows([str(f) for f in names[1::2]])[1]
    if duck == "DuckDB chunks":
        ChunkWatch(monkeypatch)
        monkeypatch.setattr(compact_module, "DUCK_MIN_FILES", 4)
    compact(path, grace_seconds=0, partitions=[partition.name])
    after = [f for f in live_files(path) if partition.name in f]
    by_type: dict[str, list[str]] = {}
    for f in after:
        by_type.setdefault(str(pq.read_schema(f).field("duration_ns").type), []).append(f)
    assert sorted(by_type) == ["int32", "int64"]  # one output group each, never cast into one another
    assert count_rows(by_type["int32"]) == (narrow_in, narrow_in)
    assert count_rows(by_type["int64"]) == (wide_in, wide_in)


def _more_hostile(like: pa.Table) -> pa.Table:
    """Rows of ``like``'s schema with text and bounds :func:`_hostile` does not hold."""
    rows = [dict(like.slice(0, 1).to_pylist()[0]) for _ in range(4)]
    utc = dt.UTC
    rows[0] |= {
        "attributes": '{"\\ud800": "\\udfff", "": null, "a\\u0000b": [], "\\"": {}}',
        "status_message": "😀" * 2,
    }
    rows[1] |= {"status_message": "x" * 2**20, "resource_attributes": "\x00" * 1000, "duration_ns": -(2**63)}
    rows[2] |= {
        "start_time": dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=utc),
        "decision_confidence": -math.inf,
    }
    rows[3] |= {"events": [{"time": dt.datetime(1970, 1, 1, tzinfo=utc), "name": "", "attributes": "{}"}] * 3}
    rows[3] |= {"links": [{"trace_id": "", "span_id": "\x00", "trace_state": None, "attributes": None}]}
    for i, row in enumerate(rows):
        row["span_id"] = f"hostile-more{i}"
    return pa.Table.from_pylist(rows, schema=like.schema)


def test_hostile_text_and_bounds_in_a_chunk_are_exactly_the_file_by_file_rows(make_dataset, monkeypatch) -> None:
    path, _ = _many(make_dataset)
    files = sorted(str(p) for p in partition_dirs(path)[0].glob("*.parquet"))
    first = pq.read_table(files[0])
    for i in (3, 12):
        table = pq.read_table(files[i])
        hostile = pa.concat_tables([_hostile(first), _more_hostile(first)])
        times = pc.subtract(hostile.column("start_time").cast(pa.int64()), 1)  # pre-1970 and bounds, less 1 ns
        hostile = hostile.set_column(9, hostile.schema.field(9), times.cast(hostile.schema.field(9).type))
        _written(pa.concat_tables([table, hostile]), files[i], compression="zstd")
    rows = {f: pq.read_metadata(f).num_rows for f in files}
    expected = compact_module.read_files(files)  # file by file
    chunks = ChunkWatch(monkeypatch)
    scanned = compact_module.read_files(files, rows=rows)
    assert chunks.taken and all(chunks.taken) and scanned.schema.equals(expected.schema, check_metadata=True)
    plain = pa.schema([f.with_type(compact_module._plain_type(f.type)) for f in expected.schema])
    assert repr(scanned.cast(plain).to_pylist()) == repr(expected.cast(plain).to_pylist())  # NaN, -0.0 by repr


def test_a_path_duckdb_would_read_as_a_glob_is_read_file_by_file(tmp_path, monkeypatch) -> None:
    """DuckDB expands ``*``, ``?`` and ``[...]`` in each path it is given: ``ds[1]`` would read ``ds1``'s files."""
    monkeypatch.setattr(compact_module, "DUCK_CHUNKS", True)
    files = []
    for i in range(20):
        for root, value in (("ds[1]", i), ("ds1", 1000 + i)):  # a sibling of the same file names: another dataset
            (tmp_path / root).mkdir(exist_ok=True)
            _written(pa.table({"i": pa.array([value, value], pa.int64())}), tmp_path / root / f"f{i:02}.parquet")
        files.append(str(tmp_path / "ds[1]" / f"f{i:02}.parquet"))
    scanned = compact_module.read_files(files, rows=dict.fromkeys(files, 2))
    assert scanned.column("i").to_pylist() == [i for i in range(20) for _ in range(2)]


def test_repeated_span_ids_under_a_path_duckdb_would_read_as_a_glob_are_counted_in_that_path(tmp_path) -> None:
    """``repeated_keys`` (ids stored twice across a partition's batches) counts ``ds[1]``'s ids, not ``ds1``'s."""
    repeated_keys = compact_module.repeated_keys
    files = []
    for i in range(3):
        for root, ids in (("ds[1]", ["a", "a"] if i == 0 else [f"x{i}"]), ("ds1", [f"y{i}"])):
            (tmp_path / root).mkdir(exist_ok=True)
            table = pa.table({"trace_id": pa.array(["t"] * len(ids)), "span_id": pa.array(ids), "v": range(len(ids))})
            pq.write_table(table, tmp_path / root / f"f{i}.parquet")
        files.append(tmp_path / "ds[1]" / f"f{i}.parquet")
    found = repeated_keys(files)
    assert found.to_pylist() == [{"t": "t", "s": "a", "n": 2}]  # was: ds1's ids, where nothing repeats
    plain = [tmp_path / "ds1" / f"f{i}.parquet" for i in range(3)]
    assert repeated_keys(plain).num_rows == 0  # DuckDB still reads a path of no pattern


def test_a_compacted_file_carries_its_own_checksum_which_any_flipped_bit_breaks(make_dataset) -> None:
    """Compaction's own local output carries the CRC-32 of its bytes, not the first input's pair (which pyarrow reads
    into the batch's schema metadata): compacted again, its files are DuckDB's to read, and a flipped bit in one keeps
    it from DuckDB as in any other file."""
    path, _ = _many(make_dataset)
    compact(path, grace_seconds=0)
    outputs = [Path(f) for f in live_files(path)]
    assert len(outputs) >= 2 and all(is_compacted_name(f.name) for f in outputs)
    for f in outputs:
        assert checksum_matches(f), f.name
        assert f.read_bytes().count(CHECKSUM_KEY) == 1
        assert CHECKSUM_KEY not in (pq.read_schema(f).metadata or {})  # no input's stale pair in the stored schema
    rows = sum(pq.read_metadata(f).num_rows for f in outputs)
    schema = pq.read_schema(outputs[0])
    read = duck_read(outputs, schema, rows)
    assert read is not None and read.num_rows == rows
    victim = outputs[1]
    data = victim.read_bytes()
    fd = os.open(victim, os.O_RDWR)
    try:  # a bit in every 50th byte (pages, their headers, the footer) and in every byte of the footer's end
        for at in sorted({*range(0, len(data), 50), *range(len(data) - 64, len(data))}):
            os.pwrite(fd, bytes([data[at] ^ (1 << at % 8)]), at)
            assert not checksum_matches(victim), at
            os.pwrite(fd, data[at : at + 1], at)
        os.pwrite(fd, bytes([data[len(data) // 2] ^ 0x10]), len(data) // 2)
        assert duck_read(outputs, schema, rows) is None  # the file-by-file read judges it
    finally:
        os.pwrite(fd, data[len(data) // 2 : len(data) // 2 + 1], len(data) // 2)
        os.close(fd)
    assert checksum_matches(victim)
