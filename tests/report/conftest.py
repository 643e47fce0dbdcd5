"""Fixtures for the report tests: a dataset whose every span text is hostile, and page parsing helpers."""

from __future__ import annotations

from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest

import otel_replay
from otel_replay import Action, AuditLog, DependencySnapshot, audit, correlation, session

SCRIPT = "<script>alert(1)</script>"
BREAKOUT = '"><img src=x onerror=alert(2)>'
JS_URL = "javascript:alert(3)"
SEPARATOR = "line\u2028separator"
BIDI = "abc\u202edcba"
LONG = "x" * 1_000_000


@dataclass(frozen=True)
class Hostile:
    """A dataset written with hostile text in every field a page shows."""

    path: Path
    correlation_id: str
    session_id: str
    record_id: str


@pytest.fixture
def hostile(dataset: Path) -> Hostile:
    """One correlation with a hostile audit entry and a hostile decision (in a session), flushed to ``dataset``."""
    telemetry = otel_replay.configure(dataset, service_name="report-tests", set_global=False)
    try:
        log = AuditLog()
        with session("sess-hostile"), correlation(agent_id=BREAKOUT) as cid:
            log.append(SCRIPT, source_agent=BREAKOUT, target_agent=JS_URL, payload={"note": SEPARATOR, "bidi": BIDI})
            state = {SCRIPT: BREAKOUT, "link": JS_URL, "long": LONG}
            with audit(SCRIPT, snapshot=DependencySnapshot(state, version=BREAKOUT)) as d:
                d.read(query=SCRIPT)
                d.model(BREAKOUT, decision_basis=JS_URL)
                d.act(Action(SCRIPT, {"to": BREAKOUT, "url": JS_URL}, cost=1))
            record_id = d.record_id
        assert telemetry.force_flush()
    finally:
        telemetry.shutdown()
    return Hostile(dataset, cid, "sess-hostile", record_id)


class Page(HTMLParser):
    """A page parsed: every start tag with its attributes, the text of each style and script element."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.styles: list[str] = []
        self.scripts: list[str] = []
        self.data: dict[str, str] = {}
        """The JSON data blocks (``<script type="application/json">``) by their id: never run."""
        self._data_id: str | None = None
        self.text: list[str] = []
        self._in: str | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in = tag if tag in ("style", "script") else None
        if tag == "script" and dict(attrs).get("type") == "application/json":
            self._in, self._data_id = "data", str(dict(attrs).get("id"))

    def handle_endtag(self, tag: str) -> None:
        self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "style":
            self.styles.append(data)
        elif self._in == "script":
            self.scripts.append(data)
        elif self._in == "data":
            self.data[str(self._data_id)] = self.data.get(str(self._data_id), "") + data
        else:
            self.text.append(data)

    def all(self, tag: str) -> list[dict[str, str | None]]:
        """The attributes of every ``tag`` element."""
        return [attrs for name, attrs in self.tags if name == tag]
