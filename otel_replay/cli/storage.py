"""``otel-replay compact``: the click command over :func:`compact` and :func:`drop_older_than`."""

from __future__ import annotations

import contextlib
import json
import os
import sys

import click
import pyarrow as pa

from otel_replay import settings
from otel_replay.capture.log_recovery import recover as recover_capture_logs
from otel_replay.cli._inputs import friendly
from otel_replay.errors import OtelReplayError, message_line
from otel_replay.integrity import load_signing_key
from otel_replay.location import local_root_problem, resolve
from otel_replay.storage.backend import backend_for
from otel_replay.storage.compact import compact
from otel_replay.storage.compact_steps import DEFAULT_GRACE_SECONDS, DEFAULT_THREADS, MAX_ROWS, CompactReport
from otel_replay.storage.retention import RetentionReport, drop_older_than

__all__ = ["compact_command"]


@click.command("compact")
@click.argument("dataset", required=False)
@click.option("--partition", "partitions", multiple=True, metavar="date=YYYY-MM-DD", help="Only this partition.")
@click.option(
    "--older-than",
    type=click.IntRange(min=0, max=999_999),
    metavar="DAYS",
    help="First drop whole partitions older than DAYS days (UTC dates).",
)
@click.option(
    "--target-rows",
    type=click.IntRange(min=1, max=MAX_ROWS),
    default=131_072,
    show_default=True,
    help="Rows per compacted file.",
)
@click.option(
    "--row-group-rows",
    type=click.IntRange(min=1, max=MAX_ROWS),
    default=16_384,
    show_default=True,
    help="Rows per Parquet row group.",
)
@click.option(
    "--max-batch-rows",
    type=click.IntRange(min=1, max=MAX_ROWS),
    default=1_000_000,
    show_default=True,
    help="Rows held in memory at once (about 1.6 KB each); a bigger partition becomes several sorted runs.",
)
@click.option(
    "--grace",
    "grace_seconds",
    type=click.FloatRange(min=0, max=10**9),
    default=DEFAULT_GRACE_SECONDS,
    show_default=True,
    help="Seconds replaced files stay for readers that listed them (deleted by a later run).",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1, max=256),
    default=DEFAULT_THREADS,
    show_default=True,
    help=(
        "Worker threads writing files, grouping index rows and extracting facts side by side (1: none). "
        "Local datasets: an s3:// dataset is compacted on one thread."
    ),
)
@click.option(
    "--drop-missing",
    is_flag=True,
    help=(
        "Drop compacted files the manifest lists but that are missing (a damaged one moved aside) from the "
        "manifest, naming and counting them (their spans are lost), instead of failing."
    ),
)
@click.option(
    "--older-key-file",
    "older_key_files",
    multiple=True,
    metavar="FILE",
    help=(
        "With --older-than: a key rotated out whose records are still in the dataset (repeatable). Retention "
        "vouches for where it cuts their chains too; checkpoints are signed with the current signing key."
    ),
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@friendly
def compact_command(
    dataset: str | None,
    partitions: tuple[str, ...],
    older_than: int | None,
    target_rows: int,
    row_group_rows: int,
    max_batch_rows: int,
    grace_seconds: float,
    threads: int,
    drop_missing: bool,
    older_key_files: tuple[str, ...],
    as_json: bool,
) -> None:
    """Sort a dataset's small arrival-order files into large indexed files (and drop old partitions).

    DATASET (a directory or s3://bucket/prefix) defaults to $OTEL_REPLAY_DATASET
    or ./traces. Readers see the old
    files or the new ones, never both; exact duplicate spans are removed and
    counted; spans sharing ids with different content are kept.
    """
    if older_key_files and older_than is None:
        raise click.UsageError("--older-key-file applies to retention: give --older-than DAYS too")
    root = settings.dataset_dir(dataset)
    _check_dataset(root)
    say = _Say(quiet=as_json)
    try:
        dropped = None
        if older_than is not None:
            older = [k for k in (load_signing_key(key_file=f) for f in older_key_files) if k is not None]
            dropped = drop_older_than(root, older_than, grace_seconds=grace_seconds, older_keys=older)
            say(_retention_line(dropped, older_than))
        recovered = recover_capture_logs(root)  # gate records a crashed agent left in its write-ahead log
        if recovered:
            say(f"recovered {recovered} span(s) from write-ahead logs left by processes that died")
        report = compact(
            root,
            partitions=_selected(partitions, dropped),
            target_rows=target_rows,
            row_group_rows=row_group_rows,
            max_batch_rows=max_batch_rows,
            grace_seconds=grace_seconds,
            threads=threads,
            drop_missing=drop_missing,
            progress=say,
        )
    except (OtelReplayError, OSError) as exc:
        if settings.env_flag(settings.DEBUG):
            raise
        raise click.ClickException(message_line(exc)) from exc
    if as_json:
        doc = report.to_dict()
        doc["memory_pool"] = pa.default_memory_pool().backend_name  # jemalloc when run as `otel-replay compact`
        if dropped is not None:
            doc["retention"] = vars(dropped)
        click.echo(json.dumps(doc, indent=2))
        return
    _print_report(report, say)
    if say.reader_gone:
        sys.exit(1)  # as every command does when its reader went away: quiet, exit 1


def _check_dataset(root: str) -> None:
    """A one-line error for a bad URI or a local dataset directory that is not there (or not a dataset)."""
    try:
        location = resolve(root)
    except OtelReplayError as exc:
        raise click.ClickException(str(exc)) from exc
    directory = backend_for(location).directory  # an object store is checked when it is opened
    problem = None if directory is None else local_root_problem(root, directory)
    if problem is not None:  # a wrong directory would compact as an empty dataset: "dropped 0", exit 0
        raise click.ClickException(problem)


class _Say:
    """Print one progress line on stdout; nothing with ``--json``, and nothing more once the reader went away."""

    def __init__(self, *, quiet: bool) -> None:
        self.quiet = quiet
        self.reader_gone = False

    def __call__(self, line: str) -> None:
        if self.quiet or self.reader_gone:
            return
        try:
            click.echo(line)
        except BrokenPipeError:  # `compact | head`: stop printing, keep compacting (not caught as an OSError above)
            self.reader_gone = True
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _retention_line(dropped: RetentionReport, older_than: int) -> str:
    """What retention did, on one line."""
    parts = [
        f"retention: dropped {len(dropped.dropped)} partition(s) older than {older_than} days "
        f"({dropped.files} files, {dropped.rows} spans"
        + (f", {dropped.log_rows} log records)" if dropped.log_rows else ")")
    ]
    if dropped.claims_expired:
        parts.append(f"; {dropped.claims_expired} expired claim(s) deleted")
    if dropped.checkpoints:
        parts.append(f"; {dropped.checkpoints} retention checkpoint(s) vouch for {dropped.links} chain cut(s)")
    if dropped.unvouched:
        parts.append(
            f"; {dropped.unvouched} chain cut(s) not vouched for (a record failed its seal or a file "
            "could not be read): verify will report them"
        )
    if dropped.no_key and dropped.dropped:
        parts.append(
            "; no signing key (OTEL_REPLAY_SIGNING_KEY / OTEL_REPLAY_KEY_FILE): no retention checkpoint "
            "written, so verify reports the chains this cut"
        )
    if dropped.busy:
        parts.append(f"; busy, left for later: {', '.join(dropped.busy)}")
    if dropped.not_partitions:
        parts.append(
            f"; {len(dropped.not_partitions)} date= folder(s) that are not dates skipped: "
            + ", ".join(dropped.not_partitions)
        )
    return "".join(parts)


def _selected(partitions: tuple[str, ...], dropped: RetentionReport | None) -> list[str] | None:
    """The ``--partition`` values (``None``: every partition), less those retention just dropped."""
    selected = list(partitions) or None
    if selected and dropped:
        gone = {name.removeprefix("logs/") for name in dropped.dropped}  # spans' date=… and logs/date=…
        selected = [p for p in selected if f"date={p.removeprefix('date=')}" not in gone] or []
    return selected


def _print_report(report: CompactReport, say: _Say) -> None:
    """What compaction did: totals, files dropped from manifests (on stderr), partitions left for later."""
    say(
        f"compacted {sum(p.status == 'compacted' for p in report.partitions)} partition(s): "
        f"{report.input_rows} -> {report.output_rows} spans"
        + (f", {report.log_rows} log records" if report.log_rows else "")
        + f", {report.duplicates_removed} exact duplicates removed, "
        f"{report.conflicting_kept} same-id rows with different content kept, {report.seconds:.2f} s"
    )
    if report.dropped_missing:
        click.echo(
            f"dropped {len(report.dropped_missing)} missing compacted file(s) from their manifests "
            f"(their spans are lost): {', '.join(report.dropped_missing)}",
            err=True,
        )
    if report.busy:
        say(f"busy (another compactor holds the lease), left for later: {', '.join(report.busy)}")
