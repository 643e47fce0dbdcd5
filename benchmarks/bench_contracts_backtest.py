"""The contracts backtest and drafting over recorded sessions: how long reading, checking and drafting take.

Run: python benchmarks/bench_contracts_backtest.py [--sessions N] [--rounds N]

Records ``--sessions`` refund-bot sessions (five model calls each: look the customer up, search orders
twice, check eligibility, refund; then a text answer) with the real ``openai`` client against the local
scripted server, through ``configure()`` and the OpenAI instrumentor with content capture on, one in
ten with a second refund. Then, best of ``--rounds``, in wall milliseconds for all the sessions:

* ``read``: ``recorded_sessions`` (``queries/contract_tool_calls.sql`` and the grouping into sessions);
* ``check``: ``backtest`` of the read sessions through the example's refund-bot contracts;
* ``infer``: ``infer_contracts`` of the read sessions;
* peer ``scan``: ``SELECT * FROM model_calls`` over the same store, the floor any reading of the tool
  calls pays.

Prints figures and ratios; asserts nothing but that the second refunds were flagged.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai

import otel_replay
from otel_replay.contracts.backtest import backtest
from otel_replay.contracts.infer import infer_contracts
from otel_replay.contracts.loader import load_contracts
from otel_replay.contracts.recorded import recorded_sessions
from otel_replay.instrumentation import OpenAIInstrumentor, scripted, tool

CONTRACTS = Path(__file__).resolve().parents[1] / "examples" / "refund_bot" / "contracts"


def _steps(number: int) -> list[list[tuple[str, dict[str, Any]]]]:
    order = f"ORD-{1000 + number}"
    refund = {"customer_id": "C42", "amount": 10.0 + number % 50, "currency": "USD"}
    steps = [
        [("lookup_customer", {"customer_email": f"user{number}@example.com"})],
        [("check_eligibility", {"order_id": order})],
        [("issue_refund", refund)],
    ]
    if number % 10 == 0:
        steps.append([("issue_refund", refund)])  # a second refund: the backtest must flag it
    return steps


def record(dataset: Path, sessions: int) -> None:
    """Record the sessions into ``dataset`` (each tool a ``@tool``, so its result is a span)."""
    telemetry = otel_replay.configure(dataset, service_name="bench-backtest", set_global=False)
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=telemetry.provider, capture_content=True)
    results = {
        "lookup_customer": lambda customer_email: {"customer_id": "C42"},
        "check_eligibility": lambda order_id: {"eligible": True},
        "issue_refund": lambda customer_id, amount, currency: {"refund_id": "R1"},
    }
    tools = {
        name: tool(name, capture_content=True, tracer_provider=telemetry.provider)(fn) for name, fn in results.items()
    }
    plans = [_steps(number) for number in range(sessions)]
    replies = []
    for plan in plans:
        for index, step in enumerate(plan):
            calls = [(f"call_{index}", name, arguments) for name, arguments in step]
            replies.append(scripted.chat_completion(None, tool_calls=calls, model="gpt-4o-mini"))
        replies.append(scripted.chat_completion("done", model="gpt-4o-mini"))
    try:
        with (
            scripted.ScriptedServer(replies, keep=False) as server,
            openai.OpenAI(base_url=server.base_url, api_key="sk-bench", max_retries=0) as client,
        ):
            for number, plan in enumerate(plans):
                with otel_replay.session(f"s{number:05d}"):
                    for _ in range(len(plan) + 1):
                        reply = client.chat.completions.create(model="gpt-4o-mini", messages=[])
                        for call in reply.choices[0].message.tool_calls or ():
                            tools[call.function.name](**json.loads(call.function.arguments))
    finally:
        instrumentor.uninstrument()
        telemetry.shutdown()


def best(rounds: int, work: Callable[[], Any]) -> tuple[float, Any]:
    """The fastest of ``rounds`` runs of ``work`` in wall milliseconds, and its last result."""
    fastest, result = float("inf"), None
    for _ in range(rounds):
        started = time.perf_counter()
        result = work()
        fastest = min(fastest, (time.perf_counter() - started) * 1000)
    return fastest, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    os.environ.setdefault("OTEL_REPLAY_SIGNING_KEY", "bench-backtest-signing-key-0123456789")
    contracts = load_contracts(CONTRACTS)
    with tempfile.TemporaryDirectory() as tmp:
        dataset = Path(tmp) / "traces"
        started = time.perf_counter()
        record(dataset, options.sessions)
        print(f"recorded {options.sessions} sessions in {time.perf_counter() - started:.1f} s")
        with otel_replay.open(dataset) as store:
            scan, rows = best(options.rounds, lambda: store.rows("SELECT * FROM model_calls"))
            read, sessions = best(options.rounds, lambda: recorded_sessions(store))
        check, report = best(options.rounds, lambda: backtest(contracts, sessions))
        infer, _ = best(options.rounds, lambda: infer_contracts(sessions))
    calls = sum(len(s.calls) for s in sessions)
    flagged = [s.session_id for s in report.sessions if not s.passed]
    assert len(flagged) == len(range(0, options.sessions, 10)), flagged
    count = max(options.sessions, 1)
    print(f"{len(sessions)} sessions, {len(rows)} model calls, {calls} tool calls; {len(flagged)} flagged")
    print(f"scan  (peer: SELECT * FROM model_calls) {scan:9.1f} ms")
    for label, took in (
        ("read  (contract_tool_calls + grouping)", read),
        ("check (backtest through the engine)   ", check),
        ("infer (drafting)                      ", infer),
    ):
        print(f"{label}  {took:9.1f} ms  {took / count:7.3f} ms/session  {took / scan:5.2f}x scan")
    return 0


if __name__ == "__main__":
    sys.exit(main())
