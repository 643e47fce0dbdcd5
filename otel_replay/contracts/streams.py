"""Streaming, enforced: text flows as it arrives; tool calls are held until complete, gated, then released.

A governed stream wraps the client's stream (``openai.Stream``, ``anthropic.Stream`` and their async
forms, and the raw stream under ``messages.stream()``'s helper). A per-API *filter* looks at each chunk:

* text (and the role, and the message start) passes at once;
* a tool call's pieces (its id and name, then its argument fragments) are held;
* the end of the response (the finish reason and usage) is held too, until the whole response is in.

When the model's response is complete the held calls go to the session's ``decide`` callback (the same
pipeline as a non-streamed response). What it allows is released, renumbered so the caller's own
accumulator sees calls ``0..n-1`` (or content blocks in order); what it refuses never reaches the caller;
a rejection raises :class:`~otel_replay.errors.ReplayContractError` from the iteration, after the text.
If the stream breaks or is left (closed, or its ``with`` block left) before the response is complete, the held
calls are never delivered, and the session counts the model call as a step (``abandon``).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final, Protocol

import wrapt

from otel_replay.contracts.engine import ToolCallView
from otel_replay.contracts.providers.openai import APP_CALLS, responses_call
from otel_replay.errors import ContractError

__all__ = [
    "AnthropicFilter",
    "AsyncGovernedStream",
    "ChatFilter",
    "Decide",
    "GovernedStream",
    "ResponsesFilter",
    "StreamFilter",
]

Decide = Callable[[list[ToolCallView], "str | None", "tuple[int, int] | None"], frozenset[int]]
"""``decide(calls, model, usage) -> indexes of the calls allowed`` (raises when the response is rejected)."""


class StreamFilter(Protocol):
    """What one API's stream holds back and releases."""

    complete: bool
    """The response is complete: release now (else at the end of the stream)."""

    def take(self, chunk: Any) -> list[Any]:
        """The chunks to hand the caller now for ``chunk`` (none while it is held)."""
        ...

    def release(self, decide: Decide) -> list[Any]:
        """Gate the held calls and return what the caller gets: the allowed calls, then the held ending."""
        ...


# --- openai chat.completions ----------------------------------------------------------------------------


class _HeldCall:
    """One streamed tool call's pieces, assembled as the client's own accumulator assembles them."""

    __slots__ = ("call_id", "first", "legacy", "name", "parts")

    def __init__(self, first: tuple[Any, Any, Any], legacy: bool = False) -> None:
        self.call_id = ""
        self.name = ""
        self.parts: list[str] = []
        self.first = first  # (chunk, choice, tool call delta) of its first piece: the shape it is released in
        self.legacy = legacy  # a deprecated ``delta.function_call``, released in that field


