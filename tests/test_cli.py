from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from otel_replay.cli import main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def demo_dataset(tmp_path):
    path = tmp_path / "demo"
    result = CliRunner().invoke(main, ["demo", "--dataset", str(path)])
    assert result.exit_code == 0, result.output
    return path


def replay_args(record_id, dataset, live, *extra: str) -> list[str]:
    """``otel-replay replay`` arguments with the demo's budget policy."""
    return [
        "replay",
        record_id,
        "-d",
        str(dataset),
        "--live-state",
        str(live),
        "--policy",
        "otel_replay.demo:budget_policy",
        *extra,
    ]


def run(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert "Traceback" not in result.output
    return result


def test_demo_as_a_subprocess(tmp_path):
    env = {**os.environ, "COLUMNS": "200"}
    out = subprocess.run(
        [sys.executable, "-m", "otel_replay", "demo", "--dataset", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "ROLLBACK" in text and "rolled_back" in text
    assert "ledger balance after commit: 5,800.00" in text and "ledger balance after the gate: 10,000.00" in text
    assert "rehydrated from Parquet equals the in-process record: True" in text
    assert "OK " in text and "invoice_received" in text and "budget_revised" in text


def test_sql_formats(demo_dataset):
    result = run("sql", "SELECT decision_type, action_cost FROM decisions", "-d", str(demo_dataset), "--format", "json")
    assert result.exit_code == 0
    assert json.loads(result.output.strip()) == {"decision_type": "vendor_payment", "action_cost": 4200.0}
    csv_out = run("sql", "SELECT executed FROM gates ORDER BY recorded_at", "-d", str(demo_dataset), "--format", "csv")
    assert csv_out.output.splitlines() == ["executed", "committed", "rolled_back"]


def test_sql_from_a_file(demo_dataset, tmp_path):
    query = tmp_path / "q.sql"
    query.write_text("SELECT count(*) AS n FROM audit_entries")
    result = run("sql", str(query), "-d", str(demo_dataset), "--format", "json")
    assert json.loads(result.output) == {"n": 3}


def test_chain_replay_and_verify(demo_dataset):
    cid = json.loads(
        run(
            "sql", "SELECT correlation_id, record_id FROM decisions", "-d", str(demo_dataset), "--format", "json"
        ).output
    )
    chain = run("chain", "trade", cid["correlation_id"], "-d", str(demo_dataset), "--json")
    assert chain.exit_code == 0
    body = json.loads(chain.output)
    assert [e["event_type"] for e in body["audit_entries"]] == [
        "invoice_received",
        "budget_revised",
        "payment_reversed",
    ]
    replay_args = [
        "replay",
        cid["record_id"],
        "-d",
        str(demo_dataset),
        "--policy",
        "otel_replay.demo:budget_policy",
        "--live-state",
        str(demo_dataset / "demo-live-state.json"),
    ]
    replayed = run(*replay_args)
    assert replayed.exit_code == 0 and "ROLLBACK" in replayed.output
    again = run(*replay_args, "--execute", "--rail", "otel_replay.demo:demo_ledger")
    assert again.exit_code == 1 and "already compensated (rolled_back at" in again.output  # the demo rolled it back
    verified = run("verify", str(demo_dataset))
    assert verified.exit_code == 0 and verified.output.startswith("OK")
    tree = run("tree", cid["record_id"], "-d", str(demo_dataset))
    assert "replay.act" in tree.output and "[decision]" in tree.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["chain", "trade", "no-such-id"], "no trade chain 'no-such-id'"),
        (["chain", "weekly", "x"], "'weekly' is not one of 'trade', 'session', 'directive', 'incident'"),
        (["sql", "SELECT * FROM nope"], "nope does not exist"),
        (
            ["replay", "nope", "--live-state", "LIVE", "--policy", "otel_replay.demo:budget_policy"],
            "no decision record 'nope'",
        ),
        (
            ["replay", "nope", "--live-state", "LIVE", "--policy", "no_such_module:f"],
            "cannot import module 'no_such_module'",
        ),
        (["replay", "nope", "--live-state", "LIVE", "--policy", "nocolon"], "must look like 'package.module:function'"),
        (
            ["replay", "nope", "--live-state", "BADJSON", "--policy", "otel_replay.demo:budget_policy"],
            "not valid JSON (line 1",
        ),
        (
            ["replay", "nope", "--live-state", "LIVE", "--policy", "otel_replay.demo:budget_policy", "--execute"],
            "--execute needs --rail",
        ),
    ],
)
def test_user_errors_are_one_line_without_traceback(demo_dataset, tmp_path, args, message):
    live = tmp_path / "live.json"
    live.write_text("{}")
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    args = [str(live) if a == "LIVE" else str(bad) if a == "BADJSON" else a for a in args]
    result = run(*args, "-d", str(demo_dataset))
    assert result.exit_code != 0
    assert message in result.output
    assert "Traceback" not in result.output


