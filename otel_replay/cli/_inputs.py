"""What every command shares: the dataset options, the checks on input files, and the error guard.

Every user error ends in one line on stderr and exit code 1; an unexpected
error (a bug) ends in one line and exit code 3 (:func:`friendly`). Input
files are checked before they are read, so a directory, a device or an
unreadable file is named in that one line, never met as a traceback.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import stat
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click
import duckdb

from otel_replay import settings
from otel_replay._json import strict_loads
from otel_replay.cli import render as r
from otel_replay.errors import OtelReplayError
from otel_replay.gate.policy import load_callable
from otel_replay.integrity import SigningKey, load_signing_key
from otel_replay.location import local_root_problem, resolve
from otel_replay.query import files as query_files
from otel_replay.query.store import Store
from otel_replay.storage.backend import backend_for

__all__ = [
    "INTERNAL_ERROR",
    "LIVE_STATE_MAX_BYTES",
    "dataset_option",
    "friendly",
    "input_file",
    "key_file_keys",
    "no_chain",
    "open_dataset",
    "read_input_file",
    "read_live_state",
    "require_writable",
    "skip_option",
    "user_callable",
]

F = TypeVar("F", bound=Callable[..., Any])

dataset_option = click.option(
    "--dataset",
    "-d",
    default=lambda: settings.dataset_dir(),
    show_default="$OTEL_REPLAY_DATASET or ./traces",
    help="Dataset directory or s3://bucket/prefix.",
)
"""``--dataset`` / ``-d`` of the commands that read a dataset."""
skip_option = click.option("--skip-corrupt", is_flag=True, help="Leave unreadable Parquet files out (and list them).")
"""``--skip-corrupt`` of the commands that read a dataset."""
INTERNAL_ERROR = 3
"""Exit code of an unexpected error (a bug in otel-replay); user errors exit with 1."""
LIVE_STATE_MAX_BYTES = 64 * 1024 * 1024
"""Largest ``--live-state`` file read (a bigger one is refused, never read until memory runs out)."""


class _InternalError(click.ClickException):
    exit_code = INTERNAL_ERROR


def friendly(func: F) -> F:
    """Turn library and OS errors into one clear line and exit code 1."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _refuse_empty_dataset(kwargs)
        try:
            return func(*args, **kwargs)
        except click.ClickException as exc:
            cleaned = _one_line_of(exc)
            if cleaned is None:
                raise
            raise cleaned from exc.__cause__
        except (click.exceptions.Exit, click.Abort):
            raise
        except BrokenPipeError:
            # The reader went away (`otel-replay sql ... | head`): stop quietly.
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        except Exception as exc:
            if _interrupted(exc):
                # Ctrl-C inside a DuckDB query arrives as DuckDB's error, not KeyboardInterrupt: end as click
                # ends a Ctrl-C anywhere else ("Aborted!", exit 1), never as a bug in otel-replay.
                raise click.Abort() from exc
            if settings.env_flag(settings.DEBUG):
                raise
            if isinstance(exc, (OtelReplayError, OSError, ValueError, RecursionError, OverflowError)):
                raise click.ClickException(r.one_line(exc) + _duckdb_hint(exc)) from exc
            raise _InternalError(
                f"internal error: {type(exc).__name__}: {r.one_line(exc)} "
                "(a bug in otel-replay; OTEL_REPLAY_DEBUG=1 shows the traceback)"
            ) from exc

    return wrapper  # type: ignore[return-value]


def _interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) is DuckDB's answer to Ctrl-C.

    DuckDB 2.0 turns a SIGINT that arrives while a query runs into ``RuntimeError("Query
    interrupted")`` (and ``Connection.interrupt()`` into ``InterruptException``).
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, duckdb.InterruptException) or (
            type(current) is RuntimeError and str(current) == "Query interrupted"
        ):
            return True
        current = current.__cause__ or current.__context__
    return False


_DUCKDB_HINTS = ("Did you mean ", "Candidate bindings: ")


def _duckdb_hint(exc: BaseException) -> str:
    """DuckDB's own suggestion behind ``exc`` (``Did you mean "decisions"?``) when its one line left it out.

    DuckDB puts the suggestion for a misspelt table, column or function on the line after its error, and
    errors are cut to their first line on the way here.
    """
    cause = exc.__cause__
    if not isinstance(cause, duckdb.Error):
        return ""
    said = str(exc)
    if "Table with name" in said:  # its guess misses the dataset's views (it offered "pg_description" for "decision")
        return ""
    hints = [line.strip() for line in str(cause).splitlines()[1:] if line.strip().startswith(_DUCKDB_HINTS)]
    return "".join(f" ({r.first_line(hint)})" for hint in hints[:1] if hint not in said)


