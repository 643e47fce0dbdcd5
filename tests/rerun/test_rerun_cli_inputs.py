"""``otel-replay rerun``: recorded ids printed escaped, bad input named, a result that was not stored is a failure."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path

from click.testing import CliRunner

from otel_replay.cli.rerun import DIVERGED, rerun_command

from .conftest import record

EVIL = "evil\x1b]0;pwned\x07\nALL 7 SESSIONS MATCHED"


def clock() -> float:
    return time.time()


def changed() -> None:
    raise KeyError("x")


def test_recorded_session_ids_are_printed_escaped(dataset: Path) -> None:
    record(dataset, EVIL, clock)
    for args in (["--all"], [EVIL]):
        out = CliRunner().invoke(rerun_command, [*args, "--entrypoint", f"{__name__}:changed", "-d", str(dataset)])
        assert out.exit_code == DIVERGED, out.output
        # was: a raw OSC (window title) and a forged "ALL 7 SESSIONS MATCHED" line on the terminal
        assert "\x1b" not in out.output and "\x07" not in out.output
        assert not any(line.startswith("ALL 7 SESSIONS MATCHED") for line in out.output.splitlines())
        assert "evil\\x1b]0;pwned\\x07\\nALL 7 SESSIONS MATCHED" in out.output


def test_sessions_sql_that_is_not_utf8_names_the_option(dataset: Path) -> None:
    record(dataset, "s0", clock)
    sql = os.fsdecode(b"SELECT 's\xe9' AS session_id")  # a Latin-1 argument, as Python receives it
    out = CliRunner().invoke(rerun_command, ["--all", "--entrypoint", f"{__name__}:clock", "-d", str(dataset),
                                             "--sessions-sql", sql])  # fmt: skip
    assert out.exit_code == 1 and out.exception is not None and isinstance(out.exception, SystemExit)
    assert "--sessions-sql is not valid UTF-8 (byte 0xe9 at character 9)" in out.output  # was: internal error


def test_live_state_from_a_device_is_refused(dataset: Path) -> None:
    record(dataset, "s0", clock)
    args = ["s0", "--entrypoint", f"{__name__}:clock", "-d", str(dataset), "--live-state", "/dev/zero"]
    out = CliRunner().invoke(rerun_command, [*args, "--policy", "tests._support:budget_policy"])
    assert out.exit_code == 1 and "live state file /dev/zero is not a regular file" in out.output


def test_a_rerun_whose_result_cannot_be_stored_fails(dataset: Path) -> None:
    record(dataset, "s0", clock)
    today = f"date={datetime.now(UTC).date().isoformat()}"
    spans = dataset / "spans"
    (spans / today).rename(spans / "date=2020-01-01")  # the recording stays readable under another day ...
    (spans / today).write_text("")  # ... and today's partition cannot be made: the rerun's record has nowhere to go
    out = CliRunner().invoke(rerun_command, ["s0", "--entrypoint", f"{__name__}:clock", "-d", str(dataset)])
    assert ": matched" in out.output  # the rerun itself ran and matched ...
    assert out.exit_code == 1  # ... but its record was not stored: was exit 0, "matched"
    assert f"the rerun's result could not be stored in {dataset}" in out.output
