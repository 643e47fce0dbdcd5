"""The side index narrows lookups to the files holding an id, and stays complete as new files arrive."""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otel_replay.errors import ConfigError, DatasetError
from otel_replay.storage import compact, files_for, live_files
from otel_replay.storage.manifest import partition_dirs, read_manifest
from otel_replay.storage.side_index import INDEX_KINDS


def _holding(files: list[str], column: str, value: str) -> set[str]:
    con = duckdb.connect()
    try:
        found = con.execute(
            f"SELECT DISTINCT filename FROM read_parquet(?, filename = true) WHERE {column} = ?", [files, value]
        ).fetchall()
    finally:
        con.close()
    return {f for (f,) in found}


def _values(files: list[str], column: str, n: int) -> list[str]:
    con = duckdb.connect()
    try:
        rows = con.execute(f"SELECT DISTINCT {column} FROM read_parquet(?) WHERE {column} IS NOT NULL", [files])
        values = sorted(v for (v,) in rows.fetchall())
    finally:
        con.close()
    return random.Random(3).sample(values, min(n, len(values)))


def test_no_index_means_none_and_no_id_is_an_error(make_dataset) -> None:
    path, _ = make_dataset(spans=300, ids=30)
    assert files_for(path, correlation_id="trade-000000001") is None
    with pytest.raises(ConfigError, match="at least one id"):
        files_for(path)


@pytest.mark.parametrize("kind", INDEX_KINDS)
def test_files_for_holds_every_file_with_the_id_and_few_others(make_dataset, kind: str) -> None:
    path, _ = make_dataset(spans=4000, ids=400)
    compact(path, grace_seconds=0, target_rows=300)  # many small compacted files
    every = live_files(path)
    assert len(every) > 8
    narrowed_total = 0
    for value in _values(every, kind, 15):
        got = files_for(path, **{kind: value})
        assert got is not None
        assert _holding(every, kind, value) <= set(got)  # complete
        assert set(got) <= set(every)
        narrowed_total += len(got)
    assert narrowed_total < 15 * len(every) / 3  # and narrow: most files are left out
    assert files_for(path, **{kind: "no-such-id"}) == []


def test_files_newer_than_the_index_are_always_searched(make_dataset) -> None:
    path, _ = make_dataset(spans=1000, ids=100)
    compact(path, grace_seconds=0)
    partition = partition_dirs(path)[0]
    sample = pq.read_table(live_files(path)[0]).slice(0, 2)
    arrived = sample.set_column(
        sample.schema.get_field_index("correlation_id"), "correlation_id", pa.array(["late-id"] * 2, pa.string())
    )
    late = partition / "part-5-eeeeeeeeeeee.parquet"
    pq.write_table(arrived, late)
    assert files_for(path, correlation_id="late-id") == [str(late)]
    got = files_for(path, correlation_id="trade-000000003")
    assert got is not None and str(late) in got
    compact(path, grace_seconds=0)  # the arrival is now indexed: only the file holding it remains
    got = files_for(path, correlation_id="late-id")
    assert got is not None and len(got) == 1 and _holding(live_files(path), "correlation_id", "late-id") == set(got)


def test_query_over_files_for_equals_query_over_everything(make_dataset) -> None:
    path, _ = make_dataset(spans=3000, ids=300)
    compact(path, grace_seconds=0, target_rows=250)
    con = duckdb.connect()
    sql = "SELECT span_id, epoch_ns(start_time) FROM read_parquet(?) WHERE correlation_id = ? ORDER BY ALL"
    for cid in ("trade-000000000", "trade-000000150", "trade-000000299"):
        narrowed = files_for(path, correlation_id=cid)
        assert narrowed
        assert con.execute(sql, [narrowed, cid]).fetchall() == con.execute(sql, [live_files(path), cid]).fetchall()


def test_an_unreadable_index_is_a_dataset_error_naming_it(make_dataset) -> None:
    path, _ = make_dataset(spans=300, ids=30)
    compact(path, grace_seconds=0)
    partition = partition_dirs(path)[0]
    manifest = read_manifest(partition)
    assert manifest is not None and manifest.index is not None
    (partition / manifest.index).write_bytes(b"not parquet at all")
    with pytest.raises(DatasetError, match=manifest.index):
        files_for(path, correlation_id="trade-000000001")


def test_index_rows_have_time_bounds(make_dataset, tmp_path: Path) -> None:
    path, _ = make_dataset(spans=300, ids=30)
    compact(path, grace_seconds=0)
    partition = partition_dirs(path)[0]
    manifest = read_manifest(partition)
    assert manifest is not None and manifest.index is not None
    index = pq.read_table(partition / manifest.index)
    assert set(index.column("kind").to_pylist()) == set(INDEX_KINDS)
    con = duckdb.connect()
    (lo, hi, n) = con.execute(
        "SELECT epoch_ns(min(start_time)), epoch_ns(max(start_time)), count(*) FROM read_parquet(?) "
        "WHERE correlation_id = 'trade-000000001'",
        [[str(partition / f) for f in manifest.files]],
    ).fetchone()
    got = con.execute(
        "SELECT rows, epoch_ns(min_start), epoch_ns(max_start) FROM read_parquet(?) "
        "WHERE kind = 'correlation_id' AND key = 'trade-000000001'",
        [str(partition / manifest.index)],
    ).fetchall()
    assert got == [(n, lo, hi)]


def test_partitions_without_an_index_contribute_every_file(make_dataset) -> None:
    path, _ = make_dataset(spans=1000, ids=100)
    first, *rest = partition_dirs(path)
    compact(path, grace_seconds=0, partitions=[first.name])
    got = files_for(path, correlation_id="trade-000000001")
    assert got is not None
    unindexed = [f for f in live_files(path) if first.name not in f]
    assert rest and set(unindexed) <= set(got)
    assert len([f for f in got if first.name in f]) == 1


def test_trade_chain_over_files_for_equals_the_store_chain(make_dataset) -> None:
    """What Store will do: point the views at files_for's answer; the chain must not change."""
    from otel_replay.query.engine import load_sql
    from otel_replay.query.store import Store

    path, _ = make_dataset(spans=3000, ids=300)
    compact(path, grace_seconds=0, target_rows=300)
    late = partition_dirs(path)[0] / "part-7-abababababab.parquet"  # an arrival newer than the index
    pq.write_table(pq.read_table(live_files(path)[0]).slice(0, 3), late)
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET VARIABLE otel_replay_files = ?", [live_files(path)])
    con.execute(load_sql("source"))
    con.execute(load_sql("views"))
    trade = f"SELECT layer, record_id, body FROM ({load_sql('chains/trade').rstrip().rstrip(';')})"
    with Store(path) as store:
        for chain_id in ("trade-000000000", "trade-000000042", "trade-000000299", "absent"):
            narrowed = files_for(path, correlation_id=chain_id)
            assert narrowed is not None and len(narrowed) < len(live_files(path))
            con.execute("SET VARIABLE otel_replay_files = ?", [narrowed])
            con.execute("SET VARIABLE chain_id = ?", [chain_id])
            got = con.execute(trade).fetchall()
            full = store.run("chains/trade", chain_id=chain_id)
            assert got == [(r["layer"], r["record_id"], r["body"]) for r in full]
            assert (len(got) > 3) == (chain_id != "absent")
