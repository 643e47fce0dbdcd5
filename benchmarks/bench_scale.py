"""Scale benchmark: generation, compaction and point lookups, against SQLite in the same run.

Usage: python benchmarks/bench_scale.py [--spans 1000000] [--ids 100000] [--workdir DIR] [--keep]
       python benchmarks/bench_scale.py --ten-million        # 10M spans / 1M ids (takes a while)
       python benchmarks/bench_scale.py --dataset DIR [--compacted DIR] --ids N [--skip sqlite,calibration,open]
           # reuse a dataset gen_dataset.py wrote (read only; copied before compacting), or an already
           # compacted copy of it; --skip leaves phases out (sqlite takes ~70 s to load at 10M)

Phases run in child processes so each one's peak RSS is its own:

1. generate N spans across M correlation ids (benchmarks/gen_dataset.py, the
   project's RowBuilder + DatasetWriter, small arrival-order files);
2. copy that dataset and compact the copy (otel_replay.storage.compact);
3. lookups for 20 random ids (median, warm connection; first query per layout
   discarded): the raw rows of one id (``SELECT * ... WHERE correlation_id = ?``)
   and the whole trade chain (queries/chains/trade.sql through the views), over
   (a) the uncompacted files, (b) the compacted files, (c) the compacted files
   narrowed by the side index (files_for); and SQLite (a B-tree index on
   correlation_id) for the raw rows; plus one cold process per layout that
   opens a Store and runs one chain;
   the trade chain's floor: the same SQL over the chain's own rows in a DuckDB
   table (no Parquet), with every optimizer and with those a narrowed lookup
   leaves out, and DuckDB's planning time for the real lookup (bind + optimize,
   as ``Store.run_for`` plans it);
4. calibration over all decisions, uncompacted and compacted;
5. opening a Store over 2,000 small files (cold process), against the
   per-file footer validation Store did before (pyarrow's read_metadata of
   every file), measured in the same run;
6. calibration and the decision scan (``Store.calibration()``,
   ``Store.decision_summary()``: compaction's facts files plus the spans they
   do not cover), each in a child process of its own for its peak RSS,
   against the same figures from the ``decisions`` / ``outcomes`` views
   (results compared) and against SQLite doing the same computation (typed
   columns, duplicate-key check, dedup, first outcome) over a copy of the
   spans with an index on correlation_id, in the same run.

``--calibration DATASET`` runs phase 6 alone on an existing (compacted) dataset.

Figures are printed; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _child(phase: str, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--phase", phase, *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- phases (child processes) ---------------------------------------------------
def phase_generate(dataset: str, spans: int, ids: int) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    from gen_dataset import generate

    figures = generate(Path(dataset), spans=spans, ids=ids, days=max(1, spans // 2_500_000) or 1)
    figures["peak_rss_mb"] = round(_peak_mb())
    return figures


def phase_compact(dataset: str, row_group_rows: int) -> dict[str, Any]:
    from otel_replay.storage import compact

    report = compact(dataset, grace_seconds=0, row_group_rows=row_group_rows)
    return {
        "seconds": round(report.seconds, 2),
        "input_rows": report.input_rows,
        "output_rows": report.output_rows,
        "duplicates_removed": report.duplicates_removed,
        "conflicting_kept": report.conflicting_kept,
        "output_files": sum(p.output_files for p in report.partitions),
        "spans_per_second": round(report.input_rows / report.seconds) if report.seconds else None,
        "peak_rss_mb": round(_peak_mb()),
    }


def phase_cold(dataset: str, chain_id: str, narrowed: str) -> dict[str, Any]:
    started = time.perf_counter()
    from otel_replay.query.store import Store

    imported = time.perf_counter()
    with Store(dataset) as store:
        if narrowed == "yes":  # the side index (what ReplayBuilder and `otel-replay chain` do)
            rows = len(store.run_for("chains/trade", {"correlation_id": chain_id}, chain_id=chain_id, chain_limit=101))
        else:
            rows = len(store.run("chains/trade", chain_id=chain_id, chain_limit=101))
    done = time.perf_counter()
    return {"seconds": round(done - started, 3), "after_import": round(done - imported, 3), "rows": rows}


def phase_open(dataset: str) -> dict[str, Any]:
    import pyarrow.parquet as pq

    from otel_replay.query.store import Store
    from otel_replay.storage import live_files

    started = time.perf_counter()
    with Store(dataset) as store:
        opened = time.perf_counter() - started
        t0 = time.perf_counter()
        store.rows("SELECT count(*) AS n FROM decisions")
        first_query = time.perf_counter() - t0
        files = len(store.files)
    t0 = time.perf_counter()
    for path in live_files(dataset):  # the check Store ran on every file at open before
        pq.read_metadata(path)
    return {
        "files": files,
        "open_seconds": round(opened, 3),
        "first_query_seconds": round(first_query, 3),
        "footer_validation_seconds_before": round(time.perf_counter() - t0, 3),
    }


def make_many_files(source: Path, target: Path, files: int = 2000, rows: int = 100) -> None:
    """``files`` small files of ``rows`` spans each, cut from ``source``'s first file (an exporter's many rolls)."""
    import pyarrow.parquet as pq

    from otel_replay.storage import live_files

    table = pq.ParquetFile(live_files(source)[0]).read()
    folder = target / "spans" / "date=2026-01-01"
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        start = (i * rows) % max(1, table.num_rows - rows)
        pq.write_table(table.slice(start, rows), folder / f"part-{i:06d}-{i:012x}.parquet")


VIEWS_CALIBRATION = """
SELECT least(floor(d.confidence * 10) / 10, 0.9) AS bucket, count(*) AS decisions,
       count(*) FILTER (WHERE o.outcome_correct) AS correct,
       round(avg(CASE WHEN o.outcome_correct THEN 1.0 ELSE 0.0 END), 4) AS accuracy,
       round(avg(d.confidence), 4) AS mean_confidence
