"""``otel-replay demo``: the whole story on a sample dataset, in one command."""

from __future__ import annotations

import click

from otel_replay.cli import render as r
from otel_replay.cli._inputs import friendly
from otel_replay.demo import run_demo

__all__ = ["demo"]


@click.command("demo")
@click.option(
    "--dataset", "-d", default="./otel-replay-demo", show_default=True, help="Directory to write the demo to."
)
@friendly
def demo(dataset: str) -> None:
    """Capture a $4,200 payment, commit it, replay it under a dropped budget, roll it back."""
    r.print_demo(run_demo(dataset))
