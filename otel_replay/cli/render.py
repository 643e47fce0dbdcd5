r"""Terminal rendering for the CLI (rich tables and panels). No logic lives here.

Data never reaches the terminal raw: control characters (ANSI/OSC escape
sequences, carriage returns, bidirectional overrides) are shown as backslash escapes
(ESC as \x1b), rich's markup and emoji codes are not applied to data, and
``--format json`` / ``--format csv`` / ``--json`` are the faithful forms.
When stdout is not a terminal, tables are printed at their natural width
instead of being wrapped at 80 columns.
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import io
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from rich.console import Console, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from otel_replay._invisible import INVISIBLE, escape_code
from otel_replay.query.analyst import table_rows

if TYPE_CHECKING:
    from otel_replay.demo import DemoResult
    from otel_replay.gate import GateOutcome
    from otel_replay.gate.policy import Verdict
    from otel_replay.integrity import VerifyReport
    from otel_replay.query.chains import ReplayChain

__all__ = [
    "CELL_WIDTH",
    "clean",
    "jsonable",
    "print_chain",
    "print_demo",
    "print_outcome",
    "print_rows",
    "print_table",
    "print_tree",
    "print_verdict",
    "print_verify",
]

CELL_WIDTH = 60
"""Table cells longer than this are cut (with ``…``); JSON and CSV print every value whole."""
_WIDE = 100_000
_FIX_STYLE = {"ALLOW": "green", "ROLLBACK": "yellow", "BLOCK": "red", "HUMAN_REVIEW": "magenta"}
# The C0 controls, and the characters that draw nothing or mislead (otel_replay._invisible).
_CONTROLS = re.compile(f"[\x00-\x1f{INVISIBLE}]")


def _console() -> Console:
    """A console on the current stdout: terminal width on a terminal, else no wrapping."""
    wide = not sys.stdout.isatty()
    return Console(highlight=False, emoji=False, soft_wrap=False, width=_WIDE if wide else None)


def _print(renderable: RenderableType = "", **kwargs: Any) -> None:
    _console().print(renderable, **kwargs)


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_one(match: re.Match[str]) -> str:
    short = _SHORT.get(match.group())
    if short is not None:
        return short
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else escape_code(code)


def clean(text: str) -> str:
    """``text`` with every control character shown as an escape (backslash-x-1b style)."""
    return _CONTROLS.sub(_escape_one, text)


def first_line(text: str) -> str:
    """The first line of ``text``, control characters escaped (it may quote stored or recorded data)."""
    lines = text.strip().splitlines()
    return clean(lines[0]) if lines else ""


def one_line(exc: BaseException) -> str:
    """``exc`` as a one-line CLI error: its message's first line (``file: reason`` for an OSError), escaped."""
    text = str(exc)
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror}"
    return first_line(text) or type(exc).__name__


def jsonable(value: Any) -> Any:
    """``value`` as strict JSON data: non-finite floats, bytes, times and decimals become strings."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return (
            value if math.isfinite(value) else ("NaN" if math.isnan(value) else repr(value).replace("inf", "Infinity"))
        )
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "base64:" + base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return str(value)


def _json_line(value: Any, indent: int | None = None) -> str:
    return json.dumps(jsonable(value), allow_nan=False, indent=indent)


def _text(value: Any) -> str:
    """One value as plain text (no quotes around strings or times)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(jsonable(value), ensure_ascii=False, allow_nan=False)
    value = jsonable(value)
    return value if isinstance(value, str) else json.dumps(value)


def _cell(value: Any, width: int | None = CELL_WIDTH) -> Text:
    """A table cell: cleaned plain text (never markup), cut at ``width``."""
    text = clean(_text(value))
    if width is not None and len(text) > width:
        text = text[: width - 1] + "…"
    return Text(text)


def _cut(value: Any, width: int = CELL_WIDTH) -> bool:
    return len(clean(_text(value))) > width


def _count(n: int, noun: str) -> str:
    plural = noun[:-1] + "ies" if noun.endswith("y") else noun + "s"
    return f"{n} {noun if n == 1 else plural}"


def _table(
    names: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str | None = None, no_wrap: Sequence[bool] = ()
) -> tuple[Table, bool]:
    table = Table(title=Text(clean(title)) if title else None)
    for i, name in enumerate(names):
        keep = i < len(no_wrap) and no_wrap[i]
        table.add_column(Text(clean(name)), overflow="fold", no_wrap=keep)
    cut = False
    for row in rows:
        cut = cut or any(_cut(v) for v in row)
        table.add_row(*(_cell(v) for v in row))
    return table, cut


def _footer(n: int, noun: str, cut: bool, faithful: str) -> str:
    note = f"; values over {CELL_WIDTH} characters are cut, {faithful} prints them whole" if cut else ""
    return f"[dim]{_count(n, noun)}{escape(note)}[/dim]"


