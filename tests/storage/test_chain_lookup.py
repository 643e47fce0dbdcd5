"""A chain narrowed by the side index gives exactly the rows of the chain over every file, hostile data included.

The trade chain joins each decision's first outcome, and an outcome may be
stored anywhere: under another correlation id, under none, in another day's
partition, in a file newer than the index, in a version 1 file that keeps the
decision id only in its JSON. ``Store.run_for`` must find it wherever it is
(``Store.run`` over every file is the reference), and leave out what the
views leave out (rows with duplicate JSON keys, repeated spans).
"""

from __future__ import annotations

import json
import random
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otel_replay import CorruptFileError
from otel_replay import semconv as sc
from otel_replay.integrity import stored_record
from otel_replay.location import resolve
from otel_replay.query.store import Store
from otel_replay.storage import compact, files_for, live_files
from otel_replay.storage.backend import LocalBackend
from otel_replay.storage.manifest import partition_dirs
from otel_replay.storage.side_index import (
    INDEX_KINDS,
    _groups_holding,
    _index_bounds,
    build_index,
    write_index,
)
from otel_replay.storage.side_index import _lookup as _lookup_through

from .._versions import rewrite_as_version_1
from ..query.test_store import damage_pages


def _lookup(path: Path, wanted: list[tuple[str, str]], loads: list[int] | None = None) -> set[str] | None:
    """The side index's lookup of ``wanted`` in the local index file ``path`` (through the local backend)."""
    return _lookup_through(path, wanted, LocalBackend(resolve(path.parent)), loads)

TARGET = "trade-000000042"  # the chain the hostile rows aim at
ELSEWHERE = "trade-000000007"  # another chain: its compacted file is not the target's
SECOND = "trade-000000123"
_SECOND = timedelta(seconds=1)


def _rows(path: Path) -> tuple[list[dict[str, Any]], pa.Schema]:
    files = live_files(path)
    tables = [pq.read_table(f, partitioning=None) for f in files]
    schema = tables[0].schema
    return pa.concat_tables([t.cast(schema) for t in tables]).to_pylist(), schema


def _write(partition: Path, name: str, rows: list[dict[str, Any]], schema: pa.Schema) -> Path:
    target = partition / name
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), target, compression="zstd")
    return target


def _outcome_like(template: dict[str, Any], decision: dict[str, Any], **changes: Any) -> dict[str, Any]:
    rng = random.Random(str(changes))
    row = dict(template)
    row.update(
        span_id=f"{rng.getrandbits(64):016x}",
        record_id=f"{rng.getrandbits(128):032x}",
        outcome_decision_id=decision["record_id"],
        start_time=decision["start_time"] + _SECOND,  # long before the chain's own outcome
        end_time=decision["start_time"] + 2 * _SECOND,
    )
    row.update(changes)
    return row


def _hostile(path: Path) -> dict[str, str]:
    """Arrival files (before compaction) with outcomes of TARGET's decisions stored far from it.

    Returns what each hostile row is (outcome ids that must, or must not, show in the chain).
    """
    rows, schema = _rows(path)
    decisions = sorted(
        (r for r in rows if r["correlation_id"] == TARGET and r["replay_kind"] == "decision"),
        key=lambda r: r["start_time"],
    )
    assert len(decisions) >= 3
    template = next(r for r in rows if r["replay_kind"] == "outcome")
    other_day, same_day = partition_dirs(path)[-1], partition_dirs(path)[0]
    elsewhere = _outcome_like(template, decisions[0], correlation_id=ELSEWHERE, outcome_correct=False)
    nowhere = _outcome_like(template, decisions[1], correlation_id=None, session_id=None)
    ambiguous = _outcome_like(  # the earliest of all, but its JSON repeats a key: the views leave it out
        template,
        decisions[2],
        correlation_id=ELSEWHERE,
        start_time=decisions[2]["start_time"],
        attributes='{"replay.outcome.note":"a","replay.outcome.note":"b"}',
    )
    forged_decision = dict(decisions[0])
    forged_decision.update(
        span_id="00000000000000ff",
        record_id="f" * 32,
        attributes=decisions[0]["attributes"][:-1] + ',"replay.decision.rationale":"x","replay.decision.rationale":"y"}'
        if decisions[0]["attributes"]
        else '{"k":1,"k":2}',
    )
    _write(other_day, "part-1900000000000000000-aaaaaaaaaaaa.parquet", [elsewhere, ambiguous], schema)
    _write(same_day, "part-1900000000000000001-bbbbbbbbbbbb.parquet", [nowhere, forged_decision], schema)
    return {"elsewhere": elsewhere["record_id"], "nowhere": nowhere["record_id"], "ambiguous": ambiguous["record_id"]}


