"""Terminal output: data is escaped, every column kept, nothing wrapped off a terminal (issue 6, item 12)."""

from __future__ import annotations

import csv
import io
import json

import duckdb
import pytest

from otel_replay.cli import render
from otel_replay.integrity import VerifyReport
from otel_replay.query.analyst import table_rows, unique_names
from otel_replay.query.chains import ReplayChain

HOSTILE = [
    "\x1b[31mred\x1b[0m",
    "\x1b]0;pwned\x07",
    "\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\",
    "a\rb\nc",
    "\u202eevil",
    ":x: [bold]b[/bold]",
    "\x9b2J",
]


def _arrow(sql: str):
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    return con.sql(sql).to_arrow_table()


def _hostile_table():
    con = duckdb.connect()
    columns = ", ".join(f"?::VARCHAR AS c{i}" for i in range(len(HOSTILE)))
    return con.sql(f"SELECT {columns}", params=HOSTILE).to_arrow_table()


def test_table_escapes_controls_and_keeps_markup_and_emoji_codes_literal(capsys):
    render.print_table(_hostile_table(), "table")
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out and "\u202e" not in out and "\x9b" not in out
    assert "\\x1b[31mred" in out and "\\x1b]0;pwned\\x07" in out and "\\u202eevil" in out and "\\x9b2J" in out
    assert "a\\rb\\nc" in out and "\\x1b]8;;http://evil\\x1b\\link" in out
    assert ":x:" in out and "❌" not in out
    assert "[bold]b[/bold]" in out


def test_json_is_faithful_and_terminal_safe(capsys):
    render.print_table(_hostile_table(), "json")
    out = capsys.readouterr().out
    assert "\x1b" not in out  # JSON escapes control characters itself
    assert json.loads(out) == {f"c{i}": value for i, value in enumerate(HOSTILE)}


def test_csv_is_faithful(capsys):
    render.print_table(_hostile_table(), "csv")
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out, newline="")))
    assert rows == [[f"c{i}" for i in range(len(HOSTILE))], HOSTILE]


@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
def test_repeated_column_names_keep_every_column(capsys, fmt):
    render.print_table(_arrow("SELECT 1 AS a, 2 AS a, 3 AS a_2, 4 AS a"), fmt)
    out = capsys.readouterr().out
    if fmt == "json":
        assert json.loads(out) == {"a": 1, "a_3": 2, "a_2": 3, "a_4": 4}
    elif fmt == "csv":
        assert out.splitlines() == ["a,a_3,a_2,a_4", "1,2,3,4"]
    else:
        header = out.splitlines()[1]
        assert [c.strip() for c in header.strip("┃").split("┃")] == ["a", "a_3", "a_2", "a_4"]
        assert [c.strip() for c in out.splitlines()[3].strip("│").split("│")] == ["1", "2", "3", "4"]


def test_unique_names():
    assert unique_names(["a", "a", "b", "a"]) == ["a", "a_2", "b", "a_3"]
    assert unique_names(["x", "x_2", "x"]) == ["x", "x_2", "x_3"]


def test_off_a_terminal_tables_are_not_wrapped_at_80_columns(capsys):
    columns = ", ".join(f"'{'v' * 20}{i}' AS column_{i}" for i in range(8))
    render.print_table(
        _arrow(f"SELECT TIMESTAMPTZ '2026-03-02 14:30:01.123456+00' AS at, {columns} FROM range(3)"), "table"
    )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 + 3 + 1 + 1  # header block, three rows, bottom border, row count
    assert max(len(line) for line in lines) > 200
    assert all("2026-03-02 14:30:01.123456+00:00" in line for line in lines[3:6])
    assert '"2026' not in "\n".join(lines)  # times print without JSON quotes


def test_long_values_are_cut_in_the_table_only_and_the_footer_says_so(capsys):
    result = _arrow("SELECT repeat('x', 500) AS long")
    render.print_table(result, "table")
    out = capsys.readouterr().out
    assert "x" * 59 + "…" in out and "x" * 61 not in out
    assert "json or csv prints them whole" in out
    render.print_table(result, "json")
    assert json.loads(capsys.readouterr().out) == {"long": "x" * 500}


def test_out_of_range_values_print_as_text(capsys):
    sql = (
        "SELECT 'infinity'::TIMESTAMP AS a, '-infinity'::TIMESTAMP AS b, 'infinity'::DATE AS c,"
        " '294246-01-01'::TIMESTAMP AS d, 'infinity'::TIMESTAMPTZ AS e, ['infinity'::TIMESTAMP] AS f,"
        " {'t': '-infinity'::DATE} AS g, 'nan'::DOUBLE AS h, '2026-01-01 10:00:00.123456789'::TIMESTAMP_NS AS i"
    )
    for fmt in ("table", "csv"):
        render.print_table(_arrow(sql), fmt)
        out = capsys.readouterr().out
        assert "infinity" in out and "-infinity" in out and "294246-01-01 00:00:00" in out
    render.print_table(_arrow(sql), "json")
    assert json.loads(capsys.readouterr().out) == {
        "a": "infinity",
        "b": "-infinity",
        "c": "infinity",
        "d": "294246-01-01 00:00:00",
        "e": "infinity",
        "f": ["infinity"],
        "g": {"t": "-infinity"},
        "h": "NaN",
        "i": "2026-01-01 10:00:00.123456789",  # every stored digit
    }
    names, rows = table_rows(_arrow(sql))
    assert rows[0][0] == "infinity" and rows[0][8].microsecond == 123456  # Python values where Python can hold them


def test_chain_table_never_cuts_the_outcome(capsys):
    long_rationale = "because " * 40
    event = {
        "layer": "trace",
        "created_at": "2026-03-02T14:30:01.123456+00:00",
        "decision_type": "vendor_payment\x1b[2J",
        "agent_id": "agent\x1b]0;x\x07",
        "rationale": long_rationale,
        "outcome_correct": False,
        "confidence": 0.5,
    }
    chain = ReplayChain("trade", "c-1", events=[event], traces=[event], limit=2, truncated_layers=("trace",))
    render.print_chain(chain)
    out = capsys.readouterr().out
    assert "incorrect" in out and "2026-03-02T14:30:01.123456+00:00" in out
    assert "\x1b" not in out and "agent\\x1b]0;x\\x07" in out
    assert "truncated" in out and "more than 2 rows" in out
    render.print_chain(chain, as_json=True)
    assert json.loads(capsys.readouterr().out)["traces"][0]["agent_id"] == "agent\x1b]0;x\x07"


def test_verify_names_what_it_could_not_check(capsys):
    report = VerifyReport(records=3, unreadable_files=["/d/spans/date=2026-01-01/part-1.parquet"])
    render.print_verify(report, "/d", True)
    out = capsys.readouterr().out
    assert out.startswith("FAILED") and "1 unreadable file" in out
    assert "not checked: /d/spans/date=2026-01-01/part-1.parquet" in out
