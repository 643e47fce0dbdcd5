"""Index keys held in memory answer exactly as the index's row groups do, and a warm store's chains stay exact.

A kind looked up twice in one index is held in memory (side_index._HELD) and
searched there from then on. These tests compare that answer with the row-group
answer for every kind, for indexes compaction did not write (unsorted, with
nulls), within a memory budget, and, end to end, a warm Store's chains with
the chains over every file on hostile data: copied and forged rows, repeated
span ids, outcomes stored under other correlation ids or none, and files newer
than the index.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otel_replay.query.store import Store
from otel_replay.storage import compact, files_for
from otel_replay.storage import side_index as si
from otel_replay.storage.manifest import partition_dirs
from otel_replay.storage.side_index import INDEX_KINDS, build_index, write_index

from .test_chain_lookup import ELSEWHERE, SECOND, TARGET, _hostile, _late, _lookup, _outcome_ids, _rows, _write


@pytest.fixture(autouse=True)
def _empty_held() -> Iterator[None]:
    si._HELD.clear()  # noqa: SLF001
    yield
    si._HELD.clear()  # noqa: SLF001


def _held_for(path: Path | str) -> set[str]:
    """The kinds of the index at ``path`` held in memory now."""
    return {kind for (where, _, kind) in si._HELD.entries if where == str(path)}  # noqa: SLF001


def _index(tmp_path: Path, *, files: int = 6, rows: int = 3000, seed: int = 9) -> tuple[Path, list]:
    rng = random.Random(seed)
    parts = []
    for f in range(files):
        ids = {
            kind: [f"{rng.getrandbits(40):010x}" if rng.random() > 0.05 else None for _ in range(rows)]
            for kind in INDEX_KINDS
        }
        ids["correlation_id"] = [f"trade-{rng.randrange(500):06d}" for _ in range(rows)]  # shared across files
        ids["session_id"] = [f"s-é{rng.randrange(50)}-\u4e2d" for _ in range(rows)]  # non-ASCII: UTF-8 order
        start = pa.array([10**18 + i for i in range(rows)], pa.timestamp("ns", tz="UTC"))
        parts.append((f"compact-g1-{f}-aaaaaaaaaaaa.parquet", pa.table({**ids, "start_time": start})))
    index = tmp_path / "_index-g1-aaaaaaaaaaaa.pq"
    write_index(build_index(parts), index)
    return index, parts


def _probes(index: Path) -> list[tuple[str, str]]:
    table = pq.read_table(index, columns=["kind", "key"])
    pairs = list(zip(table.column("kind").to_pylist(), table.column("key").to_pylist(), strict=True))
    probes = random.Random(1).sample(pairs, 600)
    for kind in INDEX_KINDS:  # absent keys: before, between and after the kind's keys
        probes += [(kind, ""), (kind, "0"), (kind, "zzzz"), (kind, "trade-000250x"), (kind, "\uffff")]
    return probes


def _hold_every_kind(index: Path) -> None:
    for _ in range(si._HOLD_AFTER):  # noqa: SLF001
        for kind in INDEX_KINDS:
            _lookup(index, [(kind, "absent")], loads=[1])  # noqa: SLF001


def test_held_keys_answer_as_the_row_groups_do(tmp_path: Path) -> None:
    index, parts = _index(tmp_path)
    probes = _probes(index)
    from_groups = [_lookup(index, [pair]) for pair in probes]  # noqa: SLF001  (no loads: row groups)
    assert not _held_for(index)
    _hold_every_kind(index)
    assert _held_for(index) == set(INDEX_KINDS)
    from_memory = [_lookup(index, [pair]) for pair in probes]  # noqa: SLF001
    assert from_memory == from_groups
    for (kind, key), got in zip(probes[:150], from_memory, strict=False):  # and both are the truth
        assert got == {name for name, t in parts if key in set(t.column(kind).to_pylist())}
    several = probes[:40]  # many ids at once, as an outcome lookup asks
    assert _lookup(index, several) == set().union(*from_groups[:40])  # noqa: SLF001


def test_an_index_compaction_did_not_write_is_searched_in_order(tmp_path: Path) -> None:
    """Unsorted keys, nulls: the held copy sorts them and leaves the nulls out; answers stay the row groups'."""
    index, _ = _index(tmp_path, files=3, rows=2000)
    table = pq.read_table(index)
    shuffled = table.take(pa.array(random.Random(5).sample(range(table.num_rows), table.num_rows)))
    schema = pa.schema([f.with_nullable(True) for f in table.schema], metadata=table.schema.metadata)
    nulls = pa.table(
        {"kind": ["correlation_id"], "key": [None], "file": ["x.parquet"], "min_start": [None], "max_start": [None],
         "rows": [1]},
        schema=schema,
    )
    foreign = tmp_path / "foreign" / "_index-g1-bbbbbbbbbbbb.pq"
    foreign.parent.mkdir()
    pq.write_table(pa.concat_tables([shuffled.cast(schema), nulls]), foreign, row_group_size=500)
    probes = _probes(index)
    expected = [_lookup(index, [pair]) for pair in probes]  # noqa: SLF001  (the sorted original)
    _hold_every_kind(foreign)
    assert _held_for(foreign) == set(INDEX_KINDS)
    assert [_lookup(foreign, [pair]) for pair in probes] == expected  # noqa: SLF001


