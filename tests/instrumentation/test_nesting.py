"""A decision's model and tool spans are its children, with its record id: inline, in threads, tasks and generators."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import openai

from otel_replay import audit, correlation, session
from otel_replay import semconv as sc
from otel_replay.instrumentation import scripted as s
from otel_replay.instrumentation import tool
from tests._support import snapshot

from .conftest import Pipeline

MESSAGES = [{"role": "user", "content": "go"}]


def assert_children_of_the_decision(pipeline: Pipeline, record_id: str, expected: int) -> None:
    [decision] = [d for d in pipeline.spans("replay.decision") if d.attributes[sc.RECORD_ID] == record_id]
    children = [sp for sp in pipeline.spans() if sp.name.startswith(("chat", "execute_tool"))]
    assert len(children) == expected, [sp.name for sp in children]
    for child in children:
        assert child.context.trace_id == decision.context.trace_id
        assert child.attributes[sc.RECORD_ID] == record_id, child.name
        if child.name.startswith("execute_tool"):
            assert child.parent.span_id == decision.context.span_id


def test_inline_model_and_tool_calls_are_children_with_the_record_id(server, instrumented: Pipeline):
    @tool(tracer_provider=instrumented.provider)
    def summarise(text: str) -> str:
        with openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0) as inner:
            inner.chat.completions.create(model="gpt-inner", messages=MESSAGES)  # a model call inside a tool
        return text[:3]

    server.enqueue(s.chat_completion("plan"), s.chat_completion("inner"))
    with session("sess-1", agent_id="agent-7"), correlation("corr-9"):
        with audit("vendor_payment", snapshot=snapshot()) as d:
            with openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0) as c:
                c.chat.completions.create(model="gpt-test", messages=MESSAGES)
            summarise("long text")
    assert_children_of_the_decision(instrumented, d.record_id, 3)
    outer = instrumented.one("chat gpt-test")
    inner = instrumented.one("chat gpt-inner")
    tool_span = instrumented.one("execute_tool")
    assert outer.parent.span_id == instrumented.one("replay.decision").context.span_id
    assert inner.parent.span_id == tool_span.context.span_id
    attrs = outer.attributes
    assert (attrs[sc.CORRELATION_ID], attrs[sc.SESSION_ID], attrs[sc.AGENT_ID]) == ("corr-9", "sess-1", "agent-7")
    assert attrs[sc.GEN_AI_CONVERSATION_ID] == "sess-1" and attrs[sc.GEN_AI_AGENT_ID] == "agent-7"


def test_a_model_span_outside_any_decision_has_no_record_id(server, instrumented: Pipeline):
    server.enqueue(s.chat_completion())
    with openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0) as c:
        c.chat.completions.create(model="gpt-test", messages=MESSAGES)
    assert sc.RECORD_ID not in instrumented.one("chat").attributes


def test_thread_pool_work_stays_under_the_decision(server, instrumented: Pipeline):
    server.enqueue(*[s.chat_completion(f"r{i}") for i in range(4)])

    @tool(tracer_provider=instrumented.provider)
    def ask(i: int) -> str:
        with openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0) as c:
            return c.chat.completions.create(model="gpt-test", messages=MESSAGES).choices[0].message.content

    with audit("fan_out", snapshot=snapshot()) as d:
        with ThreadPoolExecutor(max_workers=2) as pool:
            answers = sorted(pool.map(ask, range(4)))
    assert answers == ["r0", "r1", "r2", "r3"]
    assert_children_of_the_decision(instrumented, d.record_id, 8)


def test_asyncio_tasks_and_async_generators_stay_under_the_decision(server, instrumented: Pipeline):
    server.enqueue(*[s.chat_completion(f"a{i}") for i in range(5)])

    @tool(tracer_provider=instrumented.provider)
    async def ask(c: openai.AsyncOpenAI, i: int) -> str:
        reply = await c.chat.completions.create(model="gpt-test", messages=MESSAGES)
        return reply.choices[0].message.content

    async def answers(c: openai.AsyncOpenAI):
        for i in range(2):
            yield await ask(c, 10 + i)

    async def run() -> list[str]:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0) as c:
            with audit("fan_out", snapshot=snapshot()) as d:
                gathered = await asyncio.gather(*(asyncio.create_task(ask(c, i)) for i in range(3)))
                streamed = [a async for a in answers(c)]
        run.record_id = d.record_id  # type: ignore[attr-defined]
        return sorted(gathered + streamed)

    assert asyncio.run(run()) == ["a0", "a1", "a2", "a3", "a4"]
    assert_children_of_the_decision(instrumented, run.record_id, 10)  # type: ignore[attr-defined]


def test_without_the_thread_instrumentor_pool_work_loses_its_parent(server, pipeline: Pipeline):
    """The contrast case: why ThreadContextInstrumentor exists (a bare pool runs work in an empty context)."""

    @tool(tracer_provider=pipeline.provider)
    def work(i: int) -> int:
        return i

    with audit("fan_out", snapshot=snapshot()) as d:
        with ThreadPoolExecutor(max_workers=1) as pool:
            list(pool.map(work, range(2)))
    spans = pipeline.spans("execute_tool")
    assert len(spans) == 2 and all(sc.RECORD_ID not in sp.attributes for sp in spans)
    assert all(sp.parent is None for sp in spans) and d.record_id


def test_concurrent_decisions_in_threads_never_mix_record_ids(server, instrumented: Pipeline):
    import threading

    server.enqueue(*[s.chat_stream([f"t{i}"]) for i in range(8)])
    seen: dict[str, str] = {}
    lock = threading.Lock()

    def agent(i: int) -> None:
        with audit("concurrent", snapshot=snapshot()) as d:
            with openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0) as c:
                stream = c.chat.completions.create(model=f"gpt-{i}", messages=MESSAGES, stream=True)
                text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
        with lock:
            seen[f"gpt-{i}"] = d.record_id
        assert text.startswith("t")

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans = instrumented.spans("chat")
    assert len(spans) == 8
    decisions = {d.attributes[sc.RECORD_ID]: d for d in instrumented.spans("replay.decision")}
    for span in spans:
        record_id = span.attributes[sc.RECORD_ID]
        assert record_id == seen[span.attributes[sc.GEN_AI_REQUEST_MODEL]]
        assert span.parent.span_id == decisions[record_id].context.span_id
