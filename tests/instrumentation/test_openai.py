"""The OpenAI instrumentor, with the real openai client against a local scripted server."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import warnings

import openai
import pytest
from opentelemetry.trace import SpanKind, StatusCode

from otel_replay import audit
from otel_replay import semconv as sc
from otel_replay.instrumentation import scripted as s
from tests._support import snapshot

from .conftest import Pipeline

MESSAGES = [{"role": "user", "content": "pay invoice INV-1"}]


def client(server: s.ScriptedServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="sk-test-key", max_retries=0)


def aclient(server: s.ScriptedServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="sk-test-key", max_retries=0)


def test_chat_completion_span_follows_the_genai_conventions(server, instrumented: Pipeline):
    server.enqueue(
        s.chat_completion(
            None,
            model="gpt-test-0613",
            tool_calls=[("call_a", "pay", {"amount": 10}), ("call_b", "notify", {"to": "ops"})],
            usage=(31, 4),
            response_id="chatcmpl-xyz",
        )
    )
    result = client(server).chat.completions.create(model="gpt-test", messages=MESSAGES, temperature=0.2, seed=7)
    assert result.choices[0].message.tool_calls[0].id == "call_a"
    span = instrumented.one("chat")
    attrs = span.attributes
    assert span.name == "chat gpt-test" and span.kind is SpanKind.CLIENT
    assert attrs[sc.GEN_AI_OPERATION_NAME] == "chat" and attrs[sc.GEN_AI_PROVIDER_NAME] == "openai"
    assert attrs[sc.GEN_AI_REQUEST_MODEL] == "gpt-test" and attrs[sc.GEN_AI_RESPONSE_MODEL] == "gpt-test-0613"
    assert attrs[sc.GEN_AI_RESPONSE_ID] == "chatcmpl-xyz"
    assert attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] == 31 and attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 4
    assert tuple(attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ("tool_calls",)
    assert attrs[sc.GEN_AI_REQUEST_TEMPERATURE] == 0.2 and attrs[sc.GEN_AI_REQUEST_SEED] == 7
    assert attrs[sc.SERVER_ADDRESS] == "127.0.0.1" and attrs[sc.SERVER_PORT] == server.port
    assert not span.events  # the conventions define no tool-call span event
    assert json.loads(attrs[sc.MODEL_TOOL_CALLS]) == [
        {"id": "call_a", "name": "pay"},
        {"id": "call_b", "name": "notify"},
    ]
    # content capture is off by default: no prompt, completion or tool arguments anywhere
    assert sc.GEN_AI_INPUT_MESSAGES not in attrs and sc.GEN_AI_OUTPUT_MESSAGES not in attrs
    assert "amount" not in attrs[sc.MODEL_TOOL_CALLS]


def test_streamed_chat_aggregates_content_usage_and_tool_calls(server, capturing: Pipeline):
    server.enqueue(s.chat_stream(["Pay", "ing"], tool_calls=[("call_s", "pay", {"amount": 99})], usage=(5, 3)))
    stream = client(server).chat.completions.create(
        model="gpt-test", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    assert capturing.spans("chat") == []  # the span is open while the stream is
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "Paying"
    span = capturing.one("chat")
    attrs = span.attributes
    assert attrs[sc.STREAM_END] == "exhausted" and attrs[sc.MODEL_STREAMED] is True
    assert attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] == 5 and attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 3
    assert tuple(attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ("tool_calls",)
    calls = json.loads(attrs[sc.MODEL_TOOL_CALLS])
    assert calls[0]["id"] == "call_s" and json.loads(calls[0]["arguments"]) == {"amount": 99}
    assert "Paying" in attrs[sc.GEN_AI_OUTPUT_MESSAGES]


@pytest.mark.parametrize("how", ["close", "with", "abandoned", "partial-then-close"])
def test_a_stream_span_ends_exactly_once_however_the_stream_ends(server, instrumented: Pipeline, how: str):
    server.enqueue(s.chat_stream(["a", "b", "c"]))
    c = client(server)
    stream = c.chat.completions.create(model="gpt-test", messages=MESSAGES, stream=True)
    if how == "close":
        stream.close()
        stream.close()
    elif how == "with":
        with stream as entered:
            next(iter(entered))
    elif how == "abandoned":
        # the caller drops the stream unread: its connection's socket is left for the collector, which may
        # warn about it now or at any later collection; that warning is the caller's bug, not the span's
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            del stream
            gc.collect()
    else:
        next(stream)
        stream.close()
        list(stream)  # whatever the client still hands out after close, it ends nothing a second time
    c.close()  # closes the pool's connections, the abandoned one's socket included
    span = instrumented.one("chat")
    assert span.attributes[sc.STREAM_END] == ("closed" if how != "abandoned" else "abandoned")
    assert span.end_time is not None and span.status.status_code is StatusCode.UNSET


def test_an_exception_mid_stream_ends_the_span_as_an_error_and_reaches_the_caller(server, instrumented: Pipeline):
    server.enqueue(s.chat_stream(["a", "b", "c", "d"], cut_after=3))
    stream = client(server).chat.completions.create(model="gpt-test", messages=MESSAGES, stream=True)
    seen = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            seen.append(chunk)
    assert 1 <= len(seen) < 6
    span = instrumented.one("chat")
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes[sc.STREAM_END] == "error"
    assert span.attributes[sc.ERROR_TYPE] == type(caught.value).__qualname__
    assert span.attributes[sc.GEN_AI_RESPONSE_ID] == "chatcmpl-s1"  # what arrived before the break is kept


@pytest.mark.parametrize(
    ("status", "error"),
    [(400, openai.BadRequestError), (429, openai.RateLimitError), (500, openai.InternalServerError)],
)
def test_error_statuses_mark_the_span_and_reraise_the_clients_own_exception(server, instrumented, status, error):
    server.enqueue(s.error(status, "scripted failure"))
    with pytest.raises(error):
        client(server).chat.completions.create(model="gpt-test", messages=MESSAGES)
    span = instrumented.one("chat")
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes[sc.ERROR_TYPE] == error.__qualname__
    assert any(e.name == "exception" for e in span.events)


def test_async_chat_and_async_stream(server, instrumented: Pipeline):
    server.enqueue(s.chat_completion("one", usage=(1, 2)), s.chat_stream(["x", "y"], usage=(3, 4)))

    async def run() -> str:
        async with aclient(server) as c:
            first = await c.chat.completions.create(model="gpt-test", messages=MESSAGES)
            stream = await c.chat.completions.create(
                model="gpt-test", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
            )
            parts = [chunk.choices[0].delta.content async for chunk in stream if chunk.choices]
            return first.choices[0].message.content + "".join(p or "" for p in parts)

    assert asyncio.run(run()) == "onexy"
    first, second = instrumented.spans("chat")
    assert first.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 2
    assert second.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 4 and second.attributes[sc.STREAM_END] == "exhausted"


def test_async_stream_closed_early_ends_once(server, instrumented: Pipeline):
    server.enqueue(s.chat_stream(["x", "y", "z"]))

    async def run() -> None:
        async with aclient(server) as c:
            async with await c.chat.completions.create(model="gpt-test", messages=MESSAGES, stream=True) as stream:
                await stream.__anext__()
            await stream.close()

    asyncio.run(run())
    assert instrumented.one("chat").attributes[sc.STREAM_END] == "closed"


def test_raw_and_streaming_response_paths_are_recorded_once(server, instrumented: Pipeline):
    server.enqueue(s.chat_completion("raw", usage=(8, 1)), s.chat_completion("streamed-raw"))
    c = client(server)
    raw = c.chat.completions.with_raw_response.create(model="gpt-test", messages=MESSAGES)
    assert raw.parse().choices[0].message.content == "raw"
    with c.chat.completions.with_streaming_response.create(model="gpt-test", messages=MESSAGES) as response:
        assert json.loads(response.read())["choices"][0]["message"]["content"] == "streamed-raw"
    first, second = instrumented.spans("chat")
    assert first.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 8 and first.attributes["http.response.status_code"] == 200
    assert second.attributes["http.response.status_code"] == 200


def test_responses_api_sync_stream_and_async(server, instrumented: Pipeline):
    server.enqueue(
        s.Reply(200, s.response_object("done", tool_calls=[("fc_1", "lookup", {"q": "x"})], usage=(13, 5))),
        s.responses_stream("streamed", usage=(2, 3)),
        s.Reply(200, s.response_object("async")),
    )
    c = client(server)
    assert c.responses.create(model="gpt-test", input="hi").output_text == "done"
    events = [e.type for e in c.responses.create(model="gpt-test", input="hi", stream=True)]
    assert events[-1] == "response.completed"

    async def run() -> str:
        async with aclient(server) as c:
            return (await c.responses.create(model="gpt-test", input="hi")).output_text

    assert asyncio.run(run()) == "async"
    plain, streamed, asynchronous = instrumented.spans("chat")
    assert plain.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 13
    assert json.loads(plain.attributes[sc.MODEL_TOOL_CALLS])[0]["id"] == "fc_1"
    assert streamed.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 3 and streamed.attributes[sc.STREAM_END] == "exhausted"
    assert asynchronous.attributes[sc.GEN_AI_RESPONSE_ID] == "resp_1"


def test_an_extraction_failure_never_breaks_the_call(server, capturing: Pipeline, caplog):
    # A response the client accepts (it does not validate) but whose shape our extraction does not expect.
    server.enqueue(
        s.Reply(
            200,
            {
                "id": "odd",
                "object": "chat.completion",
                "created": 1,
                "model": "m",
                "choices": [{"index": 0, "message": None, "finish_reason": "stop"}],
            },
        )
    )
    with caplog.at_level(logging.DEBUG, logger="otel_replay.instrumentation"):
        result = client(server).chat.completions.create(model="gpt-test", messages=MESSAGES)
    assert result.id == "odd" and result.choices[0].message is None
    span = capturing.one("chat")
    assert span.end_time is not None and span.status.status_code is StatusCode.UNSET
    assert any("response extraction failed" in r.getMessage() for r in caplog.records)


def test_under_another_genai_layer_ours_is_its_child_and_an_inner_layer_of_ours_adds_none(server, instrumented):
    """A framework's model span around the call: ours goes beneath it (model_calls keeps ours); no third span."""
    server.enqueue(s.chat_completion("framework"))
    framework = instrumented.provider.get_tracer("some.framework")
    with framework.start_as_current_span("chat gpt-test", attributes={sc.GEN_AI_OPERATION_NAME: "chat"}) as outer:
        client(server).chat.completions.create(model="gpt-test", messages=MESSAGES)
    spans = instrumented.spans("chat")
    assert [sp.instrumentation_scope.name for sp in spans] == ["otel_replay.instrumentation.openai", "some.framework"]
    assert spans[0].parent.span_id == outer.get_span_context().span_id


