"""Files the store did not expect: unnamed compacted files are read, never deleted; bad files are named."""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otel_replay.errors import CorruptFileError, DatasetError
from otel_replay.query.store import Store
from otel_replay.storage import compact, live_files
from otel_replay.storage.compact_steps import Seen, exact_duplicates, repeated_in
from otel_replay.storage.manifest import MANIFEST_NAME, partition_dirs, read_manifest, write_manifest
from otel_replay.storage.retention import drop_older_than
from otel_replay.storage.side_index import files_for

from .conftest import count_rows, load_generator


def _spans(path: Path) -> int:
    with Store(path, keys=[], require_signed=False) as store:
        return int(store.rows("SELECT count(*) AS n FROM spans")[0]["n"])


def _compacted(partition: Path) -> list[str]:
    return sorted(n for n in os.listdir(partition) if n.startswith("compact-g"))


def test_a_lost_manifest_hides_nothing_and_the_next_compaction_deletes_nothing(make_dataset, caplog) -> None:
    path, figures = make_dataset(spans=600, ids=60, duplicates=0.0)
    compact(path, grace_seconds=0)
    for partition in partition_dirs(path):
        (partition / MANIFEST_NAME).unlink()  # a restore of *.parquet only
    with caplog.at_level(logging.WARNING, logger="otel_replay"):
        assert count_rows(live_files(path)) == (figures["unique_spans"],) * 2
    assert "no manifest names" in caplog.text
    assert _spans(path) == figures["unique_spans"]
    compact(path, grace_seconds=0)
    assert count_rows(live_files(path)) == (figures["unique_spans"],) * 2


def test_compacted_files_copied_from_another_dataset_are_read_and_merged(make_dataset, tmp_path: Path) -> None:
    a, _ = make_dataset("a", spans=400, ids=40, duplicates=0.0)
    b = tmp_path / "b"
    load_generator().generate(b, spans=300, ids=30, days=2, rows_per_file=100, duplicates=0.0, seed=99)
    for ds in (a, b):
        compact(ds, grace_seconds=0)
    before = count_rows(live_files(a))
    copied = 0
    for partition in partition_dirs(b):
        for name in _compacted(partition):
            shutil.copy(partition / name, a / "spans" / partition.name / name)
            copied += pq.read_metadata(partition / name).num_rows
    assert copied > 0
    after_copy = count_rows(live_files(a))
    assert after_copy[0] == before[0] + copied  # every copied span is visible
    compact(a, grace_seconds=0)  # compacts them in; deletes only what it superseded
    assert count_rows(live_files(a)) == after_copy


def test_a_runs_outputs_are_recorded_as_pending_and_hidden_until_the_swap(make_dataset) -> None:
    path, figures = make_dataset(spans=600, ids=60)
    partition = partition_dirs(path)[0]
    seen: list[tuple[int, tuple[int, int]]] = []

    def look(step: str) -> None:
        if step == "renamed" and not seen:  # the outputs are on disk under their final names, not yet swapped
            manifest = read_manifest(partition)
            assert manifest is not None
            seen.append((len(manifest.pending), count_rows(live_files(path))))

    compact(path, grace_seconds=0, threads=1, _on_step=look)
    assert seen == [(1, (figures["spans_written"], figures["unique_spans"]))]  # recorded, and hidden
    manifest = read_manifest(partition)
    assert manifest is not None and manifest.pending == {}
    assert count_rows(live_files(path)) == (figures["unique_spans"],) * 2


def test_only_a_pending_runs_outputs_are_deleted_as_leftovers(make_dataset) -> None:
    path, figures = make_dataset(spans=600, ids=60, duplicates=0.0)
    compact(path, grace_seconds=0)
    partition = partition_dirs(path)[0]
    source = partition / _compacted(partition)[0]
    dead = partition / "compact-g9-0-0123456789ab.parquet"  # a crashed run's output: its token is pending
    shutil.copy(source, dead)
    manifest = read_manifest(partition)
    assert manifest is not None
    manifest.pending["0123456789ab"] = 1.0
    write_manifest(partition, manifest)
    assert count_rows(live_files(path)) == (figures["unique_spans"],) * 2  # hidden
    report = compact(path, grace_seconds=0)
    assert not dead.exists() and report.partitions[0].leftovers_deleted == 1
    manifest = read_manifest(partition)
    assert manifest is not None and manifest.pending == {}
    assert count_rows(live_files(path)) == (figures["unique_spans"],) * 2


