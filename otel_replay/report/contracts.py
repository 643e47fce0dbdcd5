"""The view model of a contracts backtest: per session, the calls the contracts would have blocked, and why.

Built from :func:`~otel_replay.contracts.backtest.backtest`'s report (the run
``otel-replay contracts check`` makes) and the recorded sessions it ran over,
whose tool calls' arguments it shows as recorded (redacted as stored). Each
blocked call or refused model call becomes one row per failed rule, read as
``contracts check`` reads them; the session's first row is marked. Nothing
here is HTML: :mod:`otel_replay.report.html` lays it out.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from otel_replay.contracts.backtest import BacktestReport, CallResult, SessionResult
from otel_replay.contracts.decisions import Failure
from otel_replay.contracts.recorded import RecordedSession
from otel_replay.report.model import text

__all__ = [
    "MAX_ROWS",
    "MAX_SESSIONS",
    "BlockedRow",
    "ContractsView",
    "RuleCount",
    "SessionView",
    "contracts_view",
]

MAX_SESSIONS = 500
"""Sessions listed on a contracts page (those with blocked calls first); the rest are counted."""
MAX_ROWS = 200
"""Rows (blocked calls by rule) shown for one session; the rest are counted."""


@dataclass(frozen=True)
class BlockedRow:
    """One rule that blocked one call (or refused one model call) of a session."""

    step: int
    call: str
    """The call's place in its model response (0-based), or ``-`` for a refused model call."""
    tool: str
    arguments: str
    """The call's arguments as recorded (redaction as stored), cut to :data:`~otel_replay.report.model.MAX_TEXT`."""
    rule: str
    detail: str
    source: str
    """The contract file and line that wrote the rule (``file:line``), or empty."""
    first: bool = False
    """The session's first blocking row (highlighted)."""


@dataclass(frozen=True)
class RuleCount:
    """How many rows one rule of one contract file blocked."""

    contract: str
    rule: str
    count: int


