"""Compaction on worker threads: the same files, index and facts as one thread, in the old order; errors surface whole.

The side index compaction merges from per-file rows must be
``side_index.build_index`` of the files it wrote, row for row (kinds covered
included); the rows must be in the order the single-threaded compaction wrote
them (exact duplicates dropped, then a stable sort on the sort key); and an
error on a worker must reach the caller as itself, with the partition left as
it was and no worker still writing.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from otel_replay.cli.storage import compact_command
from otel_replay.errors import ConfigError, DatasetError
from otel_replay.exporters.schema import SCHEMA_METADATA_KEY
from otel_replay.storage import compact, live_files
from otel_replay.storage.compact_steps import SORT_KEY
from otel_replay.storage.manifest import MANIFEST_NAME, partition_dirs, read_manifest
from otel_replay.storage.side_index import KINDS_METADATA_KEY, build_index

from .._support import Zygote
from .conftest import count_rows

_TOKEN = re.compile(r"[0-9a-f]{12}")


def _outputs(partition: Path) -> tuple[list[Path], Path, Path]:
    """A compacted partition's files in write order (by counter), its index and its facts file."""
    manifest = read_manifest(partition)
    assert manifest is not None and manifest.index is not None
    files = sorted((partition / n for n in manifest.files), key=lambda p: int(p.name.split("-")[2]))
    facts = partition / manifest.index.replace("_index-", "_facts-")
    return files, partition / manifest.index, facts


def _add_version_1_file(path: Path) -> None:
    """A file without the typed ``outcome_decision_id`` column (storage schema version 1), in the first partition."""
    partition = partition_dirs(path)[0]
    sample = pq.read_table(sorted(partition.glob("part-*.parquet"))[0]).slice(0, 40)
    old = sample.drop_columns(["outcome_decision_id"]).replace_schema_metadata({SCHEMA_METADATA_KEY: b"1"})
    pq.write_table(old, partition / "part-0-aaaaaaaaaaaa.parquet")


@pytest.mark.parametrize("threads", [1, 3])
def test_the_merged_index_is_build_index_of_the_written_files_row_for_row(make_dataset, threads: int) -> None:
    path, _ = make_dataset(spans=3000, ids=300, rows_per_file=100)
    _add_version_1_file(path)
    # several batches and more than ten files a partition: "…-10-…" sorts before "…-2-…" by name
    compact(path, grace_seconds=0, max_batch_rows=700, target_rows=120, threads=threads)
    counts = []
    for number, partition in enumerate(partition_dirs(path)):
        files, index, _ = _outputs(partition)
        counts.append(len(files))
        expected = build_index([(f.name, pq.read_table(f, partitioning=None)) for f in files])
        written = pq.read_table(index)
        assert written.num_rows == expected.num_rows > 0
        assert written.to_pylist() == expected.to_pylist()
        assert written.schema.remove_metadata() == expected.schema.remove_metadata()
        kinds = written.schema.metadata[KINDS_METADATA_KEY]
        assert kinds == expected.schema.metadata[KINDS_METADATA_KEY]
        # the version 1 file has no outcome_decision_id column: the first partition's index does not cover it
        assert (b"outcome_decision_id" in kinds) == (number != 0)
    assert max(counts) > 10


def _normalized(table: pa.Table) -> list[dict[str, Any]]:
    return json.loads(_TOKEN.sub("TOKEN", json.dumps(table.to_pylist(), default=str)))


def test_one_thread_and_several_write_the_same_files_index_and_facts(make_dataset) -> None:
    one, _ = make_dataset("one", spans=3000, ids=300, rows_per_file=100)
    many, _ = make_dataset("many", spans=3000, ids=300, rows_per_file=100)
    compact(one, grace_seconds=0, max_batch_rows=900, target_rows=250, threads=1)
    compact(many, grace_seconds=0, max_batch_rows=900, target_rows=250, threads=4)
    for a, b in zip(partition_dirs(one), partition_dirs(many), strict=True):
        files_a, index_a, facts_a = _outputs(a)
        files_b, index_b, facts_b = _outputs(b)
        assert [_TOKEN.sub("", f.name) for f in files_a] == [_TOKEN.sub("", f.name) for f in files_b]
        for fa, fb in zip(files_a, files_b, strict=True):
            assert pq.read_table(fa).equals(pq.read_table(fb), check_metadata=True)
            assert pq.read_metadata(fa).num_row_groups == pq.read_metadata(fb).num_row_groups
        assert _normalized(pq.read_table(index_a)) == _normalized(pq.read_table(index_b))
        facts = pq.read_table(facts_a)
        assert facts.num_rows > 0 and facts.equals(pq.read_table(facts_b))


