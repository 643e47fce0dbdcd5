"""Rerun speed: a recorded session of N steps rerun offline vs the live run vs vcrpy replaying its HTTP.

Each step reads the clock, draws a random number, makes an httpx GET and an
httpx POST to a local server whose answers change, and calls a model through
the real ``openai`` client against a local scripted endpoint. Measured in one
run, on the same servers:

* live: the agent against the servers, nothing recorded;
* record: the same under ``otel_replay.rerun.recording`` (for reference);
* rerun: ``otel_replay.rerun.rerun`` from the dataset, servers untouched
  (``serve`` is the agent's own run; ``total`` adds loading and verifying the
  recording through DuckDB);
* vcrpy: the same HTTP calls (plain httpx for the model call: vcrpy does not
  patch the httpx2 fork the openai client uses) recorded into a cassette,
  then replayed with ``record_mode="none"`` and the default matchers. vcrpy
  runs in its own venv (``--vcr-python``, default /work/rerun-bench-venv), as
  a subprocess against the same servers; skipped when that venv is missing;
* floor: the plain-httpx calls against ``httpx.MockTransport`` - the client
  library's own cost with no network and nothing recorded, which any replay
  through the client pays; rerun minus floor is otel-replay's own cost;
* matcher alone: the seam -> stream -> ``popleft`` -> hash check path, per call,
  at 5x the step counts (flat = O(1));
* pure-Python agent: a rerun of an agent whose steps are Python work (a JSON
  document parsed, scored through small functions, formatted back) with one
  clock read and one draw each, no HTTP: what a rerun's profile hook (which
  watches for clock and entropy functions bound before it began) costs code
  that makes many calls (``--heavy-steps``; CPU of the agent's thread, best of
  ``--runs``, next to the same agent run without any rerun).

Wall time is what a user waits, but on a machine shared with other jobs it swings with their load; so the
rerun, vcrpy and the floor are also measured in CPU time (``cpu`` columns: the agent thread's CPU for the
rerun and the floor, the vcrpy process's for vcrpy; all three are single-threaded), whose ratio holds
steady when the wall-time ratio does not. The live run's CPU is not comparable (its servers are threads of
this process) and is not shown.

Per step, with and without set-up. A run's time holds a one-off cost besides its steps: the agent's own
``httpx.Client()`` (loading the CA bundle, about 40 ms), ``rerun()``'s set-up, vcrpy's patching and
cassette. At 200 steps that is a tenth of a rerun, and it swings from run to run, so besides ``T(N)/N`` the
benchmark measures a one-step session of each contender and reports the marginal cost per step,
``(T(N) - T(1)) / (N - 1)``: what each further step costs, the set-up removed on both sides alike. Each
contender is run ``--runs`` times on the same recording or cassette, after a garbage collection; the best
(least disturbed) run is the figure and the median is printed beside it. "Faster than vcrpy" is judged on
the marginal CPU cost per step at the smallest size vcrpy runs (best of ``--runs``, same process for the
rerun, one vcrpy process); "flat" on the rerun's marginal cost from the smallest to the largest size,
``(T(largest) - T(smallest)) / (largest - smallest)``, against its marginal cost up to the smallest.

Usage: ``python benchmarks/bench_rerun.py [--steps 200 2000] [--vcr-max 400] [--runs 3] [--repeat 3]``
(``--repeat``: every size measured again, round after round, each row printed; the load average is printed
before and after).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import openai

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import example_rerun_agent as example  # noqa: E402

import otel_replay  # noqa: E402
from otel_replay.rerun import recording, rerun  # noqa: E402

os.environ.setdefault("OTEL_REPLAY_SIGNING_KEY", "bench-signing-key-0123456789abcdef")

VCR_SCRIPT = r"""
import gc, json, random, sys, time, tempfile, os
import httpx, vcr
api, model, steps, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cassette = os.path.join(tempfile.mkdtemp(), "c.yaml")
def run():
    out = []
    with httpx.Client(base_url=api) as client:
        for i in range(steps):
            t = time.time(); r = random.random()
            q = client.get("/quote").json()
            p = client.post("/orders", json={"i": i, "price": q["price"]}).json()
            body = {"model": "m", "messages": [{"role": "user", "content": str(i)}]}
            m = client.post(model + "/v1/chat/completions", json=body).json()
            out.append((q["price"], p["ticket"], m["id"]))
    return out
with vcr.use_cassette(cassette, record_mode="all"):
    recorded = run()
