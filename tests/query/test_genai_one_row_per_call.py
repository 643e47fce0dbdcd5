"""One model call is one row of model_calls when two spans describe it: the anthropic client's own span under ours,
a peer's span beneath ours with a span that is not stored between them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import otel_replay
from otel_replay import ParquetSpanExporter
from otel_replay.instrumentation import AnthropicInstrumentor
from otel_replay.instrumentation.scripted import ScriptedServer, anthropic_message, anthropic_stream


def test_the_anthropic_clients_own_span_does_not_double_the_call(tmp_path: Path) -> None:
    dataset = tmp_path / "traces"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ParquetSpanExporter(dataset)))
    instrumentor = AnthropicInstrumentor()
    instrumentor.instrument(tracer_provider=provider, capture_content=False)
    try:
        replies = [anthropic_message("hi", message_id="msg_1"), anthropic_message("again", message_id="msg_2")]
        with ScriptedServer(replies) as server:
            with anthropic.Anthropic(
                base_url=server.root_url, api_key="test", max_retries=0, open_telemetry={"tracer_provider": provider}
            ) as client:
                for _ in range(2):
                    client.messages.create(
                        model="claude-test", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
                    )
    finally:
        instrumentor.uninstrument()
        provider.shutdown()
    with otel_replay.open(dataset) as store:
        spans = store.rows("SELECT name, scope_name FROM spans ORDER BY name")
        calls = store.rows("SELECT response_id, provider, input_tokens, span_id FROM model_calls ORDER BY response_id")
        ours = store.rows("SELECT span_id FROM spans WHERE replay_kind = 'model' ORDER BY span_id")
    # Both describe each call (the client's span is the child of ours) ...
    assert [s["name"] for s in spans].count("anthropic.messages.create") == 2, spans
    # ... and each call is one row, ours.
    assert [(c["response_id"], c["provider"], c["input_tokens"]) for c in calls] == [
        ("msg_1", "anthropic", 17),
        ("msg_2", "anthropic", 17),
    ]
    assert sorted(c["span_id"] for c in calls) == [o["span_id"] for o in ours]



def test_the_anthropic_clients_own_span_alone_is_a_model_call_with_its_stop_reason(tmp_path: Path) -> None:
    # no instrumentor: the client's own span (its stop reason as anthropic.message.stop_reason) is the call
    dataset = tmp_path / "traces"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ParquetSpanExporter(dataset)))
    replies = [anthropic_message("hi", message_id="msg_1"), anthropic_stream(tool_uses=[("toolu_1", "f", {})])]
    ask: dict[str, Any] = {"model": "claude-test", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    with ScriptedServer(replies) as server:
        with anthropic.Anthropic(
            base_url=server.root_url, api_key="test", max_retries=0, open_telemetry={"tracer_provider": provider}
        ) as client:
            client.messages.create(**ask)
            list(client.messages.create(**ask, stream=True))
    provider.shutdown()
    with otel_replay.open(dataset) as store:
        calls = store.rows("SELECT response_id, streamed, input_tokens, finish_reasons FROM model_calls ORDER BY 1")
    assert calls == [
        {"response_id": "msg_1", "streamed": False, "input_tokens": 17, "finish_reasons": '["end_turn"]'},
        {"response_id": "msg_s1", "streamed": True, "input_tokens": 17, "finish_reasons": '["tool_use"]'},
    ]

def _beneath_ours(stored: TracerProvider, elsewhere: TracerProvider, ours: str, peer: dict[str, Any]) -> str:
    """Our model span (response id ``ours``) > a span of ``elsewhere`` (not stored) > a peer's span; the trace id."""
    with stored.get_tracer("tests").start_as_current_span("chat m", attributes={
        "replay.kind": "model", "gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
        "gen_ai.response.id": ours,
    }) as span:  # fmt: skip
        with elsewhere.get_tracer("tests.elsewhere").start_as_current_span("openai.chat"):
            with stored.get_tracer("tests.peer").start_as_current_span("ChatCompletion", attributes=peer):
                pass
        return format(span.get_span_context().trace_id, "032x")


def test_a_peers_repeat_under_an_unstored_span_is_left_out_by_response_id_within_its_trace(tmp_path: Path) -> None:
    dataset = tmp_path / "traces"
    stored, elsewhere = TracerProvider(), TracerProvider()
    stored.add_span_processor(SimpleSpanProcessor(ParquetSpanExporter(dataset)))
    oi = {"openinference.span.kind": "LLM", "llm.model_name": "m"}
    traces = {
        "same": _beneath_ours(stored, elsewhere, "r1", {**oi, "output.value": json.dumps({"id": "r1"})}),
        "other_id": _beneath_ours(stored, elsewhere, "r2", {**oi, "output.value": json.dumps({"id": "r9"})}),
        "no_id": _beneath_ours(stored, elsewhere, "r3", {**oi, "output.value": "not json"}),
    }
    with stored.get_tracer("tests.peer").start_as_current_span("ChatCompletion", attributes={
        **oi, "output.value": json.dumps({"id": "r1"})}) as lone:  # fmt: skip
        traces["lone"] = format(lone.get_span_context().trace_id, "032x")  # r1 again, in a trace with none of ours
    stored.shutdown()
    with otel_replay.open(dataset) as store:
        assert store.rows("SELECT count(*) AS n FROM spans") == [{"n": 7}]  # the middle spans are not stored
        found = {
            case: sorted((r["response_id"] or "", r["ours"]) for r in store.rows(
                "SELECT m.response_id, s.replay_kind IS NOT DISTINCT FROM 'model' AS ours FROM model_calls m"
                " JOIN spans s USING (trace_id, span_id) WHERE m.trace_id = ?", [trace_id]))
            for case, trace_id in traces.items()
        }  # fmt: skip
    assert found == {
        "same": [("r1", True)],  # the same call twice: ours stays
        "other_id": [("r2", True), ("r9", False)],  # another call beneath ours: both
        "no_id": [("", False), ("r3", True)],  # no id and not next to ours: it cannot be told to repeat ours
        "lone": [("r1", False)],  # the same id in another trace is another call
    }
