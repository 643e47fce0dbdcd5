from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from otel_replay.cli import main

REPO = Path(__file__).resolve().parents[2]


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
    """Invoke the CLI in-process; fail on any exception other than the exit itself.

    CliRunner catches exceptions, so a traceback never shows in ``result.output``:
    what ended the run (``result.exception``) is the thing to check. A failed
    run must end in exactly one line on stderr.
    """
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    assert result.exit_code in (0, 1, 2), (result.exit_code, result.output)  # 2: usage; 3 would be an internal error
    if result.exit_code == 1 and result.stderr.startswith("Error"):
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
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
    assert csv_out.output.splitlines() == ["executed", "intent", "committed", "rolled_back"]


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
    assert isinstance(result.exception, SystemExit)
    if result.exit_code == 2:  # a usage error: click's usage lines, then the one-line error
        assert message in result.stderr.splitlines()[-1]
    else:
        assert result.exit_code == 1 and message in result.stderr and len(result.stderr.splitlines()) == 1


def test_missing_dataset_and_corrupt_file(tmp_path, demo_copy):
    missing = run("sql", "SELECT 1", "-d", str(tmp_path / "absent"))
    assert missing.exit_code == 1 and "does not exist" in missing.output
    bad = next((demo_copy / "spans").rglob("*.parquet")).with_name("part-bad.parquet")
    bad.write_bytes(b"PAR1garbage")
    corrupt = run("sql", "SELECT count(*) AS n FROM spans", "-d", str(demo_copy))
    assert (
        corrupt.exit_code == 1
        and "part-bad.parquet" in corrupt.output
        and len(corrupt.output.strip().splitlines()) == 1
    )
    skipped = run(
        "sql", "SELECT count(*) AS n FROM spans", "-d", str(demo_copy), "--skip-corrupt", "--format", "json"
    )
    assert skipped.exit_code == 0 and "skipped" in skipped.output and "part-bad.parquet" in skipped.output


def test_verify_fails_with_exit_1_on_tamper(demo_copy):
    import pyarrow.parquet as pq

    # Delete the decision record from the file holding it (the demo may write several files).
    path = next(
        p
        for p in (demo_copy / "spans").rglob("*.parquet")
        if "replay.decision" in pq.read_table(p)["name"].to_pylist()
    )
    table = pq.read_table(path)
    names = table.column("name").to_pylist()
    keep = [i for i, n in enumerate(names) if not (n == "replay.decision")]
    pq.write_table(table.take(keep), path)
    result = run("verify", str(demo_copy))
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
            "intent",
            "committed",
            "rolled_back",
        ]


def test_replay_execute_over_a_file_left_out_as_corrupt_exits_1_after_what_it_could_do(tmp_path):
    import otel_replay
    from otel_replay import ActionGate, ReferenceLedger, audit

    from .._support import payment, snapshot

    dataset, ledger = tmp_path / "ds", ReferenceLedger(10_000)
    telemetry = otel_replay.configure(dataset, set_global=False)
    with audit("vendor_payment", snapshot=snapshot()) as d:
        d.act(payment())
        ActionGate(ledger).commit(payment(), record_id=d.record_id)
    telemetry.shutdown()
    before = set((dataset / "spans").rglob("*.parquet"))
    telemetry = otel_replay.configure(dataset, set_global=False)  # a second payment, stored in a file of its own
    ActionGate(ledger).commit(payment(100), record_id=d.record_id)  # rcpt-0002
    telemetry.shutdown()
    [second] = set((dataset / "spans").rglob("*.parquet")) - before
    second.write_bytes(second.read_bytes()[:100])  # torn: its commit (and receipt) cannot be read
    live = tmp_path / "live.json"
    live.write_text(json.dumps({"budget_remaining": 100, "allow_list": ["acme-supplies"]}))
    args = replay_args(d.record_id, dataset, live, "--execute", "--rail", "otel_replay.demo:demo_ledger")
    result = run(*args, "--skip-corrupt")
    assert "compensated rcpt-0001" in result.output and "rcpt-0002" not in result.output
    assert f"warning: skipped {second}" in result.stderr
    assert result.exit_code == 1, result.output  # was: 0, and rcpt-0002 never compensated
    assert "1 file(s) of" in result.stderr and "not judged nor compensated" in result.stderr


