"""The report's view models: what a page shows, built from the library calls the CLI uses.

Every value a page shows is prepared here, as plain text: times as ISO-8601
UTC, structured values as JSON, long values cut with the count of what was
left out. Nothing here is HTML: :mod:`otel_replay.report.html` escapes and
lays out what these models hold, and decides nothing. Values are shown as
the dataset stores them: a redacted value stays redacted.

The sources are :class:`~otel_replay.query.chains.ReplayBuilder` (chains),
:meth:`Store.causal_tree <otel_replay.query.store.Store.causal_tree>` and
:meth:`Store.record <otel_replay.query.store.Store.record>` (a decision),
:func:`~otel_replay.gate.execute.replay_stored` results (verdicts), the gate's
reads of stored commits, and :func:`~otel_replay.rerun.runner.rerun` results
or the stored rerun records with the session's recording (reruns).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_replay import semconv as sc
from otel_replay.gate import reads
from otel_replay.gate.policy import Verdict
from otel_replay.query.chains import ReplayChain
from otel_replay.query.store import Store
from otel_replay.records import DecisionRecord
from otel_replay.rerun.divergence import Divergence, describe
from otel_replay.rerun.load import Recording, load_recording
from otel_replay.rerun.runner import RerunResult

__all__ = [
    "DETAIL_BUDGET",
    "DETAIL_LIMIT",
    "GATE_READS_LIMIT",
    "INDEX_LIMIT",
    "MAX_STEPS",
    "MAX_TEXT",
    "ChainView",
    "DecisionView",
    "Field",
    "IndexView",
    "RerunStep",
    "RerunView",
    "Section",
    "TimelineEvent",
    "VerdictView",
    "WaterfallRow",
    "chain_view",
    "decision_view",
    "gate_sections",
    "index_view",
    "rerun_view",
    "session_rerun_view",
    "stored_rerun_view",
    "text",
    "verdict_view",
]

MAX_TEXT = 2000
"""Characters of one value shown on a page; the rest is left out and counted."""
MAX_STEPS = 2000
"""Recorded steps shown on a rerun page; the rest are left out and counted."""
GATE_READS_LIMIT = 20
"""Decisions of a chain whose gate records (receipts, compensations) are read for its page (each is a read)."""
DETAIL_LIMIT = 5000
"""Events of a chain shown with what they hold (expandable); the rest by their one-line summary only."""
DETAIL_BUDGET = 600_000
"""Characters of what a chain's events hold, on one page: past it, events show their one-line summary only."""


def text(value: Any, limit: int = MAX_TEXT) -> str:
    """``value`` as one piece of plain text: a string as it is, anything else as JSON; cut after ``limit``."""
    if value is None:
        shown = ""
    elif isinstance(value, str):
        shown = value
    elif isinstance(value, bool):
        shown = "true" if value else "false"
    elif isinstance(value, (dt.datetime, dt.date)):
        shown = value.isoformat()
    elif type(value) is float and math.isfinite(value):
        shown = repr(value)  # as JSON writes it, without its encoder's cost (a big chain has thousands)
    else:
        try:
            shown = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
        except (TypeError, ValueError):  # a cycle or a key type JSON cannot hold
            shown = _repr(value)
        except RecursionError:  # nested deeper than the interpreter's stack: repr() would fail the same way
            shown = "(a value nested too deep to show)"
    if len(shown) > limit:
        return f"{shown[:limit]}… ({len(shown) - limit:,} more characters not shown)"
    return shown


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except RecursionError:
        return "(a value nested too deep to show)"


@dataclass(frozen=True)
class Field:
    """One labelled value; ``changed`` marks a value that differs from its counterpart (highlighted)."""

    label: str
    value: str
    changed: bool = False


@dataclass(frozen=True)
class Section:
    """A titled list of fields (what a decision read, its model calls, its action ...)."""

    title: str
    fields: tuple[Field, ...]
    note: str = ""


