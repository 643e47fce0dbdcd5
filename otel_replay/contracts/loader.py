"""Load a contracts directory into a checked :class:`ContractSet`, or report everything wrong with it at once.

A contracts directory holds ``session.yaml`` (the phase machine, limits, risk defaults and
prices) and one YAML file per tool, named after the tool (``issue_refund.yaml`` holds
``tool: issue_refund``; ``.yml`` works too). Other files (a README, hidden files, sub
directories) are not read, but a file whose suffix is a near miss of ``.yaml`` (``.ymal``, ``.yam``)
is reported, so a typo in a file's name never leaves its contract out. The JSON Schemas in
``otel_replay/contracts/schema/`` describe the same two file kinds for editors.

Every problem is reported, each as ``file:line: field: what``: a file that is not UTF-8, empty,
not valid YAML or over 256 KiB; an unknown field (with the nearest known one, so a typo never
silently switches a rule off); a wrong type; an unknown side effect, gate or evidence class; a
bad regex or path; a regex whose matching can take exponential time; checks of one argument that no
value can pass together (bounds that cross, ``equals`` outside ``one_of`` or the bounds, a bound and
a ``regex``: a number and a text); a limit below 1; a loop window smaller than
its threshold; a cost cap without prices; a phase named but not defined in ``session.yaml``; a
tool named (in preconditions, ``forbids_after`` or ``max_calls_per_tool``) that has no contract
file, since a rule about a tool nobody wrote a contract for is almost always a misspelt name;
a file whose name does not match its tool; no initial phase or two; a missing ``session.yaml``.
"""

from __future__ import annotations

import difflib
import hashlib
import os
from pathlib import Path
from typing import Literal, NoReturn

from otel_replay.contracts._read import SessionRead, ToolRead, read_session, read_tool
from otel_replay.contracts._yaml import FileProblem, NodeReader, Problem, compose_file, did_you_mean
from otel_replay.contracts.model import ContractSet, SessionContract, ToolContract
from otel_replay.errors import ContractLoadError

__all__ = ["SESSION_FILES", "load_contracts", "validate_file"]

SESSION_FILES = ("session.yaml", "session.yml")
"""The names of the session contract in a contracts directory."""

_SUFFIXES = (".yaml", ".yml")


def load_contracts(directory: str | os.PathLike[str]) -> ContractSet:
    """Read and check every contract in ``directory``; :class:`ContractLoadError` lists every problem found.

    The error's message is the first problem and how many more there are; ``problems`` holds
    them all, one ``file:line: field: what`` line each, in file and line order.
    """
    root = Path(directory)
    if not root.exists():
        _raise([Problem(str(root), 0, "", "the contracts directory does not exist")])
    if not root.is_dir():
        _raise(
            [Problem(str(root), 0, "", "is a file, not a directory of contracts (session.yaml and one file per tool)")]
        )
    try:
        names = sorted(entry.name for entry in root.iterdir())
    except OSError as exc:
        _raise([Problem(str(root), 0, "", f"cannot list the directory: {exc.strerror or exc}")])
    problems: list[Problem] = []
    contents: list[tuple[str, bytes]] = []
    problems.extend(_near_misses(root, names))
    session_names = [name for name in names if name in SESSION_FILES]
    tool_names = [name for name in names if _is_contract(name) and name not in SESSION_FILES]
    session: ToolRead | SessionRead | None = None
    if not session_names:
        problems.append(
            Problem(
                str(root / "session.yaml"), 0, "", "missing: a contracts directory needs session.yaml (phases, limits)"
            )
        )
    for extra in session_names[1:]:
        problems.append(Problem(str(root / extra), 0, "", f"a second session contract beside {session_names[0]}"))
    if session_names:
        session = _read(root / session_names[0], "session", problems, contents)
    reads: list[tuple[str, ToolRead]] = []
    for name in tool_names:
        read = _read(root / name, "tool", problems, contents)
        reads.append((name, read if isinstance(read, ToolRead) else ToolRead(None)))
    tools = _one_file_per_tool(root, reads, problems)
    # A tool file that could not be read still defines its name (its file's name) for the checks of the others.
    defined = set(tools) | {name.rsplit(".", 1)[0] for name, read in reads if read.contract is None}
    if isinstance(session, SessionRead):
        problems.extend(_check_references(session, [read for _, read in reads], defined))
    if problems:
        _raise(problems)
    assert isinstance(session, SessionRead) and session.contract is not None
    return ContractSet(directory=root, session=session.contract, tools=tools, digest=_digest(contents))


def _one_file_per_tool(
    root: Path, reads: list[tuple[str, ToolRead]], problems: list[Problem]
) -> dict[str, ToolContract]:
    """The contracts read, by tool; a file not named after its tool, or a tool in two files, is a problem."""
    tools: dict[str, ToolContract] = {}
    for name, read in reads:
        contract = read.contract
        if contract is None:
            continue
        file = str(root / name)
        if contract.tool == "session":
            what = "no tool can be named 'session' (session.yaml is the session)"
            problems.append(Problem(file, read.name_line, "tool", what))
        elif name.rsplit(".", 1)[0] != contract.tool:
            what = f"tool {contract.tool!r} must be in a file named {contract.tool}.yaml"
            problems.append(Problem(file, read.name_line, "tool", what))
        if contract.tool in tools:
            what = f"tool {contract.tool!r} is also defined in {tools[contract.tool].source.file}"
            problems.append(Problem(file, read.name_line, "tool", what))
            continue
        tools[contract.tool] = contract
    return tools


