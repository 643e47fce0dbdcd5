"""``AnthropicInstrumentor``: model-call spans for the ``anthropic`` client.

Wraps ``messages.create`` (sync and async, streaming and not, and so the
``with_raw_response`` / ``with_streaming_response`` paths) and
``messages.stream`` (the stream helper: its span ends when the stream is
exhausted, closed or its ``with`` block is left). ``gen_ai.provider.name =
anthropic``; ``tool_use`` blocks are listed in ``replay.model.tool_calls`` (and,
with content capture on, are ``tool_call`` parts of ``gen_ai.output.messages``,
the same shape as OpenAI's); input tokens include cache reads and writes, as
the convention asks, which are also given on their own.

``anthropic`` is imported only when :meth:`instrument` runs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
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
from otel_replay.instrumentation._genai import MAX_TOOL_CALLS, ToolCall, write_response
from otel_replay.instrumentation._messages import LINK_CHARS, Budget, Kept, reasoning_part, text_part, tool_call_part
from otel_replay.instrumentation._messages import message as shaped
from otel_replay.instrumentation._model import ModelMethod, _start, async_wrapper, sync_wrapper
from otel_replay.instrumentation._shapes import anthropic_input
from otel_replay.instrumentation._streams import AsyncStreamProxy, StreamEnd, SyncStreamProxy
from otel_replay.redaction import MAX_CONTENT_CHARS, check_settings

__all__ = ["AnthropicInstrumentor"]

_MODULE: Final = "anthropic.resources.messages.messages"


def _usage(usage: Any) -> dict[str, Any]:
    """Token counts of a message's ``usage``: input tokens include cache reads and writes, as the convention asks."""
    total = getattr(usage, "input_tokens", None)
    read = getattr(usage, "cache_read_input_tokens", None)
    created = getattr(usage, "cache_creation_input_tokens", None)
    if isinstance(total, int):
        for extra in (read, created):
            if isinstance(extra, int):
                total += extra
    return {
        "input_tokens": total,
        "output_tokens": getattr(usage, "output_tokens", None),
        "cache_read": read,
        "cache_creation": created,
    }


def _record_message(span: Span, message: Any, capture: bool) -> None:
    calls: list[ToolCall] = []
    parts: list[dict[str, Any]] = []
    for block in getattr(message, "content", None) or ():
        kind = getattr(block, "type", None)
        if kind == "tool_use":
            calls.append((block.id, block.name, block.input))
            if capture:
                parts.append(tool_call_part(block.id, block.name, block.input))
        elif capture and kind == "text":
            parts.append(text_part(block.text))
        elif capture and kind == "thinking" and isinstance(getattr(block, "thinking", None), str):
            parts.append(reasoning_part(block.thinking))
    stop = getattr(message, "stop_reason", None)
    write_response(
        span,
        response_id=getattr(message, "id", None),
        model=getattr(message, "model", None),
        finish_reasons=[stop] if isinstance(stop, str) else [],
        usage=_usage(getattr(message, "usage", None)),
        tool_calls=calls,
        capture=capture,
        output_messages=[shaped("assistant", parts, finish_reason=stop or "")] if capture else None,
    )


class _Events:
    """Aggregates raw message stream events: ids, usage, stop reason, tool_use blocks, text.

    Text (and thinking) is kept only with content capture on, within what can reach the span; a tool_use
    block's argument deltas within :data:`LINK_CHARS` per stream, capture on or off, because the tool's
    execution span is linked to its call by them (they reach the span only with capture on). Blocks past
    ``MAX_TOOL_CALLS`` tool calls are counted, not kept: memory does not grow with the stream.
    """

    __slots__ = ("args", "blocks", "calls", "capture", "id", "model", "more", "stop", "text", "usage")

    def __init__(self, capture: bool) -> None:
        self.capture = capture
        self.id: str | None = None
        self.model: str | None = None
        self.stop: str | None = None
        self.usage: dict[str, Any] = {}
        self.blocks: dict[int, list[Any]] = {}
        self.calls = 0
        self.more = 0
        self.text = Budget(MAX_CONTENT_CHARS)
        self.args = Budget(LINK_CHARS)

    def add(self, event: Any) -> None:
        kind = event.type
        if kind == "content_block_delta":
            slot = self.blocks.get(event.index)
            if slot is None or slot[3] is None:
                return
            delta = event.delta
            if delta.type == "input_json_delta":
                slot[3].add(delta.partial_json)
            elif delta.type == "text_delta":
                slot[3].add(delta.text)
            elif delta.type == "thinking_delta":
                slot[3].add(delta.thinking)
        elif kind == "content_block_start":
            block = event.content_block
            self._start(event.index, block)
        elif kind == "message_start":
            message = event.message
            self.id, self.model = message.id, message.model
            self.usage = _usage(message.usage)
        elif kind == "message_delta":
            self.stop = event.delta.stop_reason or self.stop
            usage = _usage(event.usage)
            for key, value in usage.items():
                if isinstance(value, int) and (key != "input_tokens" or value):
                    self.usage[key] = value

    def _start(self, index: int, block: Any) -> None:
        kind = block.type
        kept: Kept | None = None
        if kind == "tool_use":
            if self.calls >= MAX_TOOL_CALLS:
                self.more += 1
                return
            self.calls += 1
            kept = Kept(self.args)
        elif self.capture and kind in ("text", "thinking"):
            kept = Kept(self.text)
            first = getattr(block, kind, None)
            if isinstance(first, str) and first:
                kept.add(first)
        self.blocks[index] = [kind, getattr(block, "id", None), getattr(block, "name", None), kept]

    def finish(self, span: Span) -> None:
        ordered = [slot for _, slot in sorted(self.blocks.items())]
        calls: list[ToolCall] = [(s[1], s[2], s[3].text() or "{}") for s in ordered if s[0] == "tool_use"]
        calls += [(None, None, None)] * self.more  # counted as dropped past the cap
        outputs = None
        cut = 0
        if self.capture:
            parts: list[dict[str, Any]] = []
            for kind, call_id, name, kept in ordered:
                if kept is None:
                    continue
                cut += kept.cut if kind != "tool_use" else 0
                if kind == "tool_use":
                    parts.append(tool_call_part(call_id, name, kept.text() or "{}"))
                elif kind == "text":
                    parts.append(text_part(kept.text()))
                else:
                    parts.append(reasoning_part(kept.text()))
            outputs = [shaped("assistant", parts, finish_reason=self.stop or "")]
        write_response(
            span,
            response_id=self.id,
            model=self.model,
            finish_reasons=[self.stop] if self.stop else [],
            usage=self.usage,
            tool_calls=calls,
            capture=self.capture,
            output_messages=outputs,
            content_cut=cut,
        )


_CREATE: Final = ModelMethod("anthropic", "anthropic.messages.create", _record_message, _Events, anthropic_input)
_STREAM: Final = ModelMethod("anthropic", "anthropic.messages.stream", _record_message, _Events, anthropic_input)


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
        self._layers.wrap_when_imported(  # anthropic is not imported here if the application has not yet
            _MODULE,
            {
                "Messages.create": sync_wrapper(tracer, _CREATE, capture),
                "AsyncMessages.create": async_wrapper(tracer, _CREATE, capture),
                "Messages.stream": _stream_wrapper(tracer, capture),
                "AsyncMessages.stream": _stream_wrapper(tracer, capture),
            },
        )

    def _uninstrument(self, **kwargs: Any) -> None:
        self._layers.remove()
