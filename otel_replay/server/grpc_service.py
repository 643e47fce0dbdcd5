"""OTLP/gRPC: ``opentelemetry.proto.collector.trace.v1.TraceService/Export`` and ``logs.v1.LogsService/Export``.

The logs service shares everything below with the trace service (admission,
inflation, bounds, status codes); its records are stored by ``accept_logs``.

Status codes follow the OTLP specification: ``OK`` (with ``partial_success``
when spans were dropped as invalid) only after the spans are durable,
``RESOURCE_EXHAUSTED`` with a ``google.rpc.RetryInfo`` in the status details
(and, for the Python SDK, a bare ``RetryInfo`` trailer) when shedding load,
``UNAVAILABLE`` while shutting down or when the WAL cannot be written (both
retryable), ``INVALID_ARGUMENT`` for a message that is not an
``ExportTraceServiceRequest``.

The method is registered with no request deserializer: the service gets the
message's bytes and charges them to the in-flight budget *before* decoding
them, so concurrent large requests are shed before they are decoded, not
after. The server is ``grpc.aio``: a call waiting for its message is a
coroutine, and takes one of the ``grpc_workers`` threads only once its whole
message has arrived and been admitted, so calls that never send theirs
neither pin the workers nor fill a concurrent-call cap (grpcio's answers
``RESOURCE_EXHAUSTED`` without ``RetryInfo``, which a Collector drops). Every
connection is still closed ``read_timeout_seconds`` after it has reached the
same age (``grpc.max_connection_age_ms`` + grace), which cancels its stuck calls.

grpc core does not inflate compressed messages (``grpc.per_message_decompression``
is off): it would inflate each one whole, up to ``max_request_bytes``, before
any budget applies (48 calls of 31 KiB took the server to 1.6 GiB). A gzip
message reaches the service as its compressed bytes and is inflated here step
by step, as on OTLP/HTTP, each step charged to the in-flight budget and the
inflation ratio checked as it goes. grpcio does not show the ``grpc-encoding``
header to the handler, and a client that asked for compression still sends a
message plain when compressing would not shrink it, so the bytes tell: gzip by
its magic ``1f 8b`` (a protobuf message never starts with ``0x1f``: wire type 7
does not exist), ``deflate`` (the Python SDK offers it) by a zlib header
(``78``, a multiple of 31 with the next byte). A real ``ExportTraceServiceRequest``
starts with ``0x0a`` (field 1); ``0x78`` would be an unknown field 15.
"""

from __future__ import annotations

import asyncio
import io
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import grpc.aio
from google.protobuf.any_pb2 import Any as AnyMessage
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import DecodeError
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)

from otel_replay.errors import ConfigError, OtelReplayError

from .admission import PROTOBUF_EXPANSION, Intake, Overloaded, Reservation, decode_charge, decode_limit_error
from .inflate import Reply, inflate_members
from .signals import LOGS, TRACES, Signal

__all__ = ["RETRY_INFO_KEY", "STATUS_DETAILS_KEY", "GrpcService", "retry_trailers"]

_log = logging.getLogger("otel_replay.server")
_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
_LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"
_GZIP_MAGIC = b"\x1f\x8b"


def _wbits(message: bytes | bytearray) -> int:
    """``zlib`` window bits to inflate ``message`` with: 31 for gzip, 15 for a zlib stream, 0 when it is plain."""
    if message[:2] == _GZIP_MAGIC:
        return 31
    if len(message) >= 2 and message[0] == 0x78 and (message[0] << 8 | message[1]) % 31 == 0:
        return 15
    return 0


STATUS_DETAILS_KEY = "grpc-status-details-bin"
"""The trailer gRPC clients read a rich status from (a ``google.rpc.Status``; grpc-go's ``status.Details()``)."""
RETRY_INFO_KEY = "google.rpc.retryinfo-bin"
"""A bare ``google.rpc.RetryInfo`` trailer: what the OpenTelemetry Python SDK's gRPC exporter reads."""


def retry_trailers(code: grpc.StatusCode, message: str, retry_after: int) -> tuple[tuple[str, bytes], ...]:
    """Trailing metadata telling a client to retry after ``retry_after`` seconds, in both places clients look.

    OTLP makes ``RESOURCE_EXHAUSTED`` retryable only "by returning a status
    containing RetryInfo": the Collector's ``otlp`` exporter looks for it in
    the status details (``grpc-status-details-bin``, a ``google.rpc.Status``
    whose ``code`` and ``message`` must match the call's, as grpcio-status's
    ``rpc_status.to_status`` builds it) and drops the batch without it; the
    Python SDK reads the bare ``RetryInfo`` trailer.
    """
    info = RetryInfo(retry_delay=Duration(seconds=retry_after))
    detail = AnyMessage()
    detail.Pack(info)
    status = Status(code=code.value[0], message=message, details=[detail])
    return ((STATUS_DETAILS_KEY, status.SerializeToString()), (RETRY_INFO_KEY, info.SerializeToString()))


