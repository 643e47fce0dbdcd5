"""``otel-replay ui``: browse a dataset's post-mortem pages in a browser, served read-only on loopback."""

from __future__ import annotations

import ipaddress

import click

from otel_replay.cli._inputs import dataset_option, friendly, open_dataset, skip_option
from otel_replay.contracts.loader import load_contracts
from otel_replay.report.server import LOOPBACK, make_server

__all__ = ["ui_command"]


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command("ui")
@dataset_option
@skip_option
@click.option(
    "--host", default=LOOPBACK, show_default=True, help="Address to bind (another than loopback is said loudly)."
)
@click.option(
    "--port", type=click.IntRange(min=0, max=65535), default=8765, show_default=True, help="Port (0: a free one)."
)
@click.option(
    "--contracts", "contracts_dir", help="A contracts directory: the index links to the sessions' backtest under it."
)
@friendly
def ui_command(dataset: str, skip_corrupt: bool, host: str, port: int, contracts_dir: str | None) -> None:
    """Serve the dataset's chains, decisions and reruns as pages (read-only, GET only) until Ctrl-C.

    An index of recent decisions, chains and recorded sessions with their
    reruns, a search box for an id, and each page linking to the next. Only
    the shipped queries run. With --contracts, a "contracts" entry shows what
    `contracts check` would report, per session.
    """
    contracts = load_contracts(contracts_dir) if contracts_dir is not None else None
    if not _loopback(host):
        click.secho(
            f"WARNING: serving on {host}, not loopback: anyone who can reach this address can read the dataset "
            "(there is no login)",
            err=True,
            fg="red",
            bold=True,
        )
    with open_dataset(dataset, skip_corrupt) as store:
        try:
            server = make_server(store, host, port, contracts=contracts)
        except OSError as exc:
            raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        with server:
            click.echo(f"serving {dataset} at {server.url} (read-only; Ctrl-C stops)", err=False)
            try:
                server.serve_forever()
            except KeyboardInterrupt:
                click.echo("stopped", err=True)
