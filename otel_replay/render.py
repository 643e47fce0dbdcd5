"""Terminal rendering for the CLI (rich tables and panels). No logic lives here."""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

if TYPE_CHECKING:
    from otel_replay.chains import ReplayChain
    from otel_replay.demo import DemoResult
    from otel_replay.gate import GateOutcome
    from otel_replay.integrity import VerifyReport
    from otel_replay.replay import Verdict

__all__ = [
    "print_chain",
    "print_demo",
    "print_outcome",
    "print_rows",
    "print_table",
    "print_tree",
    "print_verdict",
    "print_verify",
]

console = Console(highlight=False, soft_wrap=False)
_FIX_STYLE = {"ALLOW": "green", "ROLLBACK": "yellow", "BLOCK": "red", "HUMAN_REVIEW": "magenta"}


def _cell(value: Any, width: int = 60) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return escape(text if len(text) <= width else text[: width - 1] + "…")


def _count(n: int, noun: str) -> str:
    plural = noun[:-1] + "ies" if noun.endswith("y") else noun + "s"
    return f"{n} {noun if n == 1 else plural}"


def print_rows(rows: Sequence[dict[str, Any]], title: str | None = None) -> None:
    """Print dict rows as a table."""
    if not rows:
        console.print(f"[dim]({title + ': ' if title else ''}no rows)[/dim]")
        return
    table = Table(title=title, show_lines=False)
    for name in rows[0]:
        table.add_column(escape(name), overflow="fold")
    for row in rows:
        table.add_row(*(_cell(v) for v in row.values()))
    console.print(table)


def print_table(result: pa.Table, fmt: str) -> None:
    """Print a query result as a table, JSON lines or CSV."""
    from otel_replay.store import _python_safe

    rows = _python_safe(result).to_pylist()
    if fmt == "json":
        for row in rows:
            sys.stdout.write(json.dumps(row, default=str) + "\n")
    elif fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(result.column_names)
        for row in rows:
            writer.writerow(["" if v is None else v for v in row.values()])
        sys.stdout.write(out.getvalue())
    else:
        print_rows(rows)
        console.print(f"[dim]{_count(len(rows), 'row')}[/dim]")


def _event_summary(event: dict[str, Any]) -> tuple[str, str, str, str]:
    if event["layer"] == "audit":
        who = f"{event.get('source_agent') or ''} → {event.get('target_agent') or '*'}"
        return "audit", _cell(event.get("event_type")), _cell(who), _cell(event.get("payload"), 70)
    detail: Any = event.get("rationale")
    if not detail and event.get("action_type"):
        detail = f"{event['action_type']} {json.dumps(event.get('action_arguments'))} cost={event.get('action_cost')}"
    if event.get("outcome_correct") is not None:
        detail = f"{detail}  [outcome: {'correct' if event['outcome_correct'] else 'incorrect'}]"
    conf = f" ({event['confidence']:.2f})" if event.get("confidence") is not None else ""
    return "decision", _cell(f"{event.get('decision_type')}{conf}"), _cell(event.get("agent_id")), _cell(detail, 70)


def print_chain(chain: ReplayChain, as_json: bool = False) -> None:
    """Print a replay chain's merged timeline."""
    if as_json:
        payload = {
            "chain_type": chain.chain_type,
            "chain_id": chain.chain_id,
            "traces": chain.traces,
            "audit_entries": chain.audit_entries,
        }
        sys.stdout.write(json.dumps(payload, default=str, indent=2) + "\n")
        return
    table = Table(title=escape(f"{chain.chain_type} chain {chain.chain_id}"))
    for name in ("time", "layer", "what", "who", "detail"):
        table.add_column(name, overflow="fold")
    for event in chain.events:
        at = event.get("created_at") or ""
        table.add_row(_cell(str(at)[:26]), *_event_summary(event))
    console.print(table)
    counts = f"{_count(len(chain.traces), 'decision')}, {_count(len(chain.audit_entries), 'audit entry')}"
    console.print(f"[dim]{counts}[/dim]")


def print_verdict(verdict: Verdict) -> None:
    """Print a verdict as a coloured panel."""
    style = _FIX_STYLE.get(verdict.fix.value, "white")
    body = "\n".join([
        f"[bold {style}]{verdict.fix.value}[/]",
        f"justified: {verdict.justified}",
        f"reason: {escape(verdict.reason)}",
        f"record: {escape(verdict.record_id)}",
    ])
    console.print(Panel(body, title="verdict", expand=False))


def print_outcome(outcome: GateOutcome) -> None:
    """Print what the gate executed."""
    console.print(Panel(f"[bold]{outcome.executed}[/]\n{escape(outcome.detail)}", title="gate outcome", expand=False))


def print_verify(report: VerifyReport, dataset: str, have_key: bool) -> None:
    """Print a verification report."""
    unsigned = ""
    if report.unsigned_checked:
        why = "no signing key given" if not have_key else "no key given for them"
        unsigned = f" ({_count(report.unsigned_checked, 'signature')} not checked: {why})"
    if report.ok:
        console.print(
            f"[green]OK[/green] {escape(dataset)}: {_count(report.records, 'record')} in "
            f"{_count(report.chains, 'chain')} verified{unsigned}"
        )
        return
    console.print(f"[red]FAILED[/red] {escape(dataset)}: {len(report.problems)} problem(s) in {report.records} records")
    for problem in report.problems:
        console.print(f"  {escape(str(problem))}", soft_wrap=True)


def print_tree(rows: Sequence[dict[str, Any]]) -> None:
    """Print a causal tree, indented by depth."""
    for row in rows:
        ms = (row.get("duration_ns") or 0) / 1e6
        kind = escape(f" [{row['replay_kind']}]") if row.get("replay_kind") else ""
        console.print(f"{'  ' * row['depth']}{escape(row['name'])}{kind} {ms:.3f} ms  span={row['span_id']}")


def print_demo(result: DemoResult) -> None:
    """Print the demo's story: chain, verdict, gate outcome, integrity, next steps."""
    record = result.record
    action = record.action
    state = dict(record.snapshot.state) if record.snapshot else {}
    lines = [
        f"decision [bold]{escape(record.decision_type)}[/] {record.record_id}",
        escape(f"action: {action.type} {dict(action.arguments)} cost={action.cost}") if action else "action: -",
        escape(f"snapshot {record.snapshot.version if record.snapshot else ''}: {state}"),
        f"ledger balance after commit: {result.balance_after_commit:,.2f}",
    ]
    console.print(Panel("\n".join(lines), title="1. captured and committed", expand=False))
    print_chain(result.chain)
    print_verdict(result.verdict)
    print_outcome(result.outcome)
    console.print(f"ledger balance after the gate: [bold]{result.balance_after_gate:,.2f}[/]")
    console.print(f"rehydrated from Parquet equals the in-process record: [bold]{result.rehydrated_equal}[/]")
    print_verify(result.verify, result.dataset, True)
    console.print("\n[bold]Try next[/bold]")
    d = result.dataset
    for line in (
        f'otel-replay sql -d {d} "SELECT decision_type, agent_id, action_cost, created_at FROM decisions"',
        f"otel-replay chain trade {result.correlation_id} -d {d}",
        f"otel-replay tree {record.record_id} -d {d}",
        f"otel-replay replay {record.record_id} -d {d} --live-state {result.live_state_file} "
        "--policy otel_replay.demo:budget_policy",
        f"otel-replay verify {d}",
    ):
        console.print(f"  {escape(line)}", soft_wrap=True)
