"""The per-call pipeline of a governed session: narrow, pre-check, call, validate, gate, finalize, record.

:class:`Governor` holds one session's engine, store and options; the client proxies
(:mod:`otel_replay.contracts.providers.clients`) call :meth:`Governor.before` with a request and
:meth:`Governor.decide` with the tool calls of its response, and the session tools
(:mod:`otel_replay.contracts.tools`) call :meth:`Governor.direct` and :meth:`Governor.observe`.

Every change of the session state is one atomic :meth:`StateStore.update`: the response is evaluated and
finalized on the state as it is when the update runs (a step another thread or process took in between is
seen), so two callers can never both take the last allowed refund.

Modes: ``enforce`` blocks, strips and changes the state; ``shadow`` evaluates the same way on a private copy
of the state (the stored state never changes, nothing is blocked or narrowed) and reports what enforcing
would have done in :attr:`Governor.last_shadow_delta`; ``log-only`` records the tool calls, checks nothing.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final

from opentelemetry import baggage

from otel_replay import semconv as sc
from otel_replay.capture.context import session as session_scope
from otel_replay.contracts.engine import Decision, Engine, Failure, Narrowing, ToolCallView
from otel_replay.contracts.evidence import DecisionEvidence, Evidence, failure_json, of_decision
from otel_replay.contracts.providers.base import Adapter
from otel_replay.contracts.state import SessionState
from otel_replay.contracts.store import StateStore
from otel_replay.errors import ContractError, ReplayContractError, ReplayKillError

__all__ = ["GOVERNED", "MODES", "Governor", "Request", "ShadowDelta"]

_log = logging.getLogger("otel_replay.contracts")

MODES: Final = ("enforce", "shadow", "log-only")

GOVERNED: ContextVar[bool] = ContextVar("otel_replay_governed_call", default=False)
"""Set while a governed call runs: a request the client makes without it bypassed the session."""

_REMEMBERED: Final = 4096
"""Tool call ids remembered (their tool's name, and whether their result was observed): the newest kept."""


@dataclass(frozen=True)
class Request:
    """A request on its way: what was sent (after narrowing), its model, and what narrowing removed."""

    kwargs: dict[str, Any]
    model: str | None
    narrowing: Narrowing | None
    precheck: tuple[Failure, ...] = ()
    """Shadow mode: the limits that would have stopped the call (enforcing raises instead)."""


@dataclass(frozen=True)
class ShadowDelta:
    """What enforcing would have done with the last response (shadow mode): nothing of it was done."""

    step: int
    outcome: str
    would_have_blocked: list[dict[str, Any]] = field(default_factory=list)
    """One entry per call that would have been blocked: ``call_id``, ``name``, ``failures``."""
    would_have_narrowed: list[str] = field(default_factory=list)
    """The tools narrowing would have removed from the request."""
    precheck_failures: list[dict[str, Any]] = field(default_factory=list)
    """Limits that would have stopped the call before it was made."""


class Governor:
    """One session's pipeline (the engine, the store, the mode and the callbacks)."""

    def __init__(
        self,
        engine: Engine,
        store: StateStore,
        *,
        session_id: str,
        agent: str | None,
        mode: str,
        evidence: Evidence,
        on_block: Callable[[Decision], Any] | None,
        on_narrow: Callable[[Narrowing], Any] | None,
        diagnostics: Callable[[dict[str, Any]], Any] | None,
        max_unguarded_calls: int | None,
    ) -> None:
        """A pipeline for session ``session_id`` (its state is created in ``store`` on first use)."""
        if mode not in MODES:
            raise ContractError(f"govern(): mode={mode!r}: expected one of {', '.join(MODES)}")
        self.engine = engine
        self.store = store
        self.session_id = session_id
        self.agent = agent
        self.mode = mode
        self.evidence = evidence
        self._on_block = on_block
        self._on_narrow = on_narrow
        self._diagnostics = diagnostics
        self.max_unguarded_calls = max_unguarded_calls
        self._lock = threading.Lock()
        self._names: OrderedDict[str, str] = OrderedDict()  # call id -> tool, for calls the session delivered
        self._observed: OrderedDict[str, None] = OrderedDict()  # call ids whose result was observed
        self._pending: dict[tuple[str, str], list[list[dict[str, Any]]]] = {}
        """(tool, canonical arguments) -> the failures of each such call delivered and not yet run (enforcing:
        none; shadow: what enforcing would have said)."""
        self._shadow: SessionState | None = None
        self.last_shadow_delta: ShadowDelta | None = None
        self.shadow_evaluations = 0
        self.callback_errors = 0

    # --- state -------------------------------------------------------------------------------------------

    def state(self) -> SessionState:
        """The session's state now (shadow mode: the real one, which shadow never changes)."""
        state = self.store.load(self.session_id)
        return state if state is not None else self.engine.new_state(self.session_id, self.agent)

    def update(self, change: Callable[[SessionState], None]) -> SessionState:
        """Apply ``change`` to the stored state atomically (the state is created on first use)."""

        def apply(current: SessionState | None) -> SessionState:
            # the store hands ``change`` a fresh copy of what it saved: it is changed in place
            state = current if current is not None else self.engine.new_state(self.session_id, self.agent)
            change(state)
            return state

        return self.store.update(self.session_id, apply)

    def _shadow_state(self) -> SessionState:
        if self._shadow is None:
            self._shadow = self.state().copy()
        return self._shadow

    def scope(self) -> AbstractContextManager[Any]:
        """The session's id (and agent) in scope for a call it makes, so the call's spans carry it.

        A session the caller already put in scope (``otel_replay.session()``, a recording, a rerun) is kept:
        their spans then go together under the caller's id.
        """
        if baggage.get_baggage(sc.BAGGAGE_SESSION_ID):
            return nullcontext()
        return session_scope(self.session_id, agent_id=self.agent)

    def tell(self, event: dict[str, Any]) -> None:
        """Hand ``event`` to the ``diagnostics`` callback (its errors are counted, never raised)."""
        self._call(self._diagnostics, event)

    def _call(self, callback: Callable[[Any], Any] | None, value: Any) -> None:
        if callback is None:
            return
        try:
            callback(value)
        except Exception as exc:  # noqa: BLE001 - a user's callback must not break the governed call
            self.callback_errors += 1
            _log.warning("otel-replay: a govern() callback raised %s; the call proceeds", type(exc).__name__)

    # --- before the model call ---------------------------------------------------------------------------

    def before(self, adapter: Adapter, kwargs: dict[str, Any]) -> Request:
        """Observe the tool results the request carries, pre-check the limits, narrow its tools list.

        Raises :class:`ReplayKillError` when the session is killed (in every mode) and, enforcing,
        :class:`ReplayContractError` when a limit stops the call before it is made.
        """
        model = adapter.model(kwargs)
        self._observe_results(adapter, kwargs)
        if self.mode == "log-only":
            state = self.state()
            self._raise_if_killed(state)
            return Request(kwargs, model, None)
        if self.mode == "shadow":
            with self._lock:
                state = self._shadow_state()
                self._raise_if_killed(self.state())
                failures = self.engine.precheck(state, model)
                offered = adapter.offered(kwargs)
                narrowing = self.engine.narrow(state, offered) if offered is not None else None
            return Request(kwargs, model, narrowing, failures)
        state = self.state()
        self._raise_if_killed(state)
        failures = self.engine.precheck(state, model)
        if failures:
            self._reject_precheck(adapter, failures)
        offered = adapter.offered(kwargs)
        narrowing = None
        if offered is not None:
            narrowing = self.engine.narrow(state, offered)
            if narrowing.removed:
                kwargs = adapter.narrow(kwargs, frozenset(narrowing.kept))
                self._call(self._on_narrow, narrowing)
        return Request(kwargs, model, narrowing)

    def _raise_if_killed(self, state: SessionState) -> None:
        if state.killed:
            reason = f": {state.kill_reason}" if state.kill_reason else ""
            raise ReplayKillError(
                f"session {self.session_id} was killed{reason}", session_id=self.session_id, killed_at=state.killed_at
            )

    def _reject_precheck(self, adapter: Adapter, failures: tuple[Failure, ...]) -> None:
        """A limit stops the call before the model is asked: counted as a block, recorded, raised."""

        def count(state: SessionState) -> None:
            state.total_block_count += 1
            state.state_version += 1

        state = self.update(count)
        self.evidence.emit(
            DecisionEvidence(
                "enforce",
                adapter.provider,
                adapter.api,
                False,
                "reject",
                state.total_step_count + 1,
                state.state_version,
                state.current_phase,
                state.current_phase,
                (),
                {},
                failures,
                (),
                failures,
            )
        )
        first = failures[0]
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise ReplayContractError(
            f"session {self.session_id}: the call was not made: {first.rule}: {first.detail}{more}",
            decision=None,
            failures=failures,
        )

    def _observe_results(self, adapter: Adapter, kwargs: Mapping[str, Any]) -> None:
        try:
            results = adapter.results(kwargs)
        except Exception as exc:  # noqa: BLE001 - an odd message list must not stop the call
            self.tell({"event": "tool_results_unreadable", "error": type(exc).__name__})
            return
        fresh = []
        unknown = 0
        with self._lock:
            for seen in results:
                if seen.call_id in self._observed:
                    continue
                # only a result answering a call this session delivered counts: a tool message the request
                # makes up (with a made-up assistant call beside it) must not satisfy a with_output
                name = self._names.get(seen.call_id)
                unknown += name is None
                self._observed[seen.call_id] = None  # an unknown one is told of once
                if len(self._observed) > _REMEMBERED:
                    self._observed.popitem(last=False)
                if name is None:
                    continue
                fresh.append((name, seen.output, seen.call_id))
        if unknown:
            self.tell({"event": "tool_results_not_delivered", "count": unknown})
        for name, output, call_id in fresh:
            self.observe(name, output, call_id=call_id)

    def observe(self, tool: str, output: Any, *, call_id: str | None = None) -> None:
        """A tool's result (from the session's tools or a tool message): recorded for ``with_output``.

        ``call_id``, for a tool message, is the call it answers: the engine keeps the output only when that is the
        tool's last allowed call (an old message sent again with the history, after a restart too, changes nothing).
        """
        if self.mode == "log-only":
            return
        if self.mode == "shadow":
            with self._lock:
                self.engine.observe_output(self._shadow_state(), tool, output, call_id=call_id)
            return
        self.update(lambda state: self.engine.observe_output(state, tool, output, call_id=call_id))

    def observe_error(self, tool: str, error: BaseException) -> None:
        """A tool's executor raised: counted toward the circuit breaker (enforcing)."""
        if self.mode == "enforce":
            self.update(lambda state: self.engine.observe_error(state, tool, error))
        elif self.mode == "shadow":
            with self._lock:
                self.engine.observe_error(self._shadow_state(), tool, error)

    # --- after the model call ----------------------------------------------------------------------------

    def decide(
        self,
        adapter: Adapter,
        request: Request,
        calls: list[ToolCallView],
        usage: tuple[int, int] | None,
        *,
        streamed: bool,
        api: str | None = None,
    ) -> frozenset[int]:
        """Gate one complete response: the indexes of the calls that reach the caller.

        Raises :class:`ReplayContractError` (with the decision and its failures) when it is rejected.
        """
        removed = list(request.narrowing.removed) if request.narrowing is not None else []
        api = api or adapter.api
        if self.mode == "log-only":
            every = {call.index: True for call in calls}
            step = self.state().total_step_count
            self.evidence.emit(
                DecisionEvidence(
                    "log-only", adapter.provider, api, streamed, "logged", step, 0, None, None, calls, every, (), ()
                )
            )
            return frozenset(every)
        if self.mode == "shadow":
            return self._shadow_decide(adapter, request, calls, usage, streamed=streamed, api=api)
        box: dict[str, Any] = {}

        def change(state: SessionState) -> None:
            decision = self.engine.evaluate(state, calls)
            self.engine.finalize(state, decision, model=request.model, usage=usage)
            if request.narrowing is not None and request.narrowing.removed:
                self.engine.note_narrowing(state, request.narrowing)
            cap = self.max_unguarded_calls
            if cap is not None and state.total_unguarded_calls >= cap:
                self.engine.kill(state, f"max_unguarded_calls {cap} reached")
            box["decision"] = decision
            box["version"] = state.state_version

        self.update(change)
        decision: Decision = box["decision"]
        self.evidence.emit(
            of_decision(
                decision, calls, mode="enforce", provider=adapter.provider, api=api, streamed=streamed, narrowed=removed
            )
        )
        if decision.outcome != "allow":
            self._call(self._on_block, decision)
        if decision.outcome == "reject":
            raise ReplayContractError(
                _rejection(self.session_id, decision), decision=decision, failures=decision.failures
            )
        allowed = decision.allowed
        with self._lock:
            for verdict in allowed:
                call = verdict.call
                if call.call_id:
                    self._names[call.call_id] = call.name
                    if len(self._names) > _REMEMBERED:
                        self._names.popitem(last=False)
                self._wait((call.name, canonical(call.arguments)), [])
        return frozenset(verdict.call.index for verdict in allowed)

    def _shadow_decide(
        self,
        adapter: Adapter,
        request: Request,
        calls: list[ToolCallView],
        usage: tuple[int, int] | None,
        *,
        streamed: bool,
        api: str,
    ) -> frozenset[int]:
        removed = list(request.narrowing.removed) if request.narrowing is not None else []
        with self._lock:
            state = self._shadow_state()
            decision = self.engine.evaluate(state, calls)
            self.engine.finalize(state, decision, model=request.model, usage=usage)
            self.shadow_evaluations += 1
            for verdict in decision.verdicts:
                call = verdict.call
                if call.call_id:
                    self._names[call.call_id] = call.name
                    if len(self._names) > _REMEMBERED:
                        self._names.popitem(last=False)
                failed = [failure_json(f) for f in verdict.failures]
                if decision.outcome == "reject" and not failed:
                    failed = [{"rule": "rejected", "tool": call.name, "detail": "another call of the response failed"}]
                self._wait((call.name, canonical(call.arguments)), failed)
        blocked = [
            {"call_id": v.call.call_id, "name": v.call.name, "failures": [failure_json(f) for f in v.failures]}
            for v in decision.verdicts
            if not v.allowed or decision.outcome == "reject"
        ]
        self.last_shadow_delta = ShadowDelta(
            decision.step, decision.outcome, blocked, removed, [failure_json(f) for f in request.precheck]
        )
        self.evidence.emit(
            of_decision(
                decision,
                calls,
                mode="shadow",
                provider=adapter.provider,
                api=api,
                streamed=streamed,
                narrowed=removed,
                precheck=request.precheck,
            )
        )
        return frozenset(call.index for call in calls)

    # --- a tool run through the session's tools --------------------------------------------------------

    def _wait(self, key: tuple[str, str], failures: list[dict[str, Any]]) -> None:
        """Remember a delivered call until the session's tool runs it (the oldest forgotten past a bound)."""
        waiting = self._pending.setdefault(key, [])
        waiting.append(failures)
        del waiting[:-64]
        if len(self._pending) > _REMEMBERED:
            del self._pending[next(iter(self._pending))]

    def take_pending(self, tool: str, arguments: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """The failures of a delivered model call exactly like this one, not yet run (it is taken); ``None``: none.

        Enforcing, a delivered call has no failures; in shadow mode, the failures enforcing would have reported.
        """
        key = (tool, canonical(arguments))
        with self._lock:
            waiting = self._pending.get(key)
            if not waiting:
                return None
            failures = waiting.pop(0)
            if not waiting:
                del self._pending[key]
            return failures

    def direct(self, tool: str, arguments: Mapping[str, Any]) -> Decision:
        """Gate a call the model did not ask for (the application calls a session tool itself): one step."""
        try:
            text = json.dumps(dict(arguments), default=str)
        except Exception:  # noqa: BLE001 - not encodable (an object whose str() raises...): malformed arguments
            text = "<arguments that are not JSON>"
        call = ToolCallView.parse(0, "", tool, text)
        if self.mode == "shadow":
            with self._lock:
                state = self._shadow_state()
                decision = self.engine.evaluate(state, [call])
                self.engine.finalize(state, decision, model=None, usage=None)
            self.evidence.emit(
                of_decision(decision, [call], mode="shadow", provider="local", api="tools", streamed=False, narrowed=())
            )
            return decision
        box: dict[str, Decision] = {}

        def change(state: SessionState) -> None:
            decision = self.engine.evaluate(state, [call])
            self.engine.finalize(state, decision, model=None, usage=None)
            box["decision"] = decision

        self.update(change)
        decision = box["decision"]
        self.evidence.emit(
            of_decision(decision, [call], mode="enforce", provider="local", api="tools", streamed=False, narrowed=())
        )
        if decision.outcome != "allow":
            self._call(self._on_block, decision)
        return decision

    def unguarded(self, reason: str, adapter: Adapter | None = None, *, streamed: bool = False) -> None:
        """A response went to the caller unchecked (``on_error="allow"`` and governing it failed).

        Enforcing, it is counted (``total_unguarded_calls``; ``max_unguarded_calls`` reached kills the session)
        and recorded: a decision span with outcome ``unguarded`` and an ``internal_error`` failure naming why.
        """
        self.tell({"event": "unguarded_call", "reason": reason})
        if self.mode != "enforce":
            return

        def count(state: SessionState) -> None:
            state.total_unguarded_calls += 1
            state.state_version += 1
            cap = self.max_unguarded_calls
            if cap is not None and state.total_unguarded_calls >= cap:
                self.engine.kill(state, f"max_unguarded_calls {cap} reached")

        state = self.update(count)
        failure = Failure("internal_error", f"let through unchecked (on_error allow): {reason}", source=None)
        self.evidence.emit(
            DecisionEvidence(
                "enforce",
                adapter.provider if adapter is not None else "local",
                adapter.api if adapter is not None else "tools",
                streamed,
                "unguarded",
                state.total_step_count,
                state.state_version,
                state.current_phase,
                state.current_phase,
                (),
                {},
                (failure,),
                (),
            )
        )


def canonical(arguments: Mapping[str, Any] | None) -> str:
    """The arguments as canonical JSON (sorted keys): how a model's call and an executor's call are matched.

    Arguments that cannot be encoded get a text no model call has (they then match nothing).
    """
    if arguments is None:
        return "null"
    try:
        return _CANONICAL.encode(arguments)
    except Exception:  # noqa: BLE001 - hostile values (a str() that raises, cycles, deep nesting) match nothing
        return "<arguments that are not JSON>"


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)
"""Made once (``json.dumps`` with options builds an encoder per call)."""


def _shown(name: str | None) -> str:
    """A tool name as a one-line message shows it (a name with control characters quoted, long ones cut)."""
    text = name if isinstance(name, str) else repr(name)
    if not text.isprintable():
        text = repr(text)
    return text if len(text) <= 200 else text[:200] + "..."


def _rejection(session_id: str, decision: Decision) -> str:
    failures = decision.failures
    if not failures:
        return f"session {session_id}: step {decision.step} rejected"
    first = failures[0]
    where = f" ({first.source})" if first.source is not None else ""
    tool = f"{_shown(first.tool)}: " if first.tool else ""
    more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
    return f"session {session_id}: step {decision.step} rejected: {tool}{first.rule}: {first.detail}{where}{more}"