found = []
for _ in range(runs):
    gc.collect()
    start, cpu = time.perf_counter(), time.process_time()
    with vcr.use_cassette(cassette, record_mode="none"):
        replayed = run()
    found.append((time.perf_counter() - start, time.process_time() - cpu))
    assert replayed == recorded, "vcrpy replay differs"
print(json.dumps(found))
"""


def agent(api: str, model: str, steps: int, *, plain_http: bool = False) -> list[Any]:
    """The benchmarked agent: ``steps`` times clock, random, GET, POST and a model call.

    ``plain_http`` makes the model call with plain httpx instead of the openai client: exactly the
    workload vcrpy replays.
    """
    out = []
    key = "sk-bench-0123456789abcdefghij"
    llm = None if plain_http else openai.OpenAI(base_url=f"{model}/v1", api_key=key, max_retries=0)
    with httpx.Client(base_url=api, timeout=10) as client:
        for i in range(steps):
            now = time.time()
            draw = random.random()
            quote = client.get("/quote").json()
            placed = client.post("/orders", json={"i": i, "price": quote["price"], "draw": draw}).json()
            messages = [{"role": "user", "content": f"{i} {now}"}]
            if llm is None:
                body = {"model": "m", "messages": messages}
                answer = client.post(f"{model}/v1/chat/completions", json=body).json()["id"]
            else:
                answer = llm.chat.completions.create(model="m", messages=messages).choices[0].message.content  # type: ignore[arg-type]
            out.append((quote["price"], placed["ticket"], answer))
    return out


def agent_http(api: str, model: str, steps: int) -> list[Any]:
    """:func:`agent` with the model call made by plain httpx."""
    return agent(api, model, steps, plain_http=True)


def floor(steps: int) -> tuple[float, float]:
    """µs per step (wall, CPU) of the plain-httpx agent's calls against ``httpx.MockTransport``: the client's
    own cost, no network, no recording - the floor any replay through the httpx client sits on."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"price": 1.0, "ticket": "T1", "id": "c1"}, headers={"Set-Cookie": "a=b"})

    with httpx.Client(base_url="http://127.0.0.1:1", transport=httpx.MockTransport(handler)) as client:
        gc.collect()
        start, cpu = time.perf_counter(), time.thread_time()
        for i in range(steps):
            now = time.time()
            draw = random.random()
            quote = client.get("/quote").json()
            client.post("/orders", json={"i": i, "price": quote["price"], "draw": draw}).json()
            body = {"model": "m", "messages": [{"role": "user", "content": f"{i} {now}"}]}
            client.post("http://127.0.0.1:2/v1/chat/completions", json=body).json()
        return (time.perf_counter() - start) * 1e6 / steps, (time.thread_time() - cpu) * 1e6 / steps


def _measure(
    fn: Any, api: str, model: str, steps: int, dataset: str, session: str, runs: int
) -> tuple[float, float, list[float], list[float], list[float]]:
    """(live, record, rerun serve, rerun with loading, the agent thread's CPU in the rerun) seconds for one agent.

    The recording is rerun ``runs`` times (a list of each rerun's figures), each after a garbage collection.
    """
    fn(api, model, 5)  # warm up imports and connections
    start = time.perf_counter()
    fn(api, model, steps)
    live = time.perf_counter() - start
    telemetry = otel_replay.configure(dataset, service_name="bench", set_global=False)
    start = time.perf_counter()
    with recording(session):
        original = fn(api, model, steps)
    recorded = time.perf_counter() - start
    telemetry.force_flush()
    telemetry.shutdown()
    serves: list[float] = []
    totals: list[float] = []
    cpu: list[float] = []

    def entrypoint() -> Any:
        began = _thread_cpu()  # not a clock the rerun serves or watches: the agent's CPU, measured from outside
        try:
            return fn(api, model, steps)
        finally:
            cpu.append(_thread_cpu() - began)

    for _ in range(runs):
        gc.collect()
        start = time.perf_counter()
        result = rerun(entrypoint, dataset=dataset, session_id=session, write=False)
        totals.append(time.perf_counter() - start)
        assert result.matched and result.output == original, result.report()
        serves.append(result.seconds)
    return live, recorded, serves, totals, cpu


def _thread_cpu() -> float:
    """CPU seconds of the calling thread, read through ``getrusage`` (``time.thread_time`` is a clock a rerun
    serves: called from this module, the agent's, it would be a read the recording does not hold)."""
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime


