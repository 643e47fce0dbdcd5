"""One model call is one row of model_calls when two spans describe it: the anthropic client's own span under ours."""

from __future__ import annotations

from pathlib import Path

import anthropic
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import otel_replay
from otel_replay import ParquetSpanExporter
from otel_replay.instrumentation import AnthropicInstrumentor
from otel_replay.instrumentation.scripted import ScriptedServer, anthropic_message


def test_the_anthropic_clients_own_span_does_not_double_the_call(tmp_path: Path) -> None:
    dataset = tmp_path / "traces"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ParquetSpanExporter(dataset)))
    instrumentor = AnthropicInstrumentor()
    instrumentor.instrument(tracer_provider=provider, capture_content=False)
    try:
        replies = [anthropic_message("hi", message_id="msg_1"), anthropic_message("again", message_id="msg_2")]
        with ScriptedServer(replies) as server:
            client = anthropic.Anthropic(
                base_url=server.root_url, api_key="test", max_retries=0, open_telemetry={"tracer_provider": provider}
            )
            for _ in range(2):
                client.messages.create(model="claude-test", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
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
