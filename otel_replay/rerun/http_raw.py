"""``requests`` responses whose ``raw`` is a urllib3 response over bytes already read.

Recording reads each body whole (to store it), which would leave the agent a
``requests.Response`` whose ``raw`` is spent; a rerun builds its responses from
the recording, with no ``raw`` at all. Either way ``Session`` could not take
cookies from ``Set-Cookie`` (it reads them from ``raw._original_response.msg``)
and ``shutil.copyfileobj(r.raw, f)`` would break. Here ``raw`` becomes a fresh
``urllib3.HTTPResponse`` over the bytes, with the headers the cookie jar reads.
``requests`` and ``urllib3`` are imported only when called.
"""

from __future__ import annotations

import http.client
import io
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from otel_replay.rerun.http_stream import ChainReader, head_sync

if TYPE_CHECKING:
    from urllib3.response import HTTPResponse

__all__ = ["over_bytes", "read_head", "release"]

_READ = 64 * 1024


def read_head(raw: HTTPResponse, cap: int) -> tuple[bytes, Iterator[bytes] | None]:
    """The body of ``raw`` as it came (still compressed), up to the cap (see :func:`head_sync`), and the rest.

    Errors while reading the head are raised as ``requests`` raises them.
    """
    # optional dependency: requests and urllib3, only when their calls are served
    import requests.exceptions
    import urllib3.exceptions

    try:
        return head_sync(raw.stream(_READ, decode_content=False), cap)
    except urllib3.exceptions.ProtocolError as exc:
        raise requests.exceptions.ChunkedEncodingError(exc) from exc
    except urllib3.exceptions.DecodeError as exc:
        raise requests.exceptions.ContentDecodingError(exc) from exc
    except urllib3.exceptions.ReadTimeoutError as exc:
        raise requests.exceptions.ConnectionError(exc) from exc
    except urllib3.exceptions.SSLError as exc:
        raise requests.exceptions.SSLError(exc) from exc


def release(raw: HTTPResponse) -> Callable[[bool], None]:
    """How a live urllib3 response is let go once its body was handed on: reused when read to the end."""

    def done(finished: bool) -> None:
        if not finished:
            raw.close()  # unread bytes are left on the connection: never reused
        raw.release_conn()

    return done


class _Sent:
    """Stands for the ``http.client`` response of a served answer: the headers the cookie jar reads."""

    def __init__(self, pairs: Sequence[tuple[Any, Any]]) -> None:
        self.msg = http.client.HTTPMessage()
        for key, value in pairs:
            name = key.decode("latin-1") if isinstance(key, bytes) else str(key)
            self.msg[name] = value.decode("latin-1") if isinstance(value, bytes) else str(value)

    def close(self) -> None:
        pass

    def isclosed(self) -> bool:
        return True


def over_bytes(
    body: bytes,
    headers: Any,
    *,
    status: int,
    reason: str,
    method: str,
    url: str,
    original: HTTPResponse | None = None,
    rest: Iterator[bytes] | None = None,
) -> HTTPResponse:
    """A urllib3 response reading ``body``, as ``requests`` builds its own (undecoded until asked).

    ``original``: the live response whose body was read, for its ``http.client`` response (cookies) and
    settings; without it (a rerun) the headers stand in for that response. ``rest``: the live rest of the
    body after ``body`` (a long body, read on as the agent reads), ``original`` released when it is done.
    """
    # optional dependency: urllib3, only when its responses are served
    import urllib3
    from urllib3.response import HTTPResponse

    pairs = list(headers.items()) if hasattr(headers, "items") else list(headers)
    chained = ChainReader(body, rest, release(original)) if original is not None and rest is not None else None
    return HTTPResponse(
        body=io.BytesIO(body) if chained is None else io.BufferedReader(chained),
        headers=urllib3.HTTPHeaderDict(pairs),
        status=status,
        version=original.version if original is not None else 11,
        reason=reason,
        preload_content=False,
        decode_content=original.decode_content if original is not None else False,
        original_response=original._original_response if original is not None else _Sent(pairs),  # type: ignore[arg-type]
        msg=original.msg if original is not None else None,
        enforce_content_length=original.enforce_content_length if original is not None else False,
        request_method=method,
        request_url=url,
    )
