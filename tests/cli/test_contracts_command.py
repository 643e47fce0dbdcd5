"""``otel-replay contracts check`` and ``contracts infer``: reports, exit codes, and hostile input as one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import otel_replay
from otel_replay.cli import main
from otel_replay.cli.contracts import BLOCKED

from .._support import TEST_KEY
from ..contracts.recorded import recorded_dataset, refund_session

CONTRACTS = Path(__file__).resolve().parents[1] / "contracts" / "refund_bot"
SESSIONS = {
    "good": refund_session(),
    "double": [*refund_session(), refund_session()[2]],
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return recorded_dataset(tmp_path_factory, "cli", SESSIONS)


def run(*args: str):
    result = CliRunner().invoke(main, ["contracts", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    assert result.exit_code != 3, result.output  # 3 is "a bug in otel-replay"
    return result


def error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    return lines[0]


def test_check_lists_each_blocked_call_and_exits_with_the_blocked_code(dataset: Path) -> None:
    result = run("check", "--contracts", str(CONTRACTS), "--dataset", str(dataset))
    assert result.exit_code == BLOCKED == 4
    assert "2 sessions checked, 1 would have been blocked, 1 calls blocked" in result.stdout
    assert "forbidden" in result.stdout and "issue_refund" in result.stdout
    assert "good: passed" in result.stdout and "double: BLOCKED (1 calls)" in result.stdout


def test_check_of_one_passing_session_exits_zero(dataset: Path) -> None:
    result = run("check", "--contracts", str(CONTRACTS), "-d", str(dataset), "--session", "good")
    assert result.exit_code == 0, result.output
    assert "1 sessions checked, 0 would have been blocked" in result.stdout


def test_check_json_is_one_object_with_every_failure_and_its_source(dataset: Path) -> None:
    result = run("check", "--contracts", str(CONTRACTS), "-d", str(dataset), "--json")
    assert result.exit_code == BLOCKED
    report = json.loads(result.stdout)
    [double] = [s for s in report["sessions"] if s["session_id"] == "double"]
    [call] = double["blocked"]
    rules = {f["rule"]: f for f in call["failures"]}
    assert call["step"] == 4 and call["tool"] == "issue_refund"
    assert rules["forbidden"]["source"].endswith("session.yaml:1") or "session.yaml" in rules["forbidden"]["source"]
    assert report["blocked_calls"] == 1 and report["passed"] is False


def test_check_gate_mode_is_an_option(dataset: Path) -> None:
    result = run("check", "--contracts", str(CONTRACTS), "-d", str(dataset), "--gate", "strip_blocked", "--json")
    assert json.loads(result.stdout)["gate"] == "strip_blocked"
    bad = run("check", "--contracts", str(CONTRACTS), "-d", str(dataset), "--gate", "sometimes")
    assert bad.exit_code == 2  # click's usage error names the choices


def test_the_real_command_exits_with_the_blocked_code(dataset: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_REPLAY_SIGNING_KEY"] = TEST_KEY
    done = subprocess.run(
        [sys.executable, "-m", "otel_replay", "contracts", "check", "--contracts", str(CONTRACTS), "-d", str(dataset)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == BLOCKED, done.stderr
    assert "Traceback" not in done.stderr


# --- hostile input: one line, exit 1 ----------------------------------------------------------------------------


def test_a_missing_contracts_directory(dataset: Path, tmp_path: Path) -> None:
    line = error_line(run("check", "--contracts", str(tmp_path / "nope"), "-d", str(dataset)))
    assert "contracts directory" in line and "nope" in line and "does not exist" in line


def test_contracts_that_are_a_file(dataset: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("tool: x\n")
    line = error_line(run("check", "--contracts", str(tmp_path / "file"), "-d", str(dataset)))
    assert "is a file" in line


def test_a_bad_contract_names_its_file_and_line(dataset: Path, tmp_path: Path) -> None:
    contracts = tmp_path / "c"
    shutil.copytree(CONTRACTS, contracts)
    refund = contracts / "issue_refund.yaml"
    refund.write_text(refund.read_text().replace("forbids_after:", "forbid_after:"))
    line = error_line(run("check", "--contracts", str(contracts), "-d", str(dataset)))
    assert "issue_refund.yaml:18" in line and "forbid_after" in line


def test_a_missing_session_yaml(dataset: Path, tmp_path: Path) -> None:
    contracts = tmp_path / "c"
    shutil.copytree(CONTRACTS, contracts)
    (contracts / "session.yaml").unlink()
    line = error_line(run("check", "--contracts", str(contracts), "-d", str(dataset)))
    assert "session.yaml" in line


def test_a_missing_dataset(tmp_path: Path) -> None:
    line = error_line(run("check", "--contracts", str(CONTRACTS), "-d", str(tmp_path / "no-dataset")))
    assert "no-dataset" in line


def test_an_unknown_session_id(dataset: Path) -> None:
    line = error_line(run("check", "--contracts", str(CONTRACTS), "-d", str(dataset), "--session", "nobody"))
    assert "no recorded session 'nobody'" in line


def test_a_dataset_with_no_sessions(tmp_path: Path) -> None:
    # spans, but no model call with a session or correlation id; then a directory with no spans at all
    telemetry = otel_replay.configure(tmp_path / "ds", service_name="other", set_global=False)
    with telemetry.provider.get_tracer("someone").start_as_current_span(
        "chat gpt-x", attributes={"gen_ai.operation.name": "chat"}
    ):
        pass
    telemetry.shutdown()
    (tmp_path / "empty").mkdir()
    for dataset, said in ((tmp_path / "ds", "no recorded sessions"), (tmp_path / "empty", "no spans/ directory")):
        assert said in error_line(run("check", "--contracts", str(CONTRACTS), "-d", str(dataset)))
        assert said in error_line(run("infer", "-d", str(dataset), "--out", str(tmp_path / "out")))
    assert not (tmp_path / "out").exists()


def test_an_empty_dataset_option(tmp_path: Path) -> None:
    line = error_line(run("check", "--contracts", str(CONTRACTS), "-d", ""))
    assert "dataset is empty" in line


# --- infer --------------------------------------------------------------------------------------------------------


def test_infer_writes_drafts_that_check_passes_on(dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "drafts"
    result = run("infer", "-d", str(dataset), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "drafted 4 contract files" in result.stdout and "session.yaml" in result.stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "check_eligibility.yaml", "issue_refund.yaml", "lookup_customer.yaml", "session.yaml",
    ]  # fmt: skip
    # the double refund is in the data: the draft allows it (a tool called twice does not forbid itself)
    assert run("check", "--contracts", str(out), "-d", str(dataset)).exit_code == 0


def test_infer_refuses_to_overwrite_unless_forced(dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "drafts"
    out.mkdir()
    (out / "session.yaml").write_text("# my own\n")
    line = error_line(run("infer", "-d", str(dataset), "--out", str(out)))
    assert "not overwritten" in line and "--force" in line
    assert (out / "session.yaml").read_text() == "# my own\n" and len(list(out.iterdir())) == 1
    (out / "old_tool.yaml").write_text("tool: old_tool\n")
    forced = run("infer", "-d", str(dataset), "--out", str(out), "--force")
    assert forced.exit_code == 0
    assert (out / "session.yaml").read_text() != "# my own\n"
    assert "also holds old_tool.yaml, not from this draft" in forced.stderr


def test_infer_out_that_is_a_file(dataset: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    line = error_line(run("infer", "-d", str(dataset), "--out", str(tmp_path / "file")))
    assert "is a file" in line
    assert (tmp_path / "file").read_text() == "x"


def test_infer_margin_is_checked(dataset: Path, tmp_path: Path) -> None:
    assert run("infer", "-d", str(dataset), "--out", str(tmp_path / "o"), "--margin", "-1").exit_code == 2
    assert "margin" in error_line(run("infer", "-d", str(dataset), "--out", str(tmp_path / "o"), "--margin", "nan"))
    assert not (tmp_path / "o").exists()
