"""The ``otel-replay serve`` and ``otel-replay ingest`` click commands."""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from types import FrameType

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from otel_replay import settings
from otel_replay.cli._inputs import friendly
from otel_replay.cli.render import clean
from otel_replay.errors import ConfigError, OtelReplayError
from otel_replay.location import resolve
from otel_replay.server.config import MiB, ServerConfig, parse_address
from otel_replay.server.ingest import Ingestor, IngestReport
from otel_replay.server.server import Receiver
from otel_replay.storage.backend import backend_for

__all__ = ["ingest_command", "serve_command"]

_MAX_LISTED = 20
DEFAULT_GRPC = "127.0.0.1:4317"
DEFAULT_HTTP = "127.0.0.1:4318"


def _address(value: str) -> str | None:
    return None if value.lower() in ("off", "none", "") else value


def _from_env(name: str, default: str, what: str) -> str:
    """The address in the variable ``name`` (``default`` when unset); a malformed one is refused naming the variable."""
    value = settings.env_text(name, default) or ""
    if _address(value) is not None:
        try:
            parse_address(value, what)
        except ConfigError as exc:
            raise click.ClickException(f"{name}: {exc}") from None
    return value


@click.command("serve")
@click.option(
    "--dataset",
    default=None,
    help=f"Dataset directory or s3://bucket/prefix to write [default: ${settings.DATASET}, "
    f"else {settings.DEFAULT_DATASET}].",
)
@click.option(
    "--wal-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Local directory of this receiver's write-ahead log [default: DATASET/_wal/INSTANCE; "
    "required when DATASET is s3://].",
)
@click.option(
    "--grpc",
    "grpc_addr",
    default=None,
    help=f"OTLP/gRPC HOST:PORT, 'off' to disable [default: ${settings.SERVE_GRPC}, else {DEFAULT_GRPC}].",
)
@click.option(
    "--http",
    "http_addr",
    default=None,
    help=f"OTLP/HTTP HOST:PORT, 'off' to disable [default: ${settings.SERVE_HTTP}, else {DEFAULT_HTTP}].",
)
@click.option(
    "--instance",
    default="default",
    show_default=True,
    help="Name of this receiver (its WAL and file names); unique per dataset.",
)
@click.option(
    "--max-request-mib",
    default=32,
    show_default=True,
    help="Largest request body accepted (413 / RESOURCE_EXHAUSTED above).",
)
@click.option(
    "--max-inflight-mib", default=128, show_default=True, help="Request bytes processed at once before shedding (429)."
)
@click.option(
    "--max-wal-backlog-mib", default=1024, show_default=True, help="Unconverted WAL bytes before shedding (429)."
)
@click.option(
    "--flush-seconds",
    default=5.0,
    show_default=True,
    help="Seal the WAL segment and write Parquet at least this often.",
)
@click.option(
    "--read-timeout",
    default=30.0,
    show_default=True,
    help="Seconds a client has to send a whole HTTP request (slow and idle connections are closed); gRPC "
    "connections are closed at twice this age, cancelling calls still open on them.",
)
@click.option("--max-connections", default=128, show_default=True, help="HTTP connections served at once (503 above).")
@click.option(
    "--convert-workers", default=1, show_default=True, help="Converter processes (0: convert in the server process)."
)
@click.option(
    "--metrics-interval",
    default=0.0,
    type=click.FloatRange(max=settings.MAX_WAIT_SECONDS),
    show_default=True,
    help="Print a metrics line every N seconds (0: only at exit).",
)
@click.option(
    "--compact-every",
    default=0.0,
    show_default=True,
    help="Compact the partitions of past days every N seconds in the background (0: off).",
)
@friendly
def serve_command(
    dataset: str | None,
    wal_dir: str | None,
    grpc_addr: str | None,
    http_addr: str | None,
    instance: str,
    max_request_mib: int,
    max_inflight_mib: int,
    max_wal_backlog_mib: int,
    flush_seconds: float,
    read_timeout: float,
    max_connections: int,
    convert_workers: int,
    metrics_interval: float,
    compact_every: float,
) -> None:
    """Receive OTLP traces over gRPC and HTTP into DATASET; acknowledge only durable spans.

    Flags not given fall back to OTEL_REPLAY_DATASET, OTEL_REPLAY_SERVE_GRPC
    and OTEL_REPLAY_SERVE_HTTP.
    """
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    dataset = settings.dataset_dir(dataset)
    grpc_addr = grpc_addr if grpc_addr is not None else _from_env(settings.SERVE_GRPC, DEFAULT_GRPC, "gRPC")
    http_addr = http_addr if http_addr is not None else _from_env(settings.SERVE_HTTP, DEFAULT_HTTP, "HTTP")
    try:
        config = ServerConfig(
            dataset,
            wal_dir=Path(wal_dir) if wal_dir else None,
            grpc=_address(grpc_addr or ""),
            http=_address(http_addr or ""),
            instance=instance,
            max_request_bytes=max_request_mib * MiB,
            max_inflight_bytes=max_inflight_mib * MiB,
            max_wal_backlog_bytes=max_wal_backlog_mib * MiB,
            flush_seconds=flush_seconds,
            read_timeout_seconds=read_timeout,
            max_connections=max_connections,
            convert_workers=convert_workers,
            compact_every_seconds=compact_every,
        )
        if config.grpc is None and config.http is None:
            raise click.UsageError("both --grpc and --http are off; nothing to serve")
        receiver = Receiver(config)
        receiver.start()
    except OtelReplayError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot serve into {dataset}: {exc.strerror or exc}") from None
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    grpc_at = "{}:{}".format(*receiver.grpc_address) if receiver.grpc_address else "off"
    http_at = "{}:{}".format(*receiver.http_address) if receiver.http_address else "off"
    replay = f", replaying {receiver.recovered_segments} WAL segment(s)" if receiver.recovered_segments else ""
    click.echo(f"otel-replay serve: grpc {grpc_at} http {http_at} dataset {dataset}{replay}")
    while not stop.wait(metrics_interval if metrics_interval > 0 else 3600):
        if metrics_interval > 0:
            click.echo(f"otel-replay serve: {receiver.metrics_line()}")
    click.echo("otel-replay serve: draining")
    receiver.stop()
    click.echo(f"otel-replay serve: stopped; {receiver.metrics_line()}")