def test_held_keys_stay_within_their_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index, _ = _index(tmp_path)
    sizes = {}
    handle, bounds, *_ = si._index_bounds(pq.ParquetFile(index))  # noqa: SLF001
    for kind in INDEX_KINDS:
        sizes[kind] = si._held_size(handle, si._kind_groups(bounds, kind))  # noqa: SLF001
    budget = 4 * max(sizes["correlation_id"], sizes["session_id"]) + 1
    assert 4 * sizes["record_id"] > budget  # record ids: more than a quarter of the budget
    monkeypatch.setattr(si, "HELD_KEYS_BYTES", budget)
    probes = _probes(index)
    expected = [_lookup(index, [pair]) for pair in probes]  # noqa: SLF001
    _hold_every_kind(index)
    held = _held_for(index)
    assert "record_id" not in held and held  # too big for one entry: stays on disk
    assert si._HELD.nbytes <= budget  # noqa: SLF001
    assert [_lookup(index, [pair]) for pair in probes] == expected  # noqa: SLF001


def test_held_kinds_in_use_are_kept_and_stale_ones_make_room(monkeypatch: pytest.MonkeyPatch) -> None:
    """When kinds in use fill the budget, new ones are declined (no reload at every lookup) until some go stale."""
    monkeypatch.setattr(si, "HELD_KEYS_BYTES", 1000)
    held = si._Held()  # noqa: SLF001

    def entry(nbytes: int) -> si._HeldKeys:  # noqa: SLF001
        keys = si._HeldKeys(pa.array(["k"]), pa.array(["f.parquet"]).dictionary_encode())  # noqa: SLF001
        keys.nbytes = nbytes
        return keys

    def offer(name: str, nbytes: int) -> bool:
        where = (name, None, "correlation_id")
        for _ in range(si._HOLD_AFTER):  # noqa: SLF001
            assert held.get(where) is None
        if not held.room_for(where, lambda: nbytes):
            return False
        held.put(where, entry(nbytes))
        return True

    assert not offer("big", 251)  # more than a quarter of the budget
    assert [offer(f"i{n}", 250) for n in range(5)] == [True, True, True, True, False]
    assert held.nbytes == 1000
    for name in ("i0", "i1"):  # two go unused for a while
        held.entries[(name, None, "correlation_id")].used -= 2 * si._STALE_SECONDS  # noqa: SLF001
    assert offer("i5", 250)  # stale entries made room; i4, declined before, may now come in too
    assert {name for name, _, _ in held.entries} == {"i2", "i3", "i5"} and held.nbytes == 750
    assert offer("i4", 250) and held.nbytes == 1000


