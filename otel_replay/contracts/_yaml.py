"""Reading one contract file as a YAML node tree, safely, and typed reads of its nodes that report every problem.

The file is read whole but never more than :data:`MAX_FILE_BYTES` (a contract file is a few KiB,
and parsing time grows with the size), must be UTF-8, and is composed (never constructed) with
PyYAML's safe loader, so every node keeps its line and no tag can run code. Scalars resolve as
in YAML 1.2's core schema, which is what editors validating against the JSON Schema see: only
``true``/``false`` are booleans (``yes``, ``no``, ``on``, ``off`` stay strings), dates stay
strings, and only ``null``, ``~`` or nothing is null. Any tag other than the core ones is
refused. Aliases are expanded while reading, with a budget of :data:`MAX_VALUES` values per file
and :data:`MAX_DEPTH` levels, so a small file cannot expand into a huge one.

:class:`NodeReader` reads a node as the type a field wants and, when it is not, records a
:class:`Problem` (file, line, field, what) and returns :data:`INVALID`, so the caller carries on
and one pass reports everything wrong in a file.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

__all__ = [
    "INVALID",
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_VALUES",
    "FileProblem",
    "NodeReader",
    "Problem",
    "compose_file",
    "compose_text",
    "did_you_mean",
]

MAX_FILE_BYTES: Final = 256 * 1024
MAX_VALUES: Final = 100_000
MAX_DEPTH: Final = 64


class _Invalid:
    """The type of :data:`INVALID`."""

    def __repr__(self) -> str:
        return "INVALID"


INVALID: Final = _Invalid()
"""What a read returns when the node is not what the field wants (the problem is already recorded)."""


@dataclass(frozen=True, order=True)
class Problem:
    """One thing wrong in a contract file: where (file, 1-based line, field path) and what."""

    file: str
    line: int
    field: str
    what: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line > 0 else self.file
        text = f"{where}: {self.field}: {self.what}" if self.field else f"{where}: {self.what}"
        return _CONTROL.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""Characters that would break a problem's one line (a key or a file name may hold them): shown escaped."""


class FileProblem(Exception):
    """The file cannot be read as one YAML document: ``line`` (1-based, 0 when none) and ``what``."""

    def __init__(self, line: int, what: str) -> None:
        super().__init__(what)
        self.line = line
        self.what = what


_TAG = "tag:yaml.org,2002:"
_NULL, _BOOL, _INT, _FLOAT, _STR = (_TAG + name for name in ("null", "bool", "int", "float", "str"))
_SEQ, _MAP = _TAG + "seq", _TAG + "map"


class _CoreLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 core-schema resolution of plain scalars (see the module docstring)."""

    yaml_implicit_resolvers: dict[Any, list[tuple[str, re.Pattern[str]]]] = {}
    _depth = 0

    def fetch_flow_collection_start(self, token_class: Any) -> None:
        """Refuse ``[`` or ``{`` nested too deeply before the scanner's work on it grows with the depth."""
        if self.flow_level >= MAX_DEPTH:
            raise FileProblem(self.get_mark().line + 1, f"values are nested deeper than {MAX_DEPTH} levels")
        super().fetch_flow_collection_start(token_class)

    def compose_node(self, parent: Any, index: Any) -> Any:
        """Refuse a node nested deeper than :data:`MAX_DEPTH` levels (block style) instead of recursing on."""
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH + 1:
                raise FileProblem(
                    self.peek_event().start_mark.line + 1, f"values are nested deeper than {MAX_DEPTH} levels"
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_CoreLoader.add_implicit_resolver(_NULL, re.compile(r"^(?:~|null|Null|NULL|)\Z"), ["~", "n", "N", ""])
_CoreLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)\Z"), list("tTfF"))
_CoreLoader.add_implicit_resolver(_INT, re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)\Z"), list("-+0123456789"))
_CoreLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))\Z"
    ),
    list("-+.0123456789"),
)


