"""What ``govern()`` adds to one model call: 10 contracts loaded, 3 tool calls per response, each one checked.

Run:

    .venv/bin/python benchmarks/bench_govern.py [--calls 300] [--rounds 3]

One process, the real ``openai`` client. Four ways of making the same ``chat.completions.create`` call
alternate over the rounds (machine noise spread across them): the bare client, the client governed by
``govern()``, the client under the OpenAIInstrumentor alone, and the instrumented client governed. The
response (three tool calls, all allowed by the contracts) comes from an in-memory transport, so the figures
are the libraries' own time; ``--server`` uses the scripted local server instead (a real loopback round trip,
noisier: the server thread shares the GIL). Governed calls keep their state in a MemoryStateStore and write
one decision span each to a TracerProvider whose exporter keeps nothing. Each call is timed in CPU time of
the calling thread (all of the call's work runs there), so a loaded machine slows the figures less than
wall time would. Prints the median µs per call, what govern adds over the bare call and over the
instrumentor alone, and asserts nothing.
Target (issue 22): under 200 µs added per call.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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


def _httpx() -> Any:
    """The openai client's own HTTP library (openai 3 ships on ``httpx2``)."""
    try:
        import httpx2

        return httpx2
    except ImportError:
        import httpx

        return httpx


def _null_provider() -> Any:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class Null(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Null()))
    return provider


def main(calls: int, rounds: int, server: bool) -> None:
    """Time each way of calling, ``rounds`` times ``calls`` calls, and print the figures."""
    import openai

    from otel_replay.contracts.session import govern
    from otel_replay.contracts.store import MemoryStateStore
    from otel_replay.instrumentation import OpenAIInstrumentor, scripted

    httpx = _httpx()
    provider = _null_provider()
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

    def timed(fn: Callable[[], Any]) -> float:
        for _ in range(min(30, calls)):
            fn()
        times = []
        for _ in range(calls):
            start = time.thread_time_ns()
            fn()
            times.append(time.thread_time_ns() - start)
        return statistics.median(times) / 1000

    results: dict[str, list[float]] = {"bare": [], "govern": [], "instrumentor": [], "instrumentor + govern": []}
    instrumentor = OpenAIInstrumentor()
    for _ in range(rounds):
        results["bare"].append(timed(call(bare)))
        results["govern"].append(timed(call(governed)))
        instrumentor.instrument(tracer_provider=provider)
        try:
            results["instrumentor"].append(timed(call(bare)))
            results["instrumentor + govern"].append(timed(call(governed)))
        finally:
            instrumentor.uninstrument()
    if live is not None:
        live.stop()

    where = "scripted server on loopback" if server else "in-memory transport"
    print(f"govern() per call: {calls} calls x {rounds} rounds, {where}, 10 contracts, 3 tool calls per response")
    figures = {name: statistics.median(values) for name, values in results.items()}
    for name, value in figures.items():
        spread = ", ".join(f"{v:.1f}" for v in results[name])
        print(f"  {name:<22} {value:9.1f} µs CPU  (rounds: {spread})")
    added = figures["govern"] - figures["bare"]
    beyond = figures["instrumentor + govern"] - figures["instrumentor"]
    print(
        f"  govern adds            {added:9.1f} µs per call ({figures['govern'] / figures['bare']:.2f}x the bare call)"
    )
    print(f"  beyond the instrumentor{beyond:9.1f} µs per call")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--server", action="store_true", help="the scripted local server instead of memory")
    options = parser.parse_args()
    main(options.calls, options.rounds, options.server)
