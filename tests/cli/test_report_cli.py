"""``otel-replay report`` and ``otel-replay ui`` from the command line: pages written whole, user errors in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

import otel_replay
from otel_replay.cli import main
from otel_replay.cli.ui import _loopback


def _ids(demo_dataset: Path) -> tuple[str, str]:
    with otel_replay.open(demo_dataset) as store:
        (row,) = store.rows("SELECT record_id, correlation_id FROM decisions")
    return row["record_id"], row["correlation_id"]


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_report_chain_and_decision_write_one_page_each(demo_dataset: Path, tmp_path: Path) -> None:
    record_id, cid = _ids(demo_dataset)
    code, out = _run("report", "chain", "trade", cid, "-d", str(demo_dataset), "-o", str(tmp_path / "c.html"))
    assert code == 0 and out.startswith(f"wrote {tmp_path / 'c.html'}")
    assert "invoice_received" in (tmp_path / "c.html").read_text()
    live = demo_dataset / "demo-live-state.json"
    args = ["report", "decision", record_id, "-d", str(demo_dataset), "-o", str(tmp_path / "d.html")]
    code, out = _run(*args, "--live-state", str(live), "--policy", "otel_replay.demo:budget_policy")
    assert code == 0, out
    page = (tmp_path / "d.html").read_text()
    assert "ROLLBACK" in page and "replay.model" in page
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_an_existing_output_is_kept_unless_force_is_given(demo_dataset: Path, tmp_path: Path) -> None:
    _, cid = _ids(demo_dataset)
    target = tmp_path / "c.html"
    target.write_text("keep me")
    args = ["report", "chain", "trade", cid, "-d", str(demo_dataset), "-o", str(target)]
    code, out = _run(*args)
    assert code == 1 and "exists; give --force to overwrite it" in out and target.read_text() == "keep me"
    code, out = _run(*args, "--force")
    assert code == 0 and "invoice_received" in target.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["chain", "trade", "no-such-chain"], "no trade chain 'no-such-chain'"),
        (["decision", "no-such-decision"], "no decision record 'no-such-decision'"),
        (["rerun", "no-such-session"], "no recording for session 'no-such-session'"),
        (["decision", "x", "--live-state", "s.json"], "--live-state and --policy go together"),
    ],
)
def test_unknown_ids_and_options_that_do_not_go_together_are_one_line(
    demo_dataset: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    code, out = _run("report", *args, "-d", str(demo_dataset), "-o", str(tmp_path / "x.html"))
    assert code == 1 and message in out and "Traceback" not in out and len(out.strip().splitlines()) == 1
    assert not (tmp_path / "x.html").exists()


def test_bad_outputs_and_datasets_are_named(demo_dataset: Path, tmp_path: Path) -> None:
    _, cid = _ids(demo_dataset)
    chain = ["report", "chain", "trade", cid]
    code, out = _run(*chain, "-d", str(demo_dataset), "-o", str(tmp_path))
    assert code == 1 and f"-o {tmp_path} is a directory" in out
    code, out = _run(*chain, "-d", str(demo_dataset), "-o", str(tmp_path / "missing" / "c.html"))
    assert code == 1 and "does not exist" in out
    code, out = _run(*chain, "-d", str(tmp_path / "no-dataset"), "-o", str(tmp_path / "c.html"))
    assert code == 1 and "does not exist" in out and "Traceback" not in out
    (tmp_path / "file").write_text("x")
    code, out = _run(*chain, "-d", str(tmp_path / "file"), "-o", str(tmp_path / "c.html"))
    assert code == 1 and "Traceback" not in out
    code, out = _run(*chain, "-d", "", "-o", str(tmp_path / "c.html"))
    assert code == 1 and "the dataset is empty" in out
    code, out = _run("report", "chain", "nonsense", cid, "-d", str(demo_dataset), "-o", str(tmp_path / "c.html"))
    assert code == 2


def test_a_bad_live_state_is_named(demo_dataset: Path, tmp_path: Path) -> None:
    record_id, _ = _ids(demo_dataset)
    state = tmp_path / "state.json"
    state.write_text("[1, 2]")
    code, out = _run(
        "report", "decision", record_id, "-d", str(demo_dataset), "-o", str(tmp_path / "d.html"),
        "--live-state", str(state), "--policy", "otel_replay.demo:budget_policy",
    )  # fmt: skip
    assert code == 1 and "the live state must be a JSON object" in out
    state.write_text(json.dumps({"budget_remaining": 1}))
    code, out = _run(
        "report", "decision", record_id, "-d", str(demo_dataset), "-o", str(tmp_path / "d.html"),
        "--live-state", str(state), "--policy", "no_such_module:policy",
    )  # fmt: skip
    assert code == 1 and "cannot import module 'no_such_module'" in out


def test_loopback_is_told_from_other_addresses() -> None:
    assert _loopback("127.0.0.1") and _loopback("::1") and _loopback("localhost") and _loopback("127.0.0.2")
    assert not _loopback("0.0.0.0") and not _loopback("192.0.2.1") and not _loopback("example.invalid")


def test_ui_warns_loudly_before_binding_another_address(demo_dataset: Path) -> None:
    code, out = _run("ui", "-d", str(demo_dataset), "--host", "host.invalid", "--port", "0")
    assert code == 1 and "WARNING: serving on host.invalid, not loopback" in out and "cannot listen on" in out


@pytest.mark.slow
def test_ui_on_port_zero_prints_its_address_and_serves_the_index(demo_dataset: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    with subprocess.Popen(
        [sys.executable, "-m", "otel_replay", "ui", "-d", str(demo_dataset), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    ) as proc:  # fmt: skip
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith(f"serving {demo_dataset} at http://127.0.0.1:"), line
            url = line.split(" at ", 1)[1].split(" ", 1)[0]
            with urllib.request.urlopen(url, timeout=60) as response:  # loopback only
                assert response.status == 200 and b"Recent decisions" in response.read()
        finally:
            proc.terminate()
            proc.wait(timeout=60)


@pytest.mark.slow
def test_report_rerun_with_an_entrypoint_reruns_for_the_page_and_stores_nothing(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ..rerun.conftest import agent, record  # here: the rerun tests' scripted servers, for this test only

    with agent.scripted_server() as api, agent.scripted_server() as llm:
        monkeypatch.setenv("RERUN_EXAMPLE_API", api)
        monkeypatch.setenv("RERUN_EXAMPLE_MODEL", llm)
        record(dataset, "sess-cli", agent.agent_from_env)
    monkeypatch.setenv("RERUN_EXAMPLE_SUFFIX", " Think twice.")
    before = sorted(p.relative_to(dataset) for p in dataset.rglob("*"))
    out = tmp_path / "rerun.html"
    code, text = _run(
        "report", "rerun", "sess-cli", "-d", str(dataset), "-o", str(out),
        "--entrypoint", "example_rerun_agent:agent_from_env",
    )  # fmt: skip
    assert code == 0, text
    page = out.read_text()
    assert 'class="diverged"' in page and "Think twice." in page and "First divergence" in page
    assert sorted(p.relative_to(dataset) for p in dataset.rglob("*")) == before  # nothing stored
    code, text = _run("report", "rerun", "sess-cli", "-d", str(dataset), "-o", str(tmp_path / "stored.html"))
    assert code == 0 and "this session was never rerun" in (tmp_path / "stored.html").read_text()
