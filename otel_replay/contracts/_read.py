"""One contract file's node tree read into model values, every problem recorded, references kept for the loader.

A tool file becomes a :class:`ToolContract`, ``session.yaml`` a :class:`SessionContract`. What can
be checked inside one file is checked here (fields, types, enums, regexes, paths, bounds that
cannot all hold, limits). What needs the whole directory (a phase or a tool named here but
defined elsewhere) is returned as :class:`Reference` values for the loader to resolve.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from otel_replay.contracts._yaml import INVALID, NodeReader, Problem, did_you_mean
from otel_replay.contracts.checks import SlowRegexError, compile_regex, json_equal, kind_of
from otel_replay.contracts.model import (
    SIDE_EFFECTS,
    ArgumentInvariant,
    CircuitBreaker,
    LoopDetection,
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
from otel_replay.contracts.paths import parse_path

__all__ = [
    "COMMIT_REQUIREMENTS",
    "EVIDENCE_CLASSES",
    "EXTRA_FIELDS",
    "GATES",
    "INVARIANT_CHECKS",
    "LIMIT_FIELDS",
    "SCHEMA_VERSIONS",
    "SESSION_FIELDS",
    "TOOL_FIELDS",
    "TOOL_NAME",
    "Reference",
    "SessionRead",
    "ToolRead",
    "read_session",
    "read_tool",
]

TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")
"""A tool name: what both providers accept as a function name (and a file name on every system)."""

EXTRA_FIELDS: Final = {
    "timeouts": "mapping",
    "retries": "mapping",
    "rate_limits": "mapping",
    "assertions": "mapping",
    "golden_cases": "list",
    "allowed_errors": "list",
}
"""Fields the seed's tool contracts carry for other tools: kept in ``ToolContract.extra``, not enforced."""

TOOL_FIELDS: Final = frozenset(
    {
        "tool",
        "side_effect",
        "evidence_class",
        "commit_requirement",
        "transitions",
        "preconditions",
        "forbids_after",
        "argument_value_invariants",
        "gate",
        *EXTRA_FIELDS,
    }
)
SESSION_FIELDS: Final = frozenset(
    {
        "schema_version",
        "agent",
        "phases",
        "transitions",
        "session_limits",
        "risk_defaults",
        "prices",
        "provider_constraints",
    }
)
LIMIT_FIELDS: Final = frozenset(
    {"max_steps", "max_tool_calls", "max_cost_per_session", "max_calls_per_tool", "loop_detection", "circuit_breaker"}
)
INVARIANT_CHECKS: Final = ("gte", "gt", "lte", "lt", "equals", "one_of", "regex", "max_length")
SCHEMA_VERSIONS: Final = ("1.0",)
EVIDENCE_CLASSES: Final = ("local_transaction", "ack_only", "unverifiable")
COMMIT_REQUIREMENTS: Final = ("acknowledged", "none")
GATES: Final = ("allow", "block")
_INT_TAG: Final = "tag:yaml.org,2002:int"
_FLOAT_TAG: Final = "tag:yaml.org,2002:float"

_SESSION_HINTS: Final = {
    **{name: f"{name} goes under session_limits" for name in LIMIT_FIELDS},
    "tool": "a tool's contract goes in its own file, not in session.yaml",
    "<<": "YAML merge keys are not supported",
}
_TOOL_HINTS: Final = {
    "phases": "phases are defined in session.yaml",
    "session_limits": "limits are defined in session.yaml",
    "valid_in_phases": "valid_in_phases goes under transitions",
    "advances_to": "advances_to goes under transitions",
    "<<": "YAML merge keys are not supported",
}


@dataclass(frozen=True)
class Reference:
    """A name one file uses and another must define: a ``phase`` of session.yaml or a ``tool`` with a contract."""

    kind: Literal["phase", "tool"]
    name: str
    file: str
    line: int
    field: str


@dataclass
class ToolRead:
    """What reading a tool file gave: the contract (``None`` when a required part was unreadable) and its references."""

    contract: ToolContract | None
    references: list[Reference] = field(default_factory=list)
    name_line: int = 1