def test_missing_dataset_and_corrupt_file(tmp_path, demo_dataset):
    missing = run("sql", "SELECT 1", "-d", str(tmp_path / "absent"))
    assert missing.exit_code == 1 and "does not exist" in missing.output
    bad = next((demo_dataset / "spans").rglob("*.parquet")).with_name("part-bad.parquet")
    bad.write_bytes(b"PAR1garbage")
    corrupt = run("sql", "SELECT count(*) AS n FROM spans", "-d", str(demo_dataset))
    assert (
        corrupt.exit_code == 1
        and "part-bad.parquet" in corrupt.output
        and len(corrupt.output.strip().splitlines()) == 1
    )
    skipped = run(
        "sql", "SELECT count(*) AS n FROM spans", "-d", str(demo_dataset), "--skip-corrupt", "--format", "json"
    )
    assert skipped.exit_code == 0 and "skipped" in skipped.output and "part-bad.parquet" in skipped.output


def test_verify_fails_with_exit_1_on_tamper(demo_dataset):
    import pyarrow.parquet as pq

    path = next((demo_dataset / "spans").rglob("*.parquet"))
    table = pq.read_table(path)
    # Drop the first sealed record of the chain's middle: the audit entry recorded second.
    names = table.column("name").to_pylist()
    keep = [i for i, n in enumerate(names) if not (n == "replay.decision")]
    pq.write_table(table.take(keep), path)
    result = run("verify", str(demo_dataset))
    assert result.exit_code == 1 and "FAILED" in result.output and "deleted" in result.output


def test_replay_execute_compensates_a_stored_receipt_once(tmp_path, monkeypatch):
    import otel_replay
    from otel_replay import Action, ActionGate, DependencySnapshot, ReferenceLedger, audit

    dataset = tmp_path / "ds"
    telemetry = otel_replay.configure(dataset, set_global=False)
    gate = ActionGate(ReferenceLedger(10_000))
    snapshot = DependencySnapshot({"budget_remaining": 10_000, "allow_list": ["acme-supplies"]})
    with audit("vendor_payment", snapshot=snapshot) as d:
        action = Action("vendor_payment", {"recipient": "acme-supplies"}, cost=4200)
        d.act(action)
        gate.commit(action, record_id=d.record_id)
    telemetry.shutdown()
    live = tmp_path / "live.json"
    live.write_text(json.dumps({"budget_remaining": 100, "allow_list": ["acme-supplies"]}))
    args = replay_args(d.record_id, dataset, live, "--execute", "--rail", "otel_replay.demo:demo_ledger")
    first = run(*args)
    assert first.exit_code == 0 and "rolled_back" in first.output and "compensated rcpt-0001" in first.output
    second = run(*args)
    assert second.exit_code == 1 and "already compensated" in second.output
    with otel_replay.open(dataset) as store:
        assert [g["executed"] for g in store.rows("SELECT executed FROM gates ORDER BY recorded_at")] == [
            "committed",
            "rolled_back",
        ]


def test_policy_failures_are_one_line(demo_dataset, tmp_path):
    rid = json.loads(run("sql", "SELECT record_id FROM decisions", "-d", str(demo_dataset), "--format", "json").output)
    live = tmp_path / "live.json"
    live.write_text("{}")
    for ref, message in (("json:dumps", "policy dumps raised TypeError"), ("builtins:len", "raised TypeError")):
        result = run("replay", rid["record_id"], "-d", str(demo_dataset), "--live-state", str(live), "--policy", ref)
        assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output
    bad_rail = run(*replay_args(rid["record_id"], demo_dataset, live, "--execute", "--rail", "otel_replay.demo:nope"))
    assert bad_rail.exit_code == 1 and "rail 'otel_replay.demo:nope'" in bad_rail.output
    assert "verdict" not in bad_rail.output  # the rail is checked before anything is printed
