"""Pieces the benchmark scripts share: the dataset generator, a local S3-compatible server, a span
provider that keeps nothing, the openai client's HTTP library and the package as of a git revision.

The scripts run as ``python benchmarks/bench_x.py``, so this folder is first on
``sys.path`` and they import this module by its plain name.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


class _Discard(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def null_provider() -> TracerProvider:
    """An SDK provider whose spans go through a SimpleSpanProcessor to an exporter that keeps nothing."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_Discard()))
    return provider


def openai_http() -> Any:
    """The openai client's own HTTP library (openai 3 ships on ``httpx2``)."""
    try:
        import httpx2  # imported here: present only with openai 3, the fallback below otherwise

        return httpx2
    except ImportError:
        import httpx

        return httpx


def package_at(base: str, into: Path) -> Path | None:
    """The package as of git revision ``base`` under ``into`` (``git archive``), or None when git cannot give it."""
    try:
        archive = subprocess.run(
            ["git", "archive", "--format=tar", base, "otel_replay"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    into.mkdir(parents=True, exist_ok=True)
    path = into / "archive.tar"
    path.write_bytes(archive)
    with tarfile.open(path) as tar:
        tar.extractall(into, filter="data")
    return into


def generator() -> Any:
    """``benchmarks/gen_dataset.py`` loaded as a module (it writes through the project's own DatasetWriter)."""
    spec = importlib.util.spec_from_file_location("gen_dataset", HERE / "gen_dataset.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def aws_at(port: int, **environment: str) -> None:
    """Point this process's AWS environment (and its children's) at a local S3 server on loopback ``port``."""
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
        **environment,
    )


@contextlib.contextmanager
def local_s3(**environment: str) -> Iterator[int]:
    """A moto S3 server on a free loopback port, with the AWS environment pointed at it; yields the port."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    aws_at(port, **environment)
    try:
        yield port
    finally:
        server.stop()