@dataclass(frozen=True)
class TimelineEvent:
    """One event of a chain's timeline, in the lane of the agent that wrote it."""

    index: int
    time: str
    clock: str
    """The time of day alone (``HH:MM:SS.ffffff``), for the row; ``time`` is the whole instant."""
    offset: float
    """Where the event sits on the chain's time axis, 0 to 100."""
    lane: str
    layer: str
    """``decision`` or ``audit``."""
    title: str
    summary: str
    outcome: str
    record_id: str
    sections: tuple[Section, ...] = ()


@dataclass(frozen=True)
class ChainView:
    """A chain as a timeline: lanes per agent, events in time order, what was left out said."""

    chain_type: str
    chain_id: str
    lanes: tuple[str, ...]
    events: tuple[TimelineEvent, ...]
    start: str
    end: str
    counts: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class WaterfallRow:
    """One span of a decision's causal tree on the tree's time axis (as a trace viewer draws it)."""

    depth: int
    name: str
    kind: str
    span_id: str
    offset: float
    """Start on the axis, 0 to 100."""
    width: float
    """Length on the axis, 0 to 100."""
    duration: str
    status: str


@dataclass(frozen=True)
class VerdictView:
    """A replay verdict beside the snapshot it was judged on: each key with its recorded and live value."""

    fix: str
    justified: bool
    reason: str
    record_id: str
    keys: tuple[tuple[str, str, str, bool], ...] = ()
    """(key, snapshot value, live value, changed) for every key of either state."""


@dataclass(frozen=True)
class DecisionView:
    """A decision: its causal tree as a waterfall, what it read, called and did, and optionally a verdict."""

    record_id: str
    decision_type: str
    agent: str
    correlation_id: str
    session_id: str
    started: str
    total: str
    rows: tuple[WaterfallRow, ...]
    sections: tuple[Section, ...]
    verdict: VerdictView | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class RerunStep:
    """One recorded step beside what the rerun did there: ``same``, ``diverged`` or ``not reached``."""

    seq: int
    recorded: str
    rerun: str
    state: str


@dataclass(frozen=True)
class RerunView:
    """A recorded run and its rerun side by side, the first divergent step marked."""

    session_id: str
    rerun_id: str
    summary: str
    matched: bool
    original_fingerprint: str
    rerun_fingerprint: str
    steps: tuple[RerunStep, ...]
    divergence: Divergence | None
    facts: tuple[Field, ...] = ()
    notes: tuple[str, ...] = ()
    state: str = "diverged"
    """``matched``, ``diverged`` (or otherwise not matched) or ``not rerun``: the page's badge."""


# --- chains ----------------------------------------------------------------


def _instant(value: Any) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def _clock(instant: dt.datetime | None) -> str:
    return "" if instant is None else instant.astimezone(dt.UTC).strftime("%H:%M:%S.%f")


def _offsets(times: Sequence[dt.datetime | None]) -> list[float]:
    known = [t for t in times if t is not None]
    if not known:
        return [0.0 for _ in times]
    first, last = min(known), max(known)
    span = last - first
    # The ratio of two timedeltas is computed from their whole microseconds: exactly 1.0 for the last event, so
    # it sits at 100.0 (the seconds as floats landed one ulp off, 100.00000000000001 or 99.99999999999999).
    # Clamped all the same: the page and its readers treat anything else as outside the 0-100 axis.
    return [0.0 if t is None or not span else min(100.0, max(0.0, 100.0 * ((t - first) / span))) for t in times]


def _decision_sections(event: Mapping[str, Any], gate: Sequence[Section]) -> tuple[Section, ...]:
    sections = []
    state = event.get("snapshot_state")
    if state is not None:
        version = text(event.get("snapshot_version")) or "unversioned"
        # a row no seal vouches for may hold any JSON here (a list, a number): shown as one value, not iterated
        fields = (
            tuple(Field(str(k), text(v)) for k, v in sorted(state.items()))
            if isinstance(state, Mapping)
            else (Field("state", text(state)),)
        )
        sections.append(Section(f"read: dependency snapshot {version}", fields))
    if event.get("inputs"):
        inputs = event["inputs"]
        fields = tuple(Field(str(k), text(v)) for k, v in sorted(inputs.items())) if isinstance(inputs, Mapping) else ()
        sections.append(Section("inputs", fields or (Field("inputs", text(inputs)),)))
    models = event.get("models") or ()
    for n, model in enumerate(models if isinstance(models, list | tuple) else (models,), start=1):
        fields = tuple(Field(str(k), text(v)) for k, v in sorted(model.items())) if isinstance(model, Mapping) else ()
        sections.append(Section(f"model call {n}", fields or (Field("model", text(model)),)))
    if event.get("action_type"):
        sections.append(
            Section(
                "action",
                (
                    Field("type", text(event["action_type"])),
                    Field("arguments", text(event.get("action_arguments"))),
                    Field("cost", text(event.get("action_cost"))),
                ),
            )
        )
    sections.extend(gate)
    outcome = _outcome_fields(event)
    if outcome:
        sections.append(Section("outcome", outcome))
    return tuple(sections)


