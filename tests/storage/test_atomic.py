"""The swap is atomic for readers, survives a crash at every step, and two compactors never share a partition."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otel_replay.exporters.writer import DatasetWriter
from otel_replay.query.store import Store
from otel_replay.storage import CompactReport, PartitionLease, compact, live_files
from otel_replay.storage.manifest import partition_dirs, read_manifest, write_manifest

from .._support import ForkedProcess, Zygote
from .conftest import count_rows

CRASH_STEPS = ("read", "writing", "file", "written", "renamed", "indexed", "swapped", "deleted")

_COMPACT_SCRIPT = """
import json, os, sys, time
from otel_replay.storage import compact
dataset, crash_at, meet_in = sys.argv[1], sys.argv[2], sys.argv[3]
met = []
def step(name):
    if name == crash_at:
        os._exit(3)
    if name == "read" and meet_in != "-" and not met:  # the first partition read, inside its lease
        met.append(name)
        open(os.path.join(meet_in, str(os.getpid())), "w").close()
        end = time.monotonic() + 60
        while len(os.listdir(meet_in)) < 2 and time.monotonic() < end:
            time.sleep(0.005)
report = compact(dataset, grace_seconds=0, _on_step=step)
print(json.dumps({p.partition: p.status for p in report.partitions}))
"""


def _run_compact(zygote: Zygote, dataset: Path, crash_at: str = "-", meet_in: Path | None = None) -> ForkedProcess:
    """Compaction in a process of its own (forked with the package imported: a crash is a real process's death).

    With ``meet_in`` (a directory shared by two of them) it waits, holding its first partition's lease, until the
    other compaction holds one too (or a minute passes).
    """
    return zygote.popen(_COMPACT_SCRIPT, str(dataset), crash_at, "-" if meet_in is None else str(meet_in))


def _finish(proc: ForkedProcess) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode is not None
    return proc.returncode, out, err


def _fresh_rows(template: pa.Table, date: str) -> pa.Table:
    """``template``'s rows as new spans (new trace ids), with the writer's ``date`` column."""
    trace = uuid.uuid4().hex
    table = template.set_column(0, "trace_id", pa.array([trace] * template.num_rows, pa.string()))
    return table.append_column("date", pa.array([date] * template.num_rows, pa.string()))


@pytest.mark.slow
def test_concurrent_reader_sees_old_or_new_never_both_never_neither(make_dataset) -> None:
    path, figures = make_dataset(duplicates=0, spans=1000, ids=100)
    base = figures["unique_spans"]
    partition = partition_dirs(path)[0]
    date = partition.name.removeprefix("date=")
    template = pq.read_table(next(partition.glob("part-*.parquet"))).slice(0, 20)
    writer = DatasetWriter(path, max_rows=20, max_age_seconds=3600)
    stop = threading.Event()
    # The readers read every 50 ms or so throughout. The writer adds files while a compaction runs, up to 20 a
    # compaction (written without a pause, they were hundreds on a loaded machine, each compaction taking longer
    # for all that arrived during the last).
    compacting = threading.Event()
    appends = threading.Semaphore(0)
    problems: list[str] = []
    reads = 0
    ten_reads = threading.Event()

    def write() -> None:
        while not stop.is_set():
            if compacting.wait(0.05) and appends.acquire(timeout=0.05):
                writer.append(_fresh_rows(template, date))
                time.sleep(0.01)

    def read() -> None:
        nonlocal reads
        while not stop.is_set():
            low = writer.stats.rows_written
            try:
                rows, distinct = count_rows(live_files(path))
            except Exception as exc:  # a vanished file: the reader saw neither version
                problems.append(f"read failed: {exc}")
                continue
            high = writer.stats.rows_written + template.num_rows  # at most one flush in flight
            if rows != distinct:
                problems.append(f"{rows - distinct} duplicate spans visible")
            if not base + low <= rows <= base + high:
                problems.append(f"{rows} rows visible, expected {base + low}..{base + high}")
            reads += 1
            if reads >= 10:
                ten_reads.set()
            stop.wait(0.05)

    def compaction() -> CompactReport:
        appends.release(20)
        compacting.set()
        try:
            return compact(path, grace_seconds=1.0)  # superseded files stay 1 s for readers that listed them
        finally:
            compacting.clear()

    threads = [threading.Thread(target=write), threading.Thread(target=read), threading.Thread(target=read)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.3)
        first = compaction()
        time.sleep(1.2)
        second = compaction()  # deletes the first one's superseded files, and compacts the arrivals
        # (a third compaction, 1.2 s later, met the same as the second: superseded files to delete, arrivals)
        assert ten_reads.wait(120), f"only {reads} reads"  # on a loaded machine, reads go on until there were ten
    finally:
        stop.set()
        compacting.set()
        for thread in threads:
            thread.join()
        writer.close()
    assert problems == []
    assert reads >= 10
    assert first.output_rows >= base and second.partitions[0].superseded_deleted > 0
    assert count_rows(live_files(path)) == (base + writer.stats.rows_written,) * 2


@pytest.mark.parametrize("step", CRASH_STEPS)
def test_a_crash_at_any_step_leaves_the_dataset_complete(make_dataset, zygote, step: str) -> None:
    path, figures = make_dataset(spans=600, ids=60)
    before = {p.name: count_rows([f for f in live_files(path) if p.name in f]) for p in partition_dirs(path)}
    code, _, err = _finish(_run_compact(zygote, path, crash_at=step))
    assert code == 3, err
    for partition, (rows_before, distinct_before) in before.items():
        rows, distinct = count_rows([f for f in live_files(path) if partition in f])
        assert distinct == distinct_before  # no span lost or doubled
        assert rows in (rows_before, distinct_before)  # the old files, or the compacted ones: never a mix
    first_rows = count_rows([f for f in live_files(path) if partition_dirs(path)[0].name in f])[0]
    if step in ("swapped", "deleted"):  # the first partition was swapped before the crash
        assert first_rows == before[partition_dirs(path)[0].name][1]
    report = compact(path, grace_seconds=0)
    assert report.output_rows + sum(p.status == "current" for p in report.partitions) >= 1
    assert count_rows(live_files(path)) == (figures["unique_spans"],) * 2
    for partition in partition_dirs(path):
        ours = ("compact-g", "_index-g", "_facts-g", "_manifest.json")
        left = [n for n in os.listdir(partition) if not n.startswith(ours)]
        assert left == [], f"leftovers after recovery: {left}"
    with Store(path) as store:  # the current Store (plain listing) is exact once nothing is superseded
        assert store.rows("SELECT count(*) AS n FROM spans") == [{"n": figures["unique_spans"]}]


def test_two_compactors_never_rewrite_one_partition_at_once(make_dataset, zygote, tmp_path: Path) -> None:
    path, figures = make_dataset(spans=600, ids=60)
    meet = tmp_path / "meet"
    meet.mkdir()
    # Each holds its first partition's lease until the other holds one too: they overlap by construction (each
    # slept 1 s inside its lease before, which a loaded machine could outlast).
    first, second = _run_compact(zygote, path, meet_in=meet), _run_compact(zygote, path, meet_in=meet)
    results = []
    for proc in (first, second):
        code, out, err = _finish(proc)
        assert code == 0, err
        results.append(json.loads(out))
    statuses: dict[str, list[str]] = {}
    for result in results:
        for partition, status in result.items():
            statuses.setdefault(partition, []).append(status)
    # each partition compacted by exactly one of them; the other found it busy (or already current)
    assert all(sorted(s) in (["busy", "compacted"], ["compacted", "current"]) for s in statuses.values()), statuses
    assert any("busy" in s for s in statuses.values())  # they did overlap
    assert len(os.listdir(meet)) == 2  # both reached their first read
    done = compact(path, grace_seconds=0)  # whatever was busy for both is compacted now
    assert all(p.status in ("current", "compacted", "empty") for p in done.partitions)
    assert count_rows(live_files(path)) == (figures["unique_spans"],) * 2


def test_a_held_lease_makes_the_partition_busy_and_dies_with_its_holder(make_dataset, zygote) -> None:
    path, _ = make_dataset(spans=300, ids=30)
    partition = partition_dirs(path)[0]
    holder = zygote.popen(
        "import sys, time\nfrom otel_replay.storage import PartitionLease\n"
        "lease = PartitionLease(sys.argv[1], sys.argv[2])\nassert lease.acquire()\n"
        "print('held', flush=True)\nsys.stdin.readline()\nimport os; os._exit(9)\n",
        str(path),
        partition.name,
        stdin=True,
    )
    assert holder.stdin is not None
    try:
        assert holder.stdout.readline().strip() == "held"
        report = compact(path, partitions=[partition.name])
        assert [p.status for p in report.partitions] == ["busy"] and report.busy == [partition.name]
        assert not PartitionLease(path, partition.name).acquire(wait=0.2)
    finally:
        holder.communicate(timeout=30)  # closes its stdin: it reads the end of the line and dies
    assert holder.returncode == 9  # died without releasing: the kernel released the flock
    report = compact(path, partitions=[partition.name], lease_wait=5)
    assert [p.status for p in report.partitions] == ["compacted"]


def test_superseded_files_are_hidden_during_the_grace_period(make_dataset) -> None:
    path, figures = make_dataset(spans=600, ids=60)
    old = live_files(path)
    compact(path, grace_seconds=3600)
    assert all(os.path.exists(f) for f in old)  # still there for readers that listed them
    assert not set(old) & set(live_files(path))
    assert count_rows(live_files(path)) == (figures["unique_spans"],) * 2
    assert count_rows(old) == (figures["spans_written"], figures["unique_spans"])  # the old view is whole too
    leftover = Path(old[0]).with_name("compact-g7-0-0123456789ab.parquet")
    shutil.copy(old[0], leftover)  # a crash leftover: its run is recorded as pending in the manifest
    manifest = read_manifest(leftover.parent)
    assert manifest is not None
    manifest.pending["0123456789ab"] = 1.0
    write_manifest(leftover.parent, manifest)
    assert count_rows(live_files(path))[0] == figures["unique_spans"]