def test_content_capture_redacts_secrets_before_anything_leaves(server, capturing: Pipeline):
    pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----"
    secret_text = (
        "key sk-proj-abcdefghijklmnopqrstuvwx, header Bearer abc.def.ghijklmnop, "
        f"db postgres://admin:hunter2@db:5432/x, {pem}, password=swordfish"
    )
    server.enqueue(s.chat_completion(f"echo: {secret_text}"))
    client(server).chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": secret_text}])
    attrs = capturing.one("chat").attributes
    for key in (sc.GEN_AI_INPUT_MESSAGES, sc.GEN_AI_OUTPUT_MESSAGES):
        text = attrs[key]
        assert "[REDACTED]" in text
        for secret in ("abcdefghijklmnopqrstuvwx", "ghijklmnop", "hunter2", "MIIEowIBAAKCAQEA", "swordfish"):
            assert secret not in text, (key, secret)
    assert "admin:[REDACTED]@db" in attrs[sc.GEN_AI_INPUT_MESSAGES]


@pytest.mark.parametrize(
    ("value", "captured"),
    [
        ("true", True),
        ("SPAN_ONLY", True),
        ("span_and_event", True),
        # a privacy switch fails closed: upstream's "off" values and anything unknown keep content out
        ("NO_CONTENT", False),
        ("EVENT_ONLY", False),
        ("none", False),
        ("disabled", False),
        ("n", False),
        ("false", False),
    ],
)
def test_content_capture_follows_the_environment_switch(
    server, pipeline: Pipeline, monkeypatch, value: str, captured: bool
):
    from otel_replay.instrumentation import OpenAIInstrumentor

    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", value)
    OpenAIInstrumentor().instrument(tracer_provider=pipeline.provider)
    try:
        server.enqueue(s.chat_completion("hello there"))
        with client(server) as c:
            c.chat.completions.create(model="gpt-test", messages=MESSAGES)
    finally:
        OpenAIInstrumentor().uninstrument()
    attributes = pipeline.one("chat").attributes
    assert ("hello there" in attributes.get(sc.GEN_AI_OUTPUT_MESSAGES, "")) is captured
    assert (sc.GEN_AI_INPUT_MESSAGES in attributes) is captured


