"""Ours beside a peer's OpenAI or Anthropic instrumentation on the same client, in either order: the decision keeps
its model calls.

The real peer packages (for ``openai``: the contrib openai-v2 instrumentor, OpenLLMetry, OpenInference; for
``anthropic``: OpenLLMetry, OpenInference) instrument the real client in this process together with ours, before or
after it; inside ``audit()`` a plain and a streamed tool call (and for Anthropic the ``messages.stream`` helper too)
go to a scripted server on loopback, each tool the model asked for runs as a ``@tool``. In the dataset each call is
one row of ``model_calls``, carrying the decision's record id, correlation id and tool calls, and each tool's act
joins the model call that asked for it. The ``anthropic`` client's own span (2.x makes one per call when given a
tracer provider) is a third description of the same call. A peer that is not installed is skipped (CI installs
them all, and fails the step on a skip).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from anthropic.lib.bedrock import _beta_messages as bedrock_beta_messages
from anthropic.resources import messages as anthropic_messages
from anthropic.resources.beta import messages as anthropic_beta_messages
from openai.resources import responses
from openai.resources.chat import completions
from opentelemetry.sdk.trace import TracerProvider

import otel_replay
from otel_replay import audit, correlation
from otel_replay.instrumentation import AnthropicInstrumentor, OpenAIInstrumentor, scripted, tool
from tests._support import payment, snapshot

from ._peer_agent import PEERS

_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


_ANTHROPIC_TOOLS = [
    {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
]

_COEXISTING = ("openai_v2", "openllmetry", "openinference")
"""The peers: the contrib instrumentor and OpenLLMetry wrap the same client methods as ours, OpenInference the lower
``OpenAI.request`` (so its span is beneath ours whichever was installed first)."""

ANTHROPIC_PEERS = {
    "openllmetry": "opentelemetry.instrumentation.anthropic",
    "openinference": "openinference.instrumentation.anthropic",
}
"""Peer name -> the module holding its Anthropic ``AnthropicInstrumentor``: both wrap the same ``Messages`` methods
as ours (``create`` and ``stream``)."""

_WRAPPED = (
    completions.Completions, completions.AsyncCompletions, responses.Responses, responses.AsyncResponses,
    openai.OpenAI, openai.AsyncOpenAI,
    anthropic_messages.Messages, anthropic_messages.AsyncMessages,
    anthropic_beta_messages.Messages, anthropic_beta_messages.AsyncMessages,
    bedrock_beta_messages.Messages, bedrock_beta_messages.AsyncMessages,
)  # fmt: skip
"""The client classes whose methods the instrumentations here wrap."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package that is there but broken
        return False


@pytest.fixture(autouse=True)
def client_restored() -> Iterator[None]:
    """Put the clients' methods back as they were: OpenLLMetry 0.62's ``uninstrument()`` leaves its layers on.

    (It names the module ``openai.resources.chat.completions`` and the attribute ``Completions.create`` to
    ``unwrap``, which looks for ``Completions.create`` on the module and finds nothing.) A layer left on records
    into the earlier test's provider, a span this test's dataset never gets. OpenInference's Anthropic
    ``uninstrument()`` puts back the methods it found, taking off a layer of ours put on after it.
    """
    before = [(owner, dict(vars(owner))) for owner in _WRAPPED]
    yield
    for owner, attrs in before:
        for name, value in attrs.items():
            if vars(owner).get(name) is not value:
                setattr(owner, name, value)


@pytest.fixture
def server() -> Iterator[scripted.ScriptedServer]:
    with scripted.ScriptedServer() as scripted_server:
        yield scripted_server


def _peer(name: str) -> Any:
    return importlib.import_module(PEERS[name]).OpenAIInstrumentor()


def _decide(server: scripted.ScriptedServer, provider: Any) -> tuple[str, list[str]]:
    """A decision making a plain and a streamed tool call, running the tools asked for: its record id, the call ids."""
    server.enqueue(scripted.chat_completion(None, tool_calls=[("call_plain", "get_weather", {"city": "Oslo"})],
                                            response_id="chatcmpl-tool", usage=(11, 4)))  # fmt: skip
    server.enqueue(scripted.chat_stream((), tool_calls=[("call_streamed", "get_weather", {"city": "Rome"})],
                                        response_id="chatcmpl-st"))  # fmt: skip

    @tool(side_effect="read", tracer_provider=provider)
    def get_weather(city: str) -> str:
        return "rain" if city else "?"

    asked: list[str] = []
    with correlation("corr-coexist"), audit("vendor_payment", snapshot=snapshot()) as d:
        with openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0) as c:
            message = c.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "w?"}],
                                                tools=_TOOLS).choices[0].message  # fmt: skip
            for call in message.tool_calls or ():
                asked.append(call.id)
                get_weather(**json.loads(call.function.arguments))
            stream = c.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "w?"}],
                                               tools=_TOOLS, stream=True)  # fmt: skip
            pieces: dict[int, list[str]] = {}
            for chunk in stream:
                for delta in (chunk.choices[0].delta.tool_calls or ()) if chunk.choices else ():
                    if delta.id:
                        asked.append(delta.id)
                    pieces.setdefault(delta.index, []).append(delta.function.arguments or "")
            for _, arguments in sorted(pieces.items()):
                get_weather(**json.loads("".join(arguments)))
        d.act(payment())
    return d.record_id, asked


