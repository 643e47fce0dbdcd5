"""`serve --dataset s3://...`: SDK spans sent over OTLP land in the bucket; the WAL stays on local disk."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_replay.errors import ConfigError
from otel_replay.query.store import Store
from otel_replay.server import Receiver, ServerConfig

from .._support import Zygote
from ..server.conftest import make_spans, sdk_exporter
from .conftest import keys

ROOT = Path(__file__).resolve().parents[2]


def _receiver(uri: str, wal: Path, **overrides: Any) -> Receiver:
    settings: dict[str, Any] = {
        "grpc": "127.0.0.1:0",
        "http": "127.0.0.1:0",
        "convert_workers": 0,
        "flush_seconds": 0.2,
        "drain_seconds": 5.0,
        "wal_dir": wal,
    }
    settings.update(overrides)
    return Receiver(ServerConfig(uri, **settings)).start()


@pytest.mark.parametrize("workers", [0, 1])
def test_sdk_spans_over_otlp_land_in_the_bucket(bucket: str, s3: Any, tmp_path: Path, workers: int) -> None:
    uri = f"s3://{bucket}/received"
    receiver = _receiver(uri, tmp_path / "wal", convert_workers=workers)
    try:
        spans = make_spans(60)
        for transport in ("grpc", "http"):
            exporter = sdk_exporter(receiver, transport)
            assert exporter.export(spans[:60] if transport == "grpc" else spans[60:]) == SpanExportResult.SUCCESS
            exporter.shutdown()
    finally:
        receiver.stop()  # drains and converts the whole WAL
    stored = keys(s3, bucket)
    assert stored and all(k.startswith("received/spans/date=") and k.endswith(".parquet") for k in stored)
    assert any((tmp_path / "wal").rglob("*"))  # the WAL lived on local disk
    m = receiver.metrics.snapshot()
    assert m["spans_received"] == m["spans_written"] == len(spans)
    with Store(uri) as store:
        got = store.rows("SELECT trace_id, span_id FROM spans")
    assert sorted((r["trace_id"], r["span_id"]) for r in got) == sorted(
        (f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}") for s in spans
    )


def test_two_receivers_behind_a_load_balancer_share_one_dataset(bucket: str, s3: Any, tmp_path: Path) -> None:
    uri = f"s3://{bucket}/shared"
    receivers = [_receiver(uri, tmp_path / f"wal-{name}", instance=name) for name in ("rx-a", "rx-b")]
    spans = make_spans(100)
    try:
        for n, start in enumerate(range(0, len(spans), 25)):  # round-robin by batch, like a load balancer
            exporter = sdk_exporter(receivers[n % 2], "http")
            assert exporter.export(spans[start : start + 25]) == SpanExportResult.SUCCESS
            exporter.shutdown()
    finally:
        for receiver in receivers:
            receiver.stop()
    names = keys(s3, bucket, "shared/spans/")
    assert any("rx-a" in k for k in names) and any("rx-b" in k for k in names)
    with Store(uri) as store:
        assert store.rows("SELECT count(*) AS n, count(DISTINCT (trace_id, span_id)) AS d FROM spans") == [
            {"n": len(spans), "d": len(spans)}
        ]


def test_an_s3_dataset_needs_a_local_wal_dir(bucket: str, tmp_path: Path, zygote: Zygote) -> None:
    with pytest.raises(ConfigError, match=rf"s3://{bucket}/x: give a local WAL directory"):
        ServerConfig(f"s3://{bucket}/x")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = zygote.cli(
        "serve",
        "--dataset",
        "s3://no-such-bucket-yy/x",
        "--wal-dir",
        str(tmp_path / "wal"),
        "--grpc",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        env=env,
        timeout=60,
    )
    assert done.returncode == 1 and "s3://no-such-bucket-yy/x" in done.stderr and "does not exist" in done.stderr
