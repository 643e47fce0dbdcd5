"""Shadow and log-only modes, the Anthropic and OpenAI responses APIs, ``with_raw_response``, bypass detection,
callbacks, retries and the health report."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest

from otel_replay import semconv as sc
from otel_replay.contracts.session import govern
from otel_replay.errors import ContractError, ReplayContractError, ReplayKillError
from otel_replay.instrumentation import OpenAIInstrumentor
from otel_replay.instrumentation import scripted as s

from .govern_support import (
    ANTHROPIC_TOOLS,
    CHAT_TOOLS,
    CLAUDE,
    GPT,
    REFUND_BOT,
    RESPONSES_TOOLS,
    Spans,
    anthropic_client,
    decisions,
    openai_client,
)

GOOD = {"customer_email": "ana@example.com"}
BAD = {"customer_email": "no address"}
HELLO = [{"role": "user", "content": "hi"}]



def test_shadow_never_blocks_never_changes_state_and_reports_what_it_would_have_done(spans: Spans) -> None:
    refund = s.chat_completion(None, model=GPT, tool_calls=[("c1", "issue_refund", {"amount": 1})])
    with s.ScriptedServer([refund]) as server:
        session = govern(openai_client(server), REFUND_BOT, mode="shadow", tracer_provider=spans.provider)
        response = session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
        sent = server.requests[0]["json"]
    assert response.choices[0].message.tool_calls[0].function.name == "issue_refund"  # passed unchanged
    assert len(sent["tools"]) == 3  # nothing narrowed
    delta = session.last_shadow_delta
    assert delta is not None and delta.outcome == "reject"
    assert [b["name"] for b in delta.would_have_blocked] == ["issue_refund"]
    assert {f["rule"] for f in delta.would_have_blocked[0]["failures"]} >= {"phase", "precondition"}
    assert sorted(delta.would_have_narrowed) == ["check_eligibility", "issue_refund"]
    state = session.get_state()
    assert state["total_step_count"] == 0 and state["current_phase"] == "triage"
    assert session.get_health()["shadow_evaluations"] == 1
    assert session.get_health()["protection_level"] == "monitor"
    assert decisions(spans)[0][sc.CONTRACT_MODE] == "shadow"


def test_log_only_checks_nothing_and_records_the_calls(spans: Spans) -> None:
    refund = s.chat_completion(None, model=GPT, tool_calls=[("c1", "issue_refund", {"amount": 1})])
    with s.ScriptedServer([refund]) as server:
        session = govern(openai_client(server), REFUND_BOT, mode="log-only", tracer_provider=spans.provider)
        response = session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
    assert response.choices[0].message.tool_calls[0].function.name == "issue_refund"
    assert session.last_shadow_delta is None
    seen = decisions(spans)
    assert seen[0][sc.CONTRACT_OUTCOME] == "logged"
    assert [t["name"] for t in seen[0][sc.CONTRACT_TOOLS]] == ["issue_refund"]


def test_anthropic_messages_create_narrows_and_strips_like_openai(spans: Spans) -> None:
    reply = s.anthropic_message(
        "Looking.", model=CLAUDE, tool_uses=[("t1", "lookup_customer", BAD), ("t2", "lookup_customer", GOOD)]
    )
    with s.ScriptedServer([reply]) as server:
        session = govern(anthropic_client(server), REFUND_BOT, gate="strip_partial", tracer_provider=spans.provider)
        message = session.client.messages.create(model=CLAUDE, max_tokens=50, messages=HELLO, tools=ANTHROPIC_TOOLS)
        sent = server.requests[0]["json"]
    assert [t["name"] for t in sent["tools"]] == ["lookup_customer"]
    assert [(b.type, getattr(b, "id", None)) for b in message.content] == [("text", None), ("tool_use", "t2")]
    assert message.stop_reason == "tool_use"


def test_anthropic_tool_result_blocks_satisfy_with_output(spans: Spans) -> None:
    replies = [
        s.anthropic_message(None, model=CLAUDE, tool_uses=[("t1", "lookup_customer", GOOD)]),
        s.anthropic_message(None, model=CLAUDE, tool_uses=[("t2", "check_eligibility", {"order_id": "ORD-1"})]),
        s.anthropic_message(
            None,
            model=CLAUDE,
            tool_uses=[("t3", "issue_refund", {"customer_id": "C1", "amount": 5, "currency": "EUR"})],
        ),
    ]
    with s.ScriptedServer(replies) as server:
        session = govern(anthropic_client(server), REFUND_BOT, tracer_provider=spans.provider)
        ask = session.client.messages.create
        ask(model=CLAUDE, max_tokens=50, messages=HELLO, tools=ANTHROPIC_TOOLS)
        ask(model=CLAUDE, max_tokens=50, messages=HELLO, tools=ANTHROPIC_TOOLS)
        history = HELLO + [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t2", "name": "check_eligibility", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t2", "content": '{"eligible": true}'}],
            },
        ]
        message = ask(model=CLAUDE, max_tokens=50, messages=history, tools=ANTHROPIC_TOOLS)
    assert message.content[0].name == "issue_refund"
    assert session.get_state()["current_phase"] == "refund_issued"


def test_responses_api_is_governed_and_a_refused_function_call_is_stripped(spans: Spans) -> None:
    body = s.response_object(
        "Here.", model=GPT, tool_calls=[("f1", "lookup_customer", BAD), ("f2", "lookup_customer", GOOD)]
    )
    with s.ScriptedServer([s.Reply(200, body)]) as server:
        session = govern(openai_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        response = session.client.responses.create(model=GPT, input="hi", tools=RESPONSES_TOOLS)
        sent = server.requests[0]["json"]
    assert [t["name"] for t in sent["tools"]] == ["lookup_customer"]
    calls = [item.call_id for item in response.output if item.type == "function_call"]
    assert calls == ["f2"]
    assert decisions(spans)[0][sc.CONTRACT_API] == "responses"


def test_with_raw_response_is_governed_and_parse_shows_the_stripped_response(spans: Spans) -> None:
    reply = s.chat_completion(
        "x", model=GPT, tool_calls=[("c1", "lookup_customer", BAD), ("c2", "lookup_customer", GOOD)]
    )
    with s.ScriptedServer([reply]) as server:
        session = govern(openai_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        raw = session.client.chat.completions.with_raw_response.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
    assert raw.status_code == 200
    assert [c.id for c in raw.parse().choices[0].message.tool_calls] == ["c2"]


def test_a_call_on_the_original_client_is_reported_as_a_bypass(spans: Spans) -> None:
    with s.ScriptedServer([s.chat_completion("a", model=GPT), s.chat_completion("b", model=GPT)]) as server:
        original = openai_client(server)
        events: list[dict[str, Any]] = []
        session = govern(original, REFUND_BOT, diagnostics=events.append, tracer_provider=spans.provider)
        session.client.chat.completions.create(model=GPT, messages=HELLO)
        assert session.get_health()["bypass_detected"] is False
        original.chat.completions.create(model=GPT, messages=HELLO)
    health = session.get_health()
    assert health["bypass_detected"] is True and health["bypass_calls"] == 1
    assert health["status"] == "degraded"
    assert [e["event"] for e in events] == ["bypass_detected"]


def test_governing_the_same_client_twice_is_refused(spans: Spans) -> None:
    with s.ScriptedServer([]) as server:
        client = openai_client(server)
        govern(client, REFUND_BOT, tracer_provider=spans.provider)
        with pytest.raises(ContractError, match="already governed"):
            govern(client, REFUND_BOT, tracer_provider=spans.provider)


def test_a_client_that_is_not_openai_or_anthropic_is_refused_by_name() -> None:
    with pytest.raises(ContractError, match="builtins.object is not an OpenAI or Anthropic client"):
        govern(object(), REFUND_BOT)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("mode", "enforcing"),
        ("gate", "strip"),
        ("max_retries", 6),
        ("max_unguarded_calls", 0),
        ("capture_level", "full"),
    ],
)
def test_bad_options_are_refused_with_the_option_named(spans: Spans, option: str, value: Any) -> None:
    with s.ScriptedServer([]) as server:
        with pytest.raises(ContractError, match=option):
            govern(openai_client(server), REFUND_BOT, **{option: value})


def test_on_block_and_on_narrow_are_called_and_a_raising_callback_does_not_break_the_call(spans: Spans) -> None:
    blocked: list[Any] = []
    narrowed: list[Any] = []

    def broken(_: Any) -> None:
        raise RuntimeError("callback bug")

    reply = s.chat_completion(
        "x", model=GPT, tool_calls=[("c1", "lookup_customer", BAD), ("c2", "lookup_customer", GOOD)]
    )
    with s.ScriptedServer([reply, reply]) as server:
        session = govern(
            openai_client(server),
            REFUND_BOT,
            gate="strip_blocked",
            on_block=blocked.append,
            on_narrow=narrowed.append,
            tracer_provider=spans.provider,
        )
        session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
        other = govern(
            openai_client(server), REFUND_BOT, gate="strip_blocked", on_block=broken, tracer_provider=spans.provider
        )
        response = other.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
    assert [d.outcome for d in blocked] == ["strip"]
    assert sorted(narrowed[0].removed) == ["check_eligibility", "issue_refund"]
    assert [c.id for c in response.choices[0].message.tool_calls] == ["c2"]
    assert other.get_health()["callback_errors"] == 1


def test_max_retries_asks_the_model_again_after_a_rejection(spans: Spans) -> None:
    bad = s.chat_completion(None, model=GPT, tool_calls=[("c1", "lookup_customer", BAD)])
    good = s.chat_completion(None, model=GPT, tool_calls=[("c2", "lookup_customer", GOOD)])
    with s.ScriptedServer([bad, good]) as server:
        session = govern(openai_client(server), REFUND_BOT, max_retries=1, tracer_provider=spans.provider)
        response = session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
        asked = len(server.requests)
    assert asked == 2
    assert response.choices[0].message.tool_calls[0].id == "c2"
    assert session.get_state()["total_step_count"] == 2


def test_narrow_and_widen_restrict_the_offered_tools_on_top_of_the_contracts(spans: Spans) -> None:
    replies = [s.chat_completion("a", model=GPT), s.chat_completion("b", model=GPT)]
    with s.ScriptedServer(replies) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        session.narrow(["check_eligibility"])
        session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
        session.widen()
        session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
        sent = [r["json"] for r in server.requests]
    assert "tools" not in sent[0]
    assert [t["function"]["name"] for t in sent[1]["tools"]] == ["lookup_customer"]
    assert session.get_state()["control_revision"] == 2


def test_precheck_stops_a_model_without_a_price_under_a_cost_cap_before_calling_it(spans: Spans) -> None:
    with s.ScriptedServer([s.chat_completion("a")]) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        with pytest.raises(ReplayContractError, match="max_cost") as caught:
            session.client.chat.completions.create(model="gpt-unpriced", messages=HELLO)
        assert server.requests == []
    assert caught.value.failures[0].rule == "max_cost"


def test_an_async_client_is_governed(spans: Spans) -> None:
    reply = s.chat_completion(
        "x", model=GPT, tool_calls=[("c1", "lookup_customer", BAD), ("c2", "lookup_customer", GOOD)]
    )
    claude = s.anthropic_message(None, model=CLAUDE, tool_uses=[("t1", "issue_refund", {"amount": 3})])

    async def run(server: s.ScriptedServer) -> tuple[Any, BaseException | None]:
        oai = govern(openai_client(server, aio=True), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        response = await oai.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
        ant = govern(anthropic_client(server, aio=True), REFUND_BOT, tracer_provider=spans.provider)
        try:
            await ant.client.messages.create(model=CLAUDE, max_tokens=5, messages=HELLO, tools=ANTHROPIC_TOOLS)
        except ReplayContractError as exc:
            return response, exc
        finally:
            await oai.client.close()
            await ant.client.close()
        return response, None

    with s.ScriptedServer([reply, claude]) as server:
        response, error = asyncio.run(run(server))
    assert [c.id for c in response.choices[0].message.tool_calls] == ["c2"]
    assert isinstance(error, ReplayContractError)


def test_the_circuit_breaker_kills_the_session_after_three_blocked_responses(spans: Spans) -> None:
    refund = s.chat_completion(None, model=GPT, tool_calls=[("c1", "issue_refund", {"amount": 1})])
    with s.ScriptedServer(default=refund) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        for _ in range(3):
            with pytest.raises(ReplayContractError):
                session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
        asked = len(server.requests)
        with pytest.raises(ReplayKillError, match="circuit breaker"):
            session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
        assert len(server.requests) == asked  # the killed session never reached the model
    assert session.get_health()["killed"] is True


def test_max_steps_stops_the_eleventh_call_before_the_model_is_asked(spans: Spans) -> None:
    with s.ScriptedServer(default=s.chat_completion("ok", model=GPT)) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        for _ in range(10):
            session.client.chat.completions.create(model=GPT, messages=HELLO)
        with pytest.raises(ReplayContractError, match="max_steps"):
            session.client.chat.completions.create(model=GPT, messages=HELLO)
        assert len(server.requests) == 10
    last = decisions(spans)[-1]  # the refusal before the call is a decision too
    assert last[sc.CONTRACT_OUTCOME] == "reject" and last[sc.CONTRACT_TOOLS] == []
    assert [f["rule"] for f in last[sc.CONTRACT_FAILURES]] == ["max_steps"]
    assert session.get_state()["total_block_count"] == 1


def test_a_method_govern_does_not_cover_is_reported_as_a_bypass_not_silently_ungoverned(spans: Spans) -> None:
    with s.ScriptedServer([s.chat_completion("a", model=GPT)]) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        with session.client.chat.completions.with_streaming_response.create(model=GPT, messages=HELLO) as raw:
            raw.read()
    assert session.get_health()["bypass_detected"] is True


def test_an_error_of_the_model_api_reaches_the_caller_as_the_clients_own_exception(spans: Spans) -> None:
    with s.ScriptedServer([s.error(500, "scripted outage", "server_error")]) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        with pytest.raises(openai.InternalServerError, match="scripted outage"):
            session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
    assert session.get_state()["total_step_count"] == 0
    assert decisions(spans) == []


def test_a_request_that_generates_nothing_on_the_original_client_is_not_a_bypass(spans: Spans) -> None:
    models = s.Reply(200, {"object": "list", "data": [{"id": GPT, "object": "model", "created": 1, "owned_by": "x"}]})
    with s.ScriptedServer([models]) as server:
        original = openai_client(server)
        session = govern(original, REFUND_BOT, tracer_provider=spans.provider)
        assert [m.id for m in original.models.list()] == [GPT]
    assert session.get_health()["bypass_detected"] is False


def test_govern_over_the_instrumentor_records_the_model_span_with_every_call_and_one_decision(spans: Spans) -> None:
    reply = s.chat_completion(
        "x", model=GPT, tool_calls=[("c1", "lookup_customer", BAD), ("c2", "lookup_customer", GOOD)]
    )
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=spans.provider)
    try:
        with s.ScriptedServer([reply]) as server:
            session = govern(openai_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
            response = session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
    finally:
        instrumentor.uninstrument()
    assert [c.id for c in response.choices[0].message.tool_calls] == ["c2"]
    model_spans = [span for span in spans.finished() if span.name == f"chat {GPT}"]
    assert len(model_spans) == 1
    asked = json.loads(model_spans[0].attributes[sc.MODEL_TOOL_CALLS])
    assert len(asked) == 2  # the model span says what the model asked for; the decision what was allowed
    assert decisions(spans)[0][sc.CONTRACT_OUTCOME] == "strip"


def test_the_raw_body_of_a_stripped_response_says_what_parse_says(spans: Spans) -> None:
    reply = s.chat_completion(
        "x", model=GPT, tool_calls=[("c1", "lookup_customer", BAD), ("c2", "lookup_customer", GOOD)]
    )
    with s.ScriptedServer([reply]) as server:
        session = govern(openai_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        raw = session.client.chat.completions.with_raw_response.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
    for body in (json.loads(raw.text), json.loads(raw.content), raw.http_response.json()):
        assert [c["id"] for c in body["choices"][0]["message"]["tool_calls"]] == ["c2"]
    assert raw.status_code == 200 and raw.headers["content-type"] == "application/json"


def test_the_raw_body_of_a_governed_streamed_response_is_refused_but_parse_gives_the_governed_stream(
    spans: Spans,
) -> None:
    reply = s.chat_stream(("ok",), model=GPT, tool_calls=[("c1", "lookup_customer", BAD)])
    with s.ScriptedServer([reply]) as server:
        session = govern(openai_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        raw = session.client.chat.completions.with_raw_response.create(
            model=GPT, messages=HELLO, tools=CHAT_TOOLS, stream=True
        )
        for what in ("text", "content", "http_response"):
            with pytest.raises(ContractError, match=f"the {what} of a governed streamed response"):
                getattr(raw, what)
        chunks = list(raw.parse())
    assert not any(choice.delta.tool_calls for chunk in chunks for choice in chunk.choices)