@dataclass
class SessionRead:
    """What reading session.yaml gave: the contract (``None`` when unreadable) and its references."""

    contract: SessionContract | None
    references: list[Reference] = field(default_factory=list)
    phase_names: frozenset[str] | None = None
    """The phases defined, when the phase list could be read (even if another part of the file could not)."""


def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


def _names(reader: NodeReader, node: Node, where: str, *, nonempty: bool = False) -> list[tuple[str, Node]] | None:
    """A list of distinct non-empty strings, each with its node; ``None`` when it is not one."""
    items = reader.sequence(node, where)
    if items is INVALID:
        return None
    assert isinstance(items, list)
    if nonempty and not items:
        reader.fail(node, where, "an empty list (name at least one)")
        return None
    names: list[tuple[str, Node]] = []
    seen: set[str] = set()
    good = True
    for index, item in enumerate(items):
        name = reader.string(item, f"{where}[{index}]")
        if name is INVALID:
            good = False
            continue
        assert isinstance(name, str)
        if name in seen:
            reader.fail(item, f"{where}[{index}]", f"{name!r} is listed twice")
            continue
        seen.add(name)
        names.append((name, item))
    return names if good else None


def read_tool(reader: NodeReader, root: Node) -> ToolRead:
    """Read one tool file's top-level node."""
    entries = reader.mapping(root, "", TOOL_FIELDS, _TOOL_HINTS)
    if entries is INVALID:
        return ToolRead(None)
    assert isinstance(entries, dict)
    refs: list[Reference] = []
    file = reader.file
    name_node = entries["tool"][1] if "tool" in entries else root
    if "tool" not in entries:
        name: Any = reader.fail(root, "tool", "missing: every tool contract names its tool (tool: <name>)")
    else:
        name = reader.string(name_node, "tool")
    if isinstance(name, str) and not TOOL_NAME.fullmatch(name):
        name = reader.fail(name_node, "tool", f"{name[:60]!r} is not a tool name (1-128 letters, digits, _ or -)")
    values: dict[str, Any] = {}
    ok = name is not INVALID
    for key, options in (
        ("side_effect", SIDE_EFFECTS),
        ("evidence_class", EVIDENCE_CLASSES),
        ("commit_requirement", COMMIT_REQUIREMENTS),
        ("gate", GATES),
    ):
        if key in entries:
            values[key] = reader.choice(entries[key][1], key, options)
    if "transitions" in entries:
        values["transitions"] = _tool_transitions(reader, entries["transitions"][1], refs)
    if "preconditions" in entries:
        values["preconditions"] = _preconditions(reader, entries["preconditions"][1], refs, name)
    if "forbids_after" in entries:
        forbids = _names(reader, entries["forbids_after"][1], "forbids_after")
        if forbids is None:
            values["forbids_after"] = INVALID
        else:
            refs.extend(Reference("tool", item, file, _line(node), "forbids_after") for item, node in forbids)
            values["forbids_after"] = tuple(item for item, _ in forbids)
    if "argument_value_invariants" in entries:
        values["argument_value_invariants"] = _list_of(
            reader, entries["argument_value_invariants"][1], "argument_value_invariants", _invariant
        )
    extra: dict[str, Any] = {}
    for key, kind in EXTRA_FIELDS.items():
        if key in entries:
            value = _kept(reader, entries[key][1], key, kind)
            if value is INVALID:
                ok = False
            extra[key] = value
    if not ok or any(value is INVALID for value in values.values()):
        return ToolRead(None, refs, _line(name_node))
    assert isinstance(name, str)
    contract = ToolContract(tool=name, source=Source(file, _line(name_node)), extra=extra, **values)
    return ToolRead(contract, refs, _line(name_node))


def _kept(reader: NodeReader, node: Node, where: str, kind: str) -> Any:
    """A field kept as read (not enforced): any JSON-like value of the given kind, ``mapping`` or ``list``."""
    if kind == "mapping" and not isinstance(node, MappingNode):
        return reader.mapping(node, where)  # records why it is not a mapping
    if kind == "list" and not isinstance(node, SequenceNode):
        return reader.sequence(node, where)  # records why it is not a list
    return reader.plain(node, where)


