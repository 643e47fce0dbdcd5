"""Captured content is bounded: what is kept while streaming, and what redaction renders, never grows with the input.

A 6 MB stream in 2k deltas is served from bytes built before measuring starts, so the traced peak is the
client's and the instrumentation's alone (a memory bound, not a timing one).
"""

from __future__ import annotations

import json
import threading
import tracemalloc
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import openai
import pytest

from otel_replay import semconv as sc
from otel_replay.instrumentation import AnthropicInstrumentor, OpenAIInstrumentor, tool
from otel_replay.instrumentation import scripted as s
from otel_replay.instrumentation._messages import LINK_CHARS
from otel_replay.redaction import MAX_CONTENT_CHARS

from .conftest import Pipeline

DELTAS = 2_000
DELTA_CHARS = 3_000  # 2k deltas of 3,000 characters: 6 MB of content
PEAK_BOUND = 4 * 1024 * 1024
"""The traced peak allowed while a 6 MB stream is read: below the content's size, so keeping every delta fails it
(the client alone peaks near 1.3 MB)."""


def chat_payload() -> bytes:
    piece = "x" * DELTA_CHARS
    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-test"}
    lines = [{**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    lines += [{**chunk, "choices": [{"index": 0, "delta": {"content": piece}}]}] * DELTAS
    lines.append({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return "".join(f"data: {json.dumps(line)}\n\n" for line in lines).encode() + b"data: [DONE]\n\n"


ANTHROPIC_PEAK_BOUND = 5 * 1024 * 1024 // 2
"""The traced peak allowed while the Anthropic stream is read: below the size of either half, so keeping all of the
text or all of the tool arguments fails it (the client alone peaks near 0.7 MB, with capture on near 1.6 MB)."""


def anthropic_payload() -> bytes:
    """A text block in 1k deltas, then a tool_use block whose arguments arrive in 1k deltas (one long JSON string)."""
    start = {
        "type": "message_start",
        "message": {
            "id": "m1",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 3, "output_tokens": 1},
        },
    }
    text = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "t" * DELTA_CHARS}}
    block = {"type": "tool_use", "id": "toolu_big", "name": "ingest", "input": {}}
    events: list[tuple[str, Any]] = [
        ("message_start", start),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}),
    ]
    events += [("content_block_delta", text)] * (DELTAS // 2)
    events += [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("content_block_start", {"type": "content_block_start", "index": 1, "content_block": block}),
        ("content_block_delta", _json_delta('{"blob": "')),
    ]
    piece = _json_delta("y" * DELTA_CHARS)
    events += [("content_block_delta", piece)] * (DELTAS // 2)
    events += [
        ("content_block_delta", _json_delta('"}')),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 5}},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events).encode()


def _json_delta(text: str) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": text}}


class BytesServer:
    """Answers every POST with one fixed server-sent-event body, written from a buffer built beforehand."""

    def __init__(self, payload: bytes) -> None:
        view = memoryview(payload)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(view)))
                self.end_headers()
                for offset in range(0, len(view), 1 << 16):
                    self.wfile.write(view[offset : offset + (1 << 16)])

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.root = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def observe(pipeline: Pipeline, request: pytest.FixtureRequest) -> Iterator[tuple[Pipeline, bool]]:
    capture = bool(request.param)
    instrumentors = [OpenAIInstrumentor(), AnthropicInstrumentor()]
    for instrumentor in instrumentors:
        instrumentor.instrument(tracer_provider=pipeline.provider, capture_content=capture)
    yield pipeline, capture
    for instrumentor in instrumentors:
        instrumentor.uninstrument()


def traced_peak(read: Any, bound: int) -> int:
    """The traced peak of ``read()``; over ``bound``, the lower of that and a second read's.

    tracemalloc counts every thread of the process: a thread an earlier test of this worker left behind can
    allocate during one read (seen once in CI: 9.8 MiB in both tests), not during two in a row.
    """
    peak = _traced_peak(read)
    return min(peak, _traced_peak(read)) if peak >= bound else peak


def _traced_peak(read: Any) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        read()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow
@pytest.mark.timeout(1200)  # tracing every allocation of 2k parsed chunks: a minute on a loaded 2-core machine
@pytest.mark.parametrize("observe", [True, False], ids=["capture-on", "capture-off"], indirect=True)
def test_a_6_mb_chat_stream_is_read_in_memory_below_its_size(observe: tuple[Pipeline, bool]):
    pipeline, capture = observe
    server = BytesServer(chat_payload())
    try:
        with openai.OpenAI(base_url=f"{server.root}/v1", api_key="k", max_retries=0) as c:

            def read() -> None:
                stream = c.chat.completions.create(
                    model="gpt-test", messages=[{"role": "user", "content": "go"}], stream=True
                )
                assert sum(len(chunk.choices[0].delta.content or "") for chunk in stream) == DELTAS * DELTA_CHARS

            peak = traced_peak(read, PEAK_BOUND)
    finally:
        server.close()
    assert peak < PEAK_BOUND, f"{peak / 2**20:.1f} MiB"
    attrs = pipeline.spans("chat")[-1].attributes
    assert attrs[sc.STREAM_END] == "exhausted"
    if capture:
        [output] = json.loads(attrs[sc.GEN_AI_OUTPUT_MESSAGES])
        assert output["finish_reason"] == "stop" and output["parts"][0]["content"].startswith("x" * 1000)
        assert len(attrs[sc.GEN_AI_OUTPUT_MESSAGES]) <= MAX_CONTENT_CHARS
        assert attrs[sc.CONTENT_CUT] >= DELTAS * DELTA_CHARS - MAX_CONTENT_CHARS  # what was cut is counted
    else:
        assert sc.GEN_AI_OUTPUT_MESSAGES not in attrs and sc.CONTENT_CUT not in attrs


