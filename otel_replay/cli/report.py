"""``otel-replay report``: one self-contained HTML page for a chain, a decision, a rerun or a contracts backtest.

The page is written to ``-o FILE`` through a temporary file beside it and a
rename, so a reader never sees half a page. An existing file is not
overwritten unless ``--force`` is given (a report is often written next to
others; losing one silently is worse than one more flag); ``-o`` naming a
directory, or a file in a directory that does not exist, is a one-line error.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any, cast

import click

from otel_replay.cli._inputs import (
    dataset_option,
    friendly,
    no_chain,
    open_dataset,
    read_live_state,
    skip_option,
    user_callable,
)
from otel_replay.cli._sessions import no_recording
from otel_replay.cli.contracts import backtest_options, recorded_backtest
from otel_replay.errors import RecordNotFound
from otel_replay.gate.execute import replay_stored
from otel_replay.gate.policy import IMPORT_HELP
from otel_replay.query.analyst import require_utf8
from otel_replay.query.chains import CHAIN_TYPES, ReplayBuilder
from otel_replay.query.store import Store
from otel_replay.report import contracts as contracts_model
from otel_replay.report import html, model
from otel_replay.rerun.load import load_recording
from otel_replay.rerun.runner import rerun
from otel_replay.rerun.serve import Credentials, Governance

__all__ = ["report"]

_output = click.option("--output", "-o", required=True, help="The HTML file to write.")
_force = click.option("--force", is_flag=True, help="Overwrite the output file when it exists.")


@click.group("report")
def report() -> None:
    """Write a post-mortem as one HTML page that opens offline (no network, strict Content-Security-Policy)."""


def _target(output: str, force: bool) -> Path:
    """``output`` as the file to write, checked before anything is read (a one-line error otherwise)."""
    path = Path(output)
    if path.is_dir():
        raise click.ClickException(f"-o {output} is a directory; give a file name (e.g. {path / 'report.html'})")
    if not path.parent.is_dir():
        raise click.ClickException(f"-o {output}: the directory {path.parent} does not exist")
    if path.exists() and not force:
        raise click.ClickException(f"-o {output} exists; give --force to overwrite it")
    if path.exists() and not path.is_file():
        raise click.ClickException(f"-o {output} is not a regular file")
    return path


def _write(path: Path, page: str) -> None:
    """Write ``page`` to ``path`` whole or not at all (a temporary file beside it, then a rename)."""
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(page)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    click.echo(f"wrote {path} ({len(page.encode('utf-8')):,} bytes)")


@report.command("chain")
@click.argument("chain_type", type=click.Choice(CHAIN_TYPES))
@click.argument("chain_id")
@dataset_option
@skip_option
@click.option("--limit", type=click.IntRange(min=1, max=100_000), help="Rows per layer (default as `chain`).")
@_output
@_force
@friendly
def chain_report(
    chain_type: str, chain_id: str, dataset: str, skip_corrupt: bool, limit: int | None, output: str, force: bool
) -> None:
    """A CHAIN_TYPE chain's timeline: lanes per agent, each decision expandable to what it read, called and did."""
    require_utf8(chain_id, "CHAIN_ID")
    path = _target(output, force)
    with open_dataset(dataset, skip_corrupt) as store:
        chain = ReplayBuilder(store).build(chain_type, chain_id, limit)
        if chain.empty:
            raise click.ClickException(no_chain(chain_type, chain_id, dataset))
        page = html.chain_page(model.chain_view(chain, store))
    _write(path, page)