def _tool_transitions(reader: NodeReader, node: Node, refs: list[Reference]) -> Transitions | Any:
    """``transitions: {valid_in_phases: [...], advances_to: ...}`` of a tool."""
    entries = reader.mapping(
        node, "transitions", ("valid_in_phases", "advances_to"), {"<<": "YAML merge keys are not supported"}
    )
    if entries is INVALID:
        return INVALID
    assert isinstance(entries, dict)
    valid: tuple[str, ...] | None = None
    advances: str | None = None
    good = True
    if "valid_in_phases" in entries:
        names = _names(reader, entries["valid_in_phases"][1], "transitions.valid_in_phases", nonempty=True)
        if names is None:
            good = False
        else:
            refs.extend(Reference("phase", n, reader.file, _line(at), "transitions.valid_in_phases") for n, at in names)
            valid = tuple(n for n, _ in names)
    if "advances_to" in entries:
        at = entries["advances_to"][1]
        target = reader.string(at, "transitions.advances_to")
        if isinstance(target, str):
            refs.append(Reference("phase", target, reader.file, _line(at), "transitions.advances_to"))
            advances = target
        else:
            good = False
    return Transitions(valid_in_phases=valid, advances_to=advances) if good else INVALID


def _list_of(reader: NodeReader, node: Node, where: str, read_item: Any) -> tuple[Any, ...] | Any:
    """A list whose items ``read_item(reader, item, where[i])`` reads; INVALID when the list or any item is bad."""
    items = reader.sequence(node, where)
    if items is INVALID:
        return INVALID
    assert isinstance(items, list)
    values = [read_item(reader, item, f"{where}[{index}]") for index, item in enumerate(items)]
    return INVALID if any(value is INVALID for value in values) else tuple(values)


def _path(reader: NodeReader, node: Node, where: str) -> str | Any:
    """A ``$.a.b[0]`` path that parses."""
    path = reader.string(node, where)
    if not isinstance(path, str):
        return INVALID
    try:
        parse_path(path)
    except ValueError as exc:
        return reader.fail(node, where, str(exc))
    return path


def _preconditions(reader: NodeReader, node: Node, refs: list[Reference], tool: Any) -> tuple[Precondition, ...] | Any:
    """``preconditions: [{requires_prior_tool, with_output: [{path, equals}]}]``."""

    def one(reader: NodeReader, item: Node, where: str) -> Precondition | Any:
        entries = reader.mapping(item, where, ("requires_prior_tool", "with_output"))
        if entries is INVALID:
            return INVALID
        assert isinstance(entries, dict)
        if "requires_prior_tool" not in entries:
            return reader.fail(item, f"{where}.requires_prior_tool", "missing: the tool that must run first")
        prior_node = entries["requires_prior_tool"][1]
        prior = reader.string(prior_node, f"{where}.requires_prior_tool")
        if isinstance(prior, str):
            if prior == tool:
                prior = reader.fail(
                    prior_node, f"{where}.requires_prior_tool", "a tool cannot require itself to run first"
                )
            else:
                refs.append(Reference("tool", prior, reader.file, _line(prior_node), f"{where}.requires_prior_tool"))
        conditions: Any = ()
        if "with_output" in entries:
            conditions = _list_of(reader, entries["with_output"][1], f"{where}.with_output", _output_condition)
        if not isinstance(prior, str) or conditions is INVALID:
            return INVALID
        return Precondition(requires_prior_tool=prior, source=Source(reader.file, _line(item)), with_output=conditions)

    return _list_of(reader, node, "preconditions", one)


def _all_of(reader: NodeReader, node: Node, where: str, keys: tuple[str, ...]) -> dict[str, tuple[Node, Node]] | Any:
    """A mapping of exactly ``keys``, every one given; each missing key is reported, and makes it ``INVALID``."""
    entries = reader.mapping(node, where, keys)
    if entries is INVALID:
        return INVALID
    assert isinstance(entries, dict)
    missing = [key for key in keys if key not in entries]
    for key in missing:
        reader.fail(node, f"{where}.{key}", "missing")
    return INVALID if missing else entries


