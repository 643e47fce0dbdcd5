"""Analyst SQL is read-only and confined to the dataset (issue 6, item 10).

Every hostile statement gets a one-line error, and afterwards every file of
the dataset is byte-identical and no file appeared anywhere we can see.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner

import otel_replay
from otel_replay import audit
from otel_replay.cli import main
from otel_replay.errors import QueryError, ReadOnlyViolation
from otel_replay.query.store import Store

from .._support import Demo, payment, snapshot

SECRET = "super-secret-signing-key-0123456789"


def _snapshot_files(*roots: Path) -> dict[str, str]:
    """Path -> sha256 of every file under ``roots``."""
    found = {}
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.is_file():
                found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.fixture
def captured(telemetry, dataset, tmp_path, monkeypatch):
    """A dataset with one decision, a signing key file in ~/.config, and the cwd in tmp_path."""
    with audit("vendor_payment", snapshot=snapshot(), correlation_id="c-1") as d:
        d.act(payment())
    telemetry.force_flush()
    key_file = Path.home() / ".config" / "otel-replay" / "signing.key"
    key_file.parent.mkdir(parents=True, exist_ok=True)
    key_file.write_text(SECRET)
    monkeypatch.chdir(tmp_path)
    return dataset, key_file


@pytest.fixture(scope="module")
def demo_store(demo_build: Demo) -> Iterator[Store]:
    """One store on the shared demo for the shipped queries: opening it (views, the analyst database) cost more
    than each query. Every ``run`` sets all of its query's variables (NULL when not given), and analyst SQL
    cannot set one, so no query sees another's values."""
    with otel_replay.open(demo_build.path) as store:
        yield store


def _hostile(dataset: Path, key_file: Path, tmp_path: Path) -> list[str]:
    spans = next((dataset / "spans").rglob("*.parquet"))
    new_part = dataset / "spans" / "date=2026-01-01" / "part-evil.parquet"
    return [
        f"COPY (SELECT * FROM spans) TO '{new_part}' (FORMAT parquet)",
        f"COPY (SELECT * FROM spans) TO '{spans}' (FORMAT parquet)",
        f"COPY decisions TO '{tmp_path / 'out.csv'}'",
        "CREATE TABLE t AS SELECT 1 AS x",
        "CREATE OR REPLACE VIEW decisions AS SELECT 42.0 AS action_cost",
        "CREATE OR REPLACE MACRO unambiguous(a) AS true",
        "DROP VIEW decisions",
        "DELETE FROM spans",
        "INSERT INTO spans SELECT * FROM spans",
        f"ATTACH '{tmp_path / 'x.db'}' AS x",
        "ATTACH ':memory:' AS m",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "SET allowed_directories = ['/']",
        "RESET lock_configuration",
        "SET VARIABLE otel_replay_files = ['/etc/passwd']",
        "PRAGMA enable_profiling",
        "CALL pragma_version()",
        "CHECKPOINT",
        f"EXPORT DATABASE '{tmp_path / 'exported'}'",
        f"EXPLAIN ANALYZE COPY (SELECT 1) TO '{tmp_path / 'explained.csv'}'",
        f"SELECT 1; COPY (SELECT 1) TO '{tmp_path / 'second.csv'}'",
        f"SELECT * FROM query('COPY (SELECT 1) TO ''{tmp_path / 'nested.csv'}''')",
        f"SELECT * FROM read_text('{key_file}')",
        "SELECT * FROM read_text('~/.config/otel-replay/signing.key')",
        f"SELECT * FROM read_blob('{key_file}')",
        f"SELECT * FROM read_csv('{key_file}', header = false)",
        "SELECT * FROM read_text('/etc/passwd')",
        "SELECT * FROM read_json('/etc/passwd')",
        "SELECT * FROM read_parquet('/etc/passwd')",
        f"SELECT * FROM '{key_file}'",
        "SELECT * FROM glob('/*')",
        f"SELECT * FROM read_text('{spans}/../../../../{key_file.relative_to(Path.home()).as_posix()}')",
        f"SELECT * FROM read_parquet('{dataset}/spans/**/*.parquet')",
        "SELECT * FROM secret_table",
    ]


def test_hostile_sql_is_refused_and_nothing_changes(captured, tmp_path):
    dataset, key_file = captured
    secret_table = pa.table({"s": [SECRET]})  # a caller's variable a replacement scan could read
    before = _snapshot_files(tmp_path, Path.home())
    with otel_replay.open(dataset) as store:
        count = store.rows("SELECT count(*) AS n FROM decisions")[0]["n"]
        for sql in _hostile(dataset, key_file, tmp_path):
            with pytest.raises(QueryError) as caught:
                store.query(sql)
            message = str(caught.value)
            assert "\n" not in message and SECRET not in message, sql
        # the views were not shadowed, dropped or redefined
        assert store.rows("SELECT count(*) AS n FROM decisions")[0]["n"] == count == 1
        assert store.rows("SELECT action_cost FROM decisions") == [{"action_cost": 4200.0}]
    assert secret_table.num_rows == 1
    assert _snapshot_files(tmp_path, Path.home()) == before


