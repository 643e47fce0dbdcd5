"""Hostile span text is shown, never run: every page escapes it, makes invisible controls visible, cuts 1 MB values."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from urllib.parse import urlsplit

import otel_replay
from otel_replay.query.chains import ReplayBuilder
from otel_replay.report import html, model

from .conftest import BIDI, SCRIPT, SEPARATOR, Hostile, Page


def _pages(h: Hostile) -> list[str]:
    with otel_replay.open(h.path) as store:
        chain = ReplayBuilder(store).build("trade", h.correlation_id)
        session = ReplayBuilder(store).build("session", h.session_id)
        links = html.UiLinks()
        return [
            html.chain_page(model.chain_view(chain, store)),
            html.chain_page(model.chain_view(session, store), links),
            html.decision_page(model.decision_view(store, h.record_id), links),
            html.index_page(model.index_view(store), links),
        ]


def _sha(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def test_hostile_span_values_are_text_on_every_page(hostile: Hostile) -> None:
    for n, source in enumerate(_pages(hostile)):
        page = Page(source)
        # One script (ours) and one stylesheet: nothing from the data became an element.
        assert page.scripts == [html.SCRIPT] and page.styles == [html.CSS]
        # The chain's data block is JSON that nothing in it can end: no "<" at all, whatever the values.
        assert all("<" not in block and json.loads(block) for block in page.data.values())
        assert page.all("img") == [] and "<script>alert" not in source and "<img src=x" not in source
        assert not any(key.startswith("on") for _, attrs in page.tags for key in attrs)
        if n < 3:  # the index lists ids, not decision types
            assert SCRIPT in " ".join(page.text)
        # No attribute holds a URL from the data: links are our own paths, percent-encoded.
        for _, attrs in page.tags:
            for key in ("href", "src", "action"):
                value = attrs.get(key)
                if value is not None:
                    assert value.startswith(("/", "#", "data:")), value


def test_invisible_and_bidirectional_characters_are_shown_as_escapes(hostile: Hostile) -> None:
    chain_page = _pages(hostile)[0]
    assert "\u2028" not in chain_page and "\u202e" not in chain_page
    assert SEPARATOR.replace("\u2028", "\\u2028") in chain_page
    assert BIDI.replace("\u202e", "\\u202e") in chain_page
    # In the data block too: a value the script shows holds the escape as text, not the character.
    held = json.dumps(json.loads(Page(chain_page).data["chain-data"]), ensure_ascii=False)
    assert "\u2028" not in held and "\u202e" not in held and "\\\\u202e" in held


def test_a_data_block_shows_every_invisible_character_as_its_escape_and_cannot_be_closed() -> None:
    hostile = ["a\x01b", "x\by\fz\r", "del\x7f", "\u2066\u061c", "</script><!--", "lit\\u0001", "tab\tnew\n", "&amp;"]
    block = html.data_block("d", hostile)
    page = Page(f"<body>{block}</body>")
    assert page.scripts == [] and "<" not in page.data["d"]
    # what the page's script reads is what esc() shows for the same values (tab and newline are kept)
    shown = json.loads(page.data["d"])
    assert shown == [html.esc(v).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&") for v in hostile]
    assert shown[0] == "a\\u0001b" and shown[5] == "lit\\u0001" and shown[6] == "tab\tnew\n"


def test_a_one_megabyte_value_is_cut_and_the_cut_is_counted(hostile: Hostile) -> None:
    pages = _pages(hostile)
    assert all(len(source) < 200_000 for source in pages)
    assert f"… ({1_000_000 - model.MAX_TEXT:,} more characters not shown)" in pages[2]


def test_the_ui_links_carry_hostile_ids_percent_encoded(hostile: Hostile) -> None:
    index = Page(_pages(hostile)[3])
    hrefs = [str(a["href"]) for a in index.all("a")]
    assert "/chain/session/sess-hostile" in hrefs
    for href in hrefs:
        parts = urlsplit(href)
        assert parts.scheme == "" and parts.netloc == "" and re.fullmatch(r"[A-Za-z0-9/%._~-]*", parts.path), href


def test_every_page_has_a_strict_csp_whose_hashes_are_the_inlined_assets(hostile: Hostile) -> None:
    for source in _pages(hostile):
        page = Page(source)
        (meta,) = [m for m in page.all("meta") if m.get("http-equiv") == "Content-Security-Policy"]
        content = str(meta["content"])
        policy = dict(part.split(" ", 1) for part in content.split("; "))
        assert policy["default-src"] == "'none'" and policy["img-src"] == "data:"
        assert policy["style-src"] == f"'{_sha(page.styles[0])}'"
        assert policy["script-src"] == f"'{_sha(page.scripts[0])}'"
        assert "unsafe" not in content


def test_no_page_names_an_external_url(hostile: Hostile) -> None:
    for source in _pages(hostile):
        page = Page(source)
        for _, attrs in page.tags:
            for value in attrs.values():
                assert not re.search(r"(?i)\b(https?|ftp|wss?):|^//", str(value or "")), value
        for asset in (*page.styles, *page.scripts):
            assert "url(" not in asset and "@import" not in asset and not re.search(r"https?:", asset)