def _output_condition(reader: NodeReader, node: Node, where: str) -> OutputCondition | Any:
    """``{path, equals}``: a condition on the prior tool's output."""
    entries = _all_of(reader, node, where, ("path", "equals"))
    if entries is INVALID:
        return INVALID
    path = _path(reader, entries["path"][1], f"{where}.path")
    equals = reader.plain(entries["equals"][1], f"{where}.equals")
    if path is INVALID or equals is INVALID:
        return INVALID
    return OutputCondition(path=path, equals=equals, source=Source(reader.file, _line(node)))


def _invariant(reader: NodeReader, node: Node, where: str) -> ArgumentInvariant | Any:
    """One ``argument_value_invariants`` item: a path and at least one check, with bounds that can all hold."""
    entries = reader.mapping(node, where, ("path", "optional", *INVARIANT_CHECKS))
    if entries is INVALID:
        return INVALID
    assert isinstance(entries, dict)
    values: dict[str, Any] = {}
    if "path" not in entries:
        values["path"] = reader.fail(node, f"{where}.path", "missing: the argument this checks ($.name)")
    else:
        values["path"] = _path(reader, entries["path"][1], f"{where}.path")
    for bound in ("gte", "gt", "lte", "lt"):
        if bound in entries:
            values[bound] = reader.number(entries[bound][1], f"{where}.{bound}")
    if "optional" in entries:
        values["optional"] = reader.boolean(entries["optional"][1], f"{where}.optional")
    if "equals" in entries:
        values["equals"] = reader.plain(entries["equals"][1], f"{where}.equals")
        values["has_equals"] = True
    if "one_of" in entries:
        at = entries["one_of"][1]
        options = reader.plain(at, f"{where}.one_of")
        if isinstance(options, list) and not options:
            options = reader.fail(at, f"{where}.one_of", "an empty list: no value could pass")
        elif options is not INVALID and not isinstance(options, list):
            options = reader.fail(at, f"{where}.one_of", "expected a list of the values allowed")
        values["one_of"] = tuple(options) if isinstance(options, list) else INVALID
    if "regex" in entries:
        at = entries["regex"][1]
        pattern = reader.string(at, f"{where}.regex", nonempty=False)
        if isinstance(pattern, str):
            try:
                compile_regex(pattern)
            except SlowRegexError as exc:
                pattern = reader.fail(at, f"{where}.regex", str(exc))
            except re.error as exc:
                pattern = reader.fail(at, f"{where}.regex", f"not a valid regular expression: {exc}")
        values["regex"] = pattern
    if "max_length" in entries:
        values["max_length"] = reader.integer(entries["max_length"][1], f"{where}.max_length", minimum=0)
    if not any(check in entries for check in INVARIANT_CHECKS):
        return reader.fail(node, where, f"checks nothing: give at least one of {', '.join(INVARIANT_CHECKS)}")
    if any(value is INVALID for value in values.values()):
        return INVALID
    impossible = _impossible(values)
    if impossible:
        return reader.fail(node, where, f"{impossible} cannot all hold: no value could pass")
    return ArgumentInvariant(source=Source(reader.file, _line(node)), **values)


def _impossible(values: dict[str, Any]) -> str | None:
    """The checks of an invariant that no value can pass together, or ``None``."""
    kinds: list[tuple[str, set[str]]] = []
    if any(name in values for name in ("gte", "gt", "lte", "lt")):
        kinds.append((next(name for name in ("gte", "gt", "lte", "lt") if name in values), {"number"}))
    if "regex" in values:
        kinds.append(("regex", {"text"}))
    if "max_length" in values:
        kinds.append(("max_length", {"text", "array", "object"}))
    if "equals" in values:
        kinds.append(("equals", {kind_of(values["equals"])}))
    if "one_of" in values and isinstance(values["one_of"], tuple):
        kinds.append(("one_of", {kind_of(option) for option in values["one_of"]}))
    for index, (name, allowed) in enumerate(kinds):
        for other, other_allowed in kinds[:index]:
            if not allowed & other_allowed:
                return f"{other} and {name}"
    lowers = [(name, values[name]) for name in ("gte", "gt") if name in values]
    uppers = [(name, values[name]) for name in ("lte", "lt") if name in values]
    for low_name, low in lowers:
        for high_name, high in uppers:
            strict = low_name == "gt" or high_name == "lt"
            if low > high or (low == high and strict):
                return f"{low_name} {_num(low)} and {high_name} {_num(high)}"
    if (
        "equals" in values
        and "one_of" in values
        and not any(json_equal(values["equals"], option) for option in values["one_of"])
    ):
        return "equals and one_of"
    equals = values.get("equals")
    if isinstance(equals, (int, float)) and not isinstance(equals, bool):
        for name, bound in [*lowers, *uppers]:
            passes = {"gte": equals >= bound, "gt": equals > bound, "lte": equals <= bound, "lt": equals < bound}[name]
            if not passes:
                return f"equals {_num(equals)} and {name} {_num(bound)}"
    return None