@report.command("decision")
@click.argument("record_id")
@dataset_option
@skip_option
@click.option("--live-state", help="JSON file of the live state: show the replay verdict beside the snapshot.")
@click.option("--policy", "policy_ref", help=f"Policy as module:function (with --live-state), {IMPORT_HELP}.")
@_output
@_force
@friendly
def decision_report(
    record_id: str,
    dataset: str,
    skip_corrupt: bool,
    live_state: str | None,
    policy_ref: str | None,
    output: str,
    force: bool,
) -> None:
    """Decision RECORD_ID's causal tree as a waterfall; with --live-state and --policy, its replay verdict."""
    require_utf8(record_id, "RECORD_ID")
    if (live_state is None) != (policy_ref is None):
        raise click.ClickException("--live-state and --policy go together")
    path = _target(output, force)
    state = read_live_state(live_state) if live_state else None
    policy = user_callable(policy_ref, "policy") if policy_ref else None
    with open_dataset(dataset, skip_corrupt) as store:
        verdict = None
        if state is not None and policy is not None:
            verdict = replay_stored(store, record_id, live_state=state, policy=policy)
        page = html.decision_page(model.decision_view(store, record_id, verdict=verdict, live_state=state))
    _write(path, page)


@report.command("rerun")
@click.argument("session_id")
@dataset_option
@click.option(
    "--entrypoint",
    help=f"Rerun the agent (module:function) for this page, {IMPORT_HELP}; without it: the newest stored rerun.",
)
@click.option("--governance", type=click.Choice(["relaxed", "strict"]), default="relaxed", show_default=True)
@click.option("--allow-live", "allow_live", multiple=True, metavar="HOST:PORT", help="As `otel-replay rerun`.")
@click.option(
    "--credentials", type=click.Choice(["value", "presence"]), default="value", show_default=True,
    help="As `otel-replay rerun`.",
)  # fmt: skip
@_output
@_force
@friendly
def rerun_report(
    session_id: str,
    dataset: str,
    entrypoint: str | None,
    governance: str,
    allow_live: tuple[str, ...],
    credentials: str,
    output: str,
    force: bool,
) -> None:
    """The recorded run of SESSION_ID and its rerun side by side, the first divergent step highlighted.

    With --entrypoint the agent is rerun offline for the page (as `otel-replay
    rerun` does, but nothing is stored); without it, the newest rerun the
    dataset holds for the session is shown.
    """
    require_utf8(session_id, "SESSION_ID")
    path = _target(output, force)
    function: Any = user_callable(entrypoint, "entrypoint") if entrypoint else None
    with open_dataset(dataset, False) as store:
        try:
            view = _rerun_view(store, session_id, function, governance, allow_live, credentials)
        except RecordNotFound as exc:
            said = no_recording(store, session_id, exc)
            if said is None:
                raise
            raise said from exc
        page = html.rerun_page(view)
    _write(path, page)


def _rerun_view(
    store: Store, session_id: str, function: Any, governance: str, allow_live: tuple[str, ...], credentials: str
) -> Any:
    """The rerun page's view: the newest stored rerun of the session, or (with ``function``) a rerun made now."""
    if function is None:
        return model.session_rerun_view(store, session_id)
    recording = load_recording(store, session_id)
    result = rerun(
        function, dataset=store, session_id=session_id, governance=cast(Governance, governance),
        allow_live=allow_live, credentials=cast(Credentials, credentials), write=False,
    )  # fmt: skip
    return model.rerun_view(result, recording)


@report.command("contracts")
@backtest_options("Only this session (a session id, or a correlation id).")
@_output
@_force
@friendly
def contracts_report(
    contracts_dir: str,
    dataset: str,
    skip_corrupt: bool,
    session_id: str | None,
    gate: str,
    unmatched_policy: str,
    output: str,
    force: bool,
) -> None:
    """Per recorded session, the tool calls the contracts would have blocked and why (as `contracts check`).

    The first blocking call of each session is highlighted, with its arguments
    as recorded; blocked calls are counted per contract file and rule. The page
    is written whether or not a call would have been blocked (exit code 0).
    """
    path = _target(output, force)
    result, sessions = recorded_backtest(contracts_dir, dataset, skip_corrupt, session_id, gate, unmatched_policy)
    _write(path, html.contracts_page(contracts_model.contracts_view(result, sessions)))