def _score(item: dict[str, Any], weights: dict[str, float]) -> float:
    return sum(weights.get(key, 0.0) * float(value) for key, value in item.items() if isinstance(value, (int, float)))


def _rank(items: list[dict[str, Any]], weights: dict[str, float]) -> list[str]:
    return [f"{item['id']}:{_score(item, weights):.3f}" for item in sorted(items, key=lambda i: -_score(i, weights))]


def python_heavy(steps: int) -> list[Any]:
    """The pure-Python agent: per step a JSON document parsed, ranked through small functions and written back,
    one clock read and one draw (about 2,000 Python and C calls a step)."""
    out = []
    weights = {"price": 0.5, "size": -0.1, "age": 0.02}
    for i in range(steps):
        now, draw = time.time(), random.random()
        items = [{"id": f"o{i}-{k}", "price": k * 1.5 + draw, "size": k % 7, "age": k * 3} for k in range(40)]
        document = json.loads(json.dumps({"at": now, "items": items}))
        ranked = _rank(document["items"], weights)
        out.append((ranked[0], len(ranked)))
    return out


def heavy(steps: int, runs: int) -> tuple[float, float]:
    """(the agent alone, its rerun) CPU seconds of the agent's thread for :func:`python_heavy`, best of ``runs``."""
    dataset = tempfile.mkdtemp(prefix="bench-rerun-heavy-")
    telemetry = otel_replay.configure(dataset, service_name="bench", set_global=False)
    with recording("heavy"):
        original = python_heavy(steps)
    telemetry.force_flush()
    telemetry.shutdown()
    alone: list[float] = []
    cpu: list[float] = []

    def entrypoint() -> Any:
        began = _thread_cpu()
        try:
            return python_heavy(steps)
        finally:
            cpu.append(_thread_cpu() - began)

    for _ in range(runs):
        gc.collect()
        began = _thread_cpu()
        python_heavy(steps)
        alone.append(_thread_cpu() - began)
        gc.collect()
        result = rerun(entrypoint, dataset=dataset, session_id="heavy", write=False)
        assert result.matched and result.output == original, result.report()
    return min(alone), min(cpu)