def test_a_failed_run_leaves_no_pending_token_and_its_manifest_changed(make_dataset) -> None:
    # The manifest the run created stays (empty, without the token): a reader that read "no manifest" before the
    # run and listed its outputs then sees the manifest changed and lists again (third review).
    path, figures = make_dataset(spans=300, ids=30, duplicates=0.0)
    partition = partition_dirs(path)[0]
    before = sorted(os.listdir(partition))

    def fail(step: str) -> None:
        if step == "renamed":
            raise KeyboardInterrupt("stop")

    with pytest.raises(KeyboardInterrupt):
        compact(path, partitions=[partition.name], _on_step=fail)
    assert sorted(os.listdir(partition)) == sorted([*before, MANIFEST_NAME])
    left = read_manifest(partition)
    assert left is not None and left.pending == {} and left.files == []
    assert count_rows(live_files(path))[0] == figures["unique_spans"]


def test_a_damaged_compacted_file_moved_aside_is_skipped_and_dropped_loudly(make_dataset, caplog) -> None:
    path, figures = make_dataset(spans=600, ids=60, duplicates=0.0)
    compact(path, grace_seconds=0, target_rows=100)
    partition = partition_dirs(path)[0]
    victim = partition / _compacted(partition)[0]
    lost = pq.read_metadata(victim).num_rows
    victim.rename(path / "aside.parquet")
    with pytest.raises(DatasetError, match="--drop-missing"):
        Store(path, keys=[], require_signed=False)
    with Store(path, keys=[], require_signed=False, skip_corrupt=True) as store:
        assert [Path(p.path).name for p in store.skipped] == [victim.name]  # counted, the rest readable
        assert store.rows("SELECT count(*) AS n FROM spans")[0]["n"] == figures["unique_spans"] - lost
    with pytest.raises(DatasetError, match="missing"):
        compact(path)
    with caplog.at_level(logging.WARNING, logger="otel_replay"):
        report = compact(path, grace_seconds=0, drop_missing=True)
    assert report.dropped_missing == [f"{partition.name}/{victim.name}"]
    assert victim.name in caplog.text
    assert _spans(path) == figures["unique_spans"] - lost
    assert compact(path).dropped_missing == []


def _foreign(partition: Path, name: str, table: pa.Table) -> Path:
    target = partition / name
    pq.write_table(table, target)
    return target


def test_a_file_with_a_wrong_column_type_is_named_and_skippable(make_dataset) -> None:
    path, figures = make_dataset(spans=300, ids=30, duplicates=0.0)
    partition = partition_dirs(path)[0]
    foreign = _foreign(
        partition,
        "zz-foreign.parquet",
        pa.table(
            {
                "trace_id": ["t"],
                "span_id": ["s"],
                "start_time": pa.array([0], pa.timestamp("ns", tz="UTC")),
                "attributes": [{"k": 1}],
            }
        ),
    )
    with pytest.raises(CorruptFileError, match="zz-foreign.parquet.*column attributes"):
        Store(path, keys=[], require_signed=False)
    with Store(path, keys=[], require_signed=False, skip_corrupt=True) as store:
        assert [Path(p.path).name for p in store.skipped] == [foreign.name]
        assert store.rows("SELECT count(*) AS n FROM spans")[0]["n"] == figures["spans_written"]
    untouched = sorted(os.listdir(partition))
    with pytest.raises(CorruptFileError, match="zz-foreign.parquet"):
        compact(path, partitions=[partition.name])
    assert sorted(os.listdir(partition)) == untouched


def test_a_parquet_file_without_span_columns_is_refused_by_compaction(make_dataset) -> None:
    path, _ = make_dataset(spans=300, ids=30)
    partition = partition_dirs(path)[0]
    _foreign(partition, "other.parquet", pa.table({"x": [1, 2]}))
    untouched = sorted(os.listdir(partition))
    with pytest.raises(CorruptFileError, match="other.parquet: not a span file: no trace_id column"):
        compact(path, partitions=[partition.name])
    assert sorted(os.listdir(partition)) == untouched
    with pytest.raises(CorruptFileError, match="other.parquet"):
        Store(path, keys=[], require_signed=False)


def test_a_symlink_loop_is_a_named_bad_file(make_dataset) -> None:
    path, figures = make_dataset(spans=300, ids=30, duplicates=0.0)
    loop = partition_dirs(path)[0] / "loop.parquet"
    os.symlink(loop.name, loop)
    with pytest.raises(CorruptFileError, match="loop.parquet"):
        Store(path, keys=[], require_signed=False)
    with Store(path, keys=[], require_signed=False, skip_corrupt=True) as store:
        assert [Path(p.path).name for p in store.skipped] == ["loop.parquet"]
        assert store.rows("SELECT count(*) AS n FROM spans")[0]["n"] == figures["spans_written"]


