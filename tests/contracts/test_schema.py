"""The JSON Schemas shipped for editors agree with the loader on every file of the corpora.

jsonschema is a test dependency only (the loader does not use it); the schemas are read the way
an installed package reads them, through importlib.resources.
"""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest

from otel_replay.contracts._read import (
    COMMIT_REQUIREMENTS,
    EVIDENCE_CLASSES,
    GATES,
    INVARIANT_CHECKS,
    LIMIT_FIELDS,
    SCHEMA_VERSIONS,
    SESSION_FIELDS,
    TOOL_FIELDS,
    TOOL_NAME,
)
from otel_replay.contracts._yaml import INVALID, FileProblem, NodeReader, compose_text
from otel_replay.contracts.loader import validate_file
from otel_replay.contracts.model import SIDE_EFFECTS

from ._corpus import BadCase, bad_cases, good_files

jsonschema = pytest.importorskip("jsonschema", reason="the schema agreement tests need jsonschema (the test extra)")

SCHEMA_DIR = files("otel_replay.contracts") / "schema"


def _schema(kind: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((SCHEMA_DIR / f"{kind}.schema.json").read_text(encoding="utf-8"))
    return loaded


def _validator(kind: str) -> Any:
    return jsonschema.Draft202012Validator(_schema(kind), format_checker=jsonschema.FormatChecker())


def _as_json(file: Path) -> Any:
    """The file as the JSON value an editor validates, or INVALID when it is not one (syntax, tags, duplicates)."""
    try:
        node = compose_text(file.read_bytes())
    except FileProblem:
        return INVALID
    if node is None:
        return INVALID
    reader = NodeReader(str(file))
    with reader.guarded():
        value = reader.plain(node, "")
        return INVALID if reader.problems else value
    return INVALID


@pytest.mark.parametrize("kind", ["tool", "session"])
def test_each_schema_is_a_valid_2020_12_schema_with_an_id_and_a_description_on_every_property(kind: str) -> None:
    schema = _schema(kind)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"].startswith("urn:otel-replay:contracts:")
    missing: list[str] = []

    def walk(node: Any, where: str) -> None:
        # Field definitions only: properties, items, additionalProperties and $defs (not anyOf, contains, if/then,
        # which constrain fields defined elsewhere).
        for name, sub in node.get("properties", {}).items():
            if "description" not in sub:
                missing.append(f"{where}.{name}")
            walk(sub, f"{where}.{name}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key], f"{where}.{key}")
        for name, sub in node.get("$defs", {}).items():
            walk(sub, f"{where}.$defs.{name}")

    walk(schema, kind)
    assert missing == []


def test_the_schemas_list_exactly_the_fields_the_loader_reads() -> None:
    tool, session = _schema("tool"), _schema("session")
    assert set(tool["properties"]) == set(TOOL_FIELDS)
    assert set(session["properties"]) == set(SESSION_FIELDS)
    assert set(session["properties"]["session_limits"]["properties"]) == set(LIMIT_FIELDS)
    assert set(tool["$defs"]["invariant"]["properties"]) == {"path", "optional", *INVARIANT_CHECKS}
    assert [set(choice["required"]) for choice in tool["$defs"]["invariant"]["anyOf"]] == [
        {check} for check in INVARIANT_CHECKS
    ]
    assert tuple(tool["properties"]["side_effect"]["enum"]) == SIDE_EFFECTS
    assert set(session["properties"]["risk_defaults"]["properties"]) == set(SIDE_EFFECTS)
    assert set(tool["properties"]["evidence_class"]["enum"]) == set(EVIDENCE_CLASSES)
    assert set(tool["properties"]["commit_requirement"]["enum"]) == set(COMMIT_REQUIREMENTS)
    assert set(tool["properties"]["gate"]["enum"]) == set(GATES) == set(session["$defs"]["gate"]["enum"])
    assert session["properties"]["schema_version"]["const"] in SCHEMA_VERSIONS
    assert tool["properties"]["tool"]["pattern"] == f"^{TOOL_NAME.pattern}$"


@pytest.mark.parametrize("file", good_files(), ids=lambda file: f"{file.parent.name}/{file.name}")
def test_a_good_file_passes_both_the_loader_and_the_schema(file: Path) -> None:
    kind = "session" if file.name == "session.yaml" else "tool"
    assert validate_file(file) == []
    value = _as_json(file)
    assert value is not INVALID
    errors = [error.message for error in _validator(kind).iter_errors(value)]
    assert errors == []


@pytest.mark.parametrize("case", bad_cases(), ids=lambda case: case.name)
def test_a_bad_file_fails_the_loader_and_the_schema_says_what_the_corpus_says(case: BadCase) -> None:
    assert validate_file(case.file, kind=case.kind) != []
    value = _as_json(case.file)
    if case.schema == "not-json":
        assert value is INVALID
        return
    assert value is not INVALID
    errors = list(_validator(case.kind).iter_errors(value))
    assert case.schema in ("valid", "invalid")
    assert (not errors) == (case.schema == "valid"), [error.message for error in errors]
