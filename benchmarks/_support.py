"""Pieces the benchmark scripts share: the dataset generator and a local S3-compatible server.

The scripts run as ``python benchmarks/bench_x.py``, so this folder is first on
``sys.path`` and they import this module by its plain name.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def generator() -> Any:
    """``benchmarks/gen_dataset.py`` loaded as a module (it writes through the project's own DatasetWriter)."""
    spec = importlib.util.spec_from_file_location("gen_dataset", HERE / "gen_dataset.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def local_s3(**environment: str) -> Iterator[int]:
    """A moto S3 server on a free loopback port, with the AWS environment pointed at it; yields the port."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
        **environment,
    )
    try:
        yield port
    finally:
        server.stop()
