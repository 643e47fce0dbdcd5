"""The contracts page: per session the calls the contracts would have blocked and why, from the CLI and the UI.

Sessions are recorded with the real ``openai`` client against a scripted server
(tests/contracts/recorded.py) and checked against the refund bot's contracts,
the same backtest ``otel-replay contracts check`` runs.
"""

from __future__ import annotations

import http.client
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

import otel_replay
from otel_replay.cli import main
from otel_replay.contracts.backtest import backtest
from otel_replay.contracts.loader import load_contracts
from otel_replay.contracts.recorded import recorded_sessions
from otel_replay.report import contracts as contracts_model
from otel_replay.report import html
from otel_replay.report.server import make_server

from .._support import TEST_KEY
from ..contracts.recorded import recorded_dataset, refund_session
from .conftest import BIDI, JS_URL, SCRIPT, Page, Watched

CONTRACTS = Path(__file__).resolve().parents[1] / "contracts" / "refund_bot"
LONG = "y" * 1_000_000
SESSIONS = {
    "good": refund_session(),
    "double": [*refund_session(), refund_session()[2]],
    # a tool no contract names, called with a hostile name and hostile arguments; a long and a 1 MB argument
    "hostile": [
        [(SCRIPT + BIDI, {"note": BIDI, "url": JS_URL})],
        [("lookup_customer", {"customer_email": "y" * 20_000})],
        [("lookup_customer", {"customer_email": LONG})],
    ],
}


