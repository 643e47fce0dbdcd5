"""``AnthropicInstrumentor``: model-call spans for the ``anthropic`` client.

Wraps ``messages.create`` (sync and async, streaming and not, and so the
``with_raw_response`` / ``with_streaming_response`` paths) and
``messages.stream`` (the stream helper: its span ends when the stream is
exhausted, closed or its ``with`` block is left). ``gen_ai.provider.name =
anthropic``; ``tool_use`` blocks become ``gen_ai.tool.call`` events; input
tokens include cache reads and writes, as the convention asks.

``anthropic`` is imported only when :meth:`instrument` runs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from types import TracebackType
from typing import Any, Final

import wrapt
from opentelemetry import context
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]
from opentelemetry.trace import Span, Tracer

from otel_replay._seam import Call, through, through_async
from otel_replay.instrumentation._common import (
    SUPPRESS_GENAI_KEY,
    Layers,
    Started,
    content_enabled,
    end_failed,
    guard,
    tracer_for,
)
from otel_replay.instrumentation._genai import ToolCall, write_response
from otel_replay.instrumentation._model import ModelMethod, _start, async_wrapper, sync_wrapper
from otel_replay.instrumentation._streams import AsyncStreamProxy, StreamEnd, SyncStreamProxy
from otel_replay.redaction import check_settings

__all__ = ["AnthropicInstrumentor"]

_MODULE: Final = "anthropic.resources.messages.messages"


def _input_tokens(usage: Any) -> int | None:
    total = getattr(usage, "input_tokens", None)
    if not isinstance(total, int):
        return None
    for extra in ("cache_read_input_tokens", "cache_creation_input_tokens"):
        value = getattr(usage, extra, None)
        if isinstance(value, int):
            total += value
    return total


def _record_message(span: Span, message: Any, capture: bool) -> None:
    calls: list[ToolCall] = []
    texts: list[str] = []
    for block in getattr(message, "content", None) or ():
        kind = getattr(block, "type", None)
        if kind == "tool_use":
            calls.append((block.id, block.name, block.input))
        elif capture and kind == "text":
            texts.append(block.text)
    usage = getattr(message, "usage", None)
    stop = getattr(message, "stop_reason", None)
    outputs = None
    if capture:
        outputs = [{"role": "assistant", "content": texts, "tool_calls": [list(c) for c in calls] or None}]
    write_response(
        span,
        response_id=getattr(message, "id", None),
        model=getattr(message, "model", None),
        finish_reasons=[stop] if isinstance(stop, str) else [],
        input_tokens=_input_tokens(usage),
        output_tokens=getattr(usage, "output_tokens", None),
        tool_calls=calls,
        capture=capture,
        output_messages=outputs,
    )


class _Events:
    """Aggregates raw message stream events: ids, usage, stop reason, tool_use blocks, text."""

    __slots__ = ("blocks", "capture", "id", "input_tokens", "model", "output_tokens", "stop")

    def __init__(self, capture: bool) -> None:
        self.capture = capture
        self.id: str | None = None
        self.model: str | None = None
        self.stop: str | None = None
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.blocks: dict[int, list[Any]] = {}

    def add(self, event: Any) -> None:
        kind = event.type
        if kind == "content_block_delta":
            delta = event.delta
            slot = self.blocks.get(event.index)
            if slot is None:
                return
            if delta.type == "input_json_delta":
                slot[3].append(delta.partial_json)
            elif self.capture and delta.type == "text_delta":
                slot[3].append(delta.text)
        elif kind == "content_block_start":
            block = event.content_block
            slot = [block.type, getattr(block, "id", None), getattr(block, "name", None), []]
            if self.capture and block.type == "text" and block.text:
                slot[3].append(block.text)
            self.blocks[event.index] = slot
        elif kind == "message_start":
            message = event.message
            self.id, self.model = message.id, message.model
            self.input_tokens = _input_tokens(message.usage)
            self.output_tokens = getattr(message.usage, "output_tokens", None)
        elif kind == "message_delta":
            self.stop = event.delta.stop_reason or self.stop
            output = getattr(event.usage, "output_tokens", None)
            if isinstance(output, int):
                self.output_tokens = output

    def finish(self, span: Span) -> None:
        ordered = [slot for _, slot in sorted(self.blocks.items())]
        calls: list[ToolCall] = [(s[1], s[2], "".join(s[3]) or "{}") for s in ordered if s[0] == "tool_use"]
        outputs = None
        if self.capture:
            texts = ["".join(s[3]) for s in ordered if s[0] == "text"]
            outputs = [{"role": "assistant", "content": texts, "tool_calls": [list(c) for c in calls] or None}]
        write_response(
            span,
            response_id=self.id,
            model=self.model,
            finish_reasons=[self.stop] if self.stop else [],
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            tool_calls=calls,
            capture=self.capture,
            output_messages=outputs,
        )


def _input(kwargs: Mapping[str, Any]) -> Any:
    content: dict[str, Any] = {"messages": kwargs.get("messages")}
    for key in ("system", "tools"):
        value = kwargs.get(key)
        if isinstance(value, str | list):
            content[key] = value
    return content


_CREATE: Final = ModelMethod("anthropic", "anthropic.messages.create", _record_message, _Events, _input)
_STREAM: Final = ModelMethod("anthropic", "anthropic.messages.stream", _record_message, _Events, _input)


class _StreamManager(wrapt.ObjectProxy):
    """``messages.stream(...)``'s manager: the span starts on ``with`` entry and ends with the stream."""

    def __init__(self, wrapped: Any, tracer: Tracer, instance: Any, kwargs: dict[str, Any], capture: bool) -> None:
        super().__init__(wrapped)
        self._self_args = (tracer, instance, kwargs, capture)

    def _begin(self) -> Started | None:
        if context.get_value(SUPPRESS_GENAI_KEY):
            return None
        tracer, instance, kwargs, capture = self._self_args
        return guard("span start", _start, tracer, _STREAM, instance, {**kwargs, "stream": True}, capture)

    def _hook(self, span: Span, stream: Any, aio: bool) -> bool:
        raw = stream._raw_stream  # read lazily by the helper's own iterator, so it can be observed here
        end = StreamEnd(span, _Events(self._self_args[3]), capture=self._self_args[3])
        stream._raw_stream = AsyncStreamProxy(raw, end) if aio else SyncStreamProxy(raw, end)
        return True

    def _entered(self, started: Started, stream: Any, *, aio: bool) -> None:
        """The stream is open: its span (started) now follows the stream to its end."""
        context.detach(started[1])
        if not guard("stream hook", self._hook, started[0], stream, aio):
            started[0].end()  # not a stream this helper knows: the span covers the request only

    def __enter__(self) -> Any:
        started = self._begin()
        call = Call("model", _STREAM.seam_name, self._self_args[2])
        if started is None:
            return through(call, self.__wrapped__.__enter__)
        try:
            stream = through(call, self.__wrapped__.__enter__)
        except BaseException as exc:
            end_failed(started, exc, self._self_args[3])
            raise
        self._entered(started, stream, aio=False)
        return stream

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Any:
        return self.__wrapped__.__exit__(exc_type, exc, tb)

    async def __aenter__(self) -> Any:
        started = self._begin()
        call = Call("model", _STREAM.seam_name, self._self_args[2])
        if started is None:
            return await through_async(call, self.__wrapped__.__aenter__)
        try:
            stream = await through_async(call, self.__wrapped__.__aenter__)
        except BaseException as exc:
            end_failed(started, exc, self._self_args[3])
            raise
        self._entered(started, stream, aio=True)
        return stream

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Any:
        return await self.__wrapped__.__aexit__(exc_type, exc, tb)


