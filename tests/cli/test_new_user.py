"""A new user's first mistakes: each ends in one line that says what was wrong and where, never "a bug".

Found by following README and the guides from a wheel in a fresh virtual
environment (fourteenth session): Ctrl-C during ``compact`` was reported as an
internal error; a policy module with a typo was blamed on otel-replay; ``verify``
given two datasets checked one of them silently.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import click
import duckdb
import pytest
from click.testing import CliRunner

import otel_replay
from otel_replay.cli import main
from otel_replay.cli._inputs import friendly

from .test_cli_inputs import error_line, run

# A query that runs for minutes unless interrupted: the interruption is what ends it.
_LONG_QUERY = "SELECT count(*) FROM range(100000000000) t(x) WHERE x % 7 = 3"


@click.command()
@friendly
def _long_query_interrupted() -> None:
    """Run a long DuckDB query while another thread interrupts the connection until the query ends."""
    con = duckdb.connect()
    done = threading.Event()

    def interrupt() -> None:
        while not done.wait(0.02):
            con.interrupt()

    helper = threading.Thread(target=interrupt, name="test-interrupter")
    helper.start()
    try:
        con.execute(_LONG_QUERY).fetchall()
    finally:
        done.set()
        helper.join()
        con.close()


def test_an_interrupted_duckdb_query_ends_as_aborted_not_as_an_internal_error() -> None:
    result = CliRunner().invoke(_long_query_interrupted, [])
    assert result.exit_code == 1, result.output  # was 3: "internal error: InterruptException ... a bug in otel-replay"
    assert "Aborted!" in result.output and "internal error" not in result.output


@click.command()
@friendly
def _query_hit_by_ctrl_c() -> None:
    """What DuckDB 2.0 raises when SIGINT arrives while a query runs (a real SIGINT is not delivered reliably
    enough for a test: DuckDB sometimes raises KeyboardInterrupt, sometimes this, sometimes misses it)."""
    raise RuntimeError("Query interrupted")


def test_ctrl_c_inside_a_duckdb_query_ends_as_aborted_not_as_an_internal_error() -> None:
    result = CliRunner().invoke(_query_hit_by_ctrl_c, [])
    assert result.exit_code == 1, result.output  # was 3: "internal error: RuntimeError: Query interrupted"
    assert "Aborted!" in result.output and "internal error" not in result.output


@pytest.fixture
def cwd_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path`` as the working directory, ``sys.path`` restored after (the CLI puts the directory on it)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    return tmp_path


_BROKEN_MODULES = {
    "name_error": ("import json\nprint(budget)\n\ndef check(state, action):\n    return True, 'ok'\n", "NameError", 2),
    "syntax_error": ("def check(state, action)\n    return True, 'ok'\n", "SyntaxError", 1),
    "runtime_error": ("raise RuntimeError('no budget service')\n", "RuntimeError", 1),
}


@pytest.mark.parametrize("kind", sorted(_BROKEN_MODULES))
def test_a_policy_module_that_fails_to_import_is_named_with_its_file_and_line(
    kind: str, cwd_path: Path, demo_dataset: Path
) -> None:
    source, error, line = _BROKEN_MODULES[kind]
    module = f"newuser_policy_{kind}"
    (cwd_path / f"{module}.py").write_text(source)
    live = cwd_path / "live.json"
    live.write_text("{}")
    result = run("replay", "any-id", "-d", str(demo_dataset), "--live-state", str(live), "--policy", f"{module}:check")
    assert result.exit_code == 1, result.output  # was 3: "internal error: NameError ... (a bug in otel-replay ...)"
    said = error_line(result)
    assert f"policy '{module}:check': importing its module raised {error}" in said, said
    assert "internal error" not in said and "a bug in otel-replay" not in said
    assert f"{module}.py" in said and (f":{line})" in said or f"line {line})" in said), said
    assert module not in sys.modules


def test_an_entrypoint_module_that_fails_to_import_is_named_too(cwd_path: Path, demo_copy: Path) -> None:
    (cwd_path / "newuser_agent.py").write_text("import json\n\nrun = agent_that_is_not_defined\n")
    result = run("rerun", "any-session", "-d", str(demo_copy), "--entrypoint", "newuser_agent:run")
    assert result.exit_code == 1, result.output
    said = error_line(result)
    assert "entrypoint 'newuser_agent:run': importing its module raised NameError" in said, said
    assert "newuser_agent.py:3)" in said, said


def test_verify_given_two_different_datasets_refuses_rather_than_check_one(demo_dataset: Path, tmp_path: Path) -> None:
    result = run("verify", str(demo_dataset), "-d", str(tmp_path))
    assert result.exit_code == 2, result.output  # was 0: "OK <DATASET>", the --dataset given ignored
    assert "two datasets given" in error_line(result) and "OK" not in result.output
    same = run("verify", str(demo_dataset), "-d", str(demo_dataset))
    assert same.exit_code == 0 and same.output.startswith("OK"), same.output


def test_verify_help_says_where_the_default_key_comes_from() -> None:
    text = CliRunner().invoke(main, ["verify", "--help"], terminal_width=200).output
    assert "$OTEL_REPLAY_SIGNING_KEY" in text and "~/.config/otel-replay/signing.key" in text, text
    assert "README" not in text  # it named a README section that does not exist


def test_rerun_of_a_session_with_no_recording_names_the_closest_recorded_one(dataset: Path, telemetry) -> None:
    import random

    from otel_replay import recording

    with recording(session_id="nightly-42"):
        random.random()
    assert telemetry.force_flush()
    typo = run("rerun", "nightly-24", "-d", str(dataset), "--entrypoint", "random:random")
    assert typo.exit_code == 1, typo.output  # was: "no recording for session 'nightly-24' in ...", nothing more
    assert "no recording for session 'nightly-24'" in error_line(typo)
    assert error_line(typo).endswith("; did you mean 'nightly-42'?"), error_line(typo)
    other = run("rerun", "weekly", "-d", str(dataset), "--entrypoint", "random:random")
    assert "its 1 recorded session(s) include 'nightly-42'" in error_line(other)
    page = dataset.parent / "rerun.html"
    for extra in ((), ("--entrypoint", "random:random")):  # report rerun, with and without a rerun for the page
        report = run("report", "rerun", "nightly-24", "-d", str(dataset), "-o", str(page), *extra)
        assert report.exit_code == 1 and error_line(report).endswith("did you mean 'nightly-42'?"), report.output
    assert not page.exists()


def test_rerun_on_a_dataset_without_recordings_says_so(demo_copy: Path) -> None:
    result = run("rerun", "nightly-42", "-d", str(demo_copy), "--entrypoint", "random:random")
    assert result.exit_code == 1, result.output
    assert "the dataset holds no recorded session" in error_line(result)


@pytest.mark.parametrize(
    ("query", "hint"),
    [
        ("SELECT * FROM decision", "(did you mean decisions, "),  # DuckDB's own guess was "pg_description"
        ("SELECT * FROM no_such_view", "(the views are acts, agents, "),
        ("SELECT amount FROM decisions", '"action_cost"'),  # DuckDB's "Candidate bindings" line, cut before
        ("SELECT lenght(agent_id) FROM decisions", '(Did you mean "length"?)'),
    ],
)
def test_sql_with_a_misspelt_name_says_what_the_dataset_has(query: str, hint: str, demo_dataset: Path) -> None:
    result = run("sql", query, "-d", str(demo_dataset))
    assert result.exit_code == 1, result.output
    said = error_line(result)
    assert hint in said, said
    assert "pg_description" not in said


def test_ingest_of_a_file_that_is_not_otlp_says_what_it_probably_is(demo_dataset: Path, tmp_path: Path) -> None:
    target = tmp_path / "traces"
    not_otlp = tmp_path / "live.json"
    not_otlp.write_text('{"budget_remaining": 3000}\n')
    plain = run("ingest", str(not_otlp), "--dataset", str(target), "-q")
    assert plain.exit_code == 0, plain.output  # a valid JSON document: nothing skipped, as before
    assert f"{not_otlp}: no spans or log records in it" in plain.stderr, plain.stderr  # was: "0 spans", nothing else
    parquet = next((demo_dataset / "spans").rglob("*.parquet"))
    copied = run("ingest", str(parquet), "--dataset", str(target), "-q")
    assert copied.exit_code == 1, copied.output
    assert f"{parquet}: a Parquet file: ingest reads Collector file-exporter output" in copied.stderr, copied.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert "is it OTLP" not in run("ingest", str(empty), "--dataset", str(target), "-q").stderr


@pytest.mark.parametrize("command", [("chain",), ("report", "chain")])
def test_a_chain_id_nothing_was_recorded_under_comes_with_a_query_that_lists_the_ids(
    command: tuple[str, ...], demo_dataset: Path, tmp_path: Path
) -> None:
    out = () if command == ("chain",) else ("-o", str(tmp_path / "c.html"))
    result = run(*command, "trade", "CORRELATION_ID", "-d", str(demo_dataset), *out)  # the guide's placeholder
    assert result.exit_code == 1, result.output
    said = error_line(result)
    assert "no trade chain 'CORRELATION_ID'" in said and "(list them: otel-replay sql -d " in said, said
    query = said.split('"')[1]  # the suggested command, run as given
    listed = run("sql", query, "-d", str(demo_dataset), "--format", "csv")
    with otel_replay.open(demo_dataset) as store:
        [decision] = store.rows("SELECT correlation_id FROM decisions")
    assert listed.exit_code == 0 and decision["correlation_id"] in listed.output.splitlines(), listed.output


def test_verify_with_another_key_names_three_records_counts_the_rest_and_says_which_option_helps(
    demo_dataset: Path, tmp_path: Path
) -> None:
    # Every record of the demo is signed with the demo's key: the same problem fourteen times is three lines and a
    # count, then one hint.
    other = tmp_path / "other.key"
    other.write_text("another-key-of-at-least-sixteen-bytes")
    result = run("verify", str(demo_dataset), "--key-file", str(other))
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    named = [line for line in lines if line.strip().startswith("record ") and "not a verification key" in line]
    assert len(named) == 3, result.stdout
    (more,) = [line for line in lines if line.strip().startswith("… and")]
    assert "more records: signed with key" in more and "which is not a verification key" in more
    assert any("hint: verify with the key that signed them: --key-file" in line for line in lines)


def test_a_key_file_variable_naming_a_missing_file_is_named_in_the_error(demo_dataset: Path, tmp_path: Path) -> None:
    missing = {"OTEL_REPLAY_SIGNING_KEY": None, "OTEL_REPLAY_KEY_FILE": str(tmp_path / "nokey")}
    result = run("verify", str(demo_dataset), env=missing)  # type: ignore[arg-type]
    line = error_line(result)
    assert "does not exist" in line and "OTEL_REPLAY_KEY_FILE" in line


def test_a_policy_module_that_raises_value_error_while_imported_is_named_with_its_line(
    demo_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A ValueError from the module's own code is not a relative module name: "give its absolute name" was wrong advice.
    module = "LIMIT = int('ten')\n\ndef policy(state, action):\n    return True, 'ok'\n"
    (tmp_path / "badpolicy_valueerror.py").write_text(module)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    live = tmp_path / "live.json"
    live.write_text("{}")
    with otel_replay.open(demo_dataset) as store:
        (decision,) = store.rows("SELECT record_id FROM decisions LIMIT 1")
    result = run(
        "replay", decision["record_id"], "-d", str(demo_dataset), "--live-state", str(live),
        "--policy", "badpolicy_valueerror:policy",
    )
    line = error_line(result)
    assert "importing its module raised ValueError" in line and "badpolicy_valueerror.py:1" in line
    assert "absolute name" not in line
    sys.modules.pop("badpolicy_valueerror", None)