@pytest.mark.parametrize(
    "sql",
    [
        "COPY (SELECT 1) TO 'x.csv'",
        "CREATE TABLE t AS SELECT 1",
        "ATTACH ':memory:' AS m",
        "INSTALL httpfs",
        "SET enable_external_access = true",
        "PRAGMA version",
        "EXPLAIN ANALYZE COPY (SELECT 1) TO 'x.csv'",
        "PIVOT spans ON name USING count(*)",
    ],
)
def test_writes_are_read_only_violations_naming_the_statement(demo_store, tmp_path, monkeypatch, sql):
    monkeypatch.chdir(tmp_path)  # a relative path a statement names would land here, not in the checkout
    with pytest.raises(ReadOnlyViolation, match=r"refused \w+ statement"):
        demo_store.query(sql)


def test_reading_outside_the_dataset_is_a_read_only_violation(captured):
    dataset, key_file = captured
    with otel_replay.open(dataset) as store, pytest.raises(ReadOnlyViolation, match="signing.key"):
        store.query(f"SELECT content FROM read_text('{key_file}')")


def test_the_database_is_closed_off_as_measured(captured):
    dataset, _ = captured
    with otel_replay.open(dataset) as store:
        settings = store.rows(
            "SELECT current_setting('enable_external_access') AS ext, current_setting('lock_configuration') AS locked,"
            " current_setting('python_enable_replacements') AS py"
        )[0]
    assert settings == {"ext": False, "locked": True, "py": False}


@pytest.mark.slow
def test_sql_command_refuses_hostile_sql_with_one_line(captured, tmp_path):
    dataset, key_file = captured
    before = _snapshot_files(tmp_path, Path.home())
    for sql in _hostile(dataset, key_file, tmp_path):
        result = CliRunner().invoke(main, ["sql", sql, "-d", str(dataset), "--format", "csv"])
        assert result.exit_code == 1, (sql, result.output)
        assert isinstance(result.exception, SystemExit), (sql, result.exception)
        assert len(result.output.strip().splitlines()) == 1 and result.output.startswith("Error: "), sql
        assert SECRET not in result.output
    assert _snapshot_files(tmp_path, Path.home()) == before


def test_queries_still_run(captured):
    dataset, _ = captured
    with otel_replay.open(dataset) as store:
        assert store.rows("WITH d AS (SELECT * FROM decisions) SELECT count(*) AS n FROM d") == [{"n": 1}]
        assert store.rows("FROM decisions SELECT action_cost") == [{"action_cost": 4200.0}]
        assert store.rows("VALUES (1)") == [{"col0": 1}]
        assert {r["column_name"] for r in store.rows("DESCRIBE decisions")} >= {"record_id", "action_cost"}
        assert {r["name"] for r in store.rows("SHOW TABLES")} >= {"decisions", "spans", "gates"}
        assert store.rows("SUMMARIZE SELECT action_cost FROM decisions")
        assert store.rows("EXPLAIN SELECT * FROM decisions")
        assert store.rows("SELECT 1 AS a; SELECT 2 AS b") == [{"b": 2}]  # several queries: the last one's rows
        assert store.rows("SELECT ? AS x", [7]) == [{"x": 7}]
        with pytest.raises(QueryError, match="parameters bind to one statement"):
            store.query("SELECT ?; SELECT ?", [1])
        spans = store.rows("SELECT count(*) AS n FROM spans")
        assert store.rows("SELECT count(*) AS n FROM read_parquet(getvariable('otel_replay_files'))") == spans


_QUERIES = Path(str(resources.files("otel_replay.queries")))
SHIPPED = sorted(  # the DuckDB files (a `name.spark.sql` variant is for Spark)
    p.relative_to(_QUERIES).as_posix()[: -len(".sql")] for p in _QUERIES.rglob("*.sql") if p.name.count(".") == 1
)


DEFINITIONS = (  # files that define views and sources: not queries an analyst runs
    "source",
    "source_current",
    "empty_source",
    "views",
    "probe_file",
    "facts_views",
    "facts_source",
    "facts_none",
    "facts_input",
    "contract_verdicts",
    "log_records",
)
AUDIT_EVENTS = ["invoice_received", "budget_revised", "payment_reversed"]


def _names(rows: list[dict[str, Any]]) -> list[str]:
    return [r["name"] for r in rows]