def test_compaction_refuses_a_newer_schema_version_and_changes_nothing(make_dataset) -> None:
    path, _ = make_dataset(spans=300, ids=30)
    partition = partition_dirs(path)[0]
    victim = sorted(partition.glob("*.parquet"))[0]
    table = pq.read_table(victim)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"otel_replay.schema_version": b"3.0"})
    pq.write_table(table, victim)
    untouched = sorted(os.listdir(partition))
    with pytest.raises(DatasetError, match=f"{victim.name}: written with storage schema version 3.0"):
        compact(path, partitions=[partition.name])
    assert sorted(os.listdir(partition)) == untouched


def test_a_forged_side_index_is_not_used_and_every_file_is_read(make_dataset) -> None:
    path, _ = make_dataset(spans=300, ids=30)
    compact(path, grace_seconds=0)
    for partition in partition_dirs(path):
        manifest = read_manifest(partition)
        assert manifest is not None and manifest.index
        pq.write_table(pa.table({"key": [1], "file": ["x"]}), partition / manifest.index)
    with pytest.raises(DatasetError, match="not a side index: column kind is missing"):
        files_for(path, correlation_id="anything")


def test_retention_skips_folders_that_are_not_dates_and_takes_any_days(make_dataset, caplog) -> None:
    path, _ = make_dataset(spans=300, ids=30)
    real = [p.name for p in partition_dirs(path)]
    odd = ["date=2024-13-45", "date=\uff12\uff10\uff12\uff14-01-01"]
    for name in odd:
        (path / "spans" / name).mkdir()
    with caplog.at_level(logging.WARNING, logger="otel_replay"):
        assert drop_older_than(path, 999_999).dropped == []  # no overflow: nothing is that old
        report = drop_older_than(path, 0, today=dt.date(2027, 1, 1))
    assert report.dropped == real
    assert sorted(report.not_partitions) == sorted(odd)
    assert "date=2024-13-45 is not a partition" in caplog.text
    assert all((path / "spans" / name).is_dir() for name in odd)


def test_nested_partition_folders_are_warned_about(make_dataset, caplog) -> None:
    path, _ = make_dataset(spans=300, ids=30)
    partition = partition_dirs(path)[0]
    nested = partition / partition.name
    nested.mkdir()
    shutil.copy(sorted(partition.glob("*.parquet"))[0], nested / "copy.parquet")
    with caplog.at_level(logging.WARNING, logger="otel_replay"):
        live_files(path)
    assert "1 Parquet file(s) sit in a date= directory inside another directory" in caplog.text


_DROPPER = """
import datetime as dt, os, sys
from pathlib import Path
from otel_replay.storage.retention import drop_older_than
dataset, sample, drops, stop = sys.argv[1], Path(sys.argv[2]).read_bytes(), sys.argv[3], sys.argv[4]
# No signing key: no retention checkpoint signed over the 20 files at each drop (about 2 s a drop at load 5, for
# marks a store never reads when it opens).
os.environ.pop("OTEL_REPLAY_SIGNING_KEY", None)
print("running", flush=True)
while not os.path.exists(stop):
    old = Path(dataset) / "spans" / "date=2020-01-01"
    old.mkdir(exist_ok=True)
    for i in range(20):
        (old / f".late-{i}.tmp").write_bytes(sample)
        (old / f".late-{i}.tmp").replace(old / f"late-{i}.parquet")  # atomic, as the writer
    if drop_older_than(dataset, 30, today=dt.date(2026, 1, 10)).dropped:
        with open(drops, "ab") as counted:  # one byte a drop: its size is the count, read without a lock
            counted.write(b".")
"""


@pytest.mark.slow
def test_opening_a_store_while_retention_drops_a_partition_never_fails(make_dataset, zygote, tmp_path: Path) -> None:
    path, figures = make_dataset(spans=200, ids=20, duplicates=0.0)
    sample = tmp_path / "sample.parquet"
    shutil.copy(sorted((path / "spans").glob("date=*/*.parquet"))[0], sample)
    drops, stop = tmp_path / "drops", tmp_path / "stop"
    drops.touch()

    def dropped() -> int:
        return drops.stat().st_size

    # The dropper is a process of its own, forked with the package imported (a spawned one started a new
    # interpreter and imported this module, pytest and all). The stores are opened until 25 of them were
    # opened while a drop happened, instead of for 4 s whatever happened meanwhile.
    dropper = zygote.popen(_DROPPER, str(path), str(sample), str(drops), str(stop))
    errors, opened, during = [], 0, 0
    try:
        assert dropper.stdout.readline().strip() == "running", dropper.stderr.read()
        end = time.monotonic() + 120  # a hang guard for a dropper that stopped dropping
        while during < 25 and time.monotonic() < end:
            before = dropped()
            try:
                Store(path, keys=[], require_signed=False).close()
                opened += 1
            except Exception as exc:  # noqa: BLE001 - every failure is the finding
                errors.append(f"{type(exc).__name__}: {exc}")
            during += dropped() != before
    finally:
        stop.touch()
        _, err = dropper.communicate(timeout=60)
    assert dropper.returncode == 0, err
    assert errors == []
    assert opened > 0 and during >= 25


