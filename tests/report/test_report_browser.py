"""The pages in a real browser: headless Chromium driven by Playwright, offline.

Each page renders with no console error and no Content-Security-Policy
violation, makes no request beyond itself, keeps hostile span text inert,
expands a decision on click, and the UI's index → session → decision → rerun
path works by clicking. Debian's ``chromium`` is used (Playwright never
downloads a browser here). Without it, or without the ``playwright`` package,
these tests skip, unless ``OTEL_REPLAY_REQUIRE_BROWSER=1`` (CI), where they fail.
A PNG of each page kind goes to ``$OTEL_REPLAY_SCREENSHOT_DIR`` when it is set (CI keeps that folder).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import otel_replay
from otel_replay.query.chains import ReplayBuilder
from otel_replay.report import html, model
from otel_replay.report.server import make_server
from otel_replay.rerun import rerun

from ..rerun.conftest import agent, record
from .conftest import BREAKOUT, JS_URL, SCRIPT, SEPARATOR, Hostile

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


def test_a_chain_page_renders_offline_and_a_decision_expands_on_click(
    watched: Watched, demo_dataset: Path, tmp_path: Path
) -> None:
    with otel_replay.open(demo_dataset) as store:
        (row,) = store.rows("SELECT record_id, correlation_id FROM decisions")
        view = model.chain_view(ReplayBuilder(store).build("trade", row["correlation_id"]), store)
    page_file = tmp_path / "chain.html"
    page_file.write_text(html.chain_page(view), encoding="utf-8")
    watched.open(page_file.as_uri())
    page = watched.page
    assert page.locator(".lane").count() == 4
    decision = page.locator(f'details[data-record="{row["record_id"]}"]')
    assert decision.get_attribute("open") is None and not page.get_by_text("budget-v7").first.is_visible()
    decision.locator("summary").click()
    assert decision.get_attribute("open") is not None and page.get_by_text("budget-v7").first.is_visible()
    page.get_by_role("button", name="Expand all").click()
    assert page.locator("details.event[open]").count() == 4
    watched.shot("chain")
    page.get_by_role("button", name="Collapse all").click()
    assert page.locator("details.event[open]").count() == 0
    # A click at the right end of the gate's lane goes to its last event (the reversal) and opens it.
    lane = page.locator("svg[data-lane='3']")
    box = lane.bounding_box()
    assert box is not None
    lane.click(position={"x": box["width"] - 2, "y": box["height"] / 2})
    page.wait_for_url("**#ev-3")
    assert page.locator("#ev-3[open]").count() == 1 and page.locator("#ev-3 .body").is_visible()
    watched.clean()
    assert watched.requests == [page_file.as_uri()]  # the page itself, nothing else


def test_hostile_span_text_is_shown_and_never_runs(watched: Watched, hostile: Hostile, tmp_path: Path) -> None:
    with otel_replay.open(hostile.path) as store:
        chain = model.chain_view(ReplayBuilder(store).build("trade", hostile.correlation_id), store)
        decision = model.decision_view(store, hostile.record_id)
    for name, source in (("hostile-chain", html.chain_page(chain)), ("hostile-decision", html.decision_page(decision))):
        page_file = tmp_path / f"{name}.html"
        page_file.write_text(source, encoding="utf-8")
        watched.requests.clear()
        watched.open(page_file.as_uri())
        watched.page.get_by_role("button", name="Expand all").count()  # present on chain pages only
        assert watched.page.get_by_text(SCRIPT).count() >= 1  # shown as text
        if name == "hostile-chain":  # what each event holds is laid out from the data block: as text too
            watched.page.get_by_role("button", name="Expand all").click()
            assert watched.page.get_by_text(BREAKOUT).count() >= 2 and watched.page.get_by_text(JS_URL).count() >= 2
            assert watched.page.get_by_text(SEPARATOR.replace("\u2028", "\\u2028")).count() >= 1
            assert watched.page.get_by_role("link").count() == 0  # a page written to a file links nowhere
        assert watched.page.locator("img").count() == 0
        assert watched.page.locator("script:not([type='application/json'])").count() == 1
        watched.shot(name)
        watched.clean()
        assert watched.requests == [page_file.as_uri()]


@pytest.fixture
def rerun_dataset(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A recorded session ``sess-ui`` (with its decision) and a rerun of it that diverged, stored."""
    with agent.scripted_server() as api, agent.scripted_server() as llm:
        monkeypatch.setenv("RERUN_EXAMPLE_API", api)
        monkeypatch.setenv("RERUN_EXAMPLE_MODEL", llm)
        record(dataset, "sess-ui", agent.agent_from_env)
    monkeypatch.setenv("RERUN_EXAMPLE_SUFFIX", " Think twice.")
    telemetry = otel_replay.configure(dataset, service_name="report-tests", set_global=False)
    try:
        result = rerun(agent.agent_from_env, dataset=dataset, session_id="sess-ui")
        assert not result.matched
        assert telemetry.force_flush()
    finally:
        telemetry.shutdown()
    return dataset


def test_the_ui_path_index_session_decision_rerun_works_by_clicking(watched: Watched, rerun_dataset: Path) -> None:
    with otel_replay.open(rerun_dataset) as store:
        server = make_server(store, port=0)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            page = watched.page
            watched.open(server.url)
            assert page.get_by_role("heading", name="Recent decisions").is_visible()
            watched.shot("ui-index")
            page.locator("table.decisions a[href='/chain/session/sess-ui']").first.click()
            page.wait_for_url("**/chain/session/sess-ui")
            page.locator("details.event.decision summary").first.click()
            page.get_by_text("open the decision’s causal tree").first.click()
            page.wait_for_url("**/decision/*")
            assert page.get_by_role("heading", name="Causal tree").is_visible()
            watched.shot("ui-decision")
            page.get_by_role("link", name="its session's reruns").click()
            page.wait_for_url("**/rerun/sess-ui")
            assert page.locator("tr.diverged").count() == 1 and page.get_by_text("Think twice.").first.is_visible()
            watched.shot("ui-rerun")
            page.get_by_role("searchbox").fill("sess-ui")
            page.get_by_role("button", name="Find").click()
            page.wait_for_url("**/rerun/sess-ui")
            watched.clean()
            origin = server.url.rstrip("/")
            assert watched.requests and all(url.startswith(origin + "/") for url in watched.requests)
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=30)


def test_the_watch_sees_a_script_the_policy_refuses(watched: Watched, tmp_path: Path) -> None:
    """The checks above can fail: a script not in the policy is refused, and the refusal is seen."""
    source = html.message_page("probe", "x", html.Links()).replace("</main>", "<script>alert(9)</script></main>")
    page_file = tmp_path / "probe.html"
    page_file.write_text(source, encoding="utf-8")
    watched.open(page_file.as_uri())
    assert watched.page.evaluate("window.__violations") == ["script-src-elem"]
    assert watched.dialogs == [] and watched.page.evaluate("window.__alerted === undefined")
    assert any("Content Security Policy" in e for e in watched.errors)