@pytest.mark.slow
@pytest.mark.timeout(1200)  # tracing every allocation of 2k parsed chunks: a minute on a loaded 2-core machine
@pytest.mark.parametrize("observe", [True, False], ids=["capture-on", "capture-off"], indirect=True)
def test_6_mb_of_anthropic_text_and_tool_argument_deltas_are_read_in_memory_below_either(
    observe: tuple[Pipeline, bool],
):
    pipeline, capture = observe
    server = BytesServer(anthropic_payload())
    try:
        with anthropic.Anthropic(base_url=server.root, api_key="k", max_retries=0) as c:

            def read() -> None:
                messages = [{"role": "user", "content": "go"}]
                kinds = [
                    e.type for e in c.messages.create(model="claude-test", max_tokens=8, messages=messages, stream=True)
                ]
                assert kinds.count("content_block_delta") == DELTAS + 2

            peak = traced_peak(read, ANTHROPIC_PEAK_BOUND)
    finally:
        server.close()
    assert peak < ANTHROPIC_PEAK_BOUND, f"{peak / 2**20:.1f} MiB"
    attrs = pipeline.spans("chat")[-1].attributes
    [call] = json.loads(attrs[sc.MODEL_TOOL_CALLS])
    assert (call["id"], call["name"]) == ("toolu_big", "ingest")  # listed exactly, capture on or off
    assert ("arguments" in call) is capture
    if capture:
        assert len(call["arguments"]) <= MAX_CONTENT_CHARS + 64  # cut by redaction's own cap, with its marker
        [output] = json.loads(attrs[sc.GEN_AI_OUTPUT_MESSAGES])
        assert output["parts"][0]["type"] == "text" and output["parts"][0]["content"].startswith("t" * 1000)
        assert attrs[sc.CONTENT_CUT] >= DELTAS // 2 * DELTA_CHARS - MAX_CONTENT_CHARS  # the text cut, counted
    else:
        assert sc.GEN_AI_OUTPUT_MESSAGES not in attrs


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
def test_tool_arguments_past_the_link_budget_are_listed_but_not_linked(server, pipeline: Pipeline, streamed: bool):
    """Arguments too long to keep cannot be matched to the tool's execution; the call is still listed.

    The same whether they were streamed (not kept past the budget) or came whole (not remembered past it)."""
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=pipeline.provider, capture_content=False)

    @tool(tracer_provider=pipeline.provider)
    def ingest(blob: str) -> int:
        return len(blob)

    long, short = {"blob": "z" * (LINK_CHARS + 10)}, {"blob": "small"}
    reply = s.chat_stream if streamed else s.chat_completion
    server.enqueue(reply([] if streamed else None, tool_calls=[("call_long", "ingest", long)]))
    server.enqueue(reply([] if streamed else None, tool_calls=[("call_short", "ingest", short)]))
    try:
        with openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0) as c:
            for _ in range(2):
                answer = c.chat.completions.create(
                    model="gpt-test", messages=[{"role": "user", "content": "go"}], stream=streamed
                )
                if streamed:
                    list(answer)
    finally:
        instrumentor.uninstrument()
    ingest(**long)
    ingest(**short)
    first, second = pipeline.spans("chat")
    assert json.loads(first.attributes[sc.MODEL_TOOL_CALLS]) == [{"id": "call_long", "name": "ingest"}]
    unlinked, linked = pipeline.spans("execute_tool")
    assert (
        sc.GEN_AI_TOOL_CALL_ID not in unlinked.attributes and linked.attributes[sc.GEN_AI_TOOL_CALL_ID] == "call_short"
    )


def test_a_20_mb_completion_is_cut_before_it_is_rendered_and_stays_valid_json(server, capturing: Pipeline):
    big = "secret=hunter2 " + "w" * (20 * 1024 * 1024)
    server.enqueue(s.chat_completion(big))
    with openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0) as c:
        reply = c.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": big}])
    assert reply.choices[0].message.content == big  # the caller's value is untouched
    attrs = capturing.one("chat").attributes
    for key in (sc.GEN_AI_INPUT_MESSAGES, sc.GEN_AI_OUTPUT_MESSAGES):
        text = attrs[key]
        assert len(text) <= MAX_CONTENT_CHARS and "hunter2" not in text
        [message] = json.loads(text)
        assert message["parts"][0]["content"].endswith(" chars cut]")
    assert attrs[sc.CONTENT_CUT] >= 2 * (len(big) - MAX_CONTENT_CHARS)  # both cuts counted
