"""Draft contracts from recorded sessions: what the agent was seen to do, written as YAML a person reviews.

:func:`infer_contracts` reads :class:`~otel_replay.contracts.recorded.RecordedSession` values and
drafts one file per tool plus ``session.yaml``:

- **phases** from the observed order of tools: a tool no session called twice is a milestone; the
  session starts in ``start`` and each milestone moves it to ``after_<tool>``. Every tool is valid in
  the phases it was called in, and the transitions are the moves observed.
- **forbids_after**: a tool never called twice in a session forbids itself after its call (the
  double-refund rule).
- **preconditions**: a milestone called before a tool's first call in every session that called
  the tool; with ``with_output`` for a boolean its recorded result had the same value each time.
- **argument ranges and patterns**: numbers get bounds widened by the margin; strings that share
  one shape (letters, digits, the punctuation between them) get an anchored pattern, other strings
  a maximum length; an argument missing from some calls is optional.
- **limits** from what was observed, with the margin: steps, tool calls, calls per repeated tool,
  and loop detection above the most identical calls seen.

Only calls that reached the agent are drawn from: a call a governed session refused
(:attr:`~otel_replay.contracts.recorded.RecordedCall.refused`) is evidence of what not to allow, and is left
out (its model call still counts as a step); the notes say how many.

Every rule carries a comment with how many sessions (or calls) support it. The drafts hold for the
sessions they were drawn from, so ``otel-replay contracts check`` on the same data passes; a session
that departs from them (a second refund, an amount out of range, a step out of order) is flagged.
Nothing is inferred from what was not recorded: redacted values, arguments captured without content
capture, costs (they need a price table).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from otel_replay.contracts._read import TOOL_NAME
from otel_replay.contracts.recorded import REDACTED, RecordedCall, RecordedSession
from otel_replay.errors import ContractError

__all__ = ["DEFAULT_MARGIN", "LOOP_WINDOW", "Draft", "infer_contracts", "write_draft"]

DEFAULT_MARGIN = 0.25
"""How far drafted limits and ranges reach beyond what was observed (a quarter of it)."""
LOOP_WINDOW = 10
"""The window of the drafted loop detection (calls)."""
_MEMBER = re.compile(r"[A-Za-z0-9_-]+")  # a member a path spells as .name (paths.py); others as ["name"]
_EXACT = 10**15  # numbers below this are written as they are; larger ones as floats with an exponent
_MAX_SHAPE_RUNS = 8  # a string of more runs than this is free text: a length, not a pattern


@dataclass(frozen=True)
class Draft:
    """Drafted contract files (file name -> YAML text), and what the drafting left out and why."""

    files: Mapping[str, str]
    sessions: int
    notes: tuple[str, ...] = ()


@dataclass
class _Tool:
    """What was seen of one tool across the sessions."""

    name: str
    sessions: int = 0
    calls: int = 0
    max_per_session: int = 0
    phases: Counter[str] = field(default_factory=Counter)
    side_effects: set[str] = field(default_factory=set)
    argument_calls: list[Mapping[str, Any]] = field(default_factory=list)
    argument_sessions: set[str] = field(default_factory=set)
    before: list[set[str]] = field(default_factory=list)  # per session calling it: milestones called earlier
    prior_outputs: list[dict[str, Any]] = field(default_factory=list)  # per such session: milestone -> its output


def infer_contracts(
    sessions: Sequence[RecordedSession], *, margin: float = DEFAULT_MARGIN, agent: str | None = None
) -> Draft:
    """Draft contracts that every one of ``sessions`` satisfies; see the module docstring.

    Raises:
        ContractError: no session holds a tool call (there is nothing to draft from), or ``margin`` is negative.

    """
    if not math.isfinite(margin) or margin < 0:
        raise ContractError(f"the margin must be a number >= 0, got {margin!r}")
    notes: list[str] = []
    sessions = _allowed_only(sessions, notes)
    calling = [s for s in sessions if any(c.name for c in s.calls)]
    if not calling:
        raise ContractError(
            f"none of the {len(sessions)} recorded sessions holds a tool call that was not refused: "
            "nothing to draft from"
        )
    tools = _observe(sessions, notes)
    folded: set[str] = set()
    for name in sorted(tools):
        if not TOOL_NAME.fullmatch(name) or name == "session":
            notes.append(f"tool {name[:80]!r}: not a name a contract can have (letters, digits, _ and -): no draft")
            del tools[name]
        elif name.lower() in folded:  # a file system that ignores case could not hold both files
            notes.append(f"tool {name!r}: another tool's name differs only in case: no draft")
            del tools[name]
        else:
            folded.add(name.lower())
    milestones = sorted(t.name for t in tools.values() if t.max_per_session == 1)
    phase_of = _phase_names(milestones)
    transitions = _walk(sessions, tools, phase_of)
    files: dict[str, str] = {}
    for name in sorted(tools):
        files[f"{name}.yaml"] = _tool_yaml(tools[name], phase_of, margin, bool(milestones), notes)
    agents = {s.agent for s in sessions} - {None}
    files["session.yaml"] = _session_yaml(
        sessions, tools, phase_of, transitions, margin, agent or (agents.pop() if len(agents) == 1 else None), notes
    )
    return Draft(files=files, sessions=len(sessions), notes=tuple(notes))


def write_draft(draft: Draft, out: str | os.PathLike[str], *, force: bool = False) -> list[Path]:
    """Write ``draft``'s files into directory ``out`` (made if missing); the paths written.

    Refuses (before writing anything) when ``out`` is a file, or when a file it would write exists and
    ``force`` is not set. Each file is written whole or not at all (a temporary file renamed into place).

    Raises:
        ContractError: ``out`` is not a directory, or a file exists and ``force`` is not set.

    """
    directory = Path(out)
    if directory.exists() and not directory.is_dir():
        raise ContractError(f"--out {directory} is a file, not a directory")
    existing = sorted(name for name in draft.files if (directory / name).exists())
    if existing and not force:
        shown = ", ".join(existing[:3]) + (f" and {len(existing) - 3} more" if len(existing) > 3 else "")
        raise ContractError(f"{directory} already holds {shown}: not overwritten (pass --force to replace them)")
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in sorted(draft.files.items()):
        target = directory / name
        if target.is_dir():
            raise ContractError(f"{target} is a directory: cannot write the draft of that name there")
        temporary = directory / f".{name}.{os.getpid()}.tmp"
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, target)
        written.append(target)
    return written


# --- observing -------------------------------------------------------------------------------------


def _allowed_only(sessions: Sequence[RecordedSession], notes: list[str]) -> list[RecordedSession]:
    """The sessions with every call a governed session refused left out (their steps kept); counted in ``notes``."""
    kept: list[RecordedSession] = []
    refused = 0
    for session in sessions:
        if not any(call.refused for call in session.calls):
            kept.append(session)
            continue
        steps = []
        for step in session.steps:
            calls = tuple(call for call in step.calls if not call.refused)
            refused += len(step.calls) - len(calls)
            steps.append(replace(step, calls=calls))
        kept.append(replace(session, steps=tuple(steps)))
    if refused:
        notes.append(
            f"{refused} tool calls refused by governance were left out: a draft describes what was allowed to run"
        )
    return kept


def _observe(sessions: Sequence[RecordedSession], notes: list[str]) -> dict[str, _Tool]:
    tools: dict[str, _Tool] = {}
    unrecorded = 0
    for session in sessions:
        counts: Counter[str] = Counter()
        for call in session.calls:
            if not call.name:
                continue
            tool = tools.setdefault(call.name, _Tool(call.name))
            counts[call.name] += 1
            tool.calls += 1
            if call.side_effect:
                tool.side_effects.add(call.side_effect)
            if call.arguments is not None:
                tool.argument_calls.append(call.arguments)
                tool.argument_sessions.add(session.session_id)
            elif call.missing:
                unrecorded += 1
        for name, count in counts.items():
            tools[name].sessions += 1
            tools[name].max_per_session = max(tools[name].max_per_session, count)
        if session.unrecorded_calls:
            notes.append(
                f"session {session.session_id}: {session.unrecorded_calls} tool calls were not recorded "
                "(past the instrumentor's per-response cap); the draft does not know them"
            )
    if unrecorded:
        notes.append(
            f"{unrecorded} tool calls have no recorded arguments (content capture was off, or they were cut): "
            "no argument rule is drawn from them"
        )
    return tools


def _phase_names(milestones: Sequence[str]) -> dict[str, str]:
    """Milestone tool -> the phase its call moves the session to (``after_<tool>``, made unique)."""
    names: dict[str, str] = {}
    taken = {"start"}
    for tool in milestones:
        base = "after_" + (re.sub(r"[^A-Za-z0-9_]+", "_", tool).strip("_") or "tool")
        name, n = base, 2
        while name in taken:
            name, n = f"{base}_{n}", n + 1
        taken.add(name)
        names[tool] = name
    return names


def _walk(
    sessions: Sequence[RecordedSession], tools: dict[str, _Tool], phase_of: Mapping[str, str]
) -> dict[str, Counter[str]]:
    """Replay each session's calls through the drafted phases: where each tool was called, the moves made."""
    transitions: dict[str, Counter[str]] = defaultdict(Counter)
    for session in sessions:
        phase = "start"
        earlier: dict[str, Any] = {}  # milestone -> its output (None when not recorded)
        first_seen: set[str] = set()
        for call in session.calls:
            if call.name not in tools:  # no name, or one no contract can have
                continue
            tool = tools[call.name]
            tool.phases[phase] += 1
            if call.name not in first_seen:
                first_seen.add(call.name)
                tool.before.append(set(earlier))
                tool.prior_outputs.append(dict(earlier))
            if call.name in phase_of:
                moved = phase_of[call.name]
                transitions[phase][moved] += 1
                phase = moved
                earlier[call.name] = call.output if call.output_recorded else None
    return transitions