class ChatFilter:
    """``ChatCompletionChunk`` streams: content passes, ``delta.tool_calls`` and the ending are held."""

    def __init__(self) -> None:
        """An empty filter."""
        self.complete = False
        # (choice, 0, call index) for tool calls; (choice, 1, 0) for a choice's deprecated function_call, each
        # index as _place gives it
        self._calls: dict[tuple[_Place, int, _Place], _HeldCall] = {}
        self._ending: list[Any] = []
        self._model: str | None = None
        self._usage: tuple[int, int] | None = None

    def take(self, chunk: Any) -> list[Any]:
        """Pass content, hold tool-call deltas, finish reasons and the usage chunk."""
        if self._model is None:
            self._model = getattr(chunk, "model", None)
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            self._usage = (int(usage.prompt_tokens or 0), int(usage.completion_tokens or 0))
        choices = list(getattr(chunk, "choices", None) or ())
        if not choices:
            if usage is not None:
                self._ending.append(chunk)
                return []
            return [chunk]
        held_any = False
        passed = []
        for choice in choices:
            delta = choice.delta
            calls = getattr(delta, "tool_calls", None) if delta is not None else None
            legacy = getattr(delta, "function_call", None) if delta is not None else None
            if calls or legacy is not None:
                held_any = True
                for call in calls or ():
                    key = (_place(choice.index), 0, _place(call.index))
                    held = self._calls.get(key)
                    if held is None:
                        held = self._calls[key] = _HeldCall((chunk, choice, call))
                    # every piece's id and name are appended, as the openai library's accumulator (and the
                    # usual hand-written one) joins them: the call gated is the call the caller assembles
                    if isinstance(call.id, str):
                        held.call_id += call.id
                    function = call.function
                    if function is not None:
                        if isinstance(function.name, str):
                            held.name += function.name
                        if isinstance(function.arguments, str):
                            held.parts.append(function.arguments)
                if legacy is not None:  # the deprecated functions API: one call per choice, joined the same way
                    key = (_place(choice.index), 1, (0, 0))
                    held = self._calls.get(key)
                    if held is None:
                        held = self._calls[key] = _HeldCall((chunk, choice, legacy), legacy=True)
                    if isinstance(legacy.name, str):
                        held.name += legacy.name
                    if isinstance(legacy.arguments, str):
                        held.parts.append(legacy.arguments)
                delta = delta.model_copy(update={"tool_calls": None, "function_call": None})
                choice = choice.model_copy(update={"delta": delta})
            if choice.finish_reason is not None:
                held_any = True
                self._ending.append(chunk.model_copy(update={"choices": [choice]}))
                continue
            passed.append(choice)
        if not held_any:
            return [chunk]
        out = [chunk.model_copy(update={"choices": passed})] if any(_has_content(c) for c in passed) else []
        return out

    def views(self) -> list[ToolCallView]:
        """The held calls, in order (choice, then call index), complete."""
        views = []
        for ordinal, key in enumerate(sorted(self._calls)):
            held = self._calls[key]
            text = "".join(held.parts)
            views.append(ToolCallView.parse(ordinal, held.call_id, held.name, text))
        return views

    def release(self, decide: Decide) -> list[Any]:
        """Gate the held calls; release each allowed one renumbered per choice, then the ending.

        An allowed call is released as ONE chunk holding exactly what was gated (its id, name and complete
        arguments), built fresh: no field of the model's pieces the gate did not read reaches the caller.
        """
        views = self.views()
        keep = decide(views, self._model, self._usage)
        out: list[Any] = []
        kept_per_choice: dict[_Place, int] = {}
        for ordinal, key in enumerate(sorted(self._calls)):
            if ordinal not in keep:
                continue
            number = kept_per_choice.get(key[0], 0)
            kept_per_choice[key[0]] = number + 1
            held = self._calls[key]
            chunk, choice, call = held.first
            if held.legacy:
                legacy = {"function_call": {"name": held.name, "arguments": "".join(held.parts)}}
                piece = _choice(choice, type(choice.delta).model_validate(legacy))
                out.append(chunk.model_copy(update={"choices": [piece], "usage": None}))
                continue
            whole = type(call).model_validate(
                {
                    "index": number,
                    "id": held.call_id,
                    "type": "function",
                    "function": {"name": held.name, "arguments": "".join(held.parts)},
                }
            )
            piece = _choice(choice, type(choice.delta).model_validate({"tool_calls": [whole]}))
            out.append(chunk.model_copy(update={"choices": [piece], "usage": None}))
        had_calls = {key[0] for key in self._calls}
        for chunk in self._ending:
            choices = []
            for choice in getattr(chunk, "choices", None) or ():
                if (
                    choice.finish_reason in ("tool_calls", "function_call")
                    and _place(choice.index) in had_calls
                    and not kept_per_choice.get(_place(choice.index))
                ):
                    choice = choice.model_copy(update={"finish_reason": "stop"})
                choices.append(choice)
            out.append(chunk.model_copy(update={"choices": choices}) if choices else chunk)
        self._calls.clear()
        self._ending.clear()
        return out


_Place = tuple[int, Any]


def _place(index: Any) -> _Place:
    """A chunk's choice or call ``index`` as a key that sorts and hashes whatever the model sent.

    The client builds chunks without validating them, so an index may be null, text or a list; numbers
    come first, in order, then the rest by their text (a call's pieces still meet under one key).
    """
    return (0, index) if type(index) is int else (1, repr(index))


def _choice(choice: Any, delta: Any) -> Any:
    """A fresh choice at ``choice``'s index holding ``delta``.

    Built unvalidated, as the client builds it, when that index is not a number.
    """
    if type(choice.index) is int:
        return type(choice).model_validate({"index": choice.index, "delta": delta, "finish_reason": None})
    return type(choice).model_construct(index=choice.index, delta=delta, finish_reason=None)


