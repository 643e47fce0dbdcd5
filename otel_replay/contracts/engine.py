"""The enforcement engine: what a model may see, whether its tool calls pass, and what they change.

One :class:`Engine` per :class:`~otel_replay.contracts.model.ContractSet` and set of options. It holds
nothing per session: every method takes the session's :class:`~otel_replay.contracts.state.SessionState`.
:meth:`Engine.narrow`, :meth:`Engine.precheck` and :meth:`Engine.evaluate` only read the state, so any
number of threads may call them at once; the methods that change a state (:meth:`Engine.finalize`,
:meth:`Engine.charge`, :meth:`Engine.observe_output`, :meth:`Engine.observe_error`, :meth:`Engine.kill`,
:meth:`Engine.restrict`, :meth:`Engine.widen`, :meth:`Engine.note_narrowing`) must not run on one state
from two threads at once: run them inside :meth:`otel_replay.contracts.store.StateStore.update`.

The pipeline of one model call, and the rule each step applies:

1. :meth:`Engine.narrow`: the tools offered to the model, less those a call would fail on now.
2. :meth:`Engine.precheck`: before the model is called: the kill switch, ``max_steps``, the cost cap.
3. :meth:`Engine.evaluate`: each tool call of the response, in order, against a simulated state (a later
   call sees an earlier allowed call's phase advance, forbids and counts); the gate mode turns the
   verdicts into an outcome. Nothing is changed.
4. :meth:`Engine.finalize`: the decision is applied to the state.

The engine never raises on what a model sends (malformed or non-object arguments, thousands of calls,
huge or deeply nested arguments, NaN): each such call gets a :class:`Failure`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
import unicodedata
from collections import Counter, deque
from collections.abc import Sequence
from typing import Any

from otel_replay.contracts._read import TOOL_NAME
from otel_replay.contracts.checks import InvariantCheck
from otel_replay.contracts.decisions import (
    GATE_MODES,
    ON_ERROR,
    OUTCOMES,
    RULES,
    UNMATCHED_POLICIES,
    CallVerdict,
    Decision,
    Failure,
    Narrowing,
    ToolCallView,
    parse_arguments,
    strict_json,
)
from otel_replay.contracts.model import ContractSet, Price, Source, ToolContract
from otel_replay.contracts.paths import read_path
from otel_replay.contracts.state import SessionState, output_digest, whole_numbers
from otel_replay.errors import ContractError, ContractLoadError
from otel_replay.redaction import redact

__all__ = [
    "GATE_MODES",
    "ON_ERROR",
    "OUTCOMES",
    "RULES",
    "UNMATCHED_POLICIES",
    "CallVerdict",
    "Decision",
    "Engine",
    "Failure",
    "Narrowing",
    "StaleDecisionError",
    "ToolCallView",
    "parse_arguments",
]

_MAX_DETAIL_CHARS = 300
_MAX_NAME_CHARS = 200
_MAX_TOKENS = 10**15
_MAX_COST = 1e300


class StaleDecisionError(ContractError):
    """:meth:`Engine.finalize` was given a decision evaluated on an older version of the state."""


def _line(text: str) -> str:
    """One line, redacted, then capped (capping first could cut a secret where redaction no longer sees it)."""
    flat = redact(" ".join(text.split()), personal=True)
    if len(flat) > _MAX_DETAIL_CHARS:
        flat = flat[: _MAX_DETAIL_CHARS - 3] + "..."
    return flat


def _shown_name(name: Any) -> str:
    text = name if isinstance(name, str) else repr(name)
    return text if len(text) <= _MAX_NAME_CHARS else text[:_MAX_NAME_CHARS] + "..."


def _said_name(name: Any) -> str:
    """A tool name for a failure's detail: redacted whole, then shortened like :func:`_shown_name`."""
    return _shown_name(redact(name if isinstance(name, str) else repr(name), personal=True))


class _Said:
    """A tool name as a failure's detail says it (:func:`_said_name`), worked out the first time a detail needs it.

    Most calls pass: their names are never redacted for a detail nobody writes.
    """

    __slots__ = ("_name", "_text")

    def __init__(self, name: Any) -> None:
        self._name = name
        self._text: str | None = None

    def __str__(self) -> str:
        if self._text is None:
            self._text = _said_name(self._name)
        return self._text

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def _stored(name: Any) -> str:
    """A tool name as the state and the failures keep it: shown (cut) and redacted (a model can name a secret)."""
    return redact(_shown_name(name), personal=True)


