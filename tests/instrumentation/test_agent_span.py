"""invoke_agent: the agent's span, its name on every model and tool call inside, in threads and tasks."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

import otel_replay
from otel_replay import audit, invoke_agent
from otel_replay import semconv as sc
from otel_replay.instrumentation import OpenAIInstrumentor, tool
from otel_replay.instrumentation import scripted as s
from tests._support import snapshot

from .conftest import Pipeline

MESSAGES = [{"role": "user", "content": "go"}]


def _ask(server, model: str = "gpt-test") -> str:
    with openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0) as c:
        return c.chat.completions.create(model=model, messages=MESSAGES).choices[0].message.content


def test_model_and_tool_spans_inside_are_children_and_carry_the_name(server, instrumented: Pipeline):
    @tool(tracer_provider=instrumented.provider)
    def lookup(x: str) -> str:
        return x

    server.enqueue(s.chat_completion("ok"))
    with invoke_agent(
        "pricer", agent_id="pricer-eu-7", description="sizes trades", tracer_provider=instrumented.provider
    ):
        with audit("size_trade", snapshot=snapshot()) as d:
            _ask(server)
            lookup("eur")
    agent = instrumented.one("invoke_agent pricer")
    assert agent.kind.name == "INTERNAL"
    assert agent.attributes[sc.GEN_AI_OPERATION_NAME] == "invoke_agent"
    assert agent.attributes[sc.GEN_AI_AGENT_NAME] == "pricer"
    assert agent.attributes[sc.GEN_AI_AGENT_DESCRIPTION] == "sizes trades"
    assert agent.attributes[sc.GEN_AI_AGENT_ID] == "pricer-eu-7"
    decision = instrumented.one("replay.decision")
    assert decision.parent.span_id == agent.context.span_id
    assert decision.attributes[sc.AGENT_ID] == "pricer-eu-7"  # the id is in scope for decisions too
    for child in (instrumented.one("chat gpt-test"), instrumented.one("execute_tool lookup")):
        assert child.attributes[sc.GEN_AI_AGENT_NAME] == "pricer"
        assert child.attributes[sc.RECORD_ID] == d.record_id
        assert child.context.trace_id == agent.context.trace_id


def test_nested_agents_stamp_the_innermost_name_and_restore_the_outer(server, instrumented: Pipeline):
    server.enqueue(s.chat_completion("a"), s.chat_completion("b"), s.chat_completion("c"))
    with invoke_agent("planner", tracer_provider=instrumented.provider):
        _ask(server, "gpt-1")
        with invoke_agent("researcher", tracer_provider=instrumented.provider):
            _ask(server, "gpt-2")
        _ask(server, "gpt-3")
    names = {sp.name: sp.attributes.get(sc.GEN_AI_AGENT_NAME) for sp in instrumented.spans("chat")}
    assert names == {"chat gpt-1": "planner", "chat gpt-2": "researcher", "chat gpt-3": "planner"}
    inner = instrumented.one("invoke_agent researcher")
    assert inner.parent.span_id == instrumented.one("invoke_agent planner").context.span_id


def test_no_name_outside_any_agent(server, instrumented: Pipeline):
    server.enqueue(s.chat_completion("x"))
    with invoke_agent("a", tracer_provider=instrumented.provider):
        pass
    _ask(server)
    assert sc.GEN_AI_AGENT_NAME not in instrumented.one("chat").attributes


def test_thread_pool_and_asyncio_work_keeps_the_name(server, instrumented: Pipeline):
    server.enqueue(*[s.chat_completion(f"r{i}") for i in range(5)])

    async def async_ask(i: int) -> str:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0) as c:
            reply = await c.chat.completions.create(model=f"gpt-async-{i}", messages=MESSAGES)
        return reply.choices[0].message.content

    async def tasks() -> list[str]:
        return await asyncio.gather(*(asyncio.create_task(async_ask(i)) for i in range(2)))

    with invoke_agent("fanout", tracer_provider=instrumented.provider):
        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(lambda i: _ask(server, f"gpt-pool-{i}"), range(3)))
        asyncio.run(tasks())
    chats = instrumented.spans("chat")
    assert len(chats) == 5
    agent = instrumented.one("invoke_agent fanout")
    assert all(sp.attributes.get(sc.GEN_AI_AGENT_NAME) == "fanout" for sp in chats)
    assert all(sp.context.trace_id == agent.context.trace_id for sp in chats)


def test_an_exception_marks_the_span_and_propagates_unchanged(instrumented: Pipeline):
    class Boom(Exception):
        pass

    with pytest.raises(Boom) as raised:
        with invoke_agent("faulty", tracer_provider=instrumented.provider):
            raise Boom("the agent failed")
    assert str(raised.value) == "the agent failed"
    span = instrumented.one("invoke_agent faulty")
    assert span.status.status_code.name == "ERROR" and span.attributes[sc.ERROR_TYPE].endswith("Boom")
    with invoke_agent("next", tracer_provider=instrumented.provider):
        pass
    assert instrumented.one("invoke_agent next").parent is None  # the failed agent's context was detached


@pytest.mark.parametrize("bad", ["", "   ", None, 7])
def test_a_bad_name_is_refused_with_one_line(bad, instrumented: Pipeline):
    with pytest.raises(ValueError, match="agent name must be a non-empty string"):
        with invoke_agent(bad, tracer_provider=instrumented.provider):  # type: ignore[arg-type]
            pass
    assert instrumented.spans() == []


def test_the_agent_span_is_not_a_model_call_in_the_dataset(server, telemetry, dataset: Path):
    OpenAIInstrumentor().instrument(tracer_provider=telemetry.provider, capture_content=False)
    try:
        server.enqueue(s.chat_completion("ok"))
        with invoke_agent("pricer", tracer_provider=telemetry.provider):
            _ask(server)
    finally:
        OpenAIInstrumentor().uninstrument()
    telemetry.shutdown()
    store = otel_replay.open(dataset)
    rows = store.rows("SELECT model, agent_name FROM model_calls")
    assert rows == [{"model": "gpt-test", "agent_name": "pricer"}]
    sql = "SELECT name, attributes ->> '$.\"gen_ai.agent.name\"' AS n FROM spans WHERE name LIKE 'invoke%'"
    [agent] = store.rows(sql)
    assert agent == {"name": "invoke_agent pricer", "n": "pricer"}
