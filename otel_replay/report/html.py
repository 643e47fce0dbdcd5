r"""HTML for the report pages: string building over the view models, with no logic of its own.

Every piece of text from a model goes through :func:`esc` (control,
bidirectional and zero-width characters, tag characters and lone surrogates
shown as ``\\uXXXX`` escapes, then
``html.escape(quote=True)``), every attribute value is quoted, and there is no
inline event handler or style attribute: the one stylesheet and the one
script (``assets/``) are inlined, and each page carries a Content-Security-Policy
allowing exactly those two by their SHA-256 hashes, pictures only as ``data:``
and nothing else: no request leaves a page. Bars and lanes are inline SVG
whose geometry is in attributes. Links between pages are made only by a
:class:`Links` (the UI's); a page written to a file links nowhere.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from collections.abc import Iterable
from importlib import resources
from urllib.parse import quote

from otel_replay._invisible import INVISIBLE, escape_code
from otel_replay._version import __version__
from otel_replay.report.contracts import ContractsView, RuleCount, SessionView
from otel_replay.report.model import (
    ChainView,
    DecisionView,
    Field,
    IndexView,
    RerunView,
    Section,
    VerdictView,
)

__all__ = [
    "CSS",
    "SCRIPT",
    "Links",
    "NoLinks",
    "UiLinks",
    "chain_page",
    "contracts_page",
    "csp",
    "data_block",
    "decision_page",
    "embed",
    "esc",
    "index_page",
    "message_page",
    "rerun_page",
    "verdict_page",
]

_ASSETS = resources.files("otel_replay.report").joinpath("assets")
CSS = _ASSETS.joinpath("report.css").read_text(encoding="utf-8")
"""The stylesheet inlined in every page."""
SCRIPT = _ASSETS.joinpath("report.js").read_text(encoding="utf-8")
"""The script inlined in every page."""

# The C0 controls but tab and newline, and the characters that draw nothing or mislead (otel_replay._invisible).
_SHOWN_BY_JSON = "\x00-\x08\x0b-\x1f"  # the C0 controls json.dumps escapes itself
_HIDDEN = re.compile(f"[{_SHOWN_BY_JSON}{INVISIBLE}]")


_KINDS = frozenset({"decision", "read", "model", "act", "gate", "audit_entry"})
_STEP_CLASS = {"diverged": "diverged", "not reached": "notreached"}
_PILLS = frozenset(
    {"ALLOW", "ROLLBACK", "BLOCK", "HUMAN_REVIEW", "matched", "diverged", "correct", "incorrect", "passed", "blocked"}
)


def esc(value: object) -> str:
    """``value`` as HTML text or a quoted attribute's value: invisible controls made visible, then escaped."""
    shown = _HIDDEN.sub(lambda m: escape_code(ord(m.group())), str(value))
    return html.escape(shown, quote=True)


def _text(value: str) -> str:
    """``value`` as an element's text (not an attribute's): as :func:`esc`, quotes left as they are."""
    return html.escape(_HIDDEN.sub(lambda m: escape_code(ord(m.group())), value), quote=False)


def _hash(source: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(source.encode("utf-8")).digest()).decode("ascii")


def csp(*, form: bool = False) -> str:
    """The page's Content-Security-Policy: only the inlined stylesheet and script, pictures as ``data:``."""
    forms = "form-action 'self'" if form else "form-action 'none'"
    return (
        f"default-src 'none'; style-src '{_hash(CSS)}'; script-src '{_hash(SCRIPT)}'; img-src data:; "
        f"base-uri 'none'; {forms}"
    )


class Links:
    """Where a page links to; this base links nowhere (a page written to a file stands alone)."""

    search = False
    """Whether the page has the search box (the UI's)."""

    def index(self) -> str | None:
        """The index page."""
        return None

    def chain(self, chain_type: str, chain_id: str) -> str | None:
        """A chain's page."""
        return None

    def decision(self, record_id: str) -> str | None:
        """A decision's page."""
        return None

    def rerun(self, session_id: str) -> str | None:
        """A session's rerun page."""
        return None

    def contracts(self, session_id: str = "") -> str | None:
        """The contracts backtest page (of one session)."""
        return None


