"""``otel-replay rerun`` (one session, ``--all``), the pytest plugin, and rerun ending in the gate."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

import otel_replay
from otel_replay import Action, ActionGate, DependencySnapshot, ReferenceLedger
from otel_replay.cli.rerun import DIVERGED, rerun_command
from otel_replay.integrity import load_signing_key
from otel_replay.rerun import rerun

from .._support import Zygote, budget_policy
from .conftest import EXAMPLES, PYTEST, agent, record

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def two_sessions(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str, str]:
    with agent.scripted_server() as api, agent.scripted_server() as model:
        monkeypatch.setenv("RERUN_EXAMPLE_API", api)
        monkeypatch.setenv("RERUN_EXAMPLE_MODEL", model)
        record(dataset, "sess-a", agent.agent_from_env)
        record(dataset, "sess-b", agent.agent_from_env)
    return dataset, api, model


def test_cli_reruns_one_session_and_prints_the_match(two_sessions: tuple[Path, str, str]) -> None:
    dataset, _, _ = two_sessions
    out = CliRunner().invoke(
        rerun_command, ["sess-a", "--entrypoint", "example_rerun_agent:agent_from_env", "-d", str(dataset)]
    )
    assert out.exit_code == 0, out.output
    assert "session sess-a" in out.output and ": matched" in out.output
    with otel_replay.open(dataset) as store:
        rows = store.run("rerun_compare", session_id="sess-a")
    assert len(rows) == 1 and rows[0]["matched"] is True
    assert rows[0]["rerun_fingerprint"] == rows[0]["original_fingerprint"]
    with otel_replay.open(dataset) as store:
        sessions = sorted(r["session_id"] for r in store.query("SELECT session_id FROM decisions").to_pylist())
        assert store.verify(load_signing_key()).ok  # recording chunks are sealed into the chain like any record
    # The rerun's own decision is marked as the rerun's, never mistaken for the original's.
    assert sessions[:2] == ["sess-a", "sess-a~rerun~" + rows[0]["rerun_id"]] and sessions[2] == "sess-b"


def test_cli_all_reports_a_table_and_fails_on_divergence(
    two_sessions: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    dataset, _, _ = two_sessions
    args = ["--all", "--entrypoint", "example_rerun_agent:agent_from_env", "-d", str(dataset)]
    ok = CliRunner().invoke(rerun_command, args)
    assert ok.exit_code == 0, ok.output
    assert "2 matched, 0 diverged, 0 errored" in ok.output
    monkeypatch.setenv("RERUN_EXAMPLE_SUFFIX", " Think twice.")
    bad = CliRunner().invoke(rerun_command, args)
    assert bad.exit_code == DIVERGED, bad.output
    assert "0 matched, 2 diverged" in bad.output and "diverged at step" in bad.output
    assert "Think twice." in bad.output
    only_a = CliRunner().invoke(rerun_command, [*args, "--match", "sess-a", "--json"])
    lines = [json.loads(line) for line in only_a.output.splitlines() if line.startswith("{")]
    assert [line["session_id"] for line in lines] == ["sess-a"] and lines[0]["divergence"]["step"] > 0
    picked = CliRunner().invoke(rerun_command, [*args, "--sessions-sql", "SELECT 'sess-b' AS session_id", "--json"])
    assert [json.loads(line)["session_id"] for line in picked.output.splitlines() if line.startswith("{")] == ["sess-b"]
    refused = CliRunner().invoke(rerun_command, [*args, "--sessions-sql", f"COPY spans TO '{tmp_path / 'x.csv'}'"])
    assert refused.exit_code == 1 and "Traceback" not in refused.output and not (tmp_path / "x.csv").exists()


@pytest.mark.slow
def test_cli_user_errors_are_one_line_without_traceback(dataset: Path, tmp_path: Path, zygote: Zygote) -> None:
    record(dataset, "s1", lambda: None)
    cases = [
        (
            ["nope", "--entrypoint", "example_rerun_agent:agent_from_env", "-d", str(dataset)],
            "no recording for session",
        ),
        (["s1", "--entrypoint", "no_such:thing", "-d", str(dataset)], "cannot import module"),
        (["s1", "--entrypoint", "x:y", "-d", str(tmp_path / "missing")], "does not exist"),
        (["--entrypoint", "x:y", "-d", str(dataset)], "give one SESSION_ID, or --all"),
    ]
    # One case as a process runs it (what it prints and its exit code), the rest in-process.
    args, expected = cases[0]
    out = zygote.cli("rerun", *args, env={**os.environ, "PYTHONPATH": str(EXAMPLES)})
    assert out.returncode == 1, (args, out.stdout, out.stderr)
    assert expected in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    for args, expected in cases[1:]:
        result = CliRunner().invoke(rerun_command, args)
        assert result.exit_code == 1 and isinstance(result.exception, SystemExit), (args, result.output)
        assert expected in result.stderr and "Traceback" not in result.output, result.output
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_pyproject_registers_the_pytest_plugin() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert data["project"]["entry-points"]["pytest11"]["otel_replay"] == "otel_replay.rerun.pytest_plugin"


@pytest.mark.slow
def test_pytest_plugin_turns_sessions_into_tests(
    two_sessions: tuple[Path, str, str], tmp_path: Path, zygote: Zygote
) -> None:
    dataset, _, _ = two_sessions
    # Block the installed entry point (if any) and load the module itself: works installed or not.
    plugin = ["-p", "no:otel_replay", "-p", "otel_replay.rerun.pytest_plugin"]
    # This checkout first: the sessions were recorded by its code, and are rerun by it.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(EXAMPLES)])}
    base = [*plugin, "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)]
    opts = ["--otel-replay-dataset", str(dataset), "--otel-replay-entrypoint", "example_rerun_agent:agent_from_env"]
    # pytest, a process of its own, forked from a parent that imported the openai client the example agent imports
    forks = zygote.with_model_clients()
    ok = forks.run(PYTEST, *base, *opts, str(tmp_path), env=env, cwd=str(tmp_path))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "2 passed" in ok.stdout
    env["RERUN_EXAMPLE_SUFFIX"] = " Think twice."
    bad = forks.run(PYTEST, *base, *opts, str(tmp_path), env=env, cwd=str(tmp_path))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "2 failed" in bad.stdout and "diverged at step" in bad.stdout and "rerun[sess-a]" in bad.stdout


def _paying_agent(api: str, gate: ActionGate) -> dict[str, Any]:
    quote = httpx.get(f"{api}/quote").json()
    snapshot = DependencySnapshot({"budget_remaining": 10_000, "allow_list": ["acme-supplies"], "quote": quote})
    with otel_replay.audit("vendor_payment", snapshot=snapshot) as decision:
        action = Action("vendor_payment", {"recipient": "acme-supplies"}, cost=4200)
        decision.act(action)
        receipt = gate.commit(action, record_id=decision.record_id)
    return {"receipt": receipt.receipt_id, "price": quote["price"]}


def test_rerun_ends_in_gate_execution_without_committing_again(dataset: Path) -> None:
    ledger = ReferenceLedger(balance=10_000)
    with agent.scripted_server() as api:
        original, _, _ = record(dataset, "pay", lambda: _paying_agent(api, ActionGate(ledger, dataset=dataset)))
    assert ledger.balance == 5_800
    rerun_ledger = ReferenceLedger(balance=0)  # would refuse a commit: the rerun must not commit
    live = {"budget_remaining": 100, "allow_list": ["acme-supplies"]}
    telemetry = otel_replay.configure(dataset, set_global=False)

    def rerun_under_live_state() -> Any:
        done = rerun(
            lambda: _paying_agent(api, ActionGate(rerun_ledger, dataset=dataset)),
            dataset=dataset,
            session_id="pay",
            live_state=live,
            policy=budget_policy,
            rail=ledger,
        )
        telemetry.force_flush()
        return done

    try:
        result = rerun_under_live_state()
        assert result.matched and result.output == original, result.report()
        assert rerun_ledger.entries == []  # nothing committed during the rerun
        assert [(g.fix, g.executed) for g in result.gate] == [("ROLLBACK", ("rolled_back",))], result.gate
        assert ledger.balance == 10_000  # the original commit was compensated
        again = rerun_under_live_state()
    finally:
        telemetry.shutdown()
    assert ledger.balance == 10_000  # at most once
    assert again.gate and again.gate[0].error is not None and "already compensated" in again.gate[0].error
    with otel_replay.open(dataset) as store:
        rows = store.run("rerun_compare", session_id="pay")
    assert len(rows) == 2 and all(json.loads(r["verdicts"]) for r in rows)


def paying_entry() -> dict[str, Any]:
    """A no-argument entrypoint for the CLI: the paying agent against the API in the environment."""
    return _paying_agent(os.environ["RERUN_EXAMPLE_API"], ActionGate(ReferenceLedger(balance=0)))


def test_cli_rerun_ends_in_execution_on_the_rail(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ..rails import FileLedger

    with agent.scripted_server() as api:
        monkeypatch.setenv("RERUN_EXAMPLE_API", api)
        record(dataset, "pay", lambda: _paying_agent(api, ActionGate(ReferenceLedger(balance=10_000), dataset=dataset)))
    live = tmp_path / "live.json"
    live.write_text(json.dumps({"budget_remaining": 100, "allow_list": ["acme-supplies"]}))
    ledger = tmp_path / "ledger.json"
    monkeypatch.setenv("OTEL_REPLAY_TEST_LEDGER", str(ledger))
    args = [
        "pay", "--entrypoint", "tests.rerun.test_rerun_cli:paying_entry", "-d", str(dataset),
        "--live-state", str(live), "--policy", "tests._support:budget_policy",
    ]  # fmt: skip
    dry = CliRunner().invoke(rerun_command, args)
    assert dry.exit_code == 0, dry.output
    assert "ROLLBACK" in dry.output and not ledger.exists()  # verdicts only: nothing executed
    forgot = CliRunner().invoke(rerun_command, [*args, "--rail", "tests.rails:file_ledger"])  # no --execute
    assert forgot.exit_code == 2 and "--rail only applies with --execute" in forgot.output and not ledger.exists()
    done = CliRunner().invoke(rerun_command, [*args, "--execute", "--rail", "tests.rails:file_ledger"])
    assert done.exit_code == 0, done.output
    assert "rolled_back" in done.output
    assert [r["amount"] for r in FileLedger(ledger).refunds()] == [4200.0]
    again = CliRunner().invoke(rerun_command, [*args, "--execute", "--rail", "tests.rails:file_ledger"])
    assert again.exit_code == DIVERGED and "already compensated" in again.output
    assert len(FileLedger(ledger).refunds()) == 1  # at most once
    missing = CliRunner().invoke(rerun_command, [*args, "--execute"])
    assert missing.exit_code == 1 and "--execute needs --rail" in missing.output


def _paying_twice(api: str, gate: ActionGate) -> list[Any]:
    return [_paying_agent(api, gate), _paying_agent(api, gate)]


def test_an_unrecorded_action_is_never_committed_in_a_rerun(dataset: Path) -> None:
    ledger = ReferenceLedger(balance=10_000)
    with agent.scripted_server() as api:
        record(dataset, "pay1", lambda: _paying_agent(api, ActionGate(ledger, dataset=dataset)))
        rerun_ledger = ReferenceLedger(balance=10_000)
        # relaxed, the quote's host allowed live: the second quote is fetched live, but the second payment is never made
        allowed = [api.removeprefix("http://")]
        result = rerun(
            lambda: _paying_twice(api, ActionGate(rerun_ledger)), dataset=dataset, session_id="pay1", allow_live=allowed
        )
    assert result.error is not None and "does not run tools or commit actions" in result.error
    assert rerun_ledger.entries == [] and not result.matched


def test_cli_all_keeps_going_past_a_tampered_session_and_names_it(
    two_sessions: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    dataset, _, _ = two_sessions
    for path in dataset.rglob("*.parquet"):
        table = pq.read_table(path)
        sessions = table.column("session_id").to_pylist()
        attributes = table.column("attributes").to_pylist()
        edited = [a.replace("quote", "QUOTE") if s == "sess-b" and a and "replay.recording.events" in a else a
                  for s, a in zip(sessions, attributes, strict=True)]  # fmt: skip
        index = table.schema.get_field_index("attributes")
        pq.write_table(table.set_column(index, "attributes", pa.array(edited, pa.string())), path)
    out = CliRunner().invoke(
        rerun_command, ["--all", "--entrypoint", "example_rerun_agent:agent_from_env", "-d", str(dataset)]
    )
    assert out.exit_code == DIVERGED, out.output
    assert "1 matched, 0 diverged, 1 errored" in out.output
    assert "sess-b" in out.output and "hash mismatch" in out.output


def test_cli_strict_divergence_shows_step_recorded_and_rerun(
    two_sessions: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset, _, _ = two_sessions
    monkeypatch.setenv("RERUN_EXAMPLE_SUFFIX", " Think twice.")
    args = ["sess-a", "--entrypoint", "example_rerun_agent:agent_from_env", "-d", str(dataset)]
    args += ["--governance", "strict"]
    out = CliRunner().invoke(rerun_command, args)
    assert out.exit_code == DIVERGED, out.output
    assert "Traceback" not in out.output
    assert "diverged at step" in out.output and "recorded:" in out.output and "rerun:" in out.output, out.output
    assert "Think twice." in out.output