def _assert_one_row_per_call(dataset: Path, record_id: str, asked: list[str]) -> None:
    """Each call one row of model_calls with the decision's ids and tool calls; each tool's act joins its call."""
    assert asked == ["call_plain", "call_streamed"]  # the instrumentations left the client's answers as they were
    store = otel_replay.open(dataset)
    calls = store.rows("SELECT * FROM model_calls WHERE operation = 'chat' ORDER BY start_time")
    assert [row["response_id"] for row in calls] == ["chatcmpl-tool", "chatcmpl-st"]  # one row per call
    for row, call_id in zip(calls, asked, strict=True):
        assert row["record_id"] == record_id and row["correlation_id"] == "corr-coexist"
        assert [t["id"] for t in json.loads(row["tool_calls"])] == [call_id]
    assert [row["streamed"] for row in calls] == [False, True]
    assert (calls[0]["input_tokens"], calls[0]["output_tokens"]) == (11, 4)
    assert _tool_runs_joined(store, record_id) == [
        ("call_plain", "chatcmpl-tool"), ("call_streamed", "chatcmpl-st")]  # fmt: skip
    [act] = store.rows("SELECT * FROM acts WHERE record_id = ? AND source = 'act'", [record_id])
    assert act["action_type"] == "vendor_payment"


def _tool_runs_joined(store: Any, record_id: str) -> list[tuple[str, str]]:
    """The decision's tool runs, in order, each as (its call id, the response id of the model call that asked)."""
    joined = store.rows(
        "SELECT a.tool_call_id, m.response_id FROM acts a JOIN model_calls m ON m.record_id = a.record_id"
        " AND list_contains(json_extract_string(m.tool_calls, '$[*].id'), a.tool_call_id)"
        " WHERE a.record_id = ? AND a.source = 'tool' ORDER BY a.start_time",
        [record_id],
    )
    return [(r["tool_call_id"], r["response_id"]) for r in joined]


def _beside(theirs: Any, ours: Any, peer_first: bool, decide: Callable[[], Any], telemetry: Any) -> Any:
    """Instrument with the peer and ours in the order asked, run ``decide``, take both off, flush; what it returned."""
    steps = [lambda: theirs.instrument(tracer_provider=telemetry.provider),
             lambda: ours.instrument(tracer_provider=telemetry.provider)]  # fmt: skip
    for step in steps if peer_first else steps[::-1]:
        step()
    try:
        return decide()
    finally:
        ours.uninstrument()
        theirs.uninstrument()
        telemetry.shutdown()


@pytest.mark.filterwarnings("ignore:Support for class-based `config`:DeprecationWarning")  # OpenLLMetry on pydantic 2
@pytest.mark.parametrize("peer_first", [True, False], ids=["peer_first", "ours_first"])
@pytest.mark.parametrize(
    "peer", [pytest.param(p, marks=pytest.mark.skipif(not _installed(PEERS[p]), reason=f"{PEERS[p]} not installed"))
             for p in _COEXISTING],
)  # fmt: skip
def test_a_decisions_model_calls_keep_its_record_id_and_tool_calls_beside_a_peer(
    server: scripted.ScriptedServer, telemetry: Any, dataset: Path, peer: str, peer_first: bool
) -> None:
    theirs, ours = _peer(peer), OpenAIInstrumentor()
    record_id, asked = _beside(theirs, ours, peer_first, lambda: _decide(server, telemetry.provider), telemetry)
    _assert_one_row_per_call(dataset, record_id, asked)


