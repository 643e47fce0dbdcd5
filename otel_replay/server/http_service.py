"""OTLP/HTTP: ``POST /v1/traces`` and ``POST /v1/logs`` plus ``GET /healthz`` and ``GET /metrics``.

``/v1/logs`` takes an ``ExportLogsServiceRequest`` under the same rules,
limits and replies as traces (an ``ExportLogsServiceResponse``, with
``partialSuccess.rejectedLogRecords`` when records were dropped).

Bodies are ``application/x-protobuf`` or ``application/json`` (OTLP/JSON),
optionally ``Content-Encoding: gzip`` (every gzip member is read). Responses
use the request's content type: an ``ExportTraceServiceResponse`` (with
``partialSuccess`` when spans were dropped) on 200, a ``google.rpc.Status``
otherwise. Codes: 400 malformed body or gzip, 411 no Content-Length, 413 body
(or its inflated form, or its inflation ratio) over the limit, 415 unsupported
content type or encoding, 429 shedding load and 503 shutting down or at the
connection cap (both with ``Retry-After``), 404 other paths, 431 (and close)
request line and headers over ``MAX_HEADER_BYTES``. A ``Content-Length`` that
is not ASCII digits, or given twice with different values, or a
``Transfer-Encoding`` is a 400 (411 without a length) and closes the
connection: the body's end would be ambiguous.

Hostile clients: the in-flight budget is charged with the bytes actually read
(and inflated, and decoded), never the declared ``Content-Length``; each
request, from its first byte to its last, must arrive within
``read_timeout_seconds`` (slow and idle connections are closed and counted);
at most ``max_connections`` connections are served at once, and each holds
at most ``MAX_HEADER_BYTES`` of request head plus one read buffer before its
body is charged.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import selectors
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.message import DecodeError, Message
from google.rpc import code_pb2
from google.rpc.status_pb2 import Status

from otel_replay.errors import ConfigError, OtelReplayError, PayloadError

from .admission import (
    JSON_EXPANSION,
    PROTOBUF_EXPANSION,
    Intake,
    Overloaded,
    Reservation,
    decode_charge,
    decode_limit_error,
)
from .inflate import CHUNK, Reply, inflate_members
from .otlp_json import message_to_json
from .signals import LOGS, TRACES

__all__ = ["HttpService"]

_log = logging.getLogger("otel_replay.server")
_PROTOBUF = "application/x-protobuf"
_JSON = "application/json"
_PATHS = ("/v1/traces", "/v1/logs")
_GRPC_CODES = {
    400: code_pb2.INVALID_ARGUMENT,
    404: code_pb2.NOT_FOUND,
    411: code_pb2.INVALID_ARGUMENT,
    413: code_pb2.RESOURCE_EXHAUSTED,
    415: code_pb2.INVALID_ARGUMENT,
    429: code_pb2.RESOURCE_EXHAUSTED,
    503: code_pb2.UNAVAILABLE,
}
MAX_HEADER_BYTES = 64 * 1024
"""Request line plus headers, per request; more is a 431 (the stdlib alone allows 100 lines of 64 KiB)."""
_DIGITS = re.compile(r"[0-9]+")
_WRITE_TIMEOUT = 10.0
_LINGER_SECONDS = 1.0
_LINGER_BYTES = 2 * 1024 * 1024


class _DeadlineReader(io.RawIOBase):
    """The connection's socket as a raw stream whose reads fail once the request's deadline has passed."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.sock = sock
        self.deadline = float("inf")
        self.received = 0
        self.timed_out = False

    def start(self, seconds: float) -> None:
        """Begin a request: it must arrive whole within ``seconds``."""
        self.deadline = time.monotonic() + seconds
        self.received = 0
        self.timed_out = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            self.timed_out = True
            raise TimeoutError("request not received within the read timeout")
        self.sock.settimeout(remaining)
        try:
            n = self.sock.recv_into(buffer)
        except TimeoutError:
            self.timed_out = True
            raise
        self.received += n
        return n


class _HeadTooLarge(Exception):
    """The request line and headers went past :data:`MAX_HEADER_BYTES`."""