def _num(value: float) -> str:
    """A bound as the user wrote it (``5`` rather than ``5.0``)."""
    return str(int(value)) if float(value).is_integer() else repr(value)


def read_session(reader: NodeReader, root: Node) -> SessionRead:
    """Read session.yaml's top-level node."""
    entries = reader.mapping(root, "", SESSION_FIELDS, _SESSION_HINTS)
    if entries is INVALID:
        return SessionRead(None)
    assert isinstance(entries, dict)
    refs: list[Reference] = []
    values: dict[str, Any] = {}
    if "schema_version" in entries:
        at = entries["schema_version"][1]
        if isinstance(at, ScalarNode) and at.tag in (_INT_TAG, _FLOAT_TAG):
            version: Any = reader.fail(at, "schema_version", f'expected a string: write it quoted, "{at.value}"')
        else:
            version = reader.string(at, "schema_version")
        if isinstance(version, str) and version not in SCHEMA_VERSIONS:
            version = reader.fail(at, "schema_version", f'unsupported version {version!r}; this release reads "1.0"')
        values["schema_version"] = version
    if "agent" in entries:
        values["agent"] = reader.string(entries["agent"][1], "agent")
    if "phases" in entries:
        values["phases"] = _phases(reader, entries["phases"][1])
    if "transitions" in entries:
        values["transitions"] = _session_transitions(reader, entries["transitions"][1], refs)
    if "session_limits" in entries:
        values["session_limits"] = _limits(reader, entries["session_limits"][1], refs)
    if "risk_defaults" in entries:
        values["risk_defaults"] = _risk_defaults(reader, entries["risk_defaults"][1])
    if "prices" in entries:
        values["prices"] = _prices(reader, entries["prices"][1])
    if "provider_constraints" in entries:
        values["provider_constraints"] = _kept(
            reader, entries["provider_constraints"][1], "provider_constraints", "mapping"
        )
    _check_phase_names(reader, values, refs)
    tool_refs = [ref for ref in refs if ref.kind == "tool"]
    limits_node = entries["session_limits"][1] if "session_limits" in entries else None
    caps = (
        [key for key, _ in limits_node.value if getattr(key, "value", None) == "max_cost_per_session"]
        if isinstance(limits_node, MappingNode)
        else []
    )
    if caps and not values.get("prices"):
        reader.fail(
            caps[0],
            "session_limits.max_cost_per_session",
            "a cost cap needs a price table: add prices: {<model>: {input_per_million: ..., output_per_million: ...}}",
        )
    phases = values.get("phases", ())
    names = None if phases is INVALID else frozenset(phase.name for phase in phases)
    if reader.problems or any(value is INVALID for value in values.values()):
        return SessionRead(None, tool_refs, names)
    return SessionRead(SessionContract(source=Source(reader.file, _line(root)), **values), tool_refs, names)