@pytest.mark.filterwarnings("ignore:Support for class-based `config`:DeprecationWarning")  # OpenLLMetry on pydantic 2
@pytest.mark.skipif(
    not (_installed(PEERS["openinference"]) and _installed(PEERS["openllmetry"])), reason="a peer is not installed"
)
def test_a_peers_span_beneath_ours_is_one_call_with_an_unstored_span_between_them(
    server: scripted.ScriptedServer, telemetry: Any, dataset: Path
) -> None:
    # OpenLLMetry, installed first and exporting elsewhere, wraps the same method beneath ours; OpenInference's
    # span (on OpenAI.request) is then the child of a span the dataset never gets, not of ours
    elsewhere = TracerProvider()
    between, ours, beneath = _peer("openllmetry"), OpenAIInstrumentor(), _peer("openinference")
    between.instrument(tracer_provider=elsewhere)
    ours.instrument(tracer_provider=telemetry.provider)
    beneath.instrument(tracer_provider=telemetry.provider)
    try:
        record_id, asked = _decide(server, telemetry.provider)
    finally:
        beneath.uninstrument()
        ours.uninstrument()
        between.uninstrument()
        elsewhere.shutdown()
    telemetry.shutdown()
    store = otel_replay.open(dataset)
    ours_ids = {r["span_id"] for r in store.rows("SELECT span_id FROM spans WHERE replay_kind = 'model'")}
    theirs = store.rows("SELECT parent_span_id FROM spans WHERE scope_name LIKE 'openinference%'")
    assert len(theirs) == 2 and not ours_ids & {r["parent_span_id"] for r in theirs}  # not ours' children
    _assert_one_row_per_call(dataset, record_id, asked)


def _decide_anthropic(server: scripted.ScriptedServer, provider: Any) -> tuple[str, list[str]]:
    """A decision making a plain and a streamed ``messages.create`` and a ``messages.stream``, each asking for a tool
    that then runs: its record id, the call ids in the order asked. The client makes its own span of each call."""
    server.enqueue(scripted.anthropic_message(None, tool_uses=[("toolu_plain", "get_weather", {"city": "Oslo"})],
                                              message_id="msg_tool", usage=(11, 4)))  # fmt: skip
    server.enqueue(scripted.anthropic_stream((), tool_uses=[("toolu_streamed", "get_weather", {"city": "Rome"})],
                                             message_id="msg_st"))  # fmt: skip
    server.enqueue(scripted.anthropic_stream(("Let me look.",), tool_uses=[("toolu_helper", "get_weather",
                                             {"city": "Bern"})], message_id="msg_helper"))  # fmt: skip

    @tool(side_effect="read", tracer_provider=provider)
    def get_weather(city: str) -> str:
        return "rain" if city else "?"

    asked: list[str] = []
    ask = {"model": "claude-test", "max_tokens": 64, "messages": [{"role": "user", "content": "w?"}],
           "tools": _ANTHROPIC_TOOLS}  # fmt: skip
    with correlation("corr-coexist"), audit("vendor_payment", snapshot=snapshot()) as d:
        with anthropic.Anthropic(base_url=server.root_url, api_key="k", max_retries=0,
                                 open_telemetry={"tracer_provider": provider}) as c:  # fmt: skip
            for block in c.messages.create(**ask).content:
                if block.type == "tool_use":
                    asked.append(block.id)
                    get_weather(**block.input)
            started: dict[int, str] = {}
            pieces: dict[int, list[str]] = {}
            for event in c.messages.create(**ask, stream=True):
                if event.type == "content_block_start" and event.content_block.type == "tool_use":
                    started[event.index] = event.content_block.id
                elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                    pieces.setdefault(event.index, []).append(event.delta.partial_json)
            for index, call_id in sorted(started.items()):
                asked.append(call_id)
                get_weather(**json.loads("".join(pieces[index])))
            with c.messages.stream(**ask) as stream:
                final = stream.get_final_message()
            for block in final.content:
                if block.type == "tool_use":
                    asked.append(block.id)
                    get_weather(**block.input)
        d.act(payment())
    return d.record_id, asked