def _exact_unique_in_read_order(table: pa.Table) -> pa.Table:
    """``table`` without rows that exactly repeat an earlier row (what compaction removes), first copies kept."""
    seen: set[str] = set()
    keep = []
    for position, row in enumerate(table.to_pylist()):
        content = json.dumps(row, sort_keys=True, default=repr)
        if content not in seen:
            seen.add(content)
            keep.append(position)
    return table.take(pa.array(keep, pa.int64()))


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_rows_come_out_in_the_old_single_threaded_order(make_dataset, threads: int) -> None:
    path, figures = make_dataset(spans=3000, ids=300, rows_per_file=100, duplicates=0.05)
    # what compaction reads: each partition's files in name order (read before they are replaced)
    inputs = {
        p.name: pq.read_table([f for f in live_files(path) if f"/{p.name}/" in f], partitioning=None)
        for p in partition_dirs(path)
    }
    compact(path, grace_seconds=0, target_rows=400, threads=threads)  # one batch a partition: one sorted run
    total = 0
    for partition in partition_dirs(path):
        unique = _exact_unique_in_read_order(inputs[partition.name])
        keys = [(name, "ascending", "at_end") for name in SORT_KEY]
        expected = unique.take(pc.sort_indices(unique, sort_keys=keys))  # stable, as in the old compaction
        written, _, _ = _outputs(partition)
        got = pa.concat_tables([pq.read_table(f, partitioning=None) for f in written])
        assert got.num_rows == expected.num_rows
        assert got.to_pylist() == expected.to_pylist()
        total += got.num_rows
    assert total == figures["unique_spans"]


def test_an_error_on_a_worker_is_raised_as_is_and_leaves_the_partition_as_it_was(make_dataset) -> None:
    path, figures = make_dataset(spans=3000, ids=300, rows_per_file=100)
    before = {p.name: sorted(os.listdir(p)) for p in partition_dirs(path)}
    files_before = live_files(path)
    lock = threading.Lock()
    calls: list[str] = []

    def step(name: str) -> None:
        if name != "writing":
            return
        with lock:
            calls.append(threading.current_thread().name)
            if len(calls) == 3:
                raise DatasetError("cannot write a compacted file: No space left on device")
        time.sleep(0.05)  # the other workers are mid-file when the error comes

    with pytest.raises(DatasetError) as info:
        compact(path, grace_seconds=0, target_rows=100, threads=3, _on_step=step)
    assert str(info.value) == "cannot write a compacted file: No space left on device"
    assert all(name.startswith("otel-replay-compact") for name in calls)  # it came from a worker thread
    time.sleep(0.3)  # a worker still running would write now
    # as it was, but for the manifest the run created: left without its token (readers must see it changed)
    after = {p.name: sorted(n for n in os.listdir(p) if n != MANIFEST_NAME) for p in partition_dirs(path)}
    assert after == before
    for partition in partition_dirs(path):
        left = read_manifest(partition)
        assert left is None or (left.files == [] and left.pending == {})
    assert live_files(path) == files_before
    report = compact(path, grace_seconds=0, target_rows=100, threads=3)  # the lease was released
    assert report.output_rows == figures["unique_spans"]
    assert count_rows(live_files(path)) == (figures["unique_spans"],) * 2


def test_threads_must_be_a_positive_integer_and_the_command_takes_it(make_dataset) -> None:
    path, figures = make_dataset(spans=400, ids=40)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigError, match="threads"):
            compact(path, threads=bad)  # type: ignore[arg-type]
    refused = CliRunner().invoke(compact_command, [str(path), "--threads", "0"])
    assert refused.exit_code != 0 and "--threads" in refused.output
    result = CliRunner().invoke(compact_command, [str(path), "--threads", "1", "--grace", "0", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["output_rows"] == figures["unique_spans"]


def test_the_compact_command_runs_under_jemalloc_unless_a_pool_was_chosen(make_dataset, zygote: Zygote) -> None:
    import subprocess
    import sys

    path, figures = make_dataset(spans=400, ids=40)
    try:
        pa.jemalloc_memory_pool()
        expected = "jemalloc"
    except NotImplementedError:  # a pyarrow built without it: the command keeps pyarrow's default
        expected = pa.default_memory_pool().backend_name
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    pools = []
    for chosen in (None, "system"):
        args = ["compact", str(path), "--grace", "0", "--json"]
        if chosen is None:
            # Forked with pyarrow imported under its default pool: the command starts itself again under jemalloc.
            done = zygote.cli(*args, env=env)
        else:  # pyarrow reads the variable when it is imported: only a new interpreter shows the choice
            done = subprocess.run(
                [sys.executable, "-m", "otel_replay", *args],
                env={**env, "ARROW_DEFAULT_MEMORY_POOL": chosen},
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        pools.append(report["memory_pool"])
        if chosen is None:
            assert report["output_rows"] == figures["unique_spans"]
    assert pools == [expected, "system"]


def test_a_batch_is_never_held_twice_while_its_columns_are_combined(tmp_path: Path, monkeypatch) -> None:
    import importlib

    steps = importlib.import_module("otel_replay.storage.compact_steps")
    paths = []
    for i in range(8):
        table = pa.table({f"c{j}": pa.array(range(i * 100_000, (i + 1) * 100_000), pa.int64()) for j in range(8)})
        paths.append(tmp_path / f"f{i}.parquet")
        pq.write_table(table, paths[-1])
    peak = [0]
    submit = steps.Workers.submit

    def watching(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        peak[0] = max(peak[0], pa.total_allocated_bytes())  # while a column is being combined
        return submit(self, fn, *args, **kwargs)

    monkeypatch.setattr(steps.Workers, "submit", watching)
    base = pa.total_allocated_bytes()
    batch = steps.read_files(paths)
    assert batch.num_rows == 800_000
    assert peak[0] - base < 1.5 * batch.nbytes  # the chunked read is freed column by column, not kept whole