def _late(path: Path, chain_id: str, name: str) -> Path:
    """A file newer than the index: an outcome of ``chain_id``'s first decision under another id, and repeats."""
    rows, schema = _rows(path)
    mine = [r for r in rows if r["correlation_id"] == chain_id]
    decision = min((r for r in mine if r["replay_kind"] == "decision"), key=lambda r: r["start_time"])
    template = next(r for r in rows if r["replay_kind"] == "outcome")
    late_outcome = _outcome_like(template, decision, correlation_id="late-elsewhere", start_time=decision["start_time"])
    return _write(partition_dirs(path)[0], name, [late_outcome, *mine[:4]], schema)  # mine[:4]: retried spans


def _outcome_ids(rows: list[dict[str, Any]]) -> set[str]:
    return {json.loads(r["body"]).get("outcome_id") for r in rows if r["layer"] == "trace"} - {None}


def _same_outcome_rows(store: Store, decision_ids: list[str]) -> int:
    """The outcome rows Store's verified lookups read (narrowed by decision id) equal those over every file."""
    narrowed = sorted(map(repr, store.record_rows(decision_ids=decision_ids)))
    full = sorted(repr(stored_record(row)) for row in store.run("record", decision_ids=decision_ids))
    assert narrowed == full
    return len(full)


def _same(store: Store, chain_id: str, query: str = "chains/trade", key: str = "correlation_id") -> list[dict]:
    full = store.run(query, chain_id=chain_id, chain_limit=101)
    narrowed = store.run_for(query, {key: chain_id}, chain_id=chain_id, chain_limit=101)
    assert narrowed == full, chain_id
    return full


def test_outcomes_stored_anywhere_are_found_through_the_index(make_dataset) -> None:
    path, _ = make_dataset(spans=3000, ids=300)
    hostile = _hostile(path)
    compact(path, grace_seconds=0, target_rows=300)  # many small sorted files
    late = _late(path, SECOND, "part-1900000000000000002-cccccccccccc.parquet")
    narrowed = files_for(path, correlation_id=TARGET)
    assert narrowed is not None and str(late) in narrowed
    holding = files_for(path, correlation_id=ELSEWHERE) or []
    assert not set(holding) & set(narrowed) - {str(late)}  # the hostile outcome's file is not the chain's
    with Store(path) as store:
        chain = _same(store, TARGET)
        found = _outcome_ids(chain)
        assert hostile["elsewhere"] in found and hostile["nowhere"] in found  # the earliest outcome wins, anywhere
        assert hostile["ambiguous"] not in found  # duplicate keys: left out, the chain's own outcome stands
        assert len(found) == 3
        assert not any(r["record_id"] == "f" * 32 for r in chain)  # forged decision: ambiguous
        assert _same_outcome_rows(store, _decision_ids(path)) == 4  # the chain's own, elsewhere, nowhere, ambiguous
        second = _same(store, SECOND)
        assert any(json.loads(r["body"]).get("outcome_correct") is not None for r in second)
        assert len(second) == len({r["record_id"] for r in second})  # retried spans count once
        for chain_id in ("trade-000000000", "trade-000000299", ELSEWHERE, "absent"):
            _same(store, chain_id)
        _same(store, "session-00000004", "chains/session", "session_id")
        assert store.run_for("traces", {"correlation_id": TARGET}, correlation_id=TARGET) == store.run(
            "traces", correlation_id=TARGET
        )


def test_a_warm_store_follows_new_outcomes_and_a_compaction(make_dataset) -> None:
    path, _ = make_dataset(spans=3000, ids=300)
    compact(path, grace_seconds=0, target_rows=300)
    with Store(path) as store:
        before = _same(store, TARGET)
        _late(path, TARGET, "part-1900000000000000003-dddddddddddd.parquet")  # newer than the index
        store.refresh()
        after = _same(store, TARGET)
        assert _outcome_ids(after) != _outcome_ids(before)
        compact(path, grace_seconds=0, target_rows=300)  # the late outcome moves into a compacted file
        assert store.run_for("chains/trade", {"correlation_id": TARGET}, chain_id=TARGET, chain_limit=101) == after
        assert _same(store, TARGET) == after


def test_a_version_1_file_is_searched_for_outcomes(make_dataset) -> None:
    """A version 1 outcome names its decision only in the JSON: nothing indexes it, so every file is read."""
    path, _ = make_dataset(spans=3000, ids=300)
    decisions = _decision_ids(path)
    rows, schema = _rows(path)  # an outcome whose decision id is only in its JSON, stored far from the chain
    template = next(r for r in rows if r["replay_kind"] == "outcome")
    decision = next(r for r in rows if r["record_id"] == decisions[1])
    json_only = _outcome_like(template, decision, correlation_id=ELSEWHERE, outcome_decision_id=None)
    json_only["attributes"] = json.dumps({**json.loads(template["attributes"]), sc.OUTCOME_DECISION_ID: decisions[1]})
    _write(partition_dirs(path)[-1], "part-1900000000000000005-ffffffffffff.parquet", [json_only], schema)
    compact(path, grace_seconds=0, target_rows=300)
    late = rewrite_as_version_1(_late(path, TARGET, "part-1900000000000000004-eeeeeeeeeeee.parquet"))
    assert pq.read_metadata(late).metadata[b"otel_replay.schema_version"] == b"1"
    with Store(path) as store:
        chain = _same(store, TARGET)
        # the chain's own outcome, the version 1 one and the JSON-only one (found by its JSON once a version 1
        # file is there, in every file: the store reads them all)
        assert json_only["record_id"] in _outcome_ids(chain) and len(_outcome_ids(chain)) == 3
        assert _same_outcome_rows(store, decisions) == 3
        _same(store, SECOND)


