"""ParquetSpanExporter(compact_every_seconds=N): past days are compacted in the background, on disk and on S3."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from otel_replay.errors import ConfigError
from otel_replay.exporters import ParquetSpanExporter
from otel_replay.query.store import Store
from otel_replay.storage import live_files
from otel_replay.storage.manifest import is_compacted_name


@pytest.mark.parametrize("where", ["local", "s3"])
def test_exporter_compacts_past_days_in_the_background(where: str, bucket: str, tmp_path: Path) -> None:
    dataset = str(tmp_path / "ds") if where == "local" else f"s3://{bucket}/ds"
    exporter = ParquetSpanExporter(dataset, max_age_seconds=3600, compact_every_seconds=0.3)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    yesterday = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    start = int(yesterday.timestamp() * 1e9)
    for i in range(45):  # 45 spans yesterday, in five files
        tracer.start_span(f"old-{i}", start_time=start + i).end(end_time=start + i + 10)
        if i % 10 == 9:
            assert exporter.force_flush()
    for i in range(5):
        with tracer.start_as_current_span(f"today-{i}"):
            pass
    assert exporter.force_flush()
    day = f"date={yesterday.date().isoformat()}/"

    def yesterday_compacted() -> bool:
        old = [f for f in live_files(dataset) if day in f]
        return bool(old) and all(is_compacted_name(f.rpartition("/")[2]) for f in old)

    # A pass may run between two flushes (it compacts the files there then); a later pass takes the rest.
    deadline = time.monotonic() + 30
    while not (exporter.compaction.partitions_compacted >= 1 and yesterday_compacted()):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    provider.shutdown()
    assert exporter.compaction.partitions_compacted >= 1 and exporter.compaction.compaction_errors == 0
    files = live_files(dataset)
    old = [f for f in files if day in f]
    assert old and all(is_compacted_name(f.rpartition("/")[2]) for f in old)
    assert not [f for f in files if day not in f and is_compacted_name(f.rpartition("/")[2])]  # today untouched
    with Store(dataset) as store:
        assert store.rows("SELECT count(*) AS n FROM spans") == [{"n": 50}]


def test_a_bad_compaction_interval_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="compact_every_seconds"):
        ParquetSpanExporter(tmp_path / "x", compact_every_seconds=float("nan"))
    monkeypatch.setenv("OTEL_REPLAY_COMPACT_EVERY", "soon")
    with pytest.raises(ConfigError, match="OTEL_REPLAY_COMPACT_EVERY"):
        ParquetSpanExporter(tmp_path / "x")
