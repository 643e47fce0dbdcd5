"""Gated commits through the real write path: ``configure()`` + ``audit()`` + ``ActionGate.commit()``.

Run: python benchmarks/bench_gated.py [--trades N] [--threads N] [--rounds N] [--dir PATH] [--base REF]

A trade is one ``audit()`` block with a read, a model call and an act; the
gated trade also commits its action through ``ActionGate.commit()`` on an
in-process rail (:class:`otel_replay.ReferenceLedger`) inside the block, as
``demo.py`` does. Each round writes a fresh dataset through
:func:`otel_replay.configure` and shuts it down; the best of ``--rounds`` is
kept (wall time: the fastest round; CPU: the least any round spent), ungated
and gated run alternately in the same process. Shown per
variant: ms per trade (and, on one thread, the CPU of the agent's thread per
trade and the CPU of the whole process per trade: the exporter's and the
log converter's threads and the shutdown included), the gated / ungated ratio, commits per second (single thread and
``--threads`` threads) and the Parquet files the round left in the dataset
(after shutdown: everything is there). On one thread a third variant runs
in turn with them: gated, with a no-op span processor of the user's added,
so the gate's records are made as SDK spans, the way every gate record was
made before they were built directly (see
:mod:`otel_replay.capture.direct_spans`). Then, as peers: ``gate.commit()``
alone (no ``audit()`` block: an intent and a commit record per commit, each
fsynced) on ``--threads`` threads, and the write-ahead log alone. ``--dir``
puts the datasets elsewhere (``/dev/shm``: fsyncs cost nothing, which leaves
the CPU of a gated trade). ``--base REF`` measures the code at git ``REF``
(say ``s5-start``) in the same run: each round runs in a child process, this
code and ``REF``'s alternately (``REF`` extracted with ``git archive`` into a
temporary directory; or, when ``REF`` is a directory holding an ``otel_replay``
package, that one); the peers are then left out.

``--processes 1,2,4`` then runs the ``--threads`` gated threads split over
that many processes at once, all on one dataset (each process its own
``configure()``, so its own write-ahead log), started together: durable
commits/s of all of them, each count in turn in the same run (what agents in
several processes reach where one interpreter's GIL binds).

``--split`` instead shows where a trade's CPU goes, on one thread, gated and
ungated alternately (``--rounds`` each): the agent thread's CPU by stage
(``time.thread_time()`` brackets around the named functions, inclusive, so
nested stages overlap; the brackets add their own cost, shown as the bracketed
trade against an unbracketed round), the cyclic GC's share on the agent
thread (``gc.callbacks``), and the process's CPU by thread (Linux
``/proc/self/task``: the agent, the log's converter, the exporter, the
shutdown's conversion).

Prints figures; asserts nothing. Targets (issue 20): a gated trade <= 2x an
ungated one single-threaded; 8 threads >= 5,000 durable commits/s; <= 10
Parquet files for 2,000 gated trades with default settings.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from opentelemetry.sdk.trace import SpanProcessor

os.environ.setdefault("OTEL_REPLAY_SIGNING_KEY", "benchmark-signing-key-0123456789")

import otel_replay  # noqa: E402
from otel_replay import Action, ActionGate, DependencySnapshot, ReferenceLedger, audit  # noqa: E402

STATE = {"budget_remaining": 10_000, "allow_list": ["acme-supplies", "globex"], "policy_id": "ap-7"}
ARGS = {"recipient": "acme-supplies", "invoice": "INV-4471"}


def trades(n: int, gate: ActionGate | None, offset: int = 0) -> None:
    """``n`` audited trades (read, model, act), each committed through ``gate`` when one is given."""
    snapshot = DependencySnapshot(STATE, version="v7")
    for i in range(offset, offset + n):
        with audit("vendor_payment", snapshot=snapshot, correlation_id=f"c-{i % 97}", agent_id="ap") as d:
            d.read(invoice=f"INV-{i}")
            d.model("gpt-x", decision_basis="PO match", output={"pay": True})
            action = Action("vendor_payment", ARGS, cost=1.0)
            d.act(action)
            if gate is not None:
                gate.commit(action, record_id=d.record_id)


WHERE: str | None = None  # --dir: where datasets and logs go (None: the system's temporary directory)


class _UsersProcessor(SpanProcessor):
    """A span processor of the user's that does nothing: with it, a gate record's span goes through the SDK."""


def round_(n: int, threads: int, gated: bool, through_sdk: bool = False) -> dict[str, float]:
    """One round on a fresh dataset: wall (and, on 1 thread, CPU) seconds of the trades alone, then the files left.

    ``through_sdk``: a span processor of the user's is added, so the gate's records are made as SDK spans (the
    path every gate record took before they were built directly).
    """
    with tempfile.TemporaryDirectory(dir=WHERE) as tmp:
        telemetry = otel_replay.configure(tmp, set_global=False)
        if through_sdk:
            telemetry.provider.add_span_processor(_UsersProcessor())
        gate = ActionGate(ReferenceLedger(balance=10.0 * n), dataset=tmp) if gated else None
        gc.collect()
        start = time.perf_counter()
        cpu = time.thread_time()
        process_cpu = time.process_time()
        if threads == 1:
            trades(n, gate)
        else:
            per = n // threads
            workers = [threading.Thread(target=trades, args=(per, gate, t * per)) for t in range(threads)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            n = per * threads
        wall = time.perf_counter() - start
        cpu = time.thread_time() - cpu  # the agent thread's own CPU (on 8 threads: the main thread's, meaningless)
        shut = time.perf_counter()
        telemetry.shutdown()
        shutdown = time.perf_counter() - shut
        process_cpu = time.process_time() - process_cpu  # every thread's, the shutdown's conversion included
        files = list(Path(tmp, "spans").rglob("*.parquet"))
        errors = telemetry.recorder.stats.capture_errors if telemetry.recorder is not None else -1
        return {
            "n": n,
            "wall": wall,
            "cpu": cpu,
            "process_cpu": process_cpu,
            "shutdown": shutdown,
            "files": len(files),
            "capture_errors": errors,
        }


VARIANTS = {"ungated": (False, False), "gated": (True, False), "gated, SDK spans": (True, True)}


def _best_of(found: list[dict[str, float]]) -> dict[str, float]:
    """The fastest round's figures, with the least CPU of any round (agent thread, process) in its CPU columns.

    On a machine shared with other work a round's wall time and its CPU move apart: the fastest round is not
    always the one that spent the least CPU, and the least of each is the figure nearest the code's own cost.
    """
    kept = dict(min(found, key=lambda r: r["wall"]))
    kept["cpu"] = min(r["cpu"] for r in found)
    kept["process_cpu"] = min(r["process_cpu"] for r in found)
    return kept


def best(n: int, threads: int, rounds: int, names: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """The variants ``names`` (of :data:`VARIANTS`) alternately, ``rounds`` times; the fastest round of each."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            gated, through_sdk = VARIANTS[name]
            runs[name].append(round_(n, threads, gated, through_sdk))
    return {name: _best_of(found) for name, found in runs.items()}


