"""OTLP/gRPC: ``opentelemetry.proto.collector.trace.v1.TraceService/Export``.

Status codes follow the OTLP specification: ``OK`` (with ``partial_success``
when spans were dropped as invalid) only after the spans are durable,
``RESOURCE_EXHAUSTED`` with a ``google.rpc.RetryInfo`` when shedding load,
``UNAVAILABLE`` while shutting down or when the WAL cannot be written (both
retryable). A message grpcio cannot decode is answered by grpcio itself with
``INTERNAL`` before it reaches this service.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import grpc
from google.protobuf.duration_pb2 import Duration
from google.rpc.error_details_pb2 import RetryInfo
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from otel_replay.errors import ConfigError, OtelReplayError

from .server import PROTOBUF_EXPANSION, Overloaded

if TYPE_CHECKING:
    from .server import Receiver

__all__ = ["GrpcService"]

_log = logging.getLogger("otel_replay.server")


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    def Export(  # noqa: N802 - the generated servicer's method name
        self, request: ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> ExportTraceServiceResponse:
        receiver = self.receiver
        try:
            with receiver.admit(PROTOBUF_EXPANSION * request.ByteSize()):
                rejected, message = receiver.accept(request)
        except Overloaded as exc:
            delay = RetryInfo(retry_delay=Duration(seconds=exc.retry_after))
            context.set_trailing_metadata((("google.rpc.retryinfo-bin", delay.SerializeToString()),))
            code = grpc.StatusCode.UNAVAILABLE if exc.unavailable else grpc.StatusCode.RESOURCE_EXHAUSTED
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
        options = [
            ("grpc.max_receive_message_length", config.max_request_bytes),
            ("grpc.so_reuseport", 0),
        ]
        self._pool = ThreadPoolExecutor(config.grpc_workers, thread_name_prefix="otel-replay-grpc")
        self.server = grpc.server(self._pool, options=options, maximum_concurrent_rpcs=config.grpc_workers * 8)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(receiver), self.server)
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
