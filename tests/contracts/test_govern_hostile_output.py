"""Hostile model output through the governed client: malformed tool-call JSON, 2,000 tool calls, 1 MiB of
arguments, odd names. Each gets a clear verdict; the agent never sees a crash of ours."""

from __future__ import annotations

import json
from typing import Any

import pytest

from otel_replay import semconv as sc
from otel_replay.contracts.evidence import MAX_ARGUMENT_CHARS, MAX_TOOLS
from otel_replay.contracts.session import govern
from otel_replay.errors import ReplayContractError
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


@pytest.mark.parametrize(
    "arguments",
    ['{"customer_email": "ana@example.com"', "not json at all", "[1, 2]", '{"a": NaN}', "", "null"],
    ids=["truncated", "prose", "array", "nan", "empty", "null"],
)
def test_malformed_tool_call_arguments_get_a_malformed_arguments_verdict(spans: Spans, arguments: str) -> None:
    reply = s.chat_completion(None, model=GPT, tool_calls=[("c1", "lookup_customer", arguments)])
    with s.ScriptedServer([reply]) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        with pytest.raises(ReplayContractError) as caught:
            session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
    rules = {f.rule for f in caught.value.failures}
    # An empty text reads as {} (no arguments): the email invariant then fails, not the JSON.
    assert rules == ({"argument_invariant"} if arguments == "" else {"malformed_arguments"})
    assert "lookup_customer" in str(caught.value)


def test_malformed_arguments_in_a_stream_are_refused_and_never_reach_the_caller(spans: Spans) -> None:
    reply = s.chat_stream(("ok",), model=GPT, tool_calls=[("c1", "lookup_customer", '{"customer_email": ')])
    with s.ScriptedServer([reply]) as server:
        session = govern(openai_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        stream = session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS, stream=True)
        chunks = list(stream)
    assert not any(choice.delta.tool_calls for chunk in chunks for choice in chunk.choices)
    assert decisions(spans)[0][sc.CONTRACT_FAILURES][0]["rule"] == "malformed_arguments"


