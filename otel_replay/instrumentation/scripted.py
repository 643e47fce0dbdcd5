"""A local, scripted OpenAI- and Anthropic-compatible endpoint, for examples, tests and benchmarks.

``ScriptedServer`` listens on ``127.0.0.1`` (a free port) and answers each
request with the next scripted :class:`Reply` (or a fixed default), so an agent
built on the real ``openai`` / ``anthropic`` clients runs offline, with no key
and no network: ``OpenAI(base_url=server.base_url, api_key="test")``. Replies
are plain JSON bodies, server-sent-event streams, error statuses, or a stream
cut off mid-way. Every request's method, path and JSON body is kept in
``server.requests``.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

__all__ = [
    "Reply",
    "encode",
    "ScriptedServer",
    "anthropic_message",
    "anthropic_stream",
    "chat_completion",
    "chat_stream",
    "error",
    "response_object",
    "responses_call_stream",
    "responses_stream",
]


@dataclass(frozen=True)
class Reply:
    """One scripted answer: a JSON body, or a list of server-sent events, with a status."""

    status: int = 200
    body: Any = None
    events: Sequence[tuple[str | None, Any]] | None = None
    """``(event name or None, data)`` pairs; data is JSON-encoded unless it is a str."""
    cut_after: int | None = None
    """Close the connection after this many events, mid-stream (a broken stream)."""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


def _sse(events: Iterable[tuple[str | None, Any]]) -> bytes:
    out = []
    for name, data in events:
        text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
        out.append((f"event: {name}\n" if name else "") + f"data: {text}\n\n")
    return "".join(out).encode()


def encode(reply: Reply) -> tuple[bytes, str]:
    """A reply's full body and content type (for serving it through another transport)."""
    if reply.events is not None:
        return _sse(reply.events), "text/event-stream"
    return json.dumps(reply.body if reply.body is not None else {}).encode(), "application/json"


class ScriptedServer:
    """A threaded HTTP server on 127.0.0.1 answering with scripted replies; a context manager."""

    def __init__(self, replies: Iterable[Reply] = (), *, default: Reply | None = None, keep: bool = True) -> None:
        """Serve ``replies`` in order, then ``default`` (an HTTP 500 when none); ``keep=False`` keeps no requests."""
        self._queue: deque[Reply] = deque(replies)
        self._default = default
        self._keep = keep
        self._lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def enqueue(self, *replies: Reply) -> None:
        """Add replies to the script."""
        with self._lock:
            self._queue.extend(replies)

    def _next(self, record: dict[str, Any]) -> Reply:
        with self._lock:
            if self._keep:
                self.requests.append(record)
            if self._queue:
                return self._queue.popleft()
        return self._default or Reply(500, {"error": {"message": "script exhausted", "type": "server_error"}})

    @property
    def port(self) -> int:
        """The port listened on."""
        assert self._httpd is not None, "server not started"
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1`` (the OpenAI client's ``base_url``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root_url(self) -> str:
        """``http://127.0.0.1:<port>`` (the Anthropic client's ``base_url``)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ScriptedServer:
        """Start serving on a free port."""
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as separate writes

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                self._answer(None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                self._answer(body)

            def _answer(self, body: Any) -> None:
                reply = server._next(
                    {"method": self.command, "path": self.path, "headers": dict(self.headers), "json": body}
                )
                if reply.delay:
                    time.sleep(reply.delay)
                if reply.events is not None:
                    events = list(reply.events)
                    payload = _sse(events if reply.cut_after is None else events[: reply.cut_after])
                    declared = len(payload) if reply.cut_after is None else len(_sse(events))
                    kind = "text/event-stream"
                else:
                    payload = json.dumps(reply.body if reply.body is not None else {}).encode()
                    declared, kind = len(payload), "application/json"
                self.send_response(reply.status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(declared))
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                if reply.cut_after is not None:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(payload)
                self.wfile.flush()
                if reply.cut_after is not None:
                    self.close_connection = True

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="scripted-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# --- reply builders ---------------------------------------------------------------------------


def error(status: int, message: str = "scripted error", kind: str = "invalid_request_error") -> Reply:
    """An error status with an OpenAI/Anthropic-shaped error body."""
    return Reply(status, {"type": "error", "error": {"message": message, "type": kind}})


def _openai_tool_calls(tool_calls: Sequence[tuple[str, str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)},
        }
        for call_id, name, args in tool_calls
    ]


def chat_completion(
    content: str | None = "ok",
    *,
    model: str = "gpt-test",
    tool_calls: Sequence[tuple[str, str, Any]] = (),
    finish_reason: str | None = None,
    usage: tuple[int, int] = (11, 7),
    response_id: str = "chatcmpl-1",
) -> Reply:
    """A ``chat.completions`` JSON answer; ``tool_calls`` as ``(id, name, arguments)``."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = _openai_tool_calls(tool_calls)
    return Reply(
        200,
        {
            "id": response_id,
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
                }
            ],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
        },
    )