def print_rows(rows: Sequence[Mapping[str, Any]], title: str | None = None) -> None:
    """Print dict rows as a table."""
    if not rows:
        _print(f"[dim]({escape(clean(title)) + ': ' if title else ''}no rows)[/dim]")
        return
    names = list(rows[0])
    table, cut = _table(names, [[row.get(n) for n in names] for row in rows], title=title)
    _print(table)
    if cut:
        _print(_footer(len(rows), "row", cut, "--json"))


def print_table(result: pa.Table, fmt: str) -> None:
    """Print a query result as a table, JSON lines or CSV.

    A repeated column name is printed as ``name_2``, ``name_3`` (every column
    kept). JSON and CSV carry every value whole: timestamps as ISO text with
    every stored digit, infinities as ``infinity``, non-finite floats as
    ``"NaN"`` / ``"Infinity"``, bytes as ``base64:...``.
    """
    names, rows = table_rows(result, exact_times=True)
    if fmt == "json":
        for row in rows:
            sys.stdout.write(_json_line(dict(zip(names, row, strict=True))) + "\n")
    elif fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(names)
        for row in rows:
            writer.writerow([_text(v) for v in row])
        sys.stdout.write(out.getvalue())
    else:
        times = [pa.types.is_timestamp(t) or pa.types.is_date(t) for t in result.schema.types]
        table, cut = _table(names, rows, no_wrap=times)
        _print(table)
        _print(_footer(len(rows), "row", cut, "--format json or csv"))


def _event_summary(event: Mapping[str, Any]) -> tuple[Text, Text, Text, Text, Text]:
    if event["layer"] == "audit":
        who = f"{event.get('source_agent') or ''} → {event.get('target_agent') or '*'}"
        return (Text("audit"), _cell(event.get("event_type")), _cell(who), _cell(event.get("payload"), 100), Text(""))
    detail: Any = event.get("rationale")
    if not detail and event.get("action_type"):
        arguments = _text(event.get("action_arguments"))
        detail = f"{event['action_type']} {arguments} cost={_text(event.get('action_cost'))}"
    correct = event.get("outcome_correct")
    outcome = "" if correct is None else ("correct" if correct else "incorrect")
    if correct is None and str(event.get("outcome_note") or "").startswith("conflicting outcomes"):
        outcome = "conflicting"  # two verified outcomes: neither is shown (the note names them, --json)
    if event.get("from_intent"):  # its process died inside the audit() block: the decision as its intent sealed it
        outcome = f"{outcome}; decision from its commit intent" if outcome else "decision from its commit intent"
    if event.get("unknown_commits"):  # a commit intent with no commit record (--json names the intents)
        outcome = f"{outcome}; executed? unknown - check the rail" if outcome else "executed? unknown - check the rail"
    conf = f" ({event['confidence']:.2f})" if isinstance(event.get("confidence"), (int, float)) else ""
    what = _cell(f"{_text(event.get('decision_type'))}{conf}")
    return Text("decision"), what, _cell(event.get("agent_id")), _cell(detail, 100), Text(outcome)


def print_chain(chain: ReplayChain, as_json: bool = False) -> None:
    """Print a replay chain's merged timeline (``as_json``: the whole chain as JSON)."""
    if as_json:
        sys.stdout.write(_json_line(chain.to_json(), indent=2) + "\n")
        return
    table = Table(title=Text(clean(f"{chain.chain_type} chain {chain.chain_id}")))
    table.add_column("time (UTC)", no_wrap=True)
    for name in ("layer", "what", "who", "detail"):
        table.add_column(name, overflow="fold")
    table.add_column("outcome", no_wrap=True)
    for event in chain.events:
        table.add_row(_cell(event.get("created_at"), None), *_event_summary(event))
    _print(table)
    counts = f"{_count(len(chain.traces), 'decision')}, {_count(len(chain.audit_entries), 'audit entry')}"
    _print(f"[dim]{escape(counts)}[/dim]")
    if chain.truncated:
        layers = " and ".join(chain.truncated_layers)
        _print(
            f"[yellow]truncated:[/yellow] the {escape(layers)} layer had more than {chain.limit} rows; "
            "the newest are left out (raise --limit)"
        )
    if not chain.outcomes_verified:
        _print("[dim]outcomes not shown: no verification key to check them with[/dim]")


def print_verdict(verdict: Verdict) -> None:
    """Print a verdict as a coloured panel."""
    style = _FIX_STYLE.get(verdict.fix.value, "white")
    body = "\n".join(
        [
            f"[bold {style}]{escape(verdict.fix.value)}[/]",
            f"justified: {verdict.justified}",
            f"reason: {escape(clean(verdict.reason))}",
            f"record: {escape(clean(verdict.record_id))}",
        ]
    )
    _print(Panel(body, title="verdict", expand=False))


