"""Files that arrive after a compaction: a lookup opens only those that hold its id, and misses nothing."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otel_replay import CorruptFileError
from otel_replay.location import resolve
from otel_replay.query.store import Store
from otel_replay.storage import compact, live_files
from otel_replay.storage.manifest import partition_dirs
from otel_replay.storage.side_index import INDEX_KINDS, indexed_and_tail
from otel_replay.storage.tail_index import TailIndex

from ..query.test_store import damage_pages

CHAIN = "trade-000000042"


def _arrivals(path: Path, count: int, rows: int = 40) -> list[Path]:
    """``count`` files newer than the index, each a slice of the compacted rows (other chains, then CHAIN's)."""
    source = pq.read_table(live_files(path))
    others = source.filter(pa.compute.not_equal(source.column("correlation_id"), CHAIN))
    mine = source.filter(pa.compute.equal(source.column("correlation_id"), CHAIN))
    written = []
    folder = partition_dirs(path)[0]
    for i in range(count):
        table = mine.slice(0, 2) if i == count - 1 else others.slice(i * rows, rows)
        target = folder / f"part-late{i:04d}-abababababab.parquet"
        pq.write_table(table, target)
        written.append(target)
    return written


def _damage_all_but_ids(source: Path) -> None:
    """Overwrite the first page header of every column but the id columns; the footer and ids still read."""
    data = bytearray(source.read_bytes())
    group = pq.read_metadata(source).row_group(0)
    for i in range(group.num_columns):
        column = group.column(i)
        if column.path_in_schema not in INDEX_KINDS:
            data[column.data_page_offset : column.data_page_offset + 4] = b"\xff\xff\xff\xff"
    source.write_bytes(bytes(data))


def test_lookups_with_a_tail_equal_lookups_over_every_file(make_dataset) -> None:
    path, _ = make_dataset(spans=3000, ids=300)
    compact(path, grace_seconds=0, target_rows=300)
    late = _arrivals(path, 30)
    with Store(path) as store, Store(path) as everything:
        chains = [CHAIN, "trade-000000007", "trade-000000150", "absent"]
        chains.append(str(pq.read_table(late[3]).column("correlation_id")[0]))
        for _ in range(2):  # the second pass is served from the tail index
            for chain_id in chains:
                full = everything.run("chains/trade", chain_id=chain_id)
                assert store.run_for("chains/trade", {"correlation_id": chain_id}, chain_id=chain_id) == full
                assert (len(full) > 0) == (chain_id != "absent")
        split = indexed_and_tail(path, [("correlation_id", CHAIN)])
        assert split is not None and len(split[1]) == 30
        assert store.engine._tail.files_read == 30  # each arrival's ids read once, over ten lookups


def test_a_tail_file_that_cannot_hold_the_id_is_not_opened(make_dataset) -> None:
    path, _ = make_dataset(spans=1500, ids=150)
    compact(path, grace_seconds=0, target_rows=300)
    late = _arrivals(path, 5)
    with Store(path) as store:
        expected = store.run_for("chains/trade", {"correlation_id": CHAIN}, chain_id=CHAIN)
        assert expected
        _damage_all_but_ids(late[0])  # holds other chains: its pages are never read for CHAIN
        store.refresh()
        assert store.run_for("chains/trade", {"correlation_id": CHAIN}, chain_id=CHAIN) == expected
        other = str(pq.read_table(late[0], columns=["correlation_id"]).column(0)[0])
        with pytest.raises(CorruptFileError, match=late[0].name):
            store.run_for("chains/trade", {"correlation_id": other}, chain_id=other)


def test_a_tail_file_whose_ids_cannot_be_read_is_always_searched(make_dataset) -> None:
    path, _ = make_dataset(spans=1500, ids=150)
    compact(path, grace_seconds=0, target_rows=300)
    late = _arrivals(path, 3)
    damage_pages(late[0], late[0].with_name(".tmp")).replace(late[0])  # id pages too: nothing to index
    with Store(path) as store:
        for _ in range(2):
            with pytest.raises(CorruptFileError, match=late[0].name):
                store.run_for("chains/trade", {"correlation_id": CHAIN}, chain_id=CHAIN)
    with Store(path, skip_corrupt=True) as store:
        rows = store.run_for("chains/trade", {"correlation_id": CHAIN}, chain_id=CHAIN)
        assert rows and [p.path for p in store.skipped] == [str(late[0])]


def test_a_file_arriving_between_lookups_is_found_without_refresh(make_dataset) -> None:
    path, _ = make_dataset(spans=1500, ids=150)
    compact(path, grace_seconds=0, target_rows=300)
    with Store(path) as store:
        before = store.run_for("chains/trade", {"correlation_id": CHAIN}, chain_id=CHAIN)
        late = _arrivals(path, 4)
        table = pq.read_table(late[-1])
        assert table.num_rows == 2
        # a copy of two of CHAIN's spans under new span ids: two more rows the lookup must show
        table = table.set_column(
            table.schema.get_field_index("span_id"), "span_id", pa.array(["f" * 16, "e" * 16], pa.string())
        )
        pq.write_table(table, late[-1])
        after = [store.run_for("chains/trade", {"correlation_id": CHAIN}, chain_id=CHAIN) for _ in range(3)]
        with Store(path) as fresh:
            assert after[0] == after[1] == after[2] == fresh.run("chains/trade", chain_id=CHAIN)
        assert after[0] != before  # the arrival's rows are in, without a refresh


def test_compaction_retires_tail_entries_and_lookups_stay_equal(make_dataset) -> None:
    path, _ = make_dataset(spans=1500, ids=150)
    compact(path, grace_seconds=0, target_rows=300)
    _arrivals(path, 6)
    with Store(path) as store:
        first = store.run_for("chains/trade", {"correlation_id": CHAIN}, chain_id=CHAIN)
        store.run_for("chains/trade", {"correlation_id": CHAIN}, chain_id=CHAIN)
        assert store.engine._tail.keys > 0
        compact(path, grace_seconds=0, target_rows=300)
        store.refresh()
        assert store.engine._tail.keys == 0  # every arrival was folded into the compacted files
        assert store.run_for("chains/trade", {"correlation_id": CHAIN}, chain_id=CHAIN) == first


def test_the_key_budget_keeps_what_it_cannot_hold(make_dataset) -> None:
    path, _ = make_dataset(spans=1500, ids=150)
    compact(path, grace_seconds=0, target_rows=300)
    late = _arrivals(path, 8)
    tail = TailIndex(resolve(path), key_budget=60)
    stamps = {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in late}
    kept = tail.holding([str(p) for p in late], [("correlation_id", CHAIN)], stamps)
    assert tail.keys <= 60
    assert str(late[-1]) in kept  # CHAIN's file: held or over budget, it is never left out
    assert len(kept) < len(late)  # the files that fit the budget and miss the id are left out
    assert tail.holding([str(late[0])], [("correlation_id", CHAIN)], {}) == [str(late[0])]  # no stamp: kept
    read = tail.files_read
    assert tail.holding([str(p) for p in late], [("correlation_id", CHAIN)], stamps) == kept
    assert tail.files_read == read  # what did not fit is not read again at every lookup
    tail.keep_only([str(p) for p in late[-2:]])  # a compaction retired the rest: room to index the last two
    assert tail.holding([str(p) for p in late[-2:]], [("correlation_id", CHAIN)], stamps) == [str(late[-1])]


def test_ids_of_one_kind_never_match_another_and_hostile_ids_are_exact(tmp_path: Path) -> None:
    target = tmp_path / "part-0.parquet"
    nul = "trade\x00correlation_id\x00x"
    pq.write_table(
        pa.table({"correlation_id": ["abc", nul], "trace_id": ["t1", None], "record_id": [None, "abc"]}), target
    )
    stamp = {str(target): (1, 1)}
    tail = TailIndex(resolve(tmp_path))
    assert tail.holding([str(target)], [("session_id", "abc")], stamp) == []
    assert tail.holding([str(target)], [("trace_id", "abc")], stamp) == []
    assert tail.holding([str(target)], [("record_id", "abc")], stamp) == [str(target)]
    assert tail.holding([str(target)], [("correlation_id", nul)], stamp) == [str(target)]
    assert tail.holding([str(target)], [("correlation_id", "trade")], stamp) == []
    assert tail.holding([str(target)], [("correlation_id", "ab")], stamp) == []
    with pytest.raises(ValueError, match="key_budget"):
        TailIndex(resolve(tmp_path), key_budget=-1)


def test_an_unknown_id_kind_is_refused_by_name(make_dataset) -> None:
    from otel_replay.errors import ConfigError

    path, _ = make_dataset(spans=300, ids=30)
    compact(path, grace_seconds=0)
    with Store(path) as store, pytest.raises(ConfigError, match="not an indexed id kind: span_id"):
        store.run_for("chains/trade", {"span_id": "x"}, chain_id="x")
