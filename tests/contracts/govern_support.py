"""What the govern() tests share: the refund bot's contracts and tool definitions, clients on a scripted server,
and a tracer provider of the test's own that keeps the decision spans."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_replay import semconv as sc
from otel_replay.gate import ActionGate, ReferenceLedger
from otel_replay.instrumentation import tool
from otel_replay.records import Action

__all__ = [
    "ANTHROPIC_TOOLS",
    "BAD",
    "CHAT_TOOLS",
    "CLAUDE",
    "GOOD",
    "GPT",
    "HELLO",
    "REFUND_BOT",
    "RESPONSES_TOOLS",
    "Spans",
    "anthropic_client",
    "close_clients",
    "decisions",
    "executors",
    "openai_client",
]

REFUND_BOT = Path(__file__).parent / "refund_bot"
"""The seed's refund bot (tests/contracts/refund_bot/, the loader's fixture)."""
GPT = "gpt-4o-mini"
CLAUDE = "claude-3-5-haiku-latest"
"""Models with a price in the refund bot's session.yaml (its cost cap needs one)."""

_SCHEMAS: dict[str, dict[str, Any]] = {
    "lookup_customer": {"type": "object", "properties": {"customer_email": {"type": "string"}}},
    "check_eligibility": {"type": "object", "properties": {"order_id": {"type": "string"}}},
    "issue_refund": {
        "type": "object",
        "properties": {"customer_id": {"type": "string"}, "amount": {"type": "number"}, "currency": {"type": "string"}},
    },
    "send_survey": {"type": "object", "properties": {}},
}
CHAT_TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": p}} for n, p in _SCHEMAS.items() if n != "send_survey"
]
RESPONSES_TOOLS = [{"type": "function", "name": n, "parameters": p} for n, p in _SCHEMAS.items() if n != "send_survey"]
ANTHROPIC_TOOLS = [{"name": n, "input_schema": p} for n, p in _SCHEMAS.items() if n != "send_survey"]

HELLO = [{"role": "user", "content": "hi"}]
"""The conversation every governed call sends: the scripted server answers whatever it is asked."""
GOOD = {"customer_email": "ana@example.com"}
"""``lookup_customer`` arguments its contract allows."""
BAD = {"customer_email": "no address"}
"""``lookup_customer`` arguments its contract blocks (not an e-mail address)."""


_OPENED: list[Any] = []


def openai_client(server: Any, aio: bool = False) -> Any:
    """A real ``openai`` client on the scripted server (no retries: a scripted error is the answer).

    A sync client is closed by :func:`close_clients`; an async one must be closed by its test, in its loop.
    """
    cls = openai.AsyncOpenAI if aio else openai.OpenAI
    client = cls(base_url=server.base_url, api_key="sk-test-not-a-key", max_retries=0)
    if not aio:
        _OPENED.append(client)
    return client


def anthropic_client(server: Any, aio: bool = False) -> Any:
    """A real ``anthropic`` client on the scripted server (closed as :func:`openai_client`'s)."""
    cls = anthropic.AsyncAnthropic if aio else anthropic.Anthropic
    client = cls(base_url=server.root_url, api_key="sk-ant-test-not-a-key", max_retries=0)
    if not aio:
        _OPENED.append(client)
    return client


def close_clients() -> None:
    """Close every sync client the test made."""
    while _OPENED:
        _OPENED.pop().close()


class Spans:
    """A tracer provider of the test's own whose finished spans are kept in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def finished(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def close(self) -> None:
        self.provider.shutdown()


def decisions(spans: Spans) -> list[dict[str, Any]]:
    """The decision spans' attributes, JSON attributes decoded, in the order they ended."""
    out = []
    for span in spans.finished():
        if span.name != sc.SPAN_CONTRACT_DECISION:
            continue
        attrs = dict(span.attributes or {})
        for key in (sc.CONTRACT_TOOLS, sc.CONTRACT_FAILURES, sc.CONTRACT_NARROWED):
            attrs[key] = json.loads(attrs[key])
        out.append(attrs)
    return out


def executors(ledger: ReferenceLedger, gate: ActionGate) -> dict[str, Any]:
    """The refund bot's tools: two reads, and a refund that commits through the gate's rail (a gated tool)."""

    def lookup_customer(customer_email: str) -> dict[str, Any]:
        return {"customer_id": "C42", "name": "Ana"}

    def check_eligibility(order_id: str) -> dict[str, Any]:
        return {"eligible": order_id != "ORD-999", "reason": "delivered"}

    @tool("issue_refund", side_effect="financial", gate=gate)
    def issue_refund(customer_id: str, amount: float, currency: str) -> Action:
        return Action("refund", {"customer_id": customer_id, "currency": currency}, cost=amount)

    return {"lookup_customer": lookup_customer, "check_eligibility": check_eligibility, "issue_refund": issue_refund}


def all_finished(it: Iterator[Any]) -> list[Any]:
    """Every item of a stream."""
    return list(it)
