"""DuckDB never draws its progress bar on the host's stdout (it did into ``compact --json`` at 10M spans)."""

from __future__ import annotations

import re
from pathlib import Path

from otel_replay import _duck
from otel_replay.store import Store

PACKAGE = Path(__file__).resolve().parents[1] / "otel_replay"


def _bar(con) -> bool:  # type: ignore[no-untyped-def]
    return con.execute("SELECT current_setting('enable_progress_bar')").fetchone()[0]


def test_every_connection_the_package_opens_has_the_bar_off(tmp_path: Path) -> None:
    store = Store(tmp_path / "empty")
    assert _bar(store._con) is False
    assert _bar(store._analyst_con()) is False
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
