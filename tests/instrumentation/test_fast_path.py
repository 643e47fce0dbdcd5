"""The model wrapper's fast paths keep the recorded facts: server address per client, the seam when a mode is on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import openai

from otel_replay import _seam
from otel_replay import semconv as sc
from otel_replay.instrumentation import scripted as s

from .conftest import Pipeline

T = TypeVar("T")
MESSAGES = [{"role": "user", "content": "hello"}]


def _ask(client: openai.OpenAI) -> None:
    client.chat.completions.create(model="gpt-test", messages=MESSAGES)


def test_server_address_follows_each_client_and_a_changed_base_url(instrumented: Pipeline):
    with (
        s.ScriptedServer(default=s.chat_completion("a")) as first,
        s.ScriptedServer(default=s.chat_completion("b")) as second,
    ):
        one = openai.OpenAI(base_url=first.base_url, api_key="sk-test", max_retries=0)
        two = openai.OpenAI(base_url=second.base_url, api_key="sk-test", max_retries=0)
        for client in (one, two, one, two):  # alternating clients: no stale address from the previous call
            _ask(client)
        one.base_url = second.base_url  # the same client pointed elsewhere
        _ask(one)
        ports = [span.attributes[sc.SERVER_PORT] for span in instrumented.spans("chat")]
        assert ports == [first.port, second.port, first.port, second.port, second.port]
        assert first.port != second.port
        assert {span.attributes[sc.SERVER_ADDRESS] for span in instrumented.spans("chat")} == {"127.0.0.1"}
        assert len(first.requests) == 2 and len(second.requests) == 3


class _Counting:
    """A seam mode that runs every call for real and notes what crossed."""

    def __init__(self) -> None:
        self.calls: list[_seam.Call] = []

    def around(self, call: _seam.Call, invoke: Callable[[], T]) -> T:
        self.calls.append(call)
        return invoke()


def test_a_mode_for_one_context_sees_the_model_calls_made_there_and_no_others(server, instrumented: Pipeline):
    server.enqueue(s.chat_completion("outside"), s.chat_completion("inside"), s.chat_stream(["x", "y"]))
    client = openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
    mode = _Counting()
    _ask(client)  # no mode: the call goes straight to the client
    with _seam.active(mode):
        _ask(client)
        chunks: list[Any] = list(client.chat.completions.create(model="gpt-test", messages=MESSAGES, stream=True))
    assert [(c.boundary, c.name) for c in mode.calls] == [("model", "openai.chat.completions.create")] * 2
    assert mode.calls[1].arguments.get("stream") is True and len(chunks) >= 3
    assert _seam.current() is None
    spans = instrumented.spans("chat")
    assert len(spans) == 3 and spans[-1].attributes[sc.STREAM_END] == "exhausted"
