"""The state of one governed session: phase, counts, forbidden tools, costs, the kill switch.

A :class:`SessionState` is the only thing the engine changes: the engine itself
(:mod:`otel_replay.contracts.engine`) holds nothing per session, so one engine
serves any number of sessions and threads. A state is saved and resumed as JSON
(:meth:`SessionState.to_json` / :meth:`SessionState.from_json`) by a store
(:mod:`otel_replay.contracts.store`); :meth:`SessionState.public` is the snapshot
safe to log (no principal, no recorded tool output values).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from otel_replay.errors import ContractError
from otel_replay.redaction import REDACTED, redact

__all__ = ["STATE_FORMAT", "SessionState", "SessionStateError", "output_digest", "whole_numbers"]

STATE_FORMAT = 2
"""The version of the JSON form :meth:`SessionState.to_json` writes; a newer one is refused, never guessed at.

2: ``satisfied_preconditions`` holds each output value's :func:`output_digest`, never the value (format 1 held
the values: read back, they are turned into their digests)."""

_NOT_FLAT = frozenset({float, dict, list, tuple})


def whole_numbers(value: Any) -> Any:
    """``value`` with each whole float as its integer (``1.0``, ``1e0`` and ``-0.0`` are the JSON numbers 1 and 0)."""
    if type(value) is float:
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        for item in value.values():
            if type(item) in _NOT_FLAT:
                return {key: whole_numbers(item) for key, item in value.items()}
        return value  # the common case: text, whole numbers, booleans: nothing to rewrite
    if isinstance(value, list | tuple):
        return [whole_numbers(item) for item in value]
    return value


_OUTPUT_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_DIGEST_PREFIX = "sha256:"


def output_digest(value: Any) -> str:
    """What the state keeps of a tool output's value at a ``with_output`` path: ``"sha256:"`` and a hex digest.

    The digest of the value's canonical JSON (keys sorted, no spaces, text unescaped, a whole number by its
    value: ``1``, ``1.0`` and ``1e0`` are one, ``true`` is not ``1``), so two values have one digest exactly when
    they are the same JSON value, and a condition's ``equals`` is checked against it. The value itself (a
    customer's e-mail, an account number) never reaches the state, its store or its file.

    Raises:
        TypeError, ValueError: the value has no JSON form (``NaN``, an object that is not JSON).

    """
    text = _OUTPUT_JSON.encode(whole_numbers(value))
    return _DIGEST_PREFIX + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class SessionStateError(ContractError, ValueError):
    """A saved session state cannot be used: corrupt, of the wrong shape, or written by a newer version."""


@dataclass
class SessionState:
    """Everything the engine knows about one session; mutable, changed only by the engine's methods.

    Counters (see :class:`otel_replay.contracts.engine.Engine` for the rule that moves each):

    * ``state_version``: +1 on every change (finalize, charge, observe, kill, restrict, widen, note_narrowing); a store
      saves a state only if nobody saved a newer version in between.
    * ``control_revision``: +1 on every manual restriction or widening (``narrowed_to``).
    * ``total_step_count``: model responses finalized (committed or rejected).
    * ``total_tool_calls`` / ``tool_call_counts``: tool calls that reached the caller (allowed), in all /
      per tool.
    * ``total_cost``: the cost of committed responses; ``actual_cost``: of every model call, blocked and
      rejected ones included (the cost cap uses this one).
    * ``forbidden_tools``: tools made illegal by an allowed call's ``forbids_after``, for the rest of the session.
    * ``satisfied_preconditions``: tool -> the values at the ``with_output`` paths of its last observed output.
    * ``output_call_ids``: tool -> the call id of its last allowed call, for tools a ``with_output`` reads (an
      output given with another call id is ignored).
    * ``total_block_count`` / ``consecutive_block_count``: calls that failed a rule; the consecutive count
      resets on a response with no failing call.
    * ``consecutive_error_count`` / ``total_error_count``: tool errors (``observe_error``); the consecutive
      count resets on a tool output (``observe_output``).
    * ``total_unguarded_calls``: calls let through unchecked because evaluating them failed and
      ``on_error="allow"``.
    * ``recent_calls``: the loop window, ``"tool:digest"`` of the last calls the model proposed.
    * ``narrowed_to``: the manual restriction (``None``: none).
    """

    session_id: str
    agent: str | None = None
    current_phase: str | None = None
    state_version: int = 0
    control_revision: int = 0
    total_step_count: int = 0
    total_tool_calls: int = 0
    total_cost: float = 0.0
    actual_cost: float = 0.0
    tool_call_counts: dict[str, int] = field(default_factory=dict)
    forbidden_tools: list[str] = field(default_factory=list)
    satisfied_preconditions: dict[str, dict[str, Any]] = field(default_factory=dict)
    output_call_ids: dict[str, str] = field(default_factory=dict)
    killed: bool = False
    killed_at: float | None = None
    kill_reason: str | None = None
    total_block_count: int = 0
    consecutive_block_count: int = 0
    consecutive_error_count: int = 0
    total_error_count: int = 0
    total_unguarded_calls: int = 0
    recent_calls: list[str] = field(default_factory=list)
    narrowed_to: list[str] | None = None
    last_step: dict[str, Any] | None = None
    last_narrowing: dict[str, Any] | None = None
    started_at: float = field(default_factory=time.time)

    def public(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot safe to log: the seed's ``getState()`` fields in snake_case.

        ``principal`` is always ``None`` (the caller's identity never leaves the session) and
        ``satisfied_preconditions`` keeps each tool's recorded paths with every value replaced by
        ``[REDACTED]`` (tool outputs can hold customer data). Tool names go through
        :func:`otel_replay.redaction.redact` (under ``unmatched_policy="allow"`` the model names the tool, and
        may echo a key it saw); counts of names that redact alike are added up. ``started_at`` is ISO 8601 in UTC.
        """
        return {
            "session_id": self.session_id,
            "agent": self.agent,
            "current_phase": self.current_phase,
            "state_version": self.state_version,
            "control_revision": self.control_revision,
            "total_step_count": self.total_step_count,
            "total_tool_calls": self.total_tool_calls,
            "total_cost": self.total_cost,
            "actual_cost": self.actual_cost,
            "tool_call_counts": _counts(self.tool_call_counts),
            "forbidden_tools": _names(self.forbidden_tools),
            "satisfied_preconditions": {
                tool: dict.fromkeys(values, REDACTED) for tool, values in self.satisfied_preconditions.items()
            },
            "killed": self.killed,
            "killed_at": self.killed_at,
            "kill_reason": self.kill_reason,
            "total_block_count": self.total_block_count,
            "consecutive_block_count": self.consecutive_block_count,
            "consecutive_error_count": self.consecutive_error_count,
            "total_error_count": self.total_error_count,
            "total_unguarded_calls": self.total_unguarded_calls,
            "narrowed_to": None if self.narrowed_to is None else _names(self.narrowed_to),
            "last_step": _redacted(self.last_step) if self.last_step is not None else None,
            "last_narrowing": _redacted(self.last_narrowing) if self.last_narrowing is not None else None,
            "started_at": datetime.fromtimestamp(self.started_at, UTC).isoformat(),
            "principal": None,
        }

    def to_json(self) -> str:
        """The whole state as JSON text (with ``"format"``), read back by :meth:`from_json`."""
        body: dict[str, Any] = {name: getattr(self, name) for name in _FIELD_NAMES}
        body["format"] = STATE_FORMAT
        return json.dumps(body, separators=(",", ":"), sort_keys=True, allow_nan=False)

    def copy(self) -> SessionState:
        """A deep, independent copy (what shadow mode evaluates on, and what a memory store hands out).

        Built field by field, not through JSON: a state holds only JSON values (texts, numbers, booleans,
        ``None``, lists and objects of them), so copying its lists and objects is copying it whole.
        """
        twin = object.__new__(SessionState)
        values = self.__dict__.copy()
        values["tool_call_counts"] = self.tool_call_counts.copy()  # text -> int
        values["output_call_ids"] = self.output_call_ids.copy()  # text -> text
        values["forbidden_tools"] = self.forbidden_tools.copy()  # texts
        values["recent_calls"] = self.recent_calls.copy()  # texts
        if self.narrowed_to is not None:
            values["narrowed_to"] = self.narrowed_to.copy()  # texts
        for name in _NESTED:
            value = values[name]
            if value:
                values[name] = _json_copy(value)
        twin.__dict__ = values
        return twin
        return twin

    @classmethod
    def from_trusted_json(cls, text: str) -> SessionState:
        """A state from text :meth:`to_json` wrote in this process (a memory store's copy), not checked again.

        Anything read from outside the process (a file, a database) goes through :meth:`from_json`.
        """
        body = json.loads(text)
        del body["format"]
        return cls(**body)

    @classmethod
    def from_json(cls, text: str | bytes, *, where: str = "session state") -> SessionState:
        """The state :meth:`to_json` wrote; ``where`` names the source in errors (a file and session).

        Raises:
            SessionStateError: the text is not JSON, a field is missing, unknown or not of its type, or the
                format is newer than this version reads (never a silent reset to a fresh state, and never a
                default in place of a missing field: an empty ``forbidden_tools`` would widen the session).

        """
        try:
            body = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise SessionStateError(f"{where}: corrupt state: not JSON ({exc})") from None
        if not isinstance(body, dict):
            raise SessionStateError(f"{where}: corrupt state: a JSON object expected, got {type(body).__name__}")
        fmt = body.pop("format", None)
        if type(fmt) is not int:
            raise SessionStateError(f"{where}: corrupt state: no integer 'format'")
        if fmt > STATE_FORMAT:
            raise SessionStateError(
                f"{where}: state format {fmt} was written by a newer otel-replay (this one reads up to "
                f"{STATE_FORMAT}); upgrade otel-replay"
            )
        if fmt < 2 and isinstance(body.get("satisfied_preconditions"), dict):
            body["satisfied_preconditions"] = _digests_of(body["satisfied_preconditions"])
        unknown = sorted(set(body) - _FIELD_SET)
        if unknown:
            raise SessionStateError(f"{where}: corrupt state: unknown field {unknown[0]!r}")
        if not isinstance(body.get("session_id"), str):
            raise SessionStateError(f"{where}: corrupt state: 'session_id' must be text")
        for name, value in body.items():
            problem = _check_field(name, value)
            if problem:
                raise SessionStateError(f"{where}: corrupt state: {name!r} {problem}")
        missing = sorted(_FORMAT_1_FIELDS - set(body))
        if missing:
            raise SessionStateError(f"{where}: corrupt state: {missing[0]!r} is missing")
        return cls(**body)