def _check_phase_names(reader: NodeReader, values: dict[str, Any], refs: list[Reference]) -> None:
    """Phases named in session.yaml's transitions must be among its phases; a terminal phase has no way out."""
    phases = values.get("phases", ())
    if phases is INVALID:
        return
    names = {phase.name for phase in phases}
    for ref in refs:
        if ref.kind == "phase" and ref.name not in names:
            hint = did_you_mean(ref.name, names) if names else " (no phases are defined)"
            reader.problems.append(
                Problem(ref.file, ref.line, ref.field, f"phase {ref.name!r} is not defined in phases{hint}")
            )
    transitions = values.get("transitions", {})
    if transitions is INVALID:
        return
    for phase in phases:
        if phase.terminal and transitions.get(phase.name):
            reader.problems.append(
                Problem(reader.file, phase.source.line, f"transitions.{phase.name}", "a terminal phase has no way out")
            )


def _phases(reader: NodeReader, node: Node) -> tuple[Phase, ...] | Any:
    """``phases: [{name, initial, terminal}]``: distinct names, exactly one initial phase."""

    def one(reader: NodeReader, item: Node, where: str) -> Phase | Any:
        entries = reader.mapping(item, where, ("name", "initial", "terminal"))
        if entries is INVALID:
            return INVALID
        assert isinstance(entries, dict)
        if "name" not in entries:
            return reader.fail(item, f"{where}.name", "missing: every phase has a name")
        values: dict[str, Any] = {"name": reader.string(entries["name"][1], f"{where}.name")}
        for flag in ("initial", "terminal"):
            if flag in entries:
                values[flag] = reader.boolean(entries[flag][1], f"{where}.{flag}")
        if any(value is INVALID for value in values.values()):
            return INVALID
        return Phase(source=Source(reader.file, _line(item)), **values)

    phases = _list_of(reader, node, "phases", one)
    if phases is INVALID:
        return INVALID
    good = True
    seen: dict[str, Phase] = {}
    for index, phase in enumerate(phases):
        if phase.name in seen:
            reader.fail(
                node.value[index],
                f"phases[{index}].name",
                f"phase {phase.name!r} is defined twice (first at line {seen[phase.name].source.line})",
            )
            good = False
        seen.setdefault(phase.name, phase)
    initial = [phase for phase in phases if phase.initial]
    if phases and not initial:
        reader.fail(node, "phases", "no phase is initial: mark the one a session starts in with initial: true")
        good = False
    for extra in initial[1:]:
        reader.fail(
            node.value[phases.index(extra)],
            "phases",
            f"{extra.name!r} is a second initial phase (first: {initial[0].name!r})",
        )
        good = False
    return phases if good else INVALID


def _session_transitions(reader: NodeReader, node: Node, refs: list[Reference]) -> dict[str, tuple[str, ...]] | Any:
    """``transitions: {phase: [next phase, ...]}``."""
    entries = reader.mapping(node, "transitions")
    if entries is INVALID:
        return INVALID
    assert isinstance(entries, dict)
    result: dict[str, tuple[str, ...]] = {}
    good = True
    for source, (key_node, value_node) in entries.items():
        refs.append(Reference("phase", source, reader.file, _line(key_node), "transitions"))
        targets = _names(reader, value_node, f"transitions.{source}")
        if targets is None:
            good = False
            continue
        refs.extend(Reference("phase", name, reader.file, _line(at), f"transitions.{source}") for name, at in targets)
        result[source] = tuple(name for name, _ in targets)
    return result if good else INVALID


def _limits(reader: NodeReader, node: Node, refs: list[Reference]) -> SessionLimits | Any:
    """``session_limits``: every limit at least 1 (a cost cap above 0), a loop window that can see the threshold."""
    entries = reader.mapping(node, "session_limits", LIMIT_FIELDS, {"<<": "YAML merge keys are not supported"})
    if entries is INVALID:
        return INVALID
    assert isinstance(entries, dict)
    values: dict[str, Any] = {}
    for name in ("max_steps", "max_tool_calls"):
        if name in entries:
            values[name] = reader.integer(entries[name][1], f"session_limits.{name}", minimum=1)
    if "max_cost_per_session" in entries:
        at = entries["max_cost_per_session"][1]
        values["max_cost_per_session"] = reader.number(at, "session_limits.max_cost_per_session", positive=True)
    if "max_calls_per_tool" in entries:
        at = entries["max_calls_per_tool"][1]
        per_tool = reader.mapping(at, "session_limits.max_calls_per_tool")
        if per_tool is INVALID:
            values["max_calls_per_tool"] = INVALID
        else:
            assert isinstance(per_tool, dict)
            counts: dict[str, Any] = {}
            for tool, (key_node, value_node) in per_tool.items():
                where = f"session_limits.max_calls_per_tool.{tool}"
                refs.append(Reference("tool", tool, reader.file, _line(key_node), where))
                counts[tool] = reader.integer(value_node, where, minimum=1)
            values["max_calls_per_tool"] = INVALID if INVALID in counts.values() else counts
    if "loop_detection" in entries:
        values["loop_detection"] = _loop(reader, entries["loop_detection"][1])
    if "circuit_breaker" in entries:
        values["circuit_breaker"] = _breaker(reader, entries["circuit_breaker"][1])
    if any(value is INVALID for value in values.values()):
        return INVALID
    return SessionLimits(**values)