def _outcome_fields(event: Mapping[str, Any]) -> tuple[Field, ...]:
    fields = []
    if event.get("outcome_id"):
        fields.append(Field("outcome", "correct" if event.get("outcome_correct") else "incorrect"))
        fields.append(Field("outcome record", text(event["outcome_id"])))
    if event.get("outcome_note"):
        fields.append(Field("note", text(event["outcome_note"])))
    if event.get("unknown_commits"):
        fields.append(Field("executed?", "unknown - check the rail: " + ", ".join(map(str, event["unknown_commits"]))))
    if event.get("from_intent"):
        fields.append(Field("stored as", "its commit intent (the process died inside the audit() block)"))
    if event.get("error"):
        fields.append(Field("error", text(event["error"])))
    return tuple(fields)


def _outcome_word(event: Mapping[str, Any]) -> str:
    if event.get("unknown_commits"):
        return "executed? unknown"
    correct = event.get("outcome_correct")
    if correct is None:
        return "conflicting" if str(event.get("outcome_note") or "").startswith("conflicting") else ""
    return "correct" if correct else "incorrect"


def gate_sections(store: Store, decision_id: str) -> tuple[Section, ...]:
    """The verified gate records of ``decision_id`` as sections: each commit's receipt, and its compensation."""
    sections = []
    for gate_id, receipt in reads.commits_for(store, decision_id):
        fields: list[Field] = [Field("gate record", gate_id)]
        if isinstance(receipt, Mapping):
            fields.extend(Field(str(k), text(v)) for k, v in sorted(receipt.items()))
        else:
            fields.append(Field("receipt", text(receipt)))
        sections.append(Section("gate: committed", tuple(fields)))
    compensation = reads.compensation_for(store, decision_id)
    if compensation is not None:
        fields = [Field(str(k), text(v)) for k, v in compensation.items() if k != "recorded_at"]
        sections.append(Section(f"gate: {compensation['executed']}", tuple(fields)))
    return tuple(sections)


def _gated(store: Store, decision_ids: Sequence[str]) -> set[str]:
    """Which of ``decision_ids`` have any gate row at all: one read for the chain (their sections are read after)."""
    if not decision_ids:
        return set()
    rows = store.record_rows(gate_decision_ids=list(decision_ids))
    return {str(r.attributes.get(sc.GATE_DECISION_ID)) for r in rows if r.attributes.get(sc.KIND) == sc.KIND_GATE}


_MAX_LANES = 40  # lanes drawn on a chain's page: past it, the later agents share the last lane


def _size(sections: Sequence[Section]) -> int:
    return sum(len(s.title) + len(s.note) + sum(len(f.label) + len(f.value) + 8 for f in s.fields) for s in sections)