_FastLoader: Any = None
if getattr(yaml, "__with_libyaml__", False):

    class _CoreFastLoader(yaml.CSafeLoader):  # type: ignore[misc,name-defined,unused-ignore]
        """The same resolution on libyaml's parser: linear time, and libyaml refuses nesting over 1000 levels."""

        yaml_implicit_resolvers = _CoreLoader.yaml_implicit_resolvers

    _FastLoader = _CoreFastLoader


def compose_file(path: Path) -> tuple[bytes, Node | None]:
    """The bytes of ``path`` and its YAML node tree (``None``: empty); :class:`FileProblem` when unreadable."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise FileProblem(0, f"cannot read the file: {exc.strerror or exc}") from exc
    if len(data) > MAX_FILE_BYTES:
        raise FileProblem(0, f"the file is larger than {MAX_FILE_BYTES} bytes; a contract file is far smaller")
    return data, compose_text(data)


def compose_text(data: bytes, *, fast: bool = True) -> Node | None:
    """The YAML node tree of ``data`` (UTF-8, one document); ``None`` when it holds no value.

    libyaml parses when PyYAML has it (``fast``); the pure-Python parser otherwise, with depth limits of its own.
    """
    body = data[3:] if data.startswith(b"\xef\xbb\xbf") else data
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = body[: exc.start].count(b"\n") + 1
        raise FileProblem(
            line, f"not UTF-8: byte 0x{body[exc.start]:02x} cannot start or continue a character"
        ) from exc
    try:
        loader = _FastLoader if fast and _FastLoader is not None else _CoreLoader
        return yaml.compose(text, Loader=loader)  # compose builds nodes only, never objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or "cannot parse"
        context = f" ({exc.context})" if exc.context and exc.problem else ""
        raise FileProblem(mark.line + 1 if mark else 0, f"YAML syntax error: {problem}{context}") from exc
    except yaml.reader.ReaderError as exc:
        line = text[: exc.position].count("\n") + 1
        raise FileProblem(line, f"the character U+{exc.character:04X} is not allowed in YAML") from exc
    except yaml.YAMLError as exc:
        raise FileProblem(0, f"YAML error: {exc}") from exc
    except RecursionError as exc:
        raise FileProblem(0, "values are nested too deeply to read") from exc


def did_you_mean(word: str, choices: Collection[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` to ``word``, or ``""`` when none is close."""
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class _Overflow(Exception):
    """The file expands (through aliases) to more values than the budget allows."""


def _kind(node: Node) -> str:
    """How a problem names the kind of a node (``a list``, ``the string 'x'``, ``null``...)."""
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if node.tag == _NULL:
        return "null"
    if node.tag == _STR:
        shown = node.value if len(node.value) <= 40 else node.value[:37] + "..."
        return f"the string {shown!r}"
    if node.tag in (_INT, _FLOAT, _BOOL):
        return f"{node.value}"
    return f"a value tagged {node.tag}"


