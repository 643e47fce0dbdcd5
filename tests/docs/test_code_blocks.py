"""The manual as a user runs it: every Python and SQL block of README.md and docs/**/*.md.

Conventions for a page's blocks:

- ```python blocks run in order, in one new process per page (one namespace, as a user
  pasting them into one session; forked from a zygote which imported the package and
  the model clients once), in a temporary working directory.
  Pages that build on each other share one process, in the order of ``CHAINED``.
- A hidden ``<!-- setup ... -->`` comment holds code a fragment needs (a stand-in for
  the user's agent or rail); it runs in its place among the page's blocks and is not
  shown on the site.
- ```sql blocks run against the demo dataset: analyst SQL through ``Store.rows``; a
  DuckDB CLI script (one with ``.read`` lines) from Python, and through the ``duckdb``
  binary when one is installed (``pip install duckdb-cli``).
- Other fences (bash, text) are not run.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import duckdb
import pytest

import otel_replay
from otel_replay.storage import live_files

from .._support import TEST_KEY, Zygote

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
QUERIES = ROOT / "otel_replay" / "queries"

# Guides whose Python blocks continue one another (capture -> replay -> chains), as the
# README's sections once did: one interpreter for the three.
CHAINED = ("guides/capture.md", "guides/replay-and-gate.md", "guides/sql-and-chains.md")

_BLOCK = re.compile(r"^```(python|sql)\n(.*?)^```|^<!-- setup\n(.*?)^-->", re.MULTILINE | re.DOTALL)
_HEADING = re.compile(r"^#{1,3} (.+)$", re.MULTILINE)

# Runs the blocks one after another in a single namespace and names the block (by its
# page and section) that failed.
_DRIVER = """
import json, sys, traceback
blocks = json.loads(sys.stdin.read())
namespace = {"__name__": "__main__"}
for index, (where, code) in enumerate(blocks["blocks"]):
    try:
        exec(compile(code, f"block {index + 1} ({where})", "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print(f"FAILED: block {index + 1} in {where}", file=sys.stderr)
        sys.exit(3)
exec(compile(blocks["after"], "checks after the blocks", "exec"), namespace)
print("BLOCKS OK")
"""


def md_files() -> list[Path]:
    """README.md and every page of the manual."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def blocks_of(path: Path, kind: str = "python") -> list[tuple[str, str]]:
    """``(page: section, code)`` for every ``kind`` block (setup comments count as python), in order."""
    text = path.read_text(encoding="utf-8")
    headings = [(m.start(), m.group(1)) for m in _HEADING.finditer(text)]
    name = path.relative_to(ROOT).as_posix()
    out = []
    for match in _BLOCK.finditer(text):
        found = "python" if match.group(3) is not None else match.group(1)
        if found != kind:
            continue
        section = [h for pos, h in headings if pos < match.start()]
        out.append((f"{name}: {section[-1] if section else '(top)'}", match.group(3) or match.group(2)))
    return out


def _run(
    zygote: Zygote, cwd: Path, blocks: list[tuple[str, str]], after: str = ""
) -> subprocess.CompletedProcess[str]:
    """The blocks in one new process (forked from a zygote that imported the package and the model clients once:
    a page's own process, with no tracer provider set, nothing configured and none of this process's state)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTEST"))}
    env.update(OTEL_REPLAY_SIGNING_KEY=TEST_KEY, HOME=str(cwd / "home"), PYTHONPATH=str(ROOT))
    child = zygote.with_model_clients().popen(_DRIVER, stdin=True, cwd=str(cwd), env=env)
    assert child.stdin is not None
    child.stdin.write(json.dumps({"blocks": blocks, "after": after}))
    out, err = child.communicate(timeout=240)
    return subprocess.CompletedProcess(["<page>"], child.returncode, out, err)


def _assert_clean(out: subprocess.CompletedProcess[str]) -> None:
    assert out.returncode == 0, out.stdout + out.stderr
    assert "BLOCKS OK" in out.stdout
    # Nothing went to the log either: no lost record, no dataset-less gate, no failed flush.
    assert "otel-replay:" not in out.stderr and "Traceback" not in out.stderr, out.stderr


def _page(path: Path) -> str:
    return path.relative_to(DOCS).as_posix()


# --- Python blocks ------------------------------------------------------------------------------

# What the README's tutorial promises, checked in its namespace after the last block.
_README_AFTER = """
assert same.matched, same.report()
assert not changed.matched and changed.divergence is not None
assert verdict.fix.name == "ROLLBACK", verdict
assert outcome.executed == "rolled_back", outcome
assert ledger.balance == 10_000 - 4200 - 4200 + 4200, ledger.balance   # paid, paid again while recording, refunded once
"""

# What the chained guides promise, checked after the last of their blocks.
_CHAINED_AFTER = """
from otel_replay import Store
from otel_replay.capture import get_recorder
assert outcome.executed == "rolled_back", outcome
assert chain.traces and chain.traces[0]["decision_type"] == "position_sizing", chain.traces
assert get_recorder().stats.dropped_after_shutdown == 0
with Store("./traces") as fresh:
    gates = fresh.rows("SELECT executed FROM gates WHERE decision_id = ?", [record.record_id])
    assert sorted(g["executed"] for g in gates) == ["committed", "intent", "rolled_back"], gates
    assert fresh.record(record.record_id) == record
"""


def test_readme_tutorial_runs_in_order(zygote: Zygote, tmp_path: Path) -> None:
    blocks = blocks_of(README)
    assert len(blocks) >= 5, blocks
    _assert_clean(_run(zygote, tmp_path, blocks, _README_AFTER))


def test_readme_is_a_short_start() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    # The test command .ci/run runs, exactly as given.
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest -q"
    assert command in text and ".venv/bin/python -m pytest -q" in ci
    assert "otel-replay demo" in text
    for word in ("seed 0", "this machine", "2 cores", "2-core"):
        assert word not in text, word
    assert not re.search(r"20\d\d-\d\d-\d\d", text), "a dated figure in README"


def test_the_chained_guides_run_in_order(zygote: Zygote, tmp_path: Path) -> None:
    blocks = [b for page in CHAINED for b in blocks_of(DOCS / page)]
    _assert_clean(_run(zygote, tmp_path, blocks, _CHAINED_AFTER))


_ALONE = sorted(
    _page(p) for p in DOCS.rglob("*.md") if _page(p) not in CHAINED and blocks_of(p)
)


def test_python_blocks_are_fenced_as_python() -> None:
    """A ```py or ```python3 fence would be shown but never run: every Python block says ```python."""
    for path in md_files():
        fences = re.findall(r"^```(\S+)", path.read_text(encoding="utf-8"), re.MULTILINE)
        assert not {"py", "python3", "pycon", "SQL", "duckdb"} & set(fences), (path, fences)


def test_every_page_with_python_is_run() -> None:
    assert set(_ALONE) >= {"guides/instrumenting.md", "guides/record-and-rerun.md"}, _ALONE


@pytest.mark.parametrize("page", _ALONE)
def test_a_page_runs_alone(zygote: Zygote, page: str, tmp_path: Path) -> None:
    _assert_clean(_run(zygote, tmp_path, blocks_of(DOCS / page)))


def _section_block(page: str, section: str) -> str:
    return next(code for where, code in blocks_of(DOCS / page) if where.endswith(": " + section))


def test_instrumenting_block_works_on_a_fresh_proxy_provider(zygote: Zygote, tmp_path: Path) -> None:
    """The block alone, where the global provider is still the API's ProxyTracerProvider."""
    code = _section_block("guides/instrumenting.md", "Instrumenting an existing OpenTelemetry setup")
    after = """
from opentelemetry import trace as _trace
from otel_replay import Action, DependencySnapshot, audit, correlation, open as _open
from otel_replay.capture import get_recorder
with correlation("c-proxy"), audit("pay", snapshot=DependencySnapshot({"b": 1})) as d:
    d.act(Action("pay", {"to": "x"}, cost=1))
    with _trace.get_tracer("someone.else").start_as_current_span("http-call"):
        pass
assert get_recorder().flush() is True
with _open("./traces") as store:
    names = {r["name"]: r["correlation_id"] for r in store.rows("SELECT name, correlation_id FROM spans")}
    assert names["http-call"] == "c-proxy" and names["replay.decision"] == "c-proxy", names
    assert store.record(d.record.record_id) == d.record
"""
    _assert_clean(_run(zygote, tmp_path, [("instrumenting", code)], after))


def test_the_old_readme_order_fails_loudly_not_silently(zygote: Zygote, tmp_path: Path) -> None:
    """Shutting down, then using the gate: the gate record is reported lost, never dropped unseen."""
    setup = """
import otel_replay
from otel_replay import Action, ActionGate, DependencySnapshot, FixAction, ReferenceLedger, Verdict, audit
telemetry = otel_replay.configure("./traces")
gate = ActionGate(ReferenceLedger(balance=10_000))
with audit("pay", snapshot=DependencySnapshot({"b": 1})) as d:
    receipt = gate.commit(Action("pay", {"to": "x"}, cost=1), record_id=d.record_id)
telemetry.shutdown()
"""
    after = """
from otel_replay import CaptureError
from otel_replay.capture import get_recorder
gate.enforce_post_commit(Verdict(FixAction.ROLLBACK, False, "stale", d.record_id), receipt=receipt)
assert get_recorder().stats.dropped_after_shutdown == 1, get_recorder().stats
try:
    with audit("pay", snapshot=DependencySnapshot({"b": 1})):
        raise AssertionError("the block must not run")
except CaptureError as exc:
    assert "shut down" in str(exc)
"""
    out = _run(zygote, tmp_path, [("setup", setup)], after)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "BLOCKS OK" in out.stdout
    assert out.stderr.count("emitted after the telemetry pipeline was shut down") == 1, out.stderr


def test_the_cli_reference_gives_the_rerun_divergence_exit_code_the_command_uses() -> None:
    from otel_replay.cli.rerun import DIVERGED

    text = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `otel-replay rerun "))
    assert f"{DIVERGED} a rerun did not match" in row
    assert "2 a rerun did not match" not in text


# --- SQL blocks and the plain-DuckDB recipe ------------------------------------------------------


@pytest.fixture
def demo(demo_dataset: Path) -> Path:
    """The demo's dataset (a payment, its commit and rollback, audit entries, a trade chain), shared read-only."""
    return demo_dataset


def _cli_script(code: str) -> bool:
    return any(line.startswith(".read ") for line in code.splitlines())


_SQL = [(where, code) for path in md_files() for where, code in blocks_of(path, "sql")]


def test_the_plain_duckdb_recipe_is_in_the_manual() -> None:
    assert any(_cli_script(code) for _, code in _SQL), "the DuckDB CLI recipe is gone"


@pytest.mark.parametrize("where,code", [b for b in _SQL if not _cli_script(b[1])], ids=lambda v: v[:40])
def test_an_analyst_sql_block_runs(where: str, code: str, demo: Path) -> None:
    with otel_replay.open(str(demo)) as store:
        store.rows(code)


def _recipe_from_python(script: str, dataset: Path) -> list[tuple]:
    """A DuckDB CLI script run from Python: ``.read FILE`` is the file's text, paths from the repository."""
    con = duckdb.connect()
    result: list[tuple] = []
    script = script.replace("'./traces/spans/**/*.parquet'", "?")
    for line in script.strip().splitlines():
        if line.startswith(".read "):
            result = con.execute((ROOT / line.split(maxsplit=1)[1]).read_text(encoding="utf-8")).fetchall()
        elif "?" in line:
            con.execute(line, [live_files(str(dataset))])
        else:
            con.execute(line)
    return result


def _duckdb_cli() -> str:
    """The ``duckdb`` binary, or a skip saying why the CLI half cannot run here."""
    binary = shutil.which("duckdb") or shutil.which("duckdb", path=str(Path(sys.executable).parent))
    if binary is None:
        pytest.skip("no duckdb CLI binary on PATH (pip install duckdb-cli)")
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout.split()
    major = int(version[0].lstrip("v").split(".")[0]) if version else 0
    if major < 2:
        # The views use DuckDB 2's TIMESTAMPTZ_NS; PyPI's duckdb-cli is still a 1.x build.
        pytest.skip(f"the duckdb CLI on PATH is {version[:1]}, older than the DuckDB 2.0 the shipped SQL needs")
    return binary


def _recipe_through_cli(binary: str, script: str) -> list[dict]:
    out = subprocess.run(
        [binary, "-json", "-bail", ":memory:"], input=script, capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout.strip()
    return json.loads(text) if text else []


@pytest.mark.parametrize("where,code", [b for b in _SQL if _cli_script(b[1])], ids=lambda v: v[:40])
def test_the_cli_recipe_runs_from_python(where: str, code: str, demo: Path) -> None:
    [trade_id] = {r[0] for r in duckdb.sql(
        f"SELECT correlation_id FROM read_parquet({live_files(str(demo))!r}) WHERE correlation_id IS NOT NULL"
    ).fetchall()} or {None}
    script = re.sub(r"SET VARIABLE chain_id = '[^']*'", f"SET VARIABLE chain_id = '{trade_id}'", code)
    assert _recipe_from_python(script, demo), "the recipe's chain came back empty"


@pytest.mark.parametrize("where,code", [b for b in _SQL if _cli_script(b[1])], ids=lambda v: v[:40])
def test_the_cli_recipe_runs_in_the_duckdb_cli(where: str, code: str, demo: Path) -> None:
    binary = _duckdb_cli()
    [trade_id] = {r[0] for r in duckdb.sql(
        f"SELECT correlation_id FROM read_parquet({live_files(str(demo))!r}) WHERE correlation_id IS NOT NULL"
    ).fetchall()} or {None}
    script = re.sub(r"SET VARIABLE chain_id = '[^']*'", f"SET VARIABLE chain_id = '{trade_id}'", code)
    rows = _recipe_from_python(script, demo)
    files_list = "[" + ", ".join(f"'{f}'" for f in live_files(str(demo))) + "]"
    cli_rows = _recipe_through_cli(binary, script.replace("'./traces/spans/**/*.parquet'", files_list))
    assert len(cli_rows) == len(rows)


# Building blocks a query runs on, not queries of their own: the recipe loads the first
# three, the Store the rest (its facts files, its probes, the contract evidence views); trade.spark.sql is Spark's.
_BUILDING_BLOCKS = {
    "source.sql", "views.sql", "facts_views.sql", "source_current.sql", "empty_source.sql", "facts_source.sql",
    "facts_none.sql", "facts_extract.sql", "facts_input.sql", "probe_file.sql", "chains/trade.spark.sql",
    "contract_verdicts.sql", "log_records.sql",
}
_SHIPPED = sorted(
    q.relative_to(QUERIES).as_posix()
    for q in [*QUERIES.glob("*.sql"), *QUERIES.glob("chains/*.sql")]
    if q.relative_to(QUERIES).as_posix() not in _BUILDING_BLOCKS
)


def _variables(query: str) -> list[str]:
    """The variables a query reads that its caller sets (the ``otel_replay_*`` ones are the source's own)."""
    return sorted(v for v in set(re.findall(r"getvariable\('([a-z_]+)'\)", query)) if not v.startswith("otel_replay_"))


@functools.cache  # the demo dataset is the session's read-only one: its ids are read once, not per variable
def _demo_values(dataset: Path) -> dict[str, object]:
    with otel_replay.open(str(dataset)) as store:
        decision = store.rows("SELECT record_id, correlation_id, trace_id, span_id FROM decisions LIMIT 1")[0]
    return {
        "chain_id": decision["correlation_id"], "correlation_id": decision["correlation_id"],
        "record_id": decision["record_id"], "gate_decision_id": decision["record_id"],
        "root_trace_id": decision["trace_id"], "root_span_id": decision["span_id"],
        "chain_limit": 100, "entry_limit": 100, "trace_limit": 100,
    }


def test_every_shipped_query_is_covered() -> None:
    assert "calibration.sql" in _SHIPPED and "chains/trade.sql" in _SHIPPED, _SHIPPED
    for block in _BUILDING_BLOCKS:
        assert (QUERIES / block).is_file(), block


def _plain(query: str, dataset: Path) -> tuple[dict[str, object], list[tuple]]:
    """source.sql + views.sql + facts_views.sql, the query's variables, the query: from Python."""
    text = files("otel_replay.queries").joinpath(query).read_text(encoding="utf-8")
    values = {name: _demo_values(dataset).get(name) for name in _variables(text)}
    con = duckdb.connect()
    con.execute("SET VARIABLE otel_replay_files = ?", [live_files(str(dataset))])
    for name in ("source.sql", "views.sql", "facts_views.sql"):
        con.execute(files("otel_replay.queries").joinpath(name).read_text(encoding="utf-8"))
    for name, value in values.items():
        con.execute(f"SET VARIABLE {name} = ?", [value])
    return values, con.execute(text).fetchall()


@pytest.mark.parametrize("query", _SHIPPED)
def test_a_shipped_query_runs_in_plain_duckdb_after_the_documented_files(query: str, demo: Path) -> None:
    """The recipe from Python gives the Store's rows (as many, for the demo's ids)."""
    values, plain = _plain(query, demo)
    with otel_replay.open(str(demo)) as store:
        stored = store.run(query.removesuffix(".sql"), **values)
    assert len(plain) == len(stored), (plain, stored)


def test_the_demo_gives_the_recipe_rows_to_compare(demo: Path) -> None:
    counts = {query: len(_plain(query, demo)[1]) for query in ("chains/trade.sql", "traces.sql", "audit_entries.sql")}
    assert all(counts.values()), counts


@pytest.mark.parametrize("query", _SHIPPED)
def test_a_shipped_query_runs_in_the_duckdb_cli_after_the_documented_files(query: str, demo: Path) -> None:
    binary = _duckdb_cli()
    values, plain = _plain(query, demo)
    files_list = "[" + ", ".join(f"'{f}'" for f in live_files(str(demo))) + "]"
    script = [f"SET VARIABLE otel_replay_files = {files_list};"]
    script += [f".read otel_replay/queries/{name}" for name in ("source.sql", "views.sql", "facts_views.sql")]
    for name, value in values.items():
        literal = "NULL" if value is None else (str(value) if isinstance(value, int) else f"'{value}'")
        script.append(f"SET VARIABLE {name} = {literal};")
    script.append(f".read otel_replay/queries/{query}")
    assert len(_recipe_through_cli(binary, "\n".join(script) + "\n")) == len(plain)