def print_outcome(outcome: GateOutcome) -> None:
    """Print what the gate executed."""
    body = f"[bold]{escape(clean(outcome.executed))}[/]\n{escape(clean(outcome.detail))}"
    _print(Panel(body, title="gate outcome", expand=False))


_SAME_PROBLEM_SHOWN = 3
"""Records ``verify`` names with one same problem (a wrong key is the same for every record); the rest are counted."""


def print_verify(report: VerifyReport, dataset: str, have_key: bool) -> None:
    """Print a verification report, naming every file that could not be read (and so was not checked)."""
    unsigned = ""
    where = escape(clean(dataset))
    if report.unsigned_checked:
        why = "no signing key given" if not have_key else "no key given for them"
        unsigned = f" ({_count(report.unsigned_checked, 'signature')} not checked: {why})"
    if report.dropped_by_retention:
        cut = _count(report.dropped_by_retention, "chain")
        unsigned += f"; {cut} starting where retention dropped its earlier records (signed checkpoints)"
    if report.voided:
        voided = _count(report.voided, "record")
        unsigned += f"; {voided} sealed, then not kept by its writer and voided in its chain (not deleted)"
    for problem in report.unknown_commits:
        _print(f"[yellow]unknown[/yellow] {escape(clean(str(problem)))}", soft_wrap=True)
    if report.ok:
        _print(
            f"[green]OK[/green] {where}: {_count(report.records, 'record')} in "
            f"{_count(report.chains, 'chain')} verified{unsigned}"
        )
        return
    problems = _count(len(report.problems), "problem")
    unreadable = _count(len(report.unreadable_files), "unreadable file")
    _print(f"[red]FAILED[/red] {where}: {problems} in {report.records} records, {unreadable}")
    shown: dict[str, int] = {}  # problem text -> records printed with it
    for problem in report.problems:
        seen = shown[problem.problem] = shown.get(problem.problem, 0) + 1
        if seen <= _SAME_PROBLEM_SHOWN:
            _print(f"  {escape(clean(str(problem)))}", soft_wrap=True)
    for text, count in shown.items():
        if count > _SAME_PROBLEM_SHOWN:
            more = _count(count - _SAME_PROBLEM_SHOWN, "more record")
            _print(f"  … and {more}: {escape(clean(text))}", soft_wrap=True)
    if any(p.problem.endswith("which is not a verification key") for p in report.problems):
        _print(
            "  hint: verify with the key that signed them: --key-file FILE (repeat it for rotated keys), or "
            "OTEL_REPLAY_SIGNING_KEY / OTEL_REPLAY_KEY_FILE",
            soft_wrap=True,
        )
    for path in report.unreadable_files:
        _print(f"  not checked: {escape(clean(path))} could not be read", soft_wrap=True)


_TREE_DEPTH = 64
"""How deep ``queries/causal_tree.sql`` walks below the decision; a row that deep may have children not shown."""


def print_tree(rows: Sequence[Mapping[str, Any]]) -> None:
    """Print a causal tree, indented by depth; says so when it stopped at its depth limit."""
    cut = False
    for row in rows:
        cut = cut or (row.get("depth") or 0) >= _TREE_DEPTH
        ms = (row.get("duration_ns") or 0) / 1e6
        kind = f" [{row['replay_kind']}]" if row.get("replay_kind") else ""
        span = clean(_text(row["span_id"]))  # stored data like the name: a dropped file may put escapes in it
        line = f"{'  ' * row['depth']}{clean(_text(row['name']))}{clean(kind)} {ms:.3f} ms  span={span}"
        _print(Text(line))
    if cut:
        _print(f"(the causal tree stops {_TREE_DEPTH} levels below the decision: deeper spans, if any, are not shown)")


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
    _print(Panel("\n".join(lines), title="1. captured and committed", expand=False))
    print_chain(result.chain)
    print_verdict(result.verdict)
    print_outcome(result.outcome)
    _print(f"ledger balance after the gate: [bold]{result.balance_after_gate:,.2f}[/]")
    _print(f"rehydrated from Parquet equals the in-process record: [bold]{result.rehydrated_equal}[/]")
    print_verify(result.verify, result.dataset, True)
    _print("\n[bold]Try next[/bold]")
    d = result.dataset
    for line in (
        f'otel-replay sql -d {d} "SELECT decision_type, agent_id, action_cost, created_at FROM decisions"',
        f"otel-replay chain trade {result.correlation_id} -d {d}",
        f"otel-replay tree {record.record_id} -d {d}",
        f"otel-replay replay {record.record_id} -d {d} --live-state {result.live_state_file} "
        "--policy otel_replay.demo:budget_policy",
        f"otel-replay verify {d}",
    ):
        _print(f"  {escape(line)}", soft_wrap=True)
