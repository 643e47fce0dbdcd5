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

from .._support import payment, snapshot
from ..test_trust import _ints, _write

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
    """``time`` as ``audit()`` sees it, set back to ``OLD``'s day: its records land in that partition."""

    def __init__(self) -> None:
        self.now = int(dt.datetime(2020, 1, 1, 12, tzinfo=dt.UTC).timestamp()) * 10**9

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


@pytest.mark.parametrize("edit", ["link", "signature", "key", "duplicate", "garbage"])
def test_a_forged_or_damaged_checkpoint_vouches_for_nothing_and_is_named(
    dataset: Path, monkeypatch: pytest.MonkeyPatch, edit: str
) -> None:
    _chain_across_an_old_partition(dataset, monkeypatch)
    drop_older_than(dataset, 30)
    (mark,) = list((dataset / MARKS_DIR).iterdir())
    doc = json.loads(mark.read_text())
    text = mark.read_text()
    if edit == "link":
        doc["links"][0][3] = "0" * 64
    elif edit == "signature":
        doc["signature"] = "0" * 64
    elif edit == "key":
        doc["key_id"] = SigningKey(b"another-key-of-sixteen-bytes").key_id
    if edit == "duplicate":
        text = text[:-1] + ',"partition":"date=1999-01-01"}'
    elif edit == "garbage":
        text = "\u0000not json"
    else:
        text = json.dumps(doc)
    mark.write_text(text)
    report = _verify(dataset, load_signing_key(create=False))
    assert not report.ok and report.dropped_by_retention == 0
    named = [p for p in report.problems if p.problem.startswith("retention checkpoint")]
    assert len(named) == 1 and named[0].file.endswith(mark.name)
    assert any("dropped by retention" in p.problem for p in report.problems)


def _read(path: Path) -> tuple[pa.Schema, list[dict[str, object]]]:
    table = pq.read_table(path, partitioning=None)
    return table.schema, table.cast(pa.schema([f.with_type(_ints(f.type)) for f in table.schema])).to_pylist()


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