@pytest.mark.parametrize("peer_first", [True, False], ids=["peer_beneath_ours", "peer_around_ours"])
def test_beside_another_wrapt_instrumentation_ours_still_carries_the_decision(server, pipeline: Pipeline, peer_first):
    """E.g. the contrib openai-v2 instrumentor, before or after ours: both spans, ours with the record id and tools."""
    import wrapt
    from openai.resources.chat.completions.completions import Completions
    from opentelemetry.instrumentation.utils import unwrap

    from otel_replay.instrumentation import OpenAIInstrumentor

    original = vars(Completions)["create"]
    other = pipeline.provider.get_tracer("another.genai.instrumentation")

    def theirs(wrapped, instance, args, kwargs):
        with other.start_as_current_span(f"chat {kwargs['model']}", attributes={sc.GEN_AI_OPERATION_NAME: "chat"}):
            return wrapped(*args, **kwargs)

    def peer() -> None:
        wrapt.wrap_function_wrapper(Completions, "create", theirs)

    ours = OpenAIInstrumentor()
    steps = [peer, lambda: ours.instrument(tracer_provider=pipeline.provider)]
    for step in steps if peer_first else steps[::-1]:
        step()
    try:
        server.enqueue(s.chat_completion(None, tool_calls=[("call_9", "lookup", {"q": "x"})]))
        with audit("trade", snapshot=snapshot()) as d, client(server) as c:
            message = c.chat.completions.create(model="gpt-test", messages=MESSAGES).choices[0].message
            assert message.tool_calls[0].id == "call_9"
    finally:
        ours.uninstrument()
        unwrap(Completions, "create")  # the peer's layer, left outermost when ours is spliced out
    assert vars(Completions)["create"] is original
    spans = {sp.instrumentation_scope.name: sp for sp in pipeline.spans("chat")}
    assert sorted(spans) == ["another.genai.instrumentation", "otel_replay.instrumentation.openai"]
    mine, peers = spans["otel_replay.instrumentation.openai"], spans["another.genai.instrumentation"]
    outer, inner = (mine, peers) if peer_first else (peers, mine)
    assert inner.parent.span_id == outer.context.span_id
    assert mine.attributes[sc.RECORD_ID] == d.record_id
    assert "call_9" in mine.attributes[sc.MODEL_TOOL_CALLS]


