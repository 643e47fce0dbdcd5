"""Compaction on S3: the manifest swap is atomic for readers without a rename; leases are conditional PUTs."""

from __future__ import annotations

import importlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest

from otel_replay import _seam
from otel_replay.errors import DatasetError
from otel_replay.location import Location, register_with, resolve
from otel_replay.query.store import Store
from otel_replay.storage import compact, live_files
from otel_replay.storage.lease import ObjectLease, lease_for
from otel_replay.storage.manifest import is_compacted_name

from .._support import Zygote
from ..storage.conftest import load_generator
from .conftest import keys

ROOT = Path(__file__).resolve().parents[2]


def _count(uri: str, files: list[str]) -> tuple[int, int]:
    """(rows, distinct (trace_id, span_id)) over ``files`` read by DuckDB through the pyarrow S3 filesystem."""
    if not files:
        return 0, 0
    con = duckdb.connect()
    try:
        register_with(con, resolve(uri))
        row = con.execute(
            "SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM read_parquet(?)", [files]
        ).fetchone()
    finally:
        con.close()
    assert row is not None
    return int(row[0]), int(row[1])


def _make(bucket: str, name: str = "ds", spans: int = 900) -> tuple[str, dict[str, Any]]:
    """A generated dataset on S3: three partitions, 11 objects, duplicates in each partition (13, 14 and 1)."""
    uri = f"s3://{bucket}/{name}"
    figures = load_generator().generate(
        uri,
        spans=spans,
        ids=200,
        days=2,
        rows_per_file=150,
        duplicates=0.03,
        seed=5,  # type: ignore[arg-type]
    )
    return uri, figures


@pytest.mark.slow
def test_compact_on_s3_sorts_dedups_and_swaps(bucket: str, s3: Any) -> None:
    uri, figures = _make(bucket)
    before = live_files(uri)
    assert _count(uri, before) == (figures["spans_written"], figures["unique_spans"])
    report = compact(uri, grace_seconds=3600)
    assert {p.status for p in report.partitions} == {"compacted"}
    assert report.duplicates_removed == figures["duplicates_written"]
    after = live_files(uri)
    assert after and all(is_compacted_name(f.rpartition("/")[2]) for f in after)
    assert _count(uri, after) == (figures["unique_spans"],) * 2
    stored = keys(s3, bucket, "ds/")
    assert all(
        f"{bucket}/{k}" in {b.removeprefix("s3://") for b in before}
        or not k.endswith(".parquet")
        or is_compacted_name(k.rpartition("/")[2])
        for k in stored
    )
    assert sum(k.endswith("_manifest.json") for k in stored) == len(report.partitions)
    assert not [k for k in stored if ".locks/" in k]  # leases released
    # superseded files stay for the grace period; a second run is current
    assert set(before) <= {f"s3://{bucket}/{k}" for k in stored}
    again = compact(uri, grace_seconds=3600)
    assert {p.status for p in again.partitions} == {"current"}
    # grace 0 deletes what was superseded
    compact(uri, grace_seconds=0)
    remaining = {f"s3://{bucket}/{k}" for k in keys(s3, bucket, "ds/spans/")}
    assert not set(before) & remaining
    with Store(uri) as store:
        assert store.rows("SELECT count(*) AS n FROM spans") == [{"n": figures["unique_spans"]}]
        # the compacted files carry bloom filters on the id columns
        meta = store.rows(
            "SELECT count(*) AS n FROM parquet_metadata(?) WHERE path_in_schema = 'correlation_id' "
            "AND bloom_filter_offset IS NOT NULL",
            [store.files[0]],
        )
        assert meta[0]["n"] >= 1


