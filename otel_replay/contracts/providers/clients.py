"""The governed client: ``session.client``, a chain of proxies over the original client.

Everything is the original client's (attributes, options, the HTTP connection, exceptions, return types)
except the governed methods, which run each call through the session's pipeline
(:class:`~otel_replay.contracts.pipeline.Governor`):

* ``openai``: ``chat.completions.create`` and ``responses.create`` (plain, ``stream=True``, and through
  ``with_raw_response``), their ``parse()`` and ``stream()`` helpers, sync and async, and the same
  ``chat.completions`` reached as ``beta.chat.completions``;
* ``anthropic``: ``messages.create`` (plain, ``stream=True``, ``with_raw_response``) and
  ``messages.stream(...)``, the same of ``beta.messages``, sync and async; ``beta.messages.tool_runner()``
  (which runs the model's tool calls itself) is refused while enforcing.

A response's refused tool calls are stripped from the very object the client returned (so a raw
response's ``parse()`` shows the same); a rejected one raises
:class:`~otel_replay.errors.ReplayContractError`. ``with_options()`` and ``copy()`` return governed clients
of the same session, and ``with session.client as client`` hands out the governed client. The openai stream
helpers (``chat.completions.stream()``, ``responses.stream()``) and ``parse()`` are governed too. Other
methods (``with_streaming_response``, the client's own ``post()``) are not: a generating call
through them reaches the client unguarded, and the session's bypass detection reports it (see
docs/guides/governing.md for the list).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Protocol

import wrapt

from otel_replay.contracts.engine import ToolCallView
from otel_replay.contracts.pipeline import GOVERNED, Governor, Request
from otel_replay.contracts.providers.anthropic import MessagesAdapter
from otel_replay.contracts.providers.base import Adapter
from otel_replay.contracts.providers.openai import ChatAdapter, ResponsesAdapter
from otel_replay.contracts.state import SessionState
from otel_replay.contracts.streams import (
    AnthropicFilter,
    AsyncGovernedStream,
    ChatFilter,
    Decide,
    GovernedStream,
    ResponsesFilter,
    StreamFilter,
)
from otel_replay.errors import ContractError, ReplayContractError


class GovernedSession(Protocol):
    """What the proxies need of the session that owns them (:class:`otel_replay.contracts.GovernedSession`)."""

    governor: Governor
    max_retries: int
    client: Any

    @property
    def session_id(self) -> str:
        """The governed session's id."""
        ...

    @property
    def active(self) -> bool:
        """False once the session was restored: the proxies then pass calls straight through."""
        ...

    def watch(self, client: Any, aio: bool) -> None:
        """Report the generating requests ``client`` makes outside a governed call as bypasses."""
        ...


__all__ = ["governed_client"]

_CHAT = ChatAdapter()
_RESPONSES = ResponsesAdapter()
_MESSAGES = MessagesAdapter()


def _filter_for(adapter: Adapter) -> StreamFilter:
    if adapter is _CHAT:
        return ChatFilter()
    if adapter is _MESSAGES:
        return AnthropicFilter()
    return ResponsesFilter()


def _decider(session: GovernedSession, adapter: Adapter, request: Request) -> Decide:
    def decide(calls: list[ToolCallView], model: str | None, usage: tuple[int, int] | None) -> frozenset[int]:
        return session.governor.decide(adapter, request, calls, usage, streamed=True)

    return decide


def _abandoner(session: GovernedSession, adapter: Adapter) -> Callable[[], None]:
    """What a stream left before its response was gated does: the model call counts as a step (enforcing).

    Else a loop of abandoned (or broken) streams would call the model past ``max_steps`` unseen.
    """

    def abandon() -> None:
        governor = session.governor
        governor.tell({"event": "stream_abandoned", "api": adapter.api})
        if governor.mode != "enforce":
            return

        def count(state: SessionState) -> None:
            state.total_step_count += 1
            state.state_version += 1

        governor.update(count)

    return abandon


def _governed_stream(session: GovernedSession, adapter: Adapter, request: Request, stream: Any, aio: bool) -> Any:
    filter = _filter_for(adapter)
    decide = _decider(session, adapter, request)
    abandon = _abandoner(session, adapter)
    if aio:
        return AsyncGovernedStream(stream, filter, decide, abandon)
    return GovernedStream(stream, filter, decide, abandon)


def _read(session: GovernedSession, adapter: Adapter, response: Any) -> tuple[list[ToolCallView], Any] | None:
    """The response's tool calls and usage; ``None`` (counted unguarded) when unreadable and ``on_error=allow``."""
    try:
        return adapter.calls(response), adapter.usage(response)
    except Exception as exc:
        if session.governor.engine.on_error == "allow":
            session.governor.unguarded(f"response unreadable: {type(exc).__name__}", adapter)
            return None
        raise ContractError(
            f"session {session.session_id}: the {adapter.api} response could not be read for its tool calls "
            f"({type(exc).__name__}); on_error='block' refuses it"
        ) from exc