class _Refused(Exception):
    """How a call ends when it is not ``OK``: raised in the worker thread or the handler, aborted in the handler."""

    def __init__(
        self, code: grpc.StatusCode, message: str, trailers: tuple[tuple[str, bytes], ...] = (), delay: float = 0.0
    ) -> None:
        super().__init__(message)
        self.code, self.message, self.trailers, self.delay = code, message, trailers, delay


class _TraceService:
    signal: Signal = TRACES

    def __init__(self, receiver: Intake, pool: ThreadPoolExecutor) -> None:
        self.receiver = receiver
        self.pool = pool
        self.request_type: Any = self.signal.request_type

    def _accept(self, request: Any) -> Any:
        """Store a decoded request; the response to send (with a partial success when some were dropped)."""
        return self.signal.reply(*self.signal.store(self.receiver, request))

    async def export(self, raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        """``TraceService/Export`` on the message's bytes: charge them, then decode and store them in a worker thread.

        The handler runs only once the whole message has arrived, as a
        coroutine: a call whose message never comes costs no thread.
        """
        box: list[bytes | bytearray] = [raw]
        del raw  # the worker thread drops the bytes once decoded
        try:
            return await self._export(box)
        except _Refused as refusal:
            if refusal.delay:  # a decompression bomb: nothing is held any more, and a waiting coroutine costs no thread
                await asyncio.sleep(refusal.delay)
            await context.abort(refusal.code, refusal.message, trailing_metadata=refusal.trailers)
            raise  # not reached: abort raises

    async def _export(self, box: list[bytes | bytearray]) -> Any:
        receiver = self.receiver
        try:
            wbits = _wbits(box[0])
            # A compressed message is charged its compressed bytes now and the rest as it is inflated (in the thread).
            charge = len(box[0]) if wbits else decode_charge(box[0], as_json=False)
            refused = decode_limit_error(charge, receiver.config.max_request_bytes)
            if refused:
                receiver.reject(too_large=True)
                raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
            admission = receiver.admit(charge)
            reservation = admission.__enter__()  # Overloaded: shed now, before the message waits for a thread
            try:
                work = self.pool.submit(self._store, box, reservation, wbits)
            except BaseException:
                admission.__exit__(None, None, None)
                raise
            # Released when the thread is done with the message, even if this call is cancelled meanwhile.
            work.add_done_callback(lambda _: admission.__exit__(None, None, None))
            return await asyncio.wrap_future(work)
        except Overloaded as exc:
            code = grpc.StatusCode.UNAVAILABLE if exc.unavailable else grpc.StatusCode.RESOURCE_EXHAUSTED
            raise _Refused(code, str(exc), retry_trailers(code, str(exc), exc.retry_after)) from None
        except (OSError, OtelReplayError) as exc:  # disk full, WAL closed at the end of a drain
            _log.error("otel-replay serve: WAL append failed: %s", exc)
            raise _Refused(grpc.StatusCode.UNAVAILABLE, f"cannot persist spans: {exc}") from None

    def _store(self, box: list[bytes | bytearray], reservation: Reservation, wbits: int) -> Any:
        """Decode and store (a worker thread); ``box`` holds the only reference to the message's bytes.

        A compressed message (``wbits`` not 0) is inflated first, charged to
        ``reservation`` as it grows.
        """
        receiver = self.receiver
        if wbits:
            box[0] = self._inflate(box[0], reservation, wbits)
        kind = self.request_type
        try:
            request = kind.FromString(box[0])
        except (DecodeError, RecursionError) as exc:
            receiver.reject()
            reason = " ".join(str(exc).split())[:300] or type(exc).__name__
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {kind.__name__}: {reason}") from None
        box.clear()  # the bytes are no longer needed: free them while the request is stored
        return self._accept(request)

    def _inflate(self, compressed: bytes | bytearray, reservation: Reservation, wbits: int) -> bytearray:
        """Inflate a gzip or zlib message with OTLP/HTTP's step-wise inflater, then charge what decoding it will take.

        Inflating past ``max_request_bytes`` is ``RESOURCE_EXHAUSTED`` (as
        grpc core answers a plain message over the limit); past
        ``max_inflate_ratio``, or not compressed after all, ``INVALID_ARGUMENT``: a
        bomb is never retried (the Collector drops ``RESOURCE_EXHAUSTED``
        without ``RetryInfo`` too, but the Python SDK retries it).
        """
        receiver = self.receiver
        config = receiver.config
        ratio, limit = config.max_inflate_ratio, config.max_request_bytes
        kind = "gzip" if wbits == 31 else "deflate"
        try:
            body = inflate_members(
                io.BytesIO(compressed).read1,
                len(compressed),
                limit,
                ratio,
                reservation,
                PROTOBUF_EXPANSION,
                wbits,
                what=f"{kind} message",
            )
        except Reply as reply:
            delay = config.bomb_delay_seconds if reply.bomb else 0.0
            too_large = reply.bomb and not reply.over_ratio
            receiver.reject(too_large=reply.bomb)
            code = grpc.StatusCode.RESOURCE_EXHAUSTED if too_large else grpc.StatusCode.INVALID_ARGUMENT
            raise _Refused(code, f"{kind} message: {reply}", delay=delay) from None
        if body is None:  # cannot happen: every byte is in memory
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "compressed message: truncated")
        charge = decode_charge(body, as_json=False)
        refused = decode_limit_error(charge, limit)
        if refused:
            receiver.reject(too_large=True)
            raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
        reservation.grow(max(0, charge - reservation.held))
        return body  # no copy: protobuf parses a bytearray


