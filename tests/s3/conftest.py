"""A local S3-compatible server (moto's S3 in server mode) on loopback, and one fresh bucket per test.

Nothing here talks to the internet: every AWS variable points at the server
started below, and the instance metadata service is switched off.
"""

from __future__ import annotations

import gc
import logging
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from otel_replay.storage import objects

moto_app = pytest.importorskip("moto.moto_server.werkzeug_app")
boto3 = pytest.importorskip("boto3")
serving = pytest.importorskip("werkzeug.serving")


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """One server per test process, serving moto's S3 application alone.

    moto's own threaded server puts a dispatcher in front that finds the service of every request anew (it
    lists moto's package directory and tries each service's URL patterns): about a third of the server's CPU
    in these tests, which speak only S3. The S3 application behind it is the same either way.
    """
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app = moto_app.create_backend_app("s3")
    server = serving.make_server("127.0.0.1", 0, app, threaded=True, request_handler=moto_app.MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, name="moto-s3", daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield f"http://{host}:{port}"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


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
def s3() -> Iterator[Any]:
    client = boto3.client("s3")
    yield client
    client.close()


@pytest.fixture(autouse=True)
def _closed_clients() -> Iterator[None]:
    """After each test, the boto3 clients ``objects.client()`` built in it closed and forgotten.

    So no test's pooled sockets outlive it, and no event handler a test registered on a client
    (``losing_the_first_response`` below) reaches the next test: that one builds clients of its own.
    """
    yield
    objects.close_clients()
    # Clients a test built itself (botocore sessions, a boto3 client in its body) sit in reference cycles: their
    # sockets close when the cyclic collector frees them, maybe inside a later test, where the ResourceWarning fails
    # it (warnings are errors). Collected here, with that warning ignored, they never reach another test.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


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


def losing_the_first_response(real: Callable[[Any], Any], part: str) -> Callable[[Any], Any]:
    """``objects.client`` whose first PUT to a key holding ``part`` reaches the bucket but whose response is lost.

    The PUT is sent for real, then the read times out: botocore retries it, and the retry (conditional, as every
    claim's PUT is) finds the object its own first attempt stored. The handler goes on the shared client once
    (``unique_id``), however many times the caller asks for the client; ``_closed_clients`` drops it after the test.
    """
    # Imported here: boto3 and botocore are optional (importorskip above), and only these tests need the two.
    from botocore.exceptions import ReadTimeoutError
    from botocore.httpsession import URLLib3Session

    lost: list[int] = []

    def client(location: Any) -> Any:
        s3 = real(location)

        def lose_the_response(request: Any, **_: Any) -> None:
            if lost or part not in request.url:
                return
            session = URLLib3Session()
            try:
                lost.append(session.send(request).status_code)
            finally:
                session.close()
            raise ReadTimeoutError(endpoint_url=request.url)

        s3.meta.events.register("before-send.s3.PutObject", lose_the_response, unique_id=f"lose-{id(lost)}")
        return s3

    return client
