"""The log views list ``logs/`` only once a query names one of them, and from then on at every refresh."""

from __future__ import annotations

from pathlib import Path

import pytest

import otel_replay
from otel_replay.errors import DatasetError
from otel_replay.exporters.schema import LOGS_DIR
from otel_replay.storage import compact
from otel_replay.storage.logs import LogWriter

from ..storage.test_log_partitions import log_request


def _write_logs(dataset: Path, prefix: str, day: int, count: int) -> None:
    writer = LogWriter(dataset, prefix)
    writer.add_payload(log_request(day, count).SerializeToString())
    writer.flush()


def test_a_store_reading_only_spans_never_lists_the_log_files(tmp_path: Path) -> None:
    dataset = tmp_path / "ds"
    _write_logs(dataset, "seg-1", 0, 2)
    broken = dataset / LOGS_DIR / "date=2026-01-01" / "_manifest.json"
    broken.write_text("{not json")  # listing logs/ now fails, naming this file
    with otel_replay.open(dataset) as store:
        assert store.rows("SELECT count(*) AS n FROM spans") == [{"n": 0}]
        store.refresh()
        assert store.rows("SELECT count(*) AS n FROM spans") == [{"n": 0}]
        with pytest.raises(DatasetError, match=r"_manifest\.json"):
            store.rows("SELECT count(*) FROM log_records")


def test_log_views_named_after_other_queries_see_every_log_file_and_follow_refreshes(tmp_path: Path) -> None:
    dataset = tmp_path / "ds"
    _write_logs(dataset, "seg-1", 0, 2)
    with otel_replay.open(dataset) as store:
        assert store.rows("SELECT count(*) AS n FROM spans") == [{"n": 0}]  # the analyst database exists now
        assert store.rows("SELECT count(*) AS n FROM LOG_RECORDS") == [{"n": 2}]  # remade to read the log files
        _write_logs(dataset, "seg-2", 1, 3)
        store.refresh()
        assert store.rows("SELECT count(*) AS n FROM spans") == [{"n": 0}]
        assert store.rows("SELECT count(*) AS n FROM genai_events") == [{"n": 5}]


def test_a_log_compaction_after_the_listing_is_read_through_not_failed(tmp_path: Path) -> None:
    dataset = tmp_path / "ds"
    for n in range(3):
        _write_logs(dataset, f"seg-{n}", 0, 2)
    with otel_replay.open(dataset) as store:
        assert store.rows("SELECT count(*) AS n FROM log_records") == [{"n": 6}]
        compact(dataset, grace_seconds=0)  # the files the store listed are gone at once
        assert store.rows("SELECT count(*) AS n FROM log_records") == [{"n": 6}]


def test_the_log_views_of_a_dataset_path_with_glob_characters_read_only_its_own_files(tmp_path: Path) -> None:
    # Each listed log file was read as a glob: ds[1]'s file also matched ds1's copy of it (counted twice).
    import shutil

    dataset = tmp_path / "ds[1]"
    _write_logs(dataset, "seg-1", 0, 2)
    shutil.copytree(dataset, tmp_path / "ds1")
    with otel_replay.open(dataset) as store:
        rows = store.rows("SELECT count(*) AS n, count(DISTINCT filename) AS files FROM log_records")
        assert rows == [{"n": 2, "files": 1}]
        (name,) = store.rows("SELECT DISTINCT filename FROM log_records")
        assert Path(name["filename"]).is_relative_to(dataset)