def chat_stream(
    parts: Sequence[str] = ("Hel", "lo"),
    *,
    model: str = "gpt-test",
    tool_calls: Sequence[tuple[str, str, Any]] = (),
    usage: tuple[int, int] | None = (11, 7),
    response_id: str = "chatcmpl-s1",
    cut_after: int | None = None,
) -> Reply:
    """A streamed ``chat.completions`` answer: content deltas, tool-call deltas, usage, ``[DONE]``."""

    def chunk(delta: dict[str, Any], finish: str | None = None, chunk_usage: Any = None) -> dict[str, Any]:
        return {
            "id": response_id,
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if delta is not None else [],
            "usage": chunk_usage,
        }

    events: list[tuple[str | None, Any]] = [(None, chunk({"role": "assistant", "content": ""}))]
    events += [(None, chunk({"content": part})) for part in parts]
    for index, (call_id, name, args) in enumerate(tool_calls):
        text = args if isinstance(args, str) else json.dumps(args)
        half = len(text) // 2
        first = {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
        events.append((None, chunk({"tool_calls": [first]})))
        for piece in (text[:half], text[half:]):
            events.append((None, chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})))
    events.append((None, chunk({}, "tool_calls" if tool_calls else "stop")))
    if usage is not None:
        totals = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
        events.append((None, {**chunk(None), "choices": [], "usage": totals}))  # type: ignore[arg-type]
    events.append((None, "[DONE]"))
    return Reply(200, events=events, cut_after=cut_after)