def no_chain(chain_type: str, chain_id: str, dataset: str) -> str:
    """The error for a chain id nothing was recorded under, with the query that lists the ids there are."""
    column = "session_id" if chain_type == "session" else "correlation_id"
    listing = f'otel-replay sql -d {dataset} "SELECT DISTINCT {column} FROM spans WHERE {column} IS NOT NULL"'
    return f"no {chain_type} chain {chain_id!r} in {dataset}: nothing was recorded under that id (list them: {listing})"


def user_callable(reference: str, what: str) -> Any:
    """The callable ``reference`` (``module:function``) names; ``what`` names the option in errors.

    As :func:`~otel_replay.gate.policy.load_callable`, but a module of the user's that raises
    while it is imported (a ``NameError``, a ``SyntaxError``) is a one-line user error naming
    the module's file and line, not an internal error of otel-replay.
    """
    try:
        return load_callable(reference, what)
    except OtelReplayError:
        raise
    except Exception as exc:
        if settings.env_flag(settings.DEBUG):
            raise
        raise click.ClickException(
            f"{what} {reference!r}: importing its module raised {type(exc).__name__}: {r.one_line(exc)}{_where(exc)}"
        ) from exc


def _where(exc: BaseException) -> str:
    """`` (at FILE:LINE)`` of the innermost frame ``exc`` was raised in; a SyntaxError's message says it already."""
    if isinstance(exc, SyntaxError):
        return ""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _refuse_empty_dataset(options: dict[str, Any]) -> None:
    for name in ("dataset", "dataset_arg"):
        if isinstance(options.get(name), str) and not options[name].strip():  # `-d "$UNSET"`: never the cwd
            raise click.ClickException("the dataset is empty (--dataset ''); give a directory or s3:// URI")


def _one_line_of(exc: click.ClickException) -> click.ClickException | None:
    """``exc`` again with its message cut to one line, controls escaped; ``None`` when it is one already.

    Our own messages may quote data (ids, file names). Only plain errors are
    rebuilt: a subclass (a usage error) may need more than its message.
    """
    lines = exc.message.strip().splitlines()
    cleaned = r.clean(lines[0]) if lines else exc.message
    if cleaned == exc.message or type(exc) not in (click.ClickException, _InternalError):
        return None
    return type(exc)(cleaned)


def input_file(path: str, what: str) -> Path:
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
    """The bytes of input file ``path`` (see :func:`input_file`); more than ``limit`` is a one-line error."""
    with input_file(path, what).open("rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise click.ClickException(f"{what} {path} is larger than {limit // (1024 * 1024)} MiB")
    return data


def read_live_state(path: str) -> dict[str, Any]:
    """The ``--live-state`` file at ``path``: a JSON object, or a one-line error."""
    state = strict_loads(read_input_file(path, "live state file", LIVE_STATE_MAX_BYTES), where=f"live state {path}")
    if not isinstance(state, dict):
        raise click.ClickException(f"{path}: the live state must be a JSON object")
    return state


def key_file_keys(key_files: tuple[str, ...]) -> list[SigningKey]:
    """The keys in the ``--key-file`` files (each checked as an input file first)."""
    return [k for k in (load_signing_key(key_file=input_file(f, "key file")) for f in key_files) if k is not None]


def require_writable(root: Path, why: str) -> None:
    """A one-line error unless spans can be written under dataset ``root`` (``why`` says who needs it)."""
    for directory in (root, root / "spans"):
        if directory.is_dir() and not os.access(directory, os.W_OK | os.X_OK):
            where = "" if directory == root else f" ({directory.name}/)"
            raise click.ClickException(f"dataset {root} is not writable{where}: permission denied; {why}")


@contextlib.contextmanager
def open_dataset(dataset: str, skip_corrupt: bool, **trust: Any) -> Iterator[Store]:
    """Open the dataset; on the way out, name every file left out as corrupt (on stderr)."""
    location = resolve(dataset)  # a bad URI: one ConfigError line naming it
    # An object store: Store checks credentials, endpoint and bucket in one line.
    directory = backend_for(location).directory
    why = None if directory is None else local_root_problem(dataset, directory)
    if why is not None:
        raise click.ClickException(why)
    quiet = _SkipNotices()
    store_log = logging.getLogger(query_files.__name__)  # where the read side says it skips a file
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
