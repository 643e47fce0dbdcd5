"""The report pages show what the dataset holds: a chain's lanes and decisions, a decision's tree and verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import otel_replay
from otel_replay.demo import budget_policy
from otel_replay.gate.execute import replay_stored
from otel_replay.query.chains import ReplayBuilder
from otel_replay.report import html, model

from .conftest import Page


def _demo_ids(path: Path) -> tuple[str, str]:
    with otel_replay.open(path) as store:
        (row,) = store.rows("SELECT record_id, correlation_id FROM decisions")
    return row["record_id"], row["correlation_id"]


def test_chain_page_shows_a_lane_per_agent_and_every_event_in_time_order(demo_dataset: Path) -> None:
    record_id, cid = _demo_ids(demo_dataset)
    with otel_replay.open(demo_dataset) as store:
        view = model.chain_view(ReplayBuilder(store).build("trade", cid), store)
    assert view.lanes == ("inbox-agent", "payables-agent", "finance-agent", "gate")
    assert [e.title for e in view.events] == [
        "invoice_received",
        "vendor_payment",
        "budget_revised",
        "payment_reversed",
    ]
    assert [e.layer for e in view.events] == ["audit", "decision", "audit", "audit"]
    offsets = [e.offset for e in view.events]
    assert offsets == sorted(offsets) and offsets[0] == 0.0 and offsets[-1] == 100.0
    page = Page(html.chain_page(view))
    assert cid in " ".join(page.text)
    (decision,) = [d for d in page.all("div") if d.get("data-record") == record_id]
    assert decision["class"] == "event decision" and decision["tabindex"] == "0"
    # What each event holds is the page's data block, laid out by its script when the event opens.
    details = json.loads(page.data["chain-data"])["details"]
    assert details[decision["id"].removeprefix("ev-")][0] == f"decision {record_id}"
    text = " ".join([*page.text, json.dumps(details, ensure_ascii=False)])
    # What the decision read, its model call, its action, and the gate's receipt of its commit.
    for shown in ("budget-v7", "budget_remaining", "10000", "gpt-x", "Invoice matches an approved PO", "rcpt-0001"):
        assert shown in text, shown
    assert "gate: committed" in text and "gate: rolled_back" in text
    assert "truncated" not in text


def test_a_truncated_chain_says_which_layer_was_cut(demo_dataset: Path) -> None:
    _, cid = _demo_ids(demo_dataset)
    with otel_replay.open(demo_dataset) as store:
        view = model.chain_view(ReplayBuilder(store).build("trade", cid, limit=1), store)
    assert len(view.events) == 2
    text = " ".join(Page(html.chain_page(view)).text)
    assert "truncated: the audit layer had more than 1 rows; the newest are left out" in text


def test_decision_page_draws_the_causal_tree_and_the_verdict_with_the_changed_key(demo_dataset: Path) -> None:
    record_id, _ = _demo_ids(demo_dataset)
    live = json.loads((demo_dataset / "demo-live-state.json").read_text())
    with otel_replay.open(demo_dataset) as store:
        verdict = replay_stored(store, record_id, live_state=live, policy=budget_policy)
        view = model.decision_view(store, record_id, verdict=verdict, live_state=live)
        tree = store.causal_tree(record_id)
    assert [r.name for r in view.rows] == [r["name"] for r in tree]
    # the root starts the axis and spans it, but for a child that ends a few µs after it (a record sealed on exit)
    root = view.rows[0]
    assert root.depth == 0 and root.offset == 0.0 and root.width == pytest.approx(100.0, abs=0.1)
    assert all(0.0 <= r.offset <= 100.0 and 0.0 <= r.width <= 100.0 for r in view.rows)
    assert view.verdict is not None and view.verdict.fix == "ROLLBACK"
    changed = {key: (was, now) for key, was, now, flag in view.verdict.keys if flag}
    assert changed == {"budget_remaining": ("10000", "3000")}
    page = Page(html.decision_page(view))
    bars = page.all("rect")
    assert len(bars) == len(tree) and {b["class"] for b in bars} >= {
        "bar bar-decision",
        "bar bar-model",
        "bar bar-gate",
    }
    assert [c["class"] for c in page.all("td") if c.get("class") == "changed"] == ["changed", "changed"]
    assert "ROLLBACK" in " ".join(page.text)


def test_a_page_written_to_a_file_links_nowhere_and_the_ui_links_each_page_to_the_next(demo_dataset: Path) -> None:
    record_id, cid = _demo_ids(demo_dataset)
    with otel_replay.open(demo_dataset) as store:
        view = model.chain_view(ReplayBuilder(store).build("trade", cid), store)
        decision = model.decision_view(store, record_id)
    alone = Page(html.chain_page(view))
    assert [a["href"] for a in alone.all("a") if not str(a["href"]).startswith("#ev-")] == []
    assert all(held[1] == "" for held in json.loads(alone.data["chain-data"])["details"].values())
    served = Page(html.chain_page(view, html.UiLinks()))
    # an event's link to its decision is laid out with the rest of what it holds, when it opens
    links = [held[1] for held in json.loads(served.data["chain-data"])["details"].values() if held[1]]
    assert links == [f"/decision/{record_id}"]
    back = Page(html.decision_page(decision, html.UiLinks()))
    assert f"/chain/trade/{cid}" in [a["href"] for a in back.all("a")]


def test_repr_html_of_chain_verdict_and_rerun_result_embeds_the_page_in_a_sandboxed_frame(demo_dataset: Path) -> None:
    record_id, cid = _demo_ids(demo_dataset)
    live = json.loads((demo_dataset / "demo-live-state.json").read_text())
    with otel_replay.open(demo_dataset) as store:
        chain = ReplayBuilder(store).build("trade", cid)
        verdict = replay_stored(store, record_id, live_state=live, policy=budget_policy)
    for shown, expected in ((chain._repr_html_(), "invoice_received"), (verdict._repr_html_(), "ROLLBACK")):
        (frame,) = Page(shown).all("iframe")
        assert frame["sandbox"] == "allow-scripts"
        inner = Page(str(frame["srcdoc"]))
        assert expected in " ".join(inner.text)
        assert any("Content-Security-Policy" == m.get("http-equiv") for m in inner.all("meta"))


def test_past_the_detail_limit_events_show_one_line_and_the_page_says_so(
    demo_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, cid = _demo_ids(demo_dataset)
    monkeypatch.setattr(model, "DETAIL_LIMIT", 2)
    with otel_replay.open(demo_dataset) as store:
        view = model.chain_view(ReplayBuilder(store).build("trade", cid), store)
    assert [bool(e.sections) for e in view.events] == [True, True, False, False]
    page = Page(html.chain_page(view))
    assert len([d for d in page.all("div") if "tabindex" in d]) == 2
    assert [d["id"] for d in page.all("div") if "plain" in str(d.get("class"))] == [
        "ev-2",
        "ev-3",
    ]
    assert "the first 2 of 4 events open to what they hold" in " ".join(page.text)


def test_a_chains_last_event_sits_exactly_at_the_axis_end_even_when_division_rounds_past_it() -> None:
    import datetime as dt

    first = dt.datetime(2026, 11, 29, tzinfo=dt.UTC)
    # 100.0 * 2.950578 / 2.950578 is 100.00000000000001 in binary floating point.
    last = first + dt.timedelta(seconds=2.950578)
    offsets = model._offsets([first, first + dt.timedelta(seconds=1), last, None])
    assert offsets[0] == 0.0 and offsets[2] == 100.0 and offsets[3] == 0.0
    # 100.0 * 0.000029 / 0.000029 is 99.99999999999999: the last event still sits at the axis end.
    assert model._offsets([first, first + dt.timedelta(microseconds=29)]) == [0.0, 100.0]
    assert all(0.0 <= o <= 100.0 for o in offsets)