def response_object(
    text: str = "ok",
    *,
    model: str = "gpt-test",
    tool_calls: Sequence[tuple[str, str, Any]] = (),
    usage: tuple[int, int] = (13, 5),
    response_id: str = "resp_1",
    status: str = "completed",
) -> dict[str, Any]:
    """A ``responses`` API ``Response`` object."""
    output: list[dict[str, Any]] = []
    if text:
        output.append(
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    for call_id, name, args in tool_calls:
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{call_id}",
                "call_id": call_id,
                "name": name,
                "arguments": args if isinstance(args, str) else json.dumps(args),
                "status": "completed",
            }
        )
    return {
        "id": response_id,
        "object": "response",
        "created_at": 1_700_000_000,
        "model": model,
        "status": status,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": usage[0],
            "output_tokens": usage[1],
            "total_tokens": sum(usage),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def responses_stream(text: str = "ok", **kwargs: Any) -> Reply:
    """A streamed ``responses`` answer: created, a text delta, completed."""
    final = response_object(text, **kwargs)
    created = {**final, "status": "in_progress", "output": [], "usage": None}
    events: list[tuple[str | None, Any]] = [
        ("response.created", {"type": "response.created", "sequence_number": 0, "response": created}),
        (
            "response.output_text.delta",
            {
                "type": "response.output_text.delta",
                "sequence_number": 1,
                "item_id": "msg_1",
                "output_index": 0,
                "content_index": 0,
                "delta": text,
                "logprobs": [],
            },
        ),
        ("response.completed", {"type": "response.completed", "sequence_number": 2, "response": final}),
    ]
    return Reply(200, events=events)


def _anthropic_blocks(text: str | None, tool_uses: Sequence[tuple[str, str, Any]]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    blocks += [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in tool_uses]
    return blocks


def anthropic_message(
    text: str | None = "ok",
    *,
    model: str = "claude-test",
    tool_uses: Sequence[tuple[str, str, Any]] = (),
    usage: tuple[int, int] = (17, 9),
    message_id: str = "msg_a1",
) -> Reply:
    """An Anthropic ``messages`` JSON answer; ``tool_uses`` as ``(id, name, input dict)``."""
    return Reply(
        200,
        {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": _anthropic_blocks(text, tool_uses),
            "stop_reason": "tool_use" if tool_uses else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
        },
    )


def anthropic_stream(
    parts: Sequence[str] = ("Hel", "lo"),
    *,
    model: str = "claude-test",
    tool_uses: Sequence[tuple[str, str, Any]] = (),
    usage: tuple[int, int] = (17, 9),
    message_id: str = "msg_s1",
    cut_after: int | None = None,
) -> Reply:
    """A streamed Anthropic ``messages`` answer (message_start … message_stop)."""
    start: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": usage[0], "output_tokens": 1},
    }
    events: list[tuple[str | None, Any]] = [("message_start", {"type": "message_start", "message": start})]
    index = 0
    if parts:
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            )
        )
        for part in parts:
            delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": part}}
            events.append(("content_block_delta", delta))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
        index = 1
    for offset, (call_id, name, args) in enumerate(tool_uses):
        i = index + offset
        block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
        events.append(("content_block_start", {"type": "content_block_start", "index": i, "content_block": block}))
        text = json.dumps(args)
        delta = {"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": text}}
        events.append(("content_block_delta", delta))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    stop = "tool_use" if tool_uses else "end_turn"
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": usage[1]},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return Reply(200, events=events, cut_after=cut_after)


def responses_call_stream(
    text: str = "ok",
    *,
    tool_calls: Sequence[tuple[str, str, Any]] = (),
    model: str = "gpt-test",
    usage: tuple[int, int] = (13, 5),
    response_id: str = "resp_s1",
    cut_after: int | None = None,
) -> Reply:
    """A streamed ``responses`` answer with every item's events, then ``response.completed``.

    The text message (added, part, delta, done), then each function call (added, argument deltas in two
    halves, arguments done, item done).
    """
    final = response_object(text, model=model, tool_calls=tool_calls, usage=usage, response_id=response_id)
    created = {**final, "status": "in_progress", "output": [], "usage": None}
    events: list[tuple[str | None, Any]] = []

    def add(kind: str, **fields: Any) -> None:
        events.append((kind, {"type": kind, "sequence_number": len(events), **fields}))

    add("response.created", response=created)
    for index, item in enumerate(final["output"]):
        if item["type"] == "message":
            add("response.output_item.added", output_index=index, item={**item, "status": "in_progress", "content": []})
            part = {"type": "output_text", "text": "", "annotations": []}
            add("response.content_part.added", item_id=item["id"], output_index=index, content_index=0, part=part)
            add(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                delta=text,
                logprobs=[],
            )
            add(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=text,
                logprobs=[],
            )
            done_part = {**part, "text": text}
            add("response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=done_part)
        else:
            arguments = item["arguments"]
            add(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            half = len(arguments) // 2
            for piece in (arguments[:half], arguments[half:]):
                add("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=piece)
            add(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=arguments,
            )
        add("response.output_item.done", output_index=index, item=item)
    add("response.completed", response=final)
    return Reply(200, events=events, cut_after=cut_after)
