"""Facts files on S3: compaction writes them before its manifest swap; the Store reads them for remote datasets."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otel_replay.query.store import Store
from otel_replay.storage import compact, drop_older_than
from otel_replay.storage.facts import plan

from ..storage.test_facts import (
    VIEWS_CALIBRATION,
    VIEWS_SUMMARY,
    _norm,
    hostile_dataset,
    late_files,
    watch_facts_use,
)
from .conftest import keys

_DTYPES = (None, "alpha", "entry")


def _upload(s3: Any, bucket: str, local: Path, only_new: bool = False) -> str:
    """``local`` (a dataset directory) copied to ``s3://bucket/ds``; with ``only_new``, objects not there yet."""
    there = set(keys(s3, bucket, "ds/")) if only_new else set()
    for path in sorted(local.rglob("*")):
        key = f"ds/{path.relative_to(local).as_posix()}"
        if path.is_file() and key not in there:
            s3.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    return f"s3://{bucket}/ds"


def _figures_of(store: Store) -> list[Any]:
    return [(_norm(store.calibration(t)), _norm(store.decision_summary(t))) for t in _DTYPES]


def _figures(ds: str | Path) -> list[Any]:
    with Store(ds) as store:
        return _figures_of(store)


def _check_same(ds: str, *, facts_expected: bool) -> list[Any]:
    """The facts queries equal the views' figures on the S3 dataset (which are returned, as ``_figures`` gives
    them); whether facts files were planned as expected. One Store, each figure query once."""
    with Store(ds) as store:
        sizes = {path: stamp[0] for path, stamp in store.engine.triage.checked.items()}
        found = plan(store.files, sizes, store.location)
        assert bool(found.fact_files) == facts_expected, found
        assert all(f.startswith("s3://") for f in found.fact_files)
        figures = _figures_of(store)
        views = [(_norm(store.rows(VIEWS_CALIBRATION, [t])), _norm(store.rows(VIEWS_SUMMARY, [t]))) for t in _DTYPES]
        assert figures == views
    return figures


def _facts_keys(s3: Any, bucket: str) -> list[str]:
    return [k for k in keys(s3, bucket, "ds/spans/") if k.rpartition("/")[2].startswith("_facts-")]


@pytest.fixture
def local(tmp_path: Path) -> Path:
    return hostile_dataset(tmp_path)


