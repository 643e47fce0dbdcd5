"""Fixtures for the receiver tests: an in-process receiver on free loopback ports, SDK workloads."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link

import otel_replay
from otel_replay.server import Receiver, ServerConfig

from .._support import CLI, ForkedProcess, Zygote


@pytest.fixture
def make_receiver(tmp_path: Path) -> Iterator[Callable[..., Receiver]]:
    started: list[Receiver] = []

    def make(dataset: Path | None = None, **overrides: Any) -> Receiver:
        settings: dict[str, Any] = {
            "grpc": "127.0.0.1:0",
            "http": "127.0.0.1:0",
            "convert_workers": 0,
            "flush_seconds": 0.2,
            "drain_seconds": 5.0,
            "bomb_delay_seconds": 0.0,  # the late 413 to a decompression bomb (3 s by default): a test asks for one
        }
        settings.update(overrides)
        receiver = Receiver(ServerConfig(dataset or tmp_path / "received", **settings)).start()
        started.append(receiver)
        return receiver

    yield make
    for receiver in started:
        receiver.stop()


@pytest.fixture
def receiver(make_receiver: Callable[..., Receiver]) -> Receiver:
    return make_receiver()


def http_url(receiver: Receiver, path: str = "/v1/traces") -> str:
    assert receiver.http_address is not None
    return f"http://127.0.0.1:{receiver.http_address[1]}{path}"


def sdk_exporter(receiver: Receiver, transport: str) -> SpanExporter:
    if transport == "grpc":
        assert receiver.grpc_address is not None
        return GrpcExporter(endpoint=f"127.0.0.1:{receiver.grpc_address[1]}", insecure=True, timeout=10)
    compression = Compression.Gzip if transport == "http-gzip" else Compression.NoCompression
    return HttpExporter(endpoint=http_url(receiver), compression=compression, timeout=10)


def make_spans(count: int, service: str = "svc") -> list[ReadableSpan]:
    """``count`` finished spans with attributes of every type, events and links."""
    collect = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service, "host.name": "h1"}))
    provider.add_span_processor(SimpleSpanProcessor(collect))
    tracer = provider.get_tracer("tests.server", "1.2.3")
    previous = None
    for i in range(count):
        links = [Link(previous.get_span_context(), {"link.n": i})] if previous is not None else []
        with tracer.start_as_current_span("root", links=links) as root:
            root.set_attributes({"i": i, "s": f"v{i}", "f": i / 2, "b": i % 2 == 0, "arr": [1, 2, i]})
            root.add_event("evt", {"e.i": i, "e.s": "x"})
            with tracer.start_as_current_span("child", attributes={"parent.i": i}):
                pass
        previous = root
    provider.shutdown()
    return list(collect.get_finished_spans())


def rows(dataset: Path, sql: str = "SELECT * FROM spans ORDER BY span_id") -> list[dict[str, Any]]:
    with otel_replay.open(dataset) as store:
        return store.rows(sql)


def parquet_rows(dataset: Path) -> list[dict[str, Any]]:
    """Every row of every Parquet file under ``dataset/spans``, sorted by span id (no partition column)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(p for p in (dataset / "spans").rglob("*.parquet") if not p.name.startswith("."))
    if not files:
        return []
    table = pa.concat_tables([pq.read_table(p, partitioning=None) for p in files])
    return _sorted_dicts(table)


def parquet_span_ids(dataset: Path) -> list[str]:
    """The span id of every row of every Parquet file under ``dataset/spans`` (only that column is read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(p for p in (dataset / "spans").rglob("*.parquet") if not p.name.startswith("."))
    if not files:
        return []
    table = pa.concat_tables([pq.read_table(p, columns=["span_id"], partitioning=None) for p in files])
    return [str(v) for v in table.column("span_id").to_pylist()]


def expected_rows(spans: list[ReadableSpan]) -> list[dict[str, Any]]:
    """The rows the in-process exporter makes of ``spans``."""
    from otel_replay.exporters.rows import DATE_COLUMN, spans_to_table

    return _sorted_dicts(spans_to_table(spans).drop_columns([DATE_COLUMN]))


def _plain(t: Any) -> Any:
    import pyarrow as pa

    if pa.types.is_timestamp(t):
        return pa.int64()
    if pa.types.is_list(t):
        return pa.list_(_plain(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _plain(f.type), f.nullable) for f in t])
    return t


def _sorted_dicts(table: Any) -> list[dict[str, Any]]:
    """Rows as dicts (nanosecond timestamps as ints), sorted by (trace_id, span_id)."""
    import pyarrow as pa

    schema = pa.schema([pa.field(f.name, _plain(f.type), f.nullable) for f in table.schema])
    return sorted(table.cast(schema).to_pylist(), key=lambda r: (r["trace_id"], r["span_id"]))


def serve_forked(zygote: Zygote, *args: str, stderr_to: str | Path = os.devnull, **options: Any) -> ForkedProcess:
    """``python -m otel_replay serve *args`` as a real process of its own (its pid, SIGTERM, SIGKILL), forked from
    the session's zygote; its stderr goes to the end of ``stderr_to``, its stdout is ``.stdout``."""
    to_file = f"import os\nos.dup2(os.open({str(stderr_to)!r}, os.O_WRONLY | os.O_APPEND | os.O_CREAT), 2)\n"
    return zygote.popen(to_file + CLI, "serve", *args, **options)


def stop_forked(proc: ForkedProcess, sig: int) -> int:
    """Send ``sig`` to a server of :func:`serve_forked` and wait for it (killed after 60 s); its exit code."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
    try:
        return proc.wait(timeout=60)
    except TimeoutError:
        proc.kill()
        proc.wait()
        raise
    finally:
        proc.stdout.close()
        proc.stderr.close()
