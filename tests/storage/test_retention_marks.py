"""Retention checkpoints: a chain cut by retention verifies; a deletion, a forged row or checkpoint does not."""

from __future__ import annotations

import datetime as dt
import importlib
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import otel_replay
from otel_replay import audit
from otel_replay import semconv as sc
from otel_replay.cli import main
from otel_replay.integrity import SigningKey, load_signing_key
from otel_replay.storage import drop_older_than
from otel_replay.storage.retention_marks import MARKS_DIR

from .._support import payment, snapshot, timestamps_as_ints
from ..query.test_trust import _write

audit_module = importlib.import_module("otel_replay.capture.audit")  # the package exports the function

OLD = "date=2020-01-01"


def _decide(n: int) -> list[str]:
    ids = []
    for _ in range(n):
        with audit("vendor_payment", snapshot=snapshot(), correlation_id="cut") as d:
            d.act(payment())
        ids.append(d.record_id)
    return ids


class _Clock:
    """``time`` as ``audit()`` sees it, set back to January ``day`` 2020 (``OLD``): records land in that partition."""

    def __init__(self, day: int = 1) -> None:
        self.now = int(dt.datetime(2020, 1, day, 12, tzinfo=dt.UTC).timestamp()) * 10**9

    def time_ns(self) -> int:
        self.now += 1_000
        return self.now


def _chain_across_an_old_partition(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[str]]:
    """Six records of one chain: the first three sealed on ``OLD``'s day (stored there), the rest today."""
    telemetry = otel_replay.configure(dataset, set_global=False)
    try:
        with monkeypatch.context() as patched:
            patched.setattr(audit_module, "time", _Clock())
            first = _decide(3)
        rest = _decide(3)
    finally:
        telemetry.shutdown()
    assert {p.name for p in (dataset / "spans").iterdir()} == {OLD, f"date={dt.datetime.now(dt.UTC).date()}"}
    return first, rest


def _verify(dataset: Path, key: SigningKey | None) -> otel_replay.VerifyReport:
    with otel_replay.open(dataset) as store:
        return store.verify(key)


