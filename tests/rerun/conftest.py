"""Fixtures for the rerun tests: scripted local servers and a record-once helper."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import otel_replay
from otel_replay.rerun import recording
from tests._support import CLI, Zygote

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

import example_rerun_agent as agent  # noqa: E402


@pytest.fixture
def servers() -> Iterator[tuple[str, str]]:
    """An API server and a model server on free 127.0.0.1 ports (stopped after the test)."""
    with agent.scripted_server() as api, agent.scripted_server() as model:
        yield api, model


def record(dataset: Path, session_id: str, entrypoint: Callable[[], Any]) -> tuple[Any, str, int]:
    """Record one run of ``entrypoint`` into ``dataset``; returns (output, fingerprint, events)."""
    telemetry = otel_replay.configure(dataset, service_name="rerun-tests", set_global=False)
    try:
        with recording(session_id) as mode:
            output = entrypoint()
        assert mode is not None
        telemetry.force_flush()
        return output, mode.fingerprint.hexdigest(), mode.events
    finally:
        telemetry.shutdown()


_NO_CURRENT_DIRECTORY = "import sys\nsys.path[:] = [entry for entry in sys.path if entry not in ('', '.')]\n"
"""What ``python -P`` leaves out of ``sys.path``: the script's directory (for ``-c``, the current one)."""

PYTEST = (
    "import os, sys, pytest\n"
    "os.environ['PYTEST_DISABLE_PLUGIN_AUTOLOAD'] = '1'\n"
    "sys.exit(int(pytest.main(sys.argv[1:])))\n"
)
"""``python -m pytest``, as a script for ``Zygote.run``, with only the plugins its ``-p`` options name: the
plugin under test is always named, and the installed others (xdist, anyio, timeout) cost 0.6 s of imports."""


def run_script(
    zygote: Zygote, script: str, *args: str, env: dict[str, str], raises: bool
) -> subprocess.CompletedProcess[str]:
    """``python -c script *args`` as a process of its own. A script that ``raises`` gets a fresh interpreter: its
    end goes through ``sys.excepthook`` there, which a child of the zygote (printing the error itself) never calls;
    any other script runs in a child of the zygote, without a second of interpreter start and imports."""
    if raises:
        command = [sys.executable, "-c", script, *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    return zygote.run(script, *args, env=env)


SCRIPT = (
    "import os, runpy, sys\n"
    "sys.argv = sys.argv[1:]\n"
    "sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)
"""``python path/to/script.py ...``, as a script for ``Zygote.run`` (the script's path its first argument)."""


def cli_without_current_directory(
    zygote: Zygote, cwd: Path, *args: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """``python -P -m otel_replay *args`` run in ``cwd`` by a child of the zygote: a real process (exit code,
    stderr), with the current directory not on ``sys.path`` (as for the console script), so a module found there
    was found by the CLI itself."""
    return zygote.run(_NO_CURRENT_DIRECTORY + CLI, *args, cwd=str(cwd), env=env)