def test_a_damaged_file_holding_an_outcome_is_named_or_skipped(make_dataset) -> None:
    path, _ = make_dataset(spans=3000, ids=300)
    hostile = _hostile(path)
    compact(path, grace_seconds=0, target_rows=300)
    narrowed = set(files_for(path, correlation_id=TARGET) or [])
    # the compacted file holding the outcome stored under ELSEWHERE: read only for the outcome
    (victim,) = [Path(f) for f in files_for(path, record_id=hostile["elsewhere"]) or [] if f not in narrowed]
    assert str(victim) in (files_for(path, outcome_decision_id=_decision_ids(path)) or [])
    damage_pages(victim, victim.with_name(".damaged.tmp")).replace(victim)
    with Store(path) as store, pytest.raises(CorruptFileError, match=victim.name):
        store.run_for("chains/trade", {"correlation_id": TARGET}, chain_id=TARGET, chain_limit=101)
    with Store(path, skip_corrupt=True) as store:
        chain = _same(store, TARGET)
        assert [p.path for p in store.skipped] == [str(victim)]
        assert hostile["elsewhere"] not in _outcome_ids(chain)


def _decision_ids(path: Path) -> list[str]:
    rows, _ = _rows(path)
    return [r["record_id"] for r in rows if r["correlation_id"] == TARGET and r["replay_kind"] == "decision"]


def test_an_index_from_before_outcomes_were_indexed_reads_the_whole_partition(make_dataset) -> None:
    """An index without the kinds list in its metadata covers the four original kinds only."""
    path, _ = make_dataset(spans=1500, ids=150)
    compact(path, grace_seconds=0, target_rows=300)
    partition = partition_dirs(path)[0]
    (index,) = partition.glob("_index-*.pq")
    table = pq.read_table(index)
    old = table.filter(pa.compute.not_equal(table.column("kind"), "outcome_decision_id")).replace_schema_metadata(None)
    pq.write_table(old, index, row_group_size=64)
    assert _lookup(index, [("outcome_decision_id", "x")]) is None
    assert _lookup(index, [("correlation_id", "absent")]) == set()
    got = files_for(path, outcome_decision_id=["x"]) or []
    assert {str(p) for p in live_files(path) if Path(p).parent == partition} <= set(got)
    with Store(path) as store:
        _same(store, TARGET)


def test_the_binary_search_over_index_row_groups_finds_what_a_scan_finds(tmp_path: Path) -> None:
    rng = random.Random(9)
    parts = []
    for f in range(6):
        n = 3000
        ids = {
            kind: [f"{rng.getrandbits(40):010x}" if rng.random() > 0.05 else None for _ in range(n)]
            for kind in INDEX_KINDS
        }
        ids["correlation_id"] = [f"trade-{rng.randrange(500):06d}" for _ in range(n)]  # shared across files
        start = pa.array([10**18 + i for i in range(n)], pa.timestamp("ns", tz="UTC"))
        parts.append((f"compact-g1-{f}-aaaaaaaaaaaa.parquet", pa.table({**ids, "start_time": start})))
    index = tmp_path / "_index-g1-aaaaaaaaaaaa.pq"
    write_index(build_index(parts), index)
    handle, bounds, regular, irregular, kinds = _index_bounds(pq.ParquetFile(index))
    assert kinds == set(INDEX_KINDS) and len(bounds) > 20 and regular and irregular  # some groups span two kinds
    table = pq.read_table(index, columns=["kind", "key"])
    pairs = list(zip(table.column("kind").to_pylist(), table.column("key").to_pylist(), strict=True))
    pairs = random.Random(1).sample(pairs, 2000)
    pairs += [("correlation_id", ""), ("correlation_id", "zzzz"), ("a", "b"), ("zz", ""), ("record_id", "0")]
    for pair in pairs:
        scan = [i for i, (kmin, vmin, kmax, vmax) in enumerate(bounds) if (kmin, vmin) <= pair <= (kmax, vmax)]
        assert sorted(_groups_holding(bounds, regular, irregular, pair)) == scan, pair
    every = {name for name, _ in parts}
    for kind, key in pairs[:200]:
        holding = {name for name, t in parts if key in set(t.column(kind).to_pylist())} if kind in kinds else every
        assert _lookup(index, [(kind, key)]) == holding