def test_policy_failures_are_one_line(demo_dataset, tmp_path):
    rid = json.loads(run("sql", "SELECT record_id FROM decisions", "-d", str(demo_dataset), "--format", "json").output)
    live = tmp_path / "live.json"
    live.write_text("{}")
    for ref, message in (("json:dumps", "policy dumps raised TypeError"), ("builtins:len", "raised TypeError")):
        result = run("replay", rid["record_id"], "-d", str(demo_dataset), "--live-state", str(live), "--policy", ref)
        assert result.exit_code == 1 and message in result.output
    bad_rail = run(*replay_args(rid["record_id"], demo_dataset, live, "--execute", "--rail", "otel_replay.demo:nope"))
    assert bad_rail.exit_code == 1 and "rail 'otel_replay.demo:nope'" in bad_rail.output
    assert "verdict" not in bad_rail.output  # the rail is checked before anything is printed


# --- issue 6: paths, corrupt pages, hostile terminal data, the real entry point ---------------


def _entry_point() -> str:
    script = Path(sys.executable).with_name("otel-replay")
    assert script.exists(), "the console script is installed with the package"
    return str(script)


@pytest.mark.slow
def test_the_real_entry_point_reports_user_errors_in_one_line(demo_dataset, tmp_path, monkeypatch):
    """Each user error ends in one line and exit 1; the installed ``otel-replay`` script, not CliRunner, shows it
    for the deepest of them (a real process's own stack) and for a good query: stderr one line, no traceback."""
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    rid = json.loads(run("sql", "SELECT record_id FROM decisions", "-d", str(demo_dataset), "--format", "json").output)
    deepest = replay_args(rid["record_id"], demo_dataset, deep)
    cases = [
        ["sql", "SELECT 1", "-d", str(tmp_path / "absent")],
        ["sql", "COPY (SELECT 1) TO 'x.csv'", "-d", str(demo_dataset)],
        ["sql", "SELECT * FROM read_text('/etc/passwd')", "-d", str(demo_dataset)],
        ["sql", str(tmp_path / "missing.sql"), "-d", str(demo_dataset)],
        deepest,
        replay_args(rid["record_id"], demo_dataset, tmp_path),
    ]
    monkeypatch.chdir(tmp_path)  # where COPY ... TO 'x.csv' would write
    for args in cases:  # in-process: run() fails on any exception but the exit, and on more than one line
        out = run(*args)
        assert out.exit_code == 1, (args, out.stderr)
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, (args, out.stderr)
        assert out.stderr.startswith("Error: "), out.stderr
    real = subprocess.run([_entry_point(), *deepest], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert real.returncode == 1, real.stderr
    assert "Traceback" not in real.stderr and len(real.stderr.strip().splitlines()) == 1, real.stderr
    assert real.stderr.startswith("Error: ") and "deep.json" in real.stderr, real.stderr
    assert not (tmp_path / "x.csv").exists()
    ok = subprocess.run(
        [_entry_point(), "sql", "SELECT 'infinity'::timestamp AS t", "-d", str(demo_dataset), "--format", "csv"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0 and ok.stdout.splitlines() == ["t", "infinity"] and ok.stderr == ""


def test_sql_prints_infinite_and_out_of_range_times(demo_dataset):
    for fmt in ("table", "json", "csv"):
        result = run(
            "sql", "SELECT 'infinity'::timestamp AS a, '-infinity'::date AS b", "-d", str(demo_dataset), "--format", fmt
        )
        assert result.exit_code == 0 and "infinity" in result.output and "-infinity" in result.output


def test_path_arguments_get_one_line_errors(demo_dataset, tmp_path):
    live = tmp_path / "live.json"
    live.write_text("{}")
    rid = json.loads(run("sql", "SELECT record_id FROM decisions", "-d", str(demo_dataset), "--format", "json").output)
    a_file = tmp_path / "plain.txt"
    a_file.write_text("x")
    cases = [
        (replay_args(rid["record_id"], demo_dataset, tmp_path / "nope.json"), "live state file", "does not exist"),
        (replay_args(rid["record_id"], demo_dataset, tmp_path), "live state file", "is a directory"),
        (
            replay_args(rid["record_id"], demo_dataset, live, "--key-file", str(tmp_path / "nokey")),
            "key file",
            "does not exist",
        ),
        (replay_args(rid["record_id"], demo_dataset, live, "--key-file", str(tmp_path)), "key file", "is a directory"),
        (["verify", str(demo_dataset), "--key-file", str(tmp_path / "nokey")], "key file", "does not exist"),
        (["sql", str(tmp_path / "q.sql"), "-d", str(demo_dataset)], "SQL file", "does not exist"),
        (["sql", "SELECT 1", "-d", str(a_file)], "dataset", "is a file, not a directory"),
        (["verify", str(a_file)], "dataset", "is a file, not a directory"),
        (["tree", "x", "-d", str(tmp_path / "absent")], "dataset", "does not exist"),
    ]
    (tmp_path / "dir.sql").mkdir()
    cases.append((["sql", str(tmp_path / "dir.sql"), "-d", str(demo_dataset)], "SQL file", "is a directory"))
    for args, what, why in cases:
        result = run(*args)
        assert result.exit_code == 1, (args, result.output)
        line = result.stderr.strip()
        assert len(line.splitlines()) == 1 and what in line and why in line, (args, line)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_live_state_is_one_line(demo_dataset, tmp_path):
    live = tmp_path / "live.json"
    live.write_text("{}")
    live.chmod(0)
    result = run(*replay_args("x", demo_dataset, live))
    assert result.exit_code == 1 and "not readable" in result.stderr


def test_deeply_nested_live_state_is_one_line(demo_dataset, tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    result = run(*replay_args("x", demo_dataset, deep))
    assert result.exit_code == 1 and "deep.json" in result.stderr and len(result.stderr.splitlines()) == 1


def test_damaged_page_is_named_by_every_read_command_and_skipped_on_request(demo_copy):
    from ..query.test_store import damage_pages

    good = max((demo_copy / "spans").rglob("*.parquet"), key=lambda p: p.stat().st_size)  # holds the decision
    bad = damage_pages(good, good.with_name("part-damaged.parquet"))
    rid = json.loads(
        run(
            "sql", "SELECT record_id FROM decisions", "-d", str(demo_copy), "--skip-corrupt", "--format", "json"
        ).stdout
    )["record_id"]
    cid = json.loads(
        run(
            "sql", "SELECT correlation_id FROM decisions", "-d", str(demo_copy), "--skip-corrupt", "--format", "json"
        ).stdout
    )["correlation_id"]
    commands = [
        ["sql", "SELECT * FROM spans"],
        ["chain", "trade", cid],
        ["tree", rid],
        replay_args(rid, demo_copy, demo_copy / "demo-live-state.json")[:],
    ]
    for command in commands:
        failed = run(*command, "-d", str(demo_copy))
        assert failed.exit_code == 1 and "part-damaged.parquet" in failed.stderr, (command, failed.output)
        skipped = run(*command, "-d", str(demo_copy), "--skip-corrupt")
        assert skipped.exit_code == 0, (command, skipped.output)
        assert f"warning: skipped {bad}" in skipped.stderr, command
    verify = run("verify", str(demo_copy))
    assert verify.exit_code == 1 and "part-damaged.parquet" in verify.stderr
    partial = run("verify", str(demo_copy), "--skip-corrupt")
    assert partial.exit_code == 1 and partial.stdout.startswith("FAILED")
    assert f"not checked: {bad}" in partial.stdout and "1 unreadable file" in partial.stdout


def test_hostile_agent_ids_and_event_types_reach_no_terminal(tmp_path):
    import otel_replay
    from otel_replay import AuditLog, audit

    from .._support import payment, snapshot

    dataset = tmp_path / "ds"
    telemetry = otel_replay.configure(dataset, set_global=False)
    evil = "\x1b]0;owned\x07\x1b[2J:x:[red]"
    with audit("vendor_payment", snapshot=snapshot(), correlation_id="c-evil", agent_id=evil) as d:
        d.act(payment())
    AuditLog().append(f"invoice{evil}", source_agent=evil, correlation_id="c-evil", payload={"note": evil})
    telemetry.shutdown()
    for args in (
        ["chain", "trade", "c-evil"],
        ["sql", "SELECT agent_id FROM decisions"],
        ["sql", "SELECT event_type, source_agent FROM audit_entries"],
        ["tree", d.record_id],
    ):
        result = run(*args, "-d", str(dataset))
        assert result.exit_code == 0, (args, result.output)
        assert "\x1b" not in result.output and "\x07" not in result.output, args
        assert "❌" not in result.output
    table = run("sql", "SELECT agent_id FROM decisions", "-d", str(dataset)).output
    assert "\\x1b]0;owned\\x07\\x1b[2J:x:[red]" in table
    faithful = run("sql", "SELECT agent_id FROM decisions", "-d", str(dataset), "--format", "json").output
    assert json.loads(faithful) == {"agent_id": evil}


@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
def test_a_reader_that_goes_away_gets_no_traceback(demo_dataset, fmt):
    """``otel-replay sql ... | head -1``: the closed pipe ends the command quietly."""
    query = "SELECT repeat('x', 50) AS v FROM range(4000)"  # about 240 KB: more than a pipe buffer holds
    args = [_entry_point(), "sql", query, "-d", str(demo_dataset), "--format", fmt]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=120) in (0, 1)
    assert err == ""


def test_the_server_and_storage_commands_report_errors_in_one_line_too(tmp_path):
    # serve, ingest, compact and rerun live in their own modules; they get the same guard as the rest.
    ctx = click.Context(main)
    for name in ("serve", "ingest", "compact", "rerun"):
        command = main.get_command(ctx, name)
        assert command is not None and hasattr(command.callback, "__wrapped__"), name
    (tmp_path / "ds" / "spans" / "date=2024-01-01").mkdir(parents=True)
    run("compact", str(tmp_path / "ds"), "--older-than", "999999")  # a cutoff before year 1


def test_tree_says_when_spans_lie_deeper_than_it_prints(telemetry, dataset):
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    import otel_replay
    from otel_replay import DependencySnapshot, audit

    with audit("vendor_payment", snapshot=DependencySnapshot({}), correlation_id="deep") as d:
        pass
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        [mine] = store.rows(
            "SELECT span_id, filename FROM spans WHERE record_id = ? AND name = 'replay.decision'", [d.record_id]
        )
    stored = pq.read_table(mine["filename"], partitioning=None)
    row = stored.filter(pc.equal(stored["span_id"], mine["span_id"]))
    levels = 70  # an agent nesting 70 spans below its decision (a recursive planner, a deep framework stack)
    ids = [f"{n + 1:016x}" for n in range(levels)]
    deep = pa.concat_tables([row] * levels)
    for name, values in {
        "span_id": ids,
        "parent_span_id": [mine["span_id"], *ids[:-1]],
        "name": [f"step.{n + 1}" for n in range(levels)],
        "record_id": [None] * levels,
        "replay_kind": [None] * levels,
        "attributes": ["{}"] * levels,
    }.items():
        at = deep.schema.get_field_index(name)
        deep = deep.set_column(at, deep.schema.field(at), pa.array(values, deep.schema.field(at).type))
    pq.write_table(deep, mine["filename"].rpartition("/")[0] + "/part-0000000000000000001-deep.parquet")
    result = run("tree", d.record_id, "-d", str(dataset))
    assert result.exit_code == 0 and "step.64" in result.output
    assert "step.70" in result.output or "64 levels" in result.output  # is: step.64 is the last line, nothing said
