"""Generate a synthetic trading dataset in otel-replay's own format and layout.

Usage: python benchmarks/gen_dataset.py DIR [--spans 1000000] [--ids 100000] [--days 4]
           [--rows-per-file 5000] [--duplicates 0.001] [--seed 7]

Each correlation id is one trade chain laid out like the examples' trading
agents: signal, evaluation, sizing and execution decisions with the audit
entries between them, a read, a model call, an act, and an outcome recorded
hours later. Spans go through the project's own row builder
(otel_replay.exporters.rows.RowBuilder) and DatasetWriter, in batches of
roughly arrival order (chains in start order, each batch sorted by start
time), so files are small, time-ordered and mix many ids, as an exporter
writes them. ``--duplicates`` re-sends that fraction of spans in a later batch,
as an OTLP client retry would. Records are not sealed (no hash or signature):
chain and scan queries read them, ``Store.record`` would refuse them.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from otel_replay import semconv as sc
from otel_replay.exporters.rows import RowBuilder
from otel_replay.exporters.writer import DatasetWriter

_BASE_NS = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z
_SECOND = 10**9
_AGENTS = ("signal-agent", "evaluation-agent", "sizing-agent", "execution-agent")
_SYMBOLS = ("AAPL", "MSFT", "NVDA", "TSLA", "AMZN", "GOOG", "META", "AMD")
_RESOURCE = (None, '{"service.name":"trader"}')


def _hex(rng: random.Random, bits: int) -> str:
    return f"{rng.getrandbits(bits):0{bits // 4}x}"


def _iso(ns: int) -> str:
    secs, frac = divmod(ns, _SECOND)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{frac // 1000:06d}+00:00"


def _chain(rng: random.Random, index: int, start_ns: int, spans: int) -> list[dict[str, Any]]:
    """The spans of one trade chain (``spans`` of them) as RowBuilder keyword dicts."""
    cid = f"trade-{index:09d}"
    session = f"session-{index // 10:08d}"
    trace_id = _hex(rng, 128)
    root = _hex(rng, 64)
    symbol = rng.choice(_SYMBOLS)
    t = start_ns
    out: list[dict[str, Any]] = []
    decisions: list[str] = []

    def span(name: str, kind: str | None, agent: str, attrs: dict[str, Any], *, at: int | None = None) -> None:
        nonlocal t
        begin = at if at is not None else t
        if at is None:
            t += rng.randint(100, 300_000) * 1_000_000  # 0.1 s to 5 min between steps
        attributes = {sc.CORRELATION_ID: cid, sc.SESSION_ID: session, sc.AGENT_ID: agent, **attrs}
        if kind is not None:
            attributes[sc.KIND] = kind
            attributes[sc.RECORD_ID] = _hex(rng, 128)
        out.append(
            {
                "trace_id": trace_id,
                "span_id": root if not out else _hex(rng, 64),
                "parent_span_id": None if not out else root,
                "trace_state": None,
                "name": name,
                "kind": "INTERNAL",
                "resource": _RESOURCE,
                "scope": ("otel_replay", "0.1"),
                "start": begin,
                "end": begin + rng.randint(1, 50) * 1_000_000,
                "status": ("UNSET", None),
                "attributes": attributes,
                "events": [],
                "links": [],
                "dropped": (0, 0, 0),
            }
        )

    def entry(source: str, target: str, event: str) -> None:
        payload = json.dumps({"symbol": symbol, "qty": rng.randint(1, 500), "px": round(rng.uniform(10, 900), 2)})
        span(
            sc.SPAN_AUDIT_ENTRY,
            sc.KIND_AUDIT_ENTRY,
            source,
            {
                sc.RECORD_SOURCE: "audit_log",
                sc.AUDIT_EVENT_TYPE: event,
                sc.AUDIT_SOURCE_AGENT: source,
                sc.AUDIT_TARGET_AGENT: target,
                sc.AUDIT_CREATED_AT: _iso(t),
                sc.AUDIT_PAYLOAD: payload,
            },
        )

    def decision(agent: str, dtype: str, **extra: Any) -> None:
        attrs = {
            sc.RECORD_SOURCE: "audit",
            sc.DECISION_TYPE: dtype,
            sc.DECISION_RATIONALE: f"{dtype} for {symbol}: momentum {rng.uniform(-3, 3):.3f}",
            sc.DECISION_CONFIDENCE: round(rng.random(), 4),
            sc.DECISION_INPUTS: json.dumps({"symbol": symbol, "window": rng.choice((5, 15, 60))}),
            sc.SNAPSHOT_STATE: json.dumps({"cash": rng.randint(1_000, 1_000_000), "positions": rng.randint(0, 40)}),
            sc.SNAPSHOT_VERSION: "v1",
            sc.SNAPSHOT_CAPTURED_AT: _iso(t),
            sc.DECISION_MODELS: '["gpt-4o-mini"]',
            **extra,
        }
        span(sc.SPAN_DECISION, sc.KIND_DECISION, agent, attrs)
        decisions.append(out[-1]["attributes"][sc.RECORD_ID])

    steps = [
        lambda: entry("market-feed", _AGENTS[0], "signal"),
        lambda: decision(_AGENTS[1], "evaluation"),
        lambda: span(sc.SPAN_READ, sc.KIND_READ, _AGENTS[1], {sc.READ_INPUTS: json.dumps({"quote": symbol})}),
        lambda: span(
            "chat gpt-4o-mini",
            sc.KIND_MODEL,
            _AGENTS[1],
            {
                sc.GEN_AI_OPERATION_NAME: "chat",
                sc.GEN_AI_REQUEST_MODEL: "gpt-4o-mini",
                sc.GEN_AI_PROVIDER_NAME: "openai",
            },
        ),
        lambda: entry(_AGENTS[1], _AGENTS[2], "evaluated"),
        lambda: decision(_AGENTS[2], "sizing"),
        lambda: entry(_AGENTS[2], _AGENTS[3], "sized"),
        lambda: decision(
            _AGENTS[3],
            "execution",
            **{
                sc.ACTION_TYPE: "place_order",
                sc.ACTION_ARGUMENTS: json.dumps({"symbol": symbol, "side": rng.choice(("buy", "sell"))}),
                sc.ACTION_COST: round(rng.uniform(100, 50_000), 2),
            },
        ),
        lambda: span(sc.SPAN_ACT, sc.KIND_ACT, _AGENTS[3], {sc.ACTION_TYPE: "place_order"}),
    ]
    for i in range(max(0, spans - 1)):
        steps[i % len(steps)]()
    if spans >= 1:
        later = t + rng.randint(3600, 6 * 3600) * _SECOND
        span(
            sc.SPAN_OUTCOME,
            sc.KIND_OUTCOME,
            "settlement",
            {
                sc.RECORD_SOURCE: "audit",
                sc.OUTCOME_DECISION_ID: decisions[-1] if decisions else "none",
                sc.OUTCOME_CORRECT: rng.random() < 0.6,
                sc.OUTCOME_NOTE: "pnl settled",
            },
            at=later,
        )
    return out


def generate(
    dataset: Path,
    *,
    spans: int,
    ids: int,
    days: int = 4,
    rows_per_file: int = 5000,
    duplicates: float = 0.001,
    seed: int = 7,
    chunk_ids: int = 2000,
) -> dict[str, Any]:
    """Write the dataset; returns the figures (spans written, duplicates, files, seconds)."""
    rng = random.Random(seed)
    per_id, extra = divmod(spans, ids)
    span_ns = days * 86_400 * _SECOND // max(1, ids)
    writer = DatasetWriter(dataset, max_rows=rows_per_file, max_age_seconds=86_400)
    started = time.perf_counter()
    written = dup_count = 0
    retry: list[dict[str, Any]] = []
    try:
        for first in range(0, ids, chunk_ids):
            batch: list[dict[str, Any]] = []
            for index in range(first, min(ids, first + chunk_ids)):
                count = per_id + (1 if index < extra else 0)
                batch.extend(_chain(rng, index, _BASE_NS + index * span_ns, count))
            batch.sort(key=lambda s: s["start"])
            resend = [s for s in batch if rng.random() < duplicates]
            for start in range(0, len(batch), rows_per_file):
                builder = RowBuilder()
                part = batch[start : start + rows_per_file] + retry
                retry = []
                for kwargs in part:
                    builder.add(**{**kwargs, "attributes": dict(kwargs["attributes"])})
                writer.append(builder.table())
                writer.flush()  # one file per batch, written now: the writer never has a backlog to drop
                written += len(part)
            retry = resend
            dup_count += len(resend)
        if retry:
            builder = RowBuilder()
            for kwargs in retry:
                builder.add(**{**kwargs, "attributes": dict(kwargs["attributes"])})
            writer.append(builder.table())
            written += len(retry)
    finally:
        writer.close()
    if writer.stats.rows_dropped:
        raise RuntimeError(f"the writer dropped {writer.stats.rows_dropped} spans")
    seconds = time.perf_counter() - started
    return {
        "spans_written": written,
        "unique_spans": written - dup_count,
        "duplicates_written": dup_count,
        "correlation_ids": ids,
        "files": writer.stats.files_written,
        "seconds": round(seconds, 2),
        "spans_per_second": round(written / seconds) if seconds else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--ids", type=int, default=100_000)
    parser.add_argument("--days", type=int, default=4)
    parser.add_argument("--rows-per-file", type=int, default=5000)
    parser.add_argument("--duplicates", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    if args.spans < 1 or args.ids < 1 or args.ids > args.spans or args.days < 1 or args.rows_per_file < 1:
        parser.error("need spans >= ids >= 1, days >= 1, rows-per-file >= 1")
    if not 0 <= args.duplicates < 1:
        parser.error("--duplicates is a fraction in [0, 1)")
    if args.dataset.exists() and any(args.dataset.iterdir()):
        parser.error(f"{args.dataset} exists and is not empty")
    figures = generate(
        args.dataset,
        spans=args.spans,
        ids=args.ids,
        days=args.days,
        rows_per_file=args.rows_per_file,
        duplicates=args.duplicates,
        seed=args.seed,
    )
    json.dump(figures, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