def validate_file(path: str | os.PathLike[str], *, kind: Literal["tool", "session"] | None = None) -> list[str]:
    """Every problem of one contract file alone, ``file:line: field: what`` each (``[]`` when it is valid).

    ``kind`` defaults to the file's name (``session.yaml`` or ``session.yml``: the session, anything
    else: a tool). What needs the rest of the directory (phases and tools named here but defined
    elsewhere, the file name matching its tool) is checked by :func:`load_contracts` only.
    """
    file = Path(path)
    chosen = kind or ("session" if file.name in SESSION_FILES else "tool")
    problems: list[Problem] = []
    if not file.is_file():
        what = "does not exist" if not file.exists() else "is not a file"
        problems.append(Problem(str(file), 0, "", what))
    else:
        _read(file, chosen, problems, [])
    return [str(problem) for problem in sorted(problems)]


def _near_misses(root: Path, names: list[str]) -> list[Problem]:
    """Files whose suffix is a near miss of ``.yaml``/``.yml`` (``.ymal``, ``.yam``, ``.yaml ``): never read silently.

    A contract left out is a tool without its rules (let through unchecked under ``unmatched_policy="allow"``).
    Backups (``~``, ``.bak``) and other suffixes (``.md``, ``.json``) are not near misses.
    """
    problems: list[Problem] = []
    for name in names:
        if name.startswith(".") or "." not in name or _is_contract(name) or name.endswith("~"):
            continue
        suffix = name.rsplit(".", 1)[1].lower()
        if difflib.get_close_matches(suffix, ("yaml", "yml"), n=1, cutoff=0.6):
            what = f"not read: a contract file's name ends in .yaml or .yml, not .{suffix.strip()}"
            problems.append(Problem(str(root / name), 0, "", what))
    return problems


def _is_contract(name: str) -> bool:
    """Whether a directory entry is read as a contract file (a visible ``*.yaml``/``*.yml``)."""
    return not name.startswith(".") and name.lower().endswith(_SUFFIXES)


def _read(
    file: Path, kind: Literal["tool", "session"], problems: list[Problem], contents: list[tuple[str, bytes]]
) -> ToolRead | SessionRead | None:
    """Read one file, adding its problems to ``problems`` and its bytes to ``contents``."""
    where = str(file)
    if not file.is_file():
        problems.append(Problem(where, 0, "", "not a regular file"))
        return None
    try:
        data, node = compose_file(file)
    except FileProblem as exc:
        problems.append(Problem(where, exc.line, "", exc.what))
        return None
    contents.append((file.name, data))
    if node is None:
        problems.append(Problem(where, 1, "", "the file is empty (no YAML value in it)"))
        return None
    reader = NodeReader(where)
    result: ToolRead | SessionRead | None = None
    with reader.guarded():
        result = read_session(reader, node) if kind == "session" else read_tool(reader, node)
    problems.extend(reader.problems)
    if reader.problems and result is not None:
        # Carry on with the references (so a cross-file problem is reported too), but never with the contract.
        result = (
            SessionRead(None, result.references, result.phase_names)
            if isinstance(result, SessionRead)
            else ToolRead(None, result.references, result.name_line)
        )
    return result


def _check_references(session: SessionRead, reads: list[ToolRead], tools: set[str]) -> list[Problem]:
    """The problems of names used in one file and defined in another (phases, tools), and unreachable advances."""
    problems: list[Problem] = []
    contract: SessionContract | None = session.contract
    phases = session.phase_names
    references = [*session.references, *(ref for read in reads for ref in read.references)]
    for ref in references:
        if ref.kind == "tool" and ref.name not in tools:
            hint = did_you_mean(ref.name, tools)
            problems.append(
                Problem(ref.file, ref.line, ref.field, f"tool {ref.name!r} has no contract ({ref.name}.yaml){hint}")
            )
        elif ref.kind == "phase" and phases is not None and ref.name not in phases:
            hint = did_you_mean(ref.name, phases) if phases else " (session.yaml defines no phases)"
            problems.append(
                Problem(ref.file, ref.line, ref.field, f"phase {ref.name!r} is not defined in session.yaml{hint}")
            )
    if contract is not None and phases is not None:
        problems.extend(_phase_machine(contract, [read.contract for read in reads if read.contract is not None]))
    return problems


def _phase_machine(session: SessionContract, tools: list[ToolContract]) -> list[Problem]:
    """Tools whose phase advance no transition allows from any phase they may be called in."""
    problems: list[Problem] = []
    by_name = {phase.name: phase for phase in session.phases}
    for tool in tools:
        target = tool.transitions.advances_to
        valid = tool.transitions.valid_in_phases
        if target is None or valid is None or target not in by_name or not set(valid) <= set(by_name):
            continue
        if not any(phase == target or target in session.transitions.get(phase, ()) for phase in valid):
            listed = ", ".join(valid)
            problems.append(
                Problem(
                    tool.source.file,
                    tool.source.line,
                    "transitions.advances_to",
                    f"no transition in session.yaml leads from {listed} to {target!r}: every call would be blocked",
                )
            )
    return problems


def _digest(contents: list[tuple[str, bytes]]) -> str:
    """sha256 over the files' names and bytes, in name order (each name and body length-prefixed)."""
    digest = hashlib.sha256()
    for name, data in sorted(contents):
        encoded = name.encode("utf-8")
        digest.update(len(encoded).to_bytes(8, "big") + encoded + len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


def _raise(problems: list[Problem]) -> NoReturn:
    """Raise :class:`ContractLoadError` with every problem, the first one in the message."""
    lines = [str(problem) for problem in sorted(problems)]
    more = len(lines) - 1
    suffix = "" if not more else f" (and {more} more problem{'s' if more > 1 else ''})"
    raise ContractLoadError(lines[0] + suffix, problems=lines)