def _expand(paths: tuple[str, ...]) -> tuple[list[Path], list[OSError]]:
    """The files to ingest (a directory's, hidden names left out) and the directories that could not be listed."""
    files: list[Path] = []
    unlisted: list[OSError] = []  # Path.rglob would skip an unreadable directory without a word
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = [Path(top, name) for top, _, names in os.walk(path, onerror=unlisted.append) for name in names]
            files.extend(p for p in sorted(found) if p.is_file() and not p.name.startswith("."))
        else:
            files.append(path)
    return files, unlisted


@click.command("ingest")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option(
    "--dataset",
    type=click.Path(file_okay=False),
    help="Dataset directory to write (default $OTEL_REPLAY_DATASET or ./traces).",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@friendly
def ingest_command(paths: tuple[str, ...], dataset: str | None, quiet: bool) -> None:
    """Load Collector file-exporter output (JSON lines or proto, plain, gzip or zstd) and OTLP/JSON files.

    Ingesting the same content twice adds nothing; malformed lines are skipped
    and reported with their line numbers.
    """
    dataset = str(settings.dataset_dir(dataset))
    if backend_for(resolve(dataset)).directory is None:  # its dedup state and flock live in the dataset's directory
        raise click.ClickException(f"ingest writes a local dataset directory, not {dataset}; ingest locally and copy")
    files, unlisted = _expand(paths)
    try:
        ingestor = Ingestor(dataset)
    except OtelReplayError as exc:
        raise click.ClickException(str(exc)) from None
    total = sum(p.stat().st_size for p in files)
    for error in unlisted:
        why = error.strerror or error
        click.echo(clean(f"{error.filename}: cannot ingest: the directory cannot be read: {why}"), err=True)
    reports, unread = _ingest_all(ingestor, files, total, quiet)
    failed = len(unlisted) + unread
    spans = sum(report.spans for report in reports)
    log_records = sum(report.log_records for report in reports)
    problems = sum(_print_report(report) for report in reports)
    for prefix in ingestor.recovered:
        click.echo(f"removed the files of an interrupted ingest ({prefix}-*); their input is read again")
    logs = f" and {log_records} log records" if log_records else ""
    click.echo(clean(f"ingested {spans} spans{logs} from {len(reports)} file(s) into {dataset}"))
    if failed or problems:
        raise click.ClickException(
            f"{problems} file(s) had skipped records or errors and {failed} could not be read; "
            "everything else was ingested"
        )


def _ingest_all(ingestor: Ingestor, files: list[Path], total: int, quiet: bool) -> tuple[list[IngestReport], int]:
    """Ingest ``files`` (``total`` bytes) under a progress bar on stderr: their reports, and how many failed."""
    console = Console(stderr=True)
    failed = 0
    reports = []
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True, disable=quiet) as progress:
        task = progress.add_task("ingesting", total=total)
        for path in files:
            progress.update(task, description=f"ingesting {escape(clean(path.name))}")
            try:
                reports.append(ingestor.ingest(path, lambda n: progress.advance(task, n)))
            except (OSError, OtelReplayError) as exc:  # unreadable input, or a dataset that cannot be written
                failed += 1
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                click.echo(clean(f"{path}: cannot ingest: {reason}"), err=True)
    return reports, failed


