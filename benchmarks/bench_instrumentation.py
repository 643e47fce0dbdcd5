"""Per-call overhead of the OpenAI instrumentor vs no instrumentation and vs the instrumentations users pick today.

Run (peers live in a separate venv, never in the project's own):

    python3 -m venv /work/bench-venv
    /work/bench-venv/bin/pip install -e /work/main openai opentelemetry-instrumentation-openai-v2 \\
        opentelemetry-instrumentation-openai openinference-instrumentation-openai
    /work/bench-venv/bin/python benchmarks/bench_instrumentation.py [--calls 300] [--rounds 3]

Each mode runs in its own subprocess (some instrumentors cannot be removed
cleanly), against the same local scripted OpenAI-compatible server, with the
same SDK pipeline (TracerProvider + SimpleSpanProcessor + a null exporter)
and content capture off. Modes alternate over several rounds so machine noise
is spread across them. A peer that is not installed is skipped. Prints
µs per call, µs added per call over the uninstrumented call, and ratios;
asserts nothing. Target (issue 7): under 50 µs added per call and per stream,
under a third of the best peer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

MODES: dict[str, str] = {
    "none": "uninstrumented",
    "otel_replay": "otel-replay OpenAIInstrumentor",
    "openai_v2": "opentelemetry-instrumentation-openai-v2 (official)",
    "openllmetry": "opentelemetry-instrumentation-openai (OpenLLMetry)",
    "openinference": "openinference-instrumentation-openai",
}

KINDS = ("server/plain", "server/stream", "memory/plain", "memory/stream")

QUIET_CONTENT = {
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "false",
    "TRACELOOP_TRACE_CONTENT": "false",
    "OPENINFERENCE_HIDE_INPUTS": "true",
    "OPENINFERENCE_HIDE_OUTPUTS": "true",
    "OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental",
}


def _instrumentor(mode: str) -> Any:
    if mode == "otel_replay":
        from otel_replay.instrumentation import OpenAIInstrumentor

        return OpenAIInstrumentor()
    if mode == "openai_v2":
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor as V2

        return V2()
    if mode == "openllmetry":
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor as Traceloop

        return Traceloop()
    if mode == "openinference":
        from openinference.instrumentation.openai import OpenAIInstrumentor as OpenInference

        return OpenInference()
    return None


def available(mode: str) -> bool:
    """Whether ``mode``'s instrumentor can be imported here."""
    try:
        _instrumentor(mode)
    except ImportError:
        return False
    return True


def worker(mode: str, calls: int, blocks: int) -> dict[str, list[float]]:
    """Run in a child process: time plain and streamed chat calls under ``mode``; µs per call per block."""
    import openai

    try:  # the openai client's own HTTP library (openai 3 ships on httpx2)
        import httpx2 as httpx
    except ImportError:
        import httpx
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    from otel_replay.instrumentation import scripted

    class Null(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Null()))
    trace.set_tracer_provider(provider)
    instrumentor = _instrumentor(mode)
    if instrumentor is not None:
        instrumentor.instrument(tracer_provider=provider)
    plain_reply = scripted.chat_completion("ok")
    stream_reply = scripted.chat_stream(["a", "b", "c"], usage=(3, 2))
    plain_server = scripted.ScriptedServer(default=plain_reply, keep=False).start()
    stream_server = scripted.ScriptedServer(default=stream_reply, keep=False).start()
    messages = [{"role": "user", "content": "hello"}]

    def in_memory(reply: scripted.Reply) -> Any:
        body, kind = scripted.encode(reply)
        return httpx.Client(
            transport=httpx.MockTransport(
                lambda request: httpx.Response(200, content=body, headers={"content-type": kind})
            )
        )

    clients = {
        ("server", "plain"): openai.OpenAI(base_url=plain_server.base_url, api_key="sk-bench", max_retries=0),
        ("server", "stream"): openai.OpenAI(base_url=stream_server.base_url, api_key="sk-bench", max_retries=0),
        ("memory", "plain"): openai.OpenAI(
            base_url="http://memory/v1", api_key="sk-bench", max_retries=0, http_client=in_memory(plain_reply)
        ),
        ("memory", "stream"): openai.OpenAI(
            base_url="http://memory/v1", api_key="sk-bench", max_retries=0, http_client=in_memory(stream_reply)
        ),
    }

    def call(client: Any, kind: str) -> None:
        if kind == "plain":
            client.chat.completions.create(model="gpt-bench", messages=messages)
            return
        stream = client.chat.completions.create(
            model="gpt-bench", messages=messages, stream=True, stream_options={"include_usage": True}
        )
        for _ in stream:
            pass

    def timed(client: Any, kind: str) -> list[float]:
        for _ in range(min(50, calls)):
            call(client, kind)
        medians = []
        for _ in range(blocks):
            times = []
            for _ in range(calls):
                start = time.perf_counter_ns()
                call(client, kind)
                times.append(time.perf_counter_ns() - start)
            medians.append(statistics.median(times) / 1000)
        return medians

    try:
        return {f"{where}/{kind}": timed(client, kind) for (where, kind), client in clients.items()}
    finally:
        for client in clients.values():
            client.close()
        plain_server.stop()
        stream_server.stop()


