"""Per-call overhead of the OpenAI instrumentor vs no instrumentation and vs the instrumentations users pick today.

Run (peers live in a separate venv, never in the project's own):

    python3 -m venv /work/bench-venv
    /work/bench-venv/bin/pip install -e /work/main openai opentelemetry-instrumentation-openai-v2 \\
        opentelemetry-instrumentation-openai openinference-instrumentation-openai
    /work/bench-venv/bin/python benchmarks/bench_instrumentation.py [--calls 300] [--rounds 3]
    .venv/bin/python benchmarks/bench_instrumentation.py --micro [--batch 200] [--micro-blocks 25]
    git archive s5-start otel_replay | tar -x -C BASE_DIR
    .venv/bin/python benchmarks/bench_instrumentation.py --micro --base BASE_DIR [--pairs 3] [--cpu]

Each mode runs in its own subprocess (some instrumentors cannot be removed
cleanly), against the same local scripted OpenAI-compatible server, with the
same SDK pipeline (TracerProvider + SimpleSpanProcessor + a null exporter)
and content capture off. Modes alternate over several rounds so machine noise
is spread across them. A peer that is not installed is skipped. Prints
µs per call, µs added per call over the uninstrumented call, and ratios;
asserts nothing. ``--micro`` instead times, in this process, the wrapped call
against a pre-built response and an in-memory transport, min and median of
many blocks, next to a bare SDK span with the same attributes (the floor).
``--micro --base DIR`` runs that micro measurement in subprocesses, in turn
with this tree's ``otel_replay`` and with the one under ``DIR`` (another
version's source), and prints the added cost of each and their ratio.
The ``server`` columns are the noisiest: the scripted server is a thread of
the worker process and shares its GIL, so on a busy machine they swing by
hundreds of µs between identical runs; ``memory`` and ``--micro`` do not.
Target (issue 7): under 50 µs added per call and per stream,
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



def _httpx() -> Any:
    """The openai client's own HTTP library (openai 3 ships on ``httpx2``)."""
    try:
        import httpx2

        return httpx2
    except ImportError:
        import httpx

        return httpx