class _PausedCompaction:
    """A compaction of ``uri`` in its own thread that stops before it starts and at each step until let go on."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.steps: list[str] = []
        self.done = False
        self.report: Any = None
        self.error: BaseException | None = None
        self._go = threading.Semaphore(0)
        self._reached = threading.Semaphore(0)
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _wait_go(self) -> None:
        if not self._go.acquire(timeout=300):  # a hang guard, not a timing assert
            raise RuntimeError("the test stopped driving the compaction")

    def _at(self, step: str) -> None:
        self.steps.append(step)
        self._reached.release()
        self._wait_go()

    def _run(self) -> None:
        try:
            self._wait_go()
            self.report = compact(self.uri, grace_seconds=3600, _on_step=self._at)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.done = True
            self._reached.release()

    def advance(self) -> None:
        """Let the compaction run to its next step (or to its end)."""
        if self.done:
            return
        self._go.release()
        assert self._reached.acquire(timeout=300)

    def swapped(self) -> int:
        """Partitions swapped so far."""
        return self.steps.count("swapped")

    def finish(self) -> None:
        """Let the compaction run to its end."""
        while not self.done:
            self.advance()
        self._thread.join(timeout=300)


def test_reader_during_s3_compaction_sees_old_or_new_never_both(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compaction stops at every step; a reader reads there, and across each step between its two listings.

    A reader reads every partition's manifest between a first listing (that finds the manifests) and a second
    (that gives the files). Each window is forced here: the compaction moves one step on (two at a partition's
    start: its run recorded and its first output uploaded) after the reader read the manifests and before it
    lists the files. Every reading must be the dataset with a prefix of the partitions swapped, in order: a span
    is never missing, nor counted in both an input object and the output that replaces it.
    """
    uri, figures = _make(bucket)  # three partitions, each with duplicates (13, 14 and 1)
    paused = _PausedCompaction(uri)
    reader = threading.get_ident()
    window = {"steps": 0, "listings": 0}
    real = Location.files_under

    def listing(self: Location, path: str) -> list[Any]:
        if threading.get_ident() == reader and window["steps"] and path.endswith("/spans"):
            window["listings"] += 1
            if window["listings"] == 2:  # the manifests are read: the files are listed after the compaction moved
                for _ in range(window["steps"]):
                    paused.advance()
        return real(self, path)

    monkeypatch.setattr(Location, "files_under", listing)

    def reading(steps: int) -> tuple[int, int, int, int]:
        """(partitions swapped before, rows, distinct spans, partitions swapped after): ``steps`` taken inside."""
        before = paused.swapped()
        window.update(steps=steps, listings=0)
        try:
            rows, distinct = _count(uri, live_files(uri))
        finally:
            window.update(steps=0, listings=0)
        return before, rows, distinct, paused.swapped()

    readings = [reading(0)]
    try:
        while not paused.done:  # each step inside one reading's window (a partition's start: with the next step)
            readings.append(reading(2 if not paused.steps or paused.steps[-1] == "swapped" else 1))
        readings.append(reading(0))
    finally:
        paused.finish()
    assert paused.error is None, paused.error
    report = paused.report
    assert [p.status for p in report.partitions] == ["compacted"] * len(report.partitions) and paused.swapped() >= 2
    assert {"read", "file", "written", "indexed", "swapped"} <= set(paused.steps)
    removed = [p.input_rows - p.output_rows for p in report.partitions]
    assert all(removed) and sum(removed) == figures["duplicates_written"]  # each partition's swap is seen
    unique = figures["unique_spans"]

    def state(swapped: int) -> tuple[int, int]:
        return figures["spans_written"] - sum(removed[:swapped]), unique

    assert readings[0][1:3] == state(0) and readings[-1][1:3] == state(len(removed))
    for before, rows, distinct, after in readings:
        # old or new state of the partition whose swap fell between the reader's listings, nothing in between
        assert (rows, distinct) in {state(before), state(after)}, (before, rows, distinct, after, removed)
    windows = [r for r in readings if r[0] != r[3]]
    assert len(windows) >= len(removed)  # every partition's swap fell inside a reader's listing once
    # a reader whose manifests predate a swap it lists after reads the old state of that partition
    assert all((r[1], r[2]) == state(r[0]) for r in windows)


def test_two_compactors_one_partition_one_wins(bucket: str) -> None:
    uri, figures = _make(bucket)
    first_partition = sorted({f.split("/spans/")[1].split("/")[0] for f in live_files(uri)})[0]
    results: dict[str, Any] = {}
    started = threading.Event()

    def slow(step: str) -> None:
        if step == "read":
            started.set()
            time.sleep(0.5)

    def run(who: str, hook: Any) -> None:
        results[who] = compact(uri, partitions=[first_partition], grace_seconds=3600, _on_step=hook)

    a = threading.Thread(target=run, args=("a", slow))
    a.start()
    assert started.wait(30)
    run("b", None)
    a.join(timeout=120)
    statuses = sorted(results[w].partitions[0].status for w in ("a", "b"))
    assert statuses == ["busy", "compacted"]
    winner = next(results[w].partitions[0] for w in ("a", "b") if results[w].partitions[0].status == "compacted")
    expected = (figures["spans_written"] - winner.duplicates_removed, figures["unique_spans"])
    assert _count(uri, live_files(uri)) == expected