class _LogsService(_TraceService):
    """``LogsService/Export``: the same admission, inflation and bounds; records go to ``accept_logs``."""

    signal: Signal = LOGS


class GrpcService:
    """A ``grpc.aio`` server bound to ``host:port`` (port 0 picks a free one; see :attr:`address`).

    Its event loop runs in a thread of its own; decoding and storing run in
    a pool of ``grpc_workers`` threads, so a call costs a thread only once its
    whole message has arrived and been admitted.
    """

    def __init__(self, receiver: Intake, host: str, port: int) -> None:
        """Bind and start serving."""
        config = receiver.config
        # A call waiting for its message is a coroutine, not a thread; still, each connection is told to go away
        # (GOAWAY) at read_timeout_seconds of age and closed, cancelling what is still open on it,
        # read_timeout_seconds later: an idle or stuck call lives at most about twice the read timeout.
        # No concurrent-call cap: grpcio's answers RESOURCE_EXHAUSTED without RetryInfo, which the Collector
        # treats as permanent (it drops the batch). Nor a per-connection stream cap (HTTP/2
        # SETTINGS_MAX_CONCURRENT_STREAMS): grpcio clients send past it before the settings arrive and get
        # REFUSED_STREAM (UNAVAILABLE), 306 of 1,000 calls from 4 threads on one channel. grpc core buffers a
        # call's message before admission sees it, so messages still arriving are outside the budget (README).
        timeout_ms = max(1, round(config.read_timeout_seconds * 1000))
        options = [
            ("grpc.max_receive_message_length", config.max_request_bytes),
            ("grpc.so_reuseport", 0),
            ("grpc.max_connection_age_ms", timeout_ms),
            ("grpc.max_connection_age_grace_ms", timeout_ms),
            # Hand gzip and deflate messages over compressed: _TraceService inflates them within the budget.
            ("grpc.per_message_decompression", 0),
        ]
        self._pool = ThreadPoolExecutor(config.grpc_workers, thread_name_prefix="otel-replay-grpc")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="otel-replay-grpc-loop", daemon=True)
        self._thread.start()
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = asyncio.run_coroutine_threadsafe(
                self._start(_TraceService(receiver, self._pool), options, target), self._loop
            ).result()
        except BaseException:
            self._close_loop()
            raise
        self.address = (host, bound)

    async def _start(self, service: _TraceService, options: list[tuple[str, Any]], target: str) -> int:
        self.server = grpc.aio.server(options=options)
        export = grpc.unary_unary_rpc_method_handler(
            service.export,
            request_deserializer=None,  # the raw bytes: charged to the budget before they are decoded
            response_serializer=ExportTraceServiceResponse.SerializeToString,
        )
        logs = _LogsService(service.receiver, service.pool)
        export_logs = grpc.unary_unary_rpc_method_handler(
            logs.export, request_deserializer=None, response_serializer=ExportLogsServiceResponse.SerializeToString
        )
        self.server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(_SERVICE, {"Export": export}),
                grpc.method_handlers_generic_handler(_LOGS_SERVICE, {"Export": export_logs}),
            )
        )
        try:
            bound = self.server.add_insecure_port(target)
        except RuntimeError as exc:
            raise ConfigError(f"cannot listen for gRPC on {target}: {exc}") from None
        if not bound:
            raise ConfigError(f"cannot listen for gRPC on {target} (address in use?)")
        await self.server.start()
        return bound

    def stop(self, grace: float) -> None:
        """Stop accepting RPCs and wait up to ``grace`` seconds for in-flight ones."""
        try:
            asyncio.run_coroutine_threadsafe(self.server.stop(grace), self._loop).result()
        finally:
            self._pool.shutdown(wait=True)  # a message already admitted is stored (or refused) before the WAL closes
            self._close_loop()

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