def _loop(reader: NodeReader, node: Node) -> LoopDetection | Any:
    """``loop_detection: {window, threshold}``: threshold at least 2, window at least the threshold."""
    where = "session_limits.loop_detection"
    entries = _all_of(reader, node, where, ("window", "threshold"))
    if entries is INVALID:
        return INVALID
    window = reader.integer(entries["window"][1], f"{where}.window", minimum=1)
    threshold = reader.integer(entries["threshold"][1], f"{where}.threshold", minimum=2)
    if not isinstance(window, int) or not isinstance(threshold, int):
        return INVALID
    if window < threshold:
        return reader.fail(
            entries["window"][1],
            f"{where}.window",
            f"window {window} is smaller than threshold {threshold}: it never fires",
        )
    return LoopDetection(window=window, threshold=threshold, source=Source(reader.file, _line(node)))


def _breaker(reader: NodeReader, node: Node) -> CircuitBreaker | Any:
    """``circuit_breaker: {consecutive_blocks, consecutive_errors}``: at least one, each at least 1."""
    where = "session_limits.circuit_breaker"
    entries = reader.mapping(node, where, ("consecutive_blocks", "consecutive_errors"))
    if entries is INVALID:
        return INVALID
    assert isinstance(entries, dict)
    if not entries:
        return reader.fail(node, where, "sets nothing: give consecutive_blocks, consecutive_errors or both")
    values: dict[str, Any] = {key: reader.integer(at, f"{where}.{key}", minimum=1) for key, (_, at) in entries.items()}
    if INVALID in values.values():
        return INVALID
    return CircuitBreaker(source=Source(reader.file, _line(node)), **values)


def _risk_defaults(reader: NodeReader, node: Node) -> dict[str, str] | Any:
    """``risk_defaults: {side_effect: allow|block}``."""
    entries = reader.mapping(node, "risk_defaults", SIDE_EFFECTS)
    if entries is INVALID:
        return INVALID
    assert isinstance(entries, dict)
    gates = {key: reader.choice(at, f"risk_defaults.{key}", GATES) for key, (_, at) in entries.items()}
    return INVALID if INVALID in gates.values() else gates


def _prices(reader: NodeReader, node: Node) -> dict[str, Price] | Any:
    """``prices: {model: {input_per_million, output_per_million}}`` in dollars, neither below 0."""
    entries = reader.mapping(node, "prices")
    if entries is INVALID:
        return INVALID
    assert isinstance(entries, dict)
    prices: dict[str, Any] = {}
    for model, (_, at) in entries.items():
        where = f"prices.{model}"
        fields = reader.mapping(at, where, ("input_per_million", "output_per_million"))
        if fields is INVALID:
            prices[model] = INVALID
            continue
        assert isinstance(fields, dict)
        rates: dict[str, Any] = {}
        for key in ("input_per_million", "output_per_million"):
            if key not in fields:
                rates[key] = reader.fail(at, f"{where}.{key}", "missing: dollars per million tokens")
            else:
                rates[key] = reader.number(fields[key][1], f"{where}.{key}", minimum=0)
        prices[model] = INVALID if INVALID in rates.values() else Price(source=Source(reader.file, _line(at)), **rates)
    return INVALID if INVALID in prices.values() else prices
