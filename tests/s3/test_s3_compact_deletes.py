"""Compaction on s3:// deletes superseded objects through DeleteObjects, per key: a failed key is retried, then kept."""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import pytest

from otel_replay.storage import compact, live_files, objects

from ..storage.conftest import load_generator
from .conftest import keys


class _Client:
    """A boto3 S3 client that counts the calls compaction makes and can refuse some keys of a DeleteObjects."""

    def __init__(self, real: Any, calls: dict[str, int], refused: dict[str, int]) -> None:
        self._real, self._calls, self._refused = real, calls, refused

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._real, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._calls[name] = self._calls.get(name, 0) + 1
            if name != "delete_objects":
                return method(*args, **kwargs)
            asked = [entry["Key"] for entry in kwargs["Delete"]["Objects"]]
            # a refused key's first N attempts fail the way S3 answers them: in Errors, the request itself succeeds
            failing = [key for key in asked if self._refused.get(key.rpartition("/")[2], 0) > 0]
            for key in failing:
                self._refused[key.rpartition("/")[2]] -= 1
            kwargs["Delete"]["Objects"] = [{"Key": key} for key in asked if key not in failing]
            answer = method(*args, **kwargs) if kwargs["Delete"]["Objects"] else {}
            errors = [{"Key": key, "Code": "InternalError", "Message": "try again"} for key in failing]
            return {**answer, "Errors": [*answer.get("Errors", []), *errors]}

        return counted


def _watched(monkeypatch: pytest.MonkeyPatch, refused: dict[str, int] | None = None) -> dict[str, int]:
    calls: dict[str, int] = {}
    real = objects.client
    monkeypatch.setattr(objects, "client", lambda location: _Client(real(location), calls, refused or {}))
    return calls


def _day(bucket: str) -> tuple[str, list[str]]:
    uri = f"s3://{bucket}/ds"
    load_generator().generate(uri, spans=120, ids=40, days=1, rows_per_file=10, duplicates=0.0, seed=3)  # type: ignore[arg-type]
    return uri, [f.rpartition("/")[2] for f in live_files(uri) if "/date=2026-01-01/" in f]


def _manifest(s3: Any, bucket: str) -> dict[str, Any]:
    key = "ds/spans/date=2026-01-01/_manifest.json"
    return json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def test_superseded_objects_go_a_batch_of_keys_a_request_not_a_head_and_delete_each(
    bucket: str, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri, inputs = _day(bucket)
    assert len(inputs) >= 11
    monkeypatch.setattr(objects, "DELETE_BATCH", 5)
    calls = _watched(monkeypatch)
    report = compact(uri, grace_seconds=0)
    assert report.partitions[0].partition == "date=2026-01-01"
    assert report.partitions[0].superseded_deleted == report.partitions[0].input_files == len(inputs)
    per_partition = [math.ceil(p.input_files / 5) for p in report.partitions if p.input_files]
    assert calls.get("delete_objects") == sum(per_partition)  # 5 keys a request, the last one fewer
    assert not calls.get("head_object")
    assert calls.get("delete_object") == len(report.partitions)  # each lease's release, no object's delete
    left = {k.rpartition("/")[2] for k in keys(s3, bucket, "ds/spans/")}
    assert not left & set(inputs)
    assert not set(_manifest(s3, bucket)["superseded"]) & set(inputs)


def test_a_key_s3_fails_to_delete_is_asked_again_then_kept_superseded_and_named(
    bucket: str, s3: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    uri, inputs = _day(bucket)
    flaky, stuck = inputs[3], inputs[7]
    real = objects.client
    _watched(monkeypatch, refused={flaky: 1, stuck: 2})  # flaky fails once, stuck on both attempts
    with caplog.at_level(logging.WARNING, logger="otel_replay"):
        report = compact(uri, grace_seconds=0)
    assert report.partitions[0].superseded_deleted == len(inputs) - 1  # the stuck one is not counted as deleted
    left = {k.rpartition("/")[2] for k in keys(s3, bucket, "ds/spans/")}
    assert left & set(inputs) == {stuck}  # flaky deleted on its second attempt, nothing else kept
    assert set(_manifest(s3, bucket)["superseded"]) & set(inputs) == {stuck}  # out of view, remembered
    assert stuck in caplog.text and "InternalError" in caplog.text and flaky not in caplog.text
    assert stuck not in {f.rpartition("/")[2] for f in live_files(uri)}
    monkeypatch.setattr(objects, "client", real)
    again = compact(uri, grace_seconds=0)  # the next run deletes it
    assert again.partitions[0].superseded_deleted == 1
    assert not {k.rpartition("/")[2] for k in keys(s3, bucket, "ds/spans/")} & set(inputs)
    assert not set(_manifest(s3, bucket)["superseded"]) & set(inputs)
