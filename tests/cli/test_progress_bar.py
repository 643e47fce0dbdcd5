"""DuckDB never draws its progress bar on the host's stdout (it did into ``compact --json`` at 10M spans)."""

from __future__ import annotations

import re
from pathlib import Path

from otel_replay import _duck
from otel_replay.query.store import Store

PACKAGE = Path(__file__).resolve().parents[2] / "otel_replay"


def _bar(con) -> bool:  # type: ignore[no-untyped-def]
    return con.execute("SELECT current_setting('enable_progress_bar')").fetchone()[0]


def test_every_connection_the_package_opens_has_the_bar_off(tmp_path: Path) -> None:
    store = Store(tmp_path / "empty")
    assert _bar(store.engine._con) is False
    assert _bar(store.engine._analyst_con()) is False
    assert _bar(_duck.connect()) is False
    store.close()


def test_duckdb_is_opened_only_through_the_one_helper() -> None:
    opened = re.compile(r"duckdb\.connect\(")
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "_duck.py" and opened.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []



def test_arrow_fetches_leave_the_warning_filters_as_they_were_across_threads(tmp_path: Path) -> None:
    # DuckDB 2 warns on every Arrow fetch from execute(); the package silences it around the fetch only. Lookups
    # on many threads at once must leave the process's filters exactly as found (catch_warnings is process-wide).
    import threading
    import warnings

    stores = [Store(tmp_path / "empty") for _ in range(6)]  # a Store's connection serves one call at a time
    before = list(warnings.filters)
    errors: list[BaseException] = []

    def lookups(store: Store) -> None:
        try:
            for _ in range(200):
                assert store.engine._execute("SELECT 1 AS a").num_rows == 1  # pytest turns warnings into errors here
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=lookups, args=(store,)) for store in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and warnings.filters == before
    for store in stores:
        store.close()


def test_only_the_duckdb_helper_touches_the_warning_filters() -> None:
    swaps = re.compile(r"catch_warnings\(|simplefilter\(|filterwarnings\(")
    offenders = [
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.name != "_duck.py" and swaps.search(p.read_text("utf-8"))
    ]
    assert offenders == []
