"""Bad CLI arguments: each is one line naming the argument, variable or file; nothing is lost or misreported."""

from __future__ import annotations

from pathlib import Path

import pytest

from .._support import Demo
from .test_cli_inputs import error_line, run


@pytest.fixture
def demo(demo_dataset: Path, demo_build: Demo) -> tuple[Path, str]:
    """The shared demo dataset (read-only) and its decision's record id."""
    return demo_dataset, demo_build.record_id


def _replay(demo: tuple[Path, str], live: Path, *extra: str):
    dataset, record_id = demo
    policy = "otel_replay.demo:budget_policy"
    return run("replay", record_id, "-d", str(dataset), "--live-state", str(live), "--policy", policy, *extra)


# --- 8: a number too large for a float is not infinity ----------------------------------------------------------


def test_a_live_state_number_too_large_for_a_float_is_refused_naming_file_line_and_column(demo, tmp_path):
    live = tmp_path / "live.json"
    live.write_text('{"allow_list": ["acme-supplies"],\n "budget_remaining": 1e999}')
    result = _replay(demo, live)  # was: read as infinity, so the over-budget payment was ALLOWed, exit 0
    assert result.exit_code == 1 and "ALLOW" not in result.output
    line = error_line(result)
    assert f"live state {live}: the number 1e999 is too large for a float (line 2, column 22" in line


# --- 9: compact on a directory that is not the dataset root --------------------------------------------------


def test_compact_on_a_wrong_directory_is_refused_not_reported_as_done(demo, tmp_path):
    dataset, _ = demo
    spans = dataset / "spans"
    for wrong, said in (
        (spans, f"dataset {spans} has no spans/ directory (is this the dataset root?)"),
        (tmp_path, f"dataset {tmp_path} has no spans/ directory"),
    ):
        result = run("compact", str(wrong), "--older-than", "30")  # was: "retention: dropped 0 partition(s)", exit 0
        assert result.exit_code == 1 and said in error_line(result) and "dropped" not in result.output
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert f"dataset {a_file} is a file, not a directory" in error_line(run("compact", str(a_file)))


# --- 10: tree prints every stored field escaped, the span id too ---------------------------------------------


@pytest.mark.parametrize("hostile", ["\x1b]0;PWNED\x1b\\", "\x1b[2K\rOK no problems found\x1b[8m", "\u202eevil"])
def test_tree_escapes_a_stored_span_id(capsys, hostile):
    from otel_replay.cli.render import print_tree

    print_tree([{"depth": 1, "name": "tool.call", "replay_kind": None, "duration_ns": 1, "span_id": hostile}])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\u202e" not in out
    assert "span=\\x1b" in out or "span=\\u202e" in out


# --- minor b: every bad argument is one line naming it -----------------------------------------------------------


@pytest.mark.parametrize("option", ["--policy", "--rail"])
def test_a_relative_module_reference_names_the_option_not_a_bug(demo, tmp_path, option):
    live = tmp_path / "live.json"
    live.write_text('{"budget_remaining": 0, "allow_list": []}')
    extra = ["--execute", "--rail", ".rails:ledger"] if option == "--rail" else []
    dataset, record_id = demo
    policy = ".policies:p" if option == "--policy" else "otel_replay.demo:budget_policy"
    result = run("replay", record_id, "-d", str(dataset), "--live-state", str(live), "--policy", policy, *extra)
    line = error_line(result)  # was: "internal error: TypeError: the 'package' argument is required", exit 3
    assert result.exit_code == 1 and "cannot import module" in line and "give its absolute name" in line


def test_rail_or_resume_without_execute_is_a_usage_error(demo, tmp_path):
    live = tmp_path / "live.json"
    live.write_text('{"budget_remaining": 0, "allow_list": []}')
    for extra, said in (
        (["--rail", "otel_replay.demo:demo_ledger"], "--rail only applies with --execute"),
        (["--resume"], "--resume only applies with --execute"),
        (["--rail", "otel_replay.demo:demo_ledger", "--resume"], "--rail and --resume only apply with --execute"),
    ):
        result = _replay(demo, live, *extra)  # was: exit 0, the verdict printed, nothing compensated, nothing said
        assert result.exit_code == 2 and said in error_line(result)


def test_ids_that_are_not_utf8_name_the_argument(demo):
    dataset, record_id = demo
    for args, named in (
        (["replay", "\udce9" + record_id, "--live-state", "x", "--policy", "m:f"], "RECORD_ID"),
        (["tree", "\udce9" + record_id], "RECORD_ID"),
        (["chain", "trade", "\udce9x"], "CHAIN_ID"),
        (["calibration", "--decision-type", "\udce9x"], "--decision-type"),
    ):
        result = run(*args, "-d", str(dataset))  # was: "InvalidInputException: ... Python Conversion Failure"
        assert f"{named} is not valid UTF-8 (byte 0xe9 at character 0)" in error_line(result)
