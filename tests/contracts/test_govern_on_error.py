"""``on_error`` and ``max_unguarded_calls`` on the real ``openai`` client: a response governance cannot read."""

from __future__ import annotations

from typing import Any

import pytest

from otel_replay import semconv as sc
from otel_replay.contracts.session import govern
from otel_replay.errors import ContractError, ReplayKillError
from otel_replay.instrumentation import scripted as s

from .govern_support import CHAT_TOOLS, GPT, HELLO, REFUND_BOT, Spans, decisions, openai_client


def _unreadable() -> s.Reply:
    """A completion whose tool-call list holds a number: the client parses it, governance cannot read the call."""
    body = {
        "id": "chatcmpl-odd",
        "object": "chat.completion",
        "created": 1,
        "model": GPT,
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "tool_calls": [42]}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
    return s.Reply(200, body)


def test_on_error_block_refuses_a_response_it_cannot_read(spans: Spans) -> None:
    with s.ScriptedServer([_unreadable()]) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        with pytest.raises(ContractError, match="could not be read for its tool calls.*on_error='block'"):
            session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
    assert session.get_state()["total_unguarded_calls"] == 0


def test_on_error_allow_lets_the_response_through_counts_it_and_records_it(spans: Spans) -> None:
    told: list[dict[str, Any]] = []
    with s.ScriptedServer([_unreadable()]) as server:
        session = govern(
            openai_client(server),
            REFUND_BOT,
            on_error="allow",
            diagnostics=told.append,
            tracer_provider=spans.provider,
        )
        response = session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
    assert response.id == "chatcmpl-odd" and response.choices[0].message.tool_calls == [42]  # as the server said
    assert session.get_state()["total_unguarded_calls"] == 1
    assert not session.get_state()["killed"]
    health = session.get_health()
    assert health["status"] == "degraded"
    assert [event["event"] for event in told] == ["unguarded_call"]
    assert "AttributeError" in told[0]["reason"]
    [decision] = decisions(spans)
    assert decision[sc.CONTRACT_OUTCOME] == "unguarded"
    assert [f["rule"] for f in decision[sc.CONTRACT_FAILURES]] == ["internal_error"]
    assert "on_error allow" in decision[sc.CONTRACT_FAILURES][0]["detail"]


def test_max_unguarded_calls_kills_the_session_once_reached(spans: Spans) -> None:
    """Two unreadable responses pass under on_error allow; the limit then stops the third call before it is made."""
    with s.ScriptedServer([_unreadable(), _unreadable(), _unreadable()]) as server:
        session = govern(
            openai_client(server),
            REFUND_BOT,
            on_error="allow",
            max_unguarded_calls=2,
            tracer_provider=spans.provider,
        )
        create = session.client.chat.completions.create
        create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
        assert not session.get_state()["killed"]
        create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)  # the second is let through, then the session stops
        with pytest.raises(ReplayKillError, match="max_unguarded_calls 2 reached"):
            create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
        asked = len(server.requests)
    assert asked == 2  # the third call never reached the model
    state = session.get_state()
    assert state["killed"] and state["total_unguarded_calls"] == 2
    assert [d[sc.CONTRACT_OUTCOME] for d in decisions(spans)] == ["unguarded", "unguarded"]


def test_on_error_allow_never_lets_a_readable_refused_call_through(spans: Spans) -> None:
    """on_error is about governance failing, not about rules failing: a refused call stays refused."""
    refund = s.chat_completion(None, model=GPT, tool_calls=[("c1", "issue_refund", {"amount": 1})])
    with s.ScriptedServer([refund]) as server:
        session = govern(openai_client(server), REFUND_BOT, on_error="allow", tracer_provider=spans.provider)
        with pytest.raises(ContractError):
            session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
    assert session.get_state()["total_unguarded_calls"] == 0
