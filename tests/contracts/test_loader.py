"""Loading a contracts directory: the refund bot's contracts as values, and every kind of problem reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_replay.contracts import ContractSet
from otel_replay.contracts.loader import load_contracts

REFUND_BOT = Path(__file__).parent / "refund_bot"


def test_the_refund_bot_loads_with_every_rule_and_its_line() -> None:
    contracts = load_contracts(REFUND_BOT)
    assert isinstance(contracts, ContractSet)
    assert sorted(contracts.tools) == ["check_eligibility", "issue_refund", "lookup_customer"]
    session = contracts.session
    assert session.agent == "refund-support-bot"
    assert session.initial_phase == "triage"
    assert [phase.name for phase in session.phases if phase.terminal] == ["completed"]
    assert session.transitions["eligibility_checked"] == ("refund_issued",)
    limits = session.session_limits
    assert (limits.max_steps, limits.max_tool_calls, limits.max_cost_per_session) == (10, 8, 1.0)
    assert limits.max_calls_per_tool == {"lookup_customer": 3, "check_eligibility": 2, "issue_refund": 1}
    assert limits.loop_detection is not None and (limits.loop_detection.window, limits.loop_detection.threshold) == (
        5,
        3,
    )
    assert limits.circuit_breaker is not None and limits.circuit_breaker.consecutive_errors == 2
    assert session.prices["gpt-4o-mini"].output_per_million == 0.6
    refund = contracts.tools["issue_refund"]
    assert refund.side_effect == "financial" and refund.gate == "block"
    assert refund.forbids_after == ("issue_refund",)
    (precondition,) = refund.preconditions
    assert precondition.requires_prior_tool == "check_eligibility"
    assert precondition.with_output[0].path == "$.eligible" and precondition.with_output[0].equals is True
    amount = refund.argument_value_invariants[0]
    assert (amount.path, amount.gt, amount.lte) == ("$.amount", 0, 500)
    assert amount.source.file.endswith("issue_refund.yaml") and amount.source.line == 21
    assert refund.argument_value_invariants[1].one_of == ("USD", "EUR", "GBP")
    assert contracts.effective_gate(contracts.tools["lookup_customer"]) == "allow"
    assert contracts.effective_gate(refund) == "block"
    lookup = contracts.tools["lookup_customer"]
    assert lookup.extra["timeouts"] == {"total_ms": 30000}
    assert lookup.extra["rate_limits"]["on_429"]["respect_retry_after"] is True
    assert lookup.transitions.valid_in_phases == ("triage",)


def test_the_digest_changes_with_any_byte_and_not_with_the_directory(tmp_path: Path) -> None:
    first = load_contracts(REFUND_BOT).digest
    copy = tmp_path / "copy"
    copy.mkdir()
    for file in REFUND_BOT.iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    assert load_contracts(copy).digest == first
    session = copy / "session.yaml"
    session.write_bytes(session.read_bytes() + b"\n# a comment\n")
    assert load_contracts(copy).digest != first


@pytest.mark.parametrize("name", ["README.md", ".hidden.yaml", "notes.txt"])
def test_files_that_are_not_contracts_are_not_read(tmp_path: Path, name: str) -> None:
    for file in REFUND_BOT.iterdir():
        (tmp_path / file.name).write_bytes(file.read_bytes())
    (tmp_path / name).write_text("tool: [not, a, contract\n")
    assert sorted(load_contracts(tmp_path).tools) == ["check_eligibility", "issue_refund", "lookup_customer"]
