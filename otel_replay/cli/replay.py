"""``otel-replay replay``: a stored decision against today's state, and with ``--execute`` its compensation."""

from __future__ import annotations

from typing import Any

import click

from otel_replay import settings
from otel_replay.cli import render as r
from otel_replay.cli._inputs import (
    dataset_option,
    friendly,
    key_file_keys,
    open_dataset,
    read_live_state,
    require_writable,
    skip_option,
    user_callable,
)
from otel_replay.gate import GateOutcome, Rail
from otel_replay.gate.execute import execute_verdict, replay_stored
from otel_replay.gate.policy import IMPORT_HELP, Verdict
from otel_replay.integrity import SigningKey
from otel_replay.pipeline import configure
from otel_replay.query.analyst import require_utf8
from otel_replay.query.store import Store
from otel_replay.storage.backend import backend_for

__all__ = ["replay_cmd"]


@click.command("replay")
@click.argument("record_id")
@click.option("--live-state", required=True, help="JSON file of the live state.")
@click.option("--policy", "policy_ref", required=True, help=f"Policy as module:function, {IMPORT_HELP}.")
@click.option(
    "--execute", is_flag=True, help="Apply the verdict post-commit through --rail, compensating the stored receipt."
)
@click.option("--rail", "rail_ref", help=f"Rail factory as module:function (needed by --execute), {IMPORT_HELP}.")
@click.option(
    "--require-signed/--no-require-signed",
    default=True,
    show_default=True,
    help="Act only on records signed with a known key; --execute always requires it.",
)
@click.option(
    "--key-file",
    "key_files",
    multiple=True,
    help="Verification key file; repeat for rotated keys (default: the signing key).",
)
@click.option("--resume", is_flag=True, help="Retry a compensation an earlier run claimed but never finished.")
@dataset_option
@skip_option
@friendly
def replay_cmd(
    record_id: str,
    live_state: str,
    policy_ref: str,
    execute: bool,
    rail_ref: str | None,
    require_signed: bool,
    key_files: tuple[str, ...],
    resume: bool,
    dataset: str,
    skip_corrupt: bool,
) -> None:
    """Replay decision RECORD_ID against the live state and print the verdict.

    Only a sealed record whose signature verifies is replayed; with --execute,
    each stored receipt is compensated at most once, across processes.
    """
    _check(record_id, execute, rail_ref, resume, require_signed)
    state = read_live_state(live_state)
    policy = user_callable(policy_ref, "policy")
    rail = _load_rail(rail_ref) if execute and rail_ref else None
    keys = _keys(key_files)
    with open_dataset(dataset, skip_corrupt, keys=keys, require_signed=require_signed) as store:
        verdict = replay_stored(store, record_id, live_state=state, policy=policy)
        r.print_verdict(verdict)
        if rail is None:
            return
        outcomes, stored = _compensate(store, verdict, rail, resume=resume, dataset=dataset, record_id=record_id)
        skipped = len(store.skipped)
    for outcome in outcomes:
        r.print_outcome(outcome)
    if not stored:
        raise click.ClickException(f"the compensation records could not be stored in {dataset} (see the errors above)")
    if skipped:  # --skip-corrupt: a file left out may hold a commit of the decision, its receipt never compensated
        raise click.ClickException(
            f"{skipped} file(s) of {dataset} were left out as corrupt (named above): a commit or compensation "
            "stored in one was not judged nor compensated; repair or remove them, then run again"
        )


def _check(record_id: str, execute: bool, rail_ref: str | None, resume: bool, require_signed: bool) -> None:
    """A one-line error for options that do not go together (before anything is read)."""
    if not execute and (rail_ref or resume):  # silently ignored, it would look like a compensation that ran
        given = " and ".join(name for name, on in (("--rail", rail_ref), ("--resume", resume)) if on)
        verb = "apply" if " and " in given else "applies"
        raise click.UsageError(f"{given} only {verb} with --execute (without it nothing is compensated)")
    if execute and not rail_ref:
        raise click.ClickException("--execute needs --rail module:function (the rail to compensate through)")
    require_utf8(record_id, "RECORD_ID")
    if execute and not require_signed:
        raise click.ClickException("--execute acts only on signed records; drop --no-require-signed")


def _compensate(
    store: Store, verdict: Verdict, rail: Rail, *, resume: bool, dataset: str, record_id: str
) -> tuple[list[GateOutcome], bool]:
    """Apply ``verdict`` through ``rail``: the gate's outcomes, and whether their records were all stored."""
    directory = backend_for(store.location).directory
    if directory is not None:
        require_writable(directory, "--execute stores its compensation records there")
    with configure(dataset, service_name="otel-replay-cli", set_global=False) as telemetry:
        try:
            outcomes = execute_verdict(store, verdict, rail, resume=resume)
        except Exception as exc:
            if settings.env_flag(settings.DEBUG) or not _compensation_summary(exc):
                raise
            # The rail's own refusal is not an otel-replay bug; say what this run did refund, too.
            raise click.ClickException(f"compensating decision {record_id}: {_compensation_summary(exc)}") from exc
        stored = telemetry.force_flush()  # False: a record was not written (the exporter logged why)
    return outcomes, stored


def _compensation_summary(exc: BaseException) -> str | None:
    """What happened to every receipt, from the note :func:`~otel_replay.gate.execute_verdict` adds to its error.

    A receipt this run could not compensate (an untrusted commit, an executed? unknown) is named by the error,
    and what was done with the trusted receipts is said after it: a refund made is never left unsaid.
    """
    for note in getattr(exc, "__notes__", ()):
        if isinstance(note, str) and "every receipt of the decision: " in note:
            return f"{note.split('every receipt of the decision: ', 1)[1]} (first failure: {type(exc).__name__})"
        if isinstance(note, str) and "the trusted receipts of the decision: " in note:
            return f"{exc} (the trusted receipts: {note.split('the trusted receipts of the decision: ', 1)[1]})"
    return None


def _keys(key_files: tuple[str, ...]) -> list[SigningKey] | None:
    """Keys from --key-file options; ``None`` means the default key (never created)."""
    if not key_files:
        return None
    return key_file_keys(key_files)


def _load_rail(ref: str) -> Any:
    factory = user_callable(ref, "rail")
    try:
        rail = factory()
    except Exception as exc:
        raise click.ClickException(f"rail factory {ref} raised {type(exc).__name__}: {exc}") from exc
    missing = [name for name in ("commit", "compensate") if not callable(getattr(rail, name, None))]
    if missing:
        raise click.ClickException(
            f"--rail {ref}: the factory returned {type(rail).__name__}, not a rail (no {' or '.join(missing)} method)"
        )
    return rail
