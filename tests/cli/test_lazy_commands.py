"""``otel-replay --help`` lists every command without importing one; a command imports its own module only."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from otel_replay.cli import COMMANDS, main

from .._support import Demo

COMMAND_MODULES = sorted({where.partition(":")[0] for where, _ in COMMANDS.values()})

# The capture path: what writes a dataset (the recorder, the exporter, the write-ahead log's writer, the OpenTelemetry
# SDK and the OTLP classes they run on). A command that only reads a dataset uses none of it.
CAPTURE_PATH = [
    "opentelemetry.sdk",
    "opentelemetry.proto",
    "google.protobuf",
    "otel_replay.capture.audit",
    "otel_replay.capture.recorder",
    "otel_replay.capture.tracer",
    "otel_replay.capture.write_ahead",
    "otel_replay.exporters.parquet",
    "otel_replay.exporters.rows",
    "otel_replay.pipeline",
]


def _fresh(code: str) -> Any:
    """Run ``code`` in a new interpreter; it prints one JSON value, returned here."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _loaded_after(args: list[str], watched: list[str] | None = None) -> dict[str, Any]:
    """Run ``otel-replay ARGS`` in a new interpreter: its exit code, output, and which of ``watched`` it imported.

    ``watched`` defaults to every command's module and the heavy packages only some commands use.
    """
    if watched is None:
        watched = [*COMMAND_MODULES, "duckdb", "grpc", "otel_replay.contracts", "otel_replay.report"]
    return _fresh(
        f"""
        import contextlib, io, json, sys
        from otel_replay.cli import main
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                main({args!r}, prog_name="otel-replay")
            except SystemExit as end:
                code = end.code
        watched = {watched!r}
        print(json.dumps({{"code": code, "out": out.getvalue(), "loaded": [m for m in watched if m in sys.modules]}}))
        """
    )


def _eager_group() -> click.Group:
    """The same group with every command imported and added, as the CLI was built before it was lazy."""

    @click.group(context_settings={"help_option_names": ["-h", "--help"]})
    @click.version_option("0", prog_name="otel-replay")
    def eager() -> None:
        """Capture, store, query, replay and gate AI-agent decisions recorded as OpenTelemetry spans."""

    ctx = click.Context(main)
    for name in COMMANDS:
        command = main.get_command(ctx, name)
        assert command is not None
        eager.add_command(command, name)
    return eager


def test_help_lists_every_command_and_imports_none_of_them() -> None:
    found = _loaded_after(["--help"])
    assert found["code"] == 0 and found["loaded"] == []
    listed = found["out"].split("Commands:\n", 1)[1]
    assert [line.split()[0] for line in listed.splitlines() if line.strip()] == sorted(COMMANDS)


@pytest.mark.parametrize("width", [40, 80, 200])
def test_help_reads_as_click_writes_it_for_the_commands_themselves(width: int) -> None:
    lazy = CliRunner().invoke(main, ["--help"], terminal_width=width, prog_name="otel-replay")
    eager = CliRunner().invoke(_eager_group(), ["--help"], terminal_width=width, prog_name="otel-replay")
    assert lazy.exit_code == 0 and lazy.output == eager.output


def test_the_short_help_held_for_each_command_is_the_command_s_own() -> None:
    for name, (where, short) in COMMANDS.items():
        module, _, attribute = where.partition(":")
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command), name
        assert command.name == name and not command.hidden, name
        assert command.get_short_help_str(10**6) == short, f"update COMMANDS[{name!r}] in otel_replay/cli/__init__.py"


def test_a_command_imports_its_own_module_and_not_the_others() -> None:
    found = _loaded_after(["sql", "--help"])
    assert found["code"] == 0 and "QUERY" in found["out"]
    assert set(found["loaded"]) <= {"otel_replay.cli.dataset", "duckdb"}  # sql's module and what it runs on
    assert "otel_replay.cli.dataset" in found["loaded"]


@pytest.mark.parametrize("command", ["chain", "sql", "verify"])
def test_a_command_that_reads_a_dataset_loads_no_part_of_the_capture_path(
    demo_build: Demo, demo_dataset: Path, command: str
) -> None:
    dataset = str(demo_dataset)
    args = {
        "chain": ["chain", "trade", demo_build.correlation_id, "-d", dataset, "--json"],
        "sql": ["sql", "SELECT count(*) AS n FROM decisions", "-d", dataset, "--format", "json"],
        "verify": ["verify", dataset],
    }[command]
    found = _loaded_after(args, [*CAPTURE_PATH, "otel_replay.gate.gate", "otel_replay.contracts", "grpc"])
    assert found["code"] == 0, found["out"]
    assert found["loaded"] == []
    shown = {"chain": '"traces"', "sql": '"n": 1', "verify": "verified"}[command]
    assert shown in found["out"]  # the command did its work: it read the dataset


@pytest.mark.parametrize("name", ["nope", "SQL", "sql ", "../sql", "otel_replay.cli.dataset:sql", ""])
def test_an_unknown_command_is_a_usage_error_naming_it(name: str) -> None:
    result = CliRunner().invoke(main, [name])
    assert result.exit_code == 2 and "No such command" in result.output and "Traceback" not in result.output
    assert main.get_command(click.Context(main), name) is None
