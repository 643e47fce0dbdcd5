"""An agent instrumented by a peer's OpenAI instrumentation, run as its own process by tests/interop.

``python -m tests.interop._peer_agent PEER OTLP_URL [SERVICE]`` instruments the real ``openai`` client with PEER
(``openai_v2``, ``openllmetry`` or ``openinference``), makes the five calls (chat, chat stream, tool call,
streamed tool call, ``responses.create``) against a scripted server on loopback, runs each tool the model asked
for under a span in the peer's own convention (what an agent framework on that convention records), and sends
every span over OTLP/HTTP to OTLP_URL with ``service.name = SERVICE`` (default PEER), and every log record the
peer emits (the contrib instrumentor's GenAI events) to the ``/v1/logs`` beside it. It prints the tool call
ids the model gave.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import openai
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from otel_replay.instrumentation import scripted

__all__ = ["PEERS", "main"]

PEERS = {
    "openai_v2": "opentelemetry.instrumentation.openai_v2",
    "openllmetry": "opentelemetry.instrumentation.openai",
    "openinference": "openinference.instrumentation.openai",
}
"""Peer name -> the module holding its ``OpenAIInstrumentor``."""

_TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "str"}}}},
    }
]
_OSLO, _ROME = ("call_plain", "get_weather", {"city": "Oslo"}), ("call_streamed", "get_weather", {"city": "Rome"})
_REPLIES = [
    scripted.chat_completion("hi", response_id="chatcmpl-plain"),
    scripted.chat_stream(("Hel", "lo"), response_id="chatcmpl-stream"),
    scripted.chat_completion(None, tool_calls=[_OSLO], response_id="chatcmpl-tool"),
    scripted.chat_stream((), tool_calls=[_ROME], response_id="chatcmpl-st"),
    scripted.Reply(200, scripted.response_object("ok", response_id="resp_1")),
]


def _run_tool(tracer: Any, peer: str, call_id: str, arguments: str) -> None:
    """Run ``get_weather`` under a tool span in the peer's convention, naming the model's call id."""
    if peer == "openinference":
        attributes = {"openinference.span.kind": "TOOL", "tool.name": "get_weather", "tool.id": call_id,
                      "input.value": arguments, "output.value": "rain"}  # fmt: skip
        name = "get_weather"
    else:
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather",
                      "gen_ai.tool.call.id": call_id}  # fmt: skip
        name = "execute_tool get_weather"
    with tracer.start_as_current_span(name, attributes=attributes):
        pass


def main(peer: str, otlp_url: str, service: str | None = None) -> list[str]:
    """Run the five calls under ``peer``'s instrumentation; the tool call ids, in the order the tools ran."""
    module = __import__(PEERS[peer], fromlist=["OpenAIInstrumentor"])
    resource = Resource.create({"service.name": service or peer})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_url, timeout=10)))
    logs = LoggerProvider(resource=resource)  # the log events an instrumentation sends (OTLP logs, beside /v1/traces)
    logs.add_log_record_processor(
        BatchLogRecordProcessor(OTLPLogExporter(endpoint=otlp_url.rsplit("/v1/", 1)[0] + "/v1/logs", timeout=10))
    )
    module.OpenAIInstrumentor().instrument(tracer_provider=provider, logger_provider=logs)
    tracer = provider.get_tracer("tests.interop.agent")
    ran: list[str] = []
    messages = [{"role": "user", "content": "weather in Oslo?"}]
    with scripted.ScriptedServer(_REPLIES) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
        client.chat.completions.create(model="gpt-test", messages=messages)
        for _ in client.chat.completions.create(
            model="gpt-test", messages=messages, stream=True, stream_options={"include_usage": True}
        ):
            pass
        answer = client.chat.completions.create(model="gpt-test", messages=messages, tools=_TOOLS)
        for call in answer.choices[0].message.tool_calls or ():
            _run_tool(tracer, peer, call.id, call.function.arguments)
            ran.append(call.id)
        streamed: dict[int, dict[str, str]] = {}
        for chunk in client.chat.completions.create(model="gpt-test", messages=messages, tools=_TOOLS, stream=True):
            for choice in chunk.choices:
                for delta in choice.delta.tool_calls or ():
                    entry = streamed.setdefault(delta.index, {"id": "", "arguments": ""})
                    entry["id"] += delta.id or ""
                    entry["arguments"] += (delta.function.arguments if delta.function else None) or ""
        for entry in streamed.values():
            _run_tool(tracer, peer, entry["id"], entry["arguments"])
            ran.append(entry["id"])
        client.responses.create(model="gpt-test", input="weather?")
    provider.shutdown()
    logs.shutdown()
    return ran


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])))