def chain_view(chain: ReplayChain, store: Store | None = None) -> ChainView:
    """The timeline of ``chain``; with ``store``, the gate records of its decisions too (the first few that have any).

    Every event gets its one-line summary; what it holds (its sections) is
    kept for the first :data:`DETAIL_LIMIT` events while their text stays
    within :data:`DETAIL_BUDGET` characters, and the page says where that stopped.
    """
    times = [_instant(e.get("created_at")) for e in chain.events]
    offsets = _offsets(times)
    gated: set[str] = set()
    if store is not None:
        ids = [text(e.get("record_id"), 200) for e in chain.events[:DETAIL_LIMIT] if e.get("layer") != "audit"]
        gated = _gated(store, ids)
    lanes: dict[str, None] = {}  # in order of first event; a dict, as a list's `in` made 100,000 agents take a minute
    events = []
    decisions = gate_reads = budget = 0
    detailed = len(chain.events)  # the first event left without its detail (the whole chain when none is)
    for i, (event, offset) in enumerate(zip(chain.events, offsets, strict=True)):
        audit = event.get("layer") == "audit"
        lane = text(event.get("source_agent") if audit else event.get("agent_id"), 80) or "(no agent)"
        lanes.setdefault(lane)
        detail = i < min(detailed, DETAIL_LIMIT)
        sections: tuple[Section, ...] = ()
        if audit:
            target = text(event.get("target_agent"), 80) or "*"
            title = text(event.get("event_type"), 200)
            summary = f"→ {target}: {text(event.get('payload'), 300)}"
            if detail:
                fields = tuple(Field(k, text(event.get(k))) for k in ("target_agent", "payload", "recorded_at"))
                sections = (Section("audit entry", fields),)
            record_id = text(event.get("entry_id"), 200)
            outcome = ""
        else:
            decisions += 1
            record_id = text(event.get("record_id"), 200)
            gate: tuple[Section, ...] = ()
            if store is not None and detail and record_id in gated:
                gate_reads += 1
                gate = gate_sections(store, record_id) if gate_reads <= GATE_READS_LIMIT else ()
            conf = event.get("confidence")
            title = text(event.get("decision_type"), 200) + (f" ({conf:.2f})" if isinstance(conf, float) else "")
            summary = text(event.get("rationale"), 300) or (
                f"{text(event.get('action_type'), 100)} {text(event.get('action_arguments'), 200)}".strip()
            )
            sections = _decision_sections(event, gate) if detail else ()
            outcome = _outcome_word(event)
        if sections:
            budget += _size(sections)
            if budget > DETAIL_BUDGET and i > 0:  # the first event keeps its detail whatever its size
                sections, detailed = (), i
        events.append(
            TimelineEvent(
                i,
                text(event.get("created_at"), 64),
                _clock(times[i]),
                offset,
                lane,
                "audit" if audit else "decision",
                title,
                summary,
                outcome,
                record_id,
                sections,
            )  # fmt: skip
        )
    notes = []
    if chain.truncated:
        layers = " and ".join(chain.truncated_layers)
        notes.append(f"truncated: the {layers} layer had more than {chain.limit} rows; the newest are left out")
    if not chain.outcomes_verified:
        notes.append("outcomes not shown: no verification key to check them with")
    shown = min(detailed, DETAIL_LIMIT)
    if len(events) > shown:
        notes.append(
            f"the first {shown} of {len(events)} events open to what they hold; the rest show one line each "
            "(a decision's own page shows it whole; --limit narrows the chain)"
        )
    if gate_reads > GATE_READS_LIMIT:
        notes.append(
            f"gate records shown for the first {GATE_READS_LIMIT} of {gate_reads} decisions that have them (each "
            "decision's page shows its own)"
        )
    drawn = tuple(lanes)
    if len(drawn) > _MAX_LANES:
        rest = len(drawn) - (_MAX_LANES - 1)
        drawn = (*drawn[: _MAX_LANES - 1], f"({rest:,} other agents)")
        notes.append(
            f"{len(lanes):,} agents: the first {_MAX_LANES - 1} have a lane each, the other {rest:,} share the last "
            "(each event's line names its own)"
        )
    known = [t for t in times if t is not None]
    entries = "audit entry" if len(chain.audit_entries) == 1 else "audit entries"
    counts = f"{len(chain.traces)} decision(s), {len(chain.audit_entries)} {entries}"
    return ChainView(
        chain.chain_type, text(chain.chain_id, 200), drawn, tuple(events),
        min(known).isoformat() if known else "", max(known).isoformat() if known else "", counts, tuple(notes),
    )  # fmt: skip


# --- decisions -------------------------------------------------------------


def _ms(ns: Any) -> str:
    return f"{(ns or 0) / 1e6:,.3f} ms"


_MAX_TREE_ROWS = 2000  # spans of a causal tree drawn on a decision's page (the axis spans them all)