# --- tool files ------------------------------------------------------------------------------------


def _tool_yaml(tool: _Tool, phase_of: Mapping[str, str], margin: float, phased: bool, notes: list[str]) -> str:
    lines = [
        f"# Drafted by `otel-replay contracts infer` from {tool.calls} calls of {_q(tool.name)} "
        f"in {_n(tool.sessions, 'session')}. Review every rule before use.",
        f"tool: {_q(tool.name)}",
    ]
    if len(tool.side_effects) == 1:
        lines.append(f"side_effect: {_q(next(iter(tool.side_effects)))}  # as its tool spans recorded it")
    else:
        seen = ", ".join(sorted(tool.side_effects)) or "none recorded"
        lines.append(f"# side_effect: set it (read, write, destructive, admin or financial); recorded: {seen}")
    if phased:
        lines.append("transitions:")
        phases = sorted(tool.phases)
        lines.append(f"  valid_in_phases: {_flow(phases)}  # where it was called ({tool.calls} calls)")
        if tool.name in phase_of:
            once = f"called at most once in each of its {_n(tool.sessions, 'session')}"
            lines.append(f"  advances_to: {_q(phase_of[tool.name])}  # {once}")
    lines += _preconditions(tool, phase_of)
    if tool.max_per_session == 1:
        lines.append(
            f"forbids_after: [{_q(tool.name)}]  # never called twice in a session ({_n(tool.sessions, 'session')})"
        )
    lines += _invariants(tool, margin, notes)
    return "\n".join(lines) + "\n"