@pytest.fixture(scope="module")
def backtested(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return recorded_dataset(tmp_path_factory, "report-contracts", SESSIONS)


def _view(dataset: Path, session_id: str | None = None) -> contracts_model.ContractsView:
    with otel_replay.open(dataset) as store:
        sessions = recorded_sessions(store, session_id)
    return contracts_model.contracts_view(backtest(load_contracts(CONTRACTS), sessions), sessions)


def test_each_blocked_session_lists_its_calls_with_the_rule_and_the_first_one_marked(backtested: Path) -> None:
    view = _view(backtested)
    assert not view.passed and view.summary.startswith("3 session(s) checked, 2 would have been blocked")
    by_id = {s.session_id: s for s in view.sessions}
    assert [s.passed for s in view.sessions] == [False, False, True]  # blocked sessions first
    double = by_id["double"]
    first = double.rows[0]
    assert first.first and (first.step, first.tool, first.rule) == (4, "issue_refund", "forbidden")
    assert first.source.startswith(str(CONTRACTS)) and ".yaml:" in first.source
    assert '"amount": 40.0' in first.arguments  # the arguments as recorded
    assert [r.first for r in double.rows].count(True) == 1
    # the call broke three rules: three rows, its arguments shown on the first only
    assert [(r.step, r.tool) for r in double.rows] == [(4, "issue_refund")] * 3
    assert [r.arguments == "(as above)" for r in double.rows] == [False, True, True]
    assert by_id["good"].rows == () and by_id["good"].passed
    counted = {(c.rule, c.count) for c in view.counts}
    assert ("forbidden", 1) in counted and sum(c.count for c in view.counts) == sum(len(s.rows) for s in view.sessions)


def test_the_page_shows_the_same_as_contracts_check(backtested: Path) -> None:
    view = _view(backtested)
    page = Page(html.contracts_page(view))
    text = " ".join(page.text)
    checked = CliRunner().invoke(main, ["contracts", "check", "--contracts", str(CONTRACTS), "-d", str(backtested)])
    assert "3 sessions checked, 2 would have been blocked" in checked.stdout
    assert "3 session(s) checked, 2 would have been blocked" in text
    assert len([t for t in page.all("tr") if t.get("class") == "first"]) == 2  # one per blocked session
    assert "forbidden" in text and "good" in text
    assert page.scripts == [html.SCRIPT] and page.all("a") == []  # a page written to a file links nowhere


def test_a_hostile_tool_name_and_arguments_are_shown_inert_and_cut(backtested: Path) -> None:
    source = html.contracts_page(_view(backtested, "hostile"))
    page = Page(source)
    text = " ".join(page.text)
    assert SCRIPT in text and "<script>alert" not in source and page.all("img") == []
    assert "\u202e" not in source and SCRIPT + BIDI.replace("\u202e", "\\u202e") in text  # the tool's name
    assert "more characters not shown" in text  # a 20,000-character argument, cut
    assert "step 3: some rules were not checked" in text  # the 1 MB one: capture cut it, the page says so
    assert len(source) < 100_000


def test_report_contracts_writes_the_page_and_exits_zero_even_when_calls_are_blocked(
    backtested: Path, tmp_path: Path
) -> None:
    out = tmp_path / "contracts.html"
    args = ["report", "contracts", "--contracts", str(CONTRACTS), "-d", str(backtested), "-o", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"wrote {out}") and "issue_refund" in out.read_text()
    one = CliRunner().invoke(main, [*args[:-2], "-o", str(tmp_path / "good.html"), "--session", "good"])
    assert (
        one.exit_code == 0 and "1 session(s) checked, 0 would have been blocked" in (tmp_path / "good.html").read_text()
    )


def _error_line(args: list[str]) -> str:
    result = CliRunner().invoke(main, args)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and "Traceback" not in result.stderr, result.output
    return lines[0]


def test_a_contract_with_a_syntax_error_is_one_line_naming_its_file_and_line(backtested: Path, tmp_path: Path) -> None:
    contracts = tmp_path / "c"
    shutil.copytree(CONTRACTS, contracts)
    refund = contracts / "issue_refund.yaml"
    lines = refund.read_text().splitlines()
    lines[4] = "  broken: [unclosed"
    refund.write_text("\n".join(lines) + "\n")
    out = tmp_path / "page.html"
    line = _error_line(["report", "contracts", "--contracts", str(contracts), "-d", str(backtested), "-o", str(out)])
    assert "issue_refund.yaml:" in line and not out.exists()


def test_an_empty_dataset_and_an_unknown_session_are_one_line(backtested: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    out = str(tmp_path / "page.html")
    line = _error_line(["report", "contracts", "--contracts", str(CONTRACTS), "-d", str(tmp_path / "empty"), "-o", out])
    assert "empty" in line
    args = ["report", "contracts", "--contracts", str(CONTRACTS), "-d", str(backtested), "-o", out]
    assert "no recorded session 'nobody'" in _error_line([*args, "--session", "nobody"])
    assert not Path(out).exists()


def test_the_real_command_has_no_traceback_for_a_missing_contracts_directory(backtested: Path, tmp_path: Path) -> None:
    env = {"OTEL_REPLAY_SIGNING_KEY": TEST_KEY, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "otel_replay", "report", "contracts", "--contracts", str(tmp_path / "none"),
         "-d", str(backtested), "-o", str(tmp_path / "p.html")],
        capture_output=True, text=True, env={**env, "PYTHONPATH": ":".join(sys.path)}, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr and "does not exist" in done.stderr


def _get(server, path: str) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(str(host), int(port), timeout=60)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8")
    finally:
        conn.close()


def test_the_ui_links_its_index_to_the_backtest_only_when_given_contracts(backtested: Path) -> None:
    with otel_replay.open(backtested) as store:
        for contracts in (load_contracts(CONTRACTS), None):
            server = make_server(store, port=0, contracts=contracts)
            thread = threading.Thread(target=server.serve_forever, daemon=True)
            thread.start()
            try:
                status, index = _get(server, "/")
                hrefs = [a["href"] for a in Page(index).all("a")]
                status_all, whole = _get(server, "/contracts")
                status_one, one = _get(server, "/contracts/double")
                status_none, _ = _get(server, "/contracts/nobody")
            finally:
                server.shutdown()
                server.server_close()
                thread.join(timeout=30)
            if contracts is None:
                assert "/contracts" not in hrefs and status_all == 404
                continue
            assert status == 200 and "/contracts" in hrefs
            assert status_all == 200 and "3 session(s) checked" in whole
            assert status_one == 200 and "1 session(s) checked, 1 would have been blocked" in one
            assert "/chain/session/double" in [a["href"] for a in Page(one).all("a")]
            assert status_none == 404


def test_the_ui_refuses_bad_contracts_at_start_in_one_line(backtested: Path, tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "session.yaml").write_text("schema_version: [\n")
    line = _error_line(["ui", "-d", str(backtested), "--contracts", str(tmp_path / "c"), "--port", "0"])
    assert "session.yaml" in line


def test_past_its_limits_the_page_says_what_it_left_out(backtested: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = {s.session_id: len(s.rows) for s in _view(backtested).sessions}
    monkeypatch.setattr(contracts_model, "MAX_SESSIONS", 1)
    monkeypatch.setattr(contracts_model, "MAX_ROWS", 0)
    view = _view(backtested)
    assert len(view.sessions) == 1 and not view.sessions[0].passed and view.sessions[0].rows == ()
    text = " ".join(Page(html.contracts_page(view)).text)
    assert "1 of 3 sessions shown, those with blocked calls first" in text
    assert f"0 of {rows[view.sessions[0].session_id]} blocked rows shown" in text
    # the counts still count everything
    assert sum(c.count for c in view.counts) >= 2


def test_counts_and_rows_are_plain_json_ready_text(backtested: Path) -> None:
    view = _view(backtested)
    for session in view.sessions:
        for row in session.rows:
            json.dumps([row.step, row.call, row.tool, row.arguments, row.rule, row.detail, row.source])
            assert isinstance(row.call, str) and len(row.arguments) <= 2100


def test_the_contracts_page_in_chromium_marks_the_first_blocked_call(
    watched: Watched, backtested: Path, tmp_path: Path
) -> None:
    page_file = tmp_path / "contracts.html"
    page_file.write_text(html.contracts_page(_view(backtested)), encoding="utf-8")
    watched.open(page_file.as_uri())
    firsts = watched.page.locator("tr.first")
    shown = sorted(firsts.nth(n).inner_text() for n in range(firsts.count()))
    assert len(shown) == 2 and "issue_refund" in shown[1] and shown[0].startswith(f"1\t0\t{SCRIPT}")
    first = firsts.first
    assert first.is_visible() and watched.page.get_by_text(SCRIPT).count() >= 1
    # the marked row is painted apart from the others
    colour = "el => getComputedStyle(el.querySelector('td')).backgroundColor"
    plain = watched.page.locator("table.blocked tr:not(.first)").nth(1)
    assert first.evaluate(colour) != plain.evaluate(colour)
    watched.shot("contracts")
    watched.clean()
    assert watched.requests == [page_file.as_uri()]
