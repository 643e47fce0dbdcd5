"""``otel-replay rerun``: rerun one recorded session, or all of them (Continuous Replay), from the dataset.

Exit codes: 0 every rerun matched (and every gate action succeeded); 4 a rerun
diverged (a strict one stopped at its divergence or leak, printed whole), ended
early or its entrypoint raised, or a gate action failed or was refused; 1 a
user error (one line on stderr, no traceback); 2 a usage error (click's); 3 a bug.
A script can tell a divergence from a mistyped option by the code alone.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import json
import sys
from collections.abc import Callable
from typing import Any, cast

import click

from otel_replay import settings
from otel_replay.cli._inputs import friendly, read_live_state, require_writable, user_callable
from otel_replay.cli._sessions import no_recording
from otel_replay.cli.render import clean, first_line, one_line
from otel_replay.errors import OtelReplayError, RecordNotFound, RerunError
from otel_replay.gate.policy import IMPORT_HELP
from otel_replay.location import resolve
from otel_replay.pipeline import configure
from otel_replay.query.analyst import require_utf8
from otel_replay.query.store import Store
from otel_replay.rerun.guards import parse_allow_live
from otel_replay.rerun.load import recorded_sessions
from otel_replay.rerun.runner import RerunResult, rerun
from otel_replay.rerun.serve import CREDENTIALS, Credentials, Governance
from otel_replay.storage.backend import backend_for

__all__ = ["DIVERGED", "rerun_command"]

DIVERGED = 4
"""Exit code when a rerun did not match its recording (distinct from click's usage error, 2)."""


def _sessions(store: Any, pattern: str | None, sessions_sql: str | None) -> list[str]:
    recorded = [str(row["session_id"]) for row in recorded_sessions(store)]
    if sessions_sql:
        table = store.query(sessions_sql)
        if "session_id" not in table.column_names:
            raise click.ClickException("--sessions-sql must return a session_id column")
        wanted = {str(v) for v in table.column("session_id").to_pylist() if v is not None}
        recorded = [s for s in recorded if s in wanted]
    if pattern:
        recorded = [s for s in recorded if fnmatch.fnmatchcase(s, pattern)]
    return recorded


@click.command("rerun")
@click.argument("session_id", required=False)
@click.option(
    "--entrypoint",
    required=True,
    help=f"The agent to rerun, as module:function (called with no arguments), {IMPORT_HELP}.",
)
@click.option(
    "--dataset",
    "-d",
    default=lambda: settings.dataset_dir(),
    show_default="$OTEL_REPLAY_DATASET or ./traces",
    help="Dataset directory.",
)
@click.option("--all", "all_sessions", is_flag=True, help="Rerun every recorded session (Continuous Replay).")
@click.option("--match", "pattern", help="With --all: only sessions whose id matches this glob.")
@click.option("--sessions-sql", help="With --all: a read-only query returning the session_id column to rerun.")
@click.option("--governance", type=click.Choice(["relaxed", "strict"]), default="relaxed", show_default=True)
@click.option("--live-state", help="JSON file of the live state: replay each reproduced decision under it.")
@click.option("--policy", "policy_ref", help=f"Policy as module:function (with --live-state), {IMPORT_HELP}.")
@click.option("--execute", is_flag=True, help="Compensate ROLLBACK/BLOCK verdicts' committed actions through --rail.")
@click.option("--rail", "rail_ref", help=f"Rail factory as module:function (needed by --execute), {IMPORT_HELP}.")
@click.option(
    "--allow-live",
    "allow_live",
    multiple=True,
    metavar="HOST:PORT",
    help="Let calls to HOST:PORT (or HOST:*) run live instead of being refused as leaks (repeatable).",
)
@click.option(
    "--credentials",
    default="value",
    show_default=True,
    metavar="value|presence",
    help="How HTTP credential headers (Authorization, X-Api-Key ...) are compared: by value, or by presence "
    "(the same header sent with the same scheme, any value: for a rerun without the recorded run's keys).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON lines.")
@friendly
def rerun_command(**options: Any) -> None:
    """Rerun recorded session SESSION_ID (or --all) offline from the dataset and compare fingerprints.

    Every clock read, entropy draw, HTTP response, model output and tool
    result is served from the sealed recording; nothing goes to the network:
    any other connection, DNS lookup or process start is a leak, refused
    (except to a --allow-live HOST:PORT), and a rerun with a leak does not
    match. Prints the first divergent step of a rerun that did not match.
    """
    try:
        code = _main(_Options(**options))  # the options, by name, as click parsed them
    except click.ClickException:
        raise
    except (OtelReplayError, OSError, ValueError) as exc:
        raise click.ClickException(one_line(exc)) from exc
    sys.exit(code)


@dataclasses.dataclass(frozen=True)
class _Options:
    """The options of one ``otel-replay rerun``, as click parsed them."""

    session_id: str | None
    entrypoint: str
    dataset: str
    all_sessions: bool
    pattern: str | None
    sessions_sql: str | None
    governance: str
    live_state: str | None
    policy_ref: str | None
    execute: bool
    rail_ref: str | None
    allow_live: tuple[str, ...]
    credentials: str
    as_json: bool


def _main(options: _Options) -> int:
    """Rerun the selected sessions and print the results; the exit code (0, or :data:`DIVERGED`)."""
    _check(options)
    _check_dataset(options.dataset)
    parse_allow_live(options.allow_live)  # a bad entry is named before anything runs
    function = user_callable(options.entrypoint, "entrypoint")
    state = read_live_state(options.live_state) if options.live_state else None
    policy = user_callable(options.policy_ref, "policy") if options.policy_ref else None
    rail = _rail(options.rail_ref) if options.execute and options.rail_ref else None
    results: list[RerunResult] = []
    errors: list[tuple[str, str]] = []
    dataset = options.dataset
    with Store(dataset) as store, configure(dataset, service_name="otel-replay-rerun", set_global=False) as telemetry:
        targets = _targets(store, options)
        one = functools.partial(
            rerun, function, dataset=store, governance=cast(Governance, options.governance), live_state=state,
            policy=policy, rail=rail, allow_live=options.allow_live, credentials=cast(Credentials, options.credentials),
        )  # fmt: skip
        if options.all_sessions and not options.as_json:
            with click.progressbar(targets, label="rerunning", file=sys.stderr, show_pos=True) as bar:
                for sid in bar:
                    _one(one, sid, results, errors, options.all_sessions)
        else:
            for sid in targets:
                try:
                    _one(one, sid, results, errors, options.all_sessions)
                except RecordNotFound as exc:
                    said = no_recording(store, sid, exc)
                    if said is None:
                        raise
                    raise said from exc
        stored = telemetry.force_flush()  # False: a write failed or spans were dropped (the exporter logged why)
    _print_results(results, errors, options)
    if not stored:
        raise click.ClickException(f"the rerun's result could not be stored in {dataset} (see the errors above)")
    failed = errors or any(not result.matched or any(g.error for g in result.gate) for result in results)
    return DIVERGED if failed else 0


def _check(options: _Options) -> None:
    """A one-line error for options that do not go together (before anything is read or run)."""
    if options.credentials not in CREDENTIALS:
        got = clean(options.credentials)[:80]
        raise click.ClickException(f"--credentials must be 'value' or 'presence', got {got!r}")
    if options.all_sessions == (options.session_id is not None):
        raise click.ClickException("give one SESSION_ID, or --all (not both)")
    if (options.pattern or options.sessions_sql) and not options.all_sessions:
        raise click.ClickException("--match and --sessions-sql select sessions for --all")
    if (options.live_state is None) != (options.policy_ref is None):
        raise click.ClickException("--live-state and --policy go together")
    if options.execute and not options.rail_ref:
        raise click.ClickException("--execute needs --rail module:function (the rail to compensate through)")
    if options.rail_ref and not options.execute:
        raise click.UsageError("--rail only applies with --execute (without it nothing is compensated)")
    if options.sessions_sql:
        require_utf8(options.sessions_sql, "--sessions-sql")


def _check_dataset(dataset: str) -> None:
    """A one-line error unless ``dataset`` is a local directory the rerun can store its result in."""
    try:
        location = resolve(dataset)
    except OtelReplayError as exc:
        raise click.ClickException(str(exc)) from exc
    path = backend_for(location).directory
    if path is None:
        raise click.ClickException(f"dataset {dataset}: rerun reads a local dataset (copy the session's files down)")
    if not path.is_dir():
        raise click.ClickException(f"dataset {dataset} does not exist or is not a directory")
    require_writable(path, "rerun stores its result there")


def _rail(ref: str) -> Any:
    """The rail the ``--rail`` factory ``ref`` makes; its error is one line naming the factory."""
    factory = user_callable(ref, "rail")
    try:
        return factory()
    except Exception as exc:
        raise click.ClickException(f"rail factory {ref} raised {type(exc).__name__}: {exc}") from exc


def _targets(store: Store, options: _Options) -> list[str]:
    """The sessions to rerun: the one given, or every recorded one the selection keeps."""
    if not options.all_sessions:
        return [str(options.session_id)]
    targets = _sessions(store, options.pattern, options.sessions_sql)
    if not targets:
        selected = " match the selection" if options.pattern or options.sessions_sql else ""
        raise click.ClickException(f"no recorded sessions in {options.dataset}{selected}")
    return targets


def _print_results(results: list[RerunResult], errors: list[tuple[str, str]], options: _Options) -> None:
    """JSON lines, the table of ``--all``, or the one rerun's report."""
    if options.as_json:
        for result in results:
            click.echo(json.dumps(_as_json(result), sort_keys=True, default=str))
        for sid, message in errors:
            click.echo(json.dumps({"session_id": sid, "status": "errored", "error": message}, sort_keys=True))
    elif options.all_sessions:
        _table(results, errors)
    elif results:
        click.echo(_report(results[0]))
    else:
        click.echo(_lines(f"session {clean(errors[0][0])}: {errors[0][1]}"))


def _one(
    rerun: Callable[..., Any], sid: str, results: list[Any], errors: list[tuple[str, str]], keep_going: bool
) -> None:
    """Rerun session ``sid``; with ``keep_going`` (``--all``) a refused session is noted and the rest go on."""
    try:
        results.append(rerun(session_id=sid))
    except RerunError as exc:  # a strict rerun stopped at a divergence or a leak: a finding, shown whole
        errors.append((sid, str(exc)))
    except OtelReplayError as exc:
        if not keep_going:
            raise
        errors.append((sid, one_line(exc)))


def _as_json(result: Any) -> dict[str, Any]:
    return {
        "session_id": result.session_id,
        "rerun_id": result.rerun_id,
        "status": result.summary(),
        "matched": result.matched,
        "fingerprint": result.fingerprint,
        "original_fingerprint": result.original_fingerprint,
        "steps": result.steps,
        "credentials": result.credentials,
        "divergence": result.divergence.to_json() if result.divergence else None,
        "leaks": list(result.leaks),
        "live": list(result.live),
        "error": result.error,
        "gate": [g.to_json() for g in result.gate],
    }


def _lines(text: str) -> str:
    """``text`` line by line with control characters escaped: recorded ids and messages are data."""
    return "\n".join(clean(line) for line in text.splitlines())


def _report(result: Any) -> str:
    """``result.report()`` safe for a terminal: a session id or error with a newline cannot forge a line."""
    error = None if result.error is None else clean(result.error)
    return _lines(dataclasses.replace(result, session_id=clean(result.session_id), error=error).report())


def _table(results: list[Any], errors: list[tuple[str, str]]) -> None:
    rows = [(clean(r.session_id), clean(r.summary()), str(r.steps), f"{r.seconds * 1000:.1f}") for r in results]
    rows += [(clean(sid), f"errored: {first_line(message)}", "-", "-") for sid, message in errors]
    header = ("session", "result", "steps", "ms")
    widths = [min(60, max(len(h), *(len(row[i]) for row in rows))) for i, h in enumerate(header)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for row in rows:
        click.echo("  ".join(cell[:w].ljust(w) for cell, w in zip(row, widths, strict=True)))
    matched = sum(1 for r in results if r.matched)
    click.echo(f"{matched} matched, {len(results) - matched} diverged, {len(errors)} errored (of {len(rows)})")
    for result in results:
        if not result.matched:
            click.echo(f"\n{_report(result)}")
    for sid, message in errors:
        click.echo(f"\n{_lines(f'{clean(sid)}: errored: {message}')}")
