"""Store reads only the files the side index names for a chain or record lookup, and gets the same answer."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from otel_replay import CorruptFileError, ReplayBuilder
from otel_replay.query.store import Store
from otel_replay.storage import compact, files_for, live_files
from otel_replay.storage.manifest import partition_dirs

from ..query.test_store import damage_pages

CHAINS = ("trade-000000000", "trade-000000042", "trade-000000123", "trade-000000299", "absent")


def _with_arrival(path: Path) -> Path:
    """Compact ``path`` into small files, then add a file newer than the index (3 rows of chain 000000000)."""
    compact(path, grace_seconds=0, target_rows=300)
    late = partition_dirs(path)[0] / "part-9-cdcdcdcdcdcd.parquet"
    pq.write_table(pq.read_table(live_files(path)[0]).slice(0, 3), late)
    return late


def _record_ids(path: Path, chain_id: str) -> list[str]:
    con = duckdb.connect()
    rows = con.execute(
        "SELECT DISTINCT record_id FROM read_parquet(?) "
        "WHERE correlation_id = ? AND replay_kind IN ('decision', 'outcome', 'audit_entry')",
        [live_files(path), chain_id],
    ).fetchall()
    return sorted(r[0] for r in rows)


def test_lookups_over_the_index_equal_lookups_over_every_file(make_dataset, tmp_path: Path) -> None:
    path, _ = make_dataset(spans=3000, ids=300)
    plain = tmp_path / "plain"
    shutil.copytree(path, plain)  # the same spans, never compacted: no index
    late = _with_arrival(path)
    shutil.copy(late, partition_dirs(plain)[0] / late.name)
    with Store(path) as store, Store(plain) as unindexed:
        assert files_for(plain, correlation_id=CHAINS[0]) is None
        late_chain = str(pq.read_table(late).column("correlation_id")[0])
        for chain_id in (*CHAINS, late_chain):
            narrowed = files_for(path, correlation_id=chain_id)
            assert narrowed is not None and len(narrowed) < len(live_files(path))
            assert str(late) in narrowed  # newer than the index: always read
            full = store.run("chains/trade", chain_id=chain_id)
            assert store.run_for("chains/trade", {"correlation_id": chain_id}, chain_id=chain_id) == full
            assert (len(full) > 3) == (chain_id != "absent")
            assert store.run_for("chains/trade", {"correlation_id": None}, chain_id=chain_id) == full  # no id
            built = ReplayBuilder(store).build("trade", chain_id).to_json()
            assert built == ReplayBuilder(unindexed).build("trade", chain_id).to_json()
            assert store.traces(correlation_id=chain_id) == unindexed.traces(correlation_id=chain_id)
            for record_id in _record_ids(path, chain_id)[:4]:
                rows = store.run("record", record_id=record_id)
                assert rows and store.run_for("record", {"record_id": record_id}, record_id=record_id) == rows
        session = "session-00000004"
        assert ReplayBuilder(store).build("session", session).to_json() == (
            ReplayBuilder(unindexed).build("session", session).to_json()
        )
        assert store.run_for("record", {"record_id": "no-such-record"}, record_id="no-such-record") == []


def test_a_chain_lookup_never_opens_the_files_the_index_rules_out(make_dataset) -> None:
    """A damaged file that cannot hold the chain breaks a full scan, not the narrowed lookup."""
    path, _ = make_dataset(spans=3000, ids=300)
    _with_arrival(path)
    chain_id = "trade-000000123"
    with Store(path) as store:
        expected = store.run("chains/trade", chain_id=chain_id)
    assert expected
    narrowed = set(files_for(path, correlation_id=chain_id) or [])
    victim = Path(next(f for f in live_files(path) if f not in narrowed))
    original = victim.read_bytes()
    damaged = damage_pages(victim, victim.with_name(".damaged.tmp"))
    damaged.replace(victim)
    try:
        with Store(path) as store:
            assert store.run_for("chains/trade", {"correlation_id": chain_id}, chain_id=chain_id) == expected
            record_id = _record_ids(path, chain_id)[0]
            assert store.run_for("record", {"record_id": record_id}, record_id=record_id)
            # a query that reads every page of every file finds the damage (the chain itself may skip the
            # victim's pages by statistics and bloom filters even without the index)
            with pytest.raises(CorruptFileError, match=victim.name):
                store.rows("SELECT count(*) FROM spans WHERE length(attributes) >= 0 AND length(name) >= 0")
    finally:
        victim.write_bytes(original)


def test_a_compaction_after_open_is_followed_by_narrowed_lookups(make_dataset) -> None:
    """The Store's own file list predates the compaction; the index's answer is used as it is."""
    path, _ = make_dataset(spans=1500, ids=150)
    chain_id = "trade-000000077"
    with Store(path) as store:
        before = store.run("chains/trade", chain_id=chain_id)
        compact(path, grace_seconds=0, target_rows=300)
        assert not set(files_for(path, correlation_id=chain_id) or []) & set(store.files)
        assert store.run_for("chains/trade", {"correlation_id": chain_id}, chain_id=chain_id) == before


def test_only_a_narrowed_lookup_plans_without_the_costly_optimizers(make_dataset) -> None:
    """Point lookups skip optimizers not worth their planning time; a query over every file keeps them all."""
    path, _ = make_dataset(spans=3000, ids=300)
    compact(path, grace_seconds=0, target_rows=300)

    def disabled(store: Store) -> str:
        row = store.engine._con.execute("SELECT current_setting('disabled_optimizers')").fetchone()  # noqa: SLF001
        assert row is not None
        return str(row[0])

    with Store(path) as store:
        chain_id = CHAINS[0]
        full = store.run("chains/trade", chain_id=chain_id)
        assert disabled(store) == ""
        assert store.run_for("chains/trade", {"correlation_id": chain_id}, chain_id=chain_id) == full
        assert "join_order" in disabled(store) and "filter_pushdown" not in disabled(store)
        assert store.run_for("chains/trade", {"correlation_id": CHAINS[1]}, chain_id=CHAINS[1]) == store.run(
            "chains/trade", chain_id=CHAINS[1]
        )
        assert disabled(store) == ""  # run() over every file: every optimizer again
        store.calibration()
        assert disabled(store) == ""