def _preconditions(tool: _Tool, phase_of: Mapping[str, str]) -> list[str]:
    always = set.intersection(*tool.before) if tool.before else set()
    always &= set(phase_of)
    always.discard(tool.name)
    if not always:
        return []
    lines = ["preconditions:"]
    for prior in sorted(always):
        lines.append(
            f"  - requires_prior_tool: {_q(prior)}  # called before it in {len(tool.before)} of "
            f"{_n(len(tool.before), 'session')}"
        )
        conditions = _common_flags([outputs.get(prior) for outputs in tool.prior_outputs])
        if conditions:
            lines.append("    with_output:")
            for key, value in conditions:
                lines.append(f"      - path: {_q(_path(key))}")
                lines.append(
                    f"        equals: {_scalar(value)}  # its result in {_n(len(tool.prior_outputs), 'session')}"
                )
    return lines


def _common_flags(outputs: Sequence[Any]) -> list[tuple[str, bool]]:
    """Top-level boolean fields every one of ``outputs`` has, with the same value each time."""
    if not outputs or not all(isinstance(o, dict) for o in outputs):
        return []
    keys = set.intersection(*(set(o) for o in outputs))
    found = []
    for key in sorted(keys):
        values = {o[key] for o in outputs if isinstance(o[key], bool)}
        if len(values) == 1 and all(isinstance(o[key], bool) for o in outputs):
            found.append((key, values.pop()))
    return found


