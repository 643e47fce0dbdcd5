"""A day no compaction has indexed: lookups find their files by the keys in the footers, and miss nothing."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import otel_replay
from otel_replay.exporters.id_keys import ID_KEYS_METADATA_KEY, encode_keys, footer_keys, id_key
from otel_replay.exporters.key_log import KEY_LOG_NAME, parse_lines
from otel_replay.query import engine
from otel_replay.query.store import Store
from otel_replay.storage import compact, live_files
from otel_replay.storage.manifest import partition_dirs

from .conftest import load_generator

CHAIN = "trade-000000042"


def _footer(path: str | Path) -> bytes:
    data = Path(path).read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    return data[-8 - length : -8]


def test_a_lookup_on_an_uncompacted_day_reads_only_the_files_whose_footer_keys_match(make_dataset) -> None:
    path, _ = make_dataset(spans=2000, ids=200, rows_per_file=20)
    files = live_files(path)
    assert all(footer_keys(_footer(f)) is not None for f in files)  # every file the writer wrote carries keys
    with Store(path) as store, Store(path) as everything:
        for chain_id in (CHAIN, "trade-000000007", "trade-000000199", "absent"):
            full = everything.run("chains/trade", chain_id=chain_id)
            assert store.run_for("chains/trade", {"correlation_id": chain_id}, chain_id=chain_id) == full
            assert (len(full) > 0) == (chain_id != "absent")
        holding = store.engine._candidates([("correlation_id", CHAIN)])
        assert 0 < len(holding) <= 4 < len(files)
        assert store.engine._tail.files_read == 0  # no file was opened to learn its ids


def test_an_older_writers_file_without_keys_is_read_and_one_forging_keys_in_a_value_is_still_found(
    make_dataset,
) -> None:
    path, _ = make_dataset(spans=600, ids=60, rows_per_file=20)
    folder = partition_dirs(path)[0]
    source = pq.read_table(live_files(path))
    mine = source.filter(pc.equal(source.column("correlation_id"), CHAIN))
    assert mine.num_rows
    # Written as an older otel-replay wrote: no keys in the footer; a span value shaped like the keys' pair
    # (in the statistics) claims the file holds only another trade.
    value = encode_keys([id_key("correlation_id", "trade-000000001")])
    forged = (b"\x18\x13" + ID_KEYS_METADATA_KEY + b"\x18" + bytes([len(value)]) + value + b"\x00").decode("ascii")
    status = pa.array([forged] * mine.num_rows, pa.string())
    old = mine.set_column(mine.schema.get_field_index("status_message"), "status_message", status)
    target = folder / "part-old-bcbcbcbcbcbc.parquet"
    pq.write_table(old, target)
    assert ID_KEYS_METADATA_KEY in _footer(target) and footer_keys(_footer(target)) is None
    with Store(path) as store, Store(path) as everything:
        full = everything.run("chains/trade", chain_id=CHAIN)
        found = store.run_for("chains/trade", {"correlation_id": CHAIN}, chain_id=CHAIN)
        assert found == full
        assert any(row["record_id"] in set(old.column("record_id").to_pylist()) for row in found)
        assert str(target) in store.engine._candidates([("correlation_id", CHAIN)])
        assert store.engine._tail.files_read == 1  # only the file without keys was opened for its ids


def test_compacted_files_carry_no_keys_of_the_small_files_they_replace(make_dataset) -> None:
    path, _ = make_dataset(spans=1000, ids=100, rows_per_file=20)
    logs = sorted(path.glob(f"spans/date=*/{KEY_LOG_NAME}"))
    assert logs and all(parse_lines(log.read_bytes())[0] for log in logs)
    compact(path, grace_seconds=0, target_rows=300)
    assert not any(log.exists() for log in logs)  # every file it named was replaced: pruned away
    for file in live_files(path):
        assert footer_keys(_footer(file)) is None
        assert ID_KEYS_METADATA_KEY not in (pq.read_metadata(file).metadata or {})
    with Store(path) as store, Store(path) as everything:
        full = everything.run("chains/trade", chain_id=CHAIN)
        assert full and store.run_for("chains/trade", {"correlation_id": CHAIN}, chain_id=CHAIN) == full


def test_gate_records_are_found_by_their_decision_id_in_the_files_holding_them_only(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", "footer-keys-test-key-0123456789abcdef")
    dataset = tmp_path / "traces"

    class Rail:
        def commit(self, action: otel_replay.Action) -> dict[str, object]:
            if action.arguments["order"] == "o-3":
                raise KeyboardInterrupt  # did the refund go through? the intent has no commit record
            return {"receipt_id": "r-" + action.arguments["order"]}

        def compensate(self, receipt: object, *, idempotency_key: str) -> None:
            pass

    gate = otel_replay.ActionGate(Rail(), dataset=dataset)
    decided = {}
    with otel_replay.configure(dataset, set_global=False):
        for n in range(6):
            order = f"o-{n}"
            try:
                snapshot = otel_replay.DependencySnapshot({})
                with otel_replay.audit("refund", snapshot=snapshot, correlation_id=order) as d:
                    action = otel_replay.Action("refund", {"order": order}, cost=1.0)
                    d.act(action)
                    gate.commit(action, record_id=d.record_id)
            except KeyboardInterrupt:
                pass
            decided[order] = d.record_id
    with otel_replay.open(dataset) as store:
        files = store.files
        holding = store.engine._candidates([("gate_decision_id", decided["o-3"])])
        assert 0 < len(holding) < len(files)
        [(intent_id, action)] = store.unknown_commits_for(decided["o-3"])
        assert action.arguments == {"order": "o-3"}
        assert store.unknown_commits_for(decided["o-2"]) == []
        assert store.engine._tail.files_read == 0


def test_with_no_side_index_a_big_file_without_keys_is_left_to_the_query_not_read_for_its_ids(
    make_dataset, monkeypatch
) -> None:
    path, _ = make_dataset(spans=600, ids=60, rows_per_file=20)
    source = pq.read_table(live_files(path))
    mine = source.filter(pc.equal(source.column("correlation_id"), CHAIN))
    target = partition_dirs(path)[0] / "part-old-cdcdcdcdcdcd.parquet"
    pq.write_table(mine, target)  # no keys: an older writer's
    monkeypatch.setattr(engine, "_READ_IDS_UP_TO", target.stat().st_size - 1)  # "big"
    with Store(path) as store, Store(path) as everything:
        full = everything.run("chains/trade", chain_id=CHAIN)
        assert store.run_for("chains/trade", {"correlation_id": CHAIN}, chain_id=CHAIN) == full
        assert str(target) in store.engine._candidates([("correlation_id", "trade-000000001")])
        assert store.engine._tail.files_read == 0


def test_a_day_read_through_its_key_logs_finds_what_a_scan_finds_and_a_new_arrival_is_logged(tmp_path) -> None:
    path = tmp_path / "ds"
    load_generator().generate(path, spans=200, ids=20, days=1, rows_per_file=10, duplicates=0.0, seed=11)
    logs = sorted(path.glob(f"spans/date=*/{KEY_LOG_NAME}"))
    assert logs and sum(len(parse_lines(log.read_bytes())[0]) for log in logs) == len(live_files(path))
    with Store(path) as store, Store(path) as everything:
        for chain_id in ("trade-000000007", "absent"):
            full = everything.run("chains/trade", chain_id=chain_id)
            assert store.run_for("chains/trade", {"correlation_id": chain_id}, chain_id=chain_id) == full
            assert (len(full) > 0) == (chain_id != "absent")
        assert store.engine._tail.files_read == 0
        before = set(live_files(path))
        load_generator().generate(path, spans=20, ids=2, days=1, rows_per_file=10, duplicates=0.0, seed=12)
        arrivals = {Path(f).name for f in live_files(path) if f not in before}
        assert arrivals and arrivals <= {name for log in logs for name in parse_lines(log.read_bytes())[0]}
        store.refresh()  # the new lines are read from where the last read stopped
        everything.refresh()
        chain_id = "trade-000000001"
        full = everything.run("chains/trade", chain_id=chain_id)
        assert full and store.run_for("chains/trade", {"correlation_id": chain_id}, chain_id=chain_id) == full
        assert store.engine._tail.files_read == 0
