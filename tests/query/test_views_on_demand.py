"""Shared views are defined when a query names them: ``SELECT 1`` defines none, and every query sees the same rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_replay.errors import ReadOnlyViolation
from otel_replay.query.catalog import ViewCatalog
from otel_replay.query.engine import _catalog, load_sql
from otel_replay.query.store import Store

from ..storage.conftest import load_generator


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("views") / "ds"
    load_generator().generate(path, spans=120, ids=12, days=1, rows_per_file=10, duplicates=0.0, seed=11)
    return path


def _views(store: Store, *, analyst: bool) -> set[str]:
    con = store.engine._analyst_con() if analyst else store.engine._con  # noqa: SLF001
    rows = con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()
    return {name for (name,) in rows}


def test_select_1_defines_no_shared_view_on_either_connection(day: Path) -> None:
    with Store(day) as store:
        assert store.rows("SELECT 1 AS one") == [{"one": 1}]
        assert "decisions" not in _views(store, analyst=False)
        assert "decisions" not in _views(store, analyst=True)
        # only the two sources (and the empty tables registered for them)
        sources = {view for view in _views(store, analyst=True) if not view.startswith("otel_replay_")}
        assert sources == {"span_source", "log_source"}


def test_a_query_naming_a_view_gets_it_and_what_it_stands_on_and_the_rows_of_every_view_defined(day: Path) -> None:
    with Store(day) as every:
        every.rows("SHOW TABLES")  # reads the catalog: every view, as when all were defined at open
        listed = _views(every, analyst=True)
        assert {"decisions", "outcomes", "audit_entries", "contract_decisions", "genai_events", "decision_facts"} <= (
            listed
        )
        reference = every.rows("SELECT record_id, decision_type FROM decisions ORDER BY record_id")
    assert reference
    with Store(day) as store:
        # A name in another case, in a quoted identifier, behind a comment: each still names the view.
        for sql in (
            "SELECT record_id, decision_type FROM DECISIONS ORDER BY record_id",
            'SELECT record_id, decision_type FROM "decisions" ORDER BY record_id',
            "-- the decisions\nSELECT record_id, decision_type FROM decisions ORDER BY record_id",
        ):
            assert store.rows(sql) == reference
        defined = _views(store, analyst=True)
        assert {"decisions", "spans"} <= defined and "contract_decisions" not in defined


def test_a_refused_statement_defines_nothing_and_a_word_in_a_string_only_defines_more(day: Path) -> None:
    with Store(day) as store:
        with pytest.raises(ReadOnlyViolation):
            store.rows("CREATE VIEW x AS SELECT * FROM decisions")
        assert "decisions" not in _views(store, analyst=True)
        assert store.rows("SELECT 'outcomes' AS word") == [{"word": "outcomes"}]
        assert "outcomes" in _views(store, analyst=True)  # defined for nothing: never a wrong answer


def test_chains_and_facts_queries_get_what_they_name_after_a_refresh(day: Path) -> None:
    with Store(day) as store, Store(day) as fresh:
        chain = "trade-000000003"
        first = store.run_for("chains/trade", {"correlation_id": chain}, chain_id=chain)
        store.refresh()  # a new span_source: the views are defined again when named
        assert store.run_for("chains/trade", {"correlation_id": chain}, chain_id=chain) == first
        assert first == fresh.run("chains/trade", chain_id=chain)
        assert store.calibration() == fresh.calibration()


def test_the_catalog_answers_a_view_with_what_it_needs_in_file_order() -> None:
    catalog = ViewCatalog(
        [
            "-- a comment naming b\nCREATE OR REPLACE MACRO a(x) AS x;\n"
            "CREATE OR REPLACE VIEW b AS SELECT a(1) AS y;\n"
            "CREATE OR REPLACE VIEW c AS SELECT * FROM b;\n"
            "create or replace view d as select 2 -- c\n;",
        ]
    )
    assert catalog.needed("SELECT * FROM c", set()) == ["a", "b", "c"]
    assert catalog.needed("SELECT * FROM C", {"a"}) == ["b", "c"]
    assert catalog.needed("SELECT * FROM d", set()) == ["d"]  # a name in a comment is no dependency
    assert catalog.needed("SELECT 1", set()) == []
    assert catalog.needed("SHOW TABLES", {"b"}) == ["a", "c", "d"]
    shipped = _catalog()
    needed = shipped.needed(load_sql("chains/trade"), set())
    assert "decisions_in" in needed and "spans" in needed and "contract_decisions" not in needed
    assert needed.index("spans") < needed.index("decisions_in")
