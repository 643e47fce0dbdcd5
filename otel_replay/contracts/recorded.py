"""Recorded sessions as the backtest and the drafting read them: each session's model calls and tool calls, in order.

The rows come from ``queries/contract_tool_calls.sql`` (the ``model_calls``
view's tool calls, with the result of the tool span that answered each call).
What a recording lacks is said, never guessed: a call whose arguments were not
captured (content capture off, redaction failed, or cut for length) has
``arguments`` ``None`` and a ``missing`` reason; a model call whose tool-call
list could not be read, and the calls an instrumentor did not record past its
per-response cap, are counted on the session.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from otel_replay.query.store import Store

__all__ = [
    "REDACTED",
    "RecordedCall",
    "RecordedSession",
    "RecordedStep",
    "recorded_sessions",
    "refused_calls",
    "sessions_from_rows",
]

REDACTED = "[REDACTED]"
"""What redaction writes in place of a secret (:mod:`otel_replay.redaction`)."""
_CUT = re.compile(r"…\[\d+\+ chars cut\]$")
"""The mark :func:`otel_replay.redaction.scrub` ends a text cut for length with."""


@dataclass(frozen=True)
class RecordedCall:
    """One tool call a model asked for, as recorded."""

    index: int
    """Its position in the model's response (0-based)."""
    call_id: str
    name: str
    arguments_text: str | None
    """The arguments as the model wrote them (redacted), or ``None`` when not recorded."""
    arguments: Mapping[str, Any] | None
    """The arguments parsed, or ``None`` when they were not recorded or are not a JSON object."""
    missing: str | None
    """Why the arguments are unknown (``None``: recorded); malformed arguments are recorded, not missing, unless
    redaction is what broke them (a secret replaced by a bare ``[REDACTED]``)."""
    output: Any
    """The tool's result as its span recorded it (parsed when it is JSON), or ``None``."""
    output_recorded: bool
    failed: bool
    """The tool span that answered the call ended in an error."""
    side_effect: str | None
    executions: int
    """How many tool spans answered this call id (0: the tool was not traced, or never ran)."""
    refused: bool = False
    """A governed session's enforcing decision refused the call (it never reached the agent): matched by the
    session and the call id with the ``contract_decisions`` view."""


@dataclass(frozen=True)
class RecordedStep:
    """One model call of a session: its place, its model and usage, and the tool calls it asked for."""

    number: int
    """1-based, in the order the model calls started."""
    model: str | None
    usage: tuple[int, int] | None
    calls: tuple[RecordedCall, ...]
    trace_id: str | None
    span_id: str | None
    started_at: Any
    unreadable: bool = False
    """The span's tool-call list is not a JSON array (its calls are unknown)."""
    dropped_calls: int = 0
    """Tool calls past the instrumentor's per-response cap (counted, not recorded)."""


@dataclass(frozen=True)
class RecordedSession:
    """One session: its id (a session id, or a correlation id when the spans carry no session id) and steps."""

    session_id: str
    key_kind: str
    """``"session"`` or ``"correlation"``: which id groups the session."""
    agent: str | None
    steps: tuple[RecordedStep, ...]

    @property
    def calls(self) -> tuple[RecordedCall, ...]:
        """Every tool call of the session, in order."""
        return tuple(call for step in self.steps for call in step.calls)

    @property
    def unrecorded_calls(self) -> int:
        """Calls known to have happened whose name and arguments were not recorded."""
        return sum(step.dropped_calls for step in self.steps)


def recorded_sessions(store: Store, session_id: str | None = None) -> list[RecordedSession]:
    """The recorded sessions of ``store`` (or only ``session_id``), each with its steps in order.

    A call an enforcing ``govern()`` decision refused is marked :attr:`RecordedCall.refused`.
    """
    return sessions_from_rows(store.run("contract_tool_calls", session_id=session_id), refused_calls(store))


