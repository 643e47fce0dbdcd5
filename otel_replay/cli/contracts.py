"""``otel-replay contracts``: check recorded sessions against tool contracts, or draft contracts from them.

``contracts check`` exits 0 when no recorded call would have been blocked, 4 (:data:`BLOCKED`) when one
would have been (or a model call refused), 1 on a user error (one line on stderr, naming the file and
line of a bad contract), 2 on a usage error, 3 on a bug. ``contracts infer`` exits 0 once the drafts are
written, 1 on a user error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from otel_replay.cli import render as r
from otel_replay.cli._inputs import dataset_option, friendly, open_dataset, skip_option
from otel_replay.contracts.backtest import BacktestReport, backtest
from otel_replay.contracts.decisions import GATE_MODES, UNMATCHED_POLICIES
from otel_replay.contracts.infer import DEFAULT_MARGIN, infer_contracts, write_draft
from otel_replay.contracts.loader import load_contracts
from otel_replay.contracts.model import ContractSet
from otel_replay.contracts.recorded import RecordedSession, recorded_sessions
from otel_replay.query.analyst import require_utf8

__all__ = ["BLOCKED", "backtest_options", "contracts_group", "recorded_backtest"]

BLOCKED = 4
"""Exit code of ``contracts check`` when a recorded call would have been blocked (or a model call refused)."""

F = TypeVar("F", bound=Callable[..., Any])


def backtest_options(session_help: str) -> Callable[[F], F]:
    """The options of a backtest of recorded sessions (``contracts check`` and ``report contracts`` take the same).

    ``--contracts``, the dataset, ``--session`` (described by ``session_help``), ``--gate``, ``--unmatched-policy``.
    """

    def decorate(command: F) -> F:
        options = (
            click.option(
                "--contracts",
                "contracts_dir",
                required=True,
                help="The contracts directory (tool YAML + session.yaml).",
            ),
            dataset_option,
            skip_option,
            click.option("--session", "session_id", help=session_help),
            click.option("--gate", type=click.Choice(GATE_MODES), default="reject_all", show_default=True),
            click.option(
                "--unmatched-policy", type=click.Choice(UNMATCHED_POLICIES), default="block", show_default=True
            ),
        )
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def recorded_backtest(
    contracts_dir: str, dataset: str, skip_corrupt: bool, session_id: str | None, gate: str, unmatched_policy: str
) -> tuple[BacktestReport, list[RecordedSession]]:
    """The contracts in ``contracts_dir`` run over the dataset's recorded sessions (or one), and those sessions.

    Each problem is a one-line error: the contracts directory or a contract's file and line, a ``--session``
    that is not UTF-8, a dataset with no recorded session (or not that one).
    """
    contracts = _load(contracts_dir)
    if session_id is not None:
        require_utf8(session_id, "--session")
    with open_dataset(dataset, skip_corrupt) as store:
        sessions = recorded_sessions(store, session_id)
    _require_sessions(sessions, dataset, session_id)
    return backtest(contracts, sessions, gate=gate, unmatched_policy=unmatched_policy), sessions


@click.group("contracts")
def contracts_group() -> None:
    """Check recorded sessions against tool contracts (YAML), or draft contracts from them."""


@contracts_group.command("check")
@backtest_options("Check only this session (a session id, or a correlation id).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@friendly
def check_command(
    contracts_dir: str,
    dataset: str,
    skip_corrupt: bool,
    session_id: str | None,
    gate: str,
    unmatched_policy: str,
    as_json: bool,
) -> None:
    """Run the recorded sessions' tool calls through the contracts offline; report each call they would block.

    Exit code 0: nothing would have been blocked; 4: a call would have been blocked or a model call
    refused (each is listed with the rule, and the contract file and line that wrote it).
    """
    report, _ = recorded_backtest(contracts_dir, dataset, skip_corrupt, session_id, gate, unmatched_policy)
    if as_json:
        click.echo(json.dumps(report.as_dict(), sort_keys=True, default=str))
    else:
        _print_report(report)
    if not report.passed:
        raise click.exceptions.Exit(BLOCKED)


@contracts_group.command("infer")
@dataset_option
@skip_option
@click.option("--out", required=True, help="Directory to write the draft contracts into (made if missing).")
@click.option("--force", is_flag=True, help="Replace files of the same names already in --out.")
@click.option(
    "--margin",
    type=click.FloatRange(min=0, max=100),
    default=DEFAULT_MARGIN,
    show_default=True,
    help="How far limits and ranges reach beyond what was observed (0.25: a quarter more).",
)
@friendly
def infer_command(dataset: str, skip_corrupt: bool, out: str, force: bool, margin: float) -> None:
    """Draft contracts (one YAML per tool + session.yaml) from the recorded sessions, for review.

    Phases come from the order tools were called in, argument ranges and patterns from the recorded
    arguments, forbids_after from tools never called twice in a session, limits from what was observed
    with the margin; each rule is commented with how many sessions support it. `contracts check` on
    the same dataset then passes.
    """
    target = Path(out)
    if target.exists() and not target.is_dir():
        raise click.ClickException(f"--out {out} is a file, not a directory")
    with open_dataset(dataset, skip_corrupt) as store:
        sessions = recorded_sessions(store)
    _require_sessions(sessions, dataset, None)
    draft = infer_contracts(sessions, margin=margin)
    written = write_draft(draft, target, force=force)
    click.echo(r.clean(f"drafted {len(written)} contract files in {out} from {draft.sessions} sessions:"))
    for path in written:
        click.echo(r.clean(f"  {path.name}"))
    for note in draft.notes:
        click.echo(r.clean(f"note: {note}"), err=True)
    others = sorted(p.name for p in target.iterdir() if p.suffix in (".yaml", ".yml") and p.name not in draft.files)
    if others:
        shown = ", ".join(others[:5]) + (" ..." if len(others) > 5 else "")
        click.echo(r.clean(f"note: {out} also holds {shown}, not from this draft: they load with it"), err=True)
    click.echo("review every rule, then: otel-replay contracts check --contracts " + r.clean(out))


def _load(directory: str) -> ContractSet:
    """The contracts in ``directory``, or a one-line error naming the directory, or the bad file and line."""
    path = Path(directory)
    if not path.exists():
        raise click.ClickException(f"contracts directory {directory} does not exist")
    if not path.is_dir():
        raise click.ClickException(f"--contracts {directory} is a file, not a directory")
    return load_contracts(path)


def _require_sessions(sessions: list[RecordedSession], dataset: str, session_id: str | None) -> None:
    if sessions:
        return
    if session_id is not None:
        raise click.ClickException(f"no recorded session {session_id!r} in {dataset} (no model call carries that id)")
    raise click.ClickException(
        f"no recorded sessions in {dataset}: no model call there carries a session or correlation id"
    )


def _print_report(report: BacktestReport) -> None:
    blocked = [s for s in report.sessions if not s.passed]
    click.echo(
        r.clean(
            f"contracts {report.contracts} ({report.digest[:12]}), gate {report.gate}: "
            f"{len(report.sessions)} sessions checked, {len(blocked)} would have been blocked, "
            f"{report.blocked_calls} calls blocked"
        )
    )
    rows: list[dict[str, Any]] = []
    for session in blocked:
        for step in session.refused_steps:
            for failure in step.refused:
                rows.append(_row(session.session_id, step.number, "-", "(model call)", failure))
        for call in session.blocked:
            if call.failures and not any(step.number == call.step for step in session.refused_steps):
                for failure in call.failures:
                    rows.append(_row(session.session_id, call.step, call.index, call.tool, failure))
            elif call.with_response:
                rows.append(
                    {
                        "session": session.session_id, "step": call.step, "call": call.index, "tool": call.tool,
                        "rule": "rejected with its response", "detail": "another call of the response failed",
                        "contract": "",
                    }
                )  # fmt: skip
    if rows:
        r.print_rows(rows, title="would have been blocked")
    for session in report.sessions:
        state = "passed" if session.passed else f"BLOCKED ({len(session.blocked)} calls)"
        killed = f"; killed: {session.kill_reason}" if session.killed else ""
        click.echo(
            r.clean(
                f"{session.session_id}: {state}, {len(session.steps)} steps, {session.call_count} calls, "
                f"final phase {session.final_phase}{killed}"
            )
        )
        for note in session.notes:
            click.echo(r.clean(f"  note: {note}"))


def _row(session: str, step: int, call: Any, tool: str, failure: Any) -> dict[str, Any]:
    return {
        "session": session,
        "step": step,
        "call": call,
        "tool": tool,
        "rule": failure.rule,
        "detail": failure.detail,
        "contract": "" if failure.source is None else str(failure.source),
    }