NoLinks = Links
"""Links of a page written to a file: none."""


class UiLinks(Links):
    """Links of the UI's pages: paths on the same server, each id percent-encoded whole."""

    search = True

    def index(self) -> str | None:
        """``/``."""
        return "/"

    def chain(self, chain_type: str, chain_id: str) -> str | None:
        """``/chain/TYPE/ID``."""
        return f"/chain/{quote(chain_type, safe='')}/{quote(chain_id, safe='')}" if chain_id else None

    def decision(self, record_id: str) -> str | None:
        """``/decision/ID``."""
        return f"/decision/{quote(record_id, safe='')}" if record_id else None

    def rerun(self, session_id: str) -> str | None:
        """``/rerun/SESSION_ID``."""
        return f"/rerun/{quote(session_id, safe='')}" if session_id else None

    def contracts(self, session_id: str = "") -> str | None:
        """``/contracts`` or ``/contracts/SESSION_ID``."""
        return f"/contracts/{quote(session_id, safe='')}" if session_id else "/contracts"


def _link(href: str | None, label: str, cls: str = "") -> str:
    klass = f' class="{esc(cls)}"' if cls else ""
    if href is None:
        return f"<span{klass}>{esc(label)}</span>"
    return f'<a href="{esc(href)}"{klass}>{esc(label)}</a>'


def _pill(word: str) -> str:
    if not word:
        return ""
    cls = f"pill {word}" if word in _PILLS else "pill"
    return f'<span class="{esc(cls)}">{esc(word)}</span>'


def page(title: str, body: str, links: Links) -> str:
    """A whole page: the CSP, the inlined stylesheet and script, the header (with the search box in the UI)."""
    home = links.index()
    brand = f'<a href="{esc(home)}">otel-replay</a>' if home else "otel-replay"
    search = (
        '<form method="get" action="/search" role="search"><input name="id" type="search" '
        'placeholder="a decision, session, correlation or rerun id" aria-label="id" maxlength="256" required>'
        '<button type="submit">Find</button></form>'
        if links.search
        else ""
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{esc(csp(form=links.search))}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="referrer" content="no-referrer"><link rel="icon" href="data:,">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
        f'<header class="top"><span class="brand">{brand}</span><span>{esc(title)}</span>{search}</header>'
        f"<main>{body}"
        f"<footer>written by otel-replay {esc(__version__)}; values are shown as the dataset stores them "
        "(redacted values stay redacted)</footer></main>"
        f"<script>{SCRIPT}</script></body></html>\n"
    )


def embed(document: str, height: int = 640) -> str:
    """``document`` (a whole page) in a sandboxed frame, for a notebook's ``_repr_html_``: its CSP still holds."""
    return (
        f'<iframe sandbox="allow-scripts" referrerpolicy="no-referrer" width="100%" height="{int(height)}" '
        f'srcdoc="{esc(document)}"></iframe>'
    )


def _notes(notes: Iterable[str]) -> str:
    items = "".join(f"<li>{esc(n)}</li>" for n in notes)
    return f'<ul class="notes">{items}</ul>' if items else ""


def _changed(changed: bool) -> str:
    return ' class="changed"' if changed else ""


def _facts(fields: Iterable[Field]) -> str:
    rows = "".join(f"<dt>{esc(f.label)}</dt><dd{_changed(f.changed)}>{esc(f.value)}</dd>" for f in fields)
    return f'<dl class="facts">{rows}</dl>' if rows else ""


def _sections(sections: Iterable[Section]) -> str:
    return "".join(
        f'<div class="section"><h3>{esc(s.title)}</h3>{_facts(s.fields)}{_notes([s.note] if s.note else [])}</div>'
        for s in sections
    )


def _x(percent: float) -> str:
    return f"{max(0.0, min(100.0, percent)) * 10:.1f}"