def _has_content(choice: Any) -> bool:
    delta = choice.delta
    return delta is not None and (delta.content is not None or delta.role is not None or bool(delta.refusal))


# --- anthropic messages ---------------------------------------------------------------------------------


class AnthropicFilter:
    """Raw ``messages`` stream events: text blocks pass (renumbered), ``tool_use`` blocks and the ending held."""

    def __init__(self) -> None:
        """An empty filter."""
        self.complete = False
        self._out_index = 0
        self._map: dict[_Place, int] = {}  # passed blocks: their index in (as _place gives it) -> index out
        self._held: dict[_Place, list[Any]] = {}  # held tool_use blocks: index in -> their events
        self._ending: list[Any] = []
        self._model: str | None = None
        self._input = 0
        self._output = 0
        self._stop: str | None = None

    def take(self, event: Any) -> list[Any]:
        """Pass the message start and text blocks, hold ``tool_use`` blocks, ``message_delta`` and ``message_stop``."""
        kind = getattr(event, "type", None)
        if kind == "message_start":
            message = event.message
            self._model = getattr(message, "model", None)
            usage = getattr(message, "usage", None)
            if usage is not None:
                self._input = int(getattr(usage, "input_tokens", 0) or 0)
                for extra in ("cache_read_input_tokens", "cache_creation_input_tokens"):
                    self._input += int(getattr(usage, extra, 0) or 0)
                self._output = int(getattr(usage, "output_tokens", 0) or 0)
            return [event]
        if kind == "content_block_start":
            place = _place(event.index)
            if getattr(event.content_block, "type", None) == "tool_use":
                self._held[place] = [event]
                return []
            self._map[place] = self._out_index
            self._out_index += 1
            return [_renumbered(event, self._map[place])]
        if kind in ("content_block_delta", "content_block_stop"):
            place = _place(event.index)
            held = self._held.get(place)
            if held is not None:
                held.append(event)
                return []
            number = self._map.get(place)
            return [event if number is None else _renumbered(event, number)]
        if kind == "message_delta":
            self._stop = getattr(event.delta, "stop_reason", None) or self._stop
            output = getattr(getattr(event, "usage", None), "output_tokens", None)
            if isinstance(output, int):
                self._output = output
            self._ending.append(event)
            return []
        if kind == "message_stop":
            self._ending.append(event)
            self.complete = True
            return []
        return [event]

    def views(self) -> list[ToolCallView]:
        """The held ``tool_use`` blocks, in order, with their input assembled."""
        views = []
        for ordinal, index in enumerate(sorted(self._held)):
            events = self._held[index]
            block = events[0].content_block
            parts = [
                e.delta.partial_json
                for e in events[1:]
                if e.type == "content_block_delta" and getattr(e.delta, "type", None) == "input_json_delta"
            ]
            if parts:  # the client's accumulator parses the deltas into the block's input, replacing it
                text = "".join(parts)
            else:  # without deltas the block keeps the input it started with
                text = json.dumps(block.input, separators=(",", ":"), default=str) if block.input else "{}"
            views.append(ToolCallView.parse(ordinal, block.id or "", block.name or "", text))
        return views

    def release(self, decide: Decide) -> list[Any]:
        """Gate the held blocks; release the allowed ones after the passed blocks, then the ending."""
        views = self.views()
        keep = decide(views, self._model, (self._input, self._output))
        out: list[Any] = []
        kept = 0
        for ordinal, index in enumerate(sorted(self._held)):
            if ordinal not in keep:
                continue
            number = self._out_index
            self._out_index += 1
            kept += 1
            out.extend(_renumbered(event, number) for event in _as_gated_block(self._held[index], views[ordinal]))
        for event in self._ending:
            if event.type == "message_delta" and self._held and not kept and event.delta.stop_reason == "tool_use":
                event = event.model_copy(update={"delta": event.delta.model_copy(update={"stop_reason": "end_turn"})})
            out.append(event)
        self._held.clear()
        self._ending.clear()
        return out