def _gate(session: GovernedSession, adapter: Adapter, request: Request, response: Any) -> bool:
    """Gate a complete response in place; ``True`` when calls were stripped from it."""
    read = _read(session, adapter, response)
    if read is None:
        return False
    calls, usage = read
    keep = session.governor.decide(adapter, request, calls, usage, streamed=False)
    if len(keep) < len(calls):
        adapter.strip(response, keep)
        return True
    return False


def _body(parsed: Any) -> bytes:
    """A stripped response as JSON bytes (what its raw body now says)."""
    to_json = getattr(parsed, "model_dump_json", None)
    return to_json().encode() if callable(to_json) else json.dumps(parsed, default=str).encode()


class _StrippedRaw(wrapt.ObjectProxy):
    """A raw response some of whose tool calls were refused: its body reads as the stripped response.

    ``parse()`` gives the stripped response; ``content``, ``text`` and ``http_response`` say the
    same (the refused calls the server sent are in no form reachable through it).
    """

    def __init__(self, wrapped: Any, parsed: Any) -> None:
        super().__init__(wrapped)
        self._self_body = _body(parsed)

    @property
    def content(self) -> bytes:
        return bytes(self._self_body)

    @property
    def text(self) -> str:
        return bytes(self._self_body).decode()

    @property
    def http_response(self) -> Any:
        original = self.__wrapped__.http_response
        skip = {"content-length", "content-encoding", "transfer-encoding"}
        headers = [(key, value) for key, value in original.headers.items() if key.lower() not in skip]
        return type(original)(original.status_code, headers=headers, content=self._self_body, request=original.request)


def _retrying(session: GovernedSession, attempt: int, exc: ReplayContractError) -> bool:
    return exc.decision is not None and attempt < session.max_retries and not session.governor.state().killed


@contextmanager
def _calling(session: GovernedSession) -> Iterator[None]:
    """Around the client's own call: marked as governed, its span carrying the session id."""
    token = GOVERNED.set(True)
    try:
        with session.governor.scope():
            yield
    finally:
        GOVERNED.reset(token)


def _streamed(session: GovernedSession, adapter: Adapter, request: Request, result: Any, raw: bool, aio: bool) -> Any:
    """What a ``stream=True`` call returns: its stream (or raw response) read through the governed filter."""
    if raw:
        return _RawStreamResponse(result, session, adapter, request, aio)
    return _governed_stream(session, adapter, request, result, aio)


def _settled(
    session: GovernedSession, adapter: Adapter, request: Request, result: Any, parsed: Any, raw: bool, attempt: int
) -> tuple[bool, Any]:
    """Gate a complete response: ``(True, what the caller gets)``, or ``(False, None)`` to ask the model again."""
    try:
        stripped = _gate(session, adapter, request, parsed)
    except ReplayContractError as exc:
        if _retrying(session, attempt, exc):
            return False, None
        raise
    return True, _StrippedRaw(result, parsed) if raw and stripped else result


def _run(
    session: GovernedSession, adapter: Adapter, method: Callable[..., Any], args: Any, kwargs: Any, raw: bool
) -> Any:
    if not session.active:
        return method(*args, **kwargs)
    attempt = 0
    while True:
        request = session.governor.before(adapter, dict(kwargs))
        with _calling(session):
            result = method(*args, **request.kwargs)
        if request.kwargs.get("stream") is True:
            return _streamed(session, adapter, request, result, raw, aio=False)
        done, value = _settled(session, adapter, request, result, result.parse() if raw else result, raw, attempt)
        if done:
            return value
        attempt += 1


async def _arun(
    session: GovernedSession, adapter: Adapter, method: Callable[..., Any], args: Any, kwargs: Any, raw: bool
) -> Any:
    """:func:`_run` of an async client: the same steps, the client's calls awaited."""
    if not session.active:
        return await method(*args, **kwargs)
    attempt = 0
    while True:
        request = session.governor.before(adapter, dict(kwargs))
        with _calling(session):
            result = await method(*args, **request.kwargs)
        if request.kwargs.get("stream") is True:
            return _streamed(session, adapter, request, result, raw, aio=True)
        parsed = (await result.parse()) if raw else result
        done, value = _settled(session, adapter, request, result, parsed, raw, attempt)
        if done:
            return value
        attempt += 1


