"""A big chain's report page: its size, the time to build it, and the time Chromium takes to open and scroll it.

Run: python benchmarks/bench_report.py [--events N] [--rounds N] [--base COMMIT]

Writes one correlation of ``--events`` events (half ``audit()`` decisions with
a snapshot, a read, a model call and an action, half audit entries) through
:func:`otel_replay.configure`, then, for this checkout and for the package as of
``--base`` (default ``s5-start``, extracted with ``git archive``; ``--base ''``
leaves it out), each in its own process, best of ``--rounds``:

* ``chain``: ``ReplayBuilder.build`` (what ``otel-replay chain`` does): the peer;
* ``page``: the chain plus the view model and the HTML (what ``otel-replay report chain`` does);

in wall and CPU seconds (the CPU of every thread of the process: DuckDB's too);

and then, both pages in one headless Chromium (Debian's, driven by Playwright;
skipped without either), alternating, best of ``--rounds``:

* ``open``: from ``goto`` to the ``load`` event and two frames after it (parsed, laid out, painted);
* ``open cpu``: the CPU time Chromium's renderer spent on that (its main thread, and the whole renderer
  process), from the DevTools protocol's ``Performance.getMetrics``: wall time on a loaded machine is
  mostly waiting for a core, CPU time much less so;
* ``scroll``: to the page's end and two frames;
* ``expand``: a click on the line of the last event that opens, until its detail is shown;
* the DOM nodes (elements and text) the page holds once opened, and its layout objects.

Prints figures and ratios; asserts nothing. Target (issue 23): a 5,000-event
chain renders and scrolls in under 1 s, and its page stays under 2 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OTEL_REPLAY_SIGNING_KEY", "benchmark-signing-key-0123456789")

from _support import package_at  # noqa: E402  (benchmarks/ is on sys.path when a script runs)

import otel_replay  # noqa: E402
from otel_replay import Action, AuditLog, DependencySnapshot, audit, correlation  # noqa: E402
from otel_replay.query.chains import ReplayBuilder  # noqa: E402
from otel_replay.report import html, model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASE = "s5-start"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
FRAMES = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
# The last event that opens: a click on its line (as a reader's), then two frames (this page's or, for the
# code before, a <details>'s summary).
EXPAND = (
    "() => new Promise(r => { const all = document.querySelectorAll('.event[tabindex], details.event'); "
    "const last = all[all.length - 1]; (last.querySelector('summary') || last.querySelector('time')).click(); "
    "requestAnimationFrame(() => requestAnimationFrame(r)); })"
)
SCROLL = (
    "() => new Promise(r => { window.scrollTo(0, document.body.scrollHeight); "
    "requestAnimationFrame(() => requestAnimationFrame(r)); })"
)


def write(dataset: Path, events: int) -> str:
    """One correlation of ``events`` events in ``dataset``; its id."""
    telemetry = otel_replay.configure(dataset, service_name="bench-report", set_global=False)
    try:
        log = AuditLog()
        with correlation() as cid:
            for i in range(events // 2):
                log.append("quote", source_agent=f"desk-{i % 4}", target_agent="trader", payload={"n": i, "px": 101.5})
                state = {"budget": 10_000 - i, "limits": {"max": 500, "desk": f"desk-{i % 4}"}}
                snapshot = DependencySnapshot(state, version=f"v{i}")
                with audit("trade", snapshot=snapshot, agent_id=f"agent-{i % 3}") as d:
                    d.read(ticker="ACME", n=i)
                    d.model("scripted-1", decision_basis=f"step {i}: within limits")
                    d.act(Action("buy", {"ticker": "ACME", "qty": i % 50}, cost=float(i)))
        assert telemetry.force_flush()
    finally:
        telemetry.shutdown()
    return cid


def best(rounds: int, work: Callable[[], object]) -> tuple[float, float]:
    """The fastest of ``rounds`` runs of ``work()``: (wall seconds, CPU seconds of the process, every thread)."""
    walls, cpus = [], []
    for _ in range(rounds):
        start, cpu = time.perf_counter(), time.process_time()
        work()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return min(walls), min(cpus)


def build(dataset: str, cid: str, events: int, rounds: int, out: str) -> dict[str, Any]:
    """The worker: the chain and its page built by the package on this process's path; the page written to ``out``."""
    with otel_replay.open(dataset) as store:
        chain_s, chain_cpu = best(rounds, lambda: ReplayBuilder(store).build("directive", cid, events))
        chain = ReplayBuilder(store).build("directive", cid, events)
        page_s, page_cpu = best(rounds, lambda: html.chain_page(model.chain_view(chain, store)))
        page = html.chain_page(model.chain_view(chain, store))
    Path(out).write_text(page, encoding="utf-8")
    return {
        "chain": chain_s, "chain_cpu": chain_cpu, "page": page_s, "page_cpu": page_cpu,
        "bytes": len(page.encode("utf-8")), "events": len(chain.events),
    }  # fmt: skip


