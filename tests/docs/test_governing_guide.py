"""The governing guide shows the example's own contracts, and they load."""

from __future__ import annotations

import re
from pathlib import Path

from otel_replay.contracts.loader import load_contracts

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guides" / "governing.md"
CONTRACTS = ROOT / "examples" / "refund_bot" / "contracts"


def test_the_yaml_the_guide_shows_is_the_examples_contracts() -> None:
    shown = re.findall(r"^```yaml\n(.*?)^```", GUIDE.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)
    files = {path.name: path.read_text(encoding="utf-8") for path in CONTRACTS.glob("*.yaml")}
    assert len(shown) == 2
    assert shown[0] == files["issue_refund.yaml"]
    # session.yaml as shown, less its comment lines
    assert _lines(shown[1]) == _lines(files["session.yaml"])
    assert set(load_contracts(CONTRACTS).tools) == {"lookup_customer", "check_eligibility", "issue_refund"}


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_every_field_of_the_contract_model_is_in_the_guide() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    fields = [
        "side_effect", "evidence_class", "commit_requirement", "valid_in_phases", "advances_to",
        "requires_prior_tool", "with_output", "forbids_after", "argument_value_invariants", "gte", "gt", "lte", "lt",
        "equals", "one_of", "regex", "max_length", "optional", "gate", "schema_version", "agent", "phases", "initial",
        "terminal", "transitions", "max_steps", "max_tool_calls", "max_cost_per_session", "max_calls_per_tool",
        "loop_detection", "window", "threshold", "circuit_breaker", "consecutive_blocks", "consecutive_errors",
        "risk_defaults", "prices", "input_per_million", "output_per_million", "provider_constraints",
    ]  # fmt: skip
    missing = [name for name in fields if f"`{name}" not in text and f"{name}`" not in text]
    assert not missing, missing
