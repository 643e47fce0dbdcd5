"""model_calls, acts and agents read every common GenAI convention into the same columns (the map in views.sql).

Spans are made with the real SDK and stored by the real exporter, one trace per case, in one dataset per
module; each test reads its own trace. Hostile spans (wrong types, a tool call with no name, 10,000 flattened
attributes, content that is not JSON) give NULL where unreadable, never an error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Tracer

import otel_replay
from otel_replay import ParquetSpanExporter

_TRACES: dict[str, str] = {}  # case -> trace id


def _case(tracer: Tracer, case: str, attributes: dict[str, Any], name: str = "span", **children: Any) -> None:
    """One root span with ``attributes`` (and child spans ``name -> attributes``) in a trace of its own."""
    with tracer.start_as_current_span(name, attributes=attributes) as root:
        _TRACES[case] = format(root.get_span_context().trace_id, "032x")
        for child_name, child_attributes in children.items():
            with tracer.start_as_current_span(child_name, attributes=child_attributes):
                pass


_OI_CALLS = {
    "llm.output_messages.0.message.role": "assistant",
    "llm.output_messages.0.message.tool_calls.0.tool_call.id": "call_oi_1",
    "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "get_weather",
    "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": '{"city": "Oslo"}',
    "llm.output_messages.0.message.tool_calls.1.tool_call.id": "call_oi_2",
    "llm.output_messages.0.message.tool_calls.1.tool_call.function.name": "get_time",
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    dataset = tmp_path_factory.mktemp("genai") / "traces"
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=20_000))
    provider.add_span_processor(SimpleSpanProcessor(ParquetSpanExporter(dataset)))
    t = provider.get_tracer("tests.genai_views")
    _case(t, "registry", {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-x",
        "gen_ai.response.model": "gpt-x-1", "gen_ai.response.id": "resp-reg", "gen_ai.request.stream": True,
        "gen_ai.usage.input_tokens": 100, "gen_ai.usage.output_tokens": 40,
        "gen_ai.usage.cache_read.input_tokens": 60, "gen_ai.usage.cache_creation.input_tokens": 8,
        "gen_ai.usage.reasoning.output_tokens": 12, "gen_ai.response.finish_reasons": ["tool_calls"],
        "gen_ai.response.time_to_first_chunk": 0.25, "openai.response.service_tier": "default",
        "gen_ai.output.messages": json.dumps([{"role": "assistant", "finish_reason": "tool_calls", "parts": [
            {"type": "text", "content": "checking"},
            {"type": "tool_call", "id": "call_reg", "name": "get_weather", "arguments": {"city": "Rome"}}]}]),
    })  # fmt: skip
    _case(t, "deprecated", {
        "gen_ai.operation.name": "chat", "gen_ai.system": "openai", "gen_ai.request.model": "gpt-old",
        "gen_ai.usage.prompt_tokens": 9, "gen_ai.usage.completion_tokens": 3,
        "gen_ai.openai.response.system_fingerprint": "fp_1", "gen_ai.openai.response.service_tier": "flex",
    })  # fmt: skip
    _case(t, "openllmetry", {
        "gen_ai.system": "openai", "gen_ai.request.model": "gpt-llm", "llm.request.type": "chat",
        "gen_ai.is_streaming": True, "gen_ai.usage.total_tokens": 30, "gen_ai.usage.reasoning_tokens": 4,
        "gen_ai.usage.cache_read_input_tokens": 2, "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "hi",
        "gen_ai.completion.0.tool_calls.1.id": "call_tl_2", "gen_ai.completion.0.tool_calls.1.name": "b",
        "gen_ai.completion.0.tool_calls.0.id": "call_tl_1", "gen_ai.completion.0.tool_calls.0.name": "a",
        "gen_ai.completion.0.tool_calls.0.arguments": '{"x": 1}',
    })  # fmt: skip
    _case(t, "openinference", {
        "openinference.span.kind": "LLM", "llm.system": "openai", "llm.provider": "openai",
        "llm.model_name": "gpt-oi", "llm.token_count.prompt": 11, "llm.token_count.completion": 7,
        "llm.token_count.total": 18, "llm.token_count.prompt_details.cache_read": 5,
        "llm.token_count.completion_details.reasoning": 1, "llm.finish_reason": "tool_calls",
        "llm.invocation_parameters": '{"model": "gpt-oi", "stream": true}',
        "output.value": '{"id": "chatcmpl-oi", "object": "chat.completion"}', "output.mime_type": "application/json",
        "input.value": '{"messages": []}', **_OI_CALLS,
    })  # fmt: skip
    _case(t, "oi_tool", {"openinference.span.kind": "TOOL", "tool.name": "get_weather", "tool.id": "call_oi_1",
                         "input.value": '{"city": "Oslo"}', "output.value": "rain"}, name="get_weather")  # fmt: skip
    _case(t, "oi_agent", {"openinference.span.kind": "AGENT", "agent.name": "planner"}, name="planner",
          chain={"openinference.span.kind": "CHAIN"})  # fmt: skip
    _case(t, "registry_tool", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather",
                               "gen_ai.tool.call.id": "call_reg", "gen_ai.agent.name": "pricer"})  # fmt: skip
    _case(t, "invoke_agent", {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "pricer",
                              "gen_ai.agent.id": "ag-1"}, name="invoke_agent pricer")  # fmt: skip
    _case(t, "traceloop", {"traceloop.span.kind": "workflow", "traceloop.entity.name": "refund_flow"},
          name="refund_flow.workflow",
          tool={"traceloop.span.kind": "tool", "traceloop.entity.name": "lookup",
                "traceloop.entity.input": '{"id": 3}'})  # fmt: skip
    # One call described twice: ours (replay.kind = model) and the client's own span under it, same response id.
    _case(t, "twice", {"replay.kind": "model", "gen_ai.operation.name": "chat", "gen_ai.provider.name": "anthropic",
                       "gen_ai.request.model": "claude-x", "gen_ai.response.id": "msg_1"}, name="chat claude-x",
          **{"anthropic.messages.create": {"gen_ai.operation.name": "chat", "gen_ai.request.model": "claude-x",
                                           "gen_ai.response.id": "msg_1"}})  # fmt: skip
    # Two calls in one trace, parent and child with different response ids: both are calls.
    _case(t, "two_calls", {"replay.kind": "model", "gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                           "gen_ai.response.id": "a"},
          inner={"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.response.id": "b"})  # fmt: skip
    # One tool run described twice: a framework's execute_tool span (pydantic-ai's) and ours under it.
    ours_tool = {"replay.kind": "tool", "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup"}
    _case(t, "tool_twice", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup",
                            "gen_ai.tool.call.id": "call_tw"}, name="execute_tool lookup",
          ours={**ours_tool, "gen_ai.tool.call.id": "call_tw"})  # fmt: skip
    _case(t, "tool_twice_no_id", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup"},
          name="execute_tool lookup", ours={**ours_tool, "gen_ai.tool.call.id": "call_tw2"})  # fmt: skip
    # Two tool runs in one trace, a framework's and ours, for different calls: both are acts.
    _case(t, "two_tools", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup",
                           "gen_ai.tool.call.id": "call_a"}, name="execute_tool lookup",
          ours={**ours_tool, "gen_ai.tool.call.id": "call_b"},
          peer={"openinference.span.kind": "TOOL", "tool.name": "lookup", "tool.id": "call_c"})  # fmt: skip
    # Hostile input.
    _case(t, "wrong_types", {
        "openinference.span.kind": "LLM", "llm.model_name": "m", "llm.token_count.prompt": "eleven",
        "llm.token_count.completion": 3.5, "llm.token_count.total": -4,
        "llm.token_count.prompt_details.cache_read": True, "llm.token_count.completion_details.reasoning": [1, 2],
        "llm.invocation_parameters": "not json", "gen_ai.is_streaming": "yes",
        "gen_ai.response.finish_reasons": "stop", "gen_ai.response.time_to_first_chunk": "soon",
    })  # fmt: skip
    _case(t, "no_name", {"gen_ai.operation.name": "chat", "gen_ai.output.messages": json.dumps(
        [{"role": "assistant", "parts": [{"type": "tool_call", "id": "call_anon"}, {"type": "tool_call"}, 7, None]}])})
    _case(t, "not_json", {"gen_ai.operation.name": "chat", "gen_ai.output.messages": "{not json at all",
                          "gen_ai.input.messages": "\x00\ufffd"})  # fmt: skip
    _case(t, "odd_json", {"gen_ai.operation.name": "chat", "gen_ai.output.messages": '{"parts": 5}',
                          "replay.model.streamed": "true"})  # fmt: skip
    flat = {"openinference.span.kind": "LLM", "llm.model_name": "m"}
    for n in range(2_500):
        prefix = f"llm.output_messages.{n}.message.tool_calls.{n % 7}.tool_call."
        flat.update({prefix + "id": f"c{n}", prefix + "function.name": f"f{n}", prefix + "function.arguments": "{}",
                     f"llm.output_messages.{n}.message.role": "assistant"})  # fmt: skip
    _case(t, "ten_thousand", flat)
    provider.shutdown()
    with otel_replay.open(dataset) as opened:
        yield opened


def _one(store: Any, view: str, case: str, where: str = "true") -> dict[str, Any]:
    rows = store.rows(f"SELECT * FROM {view} WHERE trace_id = ? AND {where}", [_TRACES[case]])
    assert len(rows) == 1, rows
    return rows[0]


def _calls(row: dict[str, Any]) -> list[dict[str, Any]]:
    return json.loads(row["tool_calls"])


def test_registry_names_fill_every_column(store: Any) -> None:
    row = _one(store, "model_calls", "registry")
    assert (row["model"], row["provider"], row["operation"]) == ("gpt-x", "openai", "chat")
    assert row["response_model"] == "gpt-x-1"
    assert (row["input_tokens"], row["output_tokens"], row["cache_read_input_tokens"]) == (100, 40, 60)
    assert (row["cache_creation_input_tokens"], row["reasoning_tokens"]) == (8, 12)
    assert row["streamed"] is True and json.loads(row["finish_reasons"]) == ["tool_calls"]
    assert row["time_to_first_chunk"] == pytest.approx(0.25) and row["service_tier"] == "default"
    assert _calls(row) == [{"id": "call_reg", "name": "get_weather", "arguments": '{"city":"Rome"}'}]


def test_deprecated_names_still_read(store: Any) -> None:
    row = _one(store, "model_calls", "deprecated")
    assert (row["provider"], row["input_tokens"], row["output_tokens"]) == ("openai", 9, 3)
    assert (row["system_fingerprint"], row["service_tier"]) == ("fp_1", "flex")
    assert row["streamed"] is False and row["tool_calls"] is None


def test_openllmetry_flattened_tool_calls_in_order(store: Any) -> None:
    row = _one(store, "model_calls", "openllmetry")
    assert (row["model"], row["provider"], row["operation"], row["streamed"]) == ("gpt-llm", "openai", "chat", True)
    assert (row["total_tokens"], row["reasoning_tokens"], row["cache_read_input_tokens"]) == (30, 4, 2)
    assert _calls(row) == [{"id": "call_tl_1", "name": "a", "arguments": '{"x": 1}'}, {"id": "call_tl_2", "name": "b"}]


def test_openinference_llm_span_is_a_model_call(store: Any) -> None:
    row = _one(store, "model_calls", "openinference")
    assert (row["model"], row["provider"], row["operation"]) == ("gpt-oi", "openai", "chat")
    assert row["response_id"] == "chatcmpl-oi"  # from output.value
    assert (row["input_tokens"], row["output_tokens"], row["total_tokens"]) == (11, 7, 18)
    assert (row["cache_read_input_tokens"], row["reasoning_tokens"], row["streamed"]) == (5, 1, True)
    assert json.loads(row["finish_reasons"]) == ["tool_calls"]
    assert _calls(row) == [
        {"id": "call_oi_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"id": "call_oi_2", "name": "get_time"},
    ]
    assert row["input_messages"] == '{"messages": []}'


def test_tool_spans_of_every_convention_are_acts_joined_to_their_call(store: Any) -> None:
    oi = _one(store, "acts", "oi_tool")
    assert (oi["source"], oi["tool_name"], oi["tool_call_id"]) == ("tool", "get_weather", "call_oi_1")
    assert (oi["action_arguments"], oi["tool_result"]) == ('{"city": "Oslo"}', "rain")
    reg = _one(store, "acts", "registry_tool")
    assert (reg["tool_name"], reg["tool_call_id"], reg["agent_name"]) == ("get_weather", "call_reg", "pricer")
    tl = _one(store, "acts", "traceloop")
    assert (tl["tool_name"], tl["action_arguments"], tl["tool_call_id"]) == ("lookup", '{"id": 3}', None)
    # The README's join from a tool execution to the model call that asked for it.
    joined = store.rows(
        """SELECT a.tool_call_id, m.model FROM acts a
           JOIN model_calls m ON m.tool_calls LIKE '%"' || a.tool_call_id || '"%'
           WHERE a.tool_call_id IN ('call_oi_1', 'call_reg') ORDER BY 1"""
    )
    assert joined == [{"tool_call_id": "call_oi_1", "model": "gpt-oi"}, {"tool_call_id": "call_reg", "model": "gpt-x"}]


def test_agent_and_workflow_spans_are_agents_not_model_calls(store: Any) -> None:
    oi = store.rows("SELECT operation, agent_name, workflow_name FROM agents WHERE trace_id = ? ORDER BY operation",
                    [_TRACES["oi_agent"]])  # fmt: skip
    assert oi == [
        {"operation": "invoke_agent", "agent_name": "planner", "workflow_name": None},
        {"operation": "invoke_workflow", "agent_name": None, "workflow_name": "chain"},
    ]
    ours = _one(store, "agents", "invoke_agent")
    assert (ours["operation"], ours["agent_name"], ours["genai_agent_id"]) == ("invoke_agent", "pricer", "ag-1")
    tl = _one(store, "agents", "traceloop")
    assert (tl["operation"], tl["workflow_name"]) == ("invoke_workflow", "refund_flow")
    for case in ("oi_agent", "invoke_agent", "traceloop", "oi_tool", "registry_tool"):
        assert store.rows("SELECT 1 FROM model_calls WHERE trace_id = ?", [_TRACES[case]]) == [], case


def test_one_call_described_twice_is_one_row(store: Any) -> None:
    row = _one(store, "model_calls", "twice")
    assert row["response_id"] == "msg_1"
    assert store.rows("SELECT count(*) AS n FROM spans WHERE trace_id = ?", [_TRACES["twice"]]) == [{"n": 2}]
    kept = store.rows("SELECT name FROM spans WHERE span_id = ?", [row["span_id"]])
    assert kept == [{"name": "chat claude-x"}]  # ours, which carries the decision's record id
    rows = store.rows("SELECT response_id FROM model_calls WHERE trace_id = ? ORDER BY 1", [_TRACES["two_calls"]])
    assert rows == [{"response_id": "a"}, {"response_id": "b"}]


def test_one_tool_run_described_twice_is_one_act(store: Any) -> None:
    for case, call_id in (("tool_twice", "call_tw"), ("tool_twice_no_id", "call_tw2")):
        row = _one(store, "acts", case)
        assert row["tool_call_id"] == call_id
        kept = store.rows("SELECT replay_kind FROM spans WHERE span_id = ?", [row["span_id"]])
        assert kept == [{"replay_kind": "tool"}], case  # ours, which carries the decision's record id
    rows = store.rows("SELECT tool_call_id FROM acts WHERE trace_id = ? ORDER BY 1", [_TRACES["two_tools"]])
    assert rows == [{"tool_call_id": "call_a"}, {"tool_call_id": "call_b"}, {"tool_call_id": "call_c"}]


def test_wrong_types_read_as_null(store: Any) -> None:
    row = _one(store, "model_calls", "wrong_types")
    assert row["model"] == "m"
    for column in ("input_tokens", "output_tokens", "total_tokens", "cache_read_input_tokens", "reasoning_tokens",
                   "finish_reasons", "time_to_first_chunk"):  # fmt: skip
        assert row[column] is None, column
    assert row["streamed"] is False


def test_tool_call_parts_without_a_name_keep_their_id(store: Any) -> None:
    row = _one(store, "model_calls", "no_name")
    assert _calls(row) == [{"id": "call_anon", "name": None}, {"id": None, "name": None}]


def test_content_that_is_not_json_is_kept_and_yields_no_calls(store: Any) -> None:
    row = _one(store, "model_calls", "not_json")
    assert row["tool_calls"] is None and row["output_messages"] == "{not json at all"
    odd = _one(store, "model_calls", "odd_json")
    assert odd["tool_calls"] is None and odd["streamed"] is True  # "true" as text reads as before the map


def test_ten_thousand_flattened_attributes_are_capped(store: Any) -> None:
    row = _one(store, "model_calls", "ten_thousand")
    calls = _calls(row)
    assert len(calls) == 128  # the instrumentors' cap
    assert calls[:2] == [{"id": "c0", "name": "f0", "arguments": "{}"}, {"id": "c1", "name": "f1", "arguments": "{}"}]