_DIGESTED = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
"""Made once (``json.dumps`` with options builds an encoder per call)."""


def _digest(call: ToolCallView) -> str:
    """``"tool:hash"`` of the tool and its canonical arguments (the raw text when they do not parse).

    Canonical: keys sorted, no spaces, text unescaped, and a number by its value (``1``, ``1.0`` and ``1e0``
    are one value, as :func:`~otel_replay.contracts.checks.json_equal` says), so respelling arguments does
    not dodge loop detection.
    """
    body: str | None = None
    if call.arguments is not None:
        try:
            body = _DIGESTED.encode(whole_numbers(call.arguments))
        except (TypeError, ValueError, RecursionError):
            body = None
    if body is None:
        body = "\x00raw:" + (call.arguments_text if isinstance(call.arguments_text, str) else repr(call.arguments_text))
    digest = hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{_stored(call.name)}:{digest}"


class _Simulation:
    """The state as the calls of one response see it: earlier allowed calls applied, nothing saved."""

    def __init__(self, state: SessionState, window: int) -> None:
        self.phase = state.current_phase
        self.forbidden = set(state.forbidden_tools)
        self.counts = dict(state.tool_call_counts)
        self.called: set[str] = set()  # tools allowed earlier in this response (their output is not known yet)
        self.total_calls = state.total_tool_calls
        earlier = state.recent_calls[-(window - 1) :] if window > 1 else []
        self.window: deque[str] = deque(earlier, maxlen=max(window - 1, 0))
        self.window_counts: dict[str, int] = dict(Counter(self.window))

    def see(self, digest: str) -> int:
        """How many times ``digest`` is in the loop window counting this call; then the call enters it."""
        counts = self.window_counts
        seen = counts.get(digest, 0) + 1
        window = self.window
        if window.maxlen:
            if len(window) == window.maxlen:
                oldest = window[0]
                counts[oldest] -= 1
            window.append(digest)
            counts[digest] = counts.get(digest, 0) + 1
        return seen

    def commit(self, name: str, contract: ToolContract | None) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1
        self.called.add(name)
        self.total_calls += 1
        if contract is not None:
            if contract.transitions.advances_to:
                self.phase = contract.transitions.advances_to
            self.forbidden.update(contract.forbids_after)