def _copies(path: Path) -> str:
    """Arrival files with copied and forged rows of TARGET and SECOND: retries, a forged outcome and decision."""
    rows, schema = _rows(path)
    mine = [r for r in rows if r["correlation_id"] in (TARGET, SECOND)]
    decision = next(r for r in mine if r["replay_kind"] == "decision" and r["correlation_id"] == SECOND)
    forged_copy = dict(decision, record_id="e" * 32)  # same span id, other content: both rows kept, both shown
    forged_outcome = dict(next(r for r in rows if r["replay_kind"] == "outcome"))
    forged_outcome.update(
        span_id="00000000000000aa",
        correlation_id=TARGET,  # stored under the chain's id, for a decision of another chain
        start_time=decision["start_time"],
        outcome_decision_id=decision["record_id"],
    )
    first, last = partition_dirs(path)[0], partition_dirs(path)[-1]
    _write(first, "part-1900000000000000010-aaaaaaaaaaab.parquet", [*mine[:6], forged_copy], schema)
    _write(last, "part-1900000000000000011-aaaaaaaaaaac.parquet", [*mine[3:9], forged_outcome], schema)
    return str(forged_outcome["record_id"])


def _same_each_pass(store: Store, chains: list[str], passes: int = 2) -> None:
    """In each of ``passes`` passes, every chain looked up through the index equals the chain over every file.

    Nothing is written between the passes, so each chain over every file (the costly query) is read once. In the
    first pass the first chain's lookup reads the index's row groups and the second's loads its keys
    (``_HOLD_AFTER``); in the second every chain is answered from the held keys, as it would be in any later pass.
    """
    full = {chain_id: store.run("chains/trade", chain_id=chain_id, chain_limit=101) for chain_id in chains}
    for _ in range(passes):
        for chain_id in chains:
            narrowed = store.run_for("chains/trade", {"correlation_id": chain_id}, chain_id=chain_id, chain_limit=101)
            assert narrowed == full[chain_id], chain_id


def test_a_warm_store_answers_hostile_chains_as_over_every_file(make_dataset) -> None:
    path, _ = make_dataset(spans=3000, ids=300)
    hostile = _hostile(path)
    forged_outcome = _copies(path)
    compact(path, grace_seconds=0, target_rows=300)
    _late(path, SECOND, "part-1900000000000000012-cccccccccccc.parquet")  # newer than the index
    chains = [TARGET, SECOND, ELSEWHERE, "trade-000000000", "trade-000000299", "late-elsewhere", "absent"]
    chains += [f"trade-{i:09d}" for i in random.Random(4).sample(range(300), 12)]
    indexes = [str(next(p.glob("_index-*.pq"))) for p in partition_dirs(path)]
    with Store(path) as store:
        _same_each_pass(store, chains)  # the first lookups read row groups; then the held keys answer
        assert all({"correlation_id", "outcome_decision_id"} <= _held_for(index) for index in indexes)
        found = _outcome_ids(store.run_for("chains/trade", {"correlation_id": TARGET}, chain_id=TARGET))
        assert {hostile["elsewhere"], hostile["nowhere"]} <= found and hostile["ambiguous"] not in found
        second = store.run_for("chains/trade", {"correlation_id": SECOND}, chain_id=SECOND, chain_limit=101)
        traces = [json.loads(r["body"]) for r in second if r["layer"] == "trace"]
        assert len(traces) == len({t["span_id"] for t in traces})  # copies and the forgery: one row a span id
        assert forged_outcome in _outcome_ids(second)  # stored under TARGET's id, found for SECOND's decision
        # a compaction replaces the indexes: the held keys of the old ones never answer for the new
        compact(path, grace_seconds=0, target_rows=300)
        store.refresh()
        assert files_for(path, correlation_id=SECOND) != []
        _same_each_pass(store, chains[:8])