def _governed_call(
    session: GovernedSession, adapter: Adapter, aio: bool, method: Callable[..., Any], args: Any, kwargs: Any, raw: bool
) -> Any:
    """``method(*args, **kwargs)`` through the session's pipeline (a coroutine for an async client)."""
    return (_arun if aio else _run)(session, adapter, method, args, kwargs, raw)


class _RawStreamResponse(wrapt.ObjectProxy):
    """``with_raw_response.create(stream=True)``: the raw response, whose ``parse()`` gives the governed stream.

    Its body is read only through ``parse()``: ``content``, ``text`` and ``http_response`` (the ungoverned
    events) are refused.
    """

    def _refused(self, what: str) -> ContractError:
        session = self._self_args[0]
        return ContractError(
            f"session {session.session_id}: the {what} of a governed streamed response is not given out "
            "(its tool calls are not gated there): read it through parse()"
        )

    @property
    def content(self) -> bytes:
        raise self._refused("content")

    @property
    def text(self) -> str:
        raise self._refused("text")

    @property
    def http_response(self) -> Any:
        raise self._refused("http_response")

    def __init__(self, wrapped: Any, session: GovernedSession, adapter: Adapter, request: Request, aio: bool) -> None:
        super().__init__(wrapped)
        self._self_args = (session, adapter, request, aio)
        self._self_parsed: Any = None

    def parse(self, *args: Any, **kwargs: Any) -> Any:
        session, adapter, request, aio = self._self_args
        if aio:
            return self._aparse(*args, **kwargs)
        if self._self_parsed is None:
            self._self_parsed = _governed_stream(
                session, adapter, request, self.__wrapped__.parse(*args, **kwargs), False
            )
        return self._self_parsed

    async def _aparse(self, *args: Any, **kwargs: Any) -> Any:
        session, adapter, request, _ = self._self_args
        if self._self_parsed is None:
            stream = await self.__wrapped__.parse(*args, **kwargs)
            self._self_parsed = _governed_stream(session, adapter, request, stream, True)
        return self._self_parsed


class _StreamManager(wrapt.ObjectProxy):
    """``messages.stream(...)``'s manager: the stream it opens reads its events through the governed filter."""

    def __init__(self, wrapped: Any, session: GovernedSession, request: Request) -> None:
        super().__init__(wrapped)
        self._self_args = (session, request)
        self._self_governed: Any = None

    def _left(self) -> None:
        if self._self_governed is not None:
            self._self_governed.abandoned()

    def _govern(self, stream: Any, aio: bool) -> Any:
        session, request = self._self_args
        decide = _decider(session, _MESSAGES, request)
        raw = stream._raw_stream  # the helper reads its raw events lazily, through this attribute
        abandon = _abandoner(session, _MESSAGES)
        governed = (
            AsyncGovernedStream(raw, AnthropicFilter(), decide, abandon)
            if aio
            else GovernedStream(raw, AnthropicFilter(), decide, abandon)
        )
        stream._raw_stream = governed
        self._self_governed = governed
        return stream

    def __enter__(self) -> Any:
        with _calling(self._self_args[0]):  # the stream's span starts here
            stream = self.__wrapped__.__enter__()
        return self._govern(stream, False)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Any:
        self._left()
        return self.__wrapped__.__exit__(exc_type, exc, tb)

    async def __aenter__(self) -> Any:
        with _calling(self._self_args[0]):
            stream = await self.__wrapped__.__aenter__()
        return self._govern(stream, True)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Any:
        self._left()
        return await self.__wrapped__.__aexit__(exc_type, exc, tb)


class _Raw(wrapt.ObjectProxy):
    """``<resource>.with_raw_response``: its ``create`` governed."""

    def __init__(self, wrapped: Any, session: GovernedSession, adapter: Adapter, aio: bool) -> None:
        super().__init__(wrapped)
        self._self_args = (session, adapter, aio)

    def create(self, *args: Any, **kwargs: Any) -> Any:
        return _governed_call(*self._self_args, self.__wrapped__.create, args, kwargs, True)


