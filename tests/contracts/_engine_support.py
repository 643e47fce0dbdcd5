"""The seed's refund bot as contract values, built directly from the model (no loader), for the engine tests."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from otel_replay.contracts.engine import Decision, Engine, ToolCallView
from otel_replay.contracts.model import (
    ArgumentInvariant,
    ContractSet,
    OutputCondition,
    Phase,
    Precondition,
    Price,
    SessionContract,
    SessionLimits,
    Source,
    ToolContract,
    Transitions,
)
from otel_replay.contracts.state import SessionState

__all__ = ["call", "calls", "refund_bot", "run_step", "src"]


def src(file: str, line: int = 1) -> Source:
    """A source in the test contracts directory."""
    return Source(file, line)


def refund_bot(
    *,
    limits: SessionLimits | None = None,
    prices: Mapping[str, Price] | None = None,
    risk_defaults: Mapping[str, str] | None = None,
    extra_tools: Sequence[ToolContract] = (),
    issue_refund_gate: str | None = None,
) -> ContractSet:
    """The seed's refund bot: triage -> customer_identified -> eligibility_checked -> refund_issued -> completed."""
    lookup = ToolContract(
        tool="lookup_customer",
        source=src("lookup_customer.yaml"),
        side_effect="read",
        transitions=Transitions(valid_in_phases=("triage",), advances_to="customer_identified"),
        argument_value_invariants=(
            ArgumentInvariant(path="$.customer_email", source=src("lookup_customer.yaml", 12), regex="^.+@.+"),
        ),
    )
    eligibility = ToolContract(
        tool="check_eligibility",
        source=src("check_eligibility.yaml"),
        transitions=Transitions(valid_in_phases=("customer_identified",), advances_to="eligibility_checked"),
        preconditions=(Precondition(requires_prior_tool="lookup_customer", source=src("check_eligibility.yaml", 7)),),
        argument_value_invariants=(
            ArgumentInvariant(path="$.order_id", source=src("check_eligibility.yaml", 10), regex="^ORD-[0-9]+$"),
        ),
    )
    refund = ToolContract(
        tool="issue_refund",
        source=src("issue_refund.yaml"),
        side_effect="financial",
        transitions=Transitions(valid_in_phases=("eligibility_checked",), advances_to="refund_issued"),
        preconditions=(
            Precondition(
                requires_prior_tool="check_eligibility",
                source=src("issue_refund.yaml", 8),
                with_output=(OutputCondition(path="$.eligible", equals=True, source=src("issue_refund.yaml", 10)),),
            ),
        ),
        forbids_after=("issue_refund",),
        argument_value_invariants=(
            ArgumentInvariant(path="$.amount", source=src("issue_refund.yaml", 14), gt=0, lte=500),
            ArgumentInvariant(path="$.customer_id", source=src("issue_refund.yaml", 17), max_length=32),
        ),
        gate=issue_refund_gate,  # type: ignore[arg-type]
    )
    close = ToolContract(
        tool="close_ticket",
        source=src("close_ticket.yaml"),
        side_effect="write",
        transitions=Transitions(valid_in_phases=("refund_issued",), advances_to="completed"),
    )
    notes = ToolContract(tool="add_note", source=src("add_note.yaml"), side_effect="read")
    session = SessionContract(
        source=src("session.yaml"),
        agent="refund-support-bot",
        phases=(
            Phase("triage", src("session.yaml", 5), initial=True),
            Phase("customer_identified", src("session.yaml", 7)),
            Phase("eligibility_checked", src("session.yaml", 8)),
            Phase("refund_issued", src("session.yaml", 9)),
            Phase("completed", src("session.yaml", 10), terminal=True),
        ),
        transitions={
            "triage": ("customer_identified",),
            "customer_identified": ("eligibility_checked",),
            "eligibility_checked": ("refund_issued",),
            "refund_issued": ("completed",),
        },
        session_limits=limits if limits is not None else SessionLimits(),
        risk_defaults=dict(risk_defaults) if risk_defaults is not None else {},  # type: ignore[arg-type]
        prices=dict(prices) if prices is not None else {},
    )
    tools = {t.tool: t for t in (lookup, eligibility, refund, close, notes, *extra_tools)}
    return ContractSet(directory=Path("contracts"), session=session, tools=tools, digest="test")


def call(
    name: str, arguments: Any = None, *, index: int = 0, call_id: str | None = None, text: str | None = None
) -> ToolCallView:
    """A tool call with ``arguments`` written as JSON (or the raw ``text``)."""
    body = text if text is not None else json.dumps(arguments if arguments is not None else {})
    return ToolCallView.parse(index, call_id or f"call_{index}_{name}", name, body)


def calls(*items: tuple[str, Any]) -> list[ToolCallView]:
    """Numbered calls from (name, arguments) pairs."""
    return [call(name, args, index=i) for i, (name, args) in enumerate(items)]


def run_step(
    engine: Engine,
    state: SessionState,
    items: Sequence[ToolCallView],
    *,
    model: str | None = None,
    usage: tuple[int, int] | None = None,
) -> Decision:
    """Evaluate one response and finalize it (the session's order)."""
    decision = engine.evaluate(state, items)
    engine.finalize(state, decision, model=model, usage=usage)
    return decision