def _null_provider() -> Any:
    """An SDK provider whose spans go through a SimpleSpanProcessor to an exporter that keeps nothing."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class Null(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Null()))
    return provider


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

    httpx = _httpx()
    from opentelemetry import trace

    from otel_replay.instrumentation import scripted

    provider = _null_provider()
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


# --- micro: in-process, min-of-N ----------------------------------------------------------------

MICRO_MODES: dict[str, str] = {
    "none": "uninstrumented",
    "otel_replay": "otel-replay OpenAIInstrumentor",
    "floor": "bare SDK span, same attributes (the floor)",
}
MICRO_KINDS = ("prebuilt/plain", "prebuilt/stream", "transport/plain", "transport/stream")


def micro(batch: int, blocks: int, warmup: int, cpu: bool = False) -> dict[str, dict[str, list[float]]]:
    """Time the wrapped ``chat.completions.create`` in this process: µs per call per timed block.

    ``prebuilt``: the client's ``post`` hands back a completion (or a fresh
    iterator over six pre-built chunks) built once up front, so what is timed is
    the SDK's request building plus the instrumentation; ``transport``: the
    full client over an in-memory ``MockTransport`` (no socket). The modes
    alternate block by block; the instrumentor is installed for its blocks and
    removed after, the floor opens one plain SDK span per call around the
    uninstrumented call and sets on it the attributes ours records. ``cpu``:
    time this process's CPU (``time.process_time_ns``) instead of the wall clock,
    which on a saturated machine counts the waits for a core as well.
    """
    import openai
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    httpx = _httpx()
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    from otel_replay.instrumentation import OpenAIInstrumentor, scripted

    provider = _null_provider()
    tracer = provider.get_tracer("bench.floor")
    plain_reply = scripted.chat_completion("ok")
    stream_reply = scripted.chat_stream(["a", "b", "c"], usage=(3, 2))
    completion = ChatCompletion.model_validate(plain_reply.body)
    chunks = [ChatCompletionChunk.model_validate(data) for _, data in stream_reply.events or () if data != "[DONE]"]
    assert len(chunks) == 6, len(chunks)

    class Prebuilt(openai.OpenAI):
        def post(self, path: str, *, stream: bool = False, **kwargs: Any) -> Any:  # type: ignore[override]
            return iter(chunks) if stream else completion

    def in_memory(reply: scripted.Reply) -> Any:
        body, kind = scripted.encode(reply)
        return httpx.Client(
            transport=httpx.MockTransport(
                lambda request: httpx.Response(200, content=body, headers={"content-type": kind})
            )
        )

    options: dict[str, Any] = {"base_url": "http://memory/v1", "api_key": "sk-bench", "max_retries": 0}
    clients = {
        "prebuilt/plain": Prebuilt(**options),
        "prebuilt/stream": Prebuilt(**options),
        "transport/plain": openai.OpenAI(**options, http_client=in_memory(plain_reply)),
        "transport/stream": openai.OpenAI(**options, http_client=in_memory(stream_reply)),
    }
    messages = [{"role": "user", "content": "hello"}]

    def plain(client: Any) -> None:
        client.chat.completions.create(model="gpt-bench", messages=messages)

    def streamed(client: Any) -> None:
        stream = client.chat.completions.create(
            model="gpt-bench", messages=messages, stream=True, stream_options={"include_usage": True}
        )
        for _ in stream:
            pass

    # the floor's attributes: exactly the ones ours records, split into known-at-start and known-at-end
    def ours_attributes(kind: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
        memory = InMemorySpanExporter()
        probe = TracerProvider()
        probe.add_span_processor(SimpleSpanProcessor(memory))
        instrumentor = OpenAIInstrumentor()
        instrumentor.instrument(tracer_provider=probe, capture_content=False)
        try:
            (plain if kind.endswith("plain") else streamed)(clients[kind])
        finally:
            instrumentor.uninstrument()
        (span,) = memory.get_finished_spans()
        attrs = dict(span.attributes or {})
        late = {k: v for k, v in attrs.items() if k.startswith(("gen_ai.response.", "gen_ai.usage.", "replay.stream"))}
        early = {k: v for k, v in attrs.items() if k not in late}
        return span.name, early, late

    floor_attrs = {kind: ours_attributes(kind) for kind in MICRO_KINDS}

    def floor(kind: str, inner: Any) -> Any:
        name, early, late = floor_attrs[kind]

        def run(client: Any) -> None:
            with tracer.start_as_current_span(name, kind=SpanKind.CLIENT, attributes=early) as span:
                inner(client)
                span.set_attributes(late)

        return run

    instrumentor = OpenAIInstrumentor()
    clock = time.process_time_ns if cpu else time.perf_counter_ns
    samples: dict[str, dict[str, list[float]]] = {m: {k: [] for k in MICRO_KINDS} for m in MICRO_MODES}
    for kind in MICRO_KINDS:
        client = clients[kind]
        inner = plain if kind.endswith("plain") else streamed
        runs = {"none": inner, "otel_replay": inner, "floor": floor(kind, inner)}
        for block in range(blocks + 1):  # block 0 is the warmup
            for mode in MICRO_MODES:
                if mode == "otel_replay":
                    instrumentor.instrument(tracer_provider=provider, capture_content=False)
                fn = runs[mode]
                try:
                    count = warmup if block == 0 else batch
                    start = clock()
                    for _ in range(count):
                        fn(client)
                    elapsed = clock() - start
                finally:
                    if mode == "otel_replay":
                        instrumentor.uninstrument()
                if block:
                    samples[mode][kind].append(elapsed / batch / 1000)
    for client in clients.values():
        client.close()
    return samples


def print_micro(samples: dict[str, dict[str, list[float]]], batch: int, blocks: int) -> None:
    """The micro table: min and median µs per call, and µs added over the uninstrumented call."""
    print(f"micro: {blocks} blocks x {batch} calls per mode and kind, modes alternating block by block")
    print("µs per call: min (median) over blocks; added = over the uninstrumented call, min (median)")
    for kind in MICRO_KINDS:
        print(f"\n  {kind}")
        base_min = min(samples["none"][kind])
        base_med = statistics.median(samples["none"][kind])
        for mode, label in MICRO_MODES.items():
            lo, mid = min(samples[mode][kind]), statistics.median(samples[mode][kind])
            added = "" if mode == "none" else f"   added {lo - base_min:+7.1f} ({mid - base_med:+7.1f})"
            print(f"    {label:<46}{lo:>9.1f} ({mid:>9.1f}){added}")
        ours = min(samples["otel_replay"][kind]) - base_min
        floor = min(samples["floor"][kind]) - base_min
        print(f"    ours over the floor: {ours - floor:+.1f} µs")


def compare_with_base(base: str, pairs: int, batch: int, blocks: int, cpu: bool = False) -> int:
    """``--micro`` for this tree and for ``base`` in alternating subprocesses; the added costs side by side."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"this tree": here, "base": os.path.abspath(base)}
    samples: dict[str, dict[str, dict[str, list[float]]]] = {}
    for pair in range(pairs):
        for label, root in trees.items():
            env = {**os.environ, "PYTHONPATH": root}
            command = [sys.executable, os.path.abspath(__file__), "--micro", "--micro-json"]
            command += ["--batch", str(batch), "--micro-blocks", str(blocks)] + (["--cpu"] if cpu else [])
            out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
            for mode, kinds in json.loads(out.strip().splitlines()[-1]).items():
                for kind, values in kinds.items():
                    samples.setdefault(label, {}).setdefault(mode, {}).setdefault(kind, []).extend(values)
        print(f"pair {pair + 1}/{pairs} done", file=sys.stderr)
    for label, root in trees.items():
        print(f"\n== {label}: {root}")
        print_micro(samples[label], batch, blocks * pairs)
    print("\nadded over the uninstrumented call, min over blocks: this tree / base")
    for kind in MICRO_KINDS:
        added = {}
        for label in trees:
            found = samples[label]
            added[label] = min(found["otel_replay"][kind]) - min(found["none"][kind])
        ratio = added["this tree"] / added["base"] if added["base"] > 0 else float("nan")
        print(f"  {kind:<12} {added['this tree']:+7.1f} µs / {added['base']:+7.1f} µs = {ratio:.2f}x")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments; run the workers (or be one); print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per timed block")
    parser.add_argument("--blocks", type=int, default=3, help="timed blocks per mode per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (modes alternate within a round)")
    parser.add_argument("--worker", choices=sorted(MODES), help=argparse.SUPPRESS)
    parser.add_argument("--micro", action="store_true", help="in-process min-of-N timing: none / ours / floor")
    parser.add_argument("--batch", type=int, default=200, help="--micro: calls per timed block")
    parser.add_argument("--micro-blocks", type=int, default=25, help="--micro: timed blocks per mode and kind")
    parser.add_argument("--base", help="--micro: a source tree of another version, measured in turn with this one")
    parser.add_argument("--pairs", type=int, default=3, help="--base: alternations of this tree and the base")
    parser.add_argument("--cpu", action="store_true", help="--micro: time process CPU, not the wall clock")
    parser.add_argument("--micro-json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.micro and args.micro_json:
        print(json.dumps(micro(args.batch, args.micro_blocks, warmup=args.batch, cpu=args.cpu)))
        return 0
    if args.micro and args.base:
        return compare_with_base(args.base, args.pairs, args.batch, args.micro_blocks, cpu=args.cpu)
    if args.micro:
        print(f"python: {sys.executable}")
        samples = micro(args.batch, args.micro_blocks, warmup=args.batch, cpu=args.cpu)
        print_micro(samples, args.batch, args.micro_blocks)
        return 0
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