class _Resource(wrapt.ObjectProxy):
    """A governed API resource (``chat.completions``, ``responses``, ``messages``)."""

    def __init__(self, wrapped: Any, session: GovernedSession, adapter: Adapter, aio: bool) -> None:
        super().__init__(wrapped)
        self._self_args = (session, adapter, aio)

    def create(self, *args: Any, **kwargs: Any) -> Any:
        return _governed_call(*self._self_args, self.__wrapped__.create, args, kwargs, False)

    @property
    def with_raw_response(self) -> Any:
        session, adapter, aio = self._self_args
        return _Raw(self.__wrapped__.with_raw_response, session, adapter, aio)

    def parse(self, *args: Any, **kwargs: Any) -> Any:
        """``parse()`` (structured output): governed like ``create`` (its parsed response is one of create's)."""
        return _governed_call(*self._self_args, self.__wrapped__.parse, args, kwargs, False)

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        """The stream helpers: ``messages.stream()``'s events, and the openai helpers' stream, governed."""
        session, adapter, _ = self._self_args
        if not session.active:
            return self.__wrapped__.stream(*args, **kwargs)
        if adapter is _MESSAGES:
            request = session.governor.before(adapter, dict(kwargs))
            return _StreamManager(self.__wrapped__.stream(*args, **request.kwargs), session, request)
        # openai's chat.completions.stream() and responses.stream() open their stream with the resource's
        # create(stream=True): run the helper on this proxy, so that create is the governed one
        return type(self.__wrapped__).stream(self, *args, **kwargs)


class _BetaMessages(_Resource):
    """Anthropic's ``beta.messages``: governed as ``messages``; its tool runner refused while enforcing."""

    def tool_runner(self, *args: Any, **kwargs: Any) -> Any:
        session, _, _ = self._self_args
        if session.active and session.governor.mode == "enforce":
            raise ContractError(
                f"session {session.session_id}: beta.messages.tool_runner() runs the model's tool calls itself, "
                "ungated: call messages.create() and run the tools through session.tools"
            )
        return self.__wrapped__.tool_runner(*args, **kwargs)


class _Namespace(wrapt.ObjectProxy):
    """A client namespace holding one governed resource.

    OpenAI's ``client.chat`` (its ``completions``) and Anthropic's ``client.beta`` (its ``messages``).
    """

    def __init__(
        self, wrapped: Any, session: GovernedSession, aio: bool, name: str, resource: type[_Resource], adapter: Adapter
    ) -> None:
        super().__init__(wrapped)
        self._self_args = (session, aio, name, resource, adapter)

    def __getattr__(self, name: str) -> Any:
        session, aio, governed, resource, adapter = self._self_args
        value = getattr(self.__wrapped__, name)
        return resource(value, session, adapter, aio) if name == governed else value


class _OpenAIBeta(wrapt.ObjectProxy):
    """OpenAI's ``client.beta``, its ``chat.completions`` governed as ``client.chat.completions``.

    It is the very same resource, and the path of many examples to ``parse()``.
    """

    def __init__(self, wrapped: Any, session: GovernedSession, aio: bool) -> None:
        super().__init__(wrapped)
        self._self_args = (session, aio)

    def __getattr__(self, name: str) -> Any:
        session, aio = self._self_args
        value = getattr(self.__wrapped__, name)
        return _Namespace(value, session, aio, "completions", _Resource, _CHAT) if name == "chat" else value


class _Client(wrapt.ObjectProxy):
    """``session.client``."""

    def __init__(self, wrapped: Any, session: GovernedSession, provider: str, aio: bool) -> None:
        super().__init__(wrapped)
        self._self_args = (session, provider, aio)

    def __getattr__(self, name: str) -> Any:
        session, provider, aio = self._self_args
        value = getattr(self.__wrapped__, name)
        if provider == "openai":
            if name == "chat":
                return _Namespace(value, session, aio, "completions", _Resource, _CHAT)
            if name == "responses":
                return _Resource(value, session, _RESPONSES, aio)
            if name == "beta":
                return _OpenAIBeta(value, session, aio)
        elif name == "messages":
            return _Resource(value, session, _MESSAGES, aio)
        elif name == "beta":
            return _Namespace(value, session, aio, "messages", _BetaMessages, _MESSAGES)
        return value

    def __enter__(self) -> Any:
        # the client's own __enter__ returns the client itself: the ungoverned one; the caller gets the proxy
        self.__wrapped__.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Any:
        return self.__wrapped__.__exit__(exc_type, exc, tb)

    async def __aenter__(self) -> Any:
        await self.__wrapped__.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Any:
        return await self.__wrapped__.__aexit__(exc_type, exc, tb)

    def with_options(self, *args: Any, **kwargs: Any) -> Any:
        return self._copied(self.__wrapped__.with_options(*args, **kwargs))

    def copy(self, *args: Any, **kwargs: Any) -> Any:
        return self._copied(self.__wrapped__.copy(*args, **kwargs))

    def _copied(self, client: Any) -> Any:
        """A copy of the client, governed by the same session, its ungoverned paths watched as the original's."""
        session, provider, aio = self._self_args
        session.watch(client, aio)
        return _Client(client, session, provider, aio)


def governed_client(client: Any, session: GovernedSession, provider: str, aio: bool) -> Any:
    """``client`` governed by ``session`` (a proxy: ``isinstance`` and every other attribute are the client's)."""
    return _Client(client, session, provider, aio)
