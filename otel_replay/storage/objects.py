"""Conditional object writes on S3 (boto3): the compare-and-swap the manifest swap and the lease stand on.

pyarrow's filesystem writes objects but cannot make a write conditional; S3
can: ``If-None-Match: *`` creates an object only if the key is free, and
``If-Match: <etag>`` replaces (or deletes) it only if nobody changed it since
it was read. Both answer ``412 PreconditionFailed`` (or ``409`` under a
concurrent write) to the loser, so exactly one of two racing writers wins.

:func:`client` hands out one boto3 client per endpoint, credentials and
settings in this process, built on first use and shared by every caller (a
boto3 client is thread-safe; building one is not, and costs milliseconds of
CPU and a new connection pool): :func:`close_clients` closes them, and runs at
interpreter exit.
"""

from __future__ import annotations

import atexit
import datetime as dt
import email.utils
import hashlib
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from otel_replay.errors import DatasetError
from otel_replay.location import Location, s3_endpoint

__all__ = [
    "DELETE_BATCH",
    "MAX_CLIENTS",
    "Conflict",
    "Stored",
    "client",
    "close_clients",
    "delete",
    "delete_if",
    "delete_many",
    "get",
    "put_if",
]


class Conflict(Exception):
    """A conditional write lost: the object was created or changed by someone else."""


@dataclass
class Stored:
    """An object as read: its bytes, ETag, last-modified time and the server's clock at the read."""

    body: bytes
    etag: str
    modified: dt.datetime
    server_now: dt.datetime


_PROXIES = frozenset(("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"))

MAX_CLIENTS = 8
"""Clients kept per process; building one more closes the oldest (an application rotating keys in the environment)."""

_clients: dict[tuple[int, str | None, str], Any] = {}
_clients_lock = threading.Lock()
_inherited: list[Any] = []


def _settings_digest() -> str:
    """A digest of what a client is built from in the environment: every ``AWS_*`` variable and the proxies.

    All of them, not a list of the ones known today: boto3 reads credentials, region, profile, config files,
    retries, checksums, addressing and endpoint settings from variables of that prefix. A digest, so the cache's
    keys hold no secret.
    """
    environ = os.environ
    # names first, values only of the few that count: os.environ.items() decodes every value (6x slower here)
    seen = sorted((name, environ[name]) for name in environ if name.startswith("AWS_") or name.upper() in _PROXIES)
    return hashlib.sha256(repr(seen).encode()).hexdigest()


def client(location: Location) -> Any:
    """The boto3 S3 client for ``location`` in this process (endpoint, region, credentials: the AWS variables).

    One client per endpoint and settings (every ``AWS_*`` variable and the
    proxy variables, read at each call), and per process: the first call
    builds it, later calls with the same environment get the same client, a
    changed credential, region or endpoint gets a new one, and a forked child
    builds its own (it never sends on its parent's connections). Credentials
    set in ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` /
    ``AWS_SESSION_TOKEN`` are the client's; without them a new boto3 session
    resolves them (profile, config file, instance role), once per client.
    At most :data:`MAX_CLIENTS` are kept: one more closes the oldest.
    Callers share the client: they must not close it or register event
    handlers on it (:func:`close_clients` closes them all).

    Raises:
        DatasetError: boto3 is not installed (``pip install 'otel-replay[s3]'``).
        ConfigError: the endpoint variable is not an http(s) URL.

    """
    endpoint = s3_endpoint()
    key = (os.getpid(), endpoint, _settings_digest())
    found = _clients.get(key)
    if found is not None:
        return found
    try:
        # optional dependency: boto3 (the `s3` extra)
        import boto3
    except ImportError as exc:
        raise DatasetError(
            f"dataset {location.uri}: s3:// datasets need boto3 (pip install 'otel-replay[s3]')"
        ) from exc
    evicted: list[Any] = []
    with _clients_lock:  # two threads' first calls build one client, not two (one left unclosed)
        found = _clients.get(key)
        if found is None:
            found = _clients[key] = _build(boto3, endpoint)
            while len(_clients) > MAX_CLIENTS:  # credentials rotated through the environment: the oldest go
                evicted.append(_clients.pop(next(iter(_clients))))
    for old in evicted:
        old.close()  # its pooled sockets; a request still running on it finishes (and reconnects if asked again)
    return found


def _build(boto3: Any, endpoint: str | None) -> Any:
    key_id, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if key_id and secret:
        # boto3's default session resolves credentials once per process: given here, a changed variable is used
        return boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
            aws_session_token=os.environ.get("AWS_SESSION_TOKEN") or None,
        )
    # a session of its own resolves the chain (profile, config file, role) as the environment names it now
    return boto3.session.Session().client("s3", endpoint_url=endpoint)


def close_clients() -> None:
    """Close the clients :func:`client` built in this process (their pooled sockets) and forget them.

    The next :func:`client` call builds a new one. A client a caller still
    holds stays usable (it opens connections again as it needs them). Runs at
    interpreter exit; a forked child leaves its parent's clients alone.
    """
    with _clients_lock:
        closing = list(_clients.values())
        _clients.clear()
    for built in closing:
        built.close()


