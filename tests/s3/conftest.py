"""A local S3-compatible server (moto in server mode) on loopback, and one fresh bucket per test.

Nothing here talks to the internet: every AWS variable points at the server
started below, and the instance metadata service is switched off.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    assert host == "127.0.0.1"
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch, s3_endpoint: str) -> str:
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return s3_endpoint


@pytest.fixture
def s3() -> Any:
    return boto3.client("s3")


@pytest.fixture
def bucket(s3: Any) -> str:
    name = f"otel-replay-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


def keys(s3: Any, bucket: str, prefix: str = "") -> list[str]:
    """Every object key under ``prefix`` in ``bucket``."""
    found: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        found.extend(item["Key"] for item in page.get("Contents", []))
    return sorted(found)
