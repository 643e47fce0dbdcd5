"""Objects the store did not expect on S3: compacted objects no manifest knows are read and merged, never deleted."""

from __future__ import annotations

from typing import Any

import pytest

from otel_replay.errors import DatasetError
from otel_replay.query.store import Store
from otel_replay.storage import compact, live_files

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


def test_a_refused_s3_compaction_leaves_the_manifest_as_it_was(bucket: str, s3: Any) -> None:
    # Third review: a partition holding a file this version refuses (a newer schema version) gained one pending
    # token per refused run ("nothing was changed"), kept for the pending period in a manifest every reader fetches.
    import io
    import json

    import pyarrow.parquet as pq

    from otel_replay.errors import OtelReplayError

    uri = f"s3://{bucket}/ds"
    load_generator().generate(uri, spans=200, ids=20, days=1, rows_per_file=100, duplicates=0.0, seed=1)
    compact(uri, grace_seconds=0)  # the partition has a manifest now
    manifest_key = next(k for k in keys(s3, bucket, "ds/") if k.endswith("_manifest.json"))
    before = json.loads(s3.get_object(Bucket=bucket, Key=manifest_key)["Body"].read())
    part = next(k for k in keys(s3, bucket, "ds/") if k.endswith(".parquet"))
    table = pq.read_table(io.BytesIO(s3.get_object(Bucket=bucket, Key=part)["Body"].read()))
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"otel_replay.schema_version": b"3.0"})
    body = io.BytesIO()
    pq.write_table(table, body)
    s3.put_object(Bucket=bucket, Key=part.rsplit("/", 1)[0] + "/part-newer.parquet", Body=body.getvalue())
    for _ in range(3):
        with pytest.raises(OtelReplayError, match="part-newer"):
            compact(uri, grace_seconds=0)
    after = json.loads(s3.get_object(Bucket=bucket, Key=manifest_key)["Body"].read())
    assert after.get("pending", {}) == before.get("pending", {}) == {}
    assert after["files"] == before["files"] and after["generation"] == before["generation"]


def test_an_s3_compaction_failing_before_any_upload_takes_its_token_back(bucket: str, s3: Any) -> None:
    # A file whose footer reads but whose pages do not: the run fails while reading, after it recorded its token
    # and before it uploaded anything; the token is taken back.
    import json

    from otel_replay.errors import OtelReplayError

    uri = f"s3://{bucket}/ds"
    load_generator().generate(uri, spans=200, ids=20, days=1, rows_per_file=100, duplicates=0.0, seed=1)
    compact(uri, grace_seconds=0)
    manifest_key = next(k for k in keys(s3, bucket, "ds/") if k.endswith("_manifest.json"))
    part = next(k for k in keys(s3, bucket, "ds/") if k.endswith(".parquet"))
    data = bytearray(s3.get_object(Bucket=bucket, Key=part)["Body"].read())
    data[8:4008] = b"\xff" * 4000  # the first pages, not the footer
    s3.put_object(Bucket=bucket, Key=part.rsplit("/", 1)[0] + "/part-torn.parquet", Body=bytes(data))
    with pytest.raises(OtelReplayError):
        compact(uri, grace_seconds=0)
    after = json.loads(s3.get_object(Bucket=bucket, Key=manifest_key)["Body"].read())
    assert after.get("pending", {}) == {}
    assert not [k for k in keys(s3, bucket, "ds/") if "/compact-g2-" in k]
