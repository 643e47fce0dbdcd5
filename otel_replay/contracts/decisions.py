"""What the engine decides, as values: a call, its failures and verdict, a narrowing, a decision.

A tool call as the engine sees it (:class:`ToolCallView`), why it failed (:class:`Failure`), its verdict
(:class:`CallVerdict`), the tools removed before a model call (:class:`Narrowing`) and the decision on one
model response (:class:`Decision`).

All frozen: a :class:`Decision` is handed to callbacks, put in a :class:`~otel_replay.errors.ReplayContractError`,
and written as evidence, and nobody may change it on the way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from otel_replay.contracts.model import Source

__all__ = [
    "GATE_MODES",
    "ON_ERROR",
    "OUTCOMES",
    "RULES",
    "UNMATCHED_POLICIES",
    "CallVerdict",
    "Decision",
    "Failure",
    "Narrowing",
    "ToolCallView",
    "parse_arguments",
    "strict_json",
]

GATE_MODES: Final = ("reject_all", "strip_partial", "strip_blocked")
UNMATCHED_POLICIES: Final = ("block", "allow")
ON_ERROR: Final = ("block", "allow")
OUTCOMES: Final = ("allow", "reject", "strip", "text_only")
"""What the gate made of a response; a decision span can also say ``logged`` (log-only mode) or ``unguarded`` (its
response could not be governed and ``on_error="allow"`` let it through)."""
RULES: Final = (
    "kill",
    "max_steps",
    "max_cost",
    "max_tool_calls",
    "max_calls_per_tool",
    "loop",
    "unmatched",
    "narrowed",
    "malformed_arguments",
    "argument_invariant",
    "precondition",
    "forbidden",
    "phase",
    "tool_error",
    "internal_error",
)
"""Every ``Failure.rule``. ``narrowed``: a call of a tool outside a manual :meth:`Engine.restrict`;
``internal_error``: evaluating the call failed and ``on_error="block"``; ``tool_error``: for a tool
executor's own error (the session's wrapped tools report it)."""


def _strict_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("a key is given twice in one object")
    return obj


def strict_json(text: str | bytes | bytearray) -> Any:
    """``json.loads`` refusing ``NaN`` and ``Infinity``, which JSON does not have, and a key given twice in one object.

    Both raise :class:`ValueError`. Parsers disagree on which copy of a duplicate key wins (the first or the
    last), so the copy a contract checks could differ from the one the tool reads: such text is not accepted.
    """
    if isinstance(text, bytes | bytearray):  # as json.loads reads bytes: UTF-8, -16 or -32 by their first bytes
        text = text.decode(json.detect_encoding(text), "surrogatepass")
    elif not isinstance(text, str):
        raise TypeError(f"JSON text must be str, bytes or bytearray, not {type(text).__name__}")
    if text.startswith("\ufeff"):
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    return _STRICT.decode(text)


_STRICT = json.JSONDecoder(parse_constant=_strict_constant, object_pairs_hook=_unique_keys)
"""Made once: ``json.loads`` with options builds a decoder per call, a fifth of the time of a small object."""


def parse_arguments(text: str) -> Mapping[str, Any] | None:
    """A tool call's arguments text as a JSON object, or ``None`` when it is not one.

    ``None``: not JSON, not an object, ``NaN`` or ``Infinity`` in it, a key given twice in one object (see
    :func:`strict_json`), or nested too deep to read. Never raises.
    """
    if not isinstance(text, str | bytes | bytearray):
        return None
    try:
        value = strict_json(text)
    except (ValueError, RecursionError, TypeError):
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class ToolCallView:
    """One tool call of a model response, provider-neutral.

    ``arguments`` is the parsed object, ``None`` when ``arguments_text`` is not a JSON object (the call then
    fails ``malformed_arguments``). :meth:`parse` builds one from the text.
    """

    index: int
    call_id: str
    name: str
    arguments_text: str
    arguments: Mapping[str, Any] | None

    @classmethod
    def parse(cls, index: int, call_id: str, name: str, arguments_text: str) -> ToolCallView:
        """A view with ``arguments`` parsed by :func:`parse_arguments` (an empty text is ``{}``)."""
        text = arguments_text if isinstance(arguments_text, str) else str(arguments_text)
        arguments = {} if text.strip() == "" else parse_arguments(text)
        return cls(index, call_id, name, text, arguments)


@dataclass(frozen=True)
class Failure:
    """Why one call (or the model call, for a pre-check) was blocked.

    ``rule`` is one of :data:`RULES`; ``detail`` one line that names numbers, paths, tools and phases but
    never text argument values, passed through :func:`otel_replay.redaction.redact`; ``source`` the
    contract file and line of the rule.
    """

    rule: str
    detail: str
    tool: str | None = None
    call_id: str | None = None
    path: str | None = None
    source: Source | None = None

    def as_dict(self) -> dict[str, Any]:
        """The failure as JSON-ready values (``source`` as ``"file:line"``)."""
        return {
            "rule": self.rule,
            "tool": self.tool,
            "call_id": self.call_id,
            "path": self.path,
            "detail": self.detail,
            "source": None if self.source is None else str(self.source),
        }


@dataclass(frozen=True)
class CallVerdict:
    """The verdict on one call: ``allowed`` when no rule failed.

    ``escalated``: it failed and its tool's effective gate is ``block``, so the whole response is
    rejected whatever the gate mode. ``unguarded``: evaluating it raised and ``on_error="allow"`` let it
    through unchecked. ``digest``: ``"tool:hash"`` of the tool and its canonical arguments (loop detection; empty
    when the session has none).
    """

    call: ToolCallView
    allowed: bool
    failures: tuple[Failure, ...]
    escalated: bool
    unguarded: bool = False
    digest: str = ""


@dataclass(frozen=True)
class Narrowing:
    """The tools ``offered`` to the model, those ``kept``, and each one ``removed`` with the reason."""

    offered: tuple[str, ...]
    kept: tuple[str, ...]
    removed: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The narrowing as JSON-ready values."""
        return {"offered": list(self.offered), "kept": list(self.kept), "removed": dict(self.removed)}


@dataclass(frozen=True)
class Decision:
    """The engine's decision on one model response.

    ``outcome``: ``allow`` (every call passed), ``reject`` (raise :class:`~otel_replay.errors.ReplayContractError`;
    nothing reaches the caller), ``strip`` (the allowed calls reach the caller, the blocked ones are removed),
    ``text_only`` (every call removed, the text kept). ``failures`` are all the verdicts' failures in order.
    ``phase_after`` is the phase once the decision is finalized; ``state_version`` the version of the state it
    was evaluated on (:meth:`Engine.finalize` refuses it on any other).
    """

    step: int
    verdicts: tuple[CallVerdict, ...]
    outcome: str
    failures: tuple[Failure, ...]
    phase_before: str | None
    phase_after: str | None
    state_version: int

    @property
    def allowed(self) -> tuple[CallVerdict, ...]:
        """The calls that reach the caller: the passing ones, none when the outcome is ``reject``."""
        if self.outcome == "reject":
            return ()
        return tuple(v for v in self.verdicts if v.allowed)

    @property
    def blocked(self) -> tuple[CallVerdict, ...]:
        """The calls that failed a rule (under ``reject`` the passing ones do not run either)."""
        return tuple(v for v in self.verdicts if not v.allowed)
