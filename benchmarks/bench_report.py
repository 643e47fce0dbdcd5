"""A big chain's report page: its size, the time to build it, and the time Chromium takes to open and scroll it.

Run: python benchmarks/bench_report.py [--events N] [--rounds N]

Writes one correlation of ``--events`` events (half ``audit()`` decisions with
a snapshot, a read, a model call and an action, half audit entries) through
:func:`otel_replay.configure`, then, best of ``--rounds``:

* ``chain``: ``ReplayBuilder.build`` (what ``otel-replay chain`` does): the peer;
* ``page``: the chain plus the view model and the HTML (what ``otel-replay report chain`` does);
* ``chromium``: headless Chromium (Debian's, driven by Playwright) opening the page from a file until
  its ``load`` event and a frame after it, and then scrolling to its end (skipped without either).

Prints figures and the page's ratio to the chain; asserts nothing. Target (issue 23): a 5,000-event
chain renders and scrolls in under 1 s, and its page stays under 2 MB.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OTEL_REPLAY_SIGNING_KEY", "benchmark-signing-key-0123456789")

import otel_replay  # noqa: E402
from otel_replay import Action, AuditLog, DependencySnapshot, audit, correlation  # noqa: E402
from otel_replay.query.chains import ReplayBuilder  # noqa: E402
from otel_replay.report import html, model  # noqa: E402

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip


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


def best(rounds: int, work: object) -> float:
    """The fastest of ``rounds`` runs of ``work()``, in seconds."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        work()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return min(times)


def browser_times(page_file: Path, rounds: int) -> tuple[float, float] | None:
    """(open, scroll) seconds in headless Chromium, best of ``rounds``; ``None`` without Chromium or Playwright."""
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright  # here: an optional benchmark dependency
    except ImportError:
        return None
    if chromium is None:
        return None
    opened, scrolled = [], []
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        for _ in range(rounds):
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            start = time.perf_counter()
            page.goto(page_file.as_uri(), wait_until="load")
            page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
            opened.append(time.perf_counter() - start)
            start = time.perf_counter()
            page.evaluate(
                "() => new Promise(r => { window.scrollTo(0, document.body.scrollHeight); "
                "requestAnimationFrame(() => requestAnimationFrame(r)); })"
            )
            scrolled.append(time.perf_counter() - start)
            page.close()
        browser.close()
    return min(opened), min(scrolled)


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dataset = Path(tmp) / "ds"
        start = time.perf_counter()
        cid = write(dataset, args.events)
        print(f"wrote {args.events} events in {time.perf_counter() - start:.1f} s (load: {os.getloadavg()[0]:.1f})")
        with otel_replay.open(dataset) as store:
            chain_s = best(args.rounds, lambda: ReplayBuilder(store).build("directive", cid, args.events))
            chain = ReplayBuilder(store).build("directive", cid, args.events)
            page_s = best(args.rounds, lambda: html.chain_page(model.chain_view(chain, store)))
            page = html.chain_page(model.chain_view(chain, store))
        page_file = Path(tmp) / "chain.html"
        page_file.write_text(page, encoding="utf-8")
        size = len(page.encode("utf-8"))
        print(f"chain (peer): {chain_s * 1000:.0f} ms for {len(chain.events)} events")
        print(f"page: {page_s * 1000:.0f} ms on top ({page_s / chain_s:.2f}x the chain), {size / 1e6:.2f} MB")
        shown = browser_times(page_file, args.rounds)
        if shown is None:
            print("chromium: skipped (no chromium on PATH or no playwright package)")
        else:
            print(f"chromium: opened in {shown[0] * 1000:.0f} ms, scrolled to the end in {shown[1] * 1000:.0f} ms")


if __name__ == "__main__":
    main()
