"""Recording agent sessions for the backtest and inference tests: the real ``openai`` client, a scripted server.

Each session is a list of steps; each step is the tool calls one model response
asks for (``(tool, arguments)``; arguments a dict, or a str sent as is). The
agent runs each call through a ``@tool``-decorated executor, so its
``execute_tool`` span carries the result, and sends the results back in the
next request, as a tool-calling agent does. Everything goes through
``configure()`` into a Parquet dataset, with content capture on (or off).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import openai
import pytest

import otel_replay
from otel_replay.instrumentation import OpenAIInstrumentor, scripted, tool
from tests._support import TEST_KEY

Call = tuple[str, Any]
Step = Sequence[Call]


class ToolFailed(Exception):
    """What a scripted tool raises (the tool named ``broken_*`` always does)."""


def _refund_results(name: str, arguments: Mapping[str, Any]) -> Any:
    """What the refund bot's tools return (the eligibility check says no for order ORD-0)."""
    if name.startswith("broken"):
        raise ToolFailed(f"{name} is down")
    if name == "lookup_customer":
        return {"customer_id": "C1", "name": "Ada"}
    if name == "check_eligibility":
        return {"eligible": arguments.get("order_id") != "ORD-0", "reason": "delivered"}
    if name == "issue_refund":
        return {"refund_id": "R-1", "status": "processed"}
    return {"ok": True}


def record(
    dataset: Path,
    sessions: Mapping[str, Sequence[Step]],
    *,
    capture: bool = True,
    results: Callable[[str, Mapping[str, Any]], Any] = _refund_results,
    side_effects: Mapping[str, str] | None = None,
    model: str = "gpt-4o-mini",
    correlation: bool = False,
) -> None:
    """Record ``sessions`` (id -> steps) into ``dataset``, each ending with a text-only answer.

    ``correlation``: the ids are correlation ids (``otel_replay.correlation``), not session ids.
    """
    telemetry = otel_replay.configure(dataset, service_name="refund-bot", set_global=False)
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=telemetry.provider, capture_content=capture)
    executors: dict[tuple[str, tuple[str, ...]], Callable[..., Any]] = {}

    def executor(name: str, keys: tuple[str, ...]) -> Callable[..., Any]:
        if (name, keys) not in executors:

            def run(**arguments: Any) -> Any:
                return results(name, arguments)

            # the tool span records the arguments by the function's parameters: give it the call's own
            run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
                [inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY) for key in keys]
            )
            executors[name, keys] = tool(
                name,
                side_effect=(side_effects or {}).get(name),
                capture_content=capture,
                tracer_provider=telemetry.provider,
            )(run)
        return executors[name, keys]

    try:
        replies = []
        for steps in sessions.values():
            for number, step in enumerate(steps):
                calls = [(f"call_{number}_{i}", name, args) for i, (name, args) in enumerate(step)]
                replies.append(scripted.chat_completion(None, tool_calls=calls, model=model, usage=(100, 20)))
            replies.append(scripted.chat_completion("done", model=model, usage=(100, 5)))
        with (
            scripted.ScriptedServer(replies) as server,
            openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0) as client,
        ):
            for session_id, steps in sessions.items():
                scope = (
                    otel_replay.correlation(session_id)
                    if correlation
                    else otel_replay.session(session_id, agent_id="refund-bot")
                )
                with scope:
                    messages: list[Any] = [{"role": "user", "content": "refund order"}]
                    for _ in range(len(steps) + 1):
                        reply = client.chat.completions.create(model=model, messages=messages)
                        message = reply.choices[0].message
                        messages.append(message.model_dump(exclude_none=True))
                        for call in message.tool_calls or ():
                            try:
                                arguments = json.loads(call.function.arguments)
                            except ValueError:
                                arguments = None
                            output: Any = None
                            try:
                                if isinstance(arguments, dict) and all(k.isidentifier() for k in arguments):
                                    output = executor(call.function.name, tuple(arguments))(**arguments)
                            except ToolFailed as exc:
                                output = {"error": str(exc)}
                            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(output)})
    finally:
        instrumentor.uninstrument()
        telemetry.shutdown()


def refund_session(amount: float = 40.0, *, email: str = "ada@example.com", order: str = "ORD-1") -> list[Step]:
    """The seed's refund workflow, one tool per step."""
    return [
        [("lookup_customer", {"customer_email": email})],
        [("check_eligibility", {"order_id": order})],
        [("issue_refund", {"customer_id": "C1", "order_id": order, "amount": amount, "currency": "USD"})],
    ]


def recorded_dataset(
    factory: pytest.TempPathFactory, name: str, sessions: Mapping[str, Sequence[Step]], **options: Any
) -> Path:
    """A dataset of ``sessions`` recorded once for a module's tests, with the tests' signing key and home."""
    path = factory.mktemp(name) / "traces"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_REPLAY_SIGNING_KEY", TEST_KEY)
        mp.setenv("HOME", str(factory.mktemp(f"{name}-home")))
        mp.delenv("OTEL_REPLAY_KEY_FILE", raising=False)
        mp.delenv("OTEL_REPLAY_DATASET", raising=False)
        record(path, sessions, **options)
    return path