def test_the_duplicate_check_holds_only_digests_of_ids_in_flight() -> None:
    table = pa.table(
        {
            "trace_id": ["t1", "t1", "t2", "t2", "t2", "t3"],
            "span_id": ["s", "s", "s", "s", "s", "s"],
            "name": ["a", "a", "x", "y", "x", "z"],
        }
    )
    seen = Seen()
    first, second = table.slice(0, 3), table.slice(3)
    repeated = repeated_in(table)
    assert exact_duplicates(first, repeated, seen) == [1]  # the second "a" of t1
    assert list(seen.open) == [("t2", "s")]  # t1's two rows are both seen: dropped at once
    assert all(len(d) == 16 for _, held in seen.open.values() for d in held)
    assert exact_duplicates(second, repeated, seen) == [1]  # the second "x" of t2
    assert seen.open == {} and seen.conflicting_kept() == 2  # t2: "x" and "y" kept


def test_compact_command_drops_a_missing_file_loudly(make_dataset) -> None:
    from click.testing import CliRunner

    from otel_replay.cli.storage import compact_command

    path, _ = make_dataset(spans=300, ids=30, duplicates=0.0)
    compact(path, grace_seconds=0, target_rows=100)
    partition = partition_dirs(path)[0]
    victim = partition / _compacted(partition)[0]
    victim.unlink()
    refused = CliRunner().invoke(compact_command, [str(path)])
    assert refused.exit_code == 1 and "--drop-missing" in refused.output
    done = CliRunner().invoke(compact_command, [str(path), "--drop-missing", "--grace", "0"])
    assert done.exit_code == 0, done.output
    assert "dropped 1 missing compacted file(s)" in done.output and victim.name in done.output
    assert CliRunner().invoke(compact_command, [str(path)]).exit_code == 0


def test_a_store_opened_while_a_grace_0_compaction_swaps_lists_again(make_dataset, monkeypatch) -> None:
    # Third review: the reader lists the arrival files, a --grace 0 compaction swaps and deletes them, then the
    # reader checks its (stale) listing: the files are gone and their replacements were never listed. The Store
    # must list again, not bind the partition with nothing in it.
    import otel_replay.query.files as store_module

    path, figures = make_dataset(spans=2000, ids=200, duplicates=0.0)
    real = store_module.live_files
    fired: list[str] = []

    def listing_then_compaction(*args, **kwargs):  # the real listing; the compaction lands right after it
        files = real(*args, **kwargs)
        if not fired:
            fired.extend(p.status for p in compact(path, grace_seconds=0).partitions)
        return files

    monkeypatch.setattr(store_module, "live_files", listing_then_compaction)
    with Store(path, keys=[], require_signed=False) as store:
        assert fired and set(fired) == {"compacted"}
        assert store.rows("SELECT count(*) AS n FROM spans")[0]["n"] == figures["unique_spans"]
        assert store.skipped == []


@pytest.mark.parametrize("skip_corrupt", [True, False])
def test_a_swap_between_the_manifest_read_and_the_listing_is_not_a_missing_file(
    make_dataset, monkeypatch, skip_corrupt: bool
) -> None:
    # Third review: the reader reads generation 1's manifest, a --grace 0 compaction swaps to generation 2 and
    # deletes generation 1's file, then the reader lists: the file named is gone, but nothing is lost.
    import otel_replay.storage.manifest as manifest_module

    path, figures = make_dataset(spans=1000, ids=100, duplicates=0.0)
    compact(path, grace_seconds=0)
    partition = partition_dirs(path)[0]
    extra = pq.read_table(next(partition.glob("compact-*.parquet"))).slice(0, 10)
    ids = pa.array([f"{n:032x}" for n in range(10)])
    extra = extra.set_column(extra.schema.get_field_index("trace_id"), "trace_id", ids)
    pq.write_table(extra, partition / "part-extra.parquet")  # an arrival: the next compaction has work
    real = manifest_module.read_manifest
    armed = [True]

    def read_then_swap(where: Path) -> object:
        found = real(where)
        if armed and where == partition:
            armed.clear()
            compact(path, partitions=[partition.name.removeprefix("date=")], grace_seconds=0)
        return found

    monkeypatch.setattr(manifest_module, "read_manifest", read_then_swap)
    with Store(path, keys=[], require_signed=False, skip_corrupt=skip_corrupt) as store:
        assert not armed  # the swap did land between the read and the listing
        assert store.skipped == []
        assert store.rows("SELECT count(*) AS n FROM spans")[0]["n"] == figures["unique_spans"] + 10
