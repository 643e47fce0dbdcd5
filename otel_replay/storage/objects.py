"""Conditional object writes on S3 (boto3): the compare-and-swap the manifest swap and the lease stand on.

pyarrow's filesystem writes objects but cannot make a write conditional; S3
can: ``If-None-Match: *`` creates an object only if the key is free, and
``If-Match: <etag>`` replaces (or deletes) it only if nobody changed it since
it was read. Both answer ``412 PreconditionFailed`` (or ``409`` under a
concurrent write) to the loser, so exactly one of two racing writers wins.
"""

from __future__ import annotations

import datetime as dt
import email.utils
from dataclasses import dataclass
from typing import Any

from otel_replay.errors import DatasetError
from otel_replay.location import Location, s3_endpoint

__all__ = ["Conflict", "Stored", "client", "delete", "delete_if", "get", "put_if"]


class Conflict(Exception):
    """A conditional write lost: the object was created or changed by someone else."""


@dataclass
class Stored:
    """An object as read: its bytes, ETag, last-modified time and the server's clock at the read."""

    body: bytes
    etag: str
    modified: dt.datetime
    server_now: dt.datetime


def client(location: Location) -> Any:
    """A boto3 S3 client for ``location`` (endpoint and region from the standard AWS variables).

    Raises:
        DatasetError: boto3 is not installed (``pip install 'otel-replay[s3]'``).

    """
    try:
        # optional dependency: boto3 (the `s3` extra)
        import boto3
    except ImportError as exc:
        raise DatasetError(
            f"dataset {location.uri}: s3:// datasets need boto3 (pip install 'otel-replay[s3]')"
        ) from exc
    return boto3.client("s3", endpoint_url=s3_endpoint())


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
