"""The ``otel-replay`` command: a thin layer over the library.

One module per family of commands (``dataset``, ``replay``, ``demo``,
``serve``, ``storage``, ``rerun``, ``contracts``), the terminal rendering in ``render``, and
what they share in ``_inputs``. Every user error ends in one line on stderr and
exit code 1; an unexpected error (a bug) ends in one line and exit code 3. Set
``OTEL_REPLAY_DEBUG=1`` to see the traceback instead.
"""

from __future__ import annotations

import os
import sys

import click
import pyarrow as pa

from otel_replay._version import __version__
from otel_replay.cli.contracts import contracts_group
from otel_replay.cli.dataset import calibration, chain, sql, tree, verify
from otel_replay.cli.demo import demo
from otel_replay.cli.replay import replay_cmd
from otel_replay.cli.report import report
from otel_replay.cli.rerun import rerun_command
from otel_replay.cli.serve import ingest_command, serve_command
from otel_replay.cli.storage import compact_command
from otel_replay.cli.ui import ui_command

__all__ = ["main", "run"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="otel-replay")
def main() -> None:
    """Capture, store, query, replay and gate AI-agent decisions recorded as OpenTelemetry spans."""


for _command in (
    demo,
    sql,
    chain,
    replay_cmd,
    verify,
    tree,
    calibration,
    serve_command,
    ingest_command,
    compact_command,
    rerun_command,
    contracts_group,
    report,
    ui_command,
):
    main.add_command(_command)


def run() -> None:
    """The ``otel-replay`` command (and ``python -m otel_replay``): :func:`main`, with ``compact`` under jemalloc."""
    _compact_under_jemalloc(sys.argv[1:])
    main(prog_name="otel-replay")


def _compact_under_jemalloc(args: list[str]) -> None:
    """Start ``compact`` again with ``ARROW_DEFAULT_MEMORY_POOL=jemalloc`` unless a pool was chosen.

    pyarrow picks the allocator of its C++ code when it is imported (before
    any command runs), so only a process started with the variable set uses
    it. With jemalloc, compacting 10M spans peaked at 1.6 GiB of RSS against
    1.9-2.1 GiB with pyarrow's default (mimalloc), in the same time (README,
    "Scaling out"). Nothing has happened yet when the process is replaced.
    """
    if not args or args[0] != "compact" or os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return
    if os.name != "posix" or getattr(sys, "frozen", False) or not sys.executable:
        return
    if pa.default_memory_pool().backend_name == "jemalloc":
        return
    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without jemalloc keeps its default
        return
    env = {**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "jemalloc"}
    sys.stdout.flush()
    sys.stderr.flush()
    # -P: the working directory is not put on sys.path, so the same installed package runs again.
    try:
        os.execve(sys.executable, [sys.executable, "-P", "-m", "otel_replay", *args], env)
    except OSError:  # the interpreter cannot be run again (permissions): compact here, with the default pool
        return
