"""What ``govern()`` adds to one model call: 10 contracts loaded, 3 tool calls per response, each one checked.

Run:

    .venv/bin/python benchmarks/bench_govern.py [--calls 300] [--rounds 3] [--base s5-start] [--server]

One worker process per tree (this checkout, and the package as of ``--base`` for a peer in the same run; the
rounds alternate between them), each with the real ``openai`` client. In a worker, calls are made in pairs:
the same ``chat.completions.create`` on the bare client and on the client governed by ``govern()`` (the
order alternating), then the same pair with the OpenAIInstrumentor on. What govern adds is the median of
the pairs' differences: the machine's noise (a loaded machine swings the bare call itself by 2x between
rounds) falls on both halves of a pair alike and cancels, where a difference of two separate medians does
not. The response (three tool calls, all allowed by the contracts) comes from an in-memory transport, so
the figures are the libraries' own time; ``--server`` uses the scripted local server instead (a real
loopback round trip, noisier: the server thread shares the GIL). Governed calls keep their state in a
MemoryStateStore and write one decision span each to a TracerProvider whose exporter keeps nothing. Each
call is timed in CPU time of the calling thread (all of the call's work runs there). Prints the medians in
µs per call, what govern adds over the bare call and beyond the instrumentor alone, and the load; asserts
nothing.
Target (issue 22): under 200 µs added per call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _support import null_provider, openai_http, package_at

ROOT = Path(__file__).resolve().parents[1]
BASE = "s5-start"
TOOLS = [f"tool_{i}" for i in range(10)]
CALLS = [(f"c{i}", TOOLS[i], {"account": f"AC-{i}00", "amount": 10 * (i + 1), "note": "bench"}) for i in range(3)]


def write_contracts(directory: Path) -> Path:
    """Ten tool contracts (argument invariants, no phase) and a session with limits and a price table."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in TOOLS:
        (directory / f"{name}.yaml").write_text(
            f"tool: {name}\n"
            "side_effect: read\n"
            "argument_value_invariants:\n"
            '  - path: "$.account"\n'
            '    regex: "^AC-[0-9]+$"\n'
            '  - path: "$.amount"\n'
            "    gte: 0\n"
            "    lte: 1000\n"
        )
    (directory / "session.yaml").write_text(
        'schema_version: "1.0"\n'
        "agent: bench\n"
        "session_limits:\n"
        "  max_steps: 100000000\n"
        "  max_tool_calls: 1000000000\n"
        "  max_cost_per_session: 1000000\n"
        "prices:\n"
        "  gpt-bench:\n"
        "    input_per_million: 0.15\n"
        "    output_per_million: 0.60\n"
    )
    return directory


def _paired(bare: Callable[[], Any], governed: Callable[[], Any], calls: int) -> dict[str, float]:
    """Median µs of each, and the median of the pairs' differences (governed minus bare)."""
    for _ in range(min(30, calls)):
        bare()
        governed()
    plain, held, added = [], [], []
    for index in range(calls):
        first, second = (bare, governed) if index % 2 == 0 else (governed, bare)
        start = time.thread_time_ns()
        first()
        middle = time.thread_time_ns()
        second()
        end = time.thread_time_ns()
        one, two = (middle - start, end - middle) if index % 2 == 0 else (end - middle, middle - start)
        plain.append(one)
        held.append(two)
        added.append(two - one)
    return {
        "bare": statistics.median(plain) / 1000,
        "governed": statistics.median(held) / 1000,
        "added": statistics.median(added) / 1000,
    }


def worker(calls: int, server: bool) -> dict[str, dict[str, float]]:
    """One round in this process: bare/governed pairs, without and then with the instrumentor."""
    import openai

    from otel_replay.contracts.session import govern
    from otel_replay.contracts.store import MemoryStateStore
    from otel_replay.instrumentation import OpenAIInstrumentor, scripted

    httpx = openai_http()
    provider = null_provider()
    reply = scripted.chat_completion(None, model="gpt-bench", tool_calls=CALLS)
    live = scripted.ScriptedServer(default=reply, keep=False).start() if server else None
    contracts = write_contracts(Path(tempfile.mkdtemp(prefix="bench-govern-")) / "contracts")
    tools = [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}} for name in TOOLS]
    messages = [{"role": "user", "content": "hello"}]

    def client() -> Any:
        if live is not None:
            return openai.OpenAI(base_url=live.base_url, api_key="sk-bench", max_retries=0)
        body, kind = scripted.encode(reply)
        transport = httpx.MockTransport(
            lambda request: httpx.Response(200, content=body, headers={"content-type": kind})
        )
        return openai.OpenAI(
            base_url="http://memory/v1",
            api_key="sk-bench",
            max_retries=0,
            http_client=httpx.Client(transport=transport),
        )

    bare = client()
    governed = govern(client(), contracts, store=MemoryStateStore(), tracer_provider=provider).client

    def call(target: Any) -> Callable[[], Any]:
        return lambda: target.chat.completions.create(model="gpt-bench", messages=messages, tools=tools)

    results = {"plain": _paired(call(bare), call(governed), calls)}
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        results["instrumented"] = _paired(call(bare), call(governed), calls)
    finally:
        instrumentor.uninstrument()
    if live is not None:
        live.stop()
    return results


def _run(tree: Path, calls: int, server: bool) -> dict[str, dict[str, float]]:
    """A worker round with ``tree``'s package first on the path; its figures."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, __file__, "--worker", "--calls", str(calls), *(["--server"] if server else [])]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"worker ({tree}) failed:\n{done.stderr[-3000:]}")
    figures: dict[str, dict[str, float]] = json.loads(done.stdout.splitlines()[-1])
    return figures


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f} (5 min {five:.1f}) on {os.cpu_count()} cores"


def main() -> int:
    """Alternate the trees over the rounds and print the medians across rounds."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="pairs of calls per round and variant")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--base", default=BASE, help="the peer: the package as of this git ref ('' for none)")
    parser.add_argument("--server", action="store_true", help="the scripted local server instead of memory")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        print(json.dumps(worker(options.calls, options.server)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this": ROOT}
        if options.base:
            base = package_at(options.base, Path(tmp))
            if base is None:
                print(f"(no peer: git cannot archive {options.base})")
            else:
                trees[options.base] = base
        print(f"start: {_load()}")
        rounds: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in trees}
        for _ in range(options.rounds):
            for name, tree in trees.items():
                rounds[name].append(_run(tree, options.calls, options.server))
        print(f"end: {_load()}")
    where = "scripted server on loopback" if options.server else "in-memory transport"
    print(
        f"govern() per call: {options.calls} pairs x {options.rounds} rounds, {where}, 10 contracts, "
        "3 tool calls per response; medians across rounds of each round's median (µs CPU)"
    )
    for name, runs in rounds.items():
        print(f" {name}:")
        for variant, label in (("plain", "bare client"), ("instrumented", "with the OpenAIInstrumentor")):
            bare = statistics.median(run[variant]["bare"] for run in runs)
            governed = statistics.median(run[variant]["governed"] for run in runs)
            added = [run[variant]["added"] for run in runs]
            spread = ", ".join(f"{value:.0f}" for value in added)
            print(
                f"  {label:<28} bare {bare:8.1f}  governed {governed:8.1f}  govern adds "
                f"{statistics.median(added):7.1f} µs ({governed / bare:.2f}x; rounds: {spread})"
            )
    if len(rounds) == 2:
        this, base = (statistics.median(run["plain"]["added"] for run in runs) for runs in rounds.values())
        print(f" this checkout adds {this / base:.2f}x what {options.base} adds (no instrumentor)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