def _vcr(python: str, api: str, model: str, steps: int, runs: int) -> list[tuple[float, float]] | None:
    """(wall, CPU) seconds of each of ``runs`` vcrpy replays of one cassette of ``steps`` steps."""
    proc = subprocess.run(
        [python, "-c", VCR_SCRIPT, api, model, str(steps), str(runs)], capture_output=True, text=True, timeout=3600
    )
    if proc.returncode != 0:
        print(f"  vcrpy failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    return [(float(wall), float(cpu)) for wall, cpu in found]


def _one_step(api: str, model: str, dataset: str, vcr_python: str | None, runs: int) -> dict[str, Any]:
    """The set-up of each contender: CPU seconds of a one-step session of the plain-httpx agent (best of ``runs``)."""
    *_, cpu = _measure(agent_http, api, model, 1, dataset, "httpx-1", runs)
    vcr = _vcr(vcr_python, api, model, 1, runs) if vcr_python else None
    return {"rerun": min(cpu), "vcrpy": min(c for _, c in vcr) if vcr else None}


def bench(steps: int, vcr_python: str | None, vcr_max: int, runs: int) -> dict[str, Any]:
    """Measure one session size; returns µs per step for each contender (best of ``runs``; lists: every run)."""
    dataset = tempfile.mkdtemp(prefix="bench-rerun-")
    with example.scripted_server() as api, example.scripted_server() as model:
        live, recorded, serve, total, _ = _measure(agent, api, model, steps, dataset, "openai", runs)
        http_live, _, http_serve, http_total, http_cpu = _measure(agent_http, api, model, steps, dataset, "httpx", runs)
        vcr = _vcr(vcr_python, api, model, steps, runs) if vcr_python and steps <= vcr_max else None
        setup = _one_step(api, model, dataset, vcr_python if vcr is not None else None, runs)
    floors = [floor(steps) for _ in range(runs)]
    per = 1e6 / steps
    return {
        "steps": steps,
        "live": live * per,
        "record": recorded * per,
        "serve": min(serve) * per,
        "total": min(total) * per,
        "http_live": http_live * per,
        "http_serve": min(http_serve) * per,
        "http_total": min(http_total) * per,
        "vcrpy": min(w for w, _ in vcr) * per if vcr is not None else None,
        "floor": min(w for w, _ in floors),
        "http_cpu": min(http_cpu) * per,
        "vcrpy_cpu": min(c for _, c in vcr) * per if vcr is not None else None,
        "floor_cpu": min(c for _, c in floors),
        "http_cpu_runs": [c * per for c in http_cpu],
        "vcrpy_cpu_runs": [c * per for _, c in vcr] if vcr is not None else None,
        "http_cpu_seconds": min(http_cpu),
        "vcrpy_cpu_seconds": min(c for _, c in vcr) if vcr is not None else None,
        "setup": setup,
    }


def _marginal(total: float, one: float | None, steps: int) -> float | None:
    """µs per further step: ``(T(N) - T(1)) / (N - 1)``, from seconds."""
    return None if one is None or steps < 2 else (total - one) * 1e6 / (steps - 1)


def matcher(steps: int) -> float:
    """µs per call spent in the rerun matcher alone (seam -> stream lookup -> popleft -> hash check), no client."""
    from otel_replay._seam import through
    from otel_replay.rerun.codec import arguments_hash
    from otel_replay.rerun.events import BoundaryCall, Event
    from otel_replay.rerun.serve import RerunMode

    calls = []
    events = []
    for i in range(steps * 5):
        stream = f"http|GET http://api/{i % 7}||"
        text = json.dumps({"method": "GET", "url": f"http://api/{i % 7}", "body": str(i)})
        calls.append(BoundaryCall("http", f"GET http://api/{i % 7}", stream=stream, arguments_text=text))
        digest = arguments_hash("http", calls[-1].name, text)
        # after=i: a sequential run, every call after all the ones before it (its order is checked)
        events.append(Event(i, "http", calls[-1].name, stream, text, digest, i, after=i))
    mode = RerunMode(events)
    from otel_replay import _seam

    previous = _seam.install(mode)
    try:
        start = time.perf_counter()
        for call in calls:
            through(call, _never)
        seconds = time.perf_counter() - start
    finally:
        _seam.install(previous)
    assert mode.divergence is None
    return seconds * 1e6 / len(calls)


def _never() -> Any:
    raise AssertionError("a served call must not run")


def main() -> None:
    """Run the benchmark and print µs per step and the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[200, 2000])
    parser.add_argument("--vcr-python", default="/work/rerun-bench-venv/bin/python")
    parser.add_argument("--vcr-max", type=int, default=400, help="vcrpy is O(n) per request: skip it above this size")
    parser.add_argument("--repeat", type=int, default=1, help="measure each size this many times, interleaved")
    parser.add_argument("--runs", type=int, default=3, help="reruns (and vcrpy replays) per size and round: best kept")
    parser.add_argument("--heavy-steps", type=int, default=1000, help="steps of the pure-Python agent (0: skip it)")
    args = parser.parse_args()
    runs = max(1, args.runs)
    vcr_python = args.vcr_python if Path(args.vcr_python).exists() else None
    if vcr_python is None:
        print(f"vcrpy: {args.vcr_python} not found, vcrpy column skipped", file=sys.stderr)
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    rows = [bench(n, vcr_python, args.vcr_max, runs) for _ in range(max(1, args.repeat)) for n in args.steps]
    heavy_cpu = heavy(args.heavy_steps, runs) if args.heavy_steps > 0 else None
    print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    print(f"otel_replay from {os.path.dirname(otel_replay.__file__)}")
    print("µs per step (clock + random + GET + POST + model call):")
    print(f"{'':>6} {'--- openai client agent ---':^45}  {'--- same calls, plain httpx ---':^45}")
    head = f"{'steps':>6} {'live':>10} {'record':>10} {'rerun':>10} {'+load':>10}  {'live':>10} {'rerun':>10}"
    print(head + f" {'+load':>10} {'vcrpy':>10} {'floor':>10}")
    for row in rows:
        vcr_text = f"{row['vcrpy']:>10.0f}" if row["vcrpy"] is not None else f"{'skipped':>10}"
        print(
            f"{row['steps']:>6} {row['live']:>10.0f} {row['record']:>10.0f} {row['serve']:>10.0f} {row['total']:>10.0f}"
            f"  {row['http_live']:>10.0f} {row['http_serve']:>10.0f} {row['http_total']:>10.0f} {vcr_text}"
            f" {row['floor']:>10.0f}"
        )
    for row in rows:
        line = f"{row['steps']} steps: rerun {row['live'] / row['serve']:.1f}x faster than live (openai agent)"
        line += f", {row['http_live'] / row['http_serve']:.1f}x (httpx agent)"
        if row["vcrpy"] is not None:
            line += f"; {row['vcrpy'] / row['http_serve']:.1f}x faster than vcrpy on the same calls"
            line += f" ({row['vcrpy'] / row['http_total']:.1f}x with loading)"
        print(line)
    print("floor: the plain-httpx calls against httpx.MockTransport (the client's own cost, nothing recorded)")
    print(f"CPU µs per step (httpx agent; load-independent): best of {runs} runs [every run]")
    print(f"{'steps':>6} {'rerun':>10} {'vcrpy':>10} {'floor':>10}  faster than vcrpy  [rerun runs] [vcrpy runs]")
    for row in rows:
        vcr_cpu = row["vcrpy_cpu"]
        shown = f"{vcr_cpu:>10.0f}" if vcr_cpu is not None else f"{'skipped':>10}"
        ratio = f"{vcr_cpu / row['http_cpu']:.1f}x" if vcr_cpu is not None else "-"
        every = " ".join(f"{c:.0f}" for c in row["http_cpu_runs"])
        vcr_every = " ".join(f"{c:.0f}" for c in row["vcrpy_cpu_runs"] or [])
        head = f"{row['steps']:>6} {row['http_cpu']:>10.0f} {shown} {row['floor_cpu']:>10.0f}"
        print(f"{head}  {ratio:>17}  [{every}] [{vcr_every}]")
    print("set-up removed (CPU µs per further step, (T(N) - T(1)) / (N - 1); T(1): a one-step session, best of runs):")
    print(f"{'steps':>6} {'set-up ms':>18} {'rerun':>10} {'vcrpy':>10}  faster than vcrpy (with medians)")
    for row in rows:
        setup, n = row["setup"], row["steps"]
        rerun_marginal = _marginal(row["http_cpu_seconds"], setup["rerun"], n)
        vcr_setup = f"{setup['vcrpy'] * 1e3:.0f}" if setup["vcrpy"] is not None else "-"
        line = f"{n:>6} {setup['rerun'] * 1e3:>11.0f} / {vcr_setup:>4} {rerun_marginal or 0:>10.0f} "
        vcr_runs = row["vcrpy_cpu_runs"]
        vcr_marginal = _marginal(row["vcrpy_cpu_seconds"], setup["vcrpy"], n) if vcr_runs else None
        if vcr_runs and vcr_marginal is not None and rerun_marginal:
            of_medians = _marginal(statistics.median(vcr_runs) * n / 1e6, setup["vcrpy"], n)
            rerun_median = _marginal(statistics.median(row["http_cpu_runs"]) * n / 1e6, setup["rerun"], n)
            median = f" ({of_medians / rerun_median:.1f}x)" if of_medians and rerun_median else ""
            line += f"{vcr_marginal:>10.0f}  {vcr_marginal / rerun_marginal:.1f}x{median}"
        else:
            line += f"{'skipped':>10}  -"
        print(line)
    for n in args.steps:
        print(f"matcher alone, {n * 5} calls: {matcher(n):.1f} µs/call")
    if heavy_cpu is not None:
        alone, again = heavy_cpu
        print(
            f"pure-Python agent, {args.heavy_steps} steps, CPU: {alone:.3f} s alone, {again:.3f} s rerun "
            f"({again / alone:.2f}x)"
        )
    if len(args.steps) > 1:
        for start in range(0, len(rows), len(args.steps)):  # each round: its smallest and largest sizes
            first, last = rows[start], rows[start + len(args.steps) - 1]
            growth, http_growth = last["serve"] / first["serve"], last["http_serve"] / first["http_serve"]
            small, large = first["steps"], last["steps"]
            up_to = _marginal(first["http_cpu_seconds"], first["setup"]["rerun"], small)
            beyond = (last["http_cpu_seconds"] - first["http_cpu_seconds"]) * 1e6 / (large - small)
            print(
                f"round {start // len(args.steps) + 1}: per-step rerun cost, {large} vs {small} steps: {growth:.2f}x "
                f"openai, {http_growth:.2f}x httpx (1.00 = flat); CPU: {last['http_cpu'] / first['http_cpu']:.2f}x "
                f"httpx; marginal CPU per step from {small} to {large}: {beyond:.0f} µs against {up_to or 0:.0f} "
                f"up to {small}: {beyond / up_to if up_to else 0:.2f}x"
            )


if __name__ == "__main__":
    main()