# In JSON text (``ensure_ascii=False``): an escaped backslash (kept), a C0 control as JSON escapes it, or one of
# the other invisible characters of _HIDDEN as it stands.
_JSON_HIDDEN = re.compile(r"\\\\|\\u00[01][0-9a-f]|\\[bfr]|" f"[{INVISIBLE}]")
_SHORT = {"b": 8, "f": 12, "r": 13}


def _json_visible(match: re.Match[str]) -> str:
    found = match.group()
    if found == "\\\\":
        return found
    if found[0] == "\\":
        code = int(found[2:], 16) if found[1] == "u" else _SHORT[found[1]]
    else:
        code = ord(found)
    return "\\" + escape_code(code)  # JSON for a backslash and the escape: the escape shown, as esc() shows it


def data_block(element_id: str, value: object) -> str:
    """``value`` as a JSON data block the page's script reads (never run: ``type="application/json"``).

    Strings have their invisible characters made visible first, as :func:`esc`
    does; ``<``, ``>`` and ``&`` are written as JSON escapes, so no text can
    close the element or open another.
    """
    shown = _JSON_HIDDEN.sub(_json_visible, json.dumps(value, ensure_ascii=False, separators=(",", ":")))
    shown = shown.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return f'<script type="application/json" id="{esc(element_id)}">{shown}</script>'


def _detail(section: Section) -> tuple[object, ...]:
    # tuples, not lists: the collector stops tracking a tuple of strings, and a big chain makes thousands
    fields = tuple((f.label, f.value, 1) if f.changed else (f.label, f.value) for f in section.fields)
    return (section.title, section.note, fields)


def chain_page(view: ChainView, links: Links | None = None) -> str:
    """The page of a chain: lanes per agent over time, then every event, each with what it holds on a click.

    What an event holds is not in the page's markup: it is one JSON data block
    the page's script lays out when the event is opened (a click on its line,
    or Enter on it): a chain of thousands of events stays a page of one line
    per event.
    """
    links = links or Links()
    lane_of = {lane: n for n, lane in enumerate(view.lanes)}
    last = len(view.lanes) - 1  # the lane an agent without its own shares (the model drew a limited number)
    marks: dict[tuple[int, str], list[str]] = {}
    for e in view.events:
        marks.setdefault((lane_of.get(e.lane, last), "a" if e.layer == "audit" else "d"), []).append(
            f"M{_x(e.offset)} 3h7v12h-7z"
        )
    lanes = []
    for n, lane in enumerate(view.lanes):
        paths = "".join(
            f'<path class="{layer}" d="{"".join(marks[n, layer])}"></path>'
            for layer in ("d", "a")
            if (n, layer) in marks
        )
        lanes.append(
            f'<div class="lane"><span class="who" title="{esc(lane)}">{esc(lane)}</span>'
            f'<svg viewBox="-4 0 1012 18" preserveAspectRatio="none" role="img" aria-label="{esc(lane)}" '
            f'data-lane="{n}"><title>{esc(lane)}: a click opens the nearest event</title>'
            f'<line class="track" x1="0" y1="9" x2="1000" y2="9"></line>{paths}</svg></div>'
        )
    events = []
    details: dict[str, object] = {}
    for e in view.events:
        layer = "audit" if e.layer == "audit" else "decision"
        # One line per event, in few and short elements (a chain can hold thousands): the time, the lane, what.
        line = (
            f"<time>{_text(e.clock)}</time><span>{_text(e.lane)}</span>"
            f"<span><b>{_text(e.title)}</b>{_text(e.summary)}</span>{_pill(e.outcome)}"
        )
        if not e.sections:
            events.append(f'<div class="event plain {layer}" id="ev-{e.index}">{line}</div>')
            continue
        href = links.decision(e.record_id) if layer == "decision" else None
        details[str(e.index)] = (f"{layer} {e.record_id}", href or "", tuple(_detail(s) for s in e.sections))
        record = f' data-record="{esc(e.record_id)}"' if layer == "decision" else ""
        # a plain element, not <details>: its shadow tree, times thousands, costs a big chain's page a fifth more
        events.append(f'<div class="event {layer}" id="ev-{e.index}"{record} tabindex="0">{line}</div>')
    data = {
        "details": details,
        "x": [round(e.offset, 1) for e in view.events],
        "lane": [lane_of.get(e.lane, last) for e in view.events],
    }
    body = (
        f'<h1>{esc(view.chain_type)} chain <span class="id">{esc(view.chain_id)}</span></h1>'
        f'<p class="sub">{esc(view.counts)}; {esc(len(view.lanes))} lane(s)</p>{_notes(view.notes)}'
        f'<div class="lanes">{"".join(lanes)}<div class="axis"><span></span><span>{esc(view.start)}</span>'
        f"<span>{esc(view.end)}</span></div></div>"
        '<div class="toolbar"><button type="button" data-expand="all">Expand all</button>'
        '<button type="button" data-expand="none">Collapse all</button></div>'
        f'<div class="events">{"".join(events) or "<p>Nothing was recorded under this id.</p>"}</div>'
        f"{data_block('chain-data', data)}"
    )
    return page(f"{view.chain_type} chain {view.chain_id}", body, links)


