"""The ``otel-replay`` command: a thin layer over the library.

One module per family of commands (``dataset``, ``replay``, ``demo``,
``serve``, ``storage``, ``rerun``, ``contracts``), the terminal rendering in ``render``, and
what they share in ``_inputs``. A command's module is imported only when that
command runs (or its help is asked for): ``otel-replay --help`` and each command
start without the modules of the others. Every user error ends in one line on stderr and
exit code 1; an unexpected error (a bug) ends in one line and exit code 3. Set
``OTEL_REPLAY_DEBUG=1`` to see the traceback instead.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from otel_replay._version import __version__

__all__ = ["main", "run"]


class _LazyGroup(click.Group):
    """A group whose commands are imported by name when one is run, listed without importing any.

    ``lazy`` maps a command's name to its ``"module:attribute"`` and its short
    help, the text ``--help`` lists (a test holds it equal to the command's own).
    """

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command's name, sorted, none of them imported."""
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command ``cmd_name``, its module imported now if it was not."""
        if cmd_name not in self.commands and cmd_name in self.lazy:
            module, _, attribute = self.lazy[cmd_name][0].partition(":")
            command = getattr(importlib.import_module(module), attribute)
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The ``Commands:`` section of ``--help``, as click writes it, from the short help held here."""
        names = [n for n in self.list_commands(ctx) if n not in self.commands or not self.commands[n].hidden]
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = []
        for name in names:
            if name in self.commands:
                rows.append((name, self.commands[name].get_short_help_str(limit)))
            else:
                # click's own shortening, of the text held here: a bare command with it as its help
                rows.append((name, click.Command(name, help=self.lazy[name][1]).get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


COMMANDS: dict[str, tuple[str, str]] = {
    "calibration": ("otel_replay.cli.dataset:calibration", "Confidence buckets against outcome correctness."),
    "chain": (
        "otel_replay.cli.dataset:chain",
        "Rebuild the CHAIN_TYPE chain for CHAIN_ID (a correlation, session, directive or incident id).",
    ),
    "compact": (
        "otel_replay.cli.storage:compact_command",
        "Sort a dataset's small arrival-order files into large indexed files (and drop old partitions).",
    ),
    "contracts": (
        "otel_replay.cli.contracts:contracts_group",
        "Check recorded sessions against tool contracts (YAML), or draft contracts from them.",
    ),
    "demo": (
        "otel_replay.cli.demo:demo",
        "Capture a $4,200 payment, commit it, replay it under a dropped budget, roll it back.",
    ),
    "ingest": (
        "otel_replay.cli.serve:ingest_command",
        "Load Collector file-exporter output (JSON lines or proto, plain, gzip or zstd) and OTLP/JSON files.",
    ),
    "replay": (
        "otel_replay.cli.replay:replay_cmd",
        "Replay decision RECORD_ID against the live state and print the verdict.",
    ),
    "report": (
        "otel_replay.cli.report:report",
        "Write a post-mortem as one HTML page that opens offline (no network, strict Content-Security-Policy).",
    ),
    "rerun": (
        "otel_replay.cli.rerun:rerun_command",
        "Rerun recorded session SESSION_ID (or --all) offline from the dataset and compare fingerprints.",
    ),
    "serve": (
        "otel_replay.cli.serve:serve_command",
        "Receive OTLP traces over gRPC and HTTP into DATASET; acknowledge only durable spans.",
    ),
    "sql": (
        "otel_replay.cli.dataset:sql",
        "Run QUERY (SQL text, or a path to a .sql file) read-only against the dataset's views.",
    ),
    "tree": ("otel_replay.cli.dataset:tree", "Print the causal tree of spans under decision RECORD_ID."),
    "ui": (
        "otel_replay.cli.ui:ui_command",
        "Serve the dataset's chains, decisions and reruns as pages (read-only, GET only) until Ctrl-C.",
    ),
    "verify": (
        "otel_replay.cli.dataset:verify",
        "Check every record's hash, signature and chain link; names any record edited, deleted or reordered.",
    ),
}
"""Every command: name -> ("module:attribute", the short help ``--help`` lists)."""


@click.group(cls=_LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="otel-replay")
def main() -> None:
    """Capture, store, query, replay and gate AI-agent decisions recorded as OpenTelemetry spans."""


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
    # Imported here for start-up cost: only ``compact`` asks pyarrow which allocator it runs under.
    import pyarrow as pa

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