def fsync_cost(count: int = 200) -> float:
    """Seconds per fsync of a small append on the disk the datasets go to (the floor of a durable commit)."""
    with tempfile.NamedTemporaryFile(dir=WHERE) as handle:
        fd = handle.fileno()
        start = time.perf_counter()
        for _ in range(count):
            os.write(fd, b"x" * 64)
            os.fsync(fd)
        return (time.perf_counter() - start) / count


def on_threads(run: Callable[[], None], threads: int) -> float:
    """Seconds for ``threads`` threads each running ``run`` once, all started together."""
    workers = [threading.Thread(target=run) for _ in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.perf_counter() - start


def log_floor(commits: int, threads: int) -> float:
    """Commits/s of the write-ahead log alone: per commit two fsynced appends (intent, then commit) of 1 KiB.

    The floor a gated commit stands on (``threads`` share fsyncs by group commit), with no capture work.
    """
    from otel_replay.storage.wal import WriteAheadLog

    with tempfile.TemporaryDirectory(dir=WHERE) as tmp:
        wal = WriteAheadLog(tmp)
        record = b"\x0a" + b"r" * 1023
        per = commits // threads

        def run() -> None:
            for _ in range(per):
                wal.append(record)
                wal.append(record)

        elapsed = on_threads(run, threads)
        wal.close()
        return per * threads / elapsed


def commits_alone(commits: int, threads: int) -> float:
    """Durable commits/s of ``gate.commit()`` alone on ``threads`` threads: no ``audit()`` block around it.

    Each commit still seals and fsyncs its intent before the rail, and its commit record before it returns.
    """
    with tempfile.TemporaryDirectory(dir=WHERE) as tmp:
        telemetry = otel_replay.configure(tmp, set_global=False)
        gate = ActionGate(ReferenceLedger(balance=10.0 * commits), dataset=tmp)
        per = commits // threads
        action = Action("vendor_payment", ARGS, cost=1.0)

        def run() -> None:
            for _ in range(per):
                gate.commit(action)

        elapsed = on_threads(run, threads)
        telemetry.shutdown()
        return per * threads / elapsed


def _fleet_child(threads: int, dataset: str, start_at: float, n: int) -> dict[str, float]:
    """In a child: ``n`` gated trades on ``threads`` threads into ``dataset``, begun at ``start_at`` (epoch s)."""
    telemetry = otel_replay.configure(dataset, set_global=False)
    gate = ActionGate(ReferenceLedger(balance=10.0 * n), dataset=dataset)
    trades(20, gate, offset=10_000_000 + os.getpid() * 1_000)  # warm: the log opens with the first write-ahead
    per = n // threads
    time.sleep(max(0.0, start_at - time.time()))
    start, cpu = time.time(), time.process_time()
    workers = [threading.Thread(target=trades, args=(per, gate, t * per)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    end = time.time()
    telemetry.shutdown()
    return {"n": per * threads, "start": start, "end": end, "cpu": time.process_time() - cpu}


def fleet(trades_total: int, threads: int, processes: int) -> tuple[float, float]:
    """Durable commits/s and process CPU per commit of ``threads`` gated threads split over ``processes`` processes.

    All on one dataset, begun together; the rate is every process's trades over the span from the first start
    to the last end.
    """
    with tempfile.TemporaryDirectory(dir=WHERE) as tmp:
        start_at = time.time() + 3.0 + 0.5 * processes  # after every child has imported and warmed up
        each = max(1, threads // processes)
        n = str(trades_total // processes)
        argv = [sys.executable, __file__, "--fleet-child", str(each), tmp, str(start_at), n]
        children = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(processes)]
        found = [json.loads(child.communicate()[0].splitlines()[-1]) for child in children]
        if any(child.returncode for child in children):
            raise SystemExit("a fleet child failed")
        if max(r["start"] for r in found) > start_at + 1.0:
            print(f"  (warning: a child began {max(r['start'] for r in found) - start_at:.1f} s late)")
        total = sum(r["n"] for r in found)
        elapsed = max(r["end"] for r in found) - min(r["start"] for r in found)
        return total / elapsed, sum(r["cpu"] for r in found) / total


_STAGES = (
    # (module, owner in it or "", function, label): inclusive, so a stage's figure includes those nested in it
    ("otel_replay.capture.audit", "_AuditBlock", "__enter__", "audit(): enter"),
    ("otel_replay.capture.audit", "Decision", "read", "audit(): d.read()"),
    ("otel_replay.capture.audit", "Decision", "model", "audit(): d.model()"),
    ("otel_replay.capture.audit", "Decision", "act", "audit(): d.act()"),
    ("otel_replay.capture.audit", "_AuditBlock", "__exit__", "audit(): exit (the decision sealed, its span ended)"),
    ("otel_replay.gate.gate", "ActionGate", "commit", "gate.commit()"),
    ("otel_replay.gate.gate", "ActionGate", "_intent", "  the intent (sealed, fsynced)"),
    ("otel_replay.capture.audit", "Decision", "_as_acted", "    the decision copied into it"),
    ("otel_replay.records", "GateRecord", "to_attributes", "    GateRecord.to_attributes (both records)"),
    ("otel_replay.gate.gate", "ActionGate", "_remember", "  the receipt's stored form and id"),
    ("otel_replay.gate.gate", "ActionGate", "_record", "  the commit record (sealed, fsynced)"),
    ("otel_replay.capture.recorder", "Recorder", "_direct", "  a durable record's span, seal, queue, wait (both)"),
    ("otel_replay.integrity", "Chain", "seal", "    seals (all three records)"),
    ("otel_replay.pipeline", "Telemetry", "queue_span", "    queued: held records taken, encoded, kept, queued"),
    ("otel_replay.capture.log_encoding", "RequestEncoder", "encode", "      the log's OTLP encoding"),
    ("otel_replay.capture.kept_spans", "KeptSpans", "keep", "      kept for the conversion"),
    ("otel_replay.pipeline", "Telemetry", "wait_logged", "    the wait: write and fsync (group commit)"),
)


def _bracket(agent: set[int], spent: Counter[str], calls: Counter[str]) -> Callable[[], None]:
    """Wrap each of :data:`_STAGES` in ``time.thread_time()`` brackets counted for the threads in ``agent``; undo."""
    undo = []
    for module, owner_name, name, label in _STAGES:
        owner = sys.modules[module]
        owner = getattr(owner, owner_name) if owner_name else owner
        original = owner.__dict__[name] if owner_name else getattr(owner, name)

        def wrapped(*args: object, _f: Callable[..., object] = original, _l: str = label, **kwargs: object) -> object:
            if threading.get_ident() not in agent:
                return _f(*args, **kwargs)
            begun = time.thread_time()
            try:
                return _f(*args, **kwargs)
            finally:
                spent[_l] += time.thread_time() - begun
                calls[_l] += 1

        setattr(owner, name, wrapped)
        undo.append((owner, name, original))

    def restore() -> None:
        for owner, name, original in undo:
            setattr(owner, name, original)

    return restore


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of each live thread of this process, by thread name (Linux; empty elsewhere)."""
    found: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for thread in threading.enumerate():
        try:
            with open(f"/proc/self/task/{thread.native_id}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        found[thread.name] = found.get(thread.name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return found


def split_round(n: int, gated: bool, bracketed: bool) -> dict[str, object]:
    """One round of ``n`` trades on one thread: its CPU by stage (``bracketed``), by thread, and the GC's share."""
    agent: set[int] = set()
    spent: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    gc_spent = [0.0, 0.0]  # the agent thread's GC CPU, and when the running collection began

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if threading.get_ident() in agent:
            if phase == "start":
                gc_spent[1] = time.thread_time()
            else:
                gc_spent[0] += time.thread_time() - gc_spent[1]

    restore = _bracket(agent, spent, calls) if bracketed else (lambda: None)
    with tempfile.TemporaryDirectory(dir=WHERE) as tmp:
        telemetry = otel_replay.configure(tmp, set_global=False)
        gate = ActionGate(ReferenceLedger(balance=10.0 * n), dataset=tmp) if gated else None
        gc.collect()
        threads_before = _thread_cpu()
        agent.add(threading.get_ident())
        gc.callbacks.append(on_gc)
        try:
            process = time.process_time()
            cpu = time.thread_time()
            trades(n, gate)
            cpu = time.thread_time() - cpu
            threads_after = _thread_cpu()
            process = time.process_time() - process
        finally:
            gc.callbacks.remove(on_gc)
            agent.clear()
            restore()
        shutdown = time.process_time()
        telemetry.shutdown()
        shutdown = time.process_time() - shutdown
    by_thread = {
        name: threads_after[name] - threads_before.get(name, 0.0)
        for name in threads_after
        if name != threading.current_thread().name
    }
    return {
        "n": n,
        "cpu": cpu,
        "process": process,
        "shutdown": shutdown,
        "gc": gc_spent[0],
        "stages": dict(spent),
        "calls": dict(calls),
        "threads": by_thread,
    }


def split(n: int, rounds: int) -> None:
    """Print where a trade's CPU goes (see the module docstring, ``--split``): medians over ``rounds``."""

    def median(values: list[float]) -> float:
        values = sorted(values)
        return (
            values[len(values) // 2]
            if len(values) % 2
            else (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2
        )

    found: dict[tuple[bool, bool], list[dict[str, object]]] = {}
    for _ in range(rounds):
        for gated in (False, True):
            for bracketed in (False, True):
                found.setdefault((gated, bracketed), []).append(split_round(n, gated, bracketed))

    def per(rows: list[dict[str, object]], get: Callable[[dict[str, object]], float]) -> float:
        return median([get(r) / n * 1e6 for r in rows])

    print(f"where a trade's CPU goes: {n} trades on one thread, medians of {rounds} rounds (us per trade)")
    print(f"  {'':52s} {'ungated':>8s} {'gated':>8s}")
    for label, get in (
        ("agent thread (no brackets)", lambda r: r["cpu"]),
        ("  of it the cyclic GC", lambda r: r["gc"]),
        ("process, the trades (every thread)", lambda r: r["process"]),
        ("process, the shutdown (the rest converted)", lambda r: r["shutdown"]),
    ):
        print(f"  {label:52s} {per(found[(False, False)], get):8.1f} {per(found[(True, False)], get):8.1f}")
    names = sorted({name for r in found[(True, False)] + found[(False, False)] for name in r["threads"]})  # type: ignore[attr-defined]
    for name in names:
        label = f"  thread {name[:40]}"
        ungated = per(found[(False, False)], lambda r, k=name: r["threads"].get(k, 0.0))  # type: ignore[attr-defined]
        gated = per(found[(True, False)], lambda r, k=name: r["threads"].get(k, 0.0))  # type: ignore[attr-defined]
        print(f"  {label:52s} {ungated:8.1f} {gated:8.1f}   (10 ms ticks)")
    print(
        f"  {'agent thread, bracketed (the brackets cost the rest)':52s} "
        f"{per(found[(False, True)], lambda r: r['cpu']):8.1f} {per(found[(True, True)], lambda r: r['cpu']):8.1f}"
    )
    for _, _, _, label in _STAGES:
        ungated = per(found[(False, True)], lambda r, k=label: r["stages"].get(k, 0.0))  # type: ignore[attr-defined]
        gated = per(found[(True, True)], lambda r, k=label: r["stages"].get(k, 0.0))  # type: ignore[attr-defined]
        count = median([r["calls"].get(label, 0) / n for r in found[(True, True)]])  # type: ignore[attr-defined]
        print(f"    {label:50s} {ungated:8.1f} {gated:8.1f}   ({count:.0f} per gated trade)")


def _print(label: str, found: dict[str, dict[str, float]], threads: int, rounds: int, code: str = "") -> None:
    """The figures of one thread count: per variant, then the gated / ungated ratios."""
    plain, gated = found["ungated"], found["gated"]
    print(
        f"{label}{code}: {gated['n']:.0f} trades (read, model, act) per round, best of {rounds} "
        "(wall: the fastest round; CPU: the least of any round)"
    )
    for name, r in found.items():
        per = r["wall"] / r["n"] * 1e3
        cpu = (
            f"  CPU {r['cpu'] / r['n'] * 1e3:6.3f} ms/trade (process {r['process_cpu'] / r['n'] * 1e3:6.3f})"
            if threads == 1
            else f"  process CPU {r['process_cpu'] / r['n'] * 1e3:6.3f} ms/trade"
        )
        print(
            f"  {name:17s} {per:7.3f} ms/trade{cpu}  {r['n'] / r['wall']:9,.0f} trades/s  "
            f"{r['files']:6.0f} Parquet files  (shutdown {r['shutdown'] * 1e3:.0f} ms, "
            f"capture_errors {r['capture_errors']:.0f})"
        )
    ratio = (gated["wall"] / gated["n"]) / (plain["wall"] / plain["n"])
    target = "target <= 2x" if threads == 1 else "target >= 5,000 commits/s"
    process = (gated["process_cpu"] / gated["n"]) / (plain["process_cpu"] / plain["n"])
    cpu_ratio = f"; CPU {gated['cpu'] / plain['cpu']:.2f}x" if threads == 1 else ""
    print(
        f"  gated / ungated: {ratio:.2f}x{cpu_ratio}; process CPU {process:.2f}x; durable commits/s: "
        f"{gated['n'] / gated['wall']:,.0f}  ({target}; <= 10 files for 2,000 gated trades)"
    )


def _names(threads: int) -> tuple[str, ...]:
    return ("ungated", "gated", "gated, SDK spans") if threads == 1 else ("ungated", "gated")


def _extract(ref: str, into: str) -> str:
    """The package at git ``ref`` of this checkout, extracted under ``into``; the directory to put on the path."""
    root = Path(__file__).resolve().parents[1]
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", ref, "otel_replay"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return into


def _child(path: str, threads: int, opts: argparse.Namespace) -> dict[str, dict[str, float]]:
    """One round of each variant in a fresh process whose ``otel_replay`` comes from ``path``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [path, os.environ.get("PYTHONPATH")]))}
    argv = [sys.executable, __file__, "--child", str(threads), "--trades", str(opts.trades)]
    if opts.dir:
        argv += ["--dir", opts.dir]
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def _against_base(opts: argparse.Namespace) -> None:
    """This code and the code at ``opts.base``, a round each in turn (each round in a child process)."""
    with tempfile.TemporaryDirectory() as tmp:
        # A directory holding an ``otel_replay`` package (a tree extracted and compiled beforehand) is used as it is.
        base = opts.base if Path(opts.base, "otel_replay").is_dir() else _extract(opts.base, tmp)
        codes = {"this code": str(Path(__file__).resolve().parents[1]), opts.base: base}
        for threads in (1, opts.threads):
            runs: dict[str, dict[str, list[dict[str, float]]]] = {code: {} for code in codes}
            for _ in range(opts.rounds):
                for code, path in codes.items():
                    for name, result in _child(path, threads, opts).items():
                        runs[code].setdefault(name, []).append(result)
            label = "1 thread" if threads == 1 else f"{threads} threads"
            for code, found in runs.items():
                best_of = {name: _best_of(found[name]) for name in found}
                _print(label, best_of, threads, opts.rounds, f", {code}")


def main() -> int:
    global WHERE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trades", type=int, default=2_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dir", default=None, help="where datasets go (default: the temporary directory)")
    parser.add_argument(
        "--base", default=None, help="a git ref (or a directory holding its otel_replay) measured in turn, same run"
    )
    parser.add_argument(
        "--processes", default="", help="e.g. 1,2,4: the --threads gated threads split over that many processes"
    )
    parser.add_argument("--split", action="store_true", help="where a trade's CPU goes, by stage and by thread")
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)  # one round per variant, as JSON
    parser.add_argument("--fleet-child", nargs=4, default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    WHERE = opts.dir
    logging.basicConfig(level=logging.ERROR)
    if opts.fleet_child:
        threads, dataset, start_at, n = opts.fleet_child
        print(json.dumps(_fleet_child(int(threads), dataset, float(start_at), int(n))))
        return 0
    if opts.processes:
        counts = [int(p) for p in opts.processes.split(",")]
        print(f"fsync of a small append here: {fsync_cost() * 1e3:.3f} ms; {os.cpu_count()} CPUs")
        for _ in range(opts.rounds):
            for processes in counts:
                rate, cpu = fleet(opts.trades, opts.threads, processes)
                print(
                    f"  {opts.threads} gated threads in {processes} process(es), one dataset: {rate:,.0f} durable "
                    f"commits/s, process CPU {cpu * 1e3:.3f} ms/commit  (target >= 5,000 commits/s)"
                )
        return 0

    if opts.split:
        round_(200, 1, False), round_(200, 1, True)  # warm up imports and caches
        split(opts.trades, opts.rounds)
        return 0
    if opts.base:
        print(f"fsync of a small append here: {fsync_cost() * 1e3:.3f} ms")
        _against_base(opts)
        return 0
    round_(200, 1, False), round_(200, 1, True)  # warm up imports and caches
    if opts.child:
        print(json.dumps(best(opts.trades, opts.child, 1, _names(opts.child))))
        return 0
    print(f"fsync of a small append here: {fsync_cost() * 1e3:.3f} ms")
    for threads in (1, opts.threads):
        found = best(opts.trades, threads, opts.rounds, _names(threads))
        label = "1 thread" if threads == 1 else f"{threads} threads"
        _print(label, found, threads, opts.rounds)
        alone = commits_alone(min(opts.trades, 400 * threads), threads)
        print(f"  peer: gate.commit() alone, no audit() block ({label}): {alone:,.0f} durable commits/s")
        floor = log_floor(min(opts.trades, 400 * threads), threads)
        print(f"  peer: the write-ahead log alone (2 fsynced appends per commit, {label}): {floor:,.0f} commits/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