def _verdict(verdict: VerdictView) -> str:
    rows = "".join(
        f'<tr><td class="mono">{esc(k)}</td><td{_changed(changed)}>{esc(was)}</td>'
        f"<td{_changed(changed)}>{esc(now)}</td><td>{'changed' if changed else ''}</td></tr>"
        for k, was, now, changed in verdict.keys
    )
    table = (
        '<table class="grid verdict-keys"><tr><th>key</th><th>snapshot (recorded)</th><th>live state</th><th></th></tr>'
        f"{rows}</table>"
        if rows
        else ""
    )
    return (
        f'<h2>Replay verdict</h2><div class="box verdict"><p>{_pill(verdict.fix)} justified: '
        f"{esc('yes' if verdict.justified else 'no')}</p><p>{esc(verdict.reason)}</p>{table}</div>"
    )


def decision_page(view: DecisionView, links: Links | None = None) -> str:
    """The page of a decision: its causal tree as a waterfall, its record, its gate records and a verdict."""
    links = links or Links()
    rows = []
    for row in view.rows:
        kind = row.kind if row.kind in _KINDS else ""
        width = max(row.width * 10, 2.0)
        rows.append(
            f'<div class="wrow d{min(row.depth, 4)}"><span class="name" title="{esc(row.span_id)}">{esc(row.name)}'
            f'<span class="kind">{esc(row.kind)}</span></span><span class="span">'
            f'<svg viewBox="0 0 1000 14" preserveAspectRatio="none" role="img" aria-label="{esc(row.name)}">'
            f'<rect class="bar{" bar-" + kind if kind else ""}" x="{_x(row.offset)}" y="2" width="{width:.1f}" '
            f'height="10" rx="2"><title>{esc(row.name)} {esc(row.duration)}</title></rect></svg></span>'
            f'<span class="dur">{esc(row.duration)}</span></div>'
        )
    chain = links.chain("trade", view.correlation_id)
    session = links.chain("session", view.session_id)
    rerun = links.rerun(view.session_id)
    facts = _facts(
        [
            Field("agent", view.agent),
            Field("started", view.started),
            Field("total", view.total),
            Field("correlation id", view.correlation_id),
            Field("session id", view.session_id),
        ]
    )
    nav = " · ".join(
        _link(href, label)
        for href, label in ((chain, "its trade chain"), (session, "its session"), (rerun, "its session's reruns"))
        if href
    )
    body = (
        f'<h1>{esc(view.decision_type)} <span class="id">{esc(view.record_id)}</span></h1>'
        f'<p class="sub">{nav}</p>{_notes(view.notes)}{facts}'
        f'<h2>Causal tree</h2><div class="waterfall"><div class="wrow head"><span class="name">span</span>'
        f'<span class="span">0 … {esc(view.total)}</span><span class="dur">duration</span></div>{"".join(rows)}</div>'
        f"{_verdict(view.verdict) if view.verdict else ''}"
        f'<h2>Record</h2><div class="box">{_sections(view.sections)}</div>'
    )
    return page(f"decision {view.record_id}", body, links)


