"""The backtest: recorded sessions' tool calls run through contracts offline, and each call they would have blocked.

Each session is run through a fresh :class:`~otel_replay.contracts.engine.Engine` state exactly as
``govern()`` runs a live one: before each recorded model call the pre-check (kill, ``max_steps``, the
cost cap), then the response's tool calls evaluated and the decision finalized, then each allowed
call's recorded result (or error) observed for the ``with_output`` conditions and the circuit breaker.
A call the contracts block does not happen in the simulation either: it does not advance the phase or
count, so what follows is judged as a governed session would have been.

What a recording lacks is not held against the agent, and is said: a call whose arguments were not
recorded (content capture off, or cut for length) has its argument rules and loop detection left out
for its step; an argument redacted in the recording (``[REDACTED]``) has the rules at its path left
out; a ``with_output`` condition on a tool whose result was not recorded is left out. Each such call
lists what was not checked, and the session says so in its notes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_replay.contracts.decisions import Decision, Failure, ToolCallView
from otel_replay.contracts.engine import Engine
from otel_replay.contracts.model import ContractSet, SessionLimits, ToolContract
from otel_replay.contracts.paths import read_path
from otel_replay.contracts.recorded import REDACTED, RecordedCall, RecordedSession, RecordedStep, recorded_sessions
from otel_replay.contracts.state import SessionState
from otel_replay.query.store import Store

__all__ = ["BacktestReport", "CallResult", "SessionResult", "StepResult", "backtest", "backtest_dataset"]


@dataclass(frozen=True)
class CallResult:
    """One recorded tool call and what the contracts would have done with it."""

    step: int
    index: int
    call_id: str
    tool: str
    allowed: bool
    """Whether the call would have reached the agent."""
    failures: tuple[Failure, ...]
    """Why it was blocked: its own failed rules, or the step's pre-check failures."""
    with_response: bool = False
    """It passed its own rules but the whole response was rejected (another call failed)."""
    unchecked: tuple[str, ...] = ()
    """What could not be checked for it, from what the recording lacks."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready values."""
        return {
            "step": self.step,
            "index": self.index,
            "call_id": self.call_id,
            "tool": self.tool,
            "allowed": self.allowed,
            "rejected_with_response": self.with_response,
            "failures": [f.as_dict() for f in self.failures],
            "unchecked": list(self.unchecked),
        }