def _print_report(report: IngestReport) -> bool:
    """Print what ingesting one file did; whether it had a problem (skipped records or an error)."""
    # file names and reasons are data (a name may hold a newline or a terminal escape): escaped
    if report.status == "skipped":
        click.echo(clean(f"{report.path}: skipped, {report.message}"))
        return False
    if report.status == "failed":
        click.echo(clean(f"{report.path}: error: {report.error}"), err=True)
        return True
    resumed = f" (new content from byte {report.start_offset})" if report.start_offset else ""
    bad = f", {len(report.malformed)} malformed record(s) skipped" if report.malformed else ""
    logs = f", {report.log_records} log records" if report.log_records else ""
    click.echo(clean(f"{report.path}: {report.spans} spans{logs}{resumed}{bad}"))
    if report.message:
        click.echo(clean(f"  {report.path}: {report.message}"))
    if report.error:
        click.echo(clean(f"  {report.path}: error: {report.error}"), err=True)
    for where, reason in report.malformed[:_MAX_LISTED]:
        click.echo(clean(f"  {report.path}:{where}: {reason}"), err=True)
    if len(report.malformed) > _MAX_LISTED:
        click.echo(f"  ... and {len(report.malformed) - _MAX_LISTED} more", err=True)
    hint = _not_otlp(report)
    if hint:
        click.echo(clean(f"  {report.path}: {hint}"), err=True)
    return not report.clean


def _not_otlp(report: IngestReport) -> str:
    """What a file that gave nothing probably is, for the usual wrong inputs; ``""`` when it gave something."""
    if report.spans or report.log_records or report.start_offset:
        return ""
    path = Path(report.path)
    try:
        with path.open("rb") as handle:
            head = handle.read(4)
    except OSError:
        return ""
    if head == b"PAR1":
        return (
            "a Parquet file: ingest reads Collector file-exporter output and OTLP/JSON; a dataset's Parquet "
            "files are copied into spans/date=YYYY-MM-DD/ instead"
        )
    if head and not report.malformed:
        return "no spans or log records in it (no resourceSpans or resourceLogs): is it OTLP?"
    return ""