def test_expired_lease_is_taken_over_and_the_stale_holder_cannot_confirm(bucket: str) -> None:
    uri = f"s3://{bucket}/ds"
    crashed = ObjectLease(uri, "date=2026-01-01", ttl_seconds=1.0)
    assert crashed.acquire()
    crashed._stop.set()  # the holder stops renewing, as a crashed process would (and never releases)
    assert crashed._thread is not None
    crashed._thread.join(timeout=5)
    other = lease_for(uri, "date=2026-01-01")
    assert isinstance(other, ObjectLease)
    assert not other.acquire(wait=0)  # not expired yet
    assert other.acquire(wait=10)  # taken over once expired: 1-2 s later (S3's Last-Modified is in whole seconds)
    assert other.took_over == crashed.owner
    with pytest.raises(DatasetError, match="was lost"):
        crashed.confirm()
    third = ObjectLease(uri, "date=2026-01-01")
    assert not third.acquire(wait=0.3)  # the new holder renews: it is live
    other.release()
    assert third.acquire(wait=0)
    third.release()


@pytest.mark.slow
def test_a_manifest_changed_during_compaction_fails_the_swap(bucket: str, s3: Any) -> None:
    """Compare-and-swap on the manifest: even a compactor whose lease was misjudged cannot swap over another."""
    uri, figures = _make(bucket, spans=300)  # a few objects a partition are enough to swap
    compact(uri, grace_seconds=3600)
    load_generator().generate(uri, spans=100, ids=10, days=2, rows_per_file=50, duplicates=0.0, seed=9)  # type: ignore[arg-type]
    before = live_files(uri)
    counted = _count(uri, before)

    def meddle(step: str) -> None:
        if step == "indexed":  # another process rewrites the first partition's manifest meanwhile
            key = next(k for k in keys(s3, bucket, "ds/spans/") if k.endswith("_manifest.json"))
            doc = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
            doc["superseded"]["part-never-existed.parquet"] = 1.0  # any change (the same bytes keep the ETag)
            s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(doc).encode())

    with pytest.raises(DatasetError, match="was changed by another process"):
        compact(uri, grace_seconds=3600, _on_step=meddle)
    assert live_files(uri) == before and _count(uri, before) == counted
    # the next run deletes the unnamed outputs and compacts
    report = compact(uri, grace_seconds=3600)
    assert report.partitions[0].leftovers_deleted >= 1
    assert _count(uri, live_files(uri))[1] == counted[1]


@pytest.mark.slow
def test_compact_cli_on_s3(bucket: str, zygote: Zygote) -> None:
    uri, figures = _make(bucket)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = zygote.cli("compact", uri, "--json", env=env)  # a process of its own, forked with the package imported
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["output_rows"] == figures["unique_spans"] and doc["duplicates_removed"] == figures["duplicates_written"]
    bad = zygote.cli("compact", "s3://no-such-bucket-zz/x", env=env)
    assert bad.returncode == 1 and "s3://no-such-bucket-zz/x" in bad.stderr and "does not exist" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_side_index_narrows_lookups_on_s3_and_stays_complete(bucket: str) -> None:
    from otel_replay.storage import files_for

    uri, _ = _make(bucket)
    assert files_for(uri, correlation_id="trade-000000001") is None  # nothing indexed yet
    compact(uri, grace_seconds=3600)
    every = live_files(uri)
    con = duckdb.connect()
    register_with(con, resolve(uri))
    sql = "SELECT trace_id, span_id FROM read_parquet(?) WHERE correlation_id = ? ORDER BY ALL"
    try:
        for cid in ("trade-000000001", "trade-000000100", "no-such-id"):
            narrowed = files_for(uri, correlation_id=cid)
            assert narrowed is not None and set(narrowed) <= set(every) and len(narrowed) < len(every)
            full = con.execute(sql, [every, cid]).fetchall()
            assert (con.execute(sql, [narrowed, cid]).fetchall() if narrowed else []) == full
    finally:
        con.close()
    # an arrival newer than the index is always searched
    load_generator().generate(uri, spans=30, ids=3, days=1, rows_per_file=100, duplicates=0.0, seed=3)  # type: ignore[arg-type]
    newer = set(live_files(uri)) - set(every)
    assert newer and newer <= set(files_for(uri, correlation_id="no-such-id") or [])
    with Store(uri) as store:
        chain = store.run_for("chains/trade", {"correlation_id": "trade-000000001"}, chain_id="trade-000000001")
        assert chain == store.run("chains/trade", chain_id="trade-000000001")


