"""A compactor that stalls past its lease on S3: its successor must not leave a manifest naming deleted files.

Also: lease renewal survives a failed request (a 5xx, a lost answer) and
stops only when the lease was really taken over.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError

from otel_replay.errors import DatasetError
from otel_replay.location import resolve
from otel_replay.query.store import Store
from otel_replay.storage import compact, drop_older_than, live_files
from otel_replay.storage.compact_s3 import compact_partition
from otel_replay.storage.compact_steps import Options, PartitionReport
from otel_replay.storage.lease import LeaseLost, ObjectLease
from otel_replay.storage.manifest import partition_names

from ..storage.conftest import load_generator
from .test_s3_compact import _count

OPTIONS = Options(target_rows=10**6, row_group_rows=16384, max_batch_rows=200_000, bloom=False, grace_seconds=3600)


def _spans(uri: str) -> int:
    """Distinct (trace_id, span_id) a fresh Store sees: opening it fails if a manifest names a missing file."""
    store = Store(uri)
    try:
        return int(store.rows("SELECT count(DISTINCT (trace_id, span_id)) AS n FROM spans")[0]["n"])
    finally:
        store.close()


def _stalled_holder(
    monkeypatch: pytest.MonkeyPatch, uri: str, name: str, meanwhile: Any
) -> tuple[ObjectLease, Any, threading.Event]:
    """A holder with a 0.5 s lease that stops renewing and, once its last ``confirm()`` passed, runs ``meanwhile``.

    That is the stall: the lease expires while the holder sits between its
    final check and the manifest swap, and ``meanwhile`` (another process)
    takes the partition over. Returns (lease, step hook, armed). A lease shorter than S3's one-second
    ``Last-Modified`` has expired once the server's clock passes the next second after its last write: the
    taker waits less than a second for it, not up to two.
    """
    lease = ObjectLease(resolve(uri), name, ttl_seconds=0.5)
    assert lease.acquire()
    lease._stop.set()  # it stops renewing (a long GC pause, a frozen VM, a lost network)
    assert lease._thread is not None
    lease._thread.join(timeout=5)
    armed = threading.Event()
    confirm = lease.confirm

    def stalled_confirm() -> None:
        confirm()
        if armed.is_set():  # the last check before the swap passed; the holder stalls now
            armed.clear()
            meanwhile()

    monkeypatch.setattr(lease, "confirm", stalled_confirm)

    def step(s: str) -> None:
        if s == "indexed":  # outputs and index uploaded: the next confirm() is the one before the swap
            armed.set()

    return lease, step, armed


@pytest.mark.parametrize("compacted_before", [False, True], ids=["first-compaction", "recompaction"])
def test_a_stalled_compactor_cannot_swap_after_its_successor_deleted_its_outputs(
    bucket: str, monkeypatch: pytest.MonkeyPatch, compacted_before: bool
) -> None:
    uri = f"s3://{bucket}/ds"
    generator = load_generator()
    generator.generate(uri, spans=600, ids=50, days=1, rows_per_file=100, duplicates=0.0, seed=5)  # type: ignore[arg-type]
    if compacted_before:  # the stalled holder then swaps with If-Match on the manifest's ETag
        compact(uri, grace_seconds=3600)
        generator.generate(uri, spans=200, ids=20, days=1, rows_per_file=100, duplicates=0.0, seed=9)  # type: ignore[arg-type]
    location = resolve(uri)
    name = partition_names(location)[0]
    spans = _spans(uri)
    assert spans > 0
    results: dict[str, str] = {}
    cleaned, resume = threading.Event(), threading.Event()

    def successor() -> None:
        lease = ObjectLease(location, name, ttl_seconds=1.0)
        if not lease.acquire(wait=15):  # the stalled holder's lease expires on the server's clock
            results["b"] = "no lease"
            return
        report = PartitionReport(name, "busy")

        def step(s: str) -> None:
            if s == "read":  # its cleanup (leftover deletion) is done; the stalled holder wakes up now
                cleaned.set()
                assert resume.wait(60)

        try:
            compact_partition(location, name, lease, report, OPTIONS, step=step)
            results["b"] = report.status
        except DatasetError as exc:
            results["b"] = str(exc)
        finally:
            lease.release()
            cleaned.set()

    b = threading.Thread(target=successor, daemon=True)

    def meanwhile() -> None:
        b.start()
        assert cleaned.wait(60)

    lease, step, _ = _stalled_holder(monkeypatch, uri, name, meanwhile)
    report = PartitionReport(name, "busy")
    try:
        compact_partition(location, name, lease, report, OPTIONS, step=step)
        results["a"] = report.status
    except DatasetError as exc:
        results["a"] = str(exc)
    finally:
        resume.set()
    b.join(timeout=60)
    assert not b.is_alive()
    assert _spans(uri) == spans  # the Store opens and no span was lost
    assert _count(uri, live_files(uri))[1] == spans
    assert "was changed by another process" in results["a"]  # the fence failed the stalled holder's swap
    assert results["b"] == "compacted"
    assert compact(uri, grace_seconds=3600).partitions[0].status == "current"


def test_a_stalled_first_compactor_cannot_recreate_a_partition_retention_deleted(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention deletes the tombstone manifest: a stalled holder must not re-create one naming deleted files."""
    uri = f"s3://{bucket}/ds"
    load_generator().generate(uri, spans=600, ids=50, days=2, rows_per_file=100, duplicates=0.0, seed=5)  # type: ignore[arg-type]
    location = resolve(uri)
    first, *others = partition_names(location)
    kept = _count(uri, [f for f in live_files(uri) if f"/{first}/" not in f])[1]
    dropped: list[str] = []

    def meanwhile() -> None:  # retention takes the expired lease over and drops the partition, grace 0
        report = drop_older_than(uri, 0, today=dt.date.fromisoformat(others[0][5:]), lease_wait=15, grace_seconds=0)
        dropped.extend(report.dropped)

    lease, step, _ = _stalled_holder(monkeypatch, uri, first, meanwhile)
    try:
        compact_partition(location, first, lease, PartitionReport(first, "busy"), OPTIONS, step=step)
        outcome = "compacted"
    except DatasetError as exc:
        outcome = str(exc)
    assert dropped == [first]
    assert _spans(uri) == kept  # the Store opens: the dropped partition did not come back half-named
    assert partition_names(location) == others
    assert "was changed by another process" in outcome