FROM decisions d JOIN outcomes o ON o.decision_id = d.record_id
WHERE d.confidence IS NOT NULL GROUP BY bucket ORDER BY bucket
"""
VIEWS_SCAN = "SELECT count(*) AS decisions, round(avg(confidence), 4) AS mean_confidence FROM decisions"

# The same computation in SQLite: the views' typed-or-JSON values, the duplicate-key check,
# one row per (trace_id, span_id), the first outcome of each decision.
_SQLITE_UNAMBIGUOUS = (
    "(attributes IS NULL OR (SELECT count(*) FROM json_each(attributes)) = "
    "(SELECT count(DISTINCT key) FROM json_each(attributes)))"
)
SQLITE_CALIBRATION = f"""
WITH d AS (
    SELECT record_id, coalesce(decision_confidence,
           CAST(json_extract(attributes, '$."replay.decision.confidence"') AS REAL)) AS confidence
    FROM spans WHERE replay_kind = 'decision' AND {_SQLITE_UNAMBIGUOUS}
    GROUP BY trace_id, span_id
), o AS (
    SELECT decision_id, outcome_correct FROM (
        SELECT coalesce(outcome_decision_id, json_extract(attributes, '$."replay.outcome.decision_id"')) AS decision_id,
               coalesce(outcome_correct, json_extract(attributes, '$."replay.outcome.correct"')) AS outcome_correct,
               row_number() OVER (
                   PARTITION BY coalesce(outcome_decision_id,
                                         json_extract(attributes, '$."replay.outcome.decision_id"'))
                   ORDER BY start_ns, span_id) AS n
        FROM spans WHERE replay_kind = 'outcome' AND {_SQLITE_UNAMBIGUOUS})
    WHERE n = 1
)
SELECT min(floor(d.confidence * 10) / 10, 0.9) AS bucket, count(*) AS decisions,
       sum(o.outcome_correct = 1) AS correct,
       round(avg(CASE WHEN o.outcome_correct = 1 THEN 1.0 ELSE 0.0 END), 4) AS accuracy,
       round(avg(d.confidence), 4) AS mean_confidence