def test_s3_compaction_writes_facts_the_store_uses_with_the_local_figures(
    local: Path, bucket: str, s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = _upload(s3, bucket, local)
    before = _check_same(uri, facts_expected=False)
    assert before == _figures(local)
    compact(uri, grace_seconds=0)
    assert len(_facts_keys(s3, bucket)) == 2
    used = watch_facts_use(monkeypatch)
    assert _check_same(uri, facts_expected=True) == before
    assert used and all(used)  # every calibration / decision_summary read the facts objects
    # the same rows as the local compaction's facts files, and the same checked list (file names differ by token)
    compact(local, grace_seconds=0)
    assert _figures(local) == before
    remote = sorted(_facts_keys(s3, bucket))
    mine = sorted(local.glob("spans/*/_facts-*.pq"))
    for key, path in zip(remote, mine, strict=True):
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        (tmp_path / "remote.pq").write_bytes(body)
        got, want = pq.read_table(tmp_path / "remote.pq"), pq.read_table(path)
        assert got.num_rows == want.num_rows > 0
        # as multisets: rows tied in the file's sort may come in any order (and DuckDB takes NaN as equal to NaN)
        con = duckdb.connect()
        con.register("got", got)
        con.register("want", want)
        one_way = "SELECT count(*) FROM (FROM {} EXCEPT ALL FROM {})"
        assert con.execute(one_way.format("got", "want")).fetchone() == (0,)
        assert con.execute(one_way.format("want", "got")).fetchone() == (0,)
        con.close()
        checked = [json.loads(t.schema.metadata[b"otel_replay.facts.checked"]) for t in (got, want)]
        assert [[re.sub(r"-[0-9a-f]{12}\.pq$", "", n) for n in names] for names in checked] == [
            ["date=2026-01-01/_facts-g1"] if "2026-01-02" in key else []
        ] * 2
        covered = json.loads(got.schema.metadata[b"otel_replay.facts.files"])
        folder = key.rpartition("/")[0]
        sizes = {
            k.rpartition("/")[2]: s3.head_object(Bucket=bucket, Key=k)["ContentLength"]
            for k in keys(s3, bucket, folder + "/")
        }
        assert covered and all(sizes[name] == size for name, size in covered)


def test_arrivals_after_s3_compaction_are_read_from_the_spans(local: Path, bucket: str, s3: Any) -> None:
    uri = _upload(s3, bucket, local)
    compact(uri, grace_seconds=0)
    before = _figures(uri)
    late_files(local)
    _upload(s3, bucket, local, only_new=True)
    after = _check_same(uri, facts_expected=True)
    assert after != before
    assert after == _figures(local)  # local: not compacted, every row from the spans
    report = compact(uri, grace_seconds=0)  # generation 2: the late files merged, facts rewritten
    assert report.partitions[0].status == "compacted"
    assert _check_same(uri, facts_expected=True) == after
    assert len(_facts_keys(s3, bucket)) == 2  # the superseded generation's facts deleted with grace 0


@pytest.mark.slow
def test_stale_forged_or_damaged_facts_objects_are_ignored(
    local: Path, bucket: str, s3: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = _upload(s3, bucket, local)
    compact(uri, grace_seconds=0)
    expected = _figures(uri)
    first, second = _facts_keys(s3, bucket)
    body = s3.get_object(Bucket=bucket, Key=second)["Body"].read()
    (tmp_path / "f.pq").write_bytes(body)
    table = pq.read_table(tmp_path / "f.pq")
    s3.put_object(Bucket=bucket, Key=first, Body=b"PAR1 not really parquet PAR1")  # damaged
    assert _check_same(uri, facts_expected=True) == expected
    assert "not used" in caplog.text
    # a footer naming other sizes than the compacted objects': stale or forged, ignored
    meta = dict(table.schema.metadata)
    covered = json.loads(meta[b"otel_replay.facts.files"])
    covered[0][1] += 1
    meta[b"otel_replay.facts.files"] = json.dumps(covered).encode()
    pq.write_table(table.replace_schema_metadata(meta), tmp_path / "g.pq")
    s3.put_object(Bucket=bucket, Key=second, Body=(tmp_path / "g.pq").read_bytes())
    assert _check_same(uri, facts_expected=False) == expected
    # a footer naming a file the partition does not have
    meta[b"otel_replay.facts.files"] = json.dumps([["compact-g1-0-000000000000.parquet", 1]]).encode()
    pq.write_table(table.replace_schema_metadata(meta), tmp_path / "h.pq")
    s3.put_object(Bucket=bucket, Key=second, Body=(tmp_path / "h.pq").read_bytes())
    assert _check_same(uri, facts_expected=False) == expected
    # another schema under the right name
    pq.write_table(pa.table({"kind": ["decision"]}).replace_schema_metadata(meta), tmp_path / "i.pq")
    s3.put_object(Bucket=bucket, Key=second, Body=(tmp_path / "i.pq").read_bytes())
    assert _check_same(uri, facts_expected=False) == expected


def test_a_crash_between_the_facts_object_and_the_swap_leaves_right_answers(local: Path, bucket: str, s3: Any) -> None:
    uri = _upload(s3, bucket, local)
    expected = _figures(uri)

    def crash(step: str) -> None:
        if step == "indexed":  # the facts object is uploaded, the manifest not yet swapped
            raise KeyboardInterrupt("crash")

    with pytest.raises(KeyboardInterrupt):
        compact(uri, grace_seconds=0, _on_step=crash)
    assert len(_facts_keys(s3, bucket)) == 1  # written, never named
    assert _check_same(uri, facts_expected=False) == expected
    report = compact(uri, grace_seconds=0)
    assert report.partitions[0].leftovers_deleted >= 1
    assert len(_facts_keys(s3, bucket)) == 2  # the crashed run's facts object deleted, each partition's written
    assert _check_same(uri, facts_expected=True) == expected


def test_retention_on_s3_keeps_facts_for_the_grace_period_then_drops_them(local: Path, bucket: str, s3: Any) -> None:
    uri = _upload(s3, bucket, local)
    compact(uri, grace_seconds=0)
    assert len(_facts_keys(s3, bucket)) == 2
    # day 0 dropped with a grace period: its facts object stays (a reader may still use the old manifest) ...
    assert drop_older_than(uri, 0, today=dt.date(2026, 1, 2), grace_seconds=3600).dropped == ["date=2026-01-01"]
    assert len(_facts_keys(s3, bucket)) == 2
    _check_same(uri, facts_expected=True)  # day 1's facts still used; day 0 no longer read
    # ... and is deleted with the partition once the grace period is over
    drop_older_than(uri, 0, today=dt.date(2026, 1, 2), grace_seconds=0)
    assert [k.split("/")[2] for k in _facts_keys(s3, bucket)] == ["date=2026-01-02"]


def test_one_s3_run_lists_the_dataset_once_for_the_other_partitions_facts(
    tmp_path: Path, bucket: str, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On S3 finding the other partitions' facts lists the whole dataset and GETs every manifest: once per run.
    from otel_replay.storage import facts as facts_module

    from ..storage.test_facts import count_calls, one_pair_a_day

    local = tmp_path / "ds"
    one_pair_a_day(local, 4)
    uri = _upload(s3, bucket, local)
    listings = count_calls(monkeypatch, facts_module, "remote_partitions")
    compact(uri, grace_seconds=0)
    assert listings[0] == 1
    found = sorted(_facts_keys(s3, bucket))
    for day, key in enumerate(found):
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        checked = json.loads(pq.read_schema(pa.BufferReader(body)).metadata[b"otel_replay.facts.checked"])
        assert checked == [k.removeprefix("ds/spans/") for k in found[:day]]
    _check_same(uri, facts_expected=True)
