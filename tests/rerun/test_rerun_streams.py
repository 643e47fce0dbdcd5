"""Streaming model calls (server-sent events) and the Anthropic client: recorded once, rerun offline."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anthropic
import openai

from otel_replay.instrumentation import scripted
from otel_replay.rerun import rerun

from .conftest import record


def _openai_stream(base: str) -> list[Any]:
    with openai.OpenAI(base_url=base, api_key="sk-test-0123456789abcdefghij", max_retries=0) as client:
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        plain = client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])
        return [text, plain.choices[0].message.content]


async def _openai_stream_async(base: str) -> str:
    async with openai.AsyncOpenAI(base_url=base, api_key="sk-test-0123456789abcdefghij", max_retries=0) as client:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        return "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])


def _anthropic(base: str) -> list[Any]:
    with anthropic.Anthropic(base_url=base, api_key="sk-ant-test-0123456789abcdef", max_retries=0) as client:
        ask = [{"role": "user", "content": "hi"}]
        message = client.messages.create(model="claude-test", max_tokens=50, messages=ask)  # type: ignore[arg-type]
        with client.messages.stream(model="claude-test", max_tokens=50, messages=ask) as s:  # type: ignore[arg-type]
            streamed = "".join(s.text_stream)
        return [message.content[0].text, streamed]  # type: ignore[union-attr]


def test_openai_streams_sync_and_async_rerun_offline(dataset: Path) -> None:
    with scripted.ScriptedServer() as server:
        server.enqueue(
            scripted.chat_stream(["Hel", "lo"]),
            scripted.chat_completion("after"),
            scripted.chat_stream(["a", "b", "c"]),
        )
        base = server.base_url

        def both() -> list[Any]:
            return [*_openai_stream(base), asyncio.run(_openai_stream_async(base))]

        original, _, _ = record(dataset, "streams", both)
    assert original == ["Hello", "after", "abc"]
    result = rerun(both, dataset=dataset, session_id="streams")
    assert result.output == original and result.matched, result.report()


def test_the_anthropic_client_reruns_offline(dataset: Path) -> None:
    with scripted.ScriptedServer() as server:
        server.enqueue(scripted.anthropic_message("first"), scripted.anthropic_stream(["str", "eam"]))
        base = server.root_url
        original, _, _ = record(dataset, "claude", lambda: _anthropic(base))
    assert original == ["first", "stream"]
    result = rerun(lambda: _anthropic(base), dataset=dataset, session_id="claude")
    assert result.output == original and result.matched, result.report()