def _waterfall(tree: Sequence[Mapping[str, Any]]) -> tuple[tuple[WaterfallRow, ...], str, str]:
    """The first ``_MAX_TREE_ROWS`` spans of ``tree`` (depth-first) as rows, on the axis of every span."""
    starts = [_instant(row.get("start_time")) for row in tree]
    known = [(s, row.get("duration_ns") or 0) for s, row in zip(starts, tree, strict=True) if s is not None]
    if not known:
        return (), "", ""
    first = min(s for s, _ in known)
    last = max(s + dt.timedelta(microseconds=d / 1000) for s, d in known)
    total_ns = max((last - first).total_seconds() * 1e9, 1.0)
    rows = []
    for start, row in zip(starts[:_MAX_TREE_ROWS], tree[:_MAX_TREE_ROWS], strict=True):
        at = 0.0 if start is None else (start - first).total_seconds() * 1e9
        width = (row.get("duration_ns") or 0) / total_ns * 100
        rows.append(
            WaterfallRow(
                int(row.get("depth") or 0), text(row.get("name"), 200), text(row.get("replay_kind"), 80),
                text(row.get("span_id"), 64), min(100.0, at / total_ns * 100), min(100.0, width),
                _ms(row.get("duration_ns")), text(row.get("status_code"), 40),
            )
        )  # fmt: skip
    return tuple(rows), first.isoformat(), _ms(total_ns)


def _record_sections(record: DecisionRecord) -> tuple[Section, ...]:
    body: dict[str, Any] = {
        "snapshot_state": record.snapshot.state if record.snapshot else None,
        "snapshot_version": record.snapshot.version if record.snapshot else None,
        "inputs": dict(record.inputs),
        "models": [
            {"model_id": m.model_id, "decision_basis": m.decision_basis, "output": m.output} for m in record.models
        ],
        "action_type": record.action.type if record.action else None,
        "action_arguments": dict(record.action.arguments) if record.action else None,
        "action_cost": record.action.cost if record.action else None,
        "error": record.error,
    }
    sections = list(_decision_sections(body, ()))
    for report in record.reports:
        passed = "passed" if report.passed else ("failed" if report.passed is False else "not judged")
        fields = (Field("result", passed), *(Field(str(k), text(v)) for k, v in sorted(report.detail.items())))
        sections.append(Section(f"check {report.stage}/{report.name}", fields))
    if record.rationale:
        sections.insert(0, Section("rationale", (Field("rationale", text(record.rationale)),)))
    return tuple(sections)


def verdict_view(
    verdict: Verdict, snapshot: Mapping[str, Any] | None = None, live: Mapping[str, Any] | None = None
) -> VerdictView:
    """``verdict`` with every key of the snapshot and live state, the changed ones marked."""
    keys = []
    if snapshot is not None and live is not None:
        for key in sorted({*map(str, snapshot), *map(str, live)}):
            was, now = snapshot.get(key, _MISSING), live.get(key, _MISSING)
            keys.append((key, _shown(was), _shown(now), was != now))
    return VerdictView(
        verdict.fix.value, verdict.justified, text(verdict.reason), text(verdict.record_id, 200), tuple(keys)
    )


_MISSING = object()


def _shown(value: Any) -> str:
    return "(absent)" if value is _MISSING else text(value)


def decision_view(
    store: Store, record_id: str, *, verdict: Verdict | None = None, live_state: Mapping[str, Any] | None = None
) -> DecisionView:
    """Decision ``record_id``: its causal tree as a waterfall, its record, its gate records, and ``verdict``.

    Raises :class:`~otel_replay.errors.RecordNotFound` when the dataset holds
    no such decision (or none that verifies, where two claim the id).
    """
    tree = store.causal_tree(record_id)
    record = store.record(record_id)
    rows, started, total = _waterfall(tree)
    sections = (*_record_sections(record), *gate_sections(store, record_id))
    shown = None
    if verdict is not None:
        snapshot = record.snapshot.state if record.snapshot else {}
        shown = verdict_view(verdict, snapshot, live_state)
    notes: tuple[str, ...] = ("the causal tree stops at 64 levels deep",) if any(r.depth >= 64 for r in rows) else ()
    if len(tree) > len(rows) and rows:
        notes += (f"the causal tree has {len(tree):,} spans: the first {len(rows):,} are drawn (depth-first)",)
    return DecisionView(
        text(record.record_id, 200), text(record.decision_type, 200), text(record.agent_id, 200),
        text(record.correlation_id, 200), text(record.session_id, 200), started, total, rows, sections, shown, notes,
    )  # fmt: skip