def _stream_wrapper(tracer: Tracer, capture: bool) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        manager = wrapped(*args, **kwargs)
        return _StreamManager(manager, tracer, instance, kwargs, capture)

    return wrapper


class AnthropicInstrumentor(BaseInstrumentor):
    """Model-call spans for ``anthropic``'s ``messages.create`` and ``messages.stream``.

    ``AnthropicInstrumentor().instrument(tracer_provider=..., capture_content=...)``;
    ``capture_content`` defaults to ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``.
    Entry point: ``otel_replay_anthropic``.
    """

    def instrumentation_dependencies(self) -> Collection[str]:
        """The client versions this instrumentor supports."""
        return ("anthropic >= 0.40",)

    def _instrument(self, **kwargs: Any) -> None:
        tracer = tracer_for("anthropic", kwargs.get("tracer_provider"))
        capture = content_enabled(kwargs.get("capture_content"))
        check_settings()  # a bad OTEL_REPLAY_REDACT_* is refused here, not at the first captured call
        self._layers = Layers()
        self._layers.wrap(_MODULE, "Messages.create", sync_wrapper(tracer, _CREATE, capture))
        self._layers.wrap(_MODULE, "AsyncMessages.create", async_wrapper(tracer, _CREATE, capture))
        self._layers.wrap(_MODULE, "Messages.stream", _stream_wrapper(tracer, capture))
        self._layers.wrap(_MODULE, "AsyncMessages.stream", _stream_wrapper(tracer, capture))

    def _uninstrument(self, **kwargs: Any) -> None:
        self._layers.remove()
