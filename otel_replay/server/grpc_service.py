"""OTLP/gRPC: ``opentelemetry.proto.collector.trace.v1.TraceService/Export``.

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
after. A call whose message never comes cannot pin a worker thread for ever:
every connection is closed ``read_timeout_seconds`` after it has reached the
same age (``grpc.max_connection_age_ms`` + grace), which cancels its stuck
calls and frees their threads.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import grpc
from google.protobuf.any_pb2 import Any
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import DecodeError
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from otel_replay.errors import ConfigError, OtelReplayError

from .server import Overloaded, decode_charge, decode_limit_error

if TYPE_CHECKING:
    from .server import Receiver

__all__ = ["RETRY_INFO_KEY", "STATUS_DETAILS_KEY", "GrpcService", "retry_trailers"]

_log = logging.getLogger("otel_replay.server")
_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


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
    detail = Any()
    detail.Pack(info)
    status = Status(code=code.value[0], message=message, details=[detail])
    return ((STATUS_DETAILS_KEY, status.SerializeToString()), (RETRY_INFO_KEY, info.SerializeToString()))


class _TraceService:
    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    def export(self, raw: bytes, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        """``TraceService/Export`` on the message's bytes: charge them, then decode, then store."""
        receiver = self.receiver
        try:
            charge = decode_charge(raw, as_json=False)
            refused = decode_limit_error(charge, receiver.config.max_request_bytes)
            if refused:
                receiver.reject(too_large=True)
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
            with receiver.admit(charge):
                try:
                    request = ExportTraceServiceRequest.FromString(raw)
                except (DecodeError, RecursionError) as exc:
                    receiver.reject()
                    reason = " ".join(str(exc).split())[:300] or type(exc).__name__
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed ExportTraceServiceRequest: {reason}")
                del raw
                rejected, message = receiver.accept(request)
        except Overloaded as exc:
            code = grpc.StatusCode.UNAVAILABLE if exc.unavailable else grpc.StatusCode.RESOURCE_EXHAUSTED
            context.set_trailing_metadata(retry_trailers(code, str(exc), exc.retry_after))
            context.abort(code, str(exc))
        except (OSError, OtelReplayError) as exc:  # disk full, WAL closed at the end of a drain
            _log.error("otel-replay serve: WAL append failed: %s", exc)
            context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot persist spans: {exc}")
        if rejected:
            partial = ExportTracePartialSuccess(rejected_spans=rejected, error_message=message)
            return ExportTraceServiceResponse(partial_success=partial)
        return ExportTraceServiceResponse()


class GrpcService:
    """A grpcio server bound to ``host:port`` (port 0 picks a free one; see :attr:`address`)."""

    def __init__(self, receiver: Receiver, host: str, port: int) -> None:
        """Bind and start serving."""
        config = receiver.config
        # A call takes a worker thread before its message arrives; a client that never sends it would hold the
        # thread for ever. Each connection is told to go away (GOAWAY) at read_timeout_seconds of age and closed,
        # cancelling what is still open on it, read_timeout_seconds later: an idle or stuck call lives at most
        # about twice the read timeout, while a call in flight at GOAWAY gets the read timeout to finish.
        timeout_ms = max(1, round(config.read_timeout_seconds * 1000))
        options = [
            ("grpc.max_receive_message_length", config.max_request_bytes),
            ("grpc.so_reuseport", 0),
            ("grpc.max_connection_age_ms", timeout_ms),
            ("grpc.max_connection_age_grace_ms", timeout_ms),
        ]
        self._pool = ThreadPoolExecutor(config.grpc_workers, thread_name_prefix="otel-replay-grpc")
        self.server = grpc.server(self._pool, options=options, maximum_concurrent_rpcs=config.grpc_workers * 8)
        export = grpc.unary_unary_rpc_method_handler(
            _TraceService(receiver).export,
            request_deserializer=None,  # the raw bytes: charged to the budget before they are decoded
            response_serializer=ExportTraceServiceResponse.SerializeToString,
        )
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, {"Export": export}),))
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = self.server.add_insecure_port(target)
        except RuntimeError as exc:
            raise ConfigError(f"cannot listen for gRPC on {target}: {exc}") from None
        if not bound:
            raise ConfigError(f"cannot listen for gRPC on {target} (address in use?)")
        self.address = (host, bound)
        self.server.start()

    def stop(self, grace: float) -> None:
        """Stop accepting RPCs and wait up to ``grace`` seconds for in-flight ones."""
        self.server.stop(grace).wait()
        self._pool.shutdown(wait=True)
