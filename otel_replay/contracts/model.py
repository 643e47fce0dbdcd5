"""What a contracts directory says, as values: one :class:`ToolContract` per tool and one :class:`SessionContract`.

The loader (:mod:`otel_replay.contracts.loader`) builds these from YAML and
checks them; the engine (:mod:`otel_replay.contracts.engine`) enforces them.
Every rule keeps the :class:`Source` it came from, so a failure can say which
file and line wrote the rule that blocked a call.

All values are frozen: a :class:`ContractSet` is shared by every session and
thread that governs with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "SIDE_EFFECTS",
    "ArgumentInvariant",
    "CircuitBreaker",
    "ContractSet",
    "GateSetting",
    "LoopDetection",
    "OutputCondition",
    "Phase",
    "Precondition",
    "Price",
    "SessionContract",
    "SessionLimits",
    "SideEffect",
    "Source",
    "ToolContract",
    "Transitions",
]

SideEffect = Literal["read", "write", "destructive", "admin", "financial"]
SIDE_EFFECTS: tuple[SideEffect, ...] = ("read", "write", "destructive", "admin", "financial")
GateSetting = Literal["allow", "block"]


@dataclass(frozen=True)
class Source:
    """Where a rule was written: the contract file and the 1-based line of its YAML node."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class ArgumentInvariant:
    """One check of a tool call's argument at ``path`` (a ``$.a.b[0]`` path into the arguments object).

    Every bound that is set must hold; an argument missing at ``path`` fails unless ``optional``.
    """

    path: str
    source: Source
    gte: float | None = None
    gt: float | None = None
    lte: float | None = None
    lt: float | None = None
    equals: Any = None
    has_equals: bool = False
    one_of: tuple[Any, ...] | None = None
    regex: str | None = None
    max_length: int | None = None
    optional: bool = False


@dataclass(frozen=True)
class OutputCondition:
    """A condition on a prior tool's output (``with_output``): the value at ``path`` equals ``equals``."""

    path: str
    equals: Any
    source: Source


@dataclass(frozen=True)
class Precondition:
    """A tool runs only after ``requires_prior_tool`` ran, and (if given) its output met ``with_output``."""

    requires_prior_tool: str
    source: Source
    with_output: tuple[OutputCondition, ...] = ()


@dataclass(frozen=True)
class Transitions:
    """The phase rules of one tool: the phases it may be called in (``None``: any) and the phase it moves to."""

    valid_in_phases: tuple[str, ...] | None = None
    advances_to: str | None = None


@dataclass(frozen=True)
class ToolContract:
    """The contract of one tool (one YAML file)."""

    tool: str
    source: Source
    side_effect: SideEffect = "read"
    evidence_class: Literal["local_transaction", "ack_only", "unverifiable"] | None = None
    commit_requirement: Literal["acknowledged", "none"] | None = None
    transitions: Transitions = field(default_factory=Transitions)
    preconditions: tuple[Precondition, ...] = ()
    forbids_after: tuple[str, ...] = ()
    argument_value_invariants: tuple[ArgumentInvariant, ...] = ()
    gate: GateSetting | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Fields the seed's contracts carry for other tools (timeouts, retries, rate_limits, assertions,
    golden_cases, allowed_errors): kept as read, not enforced by governance."""

    @property
    def state_bearing(self) -> bool:
        """Whether calling this tool changes what later calls may do (commit requirement, transitions, forbids)."""
        return bool(
            self.commit_requirement not in (None, "none")
            or self.transitions.advances_to
            or self.transitions.valid_in_phases is not None
            or self.forbids_after
        )


@dataclass(frozen=True)
class Phase:
    """One phase of the session's state machine."""

    name: str
    source: Source
    initial: bool = False
    terminal: bool = False


@dataclass(frozen=True)
class LoopDetection:
    """Block a call when ``threshold`` identical calls (same tool, same arguments) fall in the last ``window``."""

    window: int
    threshold: int
    source: Source


@dataclass(frozen=True)
class CircuitBreaker:
    """Kill the session after this many consecutive blocked calls or consecutive tool errors."""

    source: Source
    consecutive_blocks: int | None = None
    consecutive_errors: int | None = None


@dataclass(frozen=True)
class Price:
    """The user's price of one model, in dollars per million tokens (for ``max_cost_per_session``)."""

    input_per_million: float
    output_per_million: float
    source: Source


@dataclass(frozen=True)
class SessionLimits:
    """The session's limits; ``None`` is no limit."""

    max_steps: int | None = None
    max_tool_calls: int | None = None
    max_cost_per_session: float | None = None
    max_calls_per_tool: Mapping[str, int] = field(default_factory=dict)
    loop_detection: LoopDetection | None = None
    circuit_breaker: CircuitBreaker | None = None


@dataclass(frozen=True)
class SessionContract:
    """``session.yaml``: the phase machine, the limits, the risk defaults and the price table."""

    source: Source
    schema_version: str = "1.0"
    agent: str | None = None
    phases: tuple[Phase, ...] = ()
    transitions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    session_limits: SessionLimits = field(default_factory=SessionLimits)
    risk_defaults: Mapping[str, GateSetting] = field(default_factory=dict)
    prices: Mapping[str, Price] = field(default_factory=dict)
    provider_constraints: Mapping[str, Any] = field(default_factory=dict)

    @property
    def initial_phase(self) -> str | None:
        """The phase a new session starts in (``None`` when the session has no phases)."""
        for phase in self.phases:
            if phase.initial:
                return phase.name
        return None


@dataclass(frozen=True)
class ContractSet:
    """Every contract of one directory, checked against each other by the loader."""

    directory: Path
    session: SessionContract
    tools: Mapping[str, ToolContract]
    digest: str
    """A hash of the files' bytes: evidence and backtests name the contracts a verdict was made under."""

    def tool(self, name: str) -> ToolContract | None:
        """The contract of tool ``name``, or ``None`` when it has none."""
        return self.tools.get(name)

    def effective_gate(self, contract: ToolContract) -> GateSetting:
        """The tool's own ``gate``, else the session's ``risk_defaults`` for its side effect, else ``allow``."""
        if contract.gate is not None:
            return contract.gate
        return self.session.risk_defaults.get(contract.side_effect, "allow")
