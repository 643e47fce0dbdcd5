"""The ``otel-replay`` command: a thin layer over the library.

Every user error ends in one line on stderr and exit code 1; an unexpected
error (a bug) ends in one line and exit code 3. Set ``OTEL_REPLAY_DEBUG=1``
to see the traceback instead.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click

from otel_replay import __version__, settings
from otel_replay import render as r
from otel_replay.errors import OtelReplayError
from otel_replay.gate.policy import IMPORT_HELP
from otel_replay.integrity import SigningKey, load_signing_key
from otel_replay.location import local_root_problem, resolve
from otel_replay.query.analyst import require_utf8
from otel_replay.query.chains import CHAIN_TYPES, ReplayBuilder
from otel_replay.query.store import Store

__all__ = ["LIVE_STATE_MAX_BYTES", "main", "read_input_file", "require_writable", "run"]

F = TypeVar("F", bound=Callable[..., Any])

_dataset_option = click.option(
    "--dataset",
    "-d",
    default=lambda: settings.dataset_dir(),
    show_default="$OTEL_REPLAY_DATASET or ./traces",
    help="Dataset directory or s3://bucket/prefix.",
)
_skip_option = click.option("--skip-corrupt", is_flag=True, help="Leave unreadable Parquet files out (and list them).")
INTERNAL_ERROR = 3
"""Exit code of an unexpected error (a bug in otel-replay); user errors exit with 1."""
LIVE_STATE_MAX_BYTES = 64 * 1024 * 1024
"""Largest ``--live-state`` file read (a bigger one is refused, never read until memory runs out)."""


class _InternalError(click.ClickException):
    exit_code = INTERNAL_ERROR


def _friendly(func: F) -> F:
    """Turn library and OS errors into one clear line and exit code 1."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        for name in ("dataset", "dataset_arg"):
            if isinstance(kwargs.get(name), str) and not kwargs[name].strip():  # `-d "$UNSET"`: never the cwd
                raise click.ClickException("the dataset is empty (--dataset ''); give a directory or s3:// URI")
        try:
            return func(*args, **kwargs)
        except click.ClickException as exc:
            # Our own messages may quote data (ids, file names): one line, controls escaped.
            lines = exc.message.strip().splitlines()
            cleaned = r.clean(lines[0]) if lines else exc.message
            if cleaned == exc.message or type(exc) not in (click.ClickException, _InternalError):
                raise
            raise type(exc)(cleaned) from exc.__cause__
        except (click.exceptions.Exit, click.Abort):
            raise
        except BrokenPipeError:
            # The reader went away (`otel-replay sql ... | head`): stop quietly.
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        except (OtelReplayError, OSError, ValueError, RecursionError, OverflowError) as exc:
            if settings.env_flag(settings.DEBUG):
                raise
            raise click.ClickException(r.one_line(exc)) from exc
        except Exception as exc:
            if settings.env_flag(settings.DEBUG):
                raise
            raise _InternalError(
                f"internal error: {type(exc).__name__}: {r.one_line(exc)} "
                "(a bug in otel-replay; OTEL_REPLAY_DEBUG=1 shows the traceback)"
            ) from exc

    return wrapper  # type: ignore[return-value]


def _input_file(path: str, what: str) -> Path:
    """``path`` as a readable regular file (or a pipe, e.g. ``<(...)``), or a one-line error naming it."""
    file = Path(path)
    if not file.exists():
        raise click.ClickException(f"{what} {path} does not exist")
    if file.is_dir():
        raise click.ClickException(f"{what} {path} is a directory, not a file")
    if not (stat.S_ISREG(file.stat().st_mode) or stat.S_ISFIFO(file.stat().st_mode)):
        raise click.ClickException(f"{what} {path} is not a regular file (a device or socket)")
    if not os.access(file, os.R_OK):
        raise click.ClickException(f"{what} {path} is not readable (permission denied)")
    return file


