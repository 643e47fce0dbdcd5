"""OTLP/HTTP: ``POST /v1/traces`` plus ``GET /healthz`` and ``GET /metrics``.

Bodies are ``application/x-protobuf`` or ``application/json`` (OTLP/JSON),
optionally ``Content-Encoding: gzip``. Responses use the request's content
type: an ``ExportTraceServiceResponse`` (with ``partialSuccess`` when spans
were dropped) on 200, a ``google.rpc.Status`` otherwise. Codes: 400 malformed
body or truncated gzip, 411 no Content-Length, 413 body over the limit, 415
unsupported content type or encoding, 429 shedding load and 503 shutting down
(both with ``Retry-After``), 404 other paths.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError, Message
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from otel_replay.errors import ConfigError, OtelReplayError

from .otlp_json import PayloadError, message_to_json, request_from_json
from .server import Overloaded

if TYPE_CHECKING:
    from .server import Receiver

__all__ = ["HttpService"]

_log = logging.getLogger("otel_replay.server")
_PROTOBUF = "application/x-protobuf"
_JSON = "application/json"
_GRPC_CODES = {400: 3, 404: 5, 411: 3, 413: 8, 415: 3, 429: 8, 503: 14}


class _Reply(Exception):
    """Finish the request with an error status."""

    def __init__(self, status: int, message: str, *, close: bool = False, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.close = close
        self.retry_after = retry_after


def _gunzip(body: bytes, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits=31)
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise _Reply(400, f"invalid gzip body: {exc}") from None
    if len(data) > limit:
        raise _Reply(413, f"decompressed body exceeds {limit} bytes")
    if not inflater.eof:
        raise _Reply(400, "truncated gzip body")
    return data


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "otel-replay"
    timeout = 30
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        _log.debug("http %s - %s", self.address_string(), format % args)

    def _send(
        self, status: int, body: bytes, ctype: str, *, close: bool = False, retry_after: int | None = None
    ) -> None:
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

    def _send_message(self, status: int, message: Message, as_json: bool, **kw: object) -> None:
        if as_json:
            self._send(status, message_to_json(message), _JSON, **kw)  # type: ignore[arg-type]
        else:
            self._send(status, message.SerializeToString(), _PROTOBUF, **kw)  # type: ignore[arg-type]

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        receiver = self.server.receiver
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            draining = receiver._draining
            body = json.dumps({"status": "draining" if draining else "ok", "metrics": receiver.metrics_line()})
            self._send(503 if draining else 200, body.encode(), _JSON)
        elif path == "/metrics":
            self._send(200, receiver.metrics_text().encode(), "text/plain; version=0.0.4")
        else:
            self._send(404, b"not found\n", "text/plain")

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        service = self.server.service
        with service.active_lock:
            service.active += 1
        try:
            self._export()
        finally:
            with service.active_lock:
                service.active -= 1
                service.active_lock.notify_all()

    def _export(self) -> None:
        receiver = self.server.receiver
        ctype = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        as_json = ctype == _JSON
        try:
            if self.path.split("?", 1)[0] != "/v1/traces":
                raise _Reply(404, f"no such endpoint {self.path}; OTLP traces go to /v1/traces", close=True)
            if ctype not in (_PROTOBUF, _JSON):
                raise _Reply(415, f"unsupported content type {ctype!r}; use {_PROTOBUF} or {_JSON}", close=True)
            encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
            if encoding not in ("identity", "gzip"):
                raise _Reply(415, f"unsupported content encoding {encoding!r}; use gzip or none", close=True)
            raw_length = self.headers.get("Content-Length")
            if raw_length is None:
                raise _Reply(411, "Content-Length is required", close=True)
            if not raw_length.strip().isdigit():
                raise _Reply(400, f"bad Content-Length {raw_length!r}", close=True)
            length = int(raw_length)
            limit = receiver.config.max_request_bytes
            if length > limit:
                raise _Reply(413, f"body of {length} bytes exceeds the {limit} byte limit", close=True)
            try:
                with receiver.admit(length):
                    body = self.rfile.read(length)
                    if len(body) < length:
                        self.close_connection = True  # the client went away mid-body: nothing stored
                        receiver.reject()
                        return
                    response = self._store(body, encoding == "gzip", as_json, limit)
            except Overloaded as exc:
                status = 503 if exc.unavailable else 429
                raise _Reply(status, str(exc), close=True, retry_after=exc.retry_after) from None
            self._send_message(200, response, as_json)
        except _Reply as reply:
            if reply.status in (400, 413):
                receiver.reject()
            status = Status(code=_GRPC_CODES.get(reply.status, 2), message=str(reply))
            self._send_message(reply.status, status, as_json, close=reply.close, retry_after=reply.retry_after)
        except (ConnectionError, TimeoutError):
            self.close_connection = True
        except (OSError, OtelReplayError) as exc:  # disk full, WAL closed at the end of a drain
            _log.error("otel-replay serve: WAL append failed: %s", exc)
            status = Status(code=14, message=f"cannot persist spans: {exc}")
            self._send_message(503, status, as_json, close=True, retry_after=receiver.config.retry_after_seconds)

    def _store(self, body: bytes, gzipped: bool, as_json: bool, limit: int) -> ExportTraceServiceResponse:
        if gzipped:
            inflated = _gunzip(body, limit)
            # The in-flight budget covers what is held in memory: reserve the inflated size too.
            with self.server.receiver.admit(max(0, len(inflated) - len(body))):
                return self._parse_and_accept(inflated, as_json)
        return self._parse_and_accept(body, as_json)

    def _parse_and_accept(self, body: bytes, as_json: bool) -> ExportTraceServiceResponse:
        try:
            if as_json:
                request = request_from_json(body)
            else:
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
        except (DecodeError, PayloadError) as exc:
            kind = "OTLP/JSON" if as_json else "protobuf"
            raise _Reply(400, f"malformed {kind} ExportTraceServiceRequest: {exc}") from None
        rejected, message = self.server.receiver.accept(request)
        if rejected:
            return ExportTraceServiceResponse(
                partial_success=ExportTracePartialSuccess(rejected_spans=rejected, error_message=message)
            )
        return ExportTraceServiceResponse()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    receiver: Receiver
    service: HttpService


class _Server6(_Server):
    address_family = socket.AF_INET6


class HttpService:
    """A threading HTTP server bound to ``host:port`` (port 0 picks a free one; see :attr:`address`)."""

    def __init__(self, receiver: Receiver, host: str, port: int) -> None:
        """Bind and start serving in a background thread."""
        server_cls = _Server6 if ":" in host else _Server
        try:
            self.httpd = server_cls((host, port), _Handler)
        except OSError as exc:
            raise ConfigError(f"cannot listen for HTTP on {host}:{port}: {exc.strerror or exc}") from None
        self.httpd.receiver = receiver
        self.httpd.service = self
        self.active = 0
        self.active_lock = threading.Condition()
        self.address = (host, self.httpd.server_address[1])
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="otel-replay-http", daemon=True)
        self._thread.start()

    def stop(self, grace: float) -> None:
        """Stop accepting connections and wait up to ``grace`` seconds for requests in progress."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join()
        with self.active_lock:
            self.active_lock.wait_for(lambda: self.active == 0, timeout=grace)
