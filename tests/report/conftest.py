"""Fixtures for the report tests: a dataset whose every span text is hostile, page parsing, and the browser."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

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


# --- the browser: headless Chromium driven by Playwright (see test_report_browser.py) ---

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
HAVE_PLAYWRIGHT = importlib.util.find_spec("playwright") is not None
REQUIRED = os.environ.get("OTEL_REPLAY_REQUIRE_BROWSER") == "1"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Recorded in each page before any of its own script runs: CSP violations and any dialog a script opened.
WATCH = """
window.__violations = [];
document.addEventListener('securitypolicyviolation', function (e) { window.__violations.push(e.violatedDirective); });
window.alert = function () { window.__alerted = true; };
"""


def _missing() -> str | None:
    if CHROMIUM is None:
        return "no chromium on PATH (apt-get install chromium)"
    if not HAVE_PLAYWRIGHT:
        return "the playwright package is not installed (pip install playwright; never `playwright install`)"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    why = _missing()
    if why is not None:
        if REQUIRED:
            pytest.fail(f"OTEL_REPLAY_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(why)
    from playwright.sync_api import sync_playwright  # here: an optional test dependency, checked just above

    with sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


class Watched:
    """A page with every request, console error, page error and dialog it caused recorded."""

    def __init__(self, browser: Any) -> None:
        self.context = browser.new_context(viewport={"width": 1300, "height": 900}, java_script_enabled=True)
        self.context.add_init_script(WATCH)
        self.page = self.context.new_page()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

    def open(self, url: str) -> None:
        self.page.goto(url, wait_until="load")

    def clean(self) -> None:
        """No console error, no CSP violation, no dialog, nothing the page's script marked."""
        assert self.errors == []
        assert self.page.evaluate("window.__violations") == []
        assert self.dialogs == [] and self.page.evaluate("window.__alerted === undefined")

    def shot(self, name: str) -> None:
        where = os.environ.get("OTEL_REPLAY_SCREENSHOT_DIR")
        if where:
            Path(where).mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(Path(where) / f"{name}.png"), full_page=True)

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def watched(browser: Any) -> Iterator[Watched]:
    page = Watched(browser)
    try:
        yield page
    finally:
        page.close()
