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

import threading
from pathlib import Path

import pytest

import otel_replay
from otel_replay.query.chains import ReplayBuilder
from otel_replay.report import html, model
from otel_replay.report.server import make_server
from otel_replay.rerun import rerun

from ..rerun.conftest import agent, record
from .conftest import BREAKOUT, JS_URL, SCRIPT, SEPARATOR, Hostile, Watched


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
    decision = page.locator(f'.event[data-record="{row["record_id"]}"]')
    assert decision.get_attribute("aria-expanded") is None and page.get_by_text("budget-v7").count() == 0
    decision.locator("time").click()
    assert decision.get_attribute("aria-expanded") == "true" and page.get_by_text("budget-v7").first.is_visible()
    page.get_by_text("budget-v7").first.click()  # a click inside what it holds leaves it open
    assert decision.get_attribute("aria-expanded") == "true"
    decision.locator("time").click()
    assert not page.get_by_text("budget-v7").first.is_visible()
    page.get_by_role("button", name="Expand all").click()
    assert page.locator(".event.open").count() == 4
    watched.shot("chain")
    page.get_by_role("button", name="Collapse all").click()
    assert page.locator(".event.open").count() == 0
    # The keyboard: an event's line takes the focus, Enter opens it.
    decision.focus()
    page.keyboard.press("Enter")
    assert decision.get_attribute("aria-expanded") == "true" and page.get_by_text("budget-v7").first.is_visible()
    page.keyboard.press(" ")
    assert decision.get_attribute("aria-expanded") == "false"
    # A click at the right end of the gate's lane goes to its last event (the reversal) and opens it.
    lane = page.locator("svg[data-lane='3']")
    box = lane.bounding_box()
    assert box is not None
    lane.click(position={"x": box["width"] - 2, "y": box["height"] / 2})
    page.wait_for_url("**#ev-3")
    assert page.locator("#ev-3.open").count() == 1 and page.locator("#ev-3 .body").is_visible()
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
            page.locator(".event.decision time").first.click()
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
