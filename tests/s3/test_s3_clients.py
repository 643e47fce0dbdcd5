"""``objects.client``: one boto3 client per endpoint, settings and process, shared, closed by ``close_clients``."""

from __future__ import annotations

import gc
import http.server
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_replay.location import resolve
from otel_replay.storage import objects

from .._support import Zygote, in_forked_child

boto3 = pytest.importorskip("boto3")


def _signed_with(s3: Any, bucket: str) -> str:
    """The access key id a request of ``s3`` is signed with (its Authorization header's ``Credential=``)."""
    seen: list[str] = []

    def look(request: Any, **_: Any) -> None:
        seen.append(str(request.headers["Authorization"]))

    s3.meta.events.register("before-send.s3.HeadBucket", look, unique_id="signed-with")
    try:
        s3.head_bucket(Bucket=bucket)
    finally:
        s3.meta.events.unregister("before-send.s3.HeadBucket", unique_id="signed-with")
    return seen[0].split("Credential=", 1)[1].split("/", 1)[0]


def test_a_second_call_returns_the_same_client_for_every_bucket_of_the_endpoint(bucket: str) -> None:
    first = objects.client(resolve(f"s3://{bucket}/a"))
    assert objects.client(resolve(f"s3://{bucket}/a")) is first
    assert objects.client(resolve("s3://another-bucket/b")) is first
    assert first.head_bucket(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_a_changed_access_key_gets_a_new_client_that_signs_with_it(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    location = resolve(f"s3://{bucket}/p")
    first = objects.client(location)
    assert _signed_with(first, bucket) == "testing"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "rotated")  # moto accepts any key: the signature shows which was used
    second = objects.client(location)
    assert second is not first
    assert _signed_with(second, bucket) == "rotated"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    assert objects.client(location) is first  # back to the first settings: the first client again


def test_a_changed_profile_gets_a_client_with_that_profiles_credentials(
    bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no key in the environment: the client's own session resolves the chain, as the variables name it now
    credentials = tmp_path / "credentials"
    credentials.write_text(
        "[first]\naws_access_key_id = from-first\naws_secret_access_key = x\n"
        "[second]\naws_access_key_id = from-second\naws_secret_access_key = y\n"
    )
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_PROFILE", "first")
    location = resolve(f"s3://{bucket}/p")
    first = objects.client(location)
    assert _signed_with(first, bucket) == "from-first"
    monkeypatch.setenv("AWS_PROFILE", "second")
    assert _signed_with(objects.client(location), bucket) == "from-second"


def test_a_changed_session_token_or_region_gets_a_new_client(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    location = resolve(f"s3://{bucket}/p")
    first = objects.client(location)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token-2")
    with_token = objects.client(location)
    assert with_token is not first
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    in_region = objects.client(location)
    assert in_region is not with_token
    assert in_region.meta.region_name == "eu-west-1"


def test_a_changed_endpoint_gets_a_new_client_for_it(
    bucket: str, aws_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    location = resolve(f"s3://{bucket}/p")
    first = objects.client(location)
    assert first.meta.endpoint_url == aws_env
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")  # never asked: only the client's address
    elsewhere = objects.client(location)
    assert elsewhere is not first
    assert elsewhere.meta.endpoint_url == "http://127.0.0.1:9"


def test_a_forked_child_builds_its_own_client_and_uses_it(bucket: str) -> None:
    location = resolve(f"s3://{bucket}/p")
    parents = objects.client(location)
    parents.head_bucket(Bucket=bucket)  # a pooled connection the child must not send on

    def in_child() -> dict[str, Any]:
        own = objects.client(location)
        status = own.head_bucket(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"]
        return {"parents": own is parents, "again": objects.client(location) is own, "status": status}

    assert in_forked_child(in_child) == {"parents": False, "again": True, "status": 200}
    assert objects.client(location) is parents


def test_first_calls_from_many_threads_build_one_client(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    location = resolve(f"s3://{bucket}/p")
    build = boto3.client

    def slow_build(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.2)  # widens the window in which another thread's first call could build a second client
        return build(*args, **kwargs)

    monkeypatch.setattr(boto3, "client", slow_build)
    start = threading.Barrier(6)
    got: list[Any] = []

    def first_call() -> None:
        start.wait()
        got.append(objects.client(location))

    threads = [threading.Thread(target=first_call, name=f"first-call-{n}") for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(got) == 6
    assert len({id(s3) for s3 in got}) == 1


class _KeepAlive(http.server.BaseHTTPRequestHandler):
    """Answers every HEAD with 200 and keeps the connection open, as S3 does (the moto server here closes it)."""

    protocol_version = "HTTP/1.1"
    timeout = 60  # an idle connection a client never closes ends here, so the server's close never waits longer
    server: _Server

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def finish(self) -> None:
        super().finish()
        self.server.ended.release()  # the client closed the connection (or it sat idle for `timeout`)

    def log_message(self, *_: Any) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = False  # so server_close() joins the connections' threads
    ended: threading.Semaphore  # released as each connection ends


@pytest.fixture
def keep_alive(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Server]:
    """An endpoint that keeps its connections open, so a client's pool holds a socket (set as the S3 endpoint)."""
    server = _Server(("127.0.0.1", 0), _KeepAlive)
    server.ended = threading.Semaphore(0)
    thread = threading.Thread(target=server.serve_forever, name="keep-alive", daemon=True)
    thread.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield server
    finally:
        objects.close_clients()
        server.shutdown()
        thread.join()
        server.server_close()


def test_closing_closes_the_clients_sockets_and_the_next_call_builds_a_new_client(keep_alive: _Server) -> None:
    location = resolve("s3://kept-alive/p")
    s3 = objects.client(location)
    s3.head_bucket(Bucket="kept-alive")  # leaves an open connection in the client's pool
    objects.close_clients()
    # still referenced here, so no collection closes it: the server sees the connection end because it was closed
    assert keep_alive.ended.acquire(timeout=20)  # well inside the server's idle timeout (60 s)
    built = weakref.ref(s3)
    del s3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    assert built() is None  # the cache let go of it
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
    again = objects.client(location)
    assert again.head_bucket(Bucket="kept-alive")["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_keys_rotated_through_the_environment_keep_the_newest_clients_and_close_the_oldest(
    keep_alive: _Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    location = resolve("s3://kept-alive/p")
    built = []
    for n in range(objects.MAX_CLIENTS + 1):
        monkeypatch.setenv("AWS_SESSION_TOKEN", f"token-{n}")
        built.append(objects.client(location))
        if n == 0:
            built[0].head_bucket(Bucket="kept-alive")  # a connection the eviction must close
    assert keep_alive.ended.acquire(timeout=20)  # the first client's, closed when the ninth was built
    for n in range(1, objects.MAX_CLIENTS + 1):  # the newest are kept
        monkeypatch.setenv("AWS_SESSION_TOKEN", f"token-{n}")
        assert objects.client(location) is built[n]
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token-0")
    assert objects.client(location) is not built[0]


_AT_EXIT = """
from otel_replay.location import resolve
from otel_replay.storage import objects
s3 = objects.client(resolve("s3://kept-alive/p"))
s3.head_bucket(Bucket="kept-alive")
close = s3.close
def told_then_closed():
    print("closed")
    close()
s3.close = told_then_closed
print("built")
"""


def test_clients_are_closed_at_interpreter_exit(keep_alive: _Server, zygote: Zygote) -> None:
    ended = zygote.run(_AT_EXIT)
    assert ended.returncode == 0, ended.stderr
    assert ended.stdout == "built\nclosed\n"
    assert ended.stderr == ""