def test_a_chain_cut_by_retention_verifies_and_says_so(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _chain_across_an_old_partition(dataset, monkeypatch)
    key = load_signing_key(create=False)
    report = drop_older_than(dataset, 30)
    assert report.dropped == [OLD] and report.checkpoints == 1 and report.links == 1 and report.unvouched == 0
    (mark,) = list((dataset / MARKS_DIR).iterdir())
    assert mark.name.startswith(OLD)
    verified = _verify(dataset, key)
    assert verified.ok, verified.problems
    assert verified.dropped_by_retention == 1 and verified.records == 3
    result = CliRunner().invoke(main, ["verify", str(dataset)])
    assert result.exit_code == 0 and "starting where retention dropped its earlier records" in result.output


def test_without_the_checkpoint_the_cut_is_reported_as_before(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _chain_across_an_old_partition(dataset, monkeypatch)
    drop_older_than(dataset, 30)
    shutil.rmtree(dataset / MARKS_DIR)
    report = _verify(dataset, load_signing_key(create=False))
    (problem,) = report.problems
    assert "dropped by retention" in problem.problem and report.dropped_by_retention == 0


def test_retention_without_a_key_writes_no_checkpoint_and_says_so(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _chain_across_an_old_partition(dataset, monkeypatch)
    monkeypatch.delenv("OTEL_REPLAY_SIGNING_KEY")
    result = CliRunner().invoke(main, ["compact", str(dataset), "--older-than", "30"])
    assert result.exit_code == 0, result.output
    assert "no signing key" in result.output and not (dataset / MARKS_DIR).exists()


def test_a_deletion_after_the_cut_is_still_reported(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, rest = _chain_across_an_old_partition(dataset, monkeypatch)
    drop_older_than(dataset, 30)
    _remove_record(dataset, rest[0])  # the first record after the cut: its successor now names a gap
    problems = [p.problem for p in _verify(dataset, load_signing_key(create=False)).problems]
    assert any(p.startswith("deleted") for p in problems), problems


@pytest.mark.parametrize(
    "span_id",
    [
        "f" * 16,  # planted at another span: its seal names the original's span, so it fails the check
        None,  # moved verbatim: its seal and place pass, but its sealed time says it is recent
    ],
)
def test_a_row_put_into_a_dropped_partition_cannot_hide_a_later_deletion(
    dataset: Path, monkeypatch: pytest.MonkeyPatch, span_id: str | None
) -> None:
    """Whoever can write files puts the deleted record's row into an old partition: retention does not vouch for it."""
    _, rest = _chain_across_an_old_partition(dataset, monkeypatch)
    schema, victim = _row_of(dataset, rest[0])
    _remove_record(dataset, rest[0])
    moved = victim if span_id is None else dict(victim, span_id=span_id)
    _write(dataset / "spans" / OLD / "moved.parquet", [moved], schema)
    report = drop_older_than(dataset, 30)
    assert report.dropped == [OLD] and report.unvouched >= 1
    problems = [p.problem for p in _verify(dataset, load_signing_key(create=False)).problems]
    assert any(p.startswith("deleted") for p in problems), problems


@pytest.mark.parametrize("edit", ["link", "signature", "key", "duplicate", "garbage", "huge"])
def test_a_forged_or_damaged_checkpoint_vouches_for_nothing_and_is_named(
    dataset: Path, monkeypatch: pytest.MonkeyPatch, edit: str
) -> None:
    _chain_across_an_old_partition(dataset, monkeypatch)
    drop_older_than(dataset, 30)
    (mark,) = list((dataset / MARKS_DIR).iterdir())
    head, body = mark.read_text().split("\n", 1)
    header, doc = json.loads(head), json.loads(body)
    if edit == "link":
        doc["runs"][0][3] = "0" * 64
    elif edit == "signature":
        header["signature"] = "0" * 64
    elif edit == "key":
        header["key_id"] = SigningKey(b"another-key-of-sixteen-bytes").key_id
    text = json.dumps(header) + "\n" + json.dumps(doc)
    if edit == "duplicate":
        text = head[:-1] + ',"key_id":"x"}\n' + body
    elif edit == "garbage":
        text = "\u0000not json"
    elif edit == "huge":  # refused unread: a forged 20 MB body is neither parsed nor held
        text = head + "\n" + " " * (20 * 1024 * 1024)
    mark.write_text(text)
    report = _verify(dataset, load_signing_key(create=False))
    assert not report.ok and report.dropped_by_retention == 0
    named = [p for p in report.problems if p.problem.startswith("retention checkpoint")]
    assert len(named) == 1 and named[0].file.endswith(mark.name), report.problems
    assert any("dropped by retention" in p.problem for p in report.problems)


def _read(path: Path) -> tuple[pa.Schema, list[dict[str, object]]]:
    table = pq.read_table(path, partitioning=None)
    plain = pa.schema([f.with_type(timestamps_as_ints(f.type)) for f in table.schema])
    return table.schema, table.cast(plain).to_pylist()


def _row_of(dataset: Path, record_id: str) -> tuple[pa.Schema, dict[str, object]]:
    for path in (dataset / "spans").rglob("*.parquet"):
        schema, rows = _read(path)
        for row in rows:
            if row["record_id"] == record_id and row["name"] == sc.SPAN_DECISION:
                return schema, row
    raise AssertionError(record_id)


def _remove_record(dataset: Path, record_id: str) -> None:
    """Rewrite the file holding ``record_id``'s decision span without it (a deletion)."""
    for path in (dataset / "spans").rglob("*.parquet"):
        schema, rows = _read(path)
        kept = [r for r in rows if not (r["record_id"] == record_id and r["name"] == sc.SPAN_DECISION)]
        if len(kept) != len(rows):
            _write(path, kept, schema)
            return
    raise AssertionError(record_id)


def test_a_checkpoint_copied_from_another_dataset_does_not_cover_a_deletion_from_a_partition_still_there(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Vouching holds only once the checkpoint's partition is gone: while it is there, so are its records."""
    first, _ = _chain_across_an_old_partition(dataset, monkeypatch)
    other = tmp_path / "copy"
    shutil.copytree(dataset, other)
    drop_older_than(other, 30)  # the copy's retention vouches for first[-1], the old partition's newest record
    shutil.copytree(other / MARKS_DIR, dataset / MARKS_DIR)
    _remove_record(dataset, first[-1])  # deleted from the partition that is still here
    report = _verify(dataset, load_signing_key(create=False))
    assert report.dropped_by_retention == 0
    assert any(p.problem.startswith("deleted") for p in report.problems), report.problems


# --- second reading ---------------------------------------------------------------------------------


def _days(dataset: Path, monkeypatch: pytest.MonkeyPatch, plan: list[tuple[int | None, int]]) -> list[list[str]]:
    """One chain: for each (day of January 2020, or None for today; how many), that many records sealed then."""
    telemetry = otel_replay.configure(dataset, set_global=False)
    made = []
    try:
        for day, count in plan:
            with monkeypatch.context() as patched:
                if day is not None:
                    patched.setattr(audit_module, "time", _Clock(day))
                made.append(_decide(count))
    finally:
        telemetry.shutdown()
    return made


def test_a_copy_of_a_kept_partitions_record_is_not_vouched_for_by_an_older_partition(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kept (busy) day's record copied into the dropped day, then deleted where it was: still a deletion."""
    from otel_replay.storage import PartitionLease

    _, kept, _ = _days(dataset, monkeypatch, [(1, 2), (2, 3), (None, 1)])
    schema, victim = _row_of(dataset, kept[1])
    _remove_record(dataset, kept[1])
    _write(dataset / "spans" / OLD / "copied.parquet", [victim], schema)
    lease = PartitionLease(dataset, "date=2020-01-02")
    assert lease.acquire()
    try:
        report = drop_older_than(dataset, 30)
    finally:
        lease.release()
    assert report.dropped == [OLD] and report.busy == ["date=2020-01-02"] and report.unvouched >= 1
    problems = [p.problem for p in _verify(dataset, load_signing_key(create=False)).problems]
    assert any(p.startswith("deleted") for p in problems), problems


def test_a_late_row_in_a_dropped_days_folder_leaves_the_cut_vouched(dataset: Path, monkeypatch: pytest.MonkeyPatch):
    _chain_across_an_old_partition(dataset, monkeypatch)
    today = next(p for p in (dataset / "spans").iterdir() if p.name != OLD)
    drop_older_than(dataset, 30)
    late = next(today.glob("*.parquet"))
    (dataset / "spans" / OLD).mkdir()
    table = pq.read_table(late, partitioning=None)
    pq.write_table(table.filter(pa.compute.is_null(table["record_id"])), dataset / "spans" / OLD / "late.parquet")
    report = _verify(dataset, load_signing_key(create=False))  # no record of the chain on that day: still cut
    assert report.ok and report.dropped_by_retention == 1, report.problems


def test_damaged_and_foreign_files_in_a_dropped_partition_do_not_stop_retention(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _chain_across_an_old_partition(dataset, monkeypatch)
    old = dataset / "spans" / OLD
    schema, row = _read(next(old.glob("*.parquet")))
    bad_json = dict(row[0], attributes='{"replay.record.hash": "x", oops')
    _write(old / "bad-json.parquet", [bad_json], schema[0] if isinstance(schema, list) else schema)
    pq.write_table(pa.table({"name": [1], "attributes": ['{"replay.record.hash":"x"}']}), old / "foreign.parquet")
    (old / "damaged.parquet").write_bytes(b"PAR1 not parquet")
    report = drop_older_than(dataset, 30)
    assert report.dropped == [OLD] and report.links == 1 and report.unvouched >= 2
    assert _verify(dataset, load_signing_key(create=False)).dropped_by_retention == 1


def test_records_signed_before_a_key_rotation_are_vouched_for_with_the_older_key(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    older = load_signing_key(create=False)
    _chain_across_an_old_partition(dataset, monkeypatch)
    newer_file = tmp_path / "new.key"
    newer_file.write_text("a-new-signing-key-after-rotation")
    older_file = tmp_path / "old.key"
    older_file.write_text(older.secret.decode())
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", "a-new-signing-key-after-rotation")
    args = ["compact", str(dataset), "--older-than", "30", "--older-key-file", str(older_file)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0 and "vouch for 1 chain cut" in result.output, result.output
    newer = load_signing_key(create=False)
    report = _verify(dataset, [newer, older])  # type: ignore[arg-type]
    alone = CliRunner().invoke(main, ["compact", str(dataset), "--older-key-file", str(older_file)])
    assert alone.exit_code == 2 and "give --older-than" in alone.output  # not silently ignored
    assert report.ok and report.dropped_by_retention == 1, report.problems


def test_a_file_where_the_checkpoint_folder_should_be_is_named_not_a_crash(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _chain_across_an_old_partition(dataset, monkeypatch)
    (dataset / MARKS_DIR).write_text("not a folder")
    report = _verify(dataset, load_signing_key(create=False))
    assert any(p.problem.startswith("retention checkpoint") for p in report.problems), report.problems
    result = CliRunner().invoke(main, ["compact", str(dataset), "--older-than", "30"])
    assert result.exit_code == 1 and "Traceback" not in result.output and "retention checkpoint" in result.output


def test_start_times_stored_in_microseconds_are_vouched_for(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _chain_across_an_old_partition(dataset, monkeypatch)
    (path,) = (dataset / "spans" / OLD).glob("*.parquet")
    table = pq.read_table(path, partitioning=None)
    at = table.schema.get_field_index("start_time")
    micro = table.set_column(at, "start_time", pa.compute.cast(table["start_time"], pa.timestamp("us", "UTC")))
    pq.write_table(micro, path)  # lossless: the clock above moves in whole microseconds
    report = drop_older_than(dataset, 30)
    assert report.links == 1 and report.unvouched == 0


def test_a_kept_record_whose_only_successor_was_dropped_cannot_be_deleted_unseen(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sequence order is not day order (a block started before midnight seals after one started after it).

    Here seq 1 is kept (sealed today) and seq 2, started on the old day, is dropped: only seq 2 named seq 1,
    so the checkpoint carries what its run's oldest record named, and verify still expects to find it.
    """
    _, kept, _, _ = _days(dataset, monkeypatch, [(1, 1), (None, 1), (1, 1), (None, 1)])
    report = drop_older_than(dataset, 30)
    assert report.dropped == [OLD] and report.links == 2
    verified = _verify(dataset, load_signing_key(create=False))
    assert verified.ok and verified.dropped_by_retention == 2, verified.problems
    _remove_record(dataset, kept[0])
    problems = [p for p in _verify(dataset, load_signing_key(create=False)).problems]
    assert any(p.problem.startswith("deleted") and p.record_id == kept[0] for p in problems), problems
