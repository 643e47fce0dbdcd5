"""Anthropic ``messages.with_raw_response`` on a governed client: allowed, refused and stripped, sync and async."""

from __future__ import annotations

import asyncio
import json

import pytest

from otel_replay import semconv as sc
from otel_replay.contracts.session import govern
from otel_replay.errors import ReplayContractError
from otel_replay.instrumentation import scripted as s

from .govern_support import ANTHROPIC_TOOLS, BAD, CLAUDE, GOOD, HELLO, REFUND_BOT, Spans, anthropic_client, decisions


def test_an_allowed_tool_use_comes_back_through_the_raw_response(spans: Spans) -> None:
    reply = s.anthropic_message("Looking.", model=CLAUDE, tool_uses=[("t1", "lookup_customer", GOOD)])
    with s.ScriptedServer([reply]) as server:
        session = govern(anthropic_client(server), REFUND_BOT, tracer_provider=spans.provider)
        raw = session.client.messages.with_raw_response.create(
            model=CLAUDE, max_tokens=50, messages=HELLO, tools=ANTHROPIC_TOOLS
        )
        sent = server.requests[0]["json"]
    assert raw.status_code == 200 and raw.headers.get("content-type", "").startswith("application/json")
    message = raw.parse()
    assert [(b.type, getattr(b, "id", None)) for b in message.content] == [("text", None), ("tool_use", "t1")]
    assert [t["name"] for t in sent["tools"]] == ["lookup_customer"]  # narrowed on this path too
    assert session.get_state()["current_phase"] == "customer_identified"
    assert [d[sc.CONTRACT_OUTCOME] for d in decisions(spans)] == ["allow"]
    assert decisions(spans)[0][sc.CONTRACT_API] == "messages"


def test_a_refused_tool_use_raises_and_no_raw_response_is_handed_out(spans: Spans) -> None:
    refund = {"customer_id": "C1", "amount": 5, "currency": "EUR"}
    reply = s.anthropic_message(None, model=CLAUDE, tool_uses=[("t1", "issue_refund", refund)])
    with s.ScriptedServer([reply]) as server:
        session = govern(anthropic_client(server), REFUND_BOT, tracer_provider=spans.provider)
        with pytest.raises(ReplayContractError) as caught:
            session.client.messages.with_raw_response.create(
                model=CLAUDE, max_tokens=50, messages=HELLO, tools=ANTHROPIC_TOOLS
            )
        assert len(server.requests) == 1  # the model was asked; its answer was refused
    assert {f.rule for f in caught.value.failures} >= {"phase", "precondition"}
    state = session.get_state()
    assert state["current_phase"] == "triage" and state["total_tool_calls"] == 0
    assert [d[sc.CONTRACT_OUTCOME] for d in decisions(spans)] == ["reject"]


def test_a_stripped_raw_response_says_the_same_in_its_body_and_parse(spans: Spans) -> None:
    reply = s.anthropic_message(
        "Looking.", model=CLAUDE, tool_uses=[("t1", "lookup_customer", BAD), ("t2", "lookup_customer", GOOD)]
    )
    with s.ScriptedServer([reply]) as server:
        session = govern(anthropic_client(server), REFUND_BOT, gate="strip_partial", tracer_provider=spans.provider)
        raw = session.client.messages.with_raw_response.create(
            model=CLAUDE, max_tokens=50, messages=HELLO, tools=ANTHROPIC_TOOLS
        )
    parsed_ids = [getattr(b, "id", None) for b in raw.parse().content]
    body = json.loads(raw.content)
    assert parsed_ids == [None, "t2"]
    assert [block.get("id") for block in body["content"]] == [None, "t2"]  # t1 is in no form reachable
    assert "t1" not in raw.text and "no address" not in raw.http_response.text
    assert [d[sc.CONTRACT_OUTCOME] for d in decisions(spans)] == ["strip"]


def test_the_async_client_governs_with_raw_response_alike(spans: Spans) -> None:
    refund = {"customer_id": "C1", "amount": 5, "currency": "EUR"}
    replies = [
        s.anthropic_message(None, model=CLAUDE, tool_uses=[("t1", "lookup_customer", GOOD)]),
        s.anthropic_message(None, model=CLAUDE, tool_uses=[("t2", "issue_refund", refund)]),
    ]

    async def run(server: s.ScriptedServer) -> tuple[list[str], BaseException | None]:
        client = anthropic_client(server, aio=True)
        try:
            session = govern(client, REFUND_BOT, tracer_provider=spans.provider)
            ask = session.client.messages.with_raw_response.create
            raw = await ask(model=CLAUDE, max_tokens=50, messages=HELLO, tools=ANTHROPIC_TOOLS)
            names = [b.name for b in (await raw.parse()).content if b.type == "tool_use"]
            try:
                await ask(model=CLAUDE, max_tokens=50, messages=HELLO, tools=ANTHROPIC_TOOLS)
            except ReplayContractError as exc:
                return names, exc
            return names, None
        finally:
            await client.close()

    with s.ScriptedServer(replies) as server:
        names, refused = asyncio.run(run(server))
    assert names == ["lookup_customer"]
    assert isinstance(refused, ReplayContractError)
    assert [d[sc.CONTRACT_OUTCOME] for d in decisions(spans)] == ["allow", "reject"]
