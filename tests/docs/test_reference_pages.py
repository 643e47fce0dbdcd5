"""The generated reference pages cover what the code holds, and the site's navigation covers every page.

``docs/hooks.py`` makes these pages when MkDocs builds the site (``.ci/run`` builds it
with ``--strict``); these tests run its generators without MkDocs, so a command, variable,
error or public name that the pages would miss fails the ordinary test run too.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import click
import pytest
import yaml

import otel_replay
from otel_replay import errors, settings
from otel_replay.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("otel_replay_docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_command_is_in_the_cli_reference(hooks: ModuleType) -> None:
    page = hooks.cli_reference()
    ctx = click.Context(main, info_name="otel-replay")
    names = main.list_commands(ctx)
    assert len(names) >= 10, names
    for name in names:
        assert f"## `otel-replay {name}`" in page, name
    assert "Sentinel" not in page  # click's internal "no default" marker never leaks into the page


def test_every_variable_is_in_the_environment_reference(hooks: ModuleType) -> None:
    page = hooks.environment_reference()
    variables = {v for v in vars(settings).values() if isinstance(v, str) and v.startswith("OTEL_REPLAY_")}
    assert len(variables) >= 15, variables
    for variable in variables:
        assert f"| `{variable}` |" in page, variable


def test_every_error_is_in_the_error_tree(hooks: ModuleType) -> None:
    page = hooks.errors_reference()
    for cls in vars(errors).values():
        if isinstance(cls, type) and issubclass(cls, errors.OtelReplayError) and cls.__module__ == errors.__name__:
            assert f"**`{cls.__name__}`**" in page, cls


def test_every_public_name_is_in_the_api_reference(hooks: ModuleType) -> None:
    page = hooks.api_reference()
    for name in otel_replay.__all__:
        obj = getattr(otel_replay, name)
        assert f"::: {getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}\n" in page or (
            f"### `{name}`" in page
        ), name


def test_the_readme_on_the_site_links_inside_the_site(hooks: ModuleType) -> None:
    page = hooks.readme()
    assert "](docs/" not in page and "](benchmarks/README.md" not in page


def _nav_pages(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [page for item in node for page in _nav_pages(item)]
    if isinstance(node, dict):
        return [page for value in node.values() for page in _nav_pages(value)]
    return []


def test_the_navigation_lists_every_page_once() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = _nav_pages(config["nav"])
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages
    markers = {m for p in DOCS.rglob("*.md") for m in re.findall(r"<!-- generated: ([a-z-]+) -->", p.read_text())}
    assert markers == {"cli", "environment", "errors", "api", "readme", "benchmarks-history"}