def _as_gated_block(events: list[Any], view: ToolCallView) -> list[Any]:
    """A released ``tool_use`` block's events made to say exactly what was gated.

    With input deltas: the block starts with an empty input and ONE delta carries the whole input gated;
    without: the block as it started (its input is what was gated). Other events of the block pass.
    """
    deltas = [
        e for e in events if e.type == "content_block_delta" and getattr(e.delta, "type", None) == "input_json_delta"
    ]
    if not deltas:
        return events
    out: list[Any] = []
    for event in events:
        if event.type == "content_block_start":
            block = event.content_block.model_copy(update={"input": {}})
            out.append(event.model_copy(update={"content_block": block}))
        elif event.type != "content_block_delta":
            out.append(event)
        elif event is deltas[0]:
            whole = event.delta.model_copy(update={"partial_json": view.arguments_text})
            out.append(event.model_copy(update={"delta": whole}))
    return out


def _renumbered(event: Any, number: int) -> Any:
    return event if event.index == number else event.model_copy(update={"index": number})


# --- openai responses -----------------------------------------------------------------------------------

_RESPONSE_ENDS: Final = frozenset({"response.completed", "response.incomplete", "response.failed"})


class ResponsesFilter:
    """``responses`` stream events: message items pass (renumbered); tool calls and the ending are held.

    Held: the items the application carries out (function, custom and built-in tool calls,
    :data:`~otel_replay.contracts.providers.openai.APP_CALLS`) and the final ``response.*`` event.
    """

    def __init__(self) -> None:
        """An empty filter."""
        self.complete = False
        self._out_index = 0
        self._map: dict[_Place, int] = {}  # passed items: output_index in (as _place gives it) -> out
        self._held: dict[_Place, list[Any]] = {}  # tool call items: output_index in -> their events
        self._gated: list[Any] = []  # the items gated, in order, as the caller may see them
        self._ending: list[Any] = []

    def take(self, event: Any) -> list[Any]:
        """Pass what is not a tool call; hold tool calls' events and the final ``response.*`` event."""
        kind = getattr(event, "type", None)
        if kind in _RESPONSE_ENDS:
            self._ending.append(event)
            self.complete = True
            return []
        index = getattr(event, "output_index", _NO_INDEX)
        is_call = getattr(getattr(event, "item", None), "type", None) in APP_CALLS or kind in _CALL_EVENTS
        if index is _NO_INDEX and not is_call:
            return [event]  # not an output item's event (response.created, ...)
        # an index the client did not validate (null, a list) or none at all still keys its call: a call's
        # events passed through unheld would reach the caller ungated
        place = _place(None if index is _NO_INDEX else index)
        held = self._held.get(place)
        if held is None and is_call:
            held = self._held[place] = []  # a call, whichever of its events comes first
        if held is not None:
            held.append(event)
            return []
        if place not in self._map:
            self._map[place] = self._out_index
            self._out_index += 1
        return [_at_output(event, self._map[place])]

    def views(self) -> list[ToolCallView]:
        """The held calls, in order, complete: the final item's arguments, else the streamed ones."""
        views = []
        self._gated = []
        for ordinal, index in enumerate(sorted(self._held)):
            item: Any = None
            done: str | None = None
            parts: list[str] = []
            final = False
            for event in self._held[index]:
                kind = event.type
                if kind in ("response.function_call_arguments.delta", "response.custom_tool_call_input.delta"):
                    parts.append(event.delta or "")
                elif kind == "response.function_call_arguments.done":
                    done = event.arguments
                elif kind == "response.custom_tool_call_input.done":
                    done = event.input
                elif kind in ("response.output_item.added", "response.output_item.done"):
                    if not final:
                        item = event.item
                    final = final or kind == "response.output_item.done"
            found = responses_call(item) if item is not None else None
            call_id, name, text = found if found is not None else ("", "", "")
            if not final and item is not None and getattr(item, "type", None) in ("function_call", "custom_tool_call"):
                text = done if isinstance(done, str) else "".join(parts)
                field = "arguments" if item.type == "function_call" else "input"
                item = item.model_copy(update={field: text})
            self._gated.append(item)
            views.append(ToolCallView.parse(ordinal, call_id, name, text))
        return views

    def _usage(self) -> tuple[str | None, tuple[int, int] | None]:
        for event in self._ending:
            response = getattr(event, "response", None)
            usage = getattr(response, "usage", None)
            if usage is not None:
                tokens = (int(usage.input_tokens or 0), int(usage.output_tokens or 0))
                return getattr(response, "model", None), tokens
        return None, None

    def release(self, decide: Decide) -> list[Any]:
        """Gate the held calls; release the allowed ones, then the final event with exactly the gated calls.

        The final response's tool call items are replaced by the items gated (allowed ones only), so a
        final response that names other calls than the stream did delivers none of them.
        """
        views = self.views()
        model, usage = self._usage()
        keep = decide(views, model, usage)
        out: list[Any] = []
        for ordinal, index in enumerate(sorted(self._held)):
            if ordinal not in keep:
                continue
            number = self._out_index
            self._out_index += 1
            gated = self._gated[ordinal]
            out.extend(_at_output(event, number) for event in _as_gated(self._held[index], gated, views[ordinal]))
        for event in self._ending:
            response = getattr(event, "response", None)
            if response is not None and response.output is not None:
                calls = 0
                output = []
                for item in response.output:
                    if getattr(item, "type", None) in APP_CALLS:
                        ordinal, calls = calls, calls + 1
                        if ordinal in keep and ordinal < len(self._gated) and self._gated[ordinal] is not None:
                            output.append(self._gated[ordinal])
                        continue
                    output.append(item)
                event = event.model_copy(update={"response": response.model_copy(update={"output": output})})
            out.append(event)
        self._held.clear()
        self._ending.clear()
        return out