@dataclass(frozen=True)
class StepResult:
    """One recorded model call: the outcome its response would have had, and its calls."""

    number: int
    model: str | None
    outcome: str
    """``allow``, ``reject``, ``strip`` or ``text_only`` (see :class:`~otel_replay.contracts.decisions.Decision`),
    or ``refused``: the pre-check stopped the model call before it was made."""
    refused: tuple[Failure, ...]
    """The pre-check failures of a refused step."""
    phase_before: str | None
    phase_after: str | None
    calls: tuple[CallResult, ...]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready values."""
        return {
            "step": self.number,
            "model": self.model,
            "outcome": self.outcome,
            "refused": [f.as_dict() for f in self.refused],
            "phase_before": self.phase_before,
            "phase_after": self.phase_after,
            "calls": [c.as_dict() for c in self.calls],
        }


@dataclass(frozen=True)
class SessionResult:
    """One recorded session under the contracts."""

    session_id: str
    key_kind: str
    agent: str | None
    steps: tuple[StepResult, ...]
    notes: tuple[str, ...]
    killed: bool
    kill_reason: str | None
    final_phase: str | None

    @property
    def blocked(self) -> tuple[CallResult, ...]:
        """Every call that would not have reached the agent, in order."""
        return tuple(call for step in self.steps for call in step.calls if not call.allowed)

    @property
    def refused_steps(self) -> tuple[StepResult, ...]:
        """The model calls the pre-check would have stopped."""
        return tuple(step for step in self.steps if step.outcome == "refused")

    @property
    def passed(self) -> bool:
        """Nothing would have been blocked or refused."""
        return not self.blocked and not self.refused_steps

    @property
    def call_count(self) -> int:
        """The recorded tool calls of the session."""
        return sum(len(step.calls) for step in self.steps)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready values: the summary, each blocked call and refused step, and the notes."""
        return {
            "session_id": self.session_id,
            "grouped_by": self.key_kind,
            "agent": self.agent,
            "passed": self.passed,
            "steps": len(self.steps),
            "calls": self.call_count,
            "blocked": [call.as_dict() for call in self.blocked],
            "refused_steps": [
                {"step": s.number, "model": s.model, "failures": [f.as_dict() for f in s.refused]}
                for s in self.refused_steps
            ],
            "killed": self.killed,
            "kill_reason": self.kill_reason,
            "final_phase": self.final_phase,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class BacktestReport:
    """Every session checked, under which contracts and gate mode."""

    contracts: Path
    digest: str
    gate: str
    sessions: tuple[SessionResult, ...]

    @property
    def passed(self) -> bool:
        """No session would have had a call blocked or a model call refused."""
        return all(session.passed for session in self.sessions)

    @property
    def blocked_calls(self) -> int:
        """Calls blocked across the sessions."""
        return sum(len(session.blocked) for session in self.sessions)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready values."""
        return {
            "contracts": str(self.contracts),
            "digest": self.digest,
            "gate": self.gate,
            "passed": self.passed,
            "sessions_checked": len(self.sessions),
            "sessions_blocked": sum(1 for s in self.sessions if not s.passed),
            "blocked_calls": self.blocked_calls,
            "sessions": [session.as_dict() for session in self.sessions],
        }


def backtest_dataset(
    contracts: ContractSet,
    store: Store,
    *,
    session_id: str | None = None,
    gate: str = "reject_all",
    unmatched_policy: str = "block",
    on_error: str = "block",
) -> BacktestReport:
    """:func:`backtest` over the sessions recorded in ``store`` (or only ``session_id``)."""
    sessions = recorded_sessions(store, session_id)
    return backtest(contracts, sessions, gate=gate, unmatched_policy=unmatched_policy, on_error=on_error)


def backtest(
    contracts: ContractSet,
    sessions: Iterable[RecordedSession],
    *,
    gate: str = "reject_all",
    unmatched_policy: str = "block",
    on_error: str = "block",
) -> BacktestReport:
    """Run each of ``sessions`` through ``contracts`` offline; see the module docstring.

    ``gate``, ``unmatched_policy`` and ``on_error`` are those of ``govern()`` (and of
    :class:`~otel_replay.contracts.engine.Engine`, which checks them).
    """
    engines = _Engines(contracts, gate=gate, unmatched_policy=unmatched_policy, on_error=on_error)
    results = tuple(_session(engines, session) for session in sessions)
    return BacktestReport(contracts=contracts.directory, digest=contracts.digest, gate=gate, sessions=results)


class _Engines:
    """The engine over the contracts, and over the contracts less what a step's recording cannot be checked on."""

    def __init__(self, contracts: ContractSet, **options: str) -> None:
        self.contracts = contracts
        self._options = options
        self._made: dict[frozenset[tuple[str, ...]], Engine] = {}
        self.full = self.get(frozenset())

    def get(self, left_out: frozenset[tuple[str, ...]]) -> Engine:
        """The engine without the rules ``left_out`` names (see :func:`_relaxed`)."""
        engine = self._made.get(left_out)
        if engine is None:
            engine = Engine(_relaxed(self.contracts, left_out), **self._options)
            self._made[left_out] = engine
        return engine


def _relaxed(contracts: ContractSet, left_out: frozenset[tuple[str, ...]]) -> ContractSet:
    """``contracts`` without the rules ``left_out`` names.

    ``("arguments", tool)``: every argument rule of the tool; ``("path", tool, path)``: the argument rules at
    ``path``; ``("output", tool)``: every ``with_output`` condition on the tool's result; ``("loop",)``: loop detection.
    """
    if not left_out:
        return contracts
    tools: dict[str, ToolContract] = {}
    for name, contract in contracts.tools.items():
        invariants = contract.argument_value_invariants
        if ("arguments", name) in left_out:
            invariants = ()
        else:
            invariants = tuple(i for i in invariants if ("path", name, i.path) not in left_out)
        preconditions = tuple(
            dataclasses.replace(pre, with_output=()) if ("output", pre.requires_prior_tool) in left_out else pre
            for pre in contract.preconditions
        )
        tools[name] = dataclasses.replace(contract, argument_value_invariants=invariants, preconditions=preconditions)
    session = contracts.session
    if ("loop",) in left_out:
        limits: SessionLimits = dataclasses.replace(session.session_limits, loop_detection=None)
        session = dataclasses.replace(session, session_limits=limits)
    return dataclasses.replace(contracts, tools=tools, session=session)


def _session(engines: _Engines, session: RecordedSession) -> SessionResult:
    engine = engines.full
    state = engine.new_state(session.session_id, session.agent)
    notes: list[str] = []
    unobserved: set[str] = set()  # tools whose last allowed call's result was not recorded
    steps: list[StepResult] = []
    for step in session.steps:
        if step.unreadable:
            notes.append(f"step {step.number}: its tool-call list could not be read; checked as a step without calls")
        if step.dropped_calls:
            notes.append(f"step {step.number}: {step.dropped_calls} tool calls were not recorded (not checked)")
        refused = engine.precheck(state, step.model)
        if refused:  # the model call is not made; a governed session counts it as one block, as here
            state.total_block_count += 1
            state.consecutive_block_count += 1
            state.state_version += 1
            calls = tuple(CallResult(step.number, c.index, c.call_id, c.name, False, refused) for c in step.calls)
            steps.append(StepResult(step.number, step.model, "refused", refused, state.current_phase, None, calls))
            continue
        steps.append(_step(engines, state, step, unobserved, notes))
    if unobserved:
        notes.append(
            "results not recorded for " + ", ".join(sorted(unobserved)) + ": with_output conditions on them not checked"
        )
    return SessionResult(
        session_id=session.session_id,
        key_kind=session.key_kind,
        agent=session.agent,
        steps=tuple(steps),
        notes=tuple(dict.fromkeys(notes)),
        killed=state.killed,
        kill_reason=state.kill_reason,
        final_phase=state.current_phase,
    )


def _step(
    engines: _Engines, state: SessionState, step: RecordedStep, unobserved: set[str], notes: list[str]
) -> StepResult:
    views, left_out, unchecked = _views(engines.contracts, step.calls, unobserved)
    engine = engines.get(frozenset(left_out))
    decision = engine.evaluate(state, views)
    engine.finalize(state, decision, model=step.model, usage=step.usage)
    if left_out:
        notes.append(f"step {step.number}: some rules were not checked (see each call's `unchecked`)")
    _observe(engine, state, decision, step.calls, unobserved)
    calls = []
    rejected = decision.outcome == "reject"
    for verdict, call in zip(decision.verdicts, step.calls, strict=True):
        calls.append(
            CallResult(
                step=step.number,
                index=call.index,
                call_id=call.call_id,
                tool=call.name,
                allowed=verdict.allowed and not rejected,
                failures=verdict.failures,
                with_response=verdict.allowed and rejected,
                unchecked=unchecked.get(call.index, ()),
            )
        )
    return StepResult(
        step.number, step.model, decision.outcome, (), decision.phase_before, state.current_phase, tuple(calls)
    )


def _views(
    contracts: ContractSet, calls: Sequence[RecordedCall], unobserved: set[str]
) -> tuple[list[ToolCallView], set[tuple[str, ...]], dict[int, tuple[str, ...]]]:
    """The calls as the engine sees them, the rules this step leaves out, and what each call was not checked on."""
    views: list[ToolCallView] = []
    left_out: set[tuple[str, ...]] = set()
    unchecked: dict[int, tuple[str, ...]] = {}
    for call in calls:
        contract = contracts.tool(call.name)
        lacking: list[str] = []
        if call.arguments_text is None:
            views.append(ToolCallView(call.index, call.call_id, call.name, "", {}))
            left_out |= {("arguments", call.name), ("loop",)}
            lacking.append(f"argument rules and loop detection: {call.missing}")
        else:
            views.append(ToolCallView.parse(call.index, call.call_id, call.name, call.arguments_text))
            if contract is not None and call.arguments is not None:
                for path in _redacted_paths(contract, call.arguments):
                    left_out.add(("path", call.name, path))
                    lacking.append(f"{path}: redacted in the recording")
        if contract is not None:
            for pre in contract.preconditions:
                if pre.with_output and pre.requires_prior_tool in unobserved:
                    left_out.add(("output", pre.requires_prior_tool))
                    lacking.append(f"with_output of {pre.requires_prior_tool}: its result was not recorded")
        if lacking:
            unchecked[call.index] = tuple(lacking)
    return views, left_out, unchecked


def _redacted_paths(contract: ToolContract, arguments: Mapping[str, Any]) -> list[str]:
    paths = []
    for invariant in contract.argument_value_invariants:
        try:
            found, value = read_path(arguments, invariant.path)
        except Exception:  # noqa: BLE001 - a path the engine cannot read either: it reports that itself
            continue
        if found and isinstance(value, str) and REDACTED in value and invariant.path not in paths:
            paths.append(invariant.path)
    return paths


def _observe(
    engine: Engine, state: SessionState, decision: Decision, calls: Sequence[RecordedCall], unobserved: set[str]
) -> None:
    """Each allowed call's recorded result or error, as the governed session would have seen it after the step."""
    if decision.outcome == "reject":
        return
    for verdict, call in zip(decision.verdicts, calls, strict=True):
        if not verdict.allowed:
            continue
        if call.failed:
            engine.observe_error(state, call.name, _RecordedToolError(call.name))
        elif call.output_recorded:
            engine.observe_output(state, call.name, call.output)
            unobserved.discard(call.name)
        else:
            unobserved.add(call.name)


class _RecordedToolError(Exception):
    """A tool error as the recording shows it (its span ended in an error)."""

    def __init__(self, tool: str) -> None:
        super().__init__(f"{tool} failed in the recording")
