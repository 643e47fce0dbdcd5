"""The commands that read a dataset: ``sql``, ``chain``, ``tree``, ``calibration`` and ``verify``."""

from __future__ import annotations

import difflib
import re
import sys

import click
from click.core import ParameterSource

from otel_replay.cli import render as r
from otel_replay.cli._inputs import (
    dataset_option,
    friendly,
    input_file,
    key_file_keys,
    no_chain,
    open_dataset,
    skip_option,
)
from otel_replay.errors import QueryError
from otel_replay.integrity import load_signing_key
from otel_replay.query.analyst import require_utf8
from otel_replay.query.chains import CHAIN_TYPES, ReplayBuilder
from otel_replay.query.store import Store

__all__ = ["calibration", "chain", "sql", "tree", "verify"]


@click.command("sql")
@click.argument("query")
@dataset_option
@skip_option
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True)
@friendly
def sql(query: str, dataset: str, skip_corrupt: bool, fmt: str) -> None:
    """Run QUERY (SQL text, or a path to a .sql file) read-only against the dataset's views.

    Only queries run (SELECT, WITH, VALUES, FROM, DESCRIBE, SHOW, SUMMARIZE,
    EXPLAIN); they read the dataset's Parquet files and nothing else. The
    table cuts long values; --format json or csv prints every value whole.
    """
    if query.endswith(".sql") and not any(c.isspace() for c in query):
        try:
            query = input_file(query, "SQL file").read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            bad = f"byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"
            raise click.ClickException(f"SQL file {query} is not valid UTF-8 ({bad})") from None
    else:
        require_utf8(query, "QUERY")
    with open_dataset(dataset, skip_corrupt) as store:
        try:
            result = store.query(query)
        except QueryError as exc:
            missing = re.search(r"Table with name (\S+) does not exist", str(exc))
            if missing is None:
                raise
            raise click.ClickException(f"{r.one_line(exc)} ({_views_like(store, missing.group(1))})") from exc
        r.print_table(result, fmt)


def _views_like(store: Store, name: str) -> str:
    """The dataset's views closest to the misspelt ``name``, or all of them (DuckDB's own guess misses them)."""
    views = sorted(str(row["name"]) for row in store.rows("SHOW TABLES") if not str(row["name"]).startswith("otel_"))
    close = difflib.get_close_matches(name.lower(), views, n=3, cutoff=0.6)
    if close:
        return "did you mean " + ", ".join(close) + "?"
    return "the views are " + ", ".join(views)


@click.command("chain")
@click.argument("chain_type", type=click.Choice(CHAIN_TYPES))
@click.argument("chain_id")
@dataset_option
@skip_option
@click.option(
    "--limit",
    type=click.IntRange(min=1, max=2**31 - 1),
    help="Rows per layer (default 100; 500 for directive/incident).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the chain as JSON.")
@friendly
def chain(chain_type: str, chain_id: str, dataset: str, skip_corrupt: bool, limit: int | None, as_json: bool) -> None:
    """Rebuild the CHAIN_TYPE chain for CHAIN_ID (a correlation, session, directive or incident id)."""
    require_utf8(chain_id, "CHAIN_ID")  # DuckDB refuses it with a conversion error that names nothing
    with open_dataset(dataset, skip_corrupt) as store:
        result = ReplayBuilder(store).build(chain_type, chain_id, limit)
    if result.empty:
        raise click.ClickException(no_chain(chain_type, chain_id, dataset))
    r.print_chain(result, as_json)


@click.command("verify")
@click.argument("dataset_arg", required=False, metavar="[DATASET]")
@dataset_option
@skip_option
@click.option(
    "--key-file",
    "key_files",
    multiple=True,
    help=(
        "Signing key file; repeat for rotated keys (default: the signing key, from $OTEL_REPLAY_SIGNING_KEY, "
        "$OTEL_REPLAY_KEY_FILE or ~/.config/otel-replay/signing.key; without one, signatures are not checked)."
    ),
)
@friendly
def verify(dataset_arg: str | None, dataset: str, skip_corrupt: bool, key_files: tuple[str, ...]) -> None:
    """Check every record's hash, signature and chain link; names any record edited, deleted or reordered."""
    given = click.get_current_context().get_parameter_source("dataset") is ParameterSource.COMMANDLINE
    if dataset_arg is not None and given and dataset_arg != dataset:
        # Which one was meant? Verifying the other one and printing "OK" would answer a question not asked.
        raise click.UsageError(f"two datasets given, DATASET {dataset_arg} and --dataset {dataset}: give one")
    keys = key_file_keys(key_files)
    if not key_files:
        default = load_signing_key(create=False)
        keys = [default] if default is not None else []
    with open_dataset(dataset_arg or dataset, skip_corrupt) as store:
        report = store.verify(keys)
    r.print_verify(report, dataset_arg or dataset, bool(keys))
    if not report.ok:
        sys.exit(1)


@click.command("tree")
@click.argument("record_id")
@dataset_option
@skip_option
@friendly
def tree(record_id: str, dataset: str, skip_corrupt: bool) -> None:
    """Print the causal tree of spans under decision RECORD_ID."""
    require_utf8(record_id, "RECORD_ID")
    with open_dataset(dataset, skip_corrupt) as store:
        r.print_tree(store.causal_tree(record_id))


@click.command("calibration")
@dataset_option
@skip_option
@click.option("--decision-type", help="Only this decision type.")
@friendly
def calibration(dataset: str, skip_corrupt: bool, decision_type: str | None) -> None:
    """Confidence buckets against outcome correctness."""
    if decision_type is not None:
        require_utf8(decision_type, "--decision-type")
    with open_dataset(dataset, skip_corrupt) as store:
        r.print_rows(store.calibration(decision_type), "calibration")
