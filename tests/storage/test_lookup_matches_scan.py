"""A lookup answers as a full scan does: each case below once answered differently.

- an outcome stored only in a version 1 file that arrived after compaction (its decision id only in the
  JSON) was missed by a lookup by decision id;
- ``Store.run`` skipped re-setting a variable when the caller's list had changed since the last call;
- ``run_for`` of ``calibration`` / ``decision_summary`` failed on a fresh store;
- copies of one decision tied in ``traces`` and came back in any order;
- a shared DuckDB database file took the store's lean planning setting into other connections;
- a facts file with a deeply nested footer raised out of ``calibration()``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import duckdb
import pyarrow.parquet as pq

from otel_replay.query.store import Store
from otel_replay.storage import compact

from .test_facts import decision, outcome, rid, write


def _compacted(tmp_path: Path) -> Path:
    ds = tmp_path / "ds"
    write(ds, 0, "0001", [decision(1, 0.5, at=1), decision(2, 0.6, at=2), outcome(101, 1, True)])
    compact(ds, grace_seconds=0)
    return ds


def test_an_outcome_only_in_a_version_1_file_after_compaction_is_found_by_decision_id(tmp_path: Path) -> None:
    ds = _compacted(tmp_path)
    write(ds, 0, "0002", [outcome(102, 2, False, at=50)], version_1=True)  # an older writer's file
    store = Store(ds)
    full = store.run("record", decision_ids=[rid(2)])
    assert len(full) == 1
    narrowed = store.run_for("record", {"outcome_decision_id": rid(2)}, decision_ids=[rid(2)])
    assert narrowed == full
    # The same file arriving after the store was opened (found without a refresh):
    write(ds, 0, "0003", [outcome(103, 1, False, at=60)], version_1=True)
    later = store.run_for("record", {"outcome_decision_id": rid(1)}, decision_ids=[rid(1)])
    assert sorted(row["record_id"] for row in later) == sorted([rid(101), rid(103)])


def test_a_list_changed_by_the_caller_is_set_again(tmp_path: Path) -> None:
    ds = _compacted(tmp_path)
    write(ds, 0, "0002", [outcome(102, 2, False, at=50)])
    store = Store(ds)
    ids = [rid(1)]
    assert len(store.run("record", decision_ids=ids)) == 1
    ids.append(rid(2))  # the same list object, changed in place
    assert len(store.run("record", decision_ids=ids)) == 2
    assert len(store.run("record", decision_ids=list(ids))) == 2


def test_run_for_of_the_facts_queries_gives_runs_rows(tmp_path: Path) -> None:
    ds = _compacted(tmp_path)
    fresh = Store(ds)
    narrowed = fresh.run_for("decision_summary", {"correlation_id": "c-1"})
    assert narrowed == Store(ds).run("decision_summary")
    assert fresh.run_for("calibration", {"correlation_id": "c-1"}) == fresh.run("calibration")


def test_copies_of_one_decision_come_back_in_one_order(tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    rows = []
    for k in range(20):
        row = decision(1000, 0.5, at=1, trace=f"{k:032x}", span_id=f"{k + 1:016x}")
        row["correlation_id"] = "c-x"
        rows.append(row)
    for i in range(0, 20, 5):
        write(ds, 0, f"{i:04d}", rows[i : i + 5])
    compact(ds, grace_seconds=0, target_rows=7)
    store = Store(ds)
    seen = set()
    for _ in range(6):
        for rows_back in (
            store.run_for("traces", {"correlation_id": "c-x"}, correlation_id="c-x", trace_limit=5),
            store.run("traces", correlation_id="c-x", trace_limit=5),
        ):
            seen.add(tuple(json.loads(row["body"])["span_id"] for row in rows_back))
    assert seen == {tuple(f"{k + 1:016x}" for k in range(5))}


def test_a_shared_database_file_is_never_planned_lean(tmp_path: Path) -> None:
    ds = _compacted(tmp_path)
    db = str(tmp_path / "shared.duckdb")
    store = Store(ds, database=db)
    with duckdb.connect(db) as other:  # the same database instance, as long as the store keeps it open
        store.run_for("chains/trade", {"correlation_id": "c-1"}, chain_id="c-1")
        assert other.execute("SELECT current_setting('disabled_optimizers')").fetchone() == ("",)
    store.close()
    memory = Store(ds)
    memory.run_for("chains/trade", {"correlation_id": "c-1"}, chain_id="c-1")
    assert memory.engine._con.execute("SELECT current_setting('disabled_optimizers')").fetchone()[0] != ""


def test_a_deeply_nested_facts_footer_falls_back_to_the_spans(tmp_path: Path) -> None:
    ds = _compacted(tmp_path)
    expected = Store(ds).calibration()
    (facts,) = (ds / "spans" / "date=2026-01-01").glob("_facts-*.pq")
    table = pq.read_table(facts)
    meta = dict(table.schema.metadata or {})
    depth = sys.getrecursionlimit() * 20
    meta[b"otel_replay.facts.files"] = b"[" * depth + b"]" * depth
    pq.write_table(table.replace_schema_metadata(meta), facts)
    assert Store(ds).calibration() == expected