def _invariants(tool: _Tool, margin: float, notes: list[str]) -> list[str]:
    calls = tool.argument_calls
    if not calls:
        return []
    support = f"{_n(len(calls), 'call')} in {_n(len(tool.argument_sessions), 'session')}"
    rules: list[str] = []
    keys = sorted({key for arguments in calls for key in arguments})
    for key in keys:
        values = [arguments[key] for arguments in calls if key in arguments]
        if any(isinstance(v, str) and REDACTED in v for v in values):
            notes.append(f"{tool.name}: argument {key!r} was redacted when recorded: no rule drafted for it")
            continue
        body = _rule_for(values, margin)
        if body is None:
            continue
        optional = len(values) < len(calls)
        head = f"  - path: {_q(_path(key))}  # {_summary(values)}; {len(values)} of {support}"
        rules.append(head)
        rules += [f"    {line}" for line in body]
        if optional:
            rules.append("    optional: true  # missing from some calls")
    return ["argument_value_invariants:", *rules] if rules else []


def _rule_for(values: Sequence[Any], margin: float) -> list[str] | None:
    if all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        low, high = min(values), max(values)
        reach = margin * max(abs(low), abs(high), high - low) or margin or 1
        lower, upper = low - reach, high + reach
        if low >= 0:
            lower = max(0, lower)
        if all(isinstance(v, int) for v in values) and max(abs(lower), abs(upper)) < _EXACT:
            lower, upper = math.floor(lower), math.ceil(upper)
        elif max(abs(lower), abs(upper)) < _EXACT:  # six decimals, rounded outwards: still around every value seen
            lower, upper = math.floor(lower * 1e6) / 1e6, math.ceil(upper * 1e6) / 1e6
        bounds = [f"gte: {_number(lower)}"] if math.isfinite(lower) else []
        return bounds + ([f"lte: {_number(upper)}"] if math.isfinite(upper) else []) or None
    if all(isinstance(v, str) for v in values):
        pattern = _pattern(values)
        if pattern is not None:
            return [f"regex: {_q(pattern)}"]
        longest = max(len(v) for v in values)
        return [f"max_length: {max(longest + 1, math.ceil(longest * (1 + margin)))}"]
    return None


def _summary(values: Sequence[Any]) -> str:
    if all(isinstance(v, str) for v in values):
        return f"distinct values: {len(set(values))}"
    return f"from {_number(min(values))} to {_number(max(values))}"


def _pattern(values: Sequence[str]) -> str | None:
    """An anchored pattern every value matches: the finest shape they share, or ``None``."""
    for coarse in (False, True):
        shapes = {_shape(v, coarse) for v in values}
        if len(shapes) == 1:
            shape = shapes.pop()
            if 0 < len(shape) <= _MAX_SHAPE_RUNS:
                return "^" + "".join(_run(part) for part in shape) + "$"
    return None


_CLASSES = {"A": "[A-Z]+", "a": "[a-z]+", "9": "[0-9]+", "w": "[A-Za-z0-9]+"}


def _shape(value: str, coarse: bool) -> tuple[str, ...]:
    """``value`` as runs: ``A`` upper, ``a`` lower, ``9`` digits (``w`` any of them when coarse), else the character."""
    runs: list[str] = []
    for char in value:
        if char.isascii() and char.isalnum():
            kind = "w" if coarse else ("9" if char.isdigit() else "A" if char.isupper() else "a")
            if not runs or runs[-1] != kind:
                runs.append(kind)
        else:
            runs.append("\\" + char)
    return tuple(runs)


_SPECIAL = frozenset(".^$*+?{}[]\\|()")


def _run(part: str) -> str:
    if part in _CLASSES:
        return _CLASSES[part]
    char = part[1:]
    return "\\" + char if char in _SPECIAL else re.escape(char) if not char.isprintable() else char


# --- session.yaml ----------------------------------------------------------------------------------