def refused_calls(store: Store) -> frozenset[tuple[str, str]]:
    """``(session id, call id)`` of every tool call an enforcing decision refused, from ``contract_decisions``.

    A decision's ``tools`` that are not a JSON list, and entries without a text call id, are skipped.
    """
    rows = store.rows("SELECT session_id, tools FROM contract_decisions WHERE mode = 'enforce' AND blocked_calls > 0")
    refused: set[tuple[str, str]] = set()
    for row in rows:
        try:
            tools = json.loads(row["tools"] or "null")
        except (ValueError, RecursionError):
            continue
        if not isinstance(tools, list) or not isinstance(row["session_id"], str):
            continue
        for entry in tools:
            if isinstance(entry, dict) and entry.get("allowed") is False and isinstance(entry.get("call_id"), str):
                if entry["call_id"]:
                    refused.add((row["session_id"], entry["call_id"]))
    return frozenset(refused)


def sessions_from_rows(
    rows: Iterable[Mapping[str, Any]], refused: frozenset[tuple[str, str]] = frozenset()
) -> list[RecordedSession]:
    """Group the rows of ``contract_tool_calls.sql`` (ordered by session, step, call) into sessions.

    ``refused``: the ``(session id, call id)`` pairs of calls a governed session refused (:func:`refused_calls`).
    """
    sessions: list[RecordedSession] = []
    current: list[Mapping[str, Any]] = []
    for row in rows:
        if current and row["session_id"] != current[0]["session_id"]:
            sessions.append(_session(current, refused))
            current = []
        current.append(row)
    if current:
        sessions.append(_session(current, refused))
    return sessions


def _session(rows: list[Mapping[str, Any]], refused: frozenset[tuple[str, str]]) -> RecordedSession:
    steps: list[RecordedStep] = []
    agents = {row["agent_id"] or row["agent_name"] for row in rows} - {None}
    by_step: dict[int, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_step.setdefault(int(row["step"]), []).append(row)
    for number, step_rows in by_step.items():
        first = step_rows[0]
        usage = None
        if isinstance(first["input_tokens"], int) and isinstance(first["output_tokens"], int):
            usage = (first["input_tokens"], first["output_tokens"])
        calls = tuple(_call(row, refused) for row in step_rows if row["call_index"] is not None)
        steps.append(
            RecordedStep(
                number=number,
                model=first["model"],  # the model asked for, as the price table names it (not the dated reply)
                usage=usage,
                calls=calls,
                trace_id=first["trace_id"],
                span_id=first["span_id"],
                started_at=first["start_time"],
                unreadable=bool(first["tool_calls_unreadable"]),
                dropped_calls=int(first["dropped_calls"] or 0),
            )
        )
    return RecordedSession(
        session_id=str(rows[0]["session_id"]),
        key_kind=str(rows[0]["session_key_kind"]),
        agent=sorted(agents)[0] if len(agents) == 1 else None,
        steps=tuple(steps),
    )


def _call(row: Mapping[str, Any], refused: frozenset[tuple[str, str]]) -> RecordedCall:
    text = row["arguments"] if row["arguments_recorded"] else None
    missing = None
    if text is None:
        missing = "arguments not recorded (content capture was off, or redaction failed)"
    elif _CUT.search(text):
        text, missing = None, "arguments cut for length when recorded"
    arguments = None
    if text is not None:
        try:
            parsed = json.loads(text)
        except (ValueError, RecursionError):
            parsed = None
            if REDACTED in text:  # redaction replaced a value with a bare marker: the model's JSON was not kept
                text, missing = None, "arguments redacted when recorded (no longer JSON)"
        arguments = parsed if isinstance(parsed, dict) else None
    output = row["tool_result"]
    if isinstance(output, str):
        try:
            output = json.loads(output)
        except (ValueError, RecursionError):
            pass  # a tool may return plain text: kept as it was recorded
    return RecordedCall(
        index=int(row["call_index"]),
        call_id=str(row["call_id"] or ""),
        name=str(row["tool"] or ""),
        arguments_text=text,
        arguments=arguments,
        missing=missing,
        output=output,
        output_recorded=row["tool_result"] is not None,
        failed=bool(row["tool_failed"]),
        side_effect=row["side_effect"],
        executions=int(row["executions"] or 0),
        refused=(str(row["session_id"]), str(row["call_id"] or "")) in refused,
    )