# --- reruns ----------------------------------------------------------------


def _steps(
    recording: Recording | None, divergence: Divergence | None, matched: bool
) -> tuple[tuple[RerunStep, ...], list[str]]:
    if recording is None:
        return (), ["the recorded steps are not shown (no recording given)"]
    at = divergence.step if divergence is not None else None
    steps = []
    for event in recording.events[:MAX_STEPS]:
        recorded = text(describe(event), 400)
        if at is not None and event.seq == at:
            steps.append(
                RerunStep(
                    event.seq, recorded, text(divergence.actual if divergence else "", 400) or "(nothing)", "diverged"
                )
            )
        elif at is not None and event.seq > at:
            steps.append(RerunStep(event.seq, recorded, "", "not reached"))
        else:
            steps.append(
                RerunStep(
                    event.seq,
                    recorded,
                    "= recorded" if matched or at is not None else "",
                    "same" if matched or at is not None else "unknown",
                )
            )
    notes = []
    if len(recording.events) > MAX_STEPS:
        notes.append(f"steps cut: {MAX_STEPS} of {len(recording.events)} recorded steps shown")
    if not recording.complete:
        notes.append("the recording ends early: its run never finished")
    return tuple(steps), notes


_MAX_CANDIDATES = 20  # closest recorded calls shown beside a divergence


def _cut(divergence: Divergence | None) -> Divergence | None:
    """``divergence`` with its texts cut as every shown value is, and at most ``_MAX_CANDIDATES`` candidates."""
    if divergence is None:
        return None
    candidates = tuple(text(c, 400) for c in divergence.candidates[:_MAX_CANDIDATES])
    if len(divergence.candidates) > _MAX_CANDIDATES:
        candidates += (f"… and {len(divergence.candidates) - _MAX_CANDIDATES:,} more not shown",)
    return Divergence(
        divergence.step, text(divergence.reason), text(divergence.expected), text(divergence.actual), candidates
    )


def rerun_view(result: RerunResult, recording: Recording | None = None) -> RerunView:
    """A rerun result beside its recording's steps (``recording``: :func:`~otel_replay.rerun.load.load_recording`'s)."""
    steps, notes = _steps(recording, result.divergence, result.matched)
    original = text(result.original_fingerprint or "(none: the recording ended early)")
    facts = [
        Field("original fingerprint", original),
        Field("rerun fingerprint", text(result.fingerprint), result.fingerprint != result.original_fingerprint),
        Field("governance", result.governance),
        Field("steps", str(result.steps)),
        Field("recorded outcome", text(result.original_outcome)),
        Field("rerun outcome", text(result.outcome), result.original_outcome != result.outcome),
    ]
    if result.error:
        facts.append(Field("the entrypoint raised", text(result.error)))
    facts.extend(Field("leak", text(leak)) for leak in result.leaks[:20])
    facts.extend(Field("ran live", text(what)) for what in result.live[:20])
    facts.extend(
        Field(f"gate {g.record_id}", text(f"{g.fix}: {g.reason} {g.error or ''}".strip())) for g in result.gate
    )
    if result.rules:
        notes.append(result.rules)
    return RerunView(
        text(result.session_id, 200), text(result.rerun_id, 200), text(result.summary()), result.matched,
        text(result.original_fingerprint or "(none: the recording ended early)"), text(result.fingerprint),
        steps, _cut(result.divergence), tuple(facts), tuple(notes), "matched" if result.matched else "diverged",
    )  # fmt: skip


