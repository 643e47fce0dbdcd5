"""Every way into the client a governed session hands out: each path is governed, or reported as a bypass.

The attacker's view: a forbidden tool call (the refund bot's ``issue_refund`` in phase ``triage``) sent back
by the model, reached through a path other than ``session.client.chat.completions.create``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from otel_replay.contracts.session import govern
from otel_replay.errors import ContractError, ReplayContractError
from otel_replay.instrumentation import scripted as s

from .govern_support import (
    ANTHROPIC_TOOLS,
    BAD,
    CHAT_TOOLS,
    CLAUDE,
    GOOD,
    GPT,
    HELLO,
    REFUND_BOT,
    Spans,
    anthropic_client,
    openai_client,
)

REFUND = {"customer_id": "C1", "amount": 1, "currency": "USD"}


def _refund_reply() -> s.Reply:
    return s.chat_completion(None, model=GPT, tool_calls=[("c1", "issue_refund", REFUND)])


def test_the_client_a_with_block_hands_out_is_the_governed_one(spans: Spans) -> None:
    with s.ScriptedServer([_refund_reply()]) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        with session.client as client:
            assert client is session.client
            with pytest.raises(ReplayContractError):
                client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
        assert session.original.is_closed()  # leaving the block still closes the client
    assert session.get_health()["bypass_detected"] is False


def test_the_client_an_async_with_block_hands_out_is_the_governed_one(spans: Spans) -> None:
    claude = s.anthropic_message(None, model=CLAUDE, tool_uses=[("t1", "issue_refund", REFUND)])

    async def run(server: s.ScriptedServer) -> tuple[bool, BaseException | None]:
        session = govern(anthropic_client(server, aio=True), REFUND_BOT, tracer_provider=spans.provider)
        async with session.client as client:
            try:
                await client.messages.create(model=CLAUDE, max_tokens=5, messages=HELLO, tools=ANTHROPIC_TOOLS)
            except ReplayContractError as exc:
                return client is session.client, exc
        return client is session.client, None

    with s.ScriptedServer([claude]) as server:
        same, error = asyncio.run(run(server))
    assert same
    assert isinstance(error, ReplayContractError)


def test_a_copy_and_with_options_of_the_governed_client_are_governed(spans: Spans) -> None:
    with s.ScriptedServer([_refund_reply(), _refund_reply()]) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        for other in (session.client.copy(), session.client.with_options(timeout=5)):
            with pytest.raises(ReplayContractError):
                other.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
    assert session.get_state()["total_block_count"] == 2


def _ungoverned(client: Any) -> Any:
    return client.chat.completions.with_streaming_response.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)


def test_an_ungoverned_path_of_a_copy_of_the_governed_client_is_reported_as_a_bypass(spans: Spans) -> None:
    with s.ScriptedServer([_refund_reply()]) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        with _ungoverned(session.client.with_options(timeout=5)) as raw:
            raw.read()
    assert session.get_health()["bypass_detected"] is True


def test_parse_is_governed_like_create(spans: Spans) -> None:
    strict = [{**entry, "function": {**entry["function"], "strict": True}} for entry in CHAT_TOOLS]
    with s.ScriptedServer([_refund_reply()]) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        with pytest.raises(ReplayContractError):
            session.client.chat.completions.parse(model=GPT, messages=HELLO, tools=strict)
        sent = server.requests[0]["json"]
    assert [entry["function"]["name"] for entry in sent["tools"]] == ["lookup_customer"]  # narrowed too
    assert session.get_health()["bypass_detected"] is False


def test_the_openai_stream_helper_of_an_async_client_is_governed(spans: Spans) -> None:
    async def run(server: s.ScriptedServer) -> BaseException | None:
        session = govern(openai_client(server, aio=True), REFUND_BOT, tracer_provider=spans.provider)
        try:
            async with session.client.chat.completions.stream(model=GPT, messages=HELLO, tools=CHAT_TOOLS) as stream:
                await stream.get_final_completion()
        except ReplayContractError as exc:
            return exc
        finally:
            await session.client.close()
        return None

    refund = s.chat_stream((), model=GPT, tool_calls=[("c1", "issue_refund", REFUND)])
    with s.ScriptedServer([refund]) as server:
        error = asyncio.run(run(server))
    assert isinstance(error, ReplayContractError)


def test_anthropic_beta_messages_are_governed_and_the_tool_runner_is_refused(spans: Spans) -> None:
    claude = s.anthropic_message(None, model=CLAUDE, tool_uses=[("t1", "issue_refund", REFUND)])
    with s.ScriptedServer([claude]) as server:
        session = govern(anthropic_client(server), REFUND_BOT, tracer_provider=spans.provider)
        with pytest.raises(ReplayContractError):
            session.client.beta.messages.create(model=CLAUDE, max_tokens=5, messages=HELLO, tools=ANTHROPIC_TOOLS)
        with pytest.raises(ContractError, match="tool_runner"):
            session.client.beta.messages.tool_runner(model=CLAUDE, max_tokens=5, messages=HELLO, tools=[])
        assert len(server.requests) == 1
    assert session.get_health()["bypass_detected"] is False


@pytest.mark.parametrize("method", ["create", "parse"])
def test_openai_beta_chat_completions_are_governed_like_chat_completions(spans: Spans, method: str) -> None:
    """``client.beta.chat.completions`` is the same resource (the cookbook's path to ``parse()``): it reached the
    client ungoverned, and a forbidden call came back to the application, reported only as a bypass."""
    strict = [{**entry, "function": {**entry["function"], "strict": True}} for entry in CHAT_TOOLS]
    with s.ScriptedServer([_refund_reply()]) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        with pytest.raises(ReplayContractError):
            getattr(session.client.beta.chat.completions, method)(model=GPT, messages=HELLO, tools=strict)
    assert session.get_health()["bypass_detected"] is False


def test_the_openai_beta_chat_stream_helper_is_governed(spans: Spans) -> None:
    reply = s.chat_stream(
        ("ok",), model=GPT, tool_calls=[("c1", "lookup_customer", BAD), ("c2", "lookup_customer", GOOD)]
    )
    with s.ScriptedServer([reply]) as server:
        session = govern(openai_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        with session.client.beta.chat.completions.stream(model=GPT, messages=HELLO, tools=CHAT_TOOLS) as stream:
            final = stream.get_final_completion()
    assert [(c.id, c.function.name) for c in final.choices[0].message.tool_calls] == [("c2", "lookup_customer")]
    assert session.get_health()["bypass_detected"] is False
