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
  at 5x the step counts (flat = O(1)).

Wall time is what a user waits, but on a machine shared with other jobs it swings with their load; so the
rerun, vcrpy and the floor are also measured in CPU time (``cpu`` columns: the agent thread's CPU for the
rerun and the floor, the vcrpy process's for vcrpy; all three are single-threaded), whose ratio holds
steady when the wall-time ratio does not. The live run's CPU is not comparable (its servers are threads of
this process) and is not shown.

Usage: ``python benchmarks/bench_rerun.py [--steps 200 2000] [--vcr-max 400] [--repeat 3]`` (``--repeat``: every
size measured again, round after round, each row printed; the load average is printed before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import random
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
import json, random, sys, time, tempfile, os
import httpx, vcr
api, model, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
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
start, cpu = time.perf_counter(), time.process_time()
with vcr.use_cassette(cassette, record_mode="none"):
    replayed = run()
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
assert replayed == recorded, "vcrpy replay differs"
print(json.dumps({"seconds": seconds, "cpu": cpu}))
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
    fn: Any, api: str, model: str, steps: int, dataset: str, session: str
) -> tuple[float, float, float, float, float]:
    """(live, record, rerun serve, rerun with loading, the agent thread's CPU in the rerun) seconds for one agent."""
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
    cpu: list[float] = []

    def entrypoint() -> Any:
        began = time.thread_time()  # not a clock the rerun serves: the agent's CPU, measured from outside
        try:
            return fn(api, model, steps)
        finally:
            cpu.append(time.thread_time() - began)

    start = time.perf_counter()
    result = rerun(entrypoint, dataset=dataset, session_id=session, write=False)
    total = time.perf_counter() - start
    assert result.matched and result.output == original, result.report()
    return live, recorded, result.seconds, total, cpu[0]


def _vcr(python: str, api: str, model: str, steps: int) -> tuple[float, float] | None:
    proc = subprocess.run(
        [python, "-c", VCR_SCRIPT, api, model, str(steps)], capture_output=True, text=True, timeout=3600
    )
    if proc.returncode != 0:
        print(f"  vcrpy failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    return float(found["seconds"]), float(found["cpu"])


def bench(steps: int, vcr_python: str | None, vcr_max: int) -> dict[str, Any]:
    """Measure one session size; returns µs per step for each contender."""
    dataset = tempfile.mkdtemp(prefix="bench-rerun-")
    with example.scripted_server() as api, example.scripted_server() as model:
        live, recorded, serve, total, _ = _measure(agent, api, model, steps, dataset, "openai")
        http_live, _, http_serve, http_total, http_cpu = _measure(agent_http, api, model, steps, dataset, "httpx")
        vcr = _vcr(vcr_python, api, model, steps) if vcr_python and steps <= vcr_max else None
    client_floor, floor_cpu = floor(steps)
    per = 1e6 / steps
    return {
        "steps": steps,
        "live": live * per,
        "record": recorded * per,
        "serve": serve * per,
        "total": total * per,
        "http_live": http_live * per,
        "http_serve": http_serve * per,
        "http_total": http_total * per,
        "vcrpy": vcr[0] * per if vcr is not None else None,
        "floor": client_floor,
        "http_cpu": http_cpu * per,
        "vcrpy_cpu": vcr[1] * per if vcr is not None else None,
        "floor_cpu": floor_cpu,
    }


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
    args = parser.parse_args()
    vcr_python = args.vcr_python if Path(args.vcr_python).exists() else None
    if vcr_python is None:
        print(f"vcrpy: {args.vcr_python} not found, vcrpy column skipped", file=sys.stderr)
    print("load average at start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    rows = [bench(n, vcr_python, args.vcr_max) for _ in range(max(1, args.repeat)) for n in args.steps]
    print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
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
    print("CPU µs per step (httpx agent; load-independent):")
    print(f"{'steps':>6} {'rerun':>10} {'vcrpy':>10} {'floor':>10}  rerun faster than vcrpy")
    for row in rows:
        vcr_cpu = row["vcrpy_cpu"]
        shown = f"{vcr_cpu:>10.0f}" if vcr_cpu is not None else f"{'skipped':>10}"
        ratio = f"{vcr_cpu / row['http_cpu']:.1f}x" if vcr_cpu is not None else "-"
        print(f"{row['steps']:>6} {row['http_cpu']:>10.0f} {shown} {row['floor_cpu']:>10.0f}  {ratio}")
    for n in args.steps:
        print(f"matcher alone, {n * 5} calls: {matcher(n):.1f} µs/call")
    if len(args.steps) > 1:
        first, last = rows[0], rows[len(args.steps) - 1]  # the first round's smallest and largest sizes
        growth, http_growth = last["serve"] / first["serve"], last["http_serve"] / first["http_serve"]
        print(
            f"per-step rerun cost, {last['steps']} vs {first['steps']} steps: {growth:.2f}x openai, "
            f"{http_growth:.2f}x httpx (1.00 = flat); CPU: {last['http_cpu'] / first['http_cpu']:.2f}x httpx"
        )


if __name__ == "__main__":
    main()
