"""``session.tools``: the application's tool executors, governed, each returning its result and its verdict.

``govern(client, ..., tools={"lookup_customer": lookup_customer, ...})`` makes ``session.tools.lookup_customer``
(or ``session.tools["lookup_customer"]``). Calling it with the tool call's arguments (a mapping, or keywords):

1. matches the call against the calls the model's responses were allowed to make and have not run yet;
   a call the model did not ask for is gated on its own, as one step (enforcing: a refused one does not run);
2. runs the executor: a tool whose contract says ``side_effect`` ``financial``, ``destructive`` or ``write``
   must be declared with :func:`otel_replay.instrumentation.tool` and a gate (``@tool(side_effect=...,
   gate=action_gate)``), so it commits through the gate's rail and returns the rail's receipt (the one kind
   of gated tool there is: replay can later compensate it); any other executor is wrapped as a
   :func:`~otel_replay.instrumentation.tool` for its ``execute_tool`` span;
3. records the result for the ``with_output`` preconditions that name the tool (an exception counts toward
   the circuit breaker and is re-raised unchanged).

It returns a :class:`ToolRun`: ``result`` (``None`` when the call was refused) and ``constraint_verdict``.
An ``async def`` executor gives an awaitable.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from otel_replay.contracts.evidence import failure_json
from otel_replay.contracts.model import ContractSet
from otel_replay.contracts.pipeline import Governor
from otel_replay.errors import ContractError
from otel_replay.instrumentation.tools import tool as declare_tool

__all__ = ["ACTING", "ConstraintVerdict", "SessionTools", "ToolRun", "prepare_executors"]

ACTING: Final = frozenset({"financial", "destructive", "write"})
"""Side effects whose executor must commit through an :class:`~otel_replay.gate.ActionGate`."""


@dataclass(frozen=True)
class ConstraintVerdict:
    """Whether the call passed the contracts, and the failures when not (redacted, as on the decision span)."""

    passed: bool
    failures: list[dict[str, Any]] = field(default_factory=list)
    matched_model_call: bool = False
    """The call was one a model response was allowed to make (else it was gated on its own)."""


@dataclass(frozen=True)
class ToolRun:
    """What a session tool returns: the executor's ``result`` and the ``constraint_verdict``."""

    result: Any
    constraint_verdict: ConstraintVerdict


def _output_of(result: Any) -> Any:
    """What ``with_output`` paths read of a result: a receipt's JSON form, else the result."""
    to_json = getattr(result, "to_json", None)
    if callable(to_json):
        try:
            return to_json()
        except Exception:  # noqa: BLE001 - a result that cannot say itself is recorded as it is
            return result
    return result


def prepare_executors(
    contracts: ContractSet, executors: Mapping[str, Callable[..., Any]]
) -> dict[str, Callable[..., Any]]:
    """Check each executor against its contract and wrap the plain ones as tools (for their spans).

    Raises :class:`ContractError` for a name that is not text, an executor that is not callable, or an acting
    tool (``financial``/``destructive``/``write``) whose executor does not commit through a gate.
    """
    prepared: dict[str, Callable[..., Any]] = {}
    for name, fn in executors.items():
        if not isinstance(name, str) or not name:
            raise ContractError(f"govern(): tools: {name!r} is not a tool name")
        if not callable(fn):
            raise ContractError(f"govern(): tools: {name}: {type(fn).__name__} is not callable")
        contract = contracts.tool(name)
        spec = getattr(fn, "__otel_replay_tool__", None)
        gated = spec is not None and getattr(spec, "gate", None) is not None
        if contract is not None and contract.side_effect in ACTING and not gated:
            where = f" ({contract.source})" if contract.source is not None else ""
            raise ContractError(
                f"govern(): tools: {name} has side_effect {contract.side_effect}{where}: its executor must commit "
                f"through an ActionGate: declare it with @tool(side_effect={contract.side_effect!r}, gate=...)"
            )
        if spec is None:
            side_effect = contract.side_effect if contract is not None else None
            fn = declare_tool(name, side_effect=side_effect)(fn)
        prepared[name] = fn
    return prepared


class _Executor:
    """One governed executor (``session.tools.<name>``)."""

    def __init__(self, name: str, fn: Callable[..., Any], governor: Governor) -> None:
        self.name = name
        self.fn = fn
        self.governor = governor
        self.aio = inspect.iscoroutinefunction(fn)
        self.__doc__ = getattr(fn, "__doc__", None)

    def _verdict(self, arguments: dict[str, Any]) -> ConstraintVerdict:
        governor = self.governor
        if governor.mode == "log-only":
            return ConstraintVerdict(True)
        failures = governor.take_pending(self.name, arguments)
        if failures is not None:
            return ConstraintVerdict(not failures, failures, matched_model_call=True)
        decision = governor.direct(self.name, arguments)
        passed = decision.outcome == "allow"
        return ConstraintVerdict(passed, [failure_json(f) for f in decision.failures])

    def _arguments(self, arguments: Mapping[str, Any] | None, keywords: dict[str, Any]) -> dict[str, Any]:
        if arguments is not None and not isinstance(arguments, Mapping):
            raise ContractError(
                f"session.tools.{self.name}: give the arguments as a mapping or keywords, "
                f"not {type(arguments).__name__}"
            )
        return {**(dict(arguments) if arguments else {}), **keywords}

    def __call__(self, arguments: Mapping[str, Any] | None = None, /, **keywords: Any) -> Any:
        args = self._arguments(arguments, keywords)
        if self.aio:
            return self._acall(args)
        verdict = self._verdict(args)
        if not verdict.passed and self.governor.mode == "enforce":
            return ToolRun(None, verdict)
        try:
            with self.governor.scope():  # the tool's span carries the session id
                result = self.fn(**args)
        except Exception as exc:
            self.governor.observe_error(self.name, exc)
            raise
        self.governor.observe(self.name, _output_of(result))
        return ToolRun(result, verdict)

    async def _acall(self, args: dict[str, Any]) -> ToolRun:
        verdict = self._verdict(args)
        if not verdict.passed and self.governor.mode == "enforce":
            return ToolRun(None, verdict)
        try:
            with self.governor.scope():
                result = await self.fn(**args)
        except Exception as exc:
            self.governor.observe_error(self.name, exc)
            raise
        self.governor.observe(self.name, _output_of(result))
        return ToolRun(result, verdict)


class SessionTools(Mapping[str, Callable[..., Any]]):
    """The session's governed executors, by name: ``session.tools.name(...)`` or ``session.tools["name"](...)``."""

    def __init__(self, executors: Mapping[str, Callable[..., Any]], governor: Governor) -> None:
        """Govern each of ``executors`` (already checked by :func:`prepare_executors`)."""
        self._executors = {name: _Executor(name, fn, governor) for name, fn in executors.items()}

    def __getitem__(self, name: str) -> Callable[..., Any]:
        return self._executors[name]

    def __getattr__(self, name: str) -> Callable[..., Any]:
        executors = self.__dict__.get("_executors", {})
        if name in executors:
            return executors[name]
        raise AttributeError(
            f"session.tools has no tool {name!r} (tools given: {', '.join(sorted(executors)) or 'none'})"
        )

    def __iter__(self) -> Iterator[str]:
        return iter(self._executors)

    def __len__(self) -> int:
        return len(self._executors)
