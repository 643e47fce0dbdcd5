"""Retention drops whole partitions (counted); the ``compact`` command reports and fails in one line."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from click.testing import CliRunner

from otel_replay.cli.storage import compact_command
from otel_replay.errors import ConfigError
from otel_replay.storage import PartitionLease, drop_older_than, live_files
from otel_replay.storage.manifest import partition_dirs

from .conftest import count_rows


def _rows_of(path, partition: str) -> int:
    return count_rows([f for f in live_files(path) if f"/{partition}/" in f])[0]


def test_drop_older_than_removes_whole_old_partitions_only(make_dataset) -> None:
    path, figures = make_dataset(spans=1000, ids=100)
    names = [p.name for p in partition_dirs(path)]
    assert names[:2] == ["date=2026-01-01", "date=2026-01-02"]
    first_rows = _rows_of(path, names[0])
    report = drop_older_than(path, 1, today=dt.date(2026, 1, 3))
    assert report.dropped == ["date=2026-01-01"] and report.rows == first_rows > 0 and report.busy == []
    assert [p.name for p in partition_dirs(path)] == names[1:]
    assert count_rows(live_files(path))[0] == figures["spans_written"] - first_rows
    assert not (path / "spans" / "date=2026-01-01").exists()
    assert drop_older_than(path, 1, today=dt.date(2026, 1, 3)).dropped == []  # idempotent


def _drop_while_leased(path, partition: str, days: int, today: dt.date):  # type: ignore[no-untyped-def]
    """``drop_older_than`` while another holder has ``partition``'s lease."""
    lease = PartitionLease(path, partition)
    assert lease.acquire()
    try:
        return drop_older_than(path, days, today=today)
    finally:
        lease.release()


def test_a_partition_under_lease_is_left_and_reported(make_dataset) -> None:
    path, _ = make_dataset(spans=300, ids=30)
    report = _drop_while_leased(path, "date=2026-01-01", 0, dt.date(2027, 1, 1))
    assert report.busy == ["date=2026-01-01"]
    assert [p.name for p in partition_dirs(path)] == ["date=2026-01-01"]


@pytest.mark.parametrize("days", [-1, 1.5, True, 10**7, "3"])
def test_bad_days_are_config_errors(make_dataset, days: object) -> None:
    path, _ = make_dataset(spans=100, ids=10)
    with pytest.raises(ConfigError, match="days"):
        drop_older_than(path, days)  # type: ignore[arg-type]


def test_command_compacts_and_reports(make_dataset) -> None:
    path, figures = make_dataset()
    result = CliRunner().invoke(compact_command, [str(path), "--grace", "0"])
    assert result.exit_code == 0, result.output
    assert f"{figures['duplicates_written']} exact duplicates removed" in result.output
    assert f"{figures['spans_written']} -> {figures['unique_spans']} spans" in result.output
    again = CliRunner().invoke(compact_command, [str(path), "--json"])
    doc = json.loads(again.output)
    assert {p["status"] for p in doc["partitions"]} == {"current"}


def test_command_retention_and_partition(make_dataset) -> None:
    path, figures = make_dataset(spans=1000, ids=100)
    result = CliRunner().invoke(compact_command, [str(path), "--partition", "date=2026-01-02", "--grace", "0"])
    assert result.exit_code == 0, result.output
    assert "date=2026-01-02: compacted" in result.output and "date=2026-01-01" not in result.output
    before = len(partition_dirs(path))
    rows = count_rows(live_files(path))[0]
    result = CliRunner().invoke(compact_command, [str(path), "--older-than", "0"])
    assert result.exit_code == 0, result.output
    assert f"retention: dropped {before} partition(s) older than 0 days" in result.output
    assert f"files, {rows} spans)" in result.output and partition_dirs(path) == []


@pytest.mark.parametrize(
    "args, message",
    [
        (["--partition", "date=1999-01-01"], "no partition date=1999-01-01"),
        (["--older-than", "-1"], "-1"),
        (["--target-rows", "0"], "target-rows"),
    ],
)
def test_command_user_errors_are_one_line(make_dataset, args: list[str], message: str) -> None:
    path, _ = make_dataset(spans=100, ids=10)
    result = CliRunner().invoke(compact_command, [str(path), *args])
    assert result.exit_code in (1, 2)
    assert message in result.output and "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_command_missing_dataset(tmp_path) -> None:
    result = CliRunner().invoke(compact_command, [str(tmp_path / "nope")])
    assert result.exit_code == 1 and "does not exist" in result.output


def _claims(path) -> list[str]:
    return sorted(p.relative_to(path).as_posix() for d in ("_outcomes", "_compensations") for p in (path / d).glob("*"))


def test_retention_expires_outcome_and_compensation_claims_older_than_the_cutoff(make_dataset) -> None:
    # One claim file per outcome and per compensated receipt would pile up for ever; retention deletes those
    # last written before the cutoff (their decisions and receipts are dropped with the partitions), never a
    # lock file, and none while a partition before the cutoff is left busy.
    import contextlib
    import os
    import sqlite3

    from otel_replay.gate.claims import ClaimState, CompensationClaims
    from otel_replay.storage.outcome_claims import claim_outcome

    path, _ = make_dataset(spans=300, ids=30)
    old = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC).timestamp()  # in the first partition's day
    claim_outcome(path, "old-decision", "o-1", True)
    claim_outcome(path, "new-decision", "o-2", False)
    store = path / "_outcomes" / "claims.sqlite3"
    with contextlib.closing(sqlite3.connect(store)) as con, con:  # as if claimed on that day
        con.execute("UPDATE outcome_claims SET claimed_ns = ? WHERE decision_id = 'old-decision'", (int(old * 1e9),))
    # a claim file an older version wrote (one file per outcome), on that day too
    (path / "_outcomes" / "older-version.json").write_text('{"claimant": "pid 1 on old"}')
    claims = CompensationClaims(path)
    claims.finish(claims.claim("old-key", decision_id="old-decision", receipt_id="r-1"), ClaimState.DONE)
    for name in ("_outcomes/older-version.json", "_compensations/old-key.json", "_compensations/old-key.lock"):
        os.utime(path / name, (old, old))
    everything = _claims(path)
    busy = _drop_while_leased(path, "date=2026-01-01", 1, dt.date(2026, 1, 3))
    assert busy.busy == ["date=2026-01-01"] and busy.claims_expired == 0 and _claims(path) == everything
    report = drop_older_than(path, 1, today=dt.date(2026, 1, 3))
    assert report.dropped == ["date=2026-01-01"] and report.claims_expired == 3
    assert _claims(path) == sorted(
        n for n in everything if n not in ("_outcomes/older-version.json", "_compensations/old-key.json")
    )
    assert "_compensations/old-key.lock" in _claims(path)  # the store's files stay; only its old rows went
    with contextlib.closing(sqlite3.connect(store)) as con:
        assert con.execute("SELECT decision_id FROM outcome_claims").fetchall() == [("new-decision",)]