_DELTAS: Final = frozenset({"response.function_call_arguments.delta", "response.custom_tool_call_input.delta"})
_CALL_EVENTS: Final = _DELTAS | {"response.function_call_arguments.done", "response.custom_tool_call_input.done"}
"""The events of a call's input, which name no item type but belong to a held call."""
_NO_INDEX: Final = object()


def _as_gated(events: list[Any], item: Any, view: ToolCallView) -> list[Any]:
    """A released call's events made to say exactly what was gated, however the caller assembles them.

    One delta carries the whole arguments text, the ``done`` events and items carry it too, the ``added``
    item starts empty (the deltas are appended to it).
    """
    text = view.arguments_text
    arg = "input" if getattr(item, "type", None) == "custom_tool_call" else "arguments"
    empty = item.model_copy(update={arg: ""}) if item is not None and hasattr(item, arg) else item
    out: list[Any] = []
    delta_sent = False
    for event in events:
        kind = event.type
        if kind in _DELTAS:
            if not delta_sent:
                out.append(event.model_copy(update={"delta": text}))
                delta_sent = True
        elif kind == "response.function_call_arguments.done":
            out.append(event.model_copy(update={"arguments": text}))
        elif kind == "response.custom_tool_call_input.done":
            out.append(event.model_copy(update={"input": text}))
        elif kind == "response.output_item.added":
            out.append(event.model_copy(update={"item": empty}))
        elif kind == "response.output_item.done":
            out.append(event.model_copy(update={"item": item}))
        else:
            out.append(event)
    return out


def _at_output(event: Any, number: int) -> Any:
    same = getattr(event, "output_index", None) == number  # (a held call's event may have come without one)
    return event if same else event.model_copy(update={"output_index": number})


# --- the stream proxies ---------------------------------------------------------------------------------


_BODY_READERS: Final = frozenset(
    {
        "read",
        "iter_bytes",
        "iter_text",
        "iter_lines",
        "iter_raw",
        "content",
        "text",
        "json",
        "aread",
        "aiter_bytes",
        "aiter_text",
        "aiter_lines",
        "aiter_raw",
    }
)


class _BodyWithheld(wrapt.ObjectProxy):
    """A governed stream's HTTP response: its status, headers and ``close()``, never its ungated body."""

    def __getattr__(self, name: str) -> Any:
        if name in _BODY_READERS:
            raise ContractError(
                f"the body of a governed stream's HTTP response is not given out ({name}): its tool calls "
                "are gated only as the stream is iterated"
            )
        return getattr(self.__wrapped__, name)


class _HeldStream(wrapt.ObjectProxy):
    """What the synchronous and asynchronous governed streams share: the held events and their release."""

    def __init__(
        self, wrapped: Any, filter: StreamFilter, decide: Decide, abandon: Callable[[], None] | None = None
    ) -> None:
        """Hold ``wrapped``'s events for ``filter``; ``decide`` gates them, ``abandon`` counts a stream left."""
        super().__init__(wrapped)
        self._self_filter = filter
        self._self_decide = decide
        self._self_abandon = abandon
        self._self_queue: deque[Any] = deque()
        self._self_released = False

    @property
    def response(self) -> Any:
        """The HTTP response, its body withheld (read the stream instead)."""
        return _BodyWithheld(self.__wrapped__.response)

    @property
    def released(self) -> bool:
        """The response was gated (or the stream given up): nothing more is held."""
        return bool(self._self_released)

    def abandoned(self) -> None:
        """The caller left the stream: if its response was not gated yet, it never will be (counted once)."""
        if self._self_released:
            return
        self._self_released = True
        self._self_queue.clear()
        if self._self_abandon is not None:
            self._self_abandon()