class Engine:
    """Enforces one :class:`~otel_replay.contracts.model.ContractSet` (see the module docstring for the pipeline).

    ``gate``: what a failing call does to its response (see :meth:`evaluate`); ``unmatched_policy``: a call of
    a tool with no contract fails ``unmatched`` (``block``) or passes the contract rules unchecked
    (``allow``; the session rules still apply); ``on_error``: when evaluating a call raises (a bug, a path
    that cannot be read), ``block`` fails it ``internal_error``, ``allow`` lets it through and counts it in
    ``total_unguarded_calls``.
    """

    def __init__(
        self,
        contracts: ContractSet,
        *,
        gate: str = "reject_all",
        unmatched_policy: str = "block",
        on_error: str = "block",
    ) -> None:
        """Check the options and compile every regular expression once (a bad one: :class:`ContractLoadError`)."""
        for name, value, allowed in (
            ("gate", gate, GATE_MODES),
            ("unmatched_policy", unmatched_policy, UNMATCHED_POLICIES),
            ("on_error", on_error, ON_ERROR),
        ):
            if value not in allowed:
                raise ContractError(f"{name}={value!r}: expected one of {', '.join(allowed)}")
        self.contracts = contracts
        self.gate = gate
        self.unmatched_policy = unmatched_policy
        self.on_error = on_error
        limits = contracts.session.session_limits
        self._limits = limits
        loop = limits.loop_detection
        self._window = loop.window if loop is not None else 0
        self._checks: dict[str, tuple[InvariantCheck, ...]] = {}
        output_paths: dict[str, list[str]] = {}
        for tool in contracts.tools.values():
            checks: list[InvariantCheck] = []
            for invariant in tool.argument_value_invariants:
                try:
                    checks.append(InvariantCheck(invariant))
                except re.error as exc:
                    raise ContractLoadError(f"{invariant.source}: argument_value_invariants: regex: {exc}") from None
                except ValueError as exc:
                    raise ContractLoadError(f"{invariant.source}: argument_value_invariants: path: {exc}") from None
            self._checks[tool.tool] = tuple(checks)
            for pre in tool.preconditions:
                if not pre.with_output:
                    continue
                paths = output_paths.setdefault(pre.requires_prior_tool, [])
                paths.extend(c.path for c in pre.with_output if c.path not in paths)
        self._output_paths = {tool: tuple(paths) for tool, paths in output_paths.items()}
        # with_output: the digest each condition's value must have (the state keeps only the outputs' digests)
        self._expected: dict[int, str] = {}
        for tool in contracts.tools.values():
            for pre in tool.preconditions:
                for condition in pre.with_output:
                    try:
                        self._expected[id(condition)] = output_digest(condition.equals)
                    except (TypeError, ValueError, RecursionError):  # no JSON form: no output can equal it
                        continue
        self._folded = {_fold(name): name for name in contracts.tools}
        prices = list(contracts.session.prices.values())
        # What an unpriced model's tokens cost under a cost cap (see cost()).
        self._dearest = (
            Price(
                max(p.input_per_million for p in prices),
                max(p.output_per_million for p in prices),
                contracts.session.source,
            )
            if limits.max_cost_per_session is not None and prices
            else None
        )

    # -- state ------------------------------------------------------------------------------------------------

    def new_state(self, session_id: str, agent: str | None) -> SessionState:
        """A fresh state in the session's initial phase (``agent`` defaults to the session contract's)."""
        return SessionState(
            session_id=session_id,
            agent=agent if agent is not None else self.contracts.session.agent,
            current_phase=self.contracts.session.initial_phase,
        )

    def cost(self, model: str | None, usage: tuple[int, int] | None) -> float:
        """Dollars of one model call: input and output tokens times the session's ``prices[model]`` per million.

        0.0 when there is no usage. A ``model`` with no price (or none named) costs 0.0 when the session has
        no ``max_cost_per_session``; under a cap it costs the dearest input and the dearest output price of the
        table, never nothing (a response can name another model than its request did, as a dated snapshot
        does, and the cap must still hold). A token count that is not a non-negative number counts as 0 (a
        NaN too), a float as the whole number at or above it, one above 10**15 as 10**15 (a provider's usage
        is input like any other); a cost is at most 1e300 dollars, so the state stays finite and saves.
        """
        if usage is None:
            return 0.0
        price = self.contracts.session.prices.get(model) if isinstance(model, str) else None
        if price is None:
            price = self._dearest
            if price is None:
                return 0.0
        try:
            tokens_in, tokens_out = usage
        except (TypeError, ValueError):
            return 0.0
        dollars = (_tokens(tokens_in) * price.input_per_million + _tokens(tokens_out) * price.output_per_million) / 1e6
        return min(dollars, _MAX_COST)

    # -- before the model call ------------------------------------------------------------------------------

    def narrow(self, state: SessionState, offered: Sequence[str]) -> Narrowing:
        """The tools of ``offered`` the model may see now, and why each other one was removed.

        Removed, first reason wins: outside a manual :meth:`restrict`; no contract while
        ``unmatched_policy="block"``, or under ``"allow"`` a name that is no tool name or looks like a
        contracted one (see :meth:`evaluate`); forbidden by an earlier call's ``forbids_after``; ``max_tool_calls``
        reached; its ``max_calls_per_tool`` reached; the current phase not in its ``valid_in_phases``; its
        ``advances_to`` not reachable from the current phase; its ``requires_prior_tool`` never allowed.
        (A ``with_output`` condition does not narrow: the output may arrive with this very request.)
        Duplicates in ``offered`` are kept once. Reads the state only; see :meth:`note_narrowing`.
        """
        kept: list[str] = []
        removed: dict[str, str] = {}
        seen: set[str] = set()
        for name in offered:
            if not isinstance(name, str) or name in seen:
                continue
            seen.add(name)
            why = self._narrow_reason(state, name)
            if why is None:
                kept.append(name)
            else:
                removed[name] = why
        return Narrowing(tuple(_seen_in_order(offered)), tuple(kept), removed)

    def _narrow_reason(self, state: SessionState, name: str) -> str | None:
        limits = self._limits
        if state.narrowed_to is not None and name not in state.narrowed_to:
            return "not in the manual narrowing"
        contract = self.contracts.tool(name)
        if contract is None and self.unmatched_policy == "block":
            return "no contract (unmatched_policy block)"
        if contract is None:
            disguise = self._disguise(name)
            if disguise is not None:
                return f"no contract and {disguise}"
        if name in state.forbidden_tools:
            return "forbidden by an earlier call's forbids_after"
        if limits.max_tool_calls is not None and state.total_tool_calls >= limits.max_tool_calls:
            return f"max_tool_calls {limits.max_tool_calls} reached"
        cap = limits.max_calls_per_tool.get(name)
        if cap is not None and state.tool_call_counts.get(name, 0) >= cap:
            return f"max_calls_per_tool {cap} reached"
        if contract is None:
            return None
        problem = self._phase_problem(state.current_phase, contract)
        if problem is not None:
            return problem
        for pre in contract.preconditions:
            if state.tool_call_counts.get(pre.requires_prior_tool, 0) == 0:
                return f"requires {pre.requires_prior_tool} first"
        return None

    def precheck(self, state: SessionState, model: str | None) -> tuple[Failure, ...]:
        """The failures that stop a model call before it is made (empty: go ahead).

        ``kill``: the session was killed. ``max_steps``: ``total_step_count`` has reached it. ``max_cost``:
        ``actual_cost`` has reached the cap, or a cap is set and ``model`` has no price in the session's
        ``prices`` (named in the detail: a cap that cannot be computed is not a cap).
        """
        session = self.contracts.session
        limits = self._limits
        if state.killed:
            reason = f" ({state.kill_reason})" if state.kill_reason else ""
            return (Failure("kill", _line(f"session {state.session_id} was killed{reason}"), source=None),)
        failures: list[Failure] = []
        if limits.max_steps is not None and state.total_step_count >= limits.max_steps:
            failures.append(Failure("max_steps", f"max_steps {limits.max_steps} reached", source=session.source))
        cap = limits.max_cost_per_session
        if cap is not None:
            if not isinstance(model, str) or model not in session.prices:
                named = "no model named" if model is None else f"model {_said_name(model)!r} has no price"
                detail = _line(f"{named}: max_cost_per_session needs one in prices")
                failures.append(Failure("max_cost", detail, source=session.source))
            elif state.actual_cost >= cap:
                failures.append(
                    Failure(
                        "max_cost",
                        f"max_cost_per_session {cap:g} reached (spent {state.actual_cost:.6g})",
                        source=session.source,
                    )
                )
        return tuple(failures)

    # -- the response ----------------------------------------------------------------------------------------

    def evaluate(self, state: SessionState, calls: Sequence[ToolCallView]) -> Decision:
        """Every call of one response, in order, and the outcome under the gate mode. Changes nothing.

        Each call is checked against the state as it would be once the earlier ALLOWED calls of the same
        response ran (their phase advance, forbids and counts). Rules, all reported for each call:

        * ``kill``: the session is killed (the only failure reported then);
        * ``narrowed``: outside a manual :meth:`restrict`;
        * ``unmatched``: no contract and ``unmatched_policy="block"``; under ``"allow"`` too when the name is
          not a tool name (1-128 ASCII letters, digits, ``_`` or ``-``: no spaces, invisible or look-alike
          letters) or differs from a contracted tool's only in case, ``_``/``-`` or compatibility forms
          (``Issue_Refund``, ``issue-refund``, full-width letters): such a name is a contracted tool in disguise;
        * ``malformed_arguments``: the arguments are not a JSON object, or hold ``NaN``/``Infinity`` or a key
          given twice in one object (:func:`parse_arguments`; their invariants are then not read);
        * ``forbidden``: an allowed call of a tool T made it illegal (T's ``forbids_after``);
        * ``max_tool_calls`` / ``max_calls_per_tool``: allowed calls would exceed the limit;
        * ``loop``: the same tool with the same canonical arguments (keys in any order, text unescaped,
          numbers by value: ``1``, ``1.0`` and ``1e0`` are one) ``threshold`` times among the last ``window``
          calls the model proposed, this one included (blocked ones count: a model retrying a blocked call
          loops);
        * ``phase``: the current phase is not in the tool's ``valid_in_phases``, or its ``advances_to`` is
          neither the current phase nor in the session's ``transitions`` from it;
        * ``precondition``: ``requires_prior_tool`` not allowed before (earlier step, or earlier in this
          response), or a ``with_output`` path not observed (:meth:`observe_output`) or not equal. Only the
          output of the prior tool's LAST allowed call counts: a ``with_output`` condition fails while a call
          of the prior tool made later (or earlier in this same response) has no output observed yet;
        * ``argument_invariant``: see :meth:`otel_replay.contracts.checks.InvariantCheck.problems`.

        Outcome: no failing call -> ``allow``. A failing call of a tool whose effective gate
        (:meth:`~otel_replay.contracts.model.ContractSet.effective_gate`) is ``block`` -> ``reject``
        whatever the mode. Else ``reject_all`` -> ``reject``; ``strip_partial`` -> ``strip``, or ``reject``
        when every call failed; ``strip_blocked`` -> ``strip``, or ``text_only`` when every call failed.
        """
        sim = _Simulation(state, self._window)
        verdicts: list[CallVerdict] = []
        for position, call in enumerate(calls):
            verdicts.append(self._judge(state, sim, call, position))
        failures = tuple(f for v in verdicts for f in v.failures)
        outcome = self._outcome(verdicts)
        return Decision(
            step=state.total_step_count + 1,
            verdicts=tuple(verdicts),
            outcome=outcome,
            failures=failures,
            phase_before=state.current_phase,
            phase_after=state.current_phase if outcome == "reject" else sim.phase,
            state_version=state.state_version,
        )

    def _outcome(self, verdicts: Sequence[CallVerdict]) -> str:
        failing = sum(1 for v in verdicts if not v.allowed)
        if failing == 0:
            return "allow"
        if self.gate == "reject_all" or any(v.escalated for v in verdicts):
            return "reject"
        if failing < len(verdicts):
            return "strip"
        return "reject" if self.gate == "strip_partial" else "text_only"

    def _judge(self, state: SessionState, sim: _Simulation, call: ToolCallView, position: int) -> CallVerdict:
        """One call's verdict; commits it to ``sim`` when it passes. Never raises."""
        digest = ""  # only loop detection reads it: not computed without one
        if self._window:
            try:
                digest = _digest(call)
            except Exception:  # noqa: BLE001 - hostile input must give a verdict, never an exception
                digest = f"?:{position}"
        contract: ToolContract | None = None
        try:
            contract = self.contracts.tool(call.name) if isinstance(call.name, str) else None
            failures = self._failures(state, sim, call, contract, sim.see(digest))
        except Exception as exc:  # noqa: BLE001 - on_error decides: fail closed or let it through unguarded
            if self.on_error == "block":
                failure = Failure(
                    "internal_error",
                    _line(f"evaluating {_said_name(call.name)} failed: {type(exc).__name__}"),
                    tool=_stored(call.name),
                    call_id=redact(_call_id(call), personal=True),
                )
                return CallVerdict(call, False, (failure,), False, False, digest)
            try:
                sim.commit(_shown_name(call.name), contract)
            except Exception:  # noqa: BLE001, S110 - the call is unguarded already; nothing more to apply
                pass
            return CallVerdict(call, True, (), False, True, digest)
        if failures:
            escalated = contract is not None and self.contracts.effective_gate(contract) == "block"
            return CallVerdict(call, False, tuple(failures), escalated, False, digest)
        sim.commit(call.name, contract)
        return CallVerdict(call, True, (), False, False, digest)

    def _failures(
        self, state: SessionState, sim: _Simulation, call: ToolCallView, contract: ToolContract | None, seen: int
    ) -> list[Failure]:
        name = _shown_name(call.name)
        said = _Said(call.name)  # for details: redacted whole, then shortened (never half a secret); only if needed
        call_id = _call_id(call)
        session = self.contracts.session
        limits = self._limits

        def fail(rule: str, detail: str, *, path: str | None = None, source: Source | None = None) -> None:
            failures.append(
                Failure(
                    rule,
                    _line(detail),
                    tool=redact(name, personal=True),
                    call_id=redact(call_id, personal=True),
                    path=path,
                    source=source,
                )
            )

        failures: list[Failure] = []
        if state.killed:
            fail("kill", f"session {state.session_id} was killed")
            return failures
        if state.narrowed_to is not None and name not in state.narrowed_to:
            fail("narrowed", f"{said} is outside the manual narrowing")
        if contract is None and self.unmatched_policy == "block":
            fail("unmatched", f"{said} has no contract (unmatched_policy block)")
        elif contract is None:
            disguise = self._disguise(call.name)
            if disguise is not None:
                fail("unmatched", f"{said} has no contract and {disguise}")
        if call.arguments is None:
            fail("malformed_arguments", f"the arguments of {said} are not a JSON object")
        if name in sim.forbidden:
            fail("forbidden", f"{said} is forbidden by an earlier call's forbids_after", source=session.source)
        if limits.max_tool_calls is not None and sim.total_calls >= limits.max_tool_calls:
            fail("max_tool_calls", f"max_tool_calls {limits.max_tool_calls} reached", source=session.source)
        cap = limits.max_calls_per_tool.get(name)
        if cap is not None and sim.counts.get(name, 0) >= cap:
            fail("max_calls_per_tool", f"max_calls_per_tool {cap} for {said} reached", source=session.source)
        loop = limits.loop_detection
        if loop is not None and seen >= loop.threshold:
            fail(
                "loop",
                f"{said} called with the same arguments {seen} times in the last {loop.window} calls "
                f"(threshold {loop.threshold})",
                source=loop.source,
            )
        if contract is None:
            return failures
        problem = self._phase_problem(sim.phase, contract)
        if problem is not None:
            fail("phase", f"{said}: {problem}", source=contract.source)
        for pre in contract.preconditions:
            prior = pre.requires_prior_tool
            if sim.counts.get(prior, 0) == 0:
                fail("precondition", f"{said} requires {prior} to have run first", source=pre.source)
                continue
            recorded = state.satisfied_preconditions.get(prior)
            for condition in pre.with_output:
                if prior in sim.called:
                    fail(
                        "precondition",
                        f"{said} requires the output of {prior} at {condition.path}, and {prior} runs in this same "
                        "response (its output is not known yet)",
                        path=condition.path,
                        source=condition.source,
                    )
                elif recorded is None or condition.path not in recorded:
                    fail(
                        "precondition",
                        f"{said} requires the output of {prior} at {condition.path}, not observed",
                        path=condition.path,
                        source=condition.source,
                    )
                elif recorded[condition.path] != self._expected.get(id(condition)):
                    fail(
                        "precondition",
                        f"{said} requires {prior}'s output {condition.path} to equal the contract's value",
                        path=condition.path,
                        source=condition.source,
                    )
        if call.arguments is not None:
            for check in self._checks.get(contract.tool, ()):
                for problem_text in check.problems(call.arguments):
                    fail(
                        "argument_invariant", f"{said}: {problem_text}", path=check.path, source=check.invariant.source
                    )
        return failures

    def _disguise(self, name: Any) -> str | None:
        """Why an uncontracted ``name`` still may not pass under ``unmatched_policy="allow"`` (``None``: it may)."""
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            return "is not a tool name (1-128 ASCII letters, digits, _ or -)"
        twin = self._folded.get(_fold(name))
        if twin is not None:
            return f"looks like the contracted tool {twin}"
        return None

    def _phase_problem(self, phase: str | None, contract: ToolContract) -> str | None:
        """Why ``contract``'s tool cannot be called in ``phase`` (``None``: it can)."""
        valid = contract.transitions.valid_in_phases
        if valid is not None and phase not in valid:
            return f"not valid in phase {phase} (valid in {', '.join(valid) or 'none'})"
        target = contract.transitions.advances_to
        if target is not None and target != phase:
            allowed = self.contracts.session.transitions.get(phase, ()) if phase is not None else ()
            if target not in allowed:
                return f"cannot advance from phase {phase} to {target}"
        return None

    # -- after the response ----------------------------------------------------------------------------------

    def finalize(
        self, state: SessionState, decision: Decision, *, model: str | None, usage: tuple[int, int] | None
    ) -> None:
        """Apply ``decision`` to ``state``; call it for every evaluated response, whatever its outcome.

        Always: ``total_step_count`` +1; the call's cost (:meth:`cost`) added to ``actual_cost``; every
        proposed call enters the loop window; ``total_block_count`` += the failing calls, and
        ``consecutive_block_count`` grows by them or resets to 0 when none failed; ``state_version`` +1.
        Unless the outcome is ``reject``: the cost is added to ``total_cost``; each call that reaches the
        caller is counted (``total_tool_calls``, ``tool_call_counts``), the output recorded for its tool is
        dropped and its call id kept in ``output_call_ids`` (the new call's output, once observed, is what
        ``with_output`` reads: see :meth:`observe_output`), its ``forbids_after``
        tools become forbidden, and the phase becomes ``decision.phase_after``; unguarded ones add to
        ``total_unguarded_calls``. Then the circuit breaker: ``consecutive_blocks`` reached -> :meth:`kill`.

        Raises:
            StaleDecisionError: the state changed since the decision was evaluated (evaluate again on the
                current state: another thread or process took a step in between).

        """
        if decision.state_version != state.state_version:
            raise StaleDecisionError(
                f"session {state.session_id}: decision evaluated on state version {decision.state_version}, "
                f"the state is at {state.state_version}"
            )
        cost = self.cost(model, usage)
        allowed_names = [_stored(v.call.name) for v in decision.allowed]
        state.total_step_count += 1
        state.actual_cost += cost
        if decision.outcome != "reject":
            state.total_cost += cost
            forbidden = set(state.forbidden_tools)
            for verdict, name in zip(decision.allowed, allowed_names, strict=True):
                state.tool_call_counts[name] = state.tool_call_counts.get(name, 0) + 1
                if name in self._output_paths:  # a new call: its output, not the last one's, is what counts now
                    state.satisfied_preconditions.pop(name, None)
                    if isinstance(verdict.call.call_id, str):
                        state.output_call_ids[name] = verdict.call.call_id
                state.total_tool_calls += 1
                if verdict.unguarded:
                    state.total_unguarded_calls += 1
                contract = self.contracts.tool(name)
                if contract is not None:
                    for tool in contract.forbids_after:
                        if tool not in forbidden:
                            forbidden.add(tool)
                            state.forbidden_tools.append(tool)
            state.current_phase = decision.phase_after
        if self._window:
            state.recent_calls.extend(v.digest for v in decision.verdicts[-self._window :])
            del state.recent_calls[: -self._window]
        failing = len(decision.blocked)
        state.total_block_count += failing
        state.consecutive_block_count = state.consecutive_block_count + failing if failing else 0
        state.last_step = {
            "step": decision.step,
            "outcome": decision.outcome,
            "phase_before": decision.phase_before,
            "phase_after": state.current_phase,
            "allowed": allowed_names,
            "blocked": [_stored(v.call.name) for v in decision.blocked],
            "rules": sorted({f.rule for f in decision.failures}),
        }
        state.state_version += 1
        breaker = self._limits.circuit_breaker
        blocks = breaker.consecutive_blocks if breaker is not None else None
        if blocks and state.consecutive_block_count >= blocks:
            self.kill(state, f"circuit breaker: {state.consecutive_block_count} consecutive blocked calls")

    def charge(self, state: SessionState, *, model: str | None, usage: tuple[int, int] | None) -> None:
        """Add the cost of a model call that is not finalized to ``actual_cost``; ``state_version`` +1.

        For a response that could not be read or was retried; a finalized response is charged by :meth:`finalize`.
        """
        state.actual_cost += self.cost(model, usage)
        state.state_version += 1

    def observe_output(self, state: SessionState, tool: str, output: Any, *, call_id: str | None = None) -> None:
        """Record a tool's result for the ``with_output`` conditions that name it; a tool error streak ends.

        ``output`` is the value, or JSON text (a tool message's content), parsed when it parses. For each
        ``with_output`` path of a precondition requiring ``tool``, the digest of the value found there
        (:func:`~otel_replay.contracts.state.output_digest`: the state never holds the value) replaces the one
        recorded before (a path not found, or a value JSON has no form for, is dropped: the condition then
        fails as not observed). Tools no
        precondition names are not recorded. ``consecutive_error_count`` resets; ``state_version`` +1.

        ``call_id``: the call the output answers (a tool message's ``tool_call_id``). Given, and not the id of
        the tool's last allowed call (``output_call_ids``), the output is ignored and nothing changes: an old
        tool message sent again with the history, or one answering a call that never ran, is not the output
        of the call the condition is about. Never raises.
        """
        paths = self._output_paths.get(tool) if isinstance(tool, str) else None
        if paths is not None and call_id is not None and state.output_call_ids.get(tool, call_id) != call_id:
            return
        if paths is not None:
            value = output
            if isinstance(output, str | bytes | bytearray):
                try:
                    value = strict_json(output)
                except (ValueError, RecursionError, TypeError):
                    value = output
            recorded: dict[str, Any] = {}
            for path in paths:
                try:
                    found, at = read_path(value, path)
                    if found:
                        recorded[path] = output_digest(at)  # never the value: outputs hold customer data
                except Exception:  # noqa: BLE001, S112 - an unreadable output satisfies nothing
                    continue
            state.satisfied_preconditions[tool] = recorded
        state.consecutive_error_count = 0
        state.state_version += 1

    def observe_error(self, state: SessionState, tool: str, error: BaseException) -> None:
        """Count a tool's error in ``total_error_count`` and ``consecutive_error_count``; ``state_version`` +1.

        The circuit breaker's ``consecutive_errors`` reached -> :meth:`kill`.
        """
        state.total_error_count += 1
        state.consecutive_error_count += 1
        state.state_version += 1
        breaker = self._limits.circuit_breaker
        errors = breaker.consecutive_errors if breaker is not None else None
        if errors and state.consecutive_error_count >= errors:
            self.kill(
                state,
                f"circuit breaker: {state.consecutive_error_count} consecutive tool errors "
                f"(last: {_said_name(tool)} {type(error).__name__})",
            )

    def kill(self, state: SessionState, reason: str) -> None:
        """Kill the session: every later :meth:`precheck` and call fails ``kill``.

        A second kill keeps the first time and reason; ``state_version`` +1 only on the first.
        """
        if state.killed:
            return
        state.killed = True
        state.killed_at = time.time()
        state.kill_reason = _line(reason)
        state.state_version += 1

    def restrict(self, state: SessionState, names: Sequence[str]) -> None:
        """Manually narrow the session to ``names``, on top of every other rule.

        ``control_revision`` and ``state_version`` +1.
        """
        state.narrowed_to = list(_seen_in_order(names))
        state.control_revision += 1
        state.state_version += 1

    def widen(self, state: SessionState) -> None:
        """Undo :meth:`restrict`; ``control_revision`` and ``state_version`` +1."""
        state.narrowed_to = None
        state.control_revision += 1
        state.state_version += 1

    def note_narrowing(self, state: SessionState, narrowing: Narrowing) -> None:
        """Keep ``narrowing`` as the state's ``last_narrowing`` (shown by ``SessionState.public``); version +1."""
        state.last_narrowing = narrowing.as_dict()
        state.state_version += 1


def _tokens(count: Any) -> int:
    """A usage token count as a whole number in [0, 10**15] (booleans, text and NaN: 0; 1.5: 2)."""
    if type(count) is int:
        return min(count, _MAX_TOKENS) if count > 0 else 0
    if type(count) is float and count > 0:  # NaN is not > 0
        return _MAX_TOKENS if count >= _MAX_TOKENS else math.ceil(count)
    return 0


def _seen_in_order(names: Sequence[Any]) -> list[str]:
    """The text names of ``names``, each once, in order."""
    out: list[str] = []
    seen: set[str] = set()
    for name in names:
        if isinstance(name, str) and name not in seen:
            seen.add(name)
            out.append(name)
    return out


def _fold(name: str) -> str:
    """``name`` in compatibility form, case-folded, with only its letters and digits kept (look-alike names meet)."""
    return "".join(char for char in unicodedata.normalize("NFKC", name).casefold() if char.isalnum())


def _call_id(call: ToolCallView) -> str:
    return call.call_id if isinstance(call.call_id, str) else repr(call.call_id)