def verdict_page(view: VerdictView) -> str:
    """A page holding one verdict (a replay result's ``_repr_html_``)."""
    return page(f"verdict on {view.record_id}", f'<h1 class="id">{esc(view.record_id)}</h1>{_verdict(view)}', Links())


def rerun_page(view: RerunView, links: Links | None = None) -> str:
    """The page of a rerun: the recorded run and the rerun side by side, the first divergent step marked."""
    links = links or Links()
    d = view.divergence
    divergence = ""
    if d is not None:
        candidates = "".join(f'<li class="mono">{esc(c)}</li>' for c in d.candidates)
        divergence = (
            f'<h2>First divergence: step {esc(d.step)}</h2><div class="box bad divergence"><p>{esc(d.reason)}</p>'
            '<div class="side"><div><h3>expected (recorded)</h3>'
            f'<p class="mono">{esc(d.expected or "(nothing: the recording holds no such call)")}</p></div>'
            "<div><h3>actual (rerun)</h3>"
            f'<p class="mono">{esc(d.actual or "(nothing: the rerun never made this call)")}'
            "</p></div></div>"
            f"{'<h3>closest recorded calls</h3><ul>' + candidates + '</ul>' if candidates else ''}</div>"
        )
    steps = "".join(
        f'<tr class="{_STEP_CLASS.get(s.state, "")}" '
        f'id="step-{esc(s.seq)}"><td class="mono">{esc(s.seq)}</td><td class="mono">{esc(s.recorded)}</td>'
        f'<td class="mono">{esc(s.rerun)}</td><td>{esc(s.state)}</td></tr>'
        for s in view.steps
    )
    body = (
        f'<h1>rerun of session <span class="id">{esc(view.session_id)}</span></h1>'
        f'<p class="sub">{_pill(view.state)} {esc(view.summary)} · rerun <span class="id">{esc(view.rerun_id)}</span>'
        f" · {_link(links.chain('session', view.session_id), 'the session’s decisions')}</p>"
        f"{_notes(view.notes)}"
        f"{_facts(view.facts)}"
        f"{divergence}<h2>Step by step</h2>"
        '<table class="grid steps"><tr><th>step</th><th>recorded</th><th>rerun</th><th></th></tr>'
        f"{steps}</table>"
    )
    return page(f"rerun of {view.session_id}", body, links)


_FIRST = ' class="first"'


def _rule_counts(counts: Iterable[RuleCount], cls: str) -> str:
    rows = "".join(
        f'<tr><td class="mono">{esc(c.contract)}</td><td>{esc(c.rule)}</td><td>{esc(c.count)}</td></tr>' for c in counts
    )
    if not rows:
        return ""
    return f'<table class="grid {cls}"><tr><th>contract</th><th>rule</th><th>blocked</th></tr>{rows}</table>'


def _contract_session(n: int, s: SessionView, links: Links) -> str:
    chain = links.chain("session" if s.grouped_by == "session" else "trade", s.session_id)
    rows = "".join(
        f"<tr{_FIRST if r.first else ''}><td>{esc(r.step)}</td><td>{esc(r.call)}</td>"
        f'<td class="mono">{esc(r.tool)}</td><td class="mono">{esc(r.arguments)}</td><td>{esc(r.rule)}</td>'
        f'<td>{esc(r.detail)}</td><td class="mono">{esc(r.source)}</td></tr>'
        for r in s.rows
    )
    table = (
        '<table class="grid blocked"><tr><th>step</th><th>call</th><th>tool</th><th>arguments (as recorded)</th>'
        f"<th>rule</th><th>why</th><th>contract</th></tr>{rows}</table>"
        if rows
        else ""
    )
    agent = f" · agent {esc(s.agent)}" if s.agent else ""
    return (
        f'<section class="session" id="session-{n}"><h2>{_pill("passed" if s.passed else "blocked")} '
        f'{esc(s.grouped_by)} <span class="id">{esc(s.session_id)}</span></h2>'
        f'<p class="sub">{esc(s.summary)}{agent}{" · " + _link(chain, "its decisions") if chain else ""}</p>'
        f"{_notes(s.notes)}{table}{_rule_counts(s.counts, 'counts')}</section>"
    )


