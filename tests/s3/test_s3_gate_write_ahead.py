"""Issue 20 on ``s3://``: a gate's write-ahead log stays on the local disk; its Parquet files go to the bucket."""

from __future__ import annotations

import os
from typing import Any

import otel_replay
from otel_replay import Action, ActionGate, ReferenceLedger
from otel_replay.capture.write_ahead import log_root
from otel_replay.storage.compact import compact
from tests.gate.test_gate_write_ahead import _CHILD, KEY, _gates, _no_row_twice, _reopen

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


def test_a_compaction_between_a_death_mid_conversion_and_the_recovery_leaves_every_record_once_on_s3(
    zygote, s3: Any, bucket: str, tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    dataset = f"s3://{bucket}/traces"
    env = {**os.environ, "OTEL_REPLAY_SIGNING_KEY": KEY}
    child = zygote.run(_CHILD, dataset, "converting_bytes", "kill", str(tmp_path / "rail.txt"), env=env)
    assert child.returncode == -9, child.stderr
    decision_id, *said = child.stdout.split()
    assert said[-1] == "converted-by:otel_replay.capture.log_recovery"  # its files uploaded, the segment kept
    (segment,) = [p for p in log_root(dataset).glob("capture-*/*.wal") if p.stat().st_size]  # on the local disk
    written = [k for k in keys(s3, bucket, "traces/spans/") if "/wal-capture-" in k]
    assert written
    compact(dataset, grace_seconds=0)  # as serve's or the exporter's background compactor does, before a recovery
    # Was: the uploaded files were merged into a compacted object and deleted, and the recovery uploaded them
    # again beside it: the intent and the commit record of the refund were stored twice.
    assert [k for k in keys(s3, bucket, "traces/spans/") if "/wal-capture-" in k] == written  # left for later
    _reopen(dataset, monkeypatch)  # the recovery: the segment converted again (the same names), then released
    assert not segment.exists()
    for _ in range(2):  # after the recovery, and after the compaction that takes the files now
        with otel_replay.open(dataset) as store:
            assert _gates(store, decision_id) == ["intent", "committed"]
            _no_row_twice(store)
        compact(dataset, grace_seconds=0)
    assert not [k for k in keys(s3, bucket, "traces/spans/") if "/wal-capture-" in k]