def _worker(tree: Path, *args: str) -> dict[str, Any]:
    """Run this script as a worker with ``tree``'s package first on the path; its JSON answer."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, __file__, "--worker", *args], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"worker {args} failed:\n{done.stderr[-3000:]}")
    answer: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return answer


def browser_times(pages: dict[str, Path], rounds: int) -> dict[str, dict[str, float]] | None:
    """Per page: open, scroll and expand seconds (best of ``rounds``, the pages alternating) and its element count."""
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright  # here: an optional benchmark dependency
    except ImportError:
        return None
    if chromium is None:
        return None
    kinds = ("open", "thread", "process", "scroll", "expand")
    times: dict[str, dict[str, list[float]]] = {name: {kind: [] for kind in kinds} for name in pages}
    elements: dict[str, dict[str, float]] = {}

    def metrics(session: Any) -> dict[str, float]:
        return {m["name"]: m["value"] for m in session.send("Performance.getMetrics")["metrics"]}

    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        for _ in range(rounds):
            for name, page_file in pages.items():
                page = browser.new_page(viewport={"width": 1300, "height": 900})
                devtools = page.context.new_cdp_session(page)
                devtools.send("Performance.enable")
                before = metrics(devtools)
                start = time.perf_counter()
                page.goto(page_file.as_uri(), wait_until="load")
                page.evaluate(FRAMES)
                times[name]["open"].append(time.perf_counter() - start)
                after = metrics(devtools)
                times[name]["thread"].append(after["ThreadTime"] - before["ThreadTime"])
                times[name]["process"].append(after["ProcessTime"] - before["ProcessTime"])
                elements[name] = {"nodes": after["Nodes"], "layout": after["LayoutObjects"]}
                start = time.perf_counter()
                page.evaluate(SCROLL)
                times[name]["scroll"].append(time.perf_counter() - start)
                start = time.perf_counter()
                page.evaluate(EXPAND)
                times[name]["expand"].append(time.perf_counter() - start)
                page.close()
        browser.close()
    return {name: {**{k: min(v) for k, v in t.items()}, **elements[name]} for name, t in times.items()}


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--base", default=BASE, help="a commit to compare with ('' for none)")
    parser.add_argument("--worker", nargs=4, metavar=("DATASET", "CID", "EVENTS", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        dataset, cid, events, out = args.worker
        print(json.dumps(build(dataset, cid, int(events), args.rounds, out)))
        return
    one, five, _ = os.getloadavg()
    print(f"load {one:.1f} (5 min {five:.1f}) on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        dataset = Path(tmp) / "ds"
        start = time.perf_counter()
        cid = write(dataset, args.events)
        print(f"wrote {args.events} events in {time.perf_counter() - start:.1f} s")
        trees = {"this": ROOT}
        if args.base:
            base = package_at(args.base, Path(tmp) / "base")
            if base is None:
                print(f"(no peer: git cannot archive {args.base})")
            else:
                trees[args.base] = base
        built, pages = {}, {}
        for name, tree in trees.items():
            pages[name] = Path(tmp) / f"chain-{len(pages)}.html"
            built[name] = _worker(tree, str(dataset), cid, str(args.events), str(pages[name]))
        for name, b in built.items():
            print(
                f"{name:>10}: chain (peer) {b['chain'] * 1000:.0f} ms ({b['chain_cpu'] * 1000:.0f} ms CPU) for "
                f"{b['events']} events; page {b['page'] * 1000:.0f} ms ({b['page_cpu'] * 1000:.0f} ms CPU) on top "
                f"({b['page_cpu'] / b['chain_cpu']:.2f}x the chain's CPU), {b['bytes'] / 1e6:.2f} MB"
            )
        shown = browser_times(pages, args.rounds)
        if shown is None:
            print("chromium: skipped (no chromium on PATH or no playwright package)")
        else:
            for name, s in shown.items():
                print(
                    f"{name:>10}: chromium opened it in {s['open'] * 1000:.0f} ms (renderer CPU: main thread "
                    f"{s['thread'] * 1000:.0f} ms, process {s['process'] * 1000:.0f} ms), scrolled to the end in "
                    f"{s['scroll'] * 1000:.0f} ms, expanded the last event in {s['expand'] * 1000:.0f} ms; "
                    f"{s['nodes']:,.0f} DOM nodes, {s['layout']:,.0f} layout objects"
                )
            if args.base in shown:
                this, base_s = shown["this"], shown[args.base]
                print(
                    f"this / {args.base}: open {this['open'] / base_s['open']:.2f}x (renderer main-thread CPU "
                    f"{this['thread'] / base_s['thread']:.2f}x), "
                    f"open + scroll {(this['open'] + this['scroll']) / (base_s['open'] + base_s['scroll']):.2f}x, "
                    f"page build CPU {built['this']['page_cpu'] / built[args.base]['page_cpu']:.2f}x, "
                    f"size {built['this']['bytes'] / built[args.base]['bytes']:.2f}x"
                )
        print(f"load after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
