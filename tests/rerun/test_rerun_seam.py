"""Model and tool calls through the instrumentation's seam: recorded once, served in the rerun, tools not run again."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

import otel_replay
from otel_replay import Action, ActionGate, DependencySnapshot, ReferenceLedger
from otel_replay.errors import ReplayMismatchError
from otel_replay.instrumentation.openai_client import OpenAIInstrumentor
from otel_replay.instrumentation.tools import tool
from otel_replay.rerun import rerun

from .conftest import agent, record

SIDE_EFFECTS: list[str] = []
LEDGER = ReferenceLedger(balance=1_000)


@tool(side_effect="write")
def lookup(symbol: str) -> dict[str, Any]:
    """A tool with a side effect the rerun must not repeat."""
    SIDE_EFFECTS.append(symbol)
    return {"symbol": symbol, "seen": len(SIDE_EFFECTS)}


@tool(side_effect="financial", gate=ActionGate(LEDGER), snapshot=DependencySnapshot({"budget": 1_000}))
def pay(amount: float) -> Action:
    """A gated tool: the rail commits, and the rerun gets the recorded receipt back."""
    return Action("pay", {"to": "acme"}, cost=amount)


@tool
async def alookup(symbol: str) -> dict[str, Any]:
    """The async form."""
    SIDE_EFFECTS.append(f"async:{symbol}")
    return {"symbol": symbol, "async": True}


@pytest.fixture
def instrumented() -> Iterator[None]:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    try:
        yield
    finally:
        instrumentor.uninstrument()


def _agent(model: str) -> dict[str, Any]:
    llm = openai.OpenAI(base_url=f"{model}/v1", api_key="sk-test-0123456789abcdefghij", max_retries=0)
    answer = llm.chat.completions.create(model="m", messages=[{"role": "user", "content": "which?"}])
    found = lookup(answer.choices[0].message.content or "")
    receipt = pay(12.5)
    extra = asyncio.run(alookup("x"))
    return {"answer": answer.choices[0].message.content, "found": found, "receipt": receipt.receipt_id, "extra": extra}


def test_model_and_tool_calls_are_served_and_tools_not_run_again(dataset: Path, instrumented: None) -> None:
    with agent.scripted_server() as model:
        original, fingerprint, _ = record(dataset, "tools", lambda: _agent(model))
    effects, balance = list(SIDE_EFFECTS), LEDGER.balance
    assert balance == 1_000 - 12.5
    result = rerun(lambda: _agent(model), dataset=dataset, session_id="tools")
    assert result.error is None, result.report()
    assert result.output == original and result.matched, result.report()
    assert SIDE_EFFECTS == effects and LEDGER.balance == balance  # nothing executed again
    assert result.fingerprint == fingerprint


@tool
def opaque_tool() -> object:
    """Returns something a recording cannot hold."""
    return object()


def test_a_tool_result_that_cannot_be_recorded_is_refused_not_rerun(dataset: Path) -> None:
    record(dataset, "opaque", lambda: type(opaque_tool()).__name__)
    with pytest.raises(ReplayMismatchError, match="could not hold"):
        rerun(lambda: opaque_tool(), dataset=dataset, session_id="opaque", governance="strict")
    relaxed = rerun(lambda: opaque_tool(), dataset=dataset, session_id="opaque")
    assert relaxed.error is not None and "could not hold" in relaxed.error
    assert otel_replay is not None


def _ask(model: str, prompt: str) -> str:
    with openai.OpenAI(base_url=f"{model}/v1", api_key="sk-test-0123456789abcdefghij", max_retries=0) as llm:
        answer = llm.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}])
        return answer.choices[0].message.content or ""


def test_a_rerun_matches_with_or_without_the_instrumentor_and_names_a_changed_prompt(dataset: Path) -> None:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()
    try:
        with agent.scripted_server() as model:
            original, fingerprint, _ = record(dataset, "ask", lambda: _ask(model, "hello"))
        changed = rerun(lambda: _ask(model, "hello there"), dataset=dataset, session_id="ask")
    finally:
        instrumentor.uninstrument()
    assert changed.divergence is not None and "model" in changed.divergence.reason
    assert "hello there" in changed.divergence.actual
    plain = rerun(lambda: _ask(model, "hello"), dataset=dataset, session_id="ask")  # instrumentor off now
    assert plain.output == original and plain.matched and plain.fingerprint == fingerprint, plain.report()


def test_record_and_rerun_under_the_contrib_http_instrumentations(dataset: Path) -> None:
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.requests import RequestsInstrumentor

    httpx_contrib, requests_contrib = HTTPXClientInstrumentor(), RequestsInstrumentor()
    httpx_contrib.instrument()
    requests_contrib.instrument()
    try:
        with agent.scripted_server() as api, agent.scripted_server() as model:
            original, fingerprint, _ = record(dataset, "contrib", lambda: agent.run_agent(api, model))
        result = rerun(lambda: agent.run_agent(api, model), dataset=dataset, session_id="contrib", governance="strict")
    finally:
        httpx_contrib.uninstrument()
        requests_contrib.uninstrument()
    assert result.output == original and result.matched and result.fingerprint == fingerprint, result.report()