class _HeadReader(io.BufferedReader):
    """The buffered socket stream; while ``head_left`` is set, lines read from it (the head) count against it."""

    head_left: int | None = None

    def readline(self, size: int | None = -1) -> bytes:
        left = self.head_left
        if left is None:
            return super().readline(size)
        if left <= 0:
            raise _HeadTooLarge(f"request line and headers exceed {MAX_HEADER_BYTES} bytes")
        cap = left + 1 if size is None or size < 0 else min(size, left + 1)
        line = super().readline(cap)
        self.head_left = left - len(line)
        if self.head_left < 0:
            raise _HeadTooLarge(f"request line and headers exceed {MAX_HEADER_BYTES} bytes")
        return line


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "otel-replay"
    timeout = None  # the deadline reader bounds every read
    server: _Server
    reader: _DeadlineReader
    rfile: _HeadReader

    def setup(self) -> None:
        super().setup()
        self.reader = _DeadlineReader(self.connection)
        self.rfile = _HeadReader(self.reader, CHUNK)
        self.storing = False
        self.server.register(self)

    def finish(self) -> None:
        self.server.unregister(self)
        try:
            super().finish()
        except OSError:  # the client is gone; nothing to flush to
            pass

    def handle_one_request(self) -> None:
        self.reader.start(self.server.receiver.config.read_timeout_seconds)
        self.rfile.head_left = MAX_HEADER_BYTES
        self.command, self.requestline, self.request_version = "", "", ""  # an error before parse_request: HTTP/1.x
        try:
            super().handle_one_request()
        except _HeadTooLarge as exc:
            self.server.receiver.reject()
            self.send_error(431, "Request Header Fields Too Large", str(exc))  # sends Connection: close
            self.close_connection = True
            self._linger()
        finally:
            self.rfile.head_left = None
            if self.reader.timed_out:
                self.close_connection = True
                if self.reader.received:  # a slow client, not an idle keep-alive connection
                    self.server.receiver.metrics.add(connections_timed_out=1)

    def parse_request(self) -> bool:
        try:
            return super().parse_request()
        finally:
            self.rfile.head_left = None  # the head is read; the body is charged to the in-flight budget

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        _log.debug("http %s - %s", self.address_string(), format % args)

    def _send(
        self, status: int, body: bytes, ctype: str, *, close: bool = False, retry_after: int | None = None
    ) -> None:
        self.connection.settimeout(_WRITE_TIMEOUT)
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if retry_after is not None:
            self.send_header("Retry-After", str(retry_after))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def _send_message(self, status: int, message: Message, as_json: bool, **kw: Any) -> None:
        if as_json:
            self._send(status, message_to_json(message), _JSON, **kw)
        else:
            self._send(status, message.SerializeToString(), _PROTOBUF, **kw)

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        receiver = self.server.receiver
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            status = "draining" if receiver.draining else "ok" if receiver.wal.writable else "wal-unwritable"
            body = json.dumps({"status": status, "metrics": receiver.metrics_line()})
            self._send(200 if status == "ok" else 503, body.encode(), _JSON)
        elif path == "/metrics":
            self._send(200, receiver.metrics_text().encode(), "text/plain; version=0.0.4")
        else:
            self._send(404, b"not found\n", "text/plain")

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        receiver = self.server.receiver
        ctype = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        as_json = ctype == _JSON
        self.body_read = False
        self.stored = False  # set once the request's spans are in the WAL: what fails after that is no refusal
        try:
            self._export(ctype)
        except Reply as reply:
            if reply.status in (400, 413):
                receiver.reject(too_large=reply.status == 413)
            status = Status(code=_GRPC_CODES.get(reply.status, code_pb2.UNKNOWN), message=str(reply))
            if reply.bomb:  # nothing is held any more; slowing the sender down keeps it from eating the CPU
                time.sleep(receiver.config.bomb_delay_seconds)
            close = reply.close or not self.body_read  # unread body bytes must not become the next request
            self._send_message(reply.status, status, as_json, close=close, retry_after=reply.retry_after)
            if not self.body_read:
                self._linger()
        except (ConnectionError, TimeoutError):
            self.close_connection = True  # the client went away or stalled
            if not self.stored:  # nothing was stored: a refused request (else only the reply was lost)
                receiver.reject()
        except (OSError, OtelReplayError) as exc:  # disk full, WAL closed at the end of a drain
            _log.error("otel-replay serve: WAL append failed: %s", exc)
            status = Status(code=code_pb2.UNAVAILABLE, message=f"cannot persist spans: {exc}")
            self._send_message(503, status, as_json, close=True, retry_after=receiver.config.retry_after_seconds)

    def _linger(self) -> None:
        """Half-close and discard what the client is still sending (bounded), so it reads our reply, not a reset."""
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            self.reader.start(_LINGER_SECONDS)
            budget = _LINGER_BYTES
            while budget > 0:
                chunk = self.rfile.read1(CHUNK)
                if not chunk:
                    break
                budget -= len(chunk)
        except OSError:
            pass
        self.reader.timed_out = False

    def _export(self, ctype: str) -> None:
        receiver = self.server.receiver
        config = receiver.config
        if self.path.split("?", 1)[0] not in _PATHS:
            shown = self.path[:200].encode("ascii", "backslashreplace").decode()
            raise Reply(404, f"no such endpoint {shown}; OTLP traces go to /v1/traces, logs to /v1/logs", close=True)
        if ctype not in (_PROTOBUF, _JSON):
            raise Reply(415, f"unsupported content type {ctype!r}; use {_PROTOBUF} or {_JSON}", close=True)
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding not in ("identity", "gzip"):
            raise Reply(415, f"unsupported content encoding {encoding!r}; use gzip or none", close=True)
        length = self._content_length()
        limit = config.max_request_bytes
        if length > limit:
            raise Reply(413, f"body of {length} bytes exceeds the {limit} byte limit", close=True)
        as_json = ctype == _JSON
        try:
            with receiver.admit() as reservation:
                factor = JSON_EXPANSION if as_json else PROTOBUF_EXPANSION
                if encoding == "gzip":
                    ratio = config.max_inflate_ratio
                    body = inflate_members(self.rfile.read1, length, limit, ratio, reservation, factor)
                else:
                    body = self._read_plain(length, reservation, factor)
                if body is None:
                    self.close_connection = True  # the client went away mid-body: nothing stored
                    receiver.reject()
                    return
                self.body_read = True
                charge = decode_charge(body, as_json)
                refused = decode_limit_error(charge, limit)
                if refused:
                    raise Reply(413, refused)
                reservation.grow(max(0, charge - reservation.held))
                self.storing = True
                try:
                    response = self._parse_and_accept(body, as_json)
                    self.stored = True
                finally:
                    self.storing = False
        except Overloaded as exc:
            status = 503 if exc.unavailable else 429
            raise Reply(status, str(exc), close=True, retry_after=exc.retry_after) from None
        self._send_message(200, response, as_json)

    def _content_length(self) -> int:
        """The body's length, refusing anything that could make its end ambiguous (request smuggling)."""
        values = {v.strip() for v in self.headers.get_all("Content-Length") or ()}
        if self.headers.get("Transfer-Encoding") is not None:
            status = 400 if values else 411
            raise Reply(status, "Transfer-Encoding is not supported; send the body with a Content-Length", close=True)
        if not values:
            raise Reply(411, "Content-Length is required", close=True)
        if len(values) > 1:
            shown = ", ".join(sorted(repr(v[:20]) for v in values))
            raise Reply(400, f"conflicting Content-Length headers ({shown})", close=True)
        (raw,) = values
        if not _DIGITS.fullmatch(raw):
            raise Reply(400, f"bad Content-Length {raw[:40]!r} (ASCII digits expected)", close=True)
        return int(raw)

    def _read_plain(self, length: int, reservation: Reservation, factor: int) -> bytearray | None:
        """Read the body step by step, charging ``factor`` x the bytes that arrived (never the declared length)."""
        body = bytearray()
        while len(body) < length:
            chunk = self.rfile.read1(min(CHUNK, length - len(body)))
            if not chunk:
                return None
            reservation.grow(factor * len(chunk))
            body += chunk
        return body

    def _parse_and_accept(self, body: bytearray, as_json: bool) -> Message:
        """Parse the body as the path's signal (traces or logs), store it, and give the response to send."""
        signal = LOGS if self.path.split("?", 1)[0] == "/v1/logs" else TRACES
        try:
            if as_json:
                request = signal.from_json(bytes(body))
            else:
                request = signal.request_type()
                request.ParseFromString(body)
        except (DecodeError, PayloadError) as exc:
            kind = "OTLP/JSON" if as_json else "protobuf"
            reason = " ".join(str(exc).split())[:300]
            raise Reply(400, f"malformed {kind} {signal.name}: {reason}") from None
        except RecursionError:
            raise Reply(400, f"malformed {signal.name}: nested too deeply") from None
        del body[:]
        rejected, message = signal.store(self.server.receiver, request)
        return signal.reply(rejected, message)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    receiver: Intake
    service: HttpService

    def server_activate(self) -> None:
        super().server_activate()
        self.handlers: set[_Handler] = set()
        self.connections = 0
        self.lock = threading.Lock()

    def register(self, handler: _Handler) -> None:
        with self.lock:
            self.handlers.add(handler)

    def unregister(self, handler: _Handler) -> None:
        with self.lock:
            self.handlers.discard(handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.lock:
            refuse = self.connections >= self.receiver.config.max_connections
            if not refuse:
                self.connections += 1
        if refuse:
            self.receiver.metrics.add(connections_refused=1)
            _refuse(request, self.receiver.config.retry_after_seconds)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            with self.lock:
                self.connections -= 1
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.lock:
                self.connections -= 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One log line per failed connection; a client hanging up is routine (debug), never a traceback."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            _log.debug("http %s: client went away: %s", client_address[0], exc)
        else:
            name = type(exc).__name__
            _log.error("otel-replay serve: http connection from %s failed: %s: %s", client_address[0], name, exc)


class _Server6(_Server):
    address_family = socket.AF_INET6


def _refuse(sock: socket.socket, retry_after: int) -> None:
    body = b"too many connections; retry later\n"
    head = (
        f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
        f"Retry-After: {retry_after}\r\nConnection: close\r\n\r\n"
    )
    try:
        sock.setblocking(False)
        sock.send(head.encode() + body)
    except OSError:
        pass


class HttpService:
    """A threading HTTP server bound to ``host:port`` (port 0 picks a free one; see :attr:`address`)."""

    def __init__(self, receiver: Intake, host: str, port: int) -> None:
        """Bind and start serving in a background thread."""
        server_cls = _Server6 if ":" in host else _Server
        try:
            self.httpd = server_cls((host, port), _Handler)
        except OSError as exc:
            raise ConfigError(f"cannot listen for HTTP on {host}:{port}: {exc.strerror or exc}") from None
        self.httpd.receiver = receiver
        self.httpd.service = self
        self.address = (host, self.httpd.server_address[1])
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="otel-replay-http", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        """Accept connections until :meth:`stop` writes to the wake pipe (no polling interval)."""
        self.httpd.timeout = 0.5  # handle_request's own wait, after the selector said a connection is ready
        with selectors.DefaultSelector() as selector:
            selector.register(self.httpd, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while not self._stopping:
                for key, _ in selector.select():
                    if key.fileobj is self.httpd and not self._stopping:
                        self.httpd.handle_request()

    def stop(self, grace: float) -> None:
        """Stop accepting, close connections not storing a request, wait up to ``grace`` s for the rest."""
        self._stopping = True
        os.write(self._wake_w, b"x")
        self._thread.join()
        self.httpd.server_close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._close_connections(storing=False)
        end = time.monotonic() + grace
        while time.monotonic() < end:
            with self.httpd.lock:
                if not any(h.storing for h in self.httpd.handlers):
                    break
            time.sleep(0.01)
        self._close_connections(storing=True)

    def _close_connections(self, *, storing: bool) -> None:
        with self.httpd.lock:
            handlers = [h for h in self.httpd.handlers if storing or not h.storing]
        for handler in handlers:
            try:
                handler.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