def stored_rerun_view(row: Mapping[str, Any], recording: Recording | None) -> RerunView:
    """A stored rerun record (a ``rerun_compare`` row) beside its recording's steps."""
    divergence = None
    raw = row.get("divergence")
    if raw:
        try:
            data = json.loads(raw)
            divergence = Divergence(
                int(data["step"]), str(data["reason"]), str(data["expected"]), str(data["actual"]),
                tuple(str(c) for c in data.get("candidates") or ()),
            )  # fmt: skip
        except (ValueError, KeyError, TypeError, OverflowError, AttributeError):  # OverflowError: a step of 1e400
            divergence = Divergence(-1, "the stored divergence could not be read", text(raw), "")
    divergence = _cut(divergence)
    matched = bool(row.get("matched"))
    steps, notes = _steps(recording, divergence, matched)
    if matched:
        summary = "matched"
    elif divergence is not None:
        summary = f"diverged at step {divergence.step}"
    else:
        summary = "not matched"
    facts = (
        Field("original fingerprint", text(row.get("original_fingerprint"))),
        Field(
            "rerun fingerprint",
            text(row.get("rerun_fingerprint")),
            row.get("rerun_fingerprint") != row.get("original_fingerprint"),
        ),
        Field("governance", text(row.get("governance"))),
        Field("steps", text(row.get("steps"))),
        Field("recorded at", text(row.get("recorded_at"))),
        Field("rerun at", text(row.get("rerun_at"))),
        Field("recorded outcome", text(row.get("original_outcome"))),
        Field("verdicts", text(row.get("verdicts"))),
    )
    return RerunView(
        text(row.get("session_id"), 200), text(row.get("rerun_id"), 200), summary, matched,
        text(row.get("original_fingerprint")), text(row.get("rerun_fingerprint")),
        steps, divergence, facts, tuple(["as stored by the rerun (no rerun was run for this page)", *notes]),
        "matched" if matched else "diverged",
    )  # fmt: skip


@dataclass(frozen=True)
class IndexView:
    """The UI's front page: recent decisions, chains, recorded sessions and their reruns."""

    decisions: tuple[Mapping[str, str], ...] = ()
    chains: tuple[str, ...] = ()
    sessions: tuple[Mapping[str, str], ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)


INDEX_LIMIT = 50
"""Decisions listed on the UI's index (the newest)."""


def index_view(store: Store, limit: int = INDEX_LIMIT) -> IndexView:
    """The newest decisions with the gate's stored fix, their chains, and every recorded session with its reruns."""
    decisions = store.run("report_index", index_limit=limit)
    rows = tuple(
        {k: text(row.get(k), 200) for k in ("record_id", "decision_type", "agent_id", "correlation_id", "session_id",
                                            "created_at", "gate_fix")}
        for row in decisions
    )  # fmt: skip
    chains = tuple(dict.fromkeys(r["correlation_id"] for r in rows if r["correlation_id"]))
    sessions = []
    for row in store.run("rerun_compare"):
        sessions.append({
            "session_id": text(row.get("session_id"), 200),
            "recorded_at": text(row.get("recorded_at"), 64),
            "rerun_id": text(row.get("rerun_id"), 200),
            "result": "" if row.get("rerun_id") is None else ("matched" if row.get("matched") else "diverged"),
        })  # fmt: skip
    notes = (f"the newest {limit} decisions are listed; search for an older id",) if len(rows) >= limit else ()
    return IndexView(rows, chains, tuple(sessions), notes)


def session_rerun_view(store: Store, session_id: str) -> RerunView:
    """The newest stored rerun of ``session_id`` beside its recording (or the recording alone, never rerun).

    Raises :class:`~otel_replay.errors.RecordNotFound` when the session has no recording.
    """
    recording = load_recording(store, session_id)
    rows = [row for row in store.run("rerun_compare", session_id=session_id) if row.get("rerun_id")]
    if rows:
        return stored_rerun_view(rows[-1], recording)
    steps, notes = _steps(recording, None, False)
    return RerunView(
        text(session_id, 200), "", "not rerun yet", False, text(recording.fingerprint or "(none)"), "",
        tuple(RerunStep(s.seq, s.recorded, "", "not rerun") for s in steps), None,
        (Field("original fingerprint", text(recording.fingerprint or "(none: the recording ended early)")),),
        ("this session was never rerun: `otel-replay rerun` or `otel-replay report rerun --entrypoint` runs one",
         *notes), "not rerun",
    )  # fmt: skip