def contracts_page(view: ContractsView, links: Links | None = None) -> str:
    """The page of a contracts backtest: per session the calls the contracts would have blocked, the first marked."""
    links = links or Links()
    blocked = [(n, s) for n, s in enumerate(view.sessions) if not s.passed]
    passed = "".join(
        f'<tr><td class="mono">{esc(s.session_id)}</td><td>{esc(s.grouped_by)}</td><td>{esc(s.summary)}</td></tr>'
        for s in view.sessions
        if s.passed
    )
    facts = _facts([Field("contracts", view.contracts), Field("digest", view.digest), Field("gate mode", view.gate)])
    body = (
        f'<h1>contracts backtest <span class="id">{esc(view.contracts)}</span></h1>'
        f'<p class="sub">{_pill("passed" if view.passed else "blocked")} {esc(view.summary)}</p>'
        f"{_notes(view.notes)}{facts}"
        + (f"<h2>Blocked, by contract and rule</h2>{_rule_counts(view.counts, 'counts')}" if view.counts else "")
        + "".join(_contract_session(n, s, links) for n, s in blocked)
        + (
            '<h2>Sessions that passed</h2><table class="grid passed"><tr><th>session</th><th>grouped by</th>'
            f"<th></th></tr>{passed}</table>"
            if passed
            else ""
        )
    )
    return page(f"contracts backtest {view.contracts}", body, links)


def index_page(view: IndexView, links: Links, contracts: str | None = None) -> str:
    """The UI's front page; with ``contracts`` (the directory the UI was given), a link to their backtest."""
    decisions = "".join(
        f'<tr><td class="mono">{esc(d["created_at"])}</td>'
        f"<td>{_link(links.decision(d['record_id']), d['record_id'], 'mono')}</td>"
        f"<td>{esc(d['decision_type'])}</td><td>{esc(d['agent_id'])}</td>"
        f"<td>{_link(links.chain('trade', d['correlation_id']), d['correlation_id'], 'mono')}</td>"
        f"<td>{_link(links.chain('session', d['session_id']), d['session_id'], 'mono')}</td>"
        f"<td>{_pill(d['gate_fix'])}</td></tr>"
        for d in view.decisions
    )
    sessions = "".join(
        f'<tr><td class="mono">{esc(s["recorded_at"])}</td>'
        f"<td>{_link(links.rerun(s['session_id']), s['session_id'], 'mono')}</td>"
        f'<td class="mono">{esc(s["rerun_id"] or "not rerun")}</td><td>{_pill(s["result"])}</td></tr>'
        for s in view.sessions
    )
    chains = "".join(f"<li>{_link(links.chain('trade', c), c, 'mono')}</li>" for c in view.chains)
    backtest = ""
    if contracts is not None:
        link = _link(links.contracts(), "the recorded sessions under the contracts", "contracts")
        backtest = f'<h2>Contracts</h2><p>{link} <span class="id">{esc(contracts)}</span></p>'
    body = (
        "<h1>Dataset</h1>"
        f"{_notes(view.notes)}{backtest}"
        '<h2>Recent decisions</h2><table class="grid decisions"><tr><th>time (UTC)</th><th>decision</th><th>type</th>'
        f"<th>agent</th><th>trade chain</th><th>session</th><th>gate verdict (as stored)</th></tr>{decisions}</table>"
        f'<h2>Chains</h2><ul class="chains">{chains or "<li>none</li>"}</ul>'
        '<h2>Recorded sessions and reruns</h2><table class="grid sessions"><tr><th>recorded</th><th>session</th>'
        f"<th>rerun</th><th>result</th></tr>{sessions}</table>"
    )
    return page("index", body, links)


def message_page(title: str, message: str, links: Links) -> str:
    """A page saying one thing (nothing found, a bad id, a method not allowed)."""
    return page(title, f"<h1>{esc(title)}</h1><p>{esc(message)}</p>", links)