def test_two_thousand_tool_calls_in_one_response_get_one_decision_with_a_capped_span(spans: Spans) -> None:
    calls = [(f"c{i}", "lookup_customer", GOOD) for i in range(2000)]
    with s.ScriptedServer([s.chat_completion(None, model=GPT, tool_calls=calls)]) as server:
        session = govern(openai_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        response = session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
    kept = response.choices[0].message.tool_calls
    assert [c.id for c in kept] == ["c0"]  # the first advances the phase; the rest are out of phase or limited
    (span,) = decisions(spans)
    assert span[sc.CONTRACT_OUTCOME] == "strip"
    assert len(span[sc.CONTRACT_TOOLS]) == MAX_TOOLS
    assert span[sc.CONTRACT_TOOLS_DROPPED] == 2000 - MAX_TOOLS
    assert session.get_state()["tool_call_counts"] == {"lookup_customer": 1}


def test_two_thousand_streamed_anthropic_tool_uses_are_gated_once(spans: Spans) -> None:
    uses = [(f"t{i}", "lookup_customer", GOOD) for i in range(2000)]
    with s.ScriptedServer([s.anthropic_stream(("x",), model=CLAUDE, tool_uses=uses)]) as server:
        session = govern(anthropic_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        with session.client.messages.stream(
            model=CLAUDE, max_tokens=10, messages=HELLO, tools=ANTHROPIC_TOOLS
        ) as stream:
            final = stream.get_final_message()
    assert [b.id for b in final.content if b.type == "tool_use"] == ["t0"]
    assert len(decisions(spans)) == 1


def test_one_mebibyte_of_arguments_gets_a_verdict_and_a_cut_redacted_span(spans: Spans) -> None:
    huge = {"customer_email": "ana@example.com", "blob": "sk-proj-" + "z" * (1 << 20)}
    reply = s.chat_completion(None, model=GPT, tool_calls=[("c1", "lookup_customer", huge)])
    with s.ScriptedServer([reply]) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        response = session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
    assert json.loads(response.choices[0].message.tool_calls[0].function.arguments) == huge  # passed whole
    shown = decisions(spans)[0][sc.CONTRACT_TOOLS][0]["arguments"]
    assert len(shown) < MAX_ARGUMENT_CHARS + 64
    assert "zzzzzzzzzzzzzzzz" not in shown and "ana@example.com" not in shown


def test_a_call_of_a_tool_nobody_offered_or_contracted_is_unmatched(spans: Spans) -> None:
    reply = s.chat_completion(None, model=GPT, tool_calls=[("c1", "rm_rf_everything\n\x00", {"path": "/"})])
    with s.ScriptedServer([reply]) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        with pytest.raises(ReplayContractError) as caught:
            session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
    assert [f.rule for f in caught.value.failures] == ["unmatched"]
    assert "\n" not in str(caught.value)


def test_hostile_arguments_given_to_a_session_tool_get_a_verdict_not_an_exception(spans: Spans) -> None:
    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no")

    with s.ScriptedServer([]) as server:
        session = govern(
            openai_client(server),
            REFUND_BOT,
            tools={"lookup_customer": lambda **kw: "ran"},
            tracer_provider=spans.provider,
        )
        run = session.tools.lookup_customer({"customer_email": Unprintable()})
    assert run.result is None and not run.constraint_verdict.passed
    assert run.constraint_verdict.failures[0]["rule"] == "malformed_arguments"


def test_with_several_choices_no_choice_carries_an_unchecked_call(spans: Spans) -> None:
    reply = s.chat_completion(None, model=GPT, tool_calls=[("c1", "lookup_customer", GOOD)])
    body = dict(reply.body)
    second = json.loads(json.dumps(body["choices"][0]))
    second["index"] = 1
    second["message"]["tool_calls"][0].update(
        id="c2", function={"name": "lookup_customer", "arguments": '{"customer_email": "nope"}'}
    )
    body["choices"] = [body["choices"][0], second]
    with s.ScriptedServer([s.Reply(200, body)]) as server:
        session = govern(openai_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        response = session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS, n=2)
    first, other = response.choices
    assert [c.id for c in first.message.tool_calls] == ["c1"]
    assert other.message.tool_calls is None and other.finish_reason == "stop"
    assert [t["call_id"] for t in decisions(spans)[0][sc.CONTRACT_TOOLS]] == ["c1", "c2"]


REFUND = {"customer_id": "C1", "amount": 1, "currency": "USD"}


def _with_items(*items: dict[str, Any]) -> s.Reply:
    body = s.response_object("Working.", model=GPT)
    body["output"] += list(items)
    return s.Reply(200, body)


def test_a_forbidden_tool_dressed_as_a_custom_tool_call_is_gated_by_its_name(spans: Spans) -> None:
    custom = {"type": "custom_tool_call", "id": "ct1", "call_id": "k1", "name": "issue_refund", "input": "{}"}
    with s.ScriptedServer([_with_items({**custom, "input": json.dumps(REFUND)})]) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        offered = [{"type": "custom", "name": "issue_refund"}, {"type": "custom", "name": "lookup_customer"}]
        with pytest.raises(ReplayContractError) as caught:
            session.client.responses.create(model=GPT, input="hi", tools=offered)
        sent = server.requests[0]["json"]["tools"]
    assert {f.tool for f in caught.value.failures} == {"issue_refund"}
    assert [entry["name"] for entry in sent] == ["lookup_customer"]  # the custom tool is narrowed like a function


def test_a_shell_call_the_application_would_run_is_unmatched_without_a_contract(spans: Spans) -> None:
    shell = {
        "type": "local_shell_call",
        "id": "ls1",
        "call_id": "ls1",
        "status": "completed",
        "action": {"type": "exec", "command": ["rm", "-rf", "/"], "env": {}},
    }
    with s.ScriptedServer([_with_items(shell)]) as server:
        session = govern(openai_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        response = session.client.responses.create(model=GPT, input="hi", tools=[{"type": "local_shell"}])
        sent = server.requests[0]["json"]
    assert [item.type for item in response.output] == ["message"]
    assert "tools" not in sent  # no contract, unmatched_policy block: the model is not offered the shell
    [tool] = decisions(spans)[0][sc.CONTRACT_TOOLS]
    assert tool["name"] == "local_shell" and tool["allowed"] is False and "rm" in tool["arguments"]


def test_a_chat_custom_tool_call_is_gated_under_its_own_name(spans: Spans) -> None:
    body = s.chat_completion(None, model=GPT).body
    body["choices"][0]["message"]["tool_calls"] = [
        {"id": "k1", "type": "custom", "custom": {"name": "issue_refund", "input": json.dumps(REFUND)}}
    ]
    body["choices"][0]["finish_reason"] = "tool_calls"
    with s.ScriptedServer([s.Reply(200, body)]) as server:
        session = govern(openai_client(server), REFUND_BOT, unmatched_policy="allow", tracer_provider=spans.provider)
        with pytest.raises(ReplayContractError) as caught:
            session.client.chat.completions.create(
                model=GPT, messages=HELLO, tools=[{"type": "custom", "custom": {"name": "issue_refund"}}]
            )
    assert {f.rule for f in caught.value.failures} >= {"phase", "precondition"}
    assert {f.tool for f in caught.value.failures} == {"issue_refund"}


def _call_events(final_calls: list[tuple[str, str, Any]], streamed: dict[str, Any]) -> s.Reply:
    """A responses stream: one function call streamed as ``streamed`` says, then a final response of its own."""
    final = s.response_object("x", model=GPT, tool_calls=final_calls)
    item = {"type": "function_call", "id": "fc_f1", "call_id": "f1", "name": "lookup_customer", "status": "completed"}
    events: list[tuple[str | None, Any]] = []

    def add(kind: str, **fields: Any) -> None:
        events.append((kind, {"type": kind, "sequence_number": len(events), **fields}))

    add("response.created", response={**final, "status": "in_progress", "output": [], "usage": None})
    add("response.output_item.added", output_index=0, item={**item, "arguments": ""})
    for piece in streamed["deltas"]:
        add("response.function_call_arguments.delta", item_id="fc_f1", output_index=0, delta=piece)
    done = streamed["done"]
    add("response.function_call_arguments.done", item_id="fc_f1", output_index=0, name=item["name"], arguments=done)
    add("response.output_item.done", output_index=0, item={**item, "arguments": done})
    add("response.completed", response=final)
    return s.Reply(200, events=events)


def test_a_final_response_naming_other_calls_than_the_stream_delivers_only_the_gated_ones(spans: Spans) -> None:
    good = json.dumps(GOOD)
    reply = _call_events(
        [("f1", "issue_refund", REFUND), ("f9", "issue_refund", REFUND)], {"deltas": [good], "done": good}
    )
    with s.ScriptedServer([reply]) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        with session.client.responses.stream(model=GPT, input="hi", tools=RESPONSES_TOOLS) as stream:
            final = stream.get_final_response()
    calls = [(item.name, json.loads(item.arguments)) for item in final.output if item.type == "function_call"]
    assert calls == [("lookup_customer", GOOD)]


def test_streamed_argument_deltas_that_disagree_with_the_final_arguments_reach_the_caller_as_gated(
    spans: Spans,
) -> None:
    forged = json.dumps({"customer_email": "no address"})
    reply = _call_events(
        [("f1", "lookup_customer", GOOD)], {"deltas": [forged[:9], forged[9:]], "done": json.dumps(GOOD)}
    )
    with s.ScriptedServer([reply]) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        events = list(session.client.responses.create(model=GPT, input="hi", tools=RESPONSES_TOOLS, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(deltas) == GOOD and [json.loads(d) for d in done] == [GOOD]
    assert decisions(spans)[0][sc.CONTRACT_OUTCOME] == "allow"


@pytest.mark.parametrize(
    "name", ["Issue_Refund", "issue_refund ", "issue-refund", "ｉｓｓｕｅ_ｒｅｆｕｎｄ", "issue_\u2009refund"]
)
def test_a_contracted_tool_under_another_case_or_spacing_is_not_let_through_as_unknown(spans: Spans, name: str) -> None:
    args = {"customer_id": "C1", "amount": 5000, "currency": "XXX"}
    with s.ScriptedServer([s.chat_completion(None, model=GPT, tool_calls=[("c1", name, args)])]) as server:
        session = govern(openai_client(server), REFUND_BOT, unmatched_policy="allow", tracer_provider=spans.provider)
        with pytest.raises(ReplayContractError) as caught:
            session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
    [failure] = caught.value.failures
    # named as a disguise of the contracted tool, or (a character no tool name may hold) as no tool name at all
    assert failure.rule == "unmatched"
    assert "issue_refund" in failure.detail or "is not a tool name" in failure.detail


def test_under_unmatched_policy_allow_an_unknown_tool_still_passes(spans: Spans) -> None:
    reply = s.chat_completion(None, model=GPT, tool_calls=[("c1", "get_weather", {"city": "Oslo"})])
    with s.ScriptedServer([reply]) as server:
        session = govern(openai_client(server), REFUND_BOT, unmatched_policy="allow", tracer_provider=spans.provider)
        response = session.client.chat.completions.create(model=GPT, messages=HELLO)
    assert [c.function.name for c in response.choices[0].message.tool_calls] == ["get_weather"]


def _legacy_function_call(name: str, arguments: Any) -> s.Reply:
    """A chat answer whose call comes in the deprecated ``message.function_call`` field (the ``functions`` API)."""
    reply = s.chat_completion(None, model=GPT)
    choice = reply.body["choices"][0]
    choice["message"]["function_call"] = {"name": name, "arguments": json.dumps(arguments)}
    choice["finish_reason"] = "function_call"
    return reply


FUNCTIONS = [tool["function"] for tool in CHAT_TOOLS]


def test_a_call_in_the_deprecated_function_call_field_is_gated_like_a_tool_call(spans: Spans) -> None:
    """The openai client still parses ``message.function_call``; an application on ``functions=`` runs it."""
    with s.ScriptedServer([_legacy_function_call("lookup_customer", BAD)]) as server:
        session = govern(openai_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        response = session.client.chat.completions.create(model=GPT, messages=HELLO, functions=FUNCTIONS)
    assert response.choices[0].message.function_call is None
    assert response.choices[0].finish_reason == "stop"
    assert decisions(spans)[0][sc.CONTRACT_FAILURES][0]["rule"] == "argument_invariant"


def test_an_allowed_call_in_the_deprecated_function_call_field_reaches_the_caller(spans: Spans) -> None:
    with s.ScriptedServer([_legacy_function_call("lookup_customer", GOOD)]) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        response = session.client.chat.completions.create(model=GPT, messages=HELLO, functions=FUNCTIONS)
    call = response.choices[0].message.function_call
    assert call.name == "lookup_customer" and json.loads(call.arguments) == GOOD
    assert decisions(spans)[0][sc.CONTRACT_OUTCOME] == "allow"


@pytest.mark.parametrize("arguments", [BAD, GOOD], ids=["refused", "allowed"])
def test_a_streamed_call_in_the_deprecated_function_call_field_is_gated_before_the_caller_sees_it(
    spans: Spans, arguments: dict[str, str]
) -> None:
    reply = s.chat_stream(("",), model=GPT)
    text = json.dumps(arguments)
    *head, finish, usage, done = reply.events or ()
    pieces = [{"name": "lookup_customer", "arguments": ""}, {"arguments": text[:7]}, {"arguments": text[7:]}]
    calls = [(None, {**head[-1][1], "choices": [{"index": 0, "delta": {"function_call": p}}]}) for p in pieces]
    finish[1]["choices"][0]["finish_reason"] = "function_call"
    events = [*head, *calls, finish, usage, done]
    with s.ScriptedServer([s.Reply(200, events=events)]) as server:
        session = govern(openai_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        stream = session.client.chat.completions.create(model=GPT, messages=HELLO, functions=FUNCTIONS, stream=True)
        chunks = list(stream)
    delivered = [c.delta.function_call for chunk in chunks for c in chunk.choices if c.delta.function_call]
    finish = [c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason]
    if arguments == BAD:
        assert delivered == [] and finish == ["stop"]
        assert decisions(spans)[0][sc.CONTRACT_FAILURES][0]["rule"] == "argument_invariant"
    else:  # released whole, in the field it came in
        assert [(d.name, json.loads(d.arguments)) for d in delivered] == [("lookup_customer", GOOD)]
        assert finish == ["function_call"]


def _chunk(delta: dict[str, Any], finish: str | None = None, index: Any = 0) -> dict[str, Any]:
    return {
        "id": "chatcmpl-x",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": GPT,
        "choices": [{"index": index, "delta": delta, "finish_reason": finish}],
    }


@pytest.mark.parametrize(
    ("call_index", "choice_index"),
    [(1, 0), (None, 0), ([1], 0), ({"i": 1}, 0), (1, None)],
    ids=["int", "null-call-index", "list-call-index", "object-call-index", "null-choice-index"],
)
def test_a_streamed_tool_call_at_an_index_that_is_not_a_number_gets_a_verdict_not_a_crash(
    spans: Spans, call_index: Any, choice_index: Any
) -> None:
    """The client builds chunks without validating them: an index of null or [1] crashed the gate with a
    TypeError of ours (sorting or hashing the held calls), and the response's decision was never recorded."""
    first = {"index": 0, "id": "c1", "type": "function", "function": {"name": "lookup_customer", "arguments": ""}}
    second = {"index": call_index, "id": "c2", "type": "function", "function": {"name": "issue_refund"}}
    events = [
        (None, _chunk({"role": "assistant", "content": ""})),
        (None, _chunk({"tool_calls": [first]})),
        (None, _chunk({"tool_calls": [{"index": 0, "function": {"arguments": json.dumps(GOOD)}}]})),
        (None, _chunk({"tool_calls": [second]}, index=choice_index)),
        (None, _chunk({"tool_calls": [{"index": call_index, "function": {"arguments": json.dumps(REFUND)}}]})),
        (None, _chunk({}, "tool_calls")),
        (None, "[DONE]"),
    ]
    with s.ScriptedServer([s.Reply(200, events=events)]) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        stream = session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS, stream=True)
        with pytest.raises(ReplayContractError) as caught:
            list(stream)
    assert caught.value.failures  # issue_refund out of phase; with the choice index null, also a nameless call
    [decision] = decisions(spans)
    assert decision[sc.CONTRACT_OUTCOME] == "reject"


@pytest.mark.parametrize("index", [2, None, [2], "2"], ids=["int", "null", "list", "text"])
def test_a_streamed_anthropic_tool_use_at_an_index_that_is_not_a_number_gets_a_verdict_not_a_crash(
    spans: Spans, index: Any
) -> None:
    uses = [("t1", "lookup_customer", GOOD), ("t2", "issue_refund", REFUND)]
    reply = s.anthropic_stream(("x",), model=CLAUDE, tool_uses=uses)
    events = [(name, {**data, "index": index} if data.get("index") == 2 else data) for name, data in reply.events or ()]
    with s.ScriptedServer([s.Reply(200, events=events)]) as server:
        session = govern(anthropic_client(server), REFUND_BOT, tracer_provider=spans.provider)
        stream = session.client.messages.create(
            model=CLAUDE, max_tokens=10, messages=HELLO, tools=ANTHROPIC_TOOLS, stream=True
        )
        with pytest.raises(ReplayContractError) as caught:
            list(stream)
    assert "issue_refund" in str(caught.value)
    [decision] = decisions(spans)
    assert decision[sc.CONTRACT_OUTCOME] == "reject"


@pytest.mark.parametrize(
    "function_call",
    [{"name": ["issue_refund"], "arguments": "{}"}, "issue_refund", {"name": "issue_refund", "arguments": None}],
    ids=["name-a-list", "text", "arguments-null"],
)
def test_a_deprecated_function_call_of_odd_shape_is_stripped_and_its_decision_recorded(
    spans: Spans, function_call: Any
) -> None:
    reply = s.chat_completion(None, model=GPT)
    reply.body["choices"][0]["message"]["function_call"] = function_call
    with s.ScriptedServer([reply]) as server:
        session = govern(openai_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        try:
            response = session.client.chat.completions.create(model=GPT, messages=HELLO, functions=FUNCTIONS)
        except ReplayContractError:  # issue_refund out of phase rejects the whole response
            pass
        else:
            assert response.choices[0].message.function_call is None
    [decision] = decisions(spans)  # before, the decision span was dropped: its redaction failed on the name
    assert decision[sc.CONTRACT_OUTCOME] in ("text_only", "reject") and decision[sc.CONTRACT_FAILURES]


@pytest.mark.parametrize(
    "block",
    [
        {"type": "tool_use", "id": "t1", "name": ["issue_refund"], "input": {}},
        {"type": "tool_use", "id": "t1", "name": 5, "input": {}},
        {"type": "tool_use", "id": ["t1"], "name": "issue_refund", "input": REFUND},
    ],
    ids=["name-a-list", "name-a-number", "id-a-list"],
)
def test_a_tool_use_named_or_numbered_by_something_not_text_is_blocked_and_its_decision_recorded(
    spans: Spans, block: dict[str, Any]
) -> None:
    """The call was blocked, but the decision span was dropped ("redaction failed"): the block left no record."""
    reply = s.anthropic_message(None, model=CLAUDE, tool_uses=[("t0", "lookup_customer", GOOD)])
    reply.body["content"].append(block)
    with s.ScriptedServer([reply]) as server:
        session = govern(anthropic_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        try:
            response = session.client.messages.create(
                model=CLAUDE, max_tokens=10, messages=HELLO, tools=ANTHROPIC_TOOLS
            )
        except ReplayContractError:  # issue_refund out of phase rejects the whole response
            pass
        else:
            assert [b.id for b in response.content if b.type == "tool_use"] == ["t0"]
    [decision] = decisions(spans)
    assert decision[sc.CONTRACT_OUTCOME] in ("strip", "reject") and decision[sc.CONTRACT_FAILURES]
    assert session.get_health()["evidence_dropped"] == 0


@pytest.mark.parametrize("output_index", [None, "0", [0], "missing"], ids=["null", "text", "list", "missing"])
def test_a_responses_call_streamed_at_an_output_index_that_is_not_a_number_is_held_and_gated(
    spans: Spans, output_index: Any
) -> None:
    """Events whose output_index was not an int passed straight through: output_item.done handed the caller a
    forbidden issue_refund before anything was gated (and the gate never saw it)."""
    refund = json.dumps(REFUND)
    reply = _call_events([("f1", "issue_refund", REFUND)], {"deltas": [refund], "done": refund})
    events = []
    for name, data in reply.events or ():
        if "output_index" in data:
            data = {**data, "output_index": output_index}
            if output_index == "missing":
                del data["output_index"]
            if "item" in data:
                data["item"] = {**data["item"], "name": "issue_refund"}
        events.append((name, data))
    with s.ScriptedServer([s.Reply(200, events=events)]) as server:
        session = govern(openai_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        stream = session.client.responses.create(model=GPT, input="hi", tools=RESPONSES_TOOLS, stream=True)
        delivered: list[Any] = []
        with pytest.raises(ReplayContractError):
            delivered.extend(stream)
    items = [getattr(e, "item", None) for e in delivered]
    assert not [item for item in items if getattr(item, "name", None) == "issue_refund"]
    assert not [e for e in delivered if getattr(e, "type", "").startswith("response.function_call_arguments")]
    assert decisions(spans)[0][sc.CONTRACT_OUTCOME] == "reject"


def test_an_allowed_responses_call_streamed_without_an_output_index_is_released_whole(spans: Spans) -> None:
    good = json.dumps(GOOD)
    reply = _call_events([("f1", "lookup_customer", GOOD)], {"deltas": [good[:5], good[5:]], "done": good})
    events = [(name, {k: v for k, v in data.items() if k != "output_index"}) for name, data in reply.events or ()]
    with s.ScriptedServer([s.Reply(200, events=events)]) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        delivered = list(session.client.responses.create(model=GPT, input="hi", tools=RESPONSES_TOOLS, stream=True))
    deltas = [e.delta for e in delivered if e.type == "response.function_call_arguments.delta"]
    done = [e.item for e in delivered if e.type == "response.output_item.done"]
    assert deltas == [good] and [(i.name, json.loads(i.arguments)) for i in done] == [("lookup_customer", GOOD)]
    assert decisions(spans)[0][sc.CONTRACT_OUTCOME] == "allow"