def _layers(rows: list[dict[str, Any]]) -> list[str]:
    return [r["layer"] for r in rows]


def _pairs(first: str, second: str) -> Callable[[list[dict[str, Any]]], list[tuple[Any, Any]]]:
    return lambda rows: [(r[first], r[second]) for r in rows]


def _shipped_expectations(demo: Demo) -> dict[str, tuple[dict[str, Any], Callable[[list[dict[str, Any]]], Any], Any]]:
    """Per shipped query on the demo's dataset: (variables, what of the rows to compare, what it must be)."""
    cid, rid = demo.correlation_id, demo.record_id
    gates = ["replay.gate"] * 3  # intent, committed, rolled back
    return {
        "audit_entries": (
            {"correlation_id": cid},
            _pairs("event_type", "correlation_id"),
            [(event, cid) for event in AUDIT_EVENTS],
        ),
        "calibration": ({"decision_type": "vendor_payment"}, list, []),  # the demo's decision has no confidence
        "causal_tree": (
            {"root_trace_id": demo.trace_id, "root_span_id": demo.span_id},
            lambda rows: sorted((r["depth"], r["name"]) for r in rows),
            [
                (0, "replay.decision"),
                (1, "replay.act"),
                (1, "replay.gate"),
                (1, "replay.gate"),
                (1, "replay.model"),
                (1, "replay.read"),
            ],
        ),  # fmt: skip
        "contract_tool_calls": (  # the demo's one model call, under its correlation id, asked for no tool
            {"session_id": cid},
            lambda rows: [(r["session_id"], r["session_key_kind"], r["step"], r["call_index"]) for r in rows],
            [(cid, "correlation", 1, None)],
        ),
        "report_index": (  # the demo's one decision, newest first, with the fix its gate stored (the rollback)
            {},
            lambda rows: [(r["record_id"], r["correlation_id"], r["decision_type"], r["gate_fix"]) for r in rows],
            [(rid, cid, "vendor_payment", "ROLLBACK")],
        ),
        "decision_summary": (
            {"decision_type": "vendor_payment"},
            list,
            [{"decision_type": "vendor_payment", "decisions": 1, "with_confidence": 0, "mean_confidence": None}],
        ),
        "facts_extract": ({}, _pairs("kind", "record_id"), [("decision", rid)]),
        "record": ({"record_id": rid}, _pairs("name", "record_id"), [("replay.decision", rid)]),
        "lost_decisions": ({"correlation_id": cid}, list, []),  # the demo's decision span is stored: no intent shows
        "rerun_compare": ({"session_id": cid}, list, []),  # the demo records no rerun session
        "rerun_event_list": ({"session_id": cid}, list, []),
        "rerun_events": ({"session_id": cid}, list, []),
        "rerun_sessions": ({}, list, []),
        "sealed_records": (
            {},
            lambda rows: sorted(_names(rows)),
            sorted(["replay.audit_entry"] * 3 + ["replay.decision"] + gates),
        ),
        "traces": ({"correlation_id": cid}, _pairs("layer", "record_id"), [("trace", rid)]),
        "chains/trade": ({"chain_id": cid}, _layers, ["audit", "trace", "audit", "audit"]),
        "chains/directive": ({"chain_id": cid}, _layers, ["audit", "trace", "audit", "audit"]),
        "chains/incident": ({"chain_id": cid}, _layers, ["audit", "audit", "audit"]),
        "chains/session": ({"chain_id": cid}, list, []),  # the demo's records carry no session id
    }


@pytest.mark.parametrize("name", [n for n in SHIPPED if n not in DEFINITIONS])
def test_shipped_queries_give_the_demo_answers_as_analyst_sql_and_through_store_run(
    demo_dataset, demo_build, demo_store, name
):
    expectations = _shipped_expectations(demo_build)
    assert name in expectations, f"queries/{name}.sql is shipped: say here what it answers on the demo"
    variables, seen, expected = expectations[name]
    sql = (_QUERIES / f"{name}.sql").read_text()
    unset = demo_store.rows(sql)  # variables unset read as NULL: it runs, read-only
    assert unset == demo_store.run(name)  # the same rows as the store's own run with no variables
    assert seen(demo_store.run(name, **variables)) == expected


def test_definition_files_are_refused_as_analyst_sql(captured):
    dataset, _ = captured
    views = (_QUERIES / "views.sql").read_text()
    with otel_replay.open(dataset) as store, pytest.raises(ReadOnlyViolation, match="CREATE"):
        store.query(views)


def test_the_damaged_file_probe_is_shipped_sql_and_decodes_a_file(captured):
    dataset, _ = captured
    sql = (_QUERIES / "probe_file.sql").read_text()
    with otel_replay.open(dataset) as store:
        assert store.query(sql, [store.files[0]]).num_rows == 1