def _forget_inherited_clients() -> None:
    """In a forked child: the parent's clients and their connections are the parent's; this process builds its own."""
    global _clients_lock
    _clients_lock = threading.Lock()  # a thread of the parent may have held it
    _inherited.extend(_clients.values())  # kept referenced: never collected here, nor their sockets closed
    _clients.clear()


if hasattr(os, "register_at_fork"):  # not on Windows, where there is no fork
    os.register_at_fork(after_in_child=_forget_inherited_clients)
atexit.register(close_clients)


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _lost(exc: Exception) -> bool:
    return _code(exc) in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")


def get(s3: Any, location: Location, key: str) -> Stored | None:
    """The object ``key`` of ``location``'s bucket, ``None`` when it does not exist."""
    try:
        response = s3.get_object(Bucket=location.bucket, Key=key)
    except Exception as exc:
        if _code(exc) in ("NoSuchKey", "404"):
            return None
        raise location.error(f"cannot read s3://{location.bucket}/{key}", exc) from exc
    headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    modified: dt.datetime = response["LastModified"]
    now = email.utils.parsedate_to_datetime(headers["date"]) if "date" in headers else dt.datetime.now(dt.UTC)
    return Stored(response["Body"].read(), response["ETag"], modified, now)


def put_if(s3: Any, location: Location, key: str, body: bytes, etag: str | None) -> str:
    """Write ``body`` to ``key`` only if it is still as read (``etag``), or still absent (``None``); the new ETag.

    Raises:
        Conflict: another writer created or changed the object first (or, given ``etag``, deleted it).
        DatasetError: any other failure (the write may or may not have happened).

    """
    condition = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}
    try:
        response = s3.put_object(Bucket=location.bucket, Key=key, Body=body, **condition)
    except Exception as exc:
        if _lost(exc) or (etag is not None and _code(exc) in ("NoSuchKey", "404")):
            raise Conflict(key) from exc
        raise location.error(f"cannot write s3://{location.bucket}/{key}", exc) from exc
    return str(response["ETag"])


def delete_if(s3: Any, location: Location, key: str, etag: str) -> bool:
    """Delete ``key`` only if it is still as written (``etag``); ``False`` when it was changed or is gone."""
    try:
        s3.delete_object(Bucket=location.bucket, Key=key, IfMatch=etag)
    except Exception as exc:
        if _lost(exc) or _code(exc) in ("NoSuchKey", "404"):
            return False
        raise location.error(f"cannot delete s3://{location.bucket}/{key}", exc) from exc
    return True


def delete(s3: Any, location: Location, path: str) -> bool:
    """Delete the object at ``path`` (URL form); ``True`` when it was there.

    Through boto3, not pyarrow: pyarrow's ``delete_file`` leaves an empty
    "directory marker" object behind when a prefix becomes empty.
    """
    key = location.key(path)
    try:
        s3.head_object(Bucket=location.bucket, Key=key)
    except Exception as exc:
        if _code(exc) in ("NoSuchKey", "404", "NotFound"):
            return False
        raise location.error(f"cannot delete {path}", exc) from exc
    try:
        s3.delete_object(Bucket=location.bucket, Key=key)
    except Exception as exc:
        raise location.error(f"cannot delete {path}", exc) from exc
    return True


DELETE_BATCH = 1000
"""Keys per DeleteObjects request (S3's limit)."""


def delete_many(s3: Any, location: Location, url: str, names: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Delete the objects ``names`` under ``url`` (URL form), :data:`DELETE_BATCH` a request; (deleted, failed).

    One DeleteObjects request per 1,000 keys instead of a HEAD and a DELETE
    each. S3 answers per key: a key that failed (``SlowDown``,
    ``InternalError``, ``AccessDenied``...) is asked again once in a request
    of its own kind; what still fails is returned with its error code, never
    counted as deleted. (A key already gone counts as deleted, as S3 answers;
    callers that count only objects that were there pass names from a listing.)

    Raises:
        DatasetError: a request as a whole failed (nothing of that request is known deleted).

    """
    prefix = location.key(url).rstrip("/")
    deleted: list[str] = []
    failed: dict[str, str] = {}
    for start in range(0, len(names), DELETE_BATCH):
        wanted = list(names[start : start + DELETE_BATCH])
        for attempt in range(2):
            errors = _delete_keys(s3, location, url, [f"{prefix}/{n}" for n in wanted])
            by_name = {key.rpartition("/")[2]: code for key, code in errors.items()}
            deleted.extend(n for n in wanted if n not in by_name)
            wanted = [n for n in wanted if n in by_name]
            if not wanted:
                break
            if attempt == 1:
                failed.update({n: by_name[n] for n in wanted})
    return deleted, failed


def _delete_keys(s3: Any, location: Location, url: str, keys: list[str]) -> dict[str, str]:
    """One DeleteObjects request: the keys S3 could not delete, with their error codes."""
    try:
        response = s3.delete_objects(
            Bucket=location.bucket, Delete={"Objects": [{"Key": key} for key in keys], "Quiet": True}
        )
    except Exception as exc:
        raise location.error(f"cannot delete {len(keys)} object(s) under {url}", exc) from exc
    asked = set(keys)
    answered = {str(error.get("Key", "")): str(error.get("Code") or "unknown") for error in response.get("Errors", [])}
    return {key: code for key, code in answered.items() if key in asked}
