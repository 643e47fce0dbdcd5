"""Retention on S3: a partition disappears for readers at one instant (a tombstone manifest), then its objects."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

from otel_replay.storage import compact, drop_older_than, live_files
from otel_replay.storage.lease import ObjectLease
from otel_replay.storage.manifest import partition_names

from .._support import Zygote
from ..storage.conftest import load_generator
from .conftest import keys
from .test_s3_compact import _count, _make

ROOT = Path(__file__).resolve().parents[2]


def _rows_in(uri: str, partition: str) -> int:
    return _count(uri, [f for f in live_files(uri) if f"/{partition}/" in f])[0]


def test_drop_older_than_on_s3_hides_then_deletes_whole_partitions(bucket: str, s3: Any) -> None:
    uri, _ = _make(bucket)
    compact(uri, partitions=["2026-01-02"], grace_seconds=3600)  # one compacted partition, others arrival-order
    names = partition_names(uri)
    assert names[:2] == ["date=2026-01-01", "date=2026-01-02"]
    first, second = _rows_in(uri, names[0]), _rows_in(uri, names[1])
    total = _count(uri, live_files(uri))[0]
    report = drop_older_than(uri, 0, today=dt.date(2026, 1, 3))
    assert report.dropped == names[:2] and report.rows == first + second and report.busy == []
    assert _count(uri, live_files(uri))[0] == total - first - second
    # gone for readers at once; the objects stay for the grace period
    assert any(k.startswith(f"ds/spans/{names[0]}/part-") for k in keys(s3, bucket))
    assert drop_older_than(uri, 0, today=dt.date(2026, 1, 3)).dropped == []  # nothing live is left there
    # grace over: the objects and then the tombstones go; the partitions are no more
    assert drop_older_than(uri, 0, today=dt.date(2026, 1, 3), grace_seconds=0).dropped == []
    left = keys(s3, bucket, "ds/spans/")
    assert not [k for k in left if k.startswith((f"ds/spans/{names[0]}/", f"ds/spans/{names[1]}/"))]
    assert partition_names(uri) == names[2:]
    assert _count(uri, live_files(uri))[0] == total - first - second


def test_a_partition_under_an_s3_lease_is_left_and_reported(bucket: str) -> None:
    uri, _ = _make(bucket)
    lease = ObjectLease(uri, "date=2026-01-01")
    assert lease.acquire()
    try:
        report = drop_older_than(uri, 0, today=dt.date(2026, 1, 2), grace_seconds=0)
    finally:
        lease.release()
    assert report.busy == ["date=2026-01-01"] and report.dropped == []
    assert "date=2026-01-01" in partition_names(uri)


def test_compact_older_than_cli_on_s3(bucket: str, zygote: Zygote) -> None:
    uri, figures = _make(bucket)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = zygote.cli("compact", uri, "--older-than", "0", "--grace", "0", "--json", env=env)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert set(doc["retention"]["dropped"]) == {"date=2026-01-01", "date=2026-01-02", "date=2026-01-03"}
    assert doc["retention"]["rows"] == figures["spans_written"]
    assert live_files(uri) == [] and partition_names(uri) == []


def test_s3_retention_expires_outcome_claims_before_the_cutoff(bucket: str, s3: Any) -> None:
    from otel_replay.storage.outcome_claims import claim_outcome

    uri = f"s3://{bucket}/ds"
    load_generator().generate(uri, spans=100, ids=10, days=1, rows_per_file=50, duplicates=0.0, seed=5)
    claim_outcome(uri, "d-1", "o-1", True)
    assert [k for k in keys(s3, bucket, "ds/") if "/_outcomes/" in k] == ["ds/_outcomes/d-1.json"]
    kept = drop_older_than(uri, 1, today=dt.date.today())  # the claim was written today: kept
    assert kept.claims_expired == 0 and [k for k in keys(s3, bucket, "ds/") if "/_outcomes/" in k]
    report = drop_older_than(uri, 1, today=dt.date.today() + dt.timedelta(days=30), grace_seconds=0)
    # (pyarrow may leave an empty directory marker, "ds/_outcomes/", where the last object was)
    assert report.claims_expired == 1 and not [k for k in keys(s3, bucket, "ds/") if "/_outcomes/" in k[:-1]]


def test_a_chain_cut_by_retention_on_s3_verifies_by_its_checkpoint(
    tmp_path: Path, bucket: str, s3: Any, monkeypatch: Any
) -> None:
    import otel_replay
    from otel_replay.integrity import load_signing_key

    from ..storage.test_retention_marks import OLD, _chain_across_an_old_partition
    from .test_s3_facts import _upload

    local = tmp_path / "local"
    _chain_across_an_old_partition(local, monkeypatch)
    uri = _upload(s3, bucket, local)
    report = drop_older_than(uri, 30, grace_seconds=0)
    assert report.dropped == [OLD] and report.checkpoints == 1 and report.links == 1
    assert [k for k in keys(s3, bucket, "ds/_retention/") if k.endswith(".json")]
    with otel_replay.open(uri) as store:
        verified = store.verify(load_signing_key(create=False))
    assert verified.ok, verified.problems
    assert verified.dropped_by_retention == 1