@pytest.mark.slow
def test_store_lookups_on_s3_reuse_the_listing_of_the_last_refresh(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chain lookup reads the (cached) side index, not a fresh listing of the whole prefix."""
    from otel_replay.location import Location

    uri, _ = _make(bucket)
    compact(uri, grace_seconds=3600)
    listings: list[str] = []
    real = Location.files_under
    monkeypatch.setattr(Location, "files_under", lambda self, path: listings.append(path) or real(self, path))

    def of_spans() -> int:
        return sum(path.endswith("/spans") for path in listings)

    with Store(uri) as store:
        opened = len(listings)
        assert of_spans() == 2  # the two listings around the manifest reads (the logs prefix has its own)
        for n in range(5):
            cid = f"trade-{n:09d}"
            narrowed = store.run_for("chains/trade", {"correlation_id": cid}, chain_id=cid)
            assert narrowed == store.run("chains/trade", chain_id=cid)
        assert len(listings) == opened  # no lookup lists anything
        store.refresh()
        assert of_spans() == 4


def _many_objects(bucket: str, name: str, objects: int = 48, duplicates: float = 0.02) -> tuple[str, dict[str, Any]]:
    """``objects`` objects of 3 spans each in one partition (and the re-sent ``duplicates`` in a few more)."""
    uri = f"s3://{bucket}/{name}"
    figures = load_generator().generate(
        uri,
        spans=3 * objects,
        ids=objects,
        days=1,
        rows_per_file=3,
        duplicates=duplicates,
        seed=5,  # type: ignore[arg-type]
    )
    return uri, figures


@pytest.mark.slow
def test_objects_are_read_one_by_one_into_the_batch_never_all_at_once(bucket: str, monkeypatch) -> None:
    from otel_replay.storage import compact_s3

    from ..storage.conftest import ReadWatch

    uri, figures = _many_objects(bucket, "many")
    inputs = live_files(uri)
    compact_module = importlib.import_module("otel_replay.storage.compact_steps")
    # pieces of 8 gathered objects instead of 64: the same steps, and a few dozen objects are already several
    # times what compaction may hold at once (each object costs a PUT, a GET and a DELETE on the server)
    monkeypatch.setattr(compact_module, "GATHER_FILES", 8)
    held = compact_module.GATHER_FILES + compact_s3.REMOTE_READERS + 2  # the most compaction may hold at once
    assert len(inputs) > 2 * held  # so holding one table per object would show
    watch = ReadWatch(monkeypatch)
    report = compact(uri, grace_seconds=0)  # every object in one batch
    assert sorted(watch.read) == sorted(inputs)  # each object read once, on its own
    assert watch.peak <= held  # not one table per object
    assert report.duplicates_removed == figures["duplicates_written"]
    assert _count(uri, live_files(uri)) == (figures["unique_spans"],) * 2


@pytest.mark.slow
def test_a_tiny_batch_over_many_objects_keeps_every_span_once(bucket: str) -> None:
    # 12 objects of 3 spans and the 2 re-sent ones, in batches of at most 6 rows, each batch's run split into
    # files of 4 rows. Each batch costs a facts extraction (~0.2 s), each object a PUT, a GET and a DELETE.
    uri, figures = _many_objects(bucket, "tiny", objects=12, duplicates=0.05)
    report = compact(uri, grace_seconds=0, max_batch_rows=6, target_rows=4)
    assert report.duplicates_removed == figures["duplicates_written"] > 0
    after = live_files(uri)
    assert all(is_compacted_name(f.rpartition("/")[2]) for f in after)
    assert len({f.rpartition("/")[2].split("-")[2] for f in after}) > 10  # one sorted run per batch
    assert _count(uri, after) == (figures["unique_spans"],) * 2


class _Taking:
    """A mode standing for a recording: it takes in every call that crosses the seam."""

    def around(self, call: Any, invoke: Any) -> Any:
        return invoke()


def test_a_leases_renewals_are_never_taken_into_a_recording(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The renewal thread's requests come whenever its timer says: a recording that took them in would hold steps
    # a rerun cannot repeat at the same place, and report a divergence the agent never made.
    renewed = threading.Event()
    modes: list[Any] = []
    confirm = ObjectLease.confirm

    def observed(self: ObjectLease) -> None:
        if threading.current_thread().name == "otel-replay-lease":
            modes.append(_seam.current())
            renewed.set()
        confirm(self)

    monkeypatch.setattr(ObjectLease, "confirm", observed)
    previous = _seam.install(_Taking())
    try:
        lease = ObjectLease(f"s3://{bucket}/ds", "date=2026-01-03", ttl_seconds=0.3)
        assert lease.acquire()
        assert renewed.wait(timeout=60)
        lease.release()
    finally:
        _seam.install(previous)
    assert modes and all(mode is _seam.DIRECT for mode in modes)
