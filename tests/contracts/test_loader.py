"""Loading a contracts directory: the refund bot's contracts as values, and every kind of problem reported."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from otel_replay.contracts import ContractSet, _yaml
from otel_replay.contracts._read import INVARIANT_CHECKS, LIMIT_FIELDS, SESSION_FIELDS, TOOL_FIELDS
from otel_replay.contracts._yaml import INVALID, FileProblem, NodeReader
from otel_replay.contracts.loader import load_contracts, validate_file
from otel_replay.errors import ContractLoadError

from ._corpus import REFUND_BOT, BadCase, Expected, bad_cases


def _copy(source: Path, target: Path) -> Path:
    target.mkdir(parents=True)
    for file in source.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    return target


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
    copy = _copy(REFUND_BOT, tmp_path / "copy")
    assert load_contracts(copy).digest == first
    session = copy / "session.yaml"
    session.write_bytes(session.read_bytes() + b"\n# a comment\n")
    assert load_contracts(copy).digest != first


@pytest.mark.parametrize(
    "name", ["README.md", ".hidden.yaml", "notes.txt", "close_ticket.yaml~", "close_ticket.yaml.bak", "schema.json"]
)
def test_files_that_are_not_contracts_are_not_read(tmp_path: Path, name: str) -> None:
    directory = _copy(REFUND_BOT, tmp_path / "contracts")
    (directory / name).write_text("tool: [not, a, contract\n")
    assert sorted(load_contracts(directory).tools) == ["check_eligibility", "issue_refund", "lookup_customer"]


# --- every problem of one file, from the corpus (tests/contracts/bad) ---


def _has(problems: list[str], file: Path, expected: Expected) -> bool:
    where = f"{file}:{expected.line}: " + (f"{expected.field}: " if expected.field else "")
    return any(problem.startswith(where) and expected.text in problem for problem in problems)


@pytest.mark.parametrize("case", bad_cases(), ids=lambda case: case.name)
def test_validate_file_reports_each_problem_with_its_line_and_field(case: BadCase) -> None:
    problems = validate_file(case.file, kind=case.kind)
    for expected in case.expected:
        assert _has(problems, case.file, expected), problems


@pytest.mark.parametrize("case", bad_cases(), ids=lambda case: case.name)
def test_a_bad_file_in_a_directory_fails_the_load_with_the_same_problem(case: BadCase, tmp_path: Path) -> None:
    directory = _copy(REFUND_BOT, tmp_path / "contracts")
    target = directory / ("session.yaml" if case.kind == "session" else "issue_refund.yaml")
    target.write_bytes(case.file.read_bytes())
    with pytest.raises(ContractLoadError) as caught:
        load_contracts(directory)
    for expected in case.expected:
        assert _has(caught.value.problems, target, expected), caught.value.problems
    assert str(caught.value).startswith(caught.value.problems[0])


def test_the_directory_may_hold_yml_files_too(tmp_path: Path) -> None:
    directory = _copy(REFUND_BOT, tmp_path / "contracts")
    (directory / "lookup_customer.yaml").rename(directory / "lookup_customer.yml")
    (directory / "session.yaml").rename(directory / "session.yml")
    assert sorted(load_contracts(directory).tools) == ["check_eligibility", "issue_refund", "lookup_customer"]


# --- problems only the whole directory shows ---


def _problems(directory: Path) -> list[str]:
    with pytest.raises(ContractLoadError) as caught:
        load_contracts(directory)
    return caught.value.problems


def _edit(file: Path, old: str, new: str) -> None:
    text = file.read_text()
    assert old in text
    file.write_text(text.replace(old, new))


@pytest.fixture
def contracts(tmp_path: Path) -> Path:
    return _copy(REFUND_BOT, tmp_path / "contracts")


def test_a_directory_that_does_not_exist_or_is_a_file_is_named(tmp_path: Path) -> None:
    assert _problems(tmp_path / "nowhere") == [f"{tmp_path / 'nowhere'}: the contracts directory does not exist"]
    file = tmp_path / "session.yaml"
    file.write_text("agent: x\n")
    (problem,) = _problems(file)
    assert problem.startswith(f"{file}: is a file, not a directory")


def test_a_missing_session_yaml_is_an_error(contracts: Path) -> None:
    (contracts / "session.yaml").unlink()
    assert _problems(contracts) == [
        f"{contracts / 'session.yaml'}: missing: a contracts directory needs session.yaml (phases, limits)"
    ]


def test_two_session_files_are_an_error(contracts: Path) -> None:
    (contracts / "session.yml").write_bytes((contracts / "session.yaml").read_bytes())
    assert _problems(contracts) == [f"{contracts / 'session.yml'}: a second session contract beside session.yaml"]


def test_a_tool_named_in_forbids_after_without_a_contract_is_an_error_with_the_nearest_name(contracts: Path) -> None:
    _edit(contracts / "issue_refund.yaml", "forbids_after: [issue_refund]", "forbids_after: [issue_refnd]")
    assert _problems(contracts) == [
        f"{contracts / 'issue_refund.yaml'}:18: forbids_after: tool 'issue_refnd' has no contract (issue_refnd.yaml)"
        " (did you mean 'issue_refund'?)"
    ]


def test_a_precondition_on_a_tool_without_a_contract_is_an_error(contracts: Path) -> None:
    (contracts / "lookup_customer.yaml").unlink()
    _edit(contracts / "session.yaml", "    lookup_customer: 3\n", "")
    (problem,) = _problems(contracts)
    assert problem == (
        f"{contracts / 'check_eligibility.yaml'}:11: preconditions[0].requires_prior_tool: "
        "tool 'lookup_customer' has no contract (lookup_customer.yaml)"
    )


def test_a_per_tool_limit_on_a_tool_without_a_contract_is_an_error(contracts: Path) -> None:
    _edit(contracts / "session.yaml", "    issue_refund: 1\n", "    issue_refunds: 1\n")
    (problem,) = _problems(contracts)
    assert problem.startswith(f"{contracts / 'session.yaml'}:27: session_limits.max_calls_per_tool.issue_refunds: ")
    assert problem.endswith("has no contract (issue_refunds.yaml) (did you mean 'issue_refund'?)")


def test_a_phase_a_tool_names_must_be_defined_in_session_yaml(contracts: Path) -> None:
    _edit(
        contracts / "check_eligibility.yaml", "valid_in_phases: [customer_identified]", "valid_in_phases: [identified]"
    )
    _edit(contracts / "check_eligibility.yaml", "advances_to: eligibility_checked", "advances_to: checked_eligibility")
    assert _problems(contracts) == [
        f"{contracts / 'check_eligibility.yaml'}:7: transitions.valid_in_phases: "
        "phase 'identified' is not defined in session.yaml (did you mean 'customer_identified'?)",
        f"{contracts / 'check_eligibility.yaml'}:8: transitions.advances_to: "
        "phase 'checked_eligibility' is not defined in session.yaml",
    ]


def test_tools_naming_phases_need_a_session_with_phases(contracts: Path) -> None:
    (contracts / "session.yaml").write_text("agent: refund-support-bot\n")
    problems = _problems(contracts)
    assert len(problems) == 6
    assert all("is not defined in session.yaml (session.yaml defines no phases)" in problem for problem in problems)


def test_a_phase_advance_no_transition_allows_is_an_error(contracts: Path) -> None:
    _edit(contracts / "lookup_customer.yaml", "advances_to: customer_identified", "advances_to: refund_issued")
    assert _problems(contracts) == [
        f"{contracts / 'lookup_customer.yaml'}:1: transitions.advances_to: no transition in session.yaml leads from "
        "triage to 'refund_issued': every call would be blocked"
    ]


def test_a_tool_advancing_to_the_phase_it_is_in_needs_no_transition(contracts: Path) -> None:
    _edit(contracts / "lookup_customer.yaml", "advances_to: customer_identified", "advances_to: triage")
    assert load_contracts(contracts).tools["lookup_customer"].transitions.advances_to == "triage"


def test_a_file_must_be_named_after_its_tool(contracts: Path) -> None:
    (contracts / "lookup_customer.yaml").rename(contracts / "lookup.yaml")
    assert _problems(contracts) == [
        f"{contracts / 'lookup.yaml'}:1: tool: tool 'lookup_customer' must be in a file named lookup_customer.yaml"
    ]


def test_the_same_tool_in_two_files_is_an_error(contracts: Path) -> None:
    (contracts / "issue_refund.yml").write_bytes((contracts / "issue_refund.yaml").read_bytes())
    assert _problems(contracts) == [
        f"{contracts / 'issue_refund.yml'}:1: tool: tool 'issue_refund' is also defined in "
        f"{contracts / 'issue_refund.yaml'}"
    ]


def test_no_tool_may_be_named_session(contracts: Path) -> None:
    (contracts / "session.yml").write_text("tool: session\n")
    problems = _problems(contracts)
    assert f"{contracts / 'session.yml'}: a second session contract beside session.yaml" in problems
    (contracts / "session.yml").rename(contracts / "Session.YAML")
    assert _problems(contracts) == [
        f"{contracts / 'Session.YAML'}:1: tool: no tool can be named 'session' (session.yaml is the session)"
    ]


def test_every_problem_of_every_file_is_reported_in_file_and_line_order(contracts: Path) -> None:
    _edit(contracts / "session.yaml", "max_steps: 10", "max_step: 10")
    _edit(contracts / "session.yaml", "threshold: 3", "threshold: 9")
    _edit(contracts / "issue_refund.yaml", "gate: block", "gate: blok")
    _edit(contracts / "issue_refund.yaml", "    lte: 500", "    lte: -1")
    _edit(contracts / "lookup_customer.yaml", "side_effect: read", "side_efect: read")
    with pytest.raises(ContractLoadError) as caught:
        load_contracts(contracts)
    problems = caught.value.problems
    assert [problem.split(": ")[0].rsplit("/", 1)[1] for problem in problems] == [
        "issue_refund.yaml:5",
        "issue_refund.yaml:21",
        "lookup_customer.yaml:2",
        "session.yaml:21",
        "session.yaml:29",
    ]
    assert "did you mean 'block'?" in problems[0]
    assert "gt 0 and lte -1 cannot all hold" in problems[1]
    assert "did you mean 'side_effect'?" in problems[2]
    assert "did you mean 'max_steps'?" in problems[3]
    assert "window 5 is smaller than threshold 9" in problems[4]
    assert str(caught.value) == problems[0] + " (and 4 more problems)"
    assert isinstance(caught.value, ValueError)


def test_a_bad_tool_file_does_not_make_the_tools_naming_it_fail_too(contracts: Path) -> None:
    (contracts / "check_eligibility.yaml").write_text("tool: check_eligibility\nside_effect: reed\n")
    (problem,) = _problems(contracts)
    assert "unknown value 'reed' (did you mean 'read'?)" in problem


def test_a_directory_with_only_session_yaml_loads_with_no_tools(tmp_path: Path) -> None:
    (tmp_path / "session.yaml").write_text("session_limits: {max_steps: 2}\n")
    contracts = load_contracts(tmp_path)
    assert contracts.tools == {}
    assert contracts.session.initial_phase is None
    assert contracts.session.session_limits.max_steps == 2


# --- hostile files ---


def test_a_file_over_256_kib_is_refused_without_parsing_it(contracts: Path) -> None:
    (contracts / "issue_refund.yaml").write_bytes(b"tool: issue_refund\n" + b"# padding\n" * 30_000)
    assert _problems(contracts) == [
        f"{contracts / 'issue_refund.yaml'}: the file is larger than 262144 bytes; a contract file is far smaller"
    ]


def test_a_directory_named_like_a_contract_is_an_error(contracts: Path) -> None:
    (contracts / "extra.yaml").mkdir()
    assert _problems(contracts) == [f"{contracts / 'extra.yaml'}: not a regular file"]


def test_a_symlink_loop_named_like_a_contract_is_an_error(contracts: Path) -> None:
    (contracts / "loop.yaml").symlink_to(contracts / "loop.yaml")
    assert _problems(contracts) == [f"{contracts / 'loop.yaml'}: not a regular file"]


def test_deep_nesting_is_a_problem_not_a_crash(contracts: Path) -> None:
    (contracts / "issue_refund.yaml").write_text("tool: issue_refund\ngolden_cases: " + "[" * 5000 + "]" * 5000 + "\n")
    (problem,) = _problems(contracts)
    assert problem.startswith(str(contracts / "issue_refund.yaml"))
    assert "nest" in problem


@pytest.mark.parametrize("fast", [True, False], ids=["libyaml", "pure-python"])
@pytest.mark.parametrize(
    ("text", "line", "what"),
    [
        ("a: " + "[" * 100_000, 1, "nest"),
        ("a: " + "{x: " * 50_000, 1, "nest"),
        ("x:\n" + "".join(" " * depth + "k:\n" for depth in range(1, 1100)), 0, "nest"),
        ("a: b\x07c\n", 1, "U+0007 is not allowed"),
        ("a: [1,\n", 2, "YAML syntax error"),
    ],
)
def test_both_parsers_refuse_hostile_text_with_a_line(fast: bool, text: str, line: int, what: str) -> None:
    if fast and _yaml._FastLoader is None:
        pytest.skip("PyYAML was built without libyaml here")
    with pytest.raises(FileProblem) as caught:
        _yaml.compose_text(text.encode(), fast=fast)
    assert what in caught.value.what
    assert line == 0 or caught.value.line == line


def test_both_parsers_resolve_scalars_the_same_way() -> None:
    text = b"a: [true, yes, ~, null, '', 0x1F, 0o17, 012, 1.5e3, -.5, 2024-01-01, 1_000, on, 1:30, 'true']\n"
    reader = NodeReader("x")
    slow = reader.plain(_yaml.compose_text(text, fast=False), "")
    expected = [True, "yes", None, None, "", 31, 15, 12, 1500.0, -0.5, "2024-01-01", "1_000", "on", "1:30", "true"]
    assert slow == {"a": expected}
    if _yaml._FastLoader is not None:
        assert reader.plain(_yaml.compose_text(text), "") == slow
    assert reader.problems == []
    assert reader.plain(_yaml.compose_text(b"a: [1, .inf]\n"), "") is INVALID
    assert reader.problems[-1].what == "expected a finite number, got .inf"


def test_a_huge_integer_is_a_problem_not_a_crash(contracts: Path) -> None:
    _edit(contracts / "session.yaml", "max_steps: 10", "max_steps: " + "9" * 5000)
    (problem,) = _problems(contracts)
    assert problem.startswith(
        f"{contracts / 'session.yaml'}:21: session_limits.max_steps: expected an integer, got 999"
    )


def test_thousands_of_unknown_fields_are_all_reported(contracts: Path) -> None:
    body = "tool: issue_refund\n" + "".join(f"field_{index}: {index}\n" for index in range(3000))
    (contracts / "issue_refund.yaml").write_text(body)
    problems = _problems(contracts)
    assert len(problems) == 3000
    assert problems[0] == f"{contracts / 'issue_refund.yaml'}:2: field_0: unknown field"


def test_validate_file_names_a_missing_file_or_a_directory(tmp_path: Path) -> None:
    assert validate_file(tmp_path / "absent.yaml") == [f"{tmp_path / 'absent.yaml'}: does not exist"]
    assert validate_file(tmp_path) == [f"{tmp_path}: is not a file"]


def test_validate_file_takes_the_kind_from_the_name(tmp_path: Path) -> None:
    session = tmp_path / "session.yaml"
    session.write_text("tool: issue_refund\n")
    assert validate_file(session) == [
        f"{session}:1: tool: unknown field (a tool's contract goes in its own file, not in session.yaml)"
    ]
    assert validate_file(session, kind="tool") == []


def test_a_duplicate_key_inside_a_kept_field_is_reported_once(tmp_path: Path) -> None:
    file = tmp_path / "issue_refund.yaml"
    file.write_text("tool: issue_refund\ntimeouts: {total_ms: 1, total_ms: 2}\n")
    assert validate_file(file) == [f"{file}:2: timeouts.total_ms: duplicate key (first at line 2)"]
    session = tmp_path / "session.yaml"
    session.write_text("provider_constraints: [openai]\n")
    assert validate_file(session) == [f"{session}:1: provider_constraints: expected a mapping, got a list"]


def test_a_problem_stays_on_one_line_whatever_the_key_holds(tmp_path: Path) -> None:
    file = tmp_path / "issue_refund.yaml"
    file.write_text('tool: issue_refund\n"gate\\nforged: line\\u2028": block\n')
    (problem,) = validate_file(file)
    assert "\n" not in problem and "\u2028" not in problem
    assert problem == f"{file}:2: gate\\u000aforged: line\\u2028: unknown field"


def test_a_fifo_named_like_a_contract_is_refused_without_blocking(contracts: Path) -> None:
    os.mkfifo(contracts / "pipe.yaml")
    assert _problems(contracts) == [f"{contracts / 'pipe.yaml'}: not a regular file"]
    assert validate_file(contracts / "pipe.yaml") == [f"{contracts / 'pipe.yaml'}: is not a file"]


def test_a_cost_cap_without_prices_is_reported_beside_another_limit_problem(tmp_path: Path) -> None:
    session = tmp_path / "session.yaml"
    session.write_text("session_limits:\n  max_steps: 0\n  max_cost_per_session: 2\n")
    assert validate_file(session) == [
        f"{session}:2: session_limits.max_steps: must be at least 1, got 0",
        f"{session}:3: session_limits.max_cost_per_session: a cost cap needs a price table: "
        "add prices: {<model>: {input_per_million: ..., output_per_million: ...}}",
    ]


@pytest.mark.parametrize(
    ("kind", "prefix", "field", "value"),
    [
        *[("tool", "", name, "x") for name in sorted(TOOL_FIELDS)],
        *[("session", "", name, "x") for name in sorted(SESSION_FIELDS)],
        *[("session", "session_limits", name, "1") for name in sorted(LIMIT_FIELDS)],
        *[("tool", "argument_value_invariants", name, "1") for name in ("path", "optional", *INVARIANT_CHECKS)],
    ],
)
def test_a_field_with_its_last_letter_doubled_is_named_with_the_field_it_meant(
    tmp_path: Path, kind: str, prefix: str, field: str, value: str
) -> None:
    typo = field + field[-1]
    if kind == "tool" and prefix:
        body = f"tool: issue_refund\n{prefix}:\n  - {typo}: {value}\n"
    elif prefix:
        body = f"{prefix}:\n  {typo}: {value}\n"
    else:
        body = ("tool: issue_refund\n" if kind == "tool" and field != "tool" else "") + f"{typo}: {value}\n"
    file = tmp_path / ("session.yaml" if kind == "session" else "issue_refund.yaml")
    file.write_text(body)
    dotted = f"{prefix}[0].{typo}" if kind == "tool" and prefix else f"{prefix}.{typo}" if prefix else typo
    assert f"{dotted}: unknown field (did you mean {field!r}?)" in "\n".join(validate_file(file))


@pytest.mark.parametrize("name", ["close_ticket.ymal", "close_ticket.yalm", "close_ticket.yam", "close_ticket.yaml "])
def test_a_file_whose_suffix_is_a_near_miss_of_yaml_is_an_error_not_a_contract_silently_left_out(
    contracts: Path, name: str
) -> None:
    """Under unmatched_policy allow, a contract nobody reads lets its tool through unchecked."""
    (contracts / name).write_text("tool: close_ticket\nside_effect: destructive\n")
    suffix = name.rsplit(".", 1)[1].strip()
    assert _problems(contracts) == [
        f"{contracts / name}: not read: a contract file's name ends in .yaml or .yml, not .{suffix}"
    ]