def read_input_file(path: str, what: str, limit: int) -> bytes:
    """The bytes of input file ``path`` (see :func:`_input_file`); more than ``limit`` is a one-line error."""
    with _input_file(path, what).open("rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise click.ClickException(f"{what} {path} is larger than {limit // (1024 * 1024)} MiB")
    return data


def require_writable(root: Path, why: str) -> None:
    """A one-line error unless spans can be written under dataset ``root`` (``why`` says who needs it)."""
    for directory in (root, root / "spans"):
        if directory.is_dir() and not os.access(directory, os.W_OK | os.X_OK):
            where = "" if directory == root else f" ({directory.name}/)"
            raise click.ClickException(f"dataset {root} is not writable{where}: permission denied; {why}")


@contextlib.contextmanager
def _open(dataset: str, skip_corrupt: bool, **trust: Any) -> Iterator[Store]:
    """Open the dataset; on the way out, name every file left out as corrupt (on stderr)."""
    location = resolve(dataset)  # a bad URI: one ConfigError line naming it
    # An object store: Store checks credentials, endpoint and bucket in one line.
    why = None if location.remote else local_root_problem(dataset, Path(location.root))
    if why is not None:
        raise click.ClickException(why)
    quiet = _SkipNotices()
    store_log = logging.getLogger("otel_replay.query.files")
    store_log.addFilter(quiet)  # the CLI names skipped files itself, once, below
    try:
        store = Store(dataset, skip_corrupt=skip_corrupt, **trust)
        try:
            yield store
        finally:
            for problem in store.skipped:
                click.echo(r.clean(f"warning: skipped {problem.path}: {problem.reason}"), err=True)
            store.close()
    finally:
        store_log.removeFilter(quiet)


class _SkipNotices(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("otel-replay: skipping")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="otel-replay")
def main() -> None:
    """Capture, store, query, replay and gate AI-agent decisions recorded as OpenTelemetry spans."""


@main.command()
@click.option(
    "--dataset", "-d", default="./otel-replay-demo", show_default=True, help="Directory to write the demo to."
)
@_friendly
def demo(dataset: str) -> None:
    """Capture a $4,200 payment, commit it, replay it under a dropped budget, roll it back."""
    from otel_replay.demo import run_demo

    r.print_demo(run_demo(dataset))


@main.command()
@click.argument("query")
@_dataset_option
@_skip_option
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True)
@_friendly
def sql(query: str, dataset: str, skip_corrupt: bool, fmt: str) -> None:
    """Run QUERY (SQL text, or a path to a .sql file) read-only against the dataset's views.

    Only queries run (SELECT, WITH, VALUES, FROM, DESCRIBE, SHOW, SUMMARIZE,
    EXPLAIN); they read the dataset's Parquet files and nothing else. The
    table cuts long values; --format json or csv prints every value whole.
    """
    if query.endswith(".sql") and not any(c.isspace() for c in query):
        try:
            query = _input_file(query, "SQL file").read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            bad = f"byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"
            raise click.ClickException(f"SQL file {query} is not valid UTF-8 ({bad})") from None
    else:
        require_utf8(query, "QUERY")
    with _open(dataset, skip_corrupt) as store:
        r.print_table(store.query(query), fmt)


@main.command()
@click.argument("chain_type", type=click.Choice(CHAIN_TYPES))
@click.argument("chain_id")
@_dataset_option
@_skip_option
@click.option(
    "--limit",
    type=click.IntRange(min=1, max=2**31 - 1),
    help="Rows per layer (default 100; 500 for directive/incident).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the chain as JSON.")
@_friendly
def chain(chain_type: str, chain_id: str, dataset: str, skip_corrupt: bool, limit: int | None, as_json: bool) -> None:
    """Rebuild the CHAIN_TYPE chain for CHAIN_ID (a correlation, session, directive or incident id)."""
    require_utf8(chain_id, "CHAIN_ID")  # DuckDB refuses it with a conversion error that names nothing
    with _open(dataset, skip_corrupt) as store:
        result = ReplayBuilder(store).build(chain_type, chain_id, limit)
    if result.empty:
        raise click.ClickException(
            f"no {chain_type} chain {chain_id!r} in {dataset}: nothing was recorded under that id"
        )
    r.print_chain(result, as_json)


@main.command("replay")
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
@_dataset_option
@_skip_option
@_friendly
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
    from otel_replay._json import strict_loads
    from otel_replay.gate.execute import execute_verdict, replay_stored
    from otel_replay.gate.policy import load_policy

    if not execute and (rail_ref or resume):  # silently ignored, it would look like a compensation that ran
        given = " and ".join(name for name, on in (("--rail", rail_ref), ("--resume", resume)) if on)
        raise click.UsageError(f"{given} only apply with --execute (without it nothing is compensated)")
    if execute and not rail_ref:
        raise click.ClickException("--execute needs --rail module:function (the rail to compensate through)")
    require_utf8(record_id, "RECORD_ID")
    if execute and not require_signed:
        raise click.ClickException("--execute acts only on signed records; drop --no-require-signed")
    state = strict_loads(
        read_input_file(live_state, "live state file", LIVE_STATE_MAX_BYTES), where=f"live state {live_state}"
    )
    if not isinstance(state, dict):
        raise click.ClickException(f"{live_state}: the live state must be a JSON object")
    policy = load_policy(policy_ref)
    rail = _load_rail(rail_ref) if execute and rail_ref else None
    keys = _keys(key_files)
    with _open(dataset, skip_corrupt, keys=keys, require_signed=require_signed) as store:
        verdict = replay_stored(store, record_id, live_state=state, policy=policy)
        r.print_verdict(verdict)
        if rail is None:
            return
        from otel_replay.pipeline import configure

        if not store.location.remote:
            require_writable(Path(store.location.root), "--execute stores its compensation records there")
        with configure(dataset, service_name="otel-replay-cli", set_global=False) as telemetry:
            try:
                outcomes = execute_verdict(store, verdict, rail, resume=resume)
            except Exception as exc:
                if settings.env_flag(settings.DEBUG) or not _compensation_summary(exc):
                    raise
                # The rail's own refusal is not an otel-replay bug; say what this run did refund, too.
                raise click.ClickException(
                    f"compensating decision {record_id}: {_compensation_summary(exc)}"
                ) from exc
            stored = telemetry.force_flush()  # False: a record was not written (the exporter logged why)
    for outcome in outcomes:
        r.print_outcome(outcome)
    if not stored:
        raise click.ClickException(f"the compensation records could not be stored in {dataset} (see the errors above)")


def _compensation_summary(exc: BaseException) -> str | None:
    """What happened to every receipt, from the note :func:`~otel_replay.gate.execute_verdict` adds to its error."""
    for note in getattr(exc, "__notes__", ()):
        if isinstance(note, str) and "every receipt of the decision: " in note:
            return f"{note.split('every receipt of the decision: ', 1)[1]} (first failure: {type(exc).__name__})"
    return None


def _keys(key_files: tuple[str, ...]) -> list[SigningKey] | None:
    """Keys from --key-file options; ``None`` means the default key (never created)."""
    if not key_files:
        return None
    return [k for k in (load_signing_key(key_file=_input_file(f, "key file")) for f in key_files) if k is not None]


def _load_rail(ref: str) -> Any:
    from otel_replay.gate.policy import load_callable

    factory = load_callable(ref, "rail")
    try:
        rail = factory()
    except Exception as exc:
        raise click.ClickException(f"rail factory {ref} raised {type(exc).__name__}: {exc}") from exc
    missing = [name for name in ("commit", "compensate") if not callable(getattr(rail, name, None))]
    if missing:
        raise click.ClickException(
            f"--rail {ref}: the factory returned {type(rail).__name__}, not a rail "
            f"(no {' or '.join(missing)} method)"
        )
    return rail


@main.command()
@click.argument("dataset_arg", required=False, metavar="[DATASET]")
@_dataset_option
@_skip_option
@click.option(
    "--key-file",
    "key_files",
    multiple=True,
    help="Signing key file; repeat for rotated keys (default: see README, Integrity and keys).",
)
@_friendly
def verify(dataset_arg: str | None, dataset: str, skip_corrupt: bool, key_files: tuple[str, ...]) -> None:
    """Check every record's hash, signature and chain link; names any record edited, deleted or reordered."""
    keys = [k for k in (load_signing_key(key_file=_input_file(f, "key file")) for f in key_files) if k is not None]
    if not key_files:
        default = load_signing_key(create=False)
        keys = [default] if default is not None else []
    with _open(dataset_arg or dataset, skip_corrupt) as store:
        report = store.verify(keys)
    r.print_verify(report, dataset_arg or dataset, bool(keys))
    if not report.ok:
        sys.exit(1)


@main.command()
@click.argument("record_id")
@_dataset_option
@_skip_option
@_friendly
def tree(record_id: str, dataset: str, skip_corrupt: bool) -> None:
    """Print the causal tree of spans under decision RECORD_ID."""
    require_utf8(record_id, "RECORD_ID")
    with _open(dataset, skip_corrupt) as store:
        r.print_tree(store.causal_tree(record_id))


@main.command()
@_dataset_option
@_skip_option
@click.option("--decision-type", help="Only this decision type.")
@_friendly
def calibration(dataset: str, skip_corrupt: bool, decision_type: str | None) -> None:
    """Confidence buckets against outcome correctness."""
    if decision_type is not None:
        require_utf8(decision_type, "--decision-type")
    with _open(dataset, skip_corrupt) as store:
        r.print_rows(store.calibration(decision_type), "calibration")


# server commands are registered here
from otel_replay.rerun.command import rerun_command  # noqa: E402
from otel_replay.server.commands import ingest_command, serve_command  # noqa: E402
from otel_replay.storage.command import compact_command  # noqa: E402

for _name, _command in (
    ("serve", serve_command),
    ("ingest", ingest_command),
    ("compact", compact_command),
    ("rerun", rerun_command),
):
    # the same guard as the commands above: one line for a user error, never a traceback
    if _command.callback is not None:
        _command.callback = _friendly(_command.callback)
    main.add_command(_command, _name)


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