def run_mode(mode: str, calls: int, blocks: int) -> dict[str, list[float]]:
    """One child process for ``mode``."""
    env = {**os.environ, **QUIET_CONTENT}
    done = subprocess.run(
        [sys.executable, __file__, "--worker", mode, "--calls", str(calls), "--blocks", str(blocks)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments; run the workers (or be one); print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per timed block")
    parser.add_argument("--blocks", type=int, default=3, help="timed blocks per mode per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (modes alternate within a round)")
    parser.add_argument("--worker", choices=sorted(MODES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.calls, args.blocks)))
        return 0

    modes = [m for m in MODES if available(m)]
    skipped = [m for m in MODES if m not in modes]
    print(f"python: {sys.executable}")
    if skipped:
        print("not installed here, skipped: " + ", ".join(MODES[m] for m in skipped))
    samples: dict[str, dict[str, list[float]]] = {m: {k: [] for k in KINDS} for m in modes}
    for round_no in range(args.rounds):
        for mode in modes:
            result = run_mode(mode, args.calls, args.blocks)
            for kind in KINDS:
                samples[mode][kind].extend(result[kind])
        print(f"round {round_no + 1}/{args.rounds} done", file=sys.stderr)

    per_call = {m: {k: statistics.median(v) for k, v in samples[m].items()} for m in modes}
    base = per_call["none"]
    added = {m: {k: per_call[m][k] - base[k] for k in KINDS} for m in modes}
    print(f"\n{args.rounds} rounds x {args.blocks} blocks x {args.calls} calls per mode and kind;")
    print("µs per call (median of per-block medians) and µs added over the uninstrumented call.")
    print("server = the local scripted HTTP server; memory = httpx.MockTransport (no socket, least noise)")
    header = "".join(f"{k:>15} {'added':>7}" for k in KINDS)
    print(f"{'mode':<52}{header}")
    for m in modes:
        cells = "".join(f"{per_call[m][k]:>15.1f} {added[m][k]:>+7.1f}" for k in KINDS)
        print(f"{MODES[m]:<52}{cells}")
    peers = [m for m in modes if m not in ("none", "otel_replay")]
    if "otel_replay" in modes and peers:
        print("\nadded cost, peer / otel-replay (higher = otel-replay cheaper):")
        for kind in KINDS:
            ours = max(added["otel_replay"][kind], 0.1)
            cells = ", ".join(f"{m} {added[m][kind] / ours:.1f}x" for m in peers)
            best = min(peers, key=lambda m: added[m][kind])
            share = added["otel_replay"][kind] / added[best][kind] if added[best][kind] > 0 else float("nan")
            print(f"  {kind:<14}: {cells}; ours = {share:.2f} of the best peer ({best})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