@pytest.mark.parametrize("peer_first", [True, False], ids=["peer_first", "ours_first"])
@pytest.mark.parametrize(
    "peer", [pytest.param(p, marks=pytest.mark.skipif(not _installed(m), reason=f"{m} not installed"))
             for p, m in ANTHROPIC_PEERS.items()],
)  # fmt: skip
def test_a_decisions_anthropic_calls_keep_its_record_id_and_tool_calls_beside_a_peer(
    server: scripted.ScriptedServer, telemetry: Any, dataset: Path, peer: str, peer_first: bool
) -> None:
    theirs, ours = importlib.import_module(ANTHROPIC_PEERS[peer]).AnthropicInstrumentor(), AnthropicInstrumentor()
    decide = lambda: _decide_anthropic(server, telemetry.provider)  # noqa: E731
    record_id, asked = _beside(theirs, ours, peer_first, decide, telemetry)
    assert asked == ["toolu_plain", "toolu_streamed", "toolu_helper"]  # the answers were left as they were
    store = otel_replay.open(dataset)
    # each call is described three times, all stored: the peer's span, ours, the client's own
    described = store.rows(
        "SELECT scope_name, count(*) AS n FROM spans GROUP BY 1 HAVING scope_name IN (?, ?, ?)",
        [ANTHROPIC_PEERS[peer], "otel_replay.instrumentation.anthropic", "com.anthropic.sdk.python"],
    )
    assert sorted((row["scope_name"], row["n"]) for row in described) == [
        ("com.anthropic.sdk.python", 3),
        (ANTHROPIC_PEERS[peer], 3),
        ("otel_replay.instrumentation.anthropic", 3),
    ]
    calls = store.rows("SELECT * FROM model_calls WHERE operation = 'chat' ORDER BY start_time")
    assert [row["response_id"] for row in calls] == ["msg_tool", "msg_st", "msg_helper"]  # one row per call
    for row, call_id in zip(calls, asked, strict=True):
        assert (row["record_id"], row["correlation_id"], row["provider"]) == (record_id, "corr-coexist", "anthropic")
        assert [(t["id"], t["name"]) for t in json.loads(row["tool_calls"])] == [(call_id, "get_weather")]
    assert [row["streamed"] for row in calls] == [False, True, True]
    assert [(row["input_tokens"], row["output_tokens"]) for row in calls] == [(11, 4), (17, 9), (17, 9)]
    assert _tool_runs_joined(store, record_id) == [
        ("toolu_plain", "msg_tool"), ("toolu_streamed", "msg_st"), ("toolu_helper", "msg_helper")]  # fmt: skip
    [act] = store.rows("SELECT * FROM acts WHERE record_id = ? AND source = 'act'", [record_id])
    assert act["action_type"] == "vendor_payment"


@pytest.mark.parametrize(
    "peer", [pytest.param(p, marks=pytest.mark.skipif(not _installed(m), reason=f"{m} not installed"))
             for p, m in ANTHROPIC_PEERS.items()],
)  # fmt: skip
def test_an_anthropic_peer_alone_fills_model_calls(
    server: scripted.ScriptedServer, telemetry: Any, dataset: Path, peer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # without ours, the peer's spans are the model calls: ids, tokens, the stream flag and tool calls read from them
    monkeypatch.setenv("TRACELOOP_TRACE_CONTENT", "true")  # OpenLLMetry's content switch (its tool calls are content)
    server.enqueue(scripted.anthropic_message(None, tool_uses=[("toolu_plain", "get_weather", {"city": "Oslo"})],
                                              message_id="msg_tool", usage=(11, 4)))  # fmt: skip
    server.enqueue(scripted.anthropic_stream(("Hel", "lo"), tool_uses=[("toolu_streamed", "get_weather",
                                             {"city": "Rome"})], message_id="msg_st"))  # fmt: skip
    theirs = importlib.import_module(ANTHROPIC_PEERS[peer]).AnthropicInstrumentor()
    theirs.instrument(tracer_provider=telemetry.provider)
    ask = {"model": "claude-test", "max_tokens": 64, "messages": [{"role": "user", "content": "w?"}],
           "tools": _ANTHROPIC_TOOLS}  # fmt: skip
    try:
        with anthropic.Anthropic(base_url=server.root_url, api_key="k", max_retries=0) as c:
            c.messages.create(**ask)
            kinds = [event.type for event in c.messages.create(**ask, stream=True)]
    finally:
        theirs.uninstrument()
    telemetry.shutdown()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    calls = otel_replay.open(dataset).rows("SELECT * FROM model_calls ORDER BY start_time")
    assert [(r["response_id"], r["provider"], r["model"], r["operation"]) for r in calls] == [
        ("msg_tool", "anthropic", "claude-test", "chat"), ("msg_st", "anthropic", "claude-test", "chat")]  # fmt: skip
    assert (calls[0]["input_tokens"], calls[0]["output_tokens"]) == (11, 4)
    assert [r["streamed"] for r in calls] == [False, True]
    assert [[(t["id"], t["name"]) for t in json.loads(r["tool_calls"])] for r in calls] == [
        [("toolu_plain", "get_weather")], [("toolu_streamed", "get_weather")]]  # fmt: skip
    assert all(r["record_id"] is None for r in calls)  # no decision here: nothing to link