class GovernedStream(_HeldStream):
    """A client's synchronous stream, governed: iterate it as the original (``with``, ``close()`` too).

    A stream left before its response was gated (closed, left by ``with``, or broken) calls ``abandon``
    once: the model was called, the session counts it; its held calls are never delivered.
    """

    def __init__(
        self, wrapped: Any, filter: StreamFilter, decide: Decide, abandon: Callable[[], None] | None = None
    ) -> None:
        """Govern ``wrapped`` through ``filter``, gating with ``decide``."""
        super().__init__(wrapped, filter, decide, abandon)
        self._self_it = wrapped if hasattr(wrapped, "__next__") else iter(wrapped)

    def __iter__(self) -> GovernedStream:
        return self

    def __next__(self) -> Any:
        queue = self._self_queue
        while not queue:
            if self._self_released:
                raise StopIteration
            try:
                chunk = self._self_it.__next__()
            except StopIteration:
                self._release()
                continue
            except BaseException:  # a broken stream: its response is never gated
                self.abandoned()
                raise
            queue.extend(self._self_filter.take(chunk))
            if self._self_filter.complete:
                self._release()
        return queue.popleft()

    def _release(self) -> None:
        self._self_released = True
        try:
            self._self_queue.extend(self._self_filter.release(self._self_decide))
        except BaseException:  # rejected: nothing more of this response is read; its connection is let go
            close = getattr(self.__wrapped__, "close", None)
            if close is not None:
                close()
            raise

    def close(self) -> None:
        """Close the stream (an ungated response is counted as abandoned)."""
        self.abandoned()
        close = getattr(self.__wrapped__, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> GovernedStream:
        enter = getattr(self.__wrapped__, "__enter__", None)
        if enter is not None:
            enter()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Any:
        self.abandoned()
        leave = getattr(self.__wrapped__, "__exit__", None)
        return leave(exc_type, exc, tb) if leave is not None else None


class AsyncGovernedStream(_HeldStream):
    """A client's asynchronous stream, governed (``async for``, ``async with``, ``await close()``).

    Abandoned as :class:`GovernedStream`.
    """

    def __init__(
        self, wrapped: Any, filter: StreamFilter, decide: Decide, abandon: Callable[[], None] | None = None
    ) -> None:
        """Govern ``wrapped`` through ``filter``, gating with ``decide`` (called in the event loop's thread)."""
        super().__init__(wrapped, filter, decide, abandon)
        self._self_it = wrapped if hasattr(wrapped, "__anext__") else wrapped.__aiter__()

    def __aiter__(self) -> AsyncGovernedStream:
        return self

    async def __anext__(self) -> Any:
        queue = self._self_queue
        while not queue:
            if self._self_released:
                raise StopAsyncIteration
            try:
                chunk = await self._self_it.__anext__()
            except StopAsyncIteration:
                await self._release()
                continue
            except BaseException:  # a broken stream: its response is never gated
                self.abandoned()
                raise
            queue.extend(self._self_filter.take(chunk))
            if self._self_filter.complete:
                await self._release()
        return queue.popleft()

    async def _release(self) -> None:
        self._self_released = True
        try:
            self._self_queue.extend(self._self_filter.release(self._self_decide))
        except BaseException:  # rejected: nothing more of this response is read; its connection is let go
            close = getattr(self.__wrapped__, "close", None)
            if close is not None:
                await close()
            raise

    async def close(self) -> None:
        """Close the stream (an ungated response is counted as abandoned)."""
        self.abandoned()
        close = getattr(self.__wrapped__, "close", None)
        if close is not None:
            await close()

    async def __aenter__(self) -> AsyncGovernedStream:
        enter = getattr(self.__wrapped__, "__aenter__", None)
        if enter is not None:
            await enter()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Any:
        self.abandoned()
        leave = getattr(self.__wrapped__, "__aexit__", None)
        return (await leave(exc_type, exc, tb)) if leave is not None else None
