"""Streaming is enforced: text deltas reach the caller as they arrive; a tool call is held until its arguments
are complete, then gated, and only an allowed call reaches the caller (OpenAI chat and Anthropic messages,
``create(stream=True)`` and the ``messages.stream()`` helper, sync and async)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from otel_replay import semconv as sc
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
    RESPONSES_TOOLS,
    Spans,
    anthropic_client,
    decisions,
    openai_client,
)


def _chat_stream(server: s.ScriptedServer, spans: Spans, gate: str = "strip_blocked") -> Any:
    session = govern(openai_client(server), REFUND_BOT, gate=gate, tracer_provider=spans.provider)
    stream = session.client.chat.completions.create(
        model=GPT,
        messages=[{"role": "user", "content": "hi"}],
        tools=CHAT_TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    return session, stream


def test_chat_text_deltas_pass_before_the_held_tool_call_is_gated(spans: Spans) -> None:
    reply = s.chat_stream(("Let ", "me ", "look."), model=GPT, tool_calls=[("c1", "lookup_customer", GOOD)])
    with s.ScriptedServer([reply]) as server:
        session, stream = _chat_stream(server, spans)
        seen: list[tuple[str, Any]] = []
        for chunk in stream:
            gated = len(decisions(spans))
            for choice in chunk.choices:
                if choice.delta.content:
                    seen.append(("text", gated))
                for call in choice.delta.tool_calls or ():
                    seen.append(("call", gated, call.index, call.id, call.function.arguments))
                if choice.finish_reason:
                    seen.append(("finish", choice.finish_reason))
    texts = [item for item in seen if item[0] == "text"]
    assert texts == [("text", 0)] * 3  # every text delta arrived before the decision was made
    calls = [item for item in seen if item[0] == "call"]
    assert calls and all(item[1] == 1 for item in calls)  # the call's pieces came only after it was gated
    assert json.loads("".join(item[4] or "" for item in calls)) == GOOD
    assert calls[0][2] == 0 and calls[0][3] == "c1"
    assert seen[-1] == ("finish", "tool_calls")
    assert session.get_state()["current_phase"] == "customer_identified"


def test_chat_stream_strips_the_refused_call_and_renumbers_the_allowed_one(spans: Spans) -> None:
    reply = s.chat_stream(
        ("ok",), model=GPT, tool_calls=[("c1", "lookup_customer", BAD), ("c2", "lookup_customer", GOOD)]
    )
    with s.ScriptedServer([reply]) as server:
        _, stream = _chat_stream(server, spans)
        calls: dict[int, dict[str, Any]] = {}
        for chunk in stream:
            for choice in chunk.choices:
                for call in choice.delta.tool_calls or ():
                    slot = calls.setdefault(call.index, {"id": None, "args": ""})
                    slot["id"] = call.id or slot["id"]
                    slot["args"] += call.function.arguments or ""
    assert list(calls) == [0]
    assert calls[0]["id"] == "c2" and json.loads(calls[0]["args"]) == GOOD
    assert decisions(spans)[0][sc.CONTRACT_OUTCOME] == "strip"
    assert decisions(spans)[0][sc.CONTRACT_STREAMED] is True


def test_chat_stream_with_every_call_refused_ends_as_text_with_finish_reason_stop(spans: Spans) -> None:
    reply = s.chat_stream(("Checking.",), model=GPT, tool_calls=[("c1", "lookup_customer", BAD)])
    with s.ScriptedServer([reply]) as server:
        _, stream = _chat_stream(server, spans)
        chunks = list(stream)
    assert not any(choice.delta.tool_calls for chunk in chunks for choice in chunk.choices)
    reasons = [choice.finish_reason for chunk in chunks for choice in chunk.choices if choice.finish_reason]
    assert reasons == ["stop"]
    assert "".join(c.delta.content or "" for chunk in chunks for c in chunk.choices) == "Checking."
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 11  # the usage chunk still arrives


def test_chat_stream_rejected_under_reject_all_raises_after_the_text_and_delivers_no_call(spans: Spans) -> None:
    reply = s.chat_stream(("Sure, ", "refunding."), model=GPT, tool_calls=[("c1", "issue_refund", {"amount": 1})])
    with s.ScriptedServer([reply]) as server:
        _, stream = _chat_stream(server, spans, gate="reject_all")
        text = []
        with pytest.raises(ReplayContractError) as caught:
            for chunk in stream:
                for choice in chunk.choices:
                    assert not choice.delta.tool_calls
                    text.append(choice.delta.content or "")
    assert "".join(text) == "Sure, refunding."
    assert caught.value.decision.outcome == "reject"


def test_a_stream_cut_before_the_call_is_complete_delivers_no_call(spans: Spans) -> None:
    reply = s.chat_stream(("a",), model=GPT, tool_calls=[("c1", "lookup_customer", GOOD)], cut_after=5)
    with s.ScriptedServer([reply]) as server:
        _, stream = _chat_stream(server, spans)
        got = []
        with pytest.raises(Exception):  # noqa: B017,PT011 - the client's own error for a broken stream
            for chunk in stream:
                got.append(chunk)
    assert not any(choice.delta.tool_calls for chunk in got for choice in chunk.choices)
    assert decisions(spans) == []


def _anthropic_session(server: s.ScriptedServer, spans: Spans, gate: str = "strip_blocked", aio: bool = False) -> Any:
    return govern(anthropic_client(server, aio), REFUND_BOT, gate=gate, tracer_provider=spans.provider)


def test_anthropic_raw_stream_holds_the_tool_use_block_and_renumbers_it(spans: Spans) -> None:
    reply = s.anthropic_stream(
        ("Let me ", "look."), model=CLAUDE, tool_uses=[("t1", "lookup_customer", BAD), ("t2", "lookup_customer", GOOD)]
    )
    with s.ScriptedServer([reply]) as server:
        session = _anthropic_session(server, spans)
        stream = session.client.messages.create(
            model=CLAUDE,
            max_tokens=100,
            messages=[{"role": "user", "content": "hi"}],
            tools=ANTHROPIC_TOOLS,
            stream=True,
        )
        events = []
        for event in stream:
            events.append((event.type, getattr(event, "index", None), len(decisions(spans))))
    text_deltas = [e for e in events if e[0] == "content_block_delta" and e[1] == 0]
    assert text_deltas and all(e[2] == 0 for e in text_deltas)
    starts = [e for e in events if e[0] == "content_block_start"]
    assert [e[1] for e in starts] == [0, 1]  # the refused block is gone, the allowed one is block 1
    assert starts[1][2] == 1


def test_anthropic_stream_helper_gives_a_final_message_without_the_refused_call(spans: Spans) -> None:
    reply = s.anthropic_stream(("Checking.",), model=CLAUDE, tool_uses=[("t1", "lookup_customer", BAD)])
    with s.ScriptedServer([reply]) as server:
        session = _anthropic_session(server, spans)
        with session.client.messages.stream(
            model=CLAUDE, max_tokens=100, messages=[{"role": "user", "content": "hi"}], tools=ANTHROPIC_TOOLS
        ) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
    assert text == "Checking."
    assert [block.type for block in final.content] == ["text"]
    assert final.stop_reason == "end_turn"
    assert decisions(spans)[0][sc.CONTRACT_OUTCOME] == "text_only"


def test_anthropic_stream_helper_passes_an_allowed_call_whole(spans: Spans) -> None:
    reply = s.anthropic_stream(("One moment.",), model=CLAUDE, tool_uses=[("t1", "lookup_customer", GOOD)])
    with s.ScriptedServer([reply]) as server:
        session = _anthropic_session(server, spans)
        with session.client.messages.stream(
            model=CLAUDE, max_tokens=100, messages=[{"role": "user", "content": "hi"}], tools=ANTHROPIC_TOOLS
        ) as stream:
            final = stream.get_final_message()
    uses = [block for block in final.content if block.type == "tool_use"]
    assert [(u.id, u.name, u.input) for u in uses] == [("t1", "lookup_customer", GOOD)]
    assert final.stop_reason == "tool_use"
    assert session.get_state()["current_phase"] == "customer_identified"


def test_async_streams_are_governed_the_same_way(spans: Spans) -> None:
    chat = s.chat_stream(("hi",), model=GPT, tool_calls=[("c1", "lookup_customer", BAD)])
    claude = s.anthropic_stream(("hi",), model=CLAUDE, tool_uses=[("t1", "lookup_customer", GOOD)])

    async def run(server: s.ScriptedServer) -> tuple[list[Any], Any]:
        oai = govern(openai_client(server, aio=True), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        stream = await oai.client.chat.completions.create(
            model=GPT, messages=[{"role": "user", "content": "hi"}], tools=CHAT_TOOLS, stream=True
        )
        chunks = [chunk async for chunk in stream]
        ant = govern(anthropic_client(server, aio=True), REFUND_BOT, tracer_provider=spans.provider)
        async with ant.client.messages.stream(
            model=CLAUDE, max_tokens=100, messages=[{"role": "user", "content": "hi"}], tools=ANTHROPIC_TOOLS
        ) as helper:
            final = await helper.get_final_message()
        await oai.client.close()
        await ant.client.close()
        return chunks, final

    with s.ScriptedServer([chat, claude]) as server:
        chunks, final = asyncio.run(run(server))
    assert not any(choice.delta.tool_calls for chunk in chunks for choice in chunk.choices)
    assert [block.type for block in final.content] == ["text", "tool_use"]


def test_responses_stream_holds_function_calls_and_the_completed_response_lists_only_allowed_ones(
    spans: Spans,
) -> None:
    reply = s.responses_call_stream(
        "Looking.", model=GPT, tool_calls=[("f1", "lookup_customer", BAD), ("f2", "lookup_customer", GOOD)]
    )
    with s.ScriptedServer([reply]) as server:
        session = govern(openai_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        stream = session.client.responses.create(model=GPT, input="hi", tools=RESPONSES_TOOLS, stream=True)
        seen = [(event.type, getattr(event, "output_index", None), len(decisions(spans))) for event in stream]
    texts = [e for e in seen if e[0] == "response.output_text.delta"]
    assert texts == [("response.output_text.delta", 0, 0)]  # text before the decision
    added = [e for e in seen if e[0] == "response.output_item.added"]
    assert [(e[1], e[2]) for e in added] == [(0, 0), (1, 1)]  # the refused call gone, the allowed one renumbered
    assert seen[-1][0] == "response.completed"


def test_responses_stream_completed_event_drops_the_refused_call(spans: Spans) -> None:
    reply = s.responses_call_stream("x", model=GPT, tool_calls=[("f1", "lookup_customer", BAD)])
    with s.ScriptedServer([reply]) as server:
        session = govern(openai_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        events = list(session.client.responses.create(model=GPT, input="hi", tools=RESPONSES_TOOLS, stream=True))
    completed = events[-1]
    assert completed.type == "response.completed"
    assert [item.type for item in completed.response.output] == ["message"]
    assert not any(e.type.startswith("response.function_call") for e in events)
    assert decisions(spans)[0][sc.CONTRACT_OUTCOME] == "text_only"


def test_a_raw_streamed_response_parses_to_the_governed_stream(spans: Spans) -> None:
    reply = s.chat_stream(("ok",), model=GPT, tool_calls=[("c1", "lookup_customer", BAD)])
    with s.ScriptedServer([reply]) as server:
        session = govern(openai_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        raw = session.client.chat.completions.with_raw_response.create(
            model=GPT, messages=[{"role": "user", "content": "hi"}], tools=CHAT_TOOLS, stream=True
        )
        assert raw.status_code == 200
        stream = raw.parse()
        assert raw.parse() is stream
        chunks = list(stream)
    assert not any(choice.delta.tool_calls for chunk in chunks for choice in chunk.choices)
    assert decisions(spans)[0][sc.CONTRACT_OUTCOME] == "text_only"


def test_a_rejected_stream_lets_its_connection_go(spans: Spans) -> None:
    reply = s.chat_stream(("x",), model=GPT, tool_calls=[("c1", "issue_refund", {"amount": 1})])
    with s.ScriptedServer([reply]) as server:
        _, stream = _chat_stream(server, spans, gate="reject_all")
        with pytest.raises(ReplayContractError):
            list(stream)
        assert stream.response.is_closed


def _chunk(delta: dict[str, Any] | None, finish: str | None = None) -> dict[str, Any]:
    choices = [{"index": 0, "delta": delta, "finish_reason": finish}] if delta is not None else []
    return {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": GPT, "choices": choices}


def _pieces_stream(*calls: dict[str, Any]) -> s.Reply:
    """A chat stream whose tool-call pieces are exactly ``calls`` (each a ``delta.tool_calls`` entry)."""
    events: list[tuple[str | None, Any]] = [(None, _chunk({"role": "assistant", "content": ""}))]
    events += [(None, _chunk({"tool_calls": [call]})) for call in calls]
    events += [(None, _chunk({}, "tool_calls")), (None, "[DONE]")]
    return s.Reply(200, events=events)


def _assembled(stream: Any) -> dict[int, dict[str, str]]:
    """The calls as a hand-written accumulator joins the pieces (id, name and arguments appended)."""
    calls: dict[int, dict[str, str]] = {}
    for chunk in stream:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or ():
                slot = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] += call.id or ""
                slot["name"] += (call.function.name if call.function else None) or ""
                slot["arguments"] += (call.function.arguments if call.function else None) or ""
    return calls


def test_a_tool_name_split_across_pieces_is_gated_as_the_caller_joins_it(spans: Spans) -> None:
    # the caller's accumulator (and the openai library's) joins "issue_" and "refund": so must the gate
    args = json.dumps({"customer_id": "C1", "amount": 1, "currency": "USD"})
    reply = _pieces_stream(
        {"index": 0, "id": "c1", "type": "function", "function": {"name": "issue_", "arguments": ""}},
        {"index": 0, "function": {"name": "refund", "arguments": args}},
    )
    with s.ScriptedServer([reply]) as server:
        session = govern(
            openai_client(server),
            REFUND_BOT,
            gate="strip_blocked",
            unmatched_policy="allow",
            tracer_provider=spans.provider,
        )
        stream = session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS, stream=True)
        with pytest.raises(ReplayContractError) as caught:  # issue_refund's gate is block: the response rejected
            _assembled(stream)
    assert {f.tool for f in caught.value.failures} == {"issue_refund"}
    [tool] = decisions(spans)[0][sc.CONTRACT_TOOLS]
    assert tool["name"] == "issue_refund" and tool["allowed"] is False


def test_an_allowed_call_is_released_as_exactly_what_was_gated_in_one_piece(spans: Spans) -> None:
    # many argument fragments, an allowed prefix, a second id piece: the caller gets the gated call, whole
    text = json.dumps(GOOD)
    pieces = [{"index": 0, "id": "c", "type": "function", "function": {"name": "lookup_customer", "arguments": ""}}]
    pieces += [{"index": 0, "function": {"arguments": ch}} for ch in text]
    pieces.append({"index": 0, "id": "1", "function": {"arguments": ""}})
    with s.ScriptedServer([_pieces_stream(*pieces)]) as server:
        session = govern(openai_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        stream = session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS, stream=True)
        chunks = list(stream)
    with_calls = [chunk for chunk in chunks if any(c.delta.tool_calls for c in chunk.choices)]
    assert len(with_calls) == 1
    assert _assembled(iter(with_calls)) == {0: {"id": "c1", "name": "lookup_customer", "arguments": text}}
    assert decisions(spans)[0][sc.CONTRACT_TOOLS][0]["call_id"] == "c1"


def test_the_openai_stream_helper_is_governed_and_its_final_completion_has_only_allowed_calls(spans: Spans) -> None:
    reply = s.chat_stream(
        ("ok",), model=GPT, tool_calls=[("c1", "lookup_customer", BAD), ("c2", "lookup_customer", GOOD)]
    )
    with s.ScriptedServer([reply]) as server:
        session = govern(openai_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        with session.client.chat.completions.stream(model=GPT, messages=HELLO, tools=CHAT_TOOLS) as stream:
            final = stream.get_final_completion()
    assert [(c.id, c.function.name) for c in final.choices[0].message.tool_calls] == [("c2", "lookup_customer")]
    assert decisions(spans)[0][sc.CONTRACT_OUTCOME] == "strip"
    assert session.get_health()["bypass_detected"] is False


def test_the_responses_stream_helper_is_governed(spans: Spans) -> None:
    reply = s.responses_call_stream("x", model=GPT, tool_calls=[("f1", "lookup_customer", BAD)])
    with s.ScriptedServer([reply]) as server:
        session = govern(openai_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        with session.client.responses.stream(model=GPT, input="hi", tools=RESPONSES_TOOLS) as stream:
            final = stream.get_final_response()
    assert [item.type for item in final.output] == ["message"]
    assert decisions(spans)[0][sc.CONTRACT_OUTCOME] == "text_only"
    assert session.get_health()["bypass_detected"] is False


def test_an_anthropic_tool_use_block_that_starts_with_its_input_and_has_no_deltas_is_gated_on_that_input(
    spans: Spans, tmp_path: Path
) -> None:
    contracts = tmp_path / "contracts"
    shutil.copytree(REFUND_BOT, contracts)
    (contracts / "note.yaml").write_text(
        "tool: note\nside_effect: read\n"
        "argument_value_invariants:\n  - path: $.amount\n    lte: 10\n    optional: true\n"
    )
    start = {"type": "tool_use", "id": "t1", "name": "note", "input": {"amount": 9999}}
    with s.ScriptedServer([s.Reply(200, events=_one_tool_use(start, []))]) as server:
        session = govern(anthropic_client(server), contracts, gate="strip_blocked", tracer_provider=spans.provider)
        tools = [{"name": "note", "input_schema": {"type": "object"}}]
        with session.client.messages.stream(model=CLAUDE, max_tokens=9, messages=HELLO, tools=tools) as stream:
            final = stream.get_final_message()
    assert [block.type for block in final.content] == []
    [failure] = decisions(spans)[0][sc.CONTRACT_FAILURES]
    assert failure["rule"] == "argument_invariant" and failure["path"] == "$.amount"


def test_an_anthropic_tool_use_block_is_released_with_its_input_in_one_delta(spans: Spans) -> None:
    text = json.dumps(GOOD)
    start = {"type": "tool_use", "id": "t1", "name": "lookup_customer", "input": {"customer_email": "x@y.z"}}
    deltas = [{"type": "input_json_delta", "partial_json": ch} for ch in text]
    with s.ScriptedServer([s.Reply(200, events=_one_tool_use(start, deltas))]) as server:
        session = govern(anthropic_client(server), REFUND_BOT, tracer_provider=spans.provider)
        stream = session.client.messages.create(
            model=CLAUDE, max_tokens=9, messages=HELLO, tools=ANTHROPIC_TOOLS, stream=True
        )
        got = list(stream)
    [begin] = [e for e in got if e.type == "content_block_start"]
    assert begin.content_block.input == {}
    assert [e.delta.partial_json for e in got if e.type == "content_block_delta"] == [text]


def _one_tool_use(start: dict[str, Any], deltas: list[dict[str, Any]]) -> list[tuple[str | None, Any]]:
    """An Anthropic message stream of one tool-use block: its ``start`` block, then each of ``deltas``."""
    return [
        ("message_start", {"type": "message_start", "message": _claude_start()}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}),
        *(("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": d}) for d in deltas),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 3}},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def _claude_start() -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": CLAUDE,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 1},
    }


def test_streams_left_before_their_response_was_gated_count_as_steps_and_max_steps_still_holds(spans: Spans) -> None:
    replies = [s.chat_stream(("a", "b"), model=GPT, tool_calls=[("c1", "lookup_customer", GOOD)]) for _ in range(9)]
    replies.append(s.chat_stream(("a",), model=GPT, tool_calls=[("c1", "lookup_customer", GOOD)], cut_after=4))
    with s.ScriptedServer(replies) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        for _ in range(4):  # closed after the first chunk
            stream = session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS, stream=True)
            next(stream)
            stream.close()
        for _ in range(5):  # a with block left early
            with session.client.chat.completions.create(
                model=GPT, messages=HELLO, tools=CHAT_TOOLS, stream=True
            ) as stream:
                next(stream)
        broken = session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS, stream=True)
        with pytest.raises(Exception):  # noqa: B017,PT011 - the client's own error for a broken stream
            list(broken)
        assert session.get_state()["total_step_count"] == 10
        with pytest.raises(ReplayContractError, match="max_steps"):
            session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS, stream=True)
        assert len(server.requests) == 10
    assert session.get_state()["tool_call_counts"] == {}  # no held call was ever delivered


def test_an_anthropic_stream_helper_left_early_counts_as_a_step(spans: Spans) -> None:
    reply = s.anthropic_stream(("Let ", "me ", "see."), model=CLAUDE, tool_uses=[("t1", "lookup_customer", GOOD)])
    with s.ScriptedServer([reply]) as server:
        session = _anthropic_session(server, spans)
        with session.client.messages.stream(
            model=CLAUDE, max_tokens=100, messages=HELLO, tools=ANTHROPIC_TOOLS
        ) as stream:
            next(iter(stream))
    state = session.get_state()
    assert state["total_step_count"] == 1 and state["tool_call_counts"] == {}


def test_the_http_body_under_a_governed_stream_is_not_given_out(spans: Spans) -> None:
    reply = s.chat_stream(("ok",), model=GPT, tool_calls=[("c1", "issue_refund", {"amount": 1})])
    with s.ScriptedServer([reply]) as server:
        _, stream = _chat_stream(server, spans)
        for reader in ("iter_lines", "iter_bytes", "read", "text"):
            with pytest.raises(ContractError, match=rf"HTTP response is not given out \({reader}\)"):
                getattr(stream.response, reader)
        assert stream.response.status_code == 200
        with pytest.raises(ReplayContractError):
            list(stream)