@dataclass(frozen=True)
class SessionView:
    """One session under the contracts: passed or blocked, its blocked rows, its counts, its notes."""

    session_id: str
    grouped_by: str
    agent: str
    passed: bool
    summary: str
    rows: tuple[BlockedRow, ...]
    counts: tuple[RuleCount, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class ContractsView:
    """A backtest: which contracts, what was checked, the sessions (blocked first) and the counts across them."""

    contracts: str
    digest: str
    gate: str
    summary: str
    passed: bool
    sessions: tuple[SessionView, ...]
    counts: tuple[RuleCount, ...]
    notes: tuple[str, ...] = ()


def _contract(failure: Failure) -> str:
    if failure.source is None:
        return "(no contract file)"
    return text(failure.source.file, 300)


def _arguments(recorded: RecordedSession | None, call: CallResult) -> str:
    if recorded is None:
        return ""
    for step in recorded.steps:
        if step.number == call.step:
            for made in step.calls:
                if made.index == call.index:
                    if made.arguments_text is None:
                        return f"(not recorded: {text(made.missing, 200)})"
                    return text(made.arguments_text)
    return ""


def _row(step: int, call: str, tool: str, arguments: str, failure: Failure) -> BlockedRow:
    source = "" if failure.source is None else text(str(failure.source), 300)
    return BlockedRow(step, call, text(tool, 200), arguments, text(failure.rule, 80), text(failure.detail), source)


def _rows(result: SessionResult, recorded: RecordedSession | None) -> list[BlockedRow]:
    """The rows ``contracts check`` prints for ``result``: refused model calls, then each blocked call's rules."""
    rows: list[BlockedRow] = []
    refused = {step.number for step in result.refused_steps}
    for step in result.refused_steps:
        rows.extend(_row(step.number, "-", "(model call)", "", failure) for failure in step.refused)
    for call in result.blocked:
        arguments = _arguments(recorded, call)
        if call.failures and call.step not in refused:
            rows.extend(_row(call.step, str(call.index), call.tool, arguments, f) for f in call.failures)
        elif call.with_response:
            rows.append(
                BlockedRow(
                    call.step, str(call.index), text(call.tool, 200), arguments, "rejected with its response",
                    "another call of the same model response failed its rules", "",
                )
            )  # fmt: skip
    rows.sort(key=lambda row: (row.step, int(row.call) if row.call.isdigit() else -1))  # stable: rules in order
    # a call blocked by several rules: its arguments once, on its first row
    return [
        dataclasses.replace(row, arguments="(as above)")
        if n and row.arguments and (row.step, row.call) == (rows[n - 1].step, rows[n - 1].call)
        else row
        for n, row in enumerate(rows)
    ]


def _counts(pairs: Iterable[tuple[str, str]]) -> tuple[RuleCount, ...]:
    counted = Counter(pairs)
    return tuple(RuleCount(c, r, n) for (c, r), n in sorted(counted.items(), key=lambda kv: (-kv[1], kv[0])))


def _failures(result: SessionResult) -> list[tuple[str, str]]:
    refused = {step.number for step in result.refused_steps}
    pairs = [(_contract(f), f.rule) for step in result.refused_steps for f in step.refused]
    for call in result.blocked:
        if call.failures and call.step not in refused:
            pairs.extend((_contract(f), f.rule) for f in call.failures)
        elif call.with_response:
            pairs.append(("(the model response)", "rejected with its response"))
    return pairs


def _session(result: SessionResult, recorded: RecordedSession | None) -> SessionView:
    rows = _rows(result, recorded)
    notes = [text(note) for note in result.notes]
    if len(rows) > MAX_ROWS:
        notes.append(f"{MAX_ROWS} of {len(rows)} blocked rows shown (contracts check --session --json lists them all)")
    if rows:
        rows[0] = dataclasses.replace(rows[0], first=True)
    state = "passed" if result.passed else f"blocked: {len(result.blocked)} of {result.call_count} calls"
    if result.refused_steps:
        state += f", {len(result.refused_steps)} model call(s) refused"
    killed = f"; killed: {text(result.kill_reason, 300)}" if result.killed else ""
    summary = f"{state}; {len(result.steps)} steps; final phase {text(result.final_phase, 80) or '(none)'}{killed}"
    return SessionView(
        text(result.session_id, 200), result.key_kind, text(result.agent, 200), result.passed, summary,
        tuple(rows[:MAX_ROWS]), _counts(_failures(result)), tuple(notes),
    )  # fmt: skip


def contracts_view(report: BacktestReport, sessions: Sequence[RecordedSession] = ()) -> ContractsView:
    """``report`` as a page: each session's blocked calls (with their arguments from ``sessions``, when given)."""
    recorded = {s.session_id: s for s in sessions}
    ordered = sorted(report.sessions, key=lambda s: s.passed)  # blocked first, each group in the report's order
    shown = tuple(_session(s, recorded.get(s.session_id)) for s in ordered[:MAX_SESSIONS])
    blocked = sum(1 for s in report.sessions if not s.passed)
    summary = (
        f"{len(report.sessions)} session(s) checked, {blocked} would have been blocked, "
        f"{report.blocked_calls} call(s) blocked"
    )
    notes = []
    if len(report.sessions) > MAX_SESSIONS:
        notes.append(
            f"{MAX_SESSIONS} of {len(report.sessions)} sessions shown, those with blocked calls first "
            "(--session narrows the page to one)"
        )
    if not report.sessions:
        notes.append("no recorded session: no model call in this dataset carries a session or correlation id")
    counts = _counts(pair for s in report.sessions for pair in _failures(s))
    return ContractsView(
        text(str(report.contracts), 500), report.digest, report.gate, summary, report.passed, shown, counts,
        tuple(notes),
    )  # fmt: skip
