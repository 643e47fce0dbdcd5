"""Duplicate candidates are found column-wise; forged ids that collide when joined never make a row vanish."""

from __future__ import annotations

import pyarrow as pa

from otel_replay.storage.compact_steps import Seen, _positions_of, exact_duplicates, repeated_in


def _table(pairs: list[tuple[str | None, str | None]], names: list[str]) -> pa.Table:
    return pa.table(
        {
            "trace_id": pa.array([p[0] for p in pairs], pa.string()),
            "span_id": pa.array([p[1] for p in pairs], pa.string()),
            "name": pa.array(names, pa.string()),
        }
    )


def test_positions_match_pairs_only_and_skip_nulls() -> None:
    table = _table([("t1", "s1"), ("t1", "s2"), (None, "s1"), ("t1", None), ("t1", "s1")], ["a", "b", "c", "d", "a"])
    repeated = pa.table({"t": pa.array(["t1"], pa.string()), "s": pa.array(["s1"], pa.string())})
    assert _positions_of(table, repeated) == [0, 4]
    assert exact_duplicates(table, repeated_in(table), Seen()) == [4]


def test_ids_forged_to_collide_when_joined_are_kept() -> None:
    # "a\x00b" + "c" and "a" + "b\x00c" join to the same key: both become candidates, neither is a duplicate.
    table = _table([("a\x00b", "c"), ("a", "b\x00c"), ("a", "b\x00c")], ["x", "x", "x"])
    repeated = pa.table({"t": pa.array(["a"], pa.string()), "s": pa.array(["b\x00c"], pa.string())})
    assert _positions_of(table, repeated) == [0, 1, 2]
    assert exact_duplicates(table, repeated_in(table), Seen()) == [2]  # only the true copy of ("a", "b\x00c")


def test_repeated_ids_in_memory_match_the_duckdb_pass(tmp_path) -> None:
    import pyarrow.parquet as pq

    from otel_replay.storage.compact_steps import repeated_keys

    table = _table(
        [("t1", "s1"), ("t1", "s2"), (None, "s1"), (None, "s1"), ("t1", "s1"), ("t2", None), ("t2", None), ("t3", "s")],
        list("abcdefgh"),
    )
    path = tmp_path / "x.parquet"
    pq.write_table(table, path)

    def pairs(t: pa.Table) -> set[tuple[object, object]]:
        return set(zip(t.column("t").to_pylist(), t.column("s").to_pylist(), strict=True))

    assert pairs(repeated_in(table)) == pairs(repeated_keys([path])) == {("t1", "s1"), (None, "s1"), ("t2", None)}