FROM d JOIN o ON o.decision_id = d.record_id
WHERE d.confidence IS NOT NULL GROUP BY 1 ORDER BY 1
"""
SQLITE_SCAN = f"""
SELECT count(*), round(avg(confidence), 4) FROM (
    SELECT coalesce(decision_confidence,
           CAST(json_extract(attributes, '$."replay.decision.confidence"') AS REAL)) AS confidence
    FROM spans WHERE replay_kind = 'decision' AND {_SQLITE_UNAMBIGUOUS}
    GROUP BY trace_id, span_id)
"""


def _best_of(fn: Any, times: int = 3) -> tuple[float, Any]:
    samples, result = [], None
    for _ in range(times):
        t0 = time.perf_counter()
        result = fn()
        samples.append(time.perf_counter() - t0)
    return round(min(samples), 3), result


def phase_calibration(dataset: str, how: str) -> dict[str, Any]:
    """One calibration/scan measurement in this (child) process: ``facts`` (the Store) or ``views``."""
    from otel_replay.query.store import Store
    from otel_replay.storage.facts import plan

    started = time.perf_counter()
    with Store(dataset) as store:
        opened = time.perf_counter() - started
        out: dict[str, Any] = {"open_s": round(opened, 3)}
        if how == "facts":
            found = plan(store.files)
            out["facts_files"], out["files_covered"] = len(found.fact_files), len(found.covered)
            out["files"] = len(store.files)
            out["first_calibration_s"], _ = _best_of(store.calibration, 1)
            out["calibration_s"], rows = _best_of(store.calibration)
            out["decision_summary_s"], summary = _best_of(store.decision_summary)
            out["scan"] = [sum(r["decisions"] for r in summary)]
        else:
            out["calibration_s"], rows = _best_of(lambda: store.rows(VIEWS_CALIBRATION), 1)
            out["decisions_scan_s"], scan = _best_of(lambda: store.rows(VIEWS_SCAN), 1)
            out["scan"] = [scan[0]["decisions"]]
    out["rows"] = [[r["bucket"], r["decisions"], r["correct"], r["accuracy"], r["mean_confidence"]] for r in rows]
    out["peak_rss_mb"] = round(_peak_mb())
    return out


_TYPED_COLUMNS = (
    ("trace_id", "TEXT", "trace_id"),
    ("span_id", "TEXT", "span_id"),
    ("start_ns", "INTEGER", "epoch_ns(start_time)"),
    ("correlation_id", "TEXT", "correlation_id"),
    ("record_id", "TEXT", "record_id"),
    ("replay_kind", "TEXT", "replay_kind"),
    ("decision_type", "TEXT", "decision_type"),
    ("outcome_decision_id", "TEXT", "outcome_decision_id"),
    ("outcome_correct", "INTEGER", "outcome_correct"),
    ("decision_confidence", "REAL", "decision_confidence"),
    ("attributes", "TEXT", "attributes"),
)
_LOOKUP_COLUMNS = (
    ("trace_id", "TEXT", "trace_id"),
    ("span_id", "TEXT", "span_id"),
    ("parent_span_id", "TEXT", "parent_span_id"),
    ("name", "TEXT", "name"),
    ("start_ns", "INTEGER", "epoch_ns(start_time)"),
    ("end_ns", "INTEGER", "epoch_ns(end_time)"),
    ("correlation_id", "TEXT", "correlation_id"),
    ("session_id", "TEXT", "session_id"),
    ("agent_id", "TEXT", "agent_id"),
    ("record_id", "TEXT", "record_id"),
    ("replay_kind", "TEXT", "replay_kind"),
    ("decision_type", "TEXT", "decision_type"),
    ("attributes", "TEXT", "attributes"),
)


def _sqlite_copy(
    path: Path, files: list[str], columns: tuple[tuple[str, str, str], ...]
) -> tuple[sqlite3.Connection, float]:
    """A SQLite table ``spans`` of ``columns`` (name, SQLite type, DuckDB expression), indexed on correlation_id."""
    import duckdb

    started = time.perf_counter()
    path.unlink(missing_ok=True)
    db = sqlite3.connect(path)
    db.execute(f"CREATE TABLE spans ({', '.join(f'{name} {kind}' for name, kind, _ in columns)})")
    con = duckdb.connect()
    reader = con.execute(f"SELECT {', '.join(expr for _, _, expr in columns)} FROM read_parquet(?)", [files])
    insert = f"INSERT INTO spans VALUES ({','.join('?' * len(columns))})"
    while True:
        batch = reader.fetchmany(50_000)
        if not batch:
            break
        db.executemany(insert, batch)
    db.execute("CREATE INDEX spans_correlation ON spans (correlation_id)")
    db.commit()
    return db, time.perf_counter() - started


def _sqlite_typed(path: Path, files: list[str]) -> tuple[sqlite3.Connection, float]:
    """SQLite copy of the spans with the typed columns too, indexed on correlation_id (as in ``lookups``)."""
    return _sqlite_copy(path, files, _TYPED_COLUMNS)


def calibration(dataset: Path, workdir: Path, *, views: bool = True) -> dict[str, Any]:
    """Phase 6: the Store (facts) and the views each in a child process, then SQLite here."""
    from otel_replay.storage import live_files

    out: dict[str, Any] = {"load_before": os.getloadavg()[0]}
    out["store"] = _child("calibration", str(dataset), "facts")
    if views:
        out["views"] = _child("calibration", str(dataset), "views")
        out["same_as_views"] = (
            out["store"]["rows"] == out["views"]["rows"] and out["store"]["scan"] == out["views"]["scan"]
        )
    db, load_seconds = _sqlite_typed(workdir / "calibration.sqlite", live_files(dataset))
    out["sqlite_load_s"] = round(load_seconds, 1)
    out["sqlite_calibration_s"], rows = _best_of(lambda: db.execute(SQLITE_CALIBRATION).fetchall(), 1)
    out["sqlite_scan_s"], scan = _best_of(lambda: db.execute(SQLITE_SCAN).fetchall(), 1)
    # SQLite's floor without the duplicate-key check (json_each per row is most of its time): not the same
    # computation, printed so the ratio above is not read as SQLite's scan speed alone
    out["sqlite_calibration_without_key_check_s"], _ = _best_of(
        lambda: db.execute(SQLITE_CALIBRATION.replace(_SQLITE_UNAMBIGUOUS, "1")).fetchall(), 1
    )
    db.close()
    (workdir / "calibration.sqlite").unlink(missing_ok=True)
    out["sqlite_same_rows"] = [list(r) for r in rows] == out["store"]["rows"] and scan[0][0] == out["store"]["scan"][0]
    out["calibration_vs_sqlite"] = round(out["sqlite_calibration_s"] / max(out["store"]["calibration_s"], 1e-9), 1)
    out["scan_vs_sqlite"] = round(out["sqlite_scan_s"] / max(out["store"]["decision_summary_s"], 1e-9), 1)
    out["load_after"] = os.getloadavg()[0]
    for part in ("store", "views"):
        out.get(part, {}).pop("rows", None)
    return out


# --- lookups (parent process) ---------------------------------------------------
def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 3)


def _time(fn: Any, ids: list[str]) -> tuple[float, list[Any]]:
    fn(ids[0])  # warm: metadata caches, connection
    samples, results = [], []
    for cid in ids:
        t0 = time.perf_counter()
        results.append(fn(cid))
        samples.append(time.perf_counter() - t0)
    return _median_ms(samples), results


def _sqlite(path: Path, files: list[str]) -> tuple[sqlite3.Connection, float]:
    return _sqlite_copy(path, files, _LOOKUP_COLUMNS)


def chain_floor(compacted: Path, ids: list[str]) -> dict[str, Any]:
    """What the trade chain costs in DuckDB with no Parquet at all: its SQL over the chain's rows in a table.

    The rows of each id (and every outcome span) are copied into an in-memory
    DuckDB table that stands in for ``span_source``; ``views.sql`` and
    ``chains/trade.sql`` run on it unchanged. Also DuckDB's own profile of
    the real lookup: planning (parse, bind, optimize) against execution.
    """
    import duckdb

    from otel_replay.query.engine import load_sql
    from otel_replay.query.store import Store
    from otel_replay.storage import files_for, live_files

    out: dict[str, Any] = {}
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    every = live_files(compacted)
    con.execute("SET VARIABLE otel_replay_files = ?", [every])
    source = "read_parquet(getvariable('otel_replay_files'), hive_partitioning = true, filename = true)"
    con.execute(f"CREATE TABLE chain_rows AS SELECT * FROM {source} WHERE list_contains(?, correlation_id)", [ids])
    con.execute(  # the chains' outcomes stored under other ids
        f"INSERT INTO chain_rows SELECT * FROM {source} WHERE replay_kind = 'outcome' "
        "AND NOT list_contains(?, coalesce(correlation_id, '')) AND outcome_decision_id IN "
        "(SELECT record_id FROM chain_rows WHERE replay_kind = 'decision')",
        [ids],
    )
    con.execute("CREATE VIEW span_source AS SELECT * FROM chain_rows")
    con.execute("SET VARIABLE otel_replay_legacy_outcomes = false")
    con.execute(load_sql("views"))
    sql = load_sql("chains/trade")

    def over_table(cid: str) -> int:
        con.execute("SET VARIABLE chain_id = ?", [cid])
        con.execute("SET VARIABLE chain_limit = 101")
        return con.execute(sql).to_arrow_table().num_rows

    out["chain_ms_sql_over_a_duckdb_table"], _ = _time(over_table, ids)
    with Store(compacted) as store:
        store.engine._plan_lean(True)  # noqa: SLF001  (the optimizers a narrowed lookup plans with)
        con.execute("SET disabled_optimizers = ?", [store.engine._lean_names or ""])  # noqa: SLF001
        out["chain_ms_sql_over_a_duckdb_table_lean_optimizers"], _ = _time(over_table, ids)
        con.execute("RESET disabled_optimizers")
        planning, total = [], []
        profile = Path(tempfile.mkdtemp()) / "profile.json"
        for cid in ids:
            store.engine._point_at(store.engine._con, files_for(compacted, correlation_id=cid) or [])  # noqa: SLF001
            store.engine._con.execute("SET VARIABLE chain_id = ?", [cid])  # noqa: SLF001
            store.engine._con.execute("SET VARIABLE chain_limit = 101")  # noqa: SLF001
            store.engine._con.execute("PRAGMA enable_profiling = 'json'")  # noqa: SLF001
            store.engine._con.execute("PRAGMA profiling_mode = 'detailed'")  # noqa: SLF001
            store.engine._con.execute("SET profiling_output = ?", [str(profile)])  # noqa: SLF001
            store.engine._execute(sql)  # noqa: SLF001
            store.engine._con.execute("PRAGMA disable_profiling")  # noqa: SLF001
            doc = json.loads(profile.read_text())
            planning.append(
                doc["planner"]["total_time"] + doc["optimizer"]["total_time"] + doc["physical_planner"]["total_time"]
            )
            total.append(doc["query"]["total_time"])
        out["chain_duckdb_planning_ms"] = _median_ms(planning)
        out["chain_duckdb_total_ms"] = _median_ms(total)
    return out


def lookups(
    uncompacted: Path, compacted: Path, ids: list[str], workdir: Path, skip: frozenset[str] = frozenset()
) -> dict[str, Any]:
    import duckdb

    from otel_replay.query.store import Store
    from otel_replay.storage import files_for, live_files

    out: dict[str, Any] = {}
    raw_sql = "SELECT * FROM read_parquet(?, union_by_name = true) WHERE correlation_id = ?"
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    counts: dict[str, list[int]] = {}
    every_uncompacted, every_compacted = live_files(uncompacted), live_files(compacted)
    for label, files_of in (
        ("uncompacted", lambda cid: every_uncompacted),
        ("compacted", lambda cid: every_compacted),
        ("compacted+index", lambda cid: files_for(compacted, correlation_id=cid) or []),
    ):
        for cached in (False, True):  # DuckDB's Parquet footer cache (off by default, and in Store today)
            con.execute(f"SET parquet_metadata_cache = {'true' if cached else 'false'}")
            ms, rows = _time(
                lambda cid, f=files_of: con.sql(raw_sql, params=[f(cid), cid]).to_arrow_table().num_rows, ids
            )
            out[f"raw_rows_ms_{label}{'_footer_cache' if cached else ''}"] = ms
            counts[label] = rows
    narrowed = [len(files_for(compacted, correlation_id=cid) or []) for cid in ids]
    out["files_uncompacted"] = len(live_files(uncompacted))
    out["files_compacted"] = len(live_files(compacted))
    out["files_per_lookup_with_index"] = statistics.median(narrowed)
    t0 = time.perf_counter()
    for cid in ids:
        files_for(compacted, correlation_id=cid)
    out["files_for_ms"] = round((time.perf_counter() - t0) / len(ids) * 1000, 3)

    chains: dict[str, list[Any]] = {}
    for label, path in (("uncompacted", uncompacted), ("compacted", compacted)):
        with Store(path) as store:
            ms, rows = _time(lambda cid, s=store: s.run("chains/trade", chain_id=cid, chain_limit=101), ids)
        out[f"chain_ms_{label}"] = ms
        chains[label] = rows
    with Store(compacted) as store:  # Store.run_for: the files the side index names, plus newer arrivals
        out["chain_ms_compacted+index"], chains["compacted+index"] = _time(
            lambda cid: store.run_for("chains/trade", {"correlation_id": cid}, chain_id=cid, chain_limit=101),
            ids,
        )
        record_ids = [
            next((r["record_id"] for r in store.run_for("chains/trade", {"correlation_id": c}, chain_id=c)), "none")
            for c in ids
        ]
        out["record_ms_compacted"], full = _time(lambda rid: store.run("record", record_id=rid), record_ids)
        out["record_ms_compacted+index"], narrow = _time(
            lambda rid: store.run_for("record", {"record_id": rid}, record_id=rid), record_ids
        )
        out["same_records_with_index"] = full == narrow
    with Store(uncompacted) as store:
        out["record_ms_uncompacted"], _ = _time(lambda rid: store.run("record", record_id=rid), record_ids)

    if "sqlite" not in skip:
        db, load_seconds = _sqlite(workdir / "spans.sqlite", live_files(compacted))
        out["sqlite_load_seconds"] = round(load_seconds, 1)
        ms, rows = _time(
            lambda cid: len(db.execute("SELECT * FROM spans WHERE correlation_id = ?", [cid]).fetchall()), ids
        )
        out["raw_rows_ms_sqlite"] = ms
        counts["sqlite"] = rows
        db.close()
        out["sqlite_size_mb"] = round((workdir / "spans.sqlite").stat().st_size / 1e6, 1)
        (workdir / "spans.sqlite").unlink()
    out["same_rows_everywhere"] = (
        counts["compacted"] == counts["compacted+index"] == counts.get("sqlite", counts["compacted"])
        and chains["uncompacted"] == chains["compacted"] == chains["compacted+index"]  # whole rows, JSON bodies
    )
    out["uncompacted_rows_include_duplicates"] = sum(counts["uncompacted"]) - sum(counts["compacted"])
    out["median_rows_per_id"] = statistics.median(counts["compacted"])
    out["median_chain_rows"] = statistics.median(len(rows) for rows in chains["compacted"])
    out.update(chain_floor(compacted, ids))

    for label, path in (("uncompacted", uncompacted), ("compacted", compacted)):
        if "calibration" in skip:
            break
        with Store(path) as store:
            t0 = time.perf_counter()
            store.calibration()
            out[f"calibration_s_{label}"] = round(time.perf_counter() - t0, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--ids", type=int, default=100_000)
    parser.add_argument("--ten-million", action="store_true", help="10M spans across 1M ids")
    parser.add_argument("--row-group-rows", type=int, default=16_384)
    parser.add_argument("--lookups", type=int, default=20)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the datasets")
    parser.add_argument("--dataset", type=Path, help="an uncompacted dataset gen_dataset.py wrote (not generated)")
    parser.add_argument("--compacted", type=Path, help="with --dataset: its compacted copy (not compacted again)")
    parser.add_argument("--skip", default="", help="phases to leave out: sqlite, calibration, open, cold")
    parser.add_argument("--calibration", type=Path, metavar="DATASET", help="phase 6 alone on an existing dataset")
    parser.add_argument("--no-views", action="store_true", help="with --calibration: skip the views' reference run")
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    parser.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.phase == "generate":
        print(json.dumps(phase_generate(ns.args[0], int(ns.args[1]), int(ns.args[2]))))
        return 0
    if ns.phase == "compact":
        print(json.dumps(phase_compact(ns.args[0], int(ns.args[1]))))
        return 0
    if ns.phase == "open":
        print(json.dumps(phase_open(ns.args[0])))
        return 0
    if ns.phase == "cold":
        print(json.dumps(phase_cold(*ns.args)))
        return 0
    if ns.phase == "calibration":
        print(json.dumps(phase_calibration(*ns.args)))
        return 0
    if ns.calibration is not None:
        scratch = ns.workdir or Path(tempfile.mkdtemp(prefix="otel-replay-calibration-"))
        scratch.mkdir(parents=True, exist_ok=True)
        print(json.dumps(calibration(ns.calibration, scratch, views=not ns.no_views), indent=2))
        return 0
    if ns.ten_million:
        ns.spans, ns.ids = 10_000_000, 1_000_000
    workdir = ns.workdir or Path(tempfile.mkdtemp(prefix="otel-replay-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    skip = frozenset(filter(None, ns.skip.split(",")))
    uncompacted, compacted = workdir / "uncompacted", workdir / "compacted"
    if ns.dataset is not None:
        uncompacted = ns.dataset  # read only: lookups and the cold process only read it
        compacted = ns.compacted or compacted
    for path in {uncompacted, compacted} - {ns.dataset, ns.compacted}:
        shutil.rmtree(path, ignore_errors=True)
    spans = None if ns.dataset is not None else ns.spans  # a given dataset: as gen_dataset.py wrote it
    results: dict[str, Any] = {"spans": spans, "ids": ns.ids, "cpus": os.cpu_count(), "load": os.getloadavg()}
    try:
        if ns.dataset is None:
            print(f"generating {ns.spans:,} spans across {ns.ids:,} correlation ids ...", file=sys.stderr)
            results["generate"] = _child("generate", str(uncompacted), str(ns.spans), str(ns.ids))
        results["size_mb_uncompacted"] = round(_size(uncompacted) / 1e6, 1)
        if ns.compacted is None:
            shutil.copytree(uncompacted, compacted)
            print("compacting ...", file=sys.stderr)
            results["compact"] = _child("compact", str(compacted), str(ns.row_group_rows))
        results["size_mb_compacted"] = round(_size(compacted) / 1e6, 1)
        rng = random.Random(20)
        ids = [f"trade-{rng.randrange(ns.ids):09d}" for _ in range(ns.lookups)]
        print("lookups ...", file=sys.stderr)
        results["lookups"] = lookups(uncompacted, compacted, ids, workdir, skip)
        cold: dict[str, Any] = {}
        for label, path, narrowed in (
            ("uncompacted", uncompacted, "no"),
            ("compacted", compacted, "no"),
            ("compacted+index", compacted, "yes"),
        ):
            if "cold" not in skip:
                cold[label] = _child("cold", str(path), ids[1], narrowed)
        results["cold_process_chain"] = cold
        if "open" not in skip:
            many = workdir / "many-files"
            shutil.rmtree(many, ignore_errors=True)
            make_many_files(uncompacted, many)
            results["open_2000_files"] = _child("open", str(many))
            shutil.rmtree(many, ignore_errors=True)
        if "calibration" not in skip:
            print("calibration ...", file=sys.stderr)
            results["calibration"] = calibration(compacted, workdir)
        results["load_after"] = os.getloadavg()
    finally:
        if not ns.keep and ns.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
