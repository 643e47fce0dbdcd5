"""MkDocs hook: the generated reference pages, made at build time from the code itself.

A page holds a marker line ``<!-- generated: NAME -->``; ``on_page_markdown``
replaces it with the Markdown ``GENERATORS[NAME]`` returns: the CLI from the click
group, the environment variables from ``otel_replay.settings``, the error tree from
``otel_replay.errors``, the Python API (mkdocstrings directives over
``otel_replay.__all__``), and benchmarks/README.md with its links made to work here.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


def _rst_to_md(text: str) -> str:
    """The few reStructuredText forms our docstrings use, as Markdown."""
    text = re.sub(r":(?:func|class|mod|data|meth|attr|exc):`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


# --- CLI ---------------------------------------------------------------------------------------


def _param_row(param: click.Parameter, ctx: click.Context) -> str:
    if isinstance(param, click.Argument):
        name = f"`{param.human_readable_name}`"
        what = "argument" + (", repeatable" if param.multiple or param.nargs == -1 else "")
        what += "" if param.required else ", optional"
        return f"| {name} | {what} | |"
    assert isinstance(param, click.Option)
    names = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
    kind = "flag" if param.is_flag else f"`{param.type.name.upper()}`"
    if isinstance(param.type, click.Choice):
        kind = "`" + "\\|".join(str(choice) for choice in param.type.choices) + "`"
    if param.multiple:
        kind += ", repeatable"
    default = ""
    value = param.get_default(ctx, call=False)
    if param.show_default is not False and value not in (None, (), False) and isinstance(value, (int, float, str)):
        default = f" (default: `{value}`)"
    env = f" Environment: `{param.envvar}`." if isinstance(param.envvar, str) else ""
    return f"| {names} | {kind} | {_cell((param.help or '') + default + env)} |"


def _command(cmd: click.Command, path: list[str], out: list[str]) -> None:
    ctx = click.Context(cmd, info_name=" ".join(path))
    out += [f"## `{' '.join(path)}`", ""]
    if cmd.help:
        out += [inspect.cleandoc(cmd.help).replace("\b\n", ""), ""]
    out += ["```text", cmd.get_usage(ctx), "```", ""]
    params = [p for p in cmd.get_params(ctx) if "--help" not in p.opts]
    if params:
        out += ["| parameter | takes | meaning |", "|---|---|---|", *(_param_row(p, ctx) for p in params), ""]
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                _command(sub, [*path, name], out)


def cli_reference() -> str:
    """Every command of ``otel-replay``: its help, usage line and parameters, from the click group."""
    from otel_replay.cli import main  # at build time only: the docs import the package they describe

    out: list[str] = []
    ctx = click.Context(main, info_name="otel-replay")
    for name in main.list_commands(ctx):
        cmd = main.get_command(ctx, name)
        if cmd is not None and not cmd.hidden:
            _command(cmd, ["otel-replay", name], out)
    return "\n".join(out)


# --- environment variables ---------------------------------------------------------------------


def _attribute_docs(source: str) -> dict[str, str]:
    """``NAME -> docstring`` for module-level assignments followed by a string literal."""
    docs: dict[str, str] = {}
    body = ast.parse(source).body
    for node, after in zip(body, body[1:], strict=False):
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if (
            isinstance(target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[target.id] = after.value.value
    return docs


def environment_reference() -> str:
    """Every environment variable ``otel_replay.settings`` names: meaning and default from its table."""
    from otel_replay import settings  # at build time only

    doc = settings.__doc__ or ""
    rows: dict[str, tuple[str, str]] = {}
    for line in doc.splitlines():
        match = re.match(r"^``([A-Z_]+)``\s{2,}(.+?)\s{2,}(\S.*)$", line)
        if match:
            rows[match.group(1)] = (match.group(2).strip(), match.group(3).strip())
    attribute_docs = _attribute_docs(Path(settings.__file__).read_text(encoding="utf-8"))
    notes = doc.split("================================  ", 1)[-1].split("\n\n", 1)[-1]
    out = ["| variable | meaning | default |", "|---|---|---|"]
    seen = set()
    for attr in settings.__all__:
        value = getattr(settings, attr)
        if not (isinstance(value, str) and value.startswith("OTEL_")) or value in seen:
            continue
        seen.add(value)
        meaning, default = rows.get(value, (attribute_docs.get(attr, ""), "-"))
        if not meaning and value in notes:
            meaning = "see below"
        if not meaning:
            raise ValueError(f"otel_replay.settings.{attr} ({value}) is documented nowhere: add it to the table")
        out.append(f"| `{value}` | {_cell(_rst_to_md(meaning))} | {_cell(_rst_to_md(default))} |")
    return "\n".join(out) + "\n\n" + _rst_to_md(inspect.cleandoc(notes)) + "\n"


# --- errors ------------------------------------------------------------------------------------


def errors_reference() -> str:
    """The exception tree of ``otel_replay.errors``, each with the first line of its docstring."""
    from otel_replay import errors  # at build time only

    classes = [
        c for c in vars(errors).values()
        if isinstance(c, type) and issubclass(c, errors.OtelReplayError) and c.__module__ == errors.__name__
    ]
    children: dict[type, list[type]] = {}
    for cls in classes:
        if cls is not errors.OtelReplayError:
            parent = next(b for b in cls.__mro__[1:] if b in classes)
            children.setdefault(parent, []).append(cls)
    lines: list[str] = []

    def walk(cls: type, depth: int) -> None:
        first = (inspect.getdoc(cls) or "").strip().splitlines()[0:1]
        summary = _rst_to_md(first[0]) if first else ""
        bases = [b.__name__ for b in cls.__bases__ if b not in classes and b is not Exception]
        also = f" (also a `{'`, `'.join(bases)}`)" if bases else ""
        lines.append(f"{'    ' * depth}- **`{cls.__name__}`**{also}: {summary}")
        for child in children.get(cls, []):
            walk(child, depth + 1)

    walk(errors.OtelReplayError, 0)
    doc = errors.__doc__ or ""
    tree, _, after = doc.split("::\n\n", 1)[1].partition("\n\n")
    tree = "\n".join(line[4:] for line in tree.splitlines()).replace("``", "")
    return "\n".join(
        ["## The tree", "", "```text", tree, "```", "", _rst_to_md(inspect.cleandoc(after)), "",
         "## Every class", "", "From the classes themselves, with the first line of each docstring:", "", *lines, ""]
    )


# --- Python API --------------------------------------------------------------------------------


def api_reference() -> str:
    """One mkdocstrings directive per public name of ``otel_replay`` (its ``__all__``), in order."""
    import otel_replay  # at build time only

    out = []
    for name in sorted(otel_replay.__all__, key=str.lower):
        obj = getattr(otel_replay, name)
        module = getattr(obj, "__module__", None) or ""
        if isinstance(obj, (type, Callable)) and module.startswith("otel_replay"):  # type: ignore[arg-type]
            # Where it is defined, not the re-export: ``otel_replay.audit`` would find the
            # module ``otel_replay.capture.audit`` before the function of that name.
            if getattr(obj, "__name__", name) != name:  # exported under another name (open = open_store)
                out += [f"`otel_replay.{name}` is `{module}.{obj.__qualname__}`:", ""]
            out += [f"::: {module}.{obj.__qualname__}", "    options:", "      show_root_full_path: false", ""]
        else:
            out += [f"### `{name}`", "", f"`otel_replay.{name}` = `{obj!r}`", ""]
    return "\n".join(out)


# --- benchmarks history ------------------------------------------------------------------------


def benchmarks_history() -> str:
    """benchmarks/README.md, its links to the manual and to itself made relative to this page."""
    text = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    text = text.replace("](benchmarks/README.md#", "](#").replace("](README.md#", "](#")
    text = re.sub(r"\]\(\.\./docs/([^)]+)\)", r"](../\1)", text)
    return re.sub(r"\]\((bench_[a-z_]+\.py|_support\.py|gen_dataset\.py)\)", r"](`\1`)", text)


def readme() -> str:
    """README.md (the tutorial is tested there), its links into docs/ made relative to this site."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    text = text.replace("](docs/)", "](index.md)").replace("](docs/", "](")
    return text.replace("](benchmarks/README.md)", "](benchmarks/history.md)")


GENERATORS: dict[str, Callable[[], str]] = {
    "readme": readme,
    "cli": cli_reference,
    "environment": environment_reference,
    "errors": errors_reference,
    "api": api_reference,
    "benchmarks-history": benchmarks_history,
}


def _table_code_pipes(markdown: str) -> str:
    r"""``\|`` inside a code span of a table row as ``|``.

    GitHub needs the backslash there to keep the pipe out of the cell split; Python-Markdown
    never splits inside a code span and would show the backslash.
    """
    lines = []
    for line in markdown.split("\n"):
        if line.startswith("|") and "\\|" in line:
            parts = line.split("`")
            line = "`".join(p.replace("\\|", "|") if i % 2 else p for i, p in enumerate(parts))
        lines.append(line)
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each ``<!-- generated: NAME -->`` line with what ``GENERATORS[NAME]`` makes."""
    return _table_code_pipes(MARKER.sub(lambda m: GENERATORS[m.group(1)](), markdown))