class NodeReader:
    """Typed reads of the nodes of one file; each read that fails records a :class:`Problem` and returns INVALID."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.problems: list[Problem] = []
        self._values = 0

    def fail(self, node: Node | None, field: str, what: str) -> _Invalid:
        """Record that ``field`` (at ``node``'s line) is wrong: ``what``; returns :data:`INVALID`."""
        line = node.start_mark.line + 1 if node is not None else 0
        self.problems.append(Problem(self.file, line, field, what))
        return INVALID

    def _visit(self, node: Node) -> None:
        """Count one value against the file's budget (aliases count each time they are read)."""
        self._values += 1
        if self._values > MAX_VALUES:
            raise _Overflow

    def guarded(self) -> _Guard:
        """A context in which an alias bomb stops the reading of the file with one problem instead of hanging."""
        return _Guard(self)

    def _tag_ok(self, node: Node, field: str) -> bool:
        """Whether ``node`` carries one of the core tags (any other tag is refused)."""
        if node.tag in (_NULL, _BOOL, _INT, _FLOAT, _STR, _SEQ, _MAP):
            return True
        self.fail(node, field, f"the YAML tag {node.tag} is not allowed (contracts use plain values)")
        return False

    def mapping(
        self,
        node: Node,
        field: str,
        allowed: Collection[str] | None = None,
        hints: Mapping[str, str] | None = None,
    ) -> dict[str, tuple[Node, Node]] | _Invalid:
        """The entries of a mapping node, ``{key: (key node, value node)}``.

        Keys must be strings and unique; with ``allowed``, any other key is a problem (with the
        nearest allowed key as a hint, or ``hints[key]`` when given) and is left out.
        """
        self._visit(node)
        if not self._tag_ok(node, field):
            return INVALID
        if not isinstance(node, MappingNode):
            return self.fail(node, field, f"expected a mapping, got {_kind(node)}")
        entries: dict[str, tuple[Node, Node]] = {}
        for key_node, value_node in node.value:
            self._visit(key_node)
            key_field = field or "(top level)"
            if not isinstance(key_node, ScalarNode) or key_node.tag != _STR:
                self.fail(key_node, key_field, f"a key must be a name, got {_kind(key_node)}")
                continue
            key = key_node.value
            at = f"{field}.{key}" if field else key
            if key in entries:
                first = entries[key][0].start_mark.line + 1
                self.fail(key_node, at, f"duplicate key (first at line {first})")
                continue
            if allowed is not None and key not in allowed:
                if hints and key in hints:
                    hint = f" ({hints[key]})"
                else:
                    hint = did_you_mean(key, allowed)
                self.fail(key_node, at, f"unknown field{hint}")
                entries[key] = (key_node, value_node)
                continue
            entries[key] = (key_node, value_node)
        if allowed is not None:
            return {key: entry for key, entry in entries.items() if key in allowed}
        return entries

    def sequence(self, node: Node, field: str) -> list[Node] | _Invalid:
        """The items of a list node."""
        self._visit(node)
        if not self._tag_ok(node, field):
            return INVALID
        if not isinstance(node, SequenceNode):
            return self.fail(node, field, f"expected a list, got {_kind(node)}")
        return list(node.value)

    def _scalar(self, node: Node, field: str, tags: tuple[str, ...], wanted: str) -> ScalarNode | _Invalid:
        """``node`` when it is a scalar of one of ``tags``."""
        self._visit(node)
        if not self._tag_ok(node, field):
            return INVALID
        if not isinstance(node, ScalarNode) or node.tag not in tags:
            return self.fail(node, field, f"expected {wanted}, got {_kind(node)}")
        return node

    def string(self, node: Node, field: str, *, nonempty: bool = True) -> str | _Invalid:
        """A string (not empty unless ``nonempty`` is false)."""
        scalar = self._scalar(node, field, (_STR,), "a string")
        if isinstance(scalar, _Invalid):
            return INVALID
        if nonempty and not scalar.value.strip():
            return self.fail(node, field, "expected a non-empty string")
        return str(scalar.value)

    def boolean(self, node: Node, field: str) -> bool | _Invalid:
        """``true`` or ``false``."""
        scalar = self._scalar(node, field, (_BOOL,), "true or false")
        if isinstance(scalar, _Invalid):
            return INVALID
        return str(scalar.value).lower() == "true"

    def integer(self, node: Node, field: str, *, minimum: int | None = None) -> int | _Invalid:
        """An integer (``10.0`` counts, as in JSON Schema), at least ``minimum`` when given."""
        scalar = self._scalar(node, field, (_INT, _FLOAT), "an integer")
        if isinstance(scalar, _Invalid):
            return INVALID
        if scalar.tag == _INT:
            value = _to_int(scalar.value)
        else:
            number = _to_number(scalar)
            value = int(number) if number is not None and number.is_integer() and abs(number) < 2**63 else None
        if value is None:
            return self.fail(node, field, f"expected an integer, got {scalar.value[:40]}")
        if minimum is not None and value < minimum:
            return self.fail(node, field, f"must be at least {minimum}, got {scalar.value}")
        return value

    def number(
        self, node: Node, field: str, *, minimum: float | None = None, positive: bool = False
    ) -> float | _Invalid:
        """A finite number (an integer or a float), at least ``minimum`` / above 0 when asked."""
        scalar = self._scalar(node, field, (_INT, _FLOAT), "a number")
        if isinstance(scalar, _Invalid):
            return INVALID
        value = _to_number(scalar)
        if value is None:
            return self.fail(node, field, f"expected a finite number, got {scalar.value[:40]}")
        if positive and value <= 0:
            return self.fail(node, field, f"must be greater than 0, got {scalar.value}")
        if minimum is not None and value < minimum:
            return self.fail(node, field, f"must be at least {minimum}, got {scalar.value}")
        return value

    def choice(self, node: Node, field: str, options: Collection[str]) -> str | _Invalid:
        """One of ``options`` (a near miss gets a hint)."""
        value = self.string(node, field)
        if isinstance(value, _Invalid):
            return INVALID
        if value not in options:
            listed = ", ".join(sorted(options))
            return self.fail(node, field, f"unknown value {value!r}{did_you_mean(value, options)}; one of: {listed}")
        return value

    def plain(self, node: Node, field: str, depth: int = 0, top: str | None = None) -> Any:
        """The JSON-like value of ``node`` (mappings with string keys, lists, finite numbers, strings, bools, null)."""
        self._visit(node)
        top = field if top is None else top
        if depth > MAX_DEPTH:
            return self.fail(node, top, f"nested deeper than {MAX_DEPTH} levels (a recursive alias?)")
        if not self._tag_ok(node, field):
            return INVALID
        if isinstance(node, MappingNode):
            entries = self.mapping(node, field)
            if isinstance(entries, _Invalid):
                return INVALID
            result: dict[str, Any] = {}
            for key, (_, value_node) in entries.items():
                value = self.plain(value_node, f"{field}.{key}", depth + 1, top)
                if value is INVALID:
                    return INVALID
                result[key] = value
            return result
        if isinstance(node, SequenceNode):
            items = []
            for index, item_node in enumerate(node.value):
                item = self.plain(item_node, f"{field}[{index}]", depth + 1, top)
                if item is INVALID:
                    return INVALID
                items.append(item)
            return items
        assert isinstance(node, ScalarNode)
        if node.tag == _NULL:
            return None
        if node.tag == _BOOL:
            return self.boolean(node, field)
        if node.tag in (_INT, _FLOAT):
            if node.tag == _INT and (whole := _to_int(node.value)) is not None:
                return whole
            return self.number(node, field)
        return str(node.value)


class _Guard:
    """Turns an alias bomb (the file's value budget running out) into one problem at the top of the file."""

    def __init__(self, reader: NodeReader) -> None:
        self.reader = reader

    def __enter__(self) -> NodeReader:
        return self.reader

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        if kind is _Overflow:
            self.reader.problems.append(
                Problem(self.reader.file, 1, "", f"the file expands to more than {MAX_VALUES} values (through aliases)")
            )
            return True
        return False


def _to_int(text: str) -> int | None:
    """The integer a core-schema int scalar spells, or ``None`` when it is too long to be a sensible limit."""
    if len(text) > 30:
        return None
    try:
        if text.startswith(("0o", "0x")):
            return int(text[2:], 8 if text[1] == "o" else 16)
        return int(text, 10)
    except ValueError:
        return None


def _to_number(node: ScalarNode) -> float | None:
    """The finite number of an int or float scalar, or ``None`` (inf, nan, unreadable)."""
    if node.tag == _INT:
        whole = _to_int(node.value)
        return float(whole) if whole is not None else None
    text = node.value.lower().replace(".inf", "inf").replace(".nan", "nan")
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