def _json_copy(value: Any) -> Any:
    """A deep copy of a JSON value (objects and lists copied, everything else shared: it does not change)."""
    if isinstance(value, dict):
        return {key: _json_copy(item) if isinstance(item, dict | list) else item for key, item in value.items()}
    if isinstance(value, list):
        return [_json_copy(item) if isinstance(item, dict | list) else item for item in value]
    return value


def _is_digest(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(_DIGEST_PREFIX) and len(value) == len(_DIGEST_PREFIX) + 64


def _digests_of(recorded: dict[str, Any]) -> Any:
    """A format-1 ``satisfied_preconditions`` (values) as format 2 has it (digests); a value without one dropped."""
    out: dict[str, Any] = {}
    for tool, values in recorded.items():
        if not isinstance(values, dict):
            return recorded  # not of the shape: the field check names it
        kept = {}
        for path, value in values.items():
            try:
                kept[path] = output_digest(value)
            except (TypeError, ValueError, RecursionError):
                continue
        out[tool] = kept
    return out


def _names(names: list[str]) -> list[str]:
    return [redact(name, personal=True) for name in names]


def _counts(counts: dict[str, int]) -> dict[str, int]:
    shown: dict[str, int] = {}
    for name, count in counts.items():
        key = redact(name, personal=True)
        shown[key] = shown.get(key, 0) + count
    return shown


def _redacted(value: Any) -> Any:
    """A JSON copy of ``value`` (a last step or narrowing: names, reasons, counts) with every text redacted."""
    if isinstance(value, str):
        return redact(value, personal=True)
    if isinstance(value, dict):
        return {redact(str(key), personal=True): _redacted(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted(item) for item in value]
    return json.loads(json.dumps(value))


_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(SessionState))
_FIELD_SET = frozenset(_FIELD_NAMES)
_NESTED: tuple[str, ...] = ("satisfied_preconditions", "last_step", "last_narrowing")
"""The fields whose objects hold other lists or objects (:meth:`SessionState.copy` copies them all the way down;
every other list or object field holds texts and numbers only)."""
_FORMAT_1_FIELDS = _FIELD_SET
"""The fields every format-1 state holds; a field added later (with a default) must not be listed here."""


def _is_int(value: Any) -> bool:
    return type(value) is int and 0 <= value < _MAX_INT


_MAX_INT = 2**63
"""Counts and versions stay below what SQLite stores as an integer (a store keeps the version in a column)."""


def _is_number(value: Any) -> bool:
    if type(value) is int:
        return 0 <= value <= _MAX_FLOAT  # a whole number past the float range cannot be a cost or a time
    return type(value) is float and math.isfinite(value) and value >= 0


_MAX_FLOAT = int(sys.float_info.max)


def _check_field(name: str, value: Any) -> str | None:
    """What is wrong with ``value`` for field ``name``, or ``None``."""
    if name in ("session_id",):
        return None
    if name in ("agent", "current_phase", "kill_reason"):
        return None if value is None or isinstance(value, str) else "must be text or null"
    if name in ("killed_at",):
        return None if value is None or _is_number(value) else "must be a number or null"
    if name == "started_at":
        return None if _is_number(value) else "must be a number"
    if name in ("total_cost", "actual_cost"):
        return None if _is_number(value) else "must be a non-negative number"
    if name == "killed":
        return None if type(value) is bool else "must be true or false"
    if name in ("tool_call_counts",):
        ok = isinstance(value, dict) and all(_is_int(v) for v in value.values())
        return None if ok else "must map tool names to counts"
    if name == "output_call_ids":
        ok = isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
        return None if ok else "must map tool names to call ids"
    if name in ("forbidden_tools", "recent_calls"):
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        return None if ok else "must be a list of text"
    if name == "narrowed_to":
        ok = value is None or (isinstance(value, list) and all(isinstance(v, str) for v in value))
        return None if ok else "must be a list of text or null"
    if name == "satisfied_preconditions":
        ok = isinstance(value, dict) and all(
            isinstance(v, dict) and all(_is_digest(d) for d in v.values()) for v in value.values()
        )
        return None if ok else "must map tool names to objects of output digests"
    if name in ("last_step", "last_narrowing"):
        return None if value is None or isinstance(value, dict) else "must be an object or null"
    return None if _is_int(value) else "must be a non-negative integer"