def _session_yaml(
    sessions: Sequence[RecordedSession],
    tools: Mapping[str, _Tool],
    phase_of: Mapping[str, str],
    transitions: Mapping[str, Counter[str]],
    margin: float,
    agent: str | None,
    notes: list[str],
) -> str:
    count = len(sessions)
    lines = [
        f"# Drafted by `otel-replay contracts infer` from {count} recorded sessions. Review every rule before use.",
        'schema_version: "1.0"',
    ]
    if agent:
        lines.append(f"agent: {_q(agent)}")
    if phase_of:
        lines.append("phases:")
        lines.append("  - name: start  # where every session begins")
        lines.append("    initial: true")
        for tool, phase in sorted(phase_of.items(), key=lambda item: item[1]):
            lines.append(f"  - name: {_q(phase)}  # after {_q(tool)} ({_n(tools[tool].sessions, 'session')})")
        lines.append("transitions:")
        for source in ["start", *sorted(phase_of.values())]:
            moves = transitions.get(source)
            if moves:
                total = sum(moves.values())
                lines.append(f"  {_q(source)}: {_flow(sorted(moves))}  # {total} moves observed")
    steps = max(len(s.steps) for s in sessions)
    calls = max(len(s.calls) for s in sessions)
    lines.append("session_limits:")
    lines.append(
        f"  max_steps: {_limit(steps, margin)}  # at most {steps} model calls in a session ({_n(count, 'session')})"
    )
    lines.append(f"  max_tool_calls: {_limit(calls, margin)}  # at most {calls} tool calls in a session")
    repeated = {name: t for name, t in tools.items() if t.max_per_session > 1}
    if repeated:
        lines.append("  max_calls_per_tool:")
        for name, seen in sorted(repeated.items()):
            lines.append(
                f"    {_q(name)}: {_limit(seen.max_per_session, margin)}  # at most {seen.max_per_session} "
                f"in one session ({_n(seen.sessions, 'session')})"
            )
    loops = _most_identical(sessions)
    if loops is not None:
        lines.append("  loop_detection:")
        lines.append(f"    window: {LOOP_WINDOW}")
        lines.append(f"    threshold: {loops + 2}  # at most {loops} identical calls seen within {LOOP_WINDOW}")
    else:
        notes.append("no tool call arguments were recorded: loop detection not drafted")
    lines.append("# max_cost_per_session: not drafted (it needs your price table under `prices`)")
    return "\n".join(lines) + "\n"


def _most_identical(sessions: Iterable[RecordedSession]) -> int | None:
    """The most identical calls (same tool, same arguments) seen within any window of :data:`LOOP_WINDOW` calls."""
    most: int | None = None
    for session in sessions:
        keys = [_identity(c) for c in session.calls if c.name]
        for end in range(len(keys)):
            window = [k for k in keys[max(0, end - LOOP_WINDOW + 1) : end + 1] if k is not None]
            if window:
                top = Counter(window).most_common(1)[0][1]
                most = top if most is None else max(most, top)
    return most


def _identity(call: RecordedCall) -> str | None:
    if call.arguments is None:
        return None
    return call.name + ":" + json.dumps(call.arguments, sort_keys=True, default=str)


# --- YAML text -------------------------------------------------------------------------------------


def _path(key: str) -> str:
    """The ``$`` path of a top-level member (see :mod:`otel_replay.contracts.paths`)."""
    if _MEMBER.fullmatch(key):
        return "$." + key
    return '$["' + key.replace("\\", "\\\\").replace('"', '\\"') + '"]'


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _limit(observed: int, margin: float) -> int:
    return max(observed + 1, math.ceil(observed * (1 + margin)))


def _q(text: str) -> str:
    """``text`` as a YAML double-quoted scalar (JSON's escaping is YAML's)."""
    return json.dumps(text, ensure_ascii=True)


def _flow(items: Sequence[str]) -> str:
    return "[" + ", ".join(_q(item) for item in items) + "]"


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return _number(value)
    return _q(str(value))


def _number(value: float) -> str:
    """A number YAML reads back as the same number: an integer, or a float with a point (and a signed exponent)."""
    if abs(value) < _EXACT and (isinstance(value, int) or float(value).is_integer()):
        return str(int(value))
    if abs(value) < _EXACT:
        text = f"{value:.6f}".rstrip("0")
        return text + "0" if text.endswith(".") else text
    mantissa, _, exponent = repr(float(value)).partition("e")
    mantissa = mantissa if "." in mantissa else mantissa + ".0"
    return f"{mantissa}e{exponent}" if exponent else mantissa
