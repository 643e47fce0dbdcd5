"""Review "store" on S3: compacted objects no manifest knows are read and merged, never deleted."""

from __future__ import annotations

from typing import Any

import pytest

from otel_replay.errors import DatasetError
from otel_replay.storage import compact, live_files
from otel_replay.store import Store

from ..storage.conftest import load_generator
from .conftest import keys


def _spans(uri: str, **kwargs: Any) -> int:
    with Store(uri, keys=[], require_signed=False, **kwargs) as store:
        return int(store.rows("SELECT count(*) AS n FROM spans")[0]["n"])


def test_compacted_objects_copied_in_are_read_and_survive_compaction(bucket: str, s3: Any) -> None:
    a, b = f"s3://{bucket}/a", f"s3://{bucket}/b"
    load_generator().generate(a, spans=100, ids=10, days=1, rows_per_file=50, duplicates=0.0, seed=1)
    load_generator().generate(b, spans=100, ids=10, days=1, rows_per_file=50, duplicates=0.0, seed=2)
    compact(a, grace_seconds=0)
    compact(b, grace_seconds=0)
    for key in [k for k in keys(s3, bucket, "b/") if "/compact-g" in k]:
        s3.copy_object(Bucket=bucket, Key="a/" + key[2:], CopySource={"Bucket": bucket, "Key": key})
    assert _spans(a) == 200
    report = compact(a, grace_seconds=0)
    assert report.partitions[0].status == "compacted"
    assert _spans(a) == 200  # merged in, not deleted as leftovers


def test_a_missing_compacted_object_is_skipped_and_dropped_loudly(bucket: str, s3: Any) -> None:
    uri = f"s3://{bucket}/ds"
    load_generator().generate(uri, spans=300, ids=30, days=1, rows_per_file=50, duplicates=0.0, seed=3)
    compact(uri, grace_seconds=0, target_rows=100)
    victim = sorted(k for k in keys(s3, bucket, "ds/") if "/compact-g" in k)[0]
    s3.delete_object(Bucket=bucket, Key=victim)
    with pytest.raises(DatasetError, match="missing"):
        Store(uri, keys=[], require_signed=False)
    with Store(uri, keys=[], require_signed=False, skip_corrupt=True) as store:
        assert [p.path.rpartition("/")[2] for p in store.skipped] == [victim.rpartition("/")[2]]
        assert store.rows("SELECT count(*) AS n FROM spans")[0]["n"] == 200
    report = compact(uri, grace_seconds=0, drop_missing=True)
    assert [name.rpartition("/")[2] for name in report.dropped_missing] == [victim.rpartition("/")[2]]
    assert _spans(uri) == 200
    assert len(live_files(uri)) >= 1
