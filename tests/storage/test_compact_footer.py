"""Compaction's raw look at a footer: the row count and schema bytes, or nothing when the bytes are not sound."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow.parquet as pq

from otel_replay.storage import live_files
from otel_replay.storage.compact_footer import footer_head


def test_row_counts_and_schema_bytes_match_pyarrows_and_a_known_prefix_gives_the_same(make_dataset) -> None:
    path, _ = make_dataset(spans=400, ids=40, rows_per_file=7)
    prefixes: list[tuple[bytes, bytes]] = []
    files = live_files(path)
    heads = [footer_head(f, prefixes) for f in files]
    assert all(h is not None and h.rows == pq.read_metadata(f).num_rows for h, f in zip(heads, files, strict=True))
    assert len(prefixes) == 1  # one writer: walked once, compared after
    assert [footer_head(f) for f in files][-1].signature == heads[-1].signature  # type: ignore[union-attr]


def test_damaged_truncated_or_foreign_footers_give_nothing_and_never_raise(make_dataset, tmp_path) -> None:
    path, _ = make_dataset(spans=100, ids=10, rows_per_file=50)
    source = Path(live_files(path)[0]).read_bytes()
    length = int.from_bytes(source[-8:-4], "little")
    rng = random.Random(5)
    target = tmp_path / "x.parquet"
    cases = [b"", b"PAR1", source[:-1], source[: len(source) // 2] + b"PAR1", b"PAR1" + b"\x00" * 20 + b"PAR1"]
    for _ in range(200):  # footers with bytes changed at random, and cut at random
        data = bytearray(source)
        for _ in range(rng.randint(1, 8)):
            data[len(data) - 8 - rng.randint(1, length)] = rng.randrange(256)
        cases.append(bytes(data))
        cut = rng.randint(1, length - 1)
        cases.append(source[: len(source) - 8 - length] + source[-8 - cut : -8] + (cut).to_bytes(4, "little") + b"PAR1")
    for data in cases:
        target.write_bytes(data)
        head = footer_head(target)
        assert head is None or head.rows >= 0
    assert footer_head(tmp_path / "missing.parquet") is None
    target.write_bytes(b"PAR1" + b"\x15\x04\x19\x1c" + b"\x00" * 4 + (8).to_bytes(4, "little") + b"PAR1")
    assert footer_head(target) is None  # no Arrow schema recorded: pyarrow judges it