class _Flaky:
    """A boto3 client whose next ``failures`` PUTs fail as if the network dropped (after landing, if ``land``)."""

    def __init__(self, client: Any, failures: int, *, land: bool) -> None:
        self._client = client
        self.failures = failures
        self.land = land

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def put_object(self, **kwargs: Any) -> Any:
        if self.failures > 0:
            self.failures -= 1
            if self.land:  # the write reached S3; its answer was lost
                self._client.put_object(**kwargs)
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
        return self._client.put_object(**kwargs)


@pytest.mark.parametrize("land", [False, True], ids=["request-failed", "answer-lost"])
def test_lease_renewal_survives_failed_requests(bucket: str, land: bool) -> None:
    uri = f"s3://{bucket}/ds"
    lease = ObjectLease(uri, "date=2026-01-01", ttl_seconds=1.0)
    assert lease.acquire()
    flaky = _Flaky(lease._s3, 2, land=land)
    lease._s3 = flaky
    deadline = time.monotonic() + 10
    while flaky.failures and time.monotonic() < deadline:
        time.sleep(0.05)
    assert flaky.failures == 0  # two renewals failed
    # S3's Last-Modified has one-second resolution: 2 s after its last write a 1 s lease has expired unless renewed
    time.sleep(2.2)
    assert lease.held and lease._thread is not None and lease._thread.is_alive()
    other = ObjectLease(uri, "date=2026-01-01", ttl_seconds=1.0)
    assert not other.acquire(wait=0)  # still renewed: not expired, not taken over
    lease.confirm()
    lease.release()
    assert other.acquire(wait=0)
    other.release()


def test_a_failed_confirm_is_not_a_lost_lease_but_a_takeover_is(bucket: str) -> None:
    uri = f"s3://{bucket}/ds"
    lease = ObjectLease(uri, "date=2026-01-01", ttl_seconds=1.0)
    assert lease.acquire()
    lease._stop.set()
    assert lease._thread is not None
    lease._thread.join(timeout=5)
    real = lease._s3
    lease._s3 = _Flaky(real, 1, land=False)
    with pytest.raises(DatasetError, match="cannot write") as failed:
        lease.confirm()
    assert not isinstance(failed.value, LeaseLost) and lease.held
    lease._s3 = real
    lease.confirm()  # still held
    other = ObjectLease(uri, "date=2026-01-01")
    assert other.acquire(wait=10)  # taken over once expired: 1-2 s later (S3's Last-Modified is in whole seconds)
    with pytest.raises(LeaseLost, match="was lost"):
        lease.confirm()
    assert not lease.held
    other.release()


def test_release_after_a_lost_answer_frees_the_lease(bucket: str) -> None:
    uri = f"s3://{bucket}/ds"
    lease = ObjectLease(uri, "date=2026-01-01")
    assert lease.acquire()
    lease._s3 = _Flaky(lease._s3, 1, land=True)
    with pytest.raises(DatasetError, match="cannot write"):
        lease.confirm()  # the renewal landed, its answer did not: the ETag this holder knows is stale
    lease.release()
    other = ObjectLease(uri, "date=2026-01-01")
    assert other.acquire(wait=0)  # released at once, not left to expire after 60 s
    other.release()