def test_an_async_stream_dropped_unconsumed_ends_its_span(server, instrumented: Pipeline):
    server.enqueue(s.chat_stream(["x"]))

    async def run() -> None:
        async with aclient(server) as c:
            stream = await c.chat.completions.create(model="gpt-test", messages=MESSAGES, stream=True)
            await stream.__anext__()
            await stream.response.aclose()  # release the connection, then drop the stream unconsumed
            del stream
            gc.collect()

    asyncio.run(run())
    assert instrumented.one("chat").attributes[sc.STREAM_END] == "abandoned"


def test_a_response_with_a_flood_of_tool_calls_and_huge_ids_is_capped_and_counted(server, instrumented: Pipeline):
    calls = [(f"call_{i}", "noop", {"i": i}) for i in range(1000)]
    server.enqueue(s.chat_completion(None, tool_calls=calls, response_id="r" * 100_000, model="m" * 50_000))
    with client(server) as c:
        reply = c.chat.completions.create(model="gpt-test", messages=MESSAGES)
    assert len(reply.choices[0].message.tool_calls) == 1000  # the caller gets everything
    attrs = instrumented.one("chat").attributes
    assert len(json.loads(attrs[sc.MODEL_TOOL_CALLS])) == 128 and attrs[sc.MODEL_TOOL_CALLS_DROPPED] == 872
    assert len(attrs[sc.GEN_AI_RESPONSE_ID]) <= 257 and len(attrs[sc.GEN_AI_RESPONSE_MODEL]) <= 257


def test_responses_raw_path(server, instrumented: Pipeline):
    server.enqueue(s.Reply(200, s.response_object("raw", usage=(6, 2))))
    with client(server) as c:
        raw = c.responses.with_raw_response.create(model="gpt-test", input="hi")
        assert raw.parse().output_text == "raw"
    attrs = instrumented.one("chat").attributes
    assert attrs["http.response.status_code"] == 200 and attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] == 6
