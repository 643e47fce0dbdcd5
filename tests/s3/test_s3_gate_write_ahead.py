"""Issue 20 on ``s3://``: a gate's write-ahead log stays on the local disk; its Parquet files go to the bucket."""

from __future__ import annotations

from typing import Any

import otel_replay
from otel_replay import Action, ActionGate, ReferenceLedger
from otel_replay.capture.write_ahead import log_root

from .conftest import keys


def test_a_gated_commit_on_an_s3_dataset_is_logged_locally_and_lands_in_the_bucket(
    s3: Any, bucket: str, tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", "s3-write-ahead-key-0123456789abcdef")
    dataset = f"s3://{bucket}/traces"
    telemetry = otel_replay.configure(dataset, set_global=False)
    try:
        ActionGate(ReferenceLedger(100), dataset=dataset).commit(Action("refund", {"o": 1}, cost=1.0), record_id="d-1")
        logged = list(log_root(dataset).glob("capture-*/*.wal"))
        assert logged and str(logged[0]).startswith(str(tmp_path / "cache"))  # fsynced on the local disk
        assert not [k for k in keys(s3, bucket) if "_wal" in k]  # never a log object in the bucket
    finally:
        telemetry.shutdown()
    assert [k for k in keys(s3, bucket, "traces/spans/") if "/wal-capture-" in k]
    assert not list(log_root(dataset).glob("capture-*"))  # converted and removed at shutdown
    with otel_replay.open(dataset) as store:
        rows = store.rows("SELECT executed FROM gates WHERE decision_id = 'd-1' ORDER BY recorded_at")
    assert [r["executed"] for r in rows] == ["intent", "committed"]
