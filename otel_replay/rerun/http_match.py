"""What an HTTP request is matched on, what of it is stored, and how a divergence names the parts that differ.

A call is matched on everything that decides what it does: the method, the full URL with its query, the
headers except the volatile ones (:data:`VOLATILE_HEADERS`: what the client adds on its own per run or per
attempt) and the body, all unredacted, through a keyed hash (see
:func:`~otel_replay.rerun.codec.arguments_hash`); only the stored text is redacted, and it carries a keyed
digest of each part (method, host, path, query, each header, the body) so that a divergence can say which
part differs without storing any of them. Recordings of codec 2 and before are matched as they were made:
method, URL and body, redacted, with no headers.

The client patches that build these texts live in :mod:`otel_replay.rerun.http`.
"""

from __future__ import annotations

import base64
import json
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from otel_replay.redaction import is_secret_name
from otel_replay.rerun.codec import (
    current_codec,
    digest_key,
    digest_with,
    redact_headers,
    redact_json_text,
    redact_partial_json,
    redact_url,
    tree_json,
)
from otel_replay.rerun.http_body import BodySeen

__all__ = [
    "VOLATILE_HEADERS",
    "body_text",
    "compared_headers",
    "credentials_only",
    "part_differences",
    "request_arguments",
    "request_texts",
    "request_texts_lazy",
    "split_parts",
]


def body_text(raw: bytes) -> Any:
    """A stored body, redacted: its text when it is UTF-8, else ``{"$b64": ...}`` of its redacted bytes."""
    try:
        return redact_json_text(raw.decode("utf-8"))
    except UnicodeDecodeError:
        pass
    # Not UTF-8 as stored (a head capped inside a character, Latin-1, a multipart upload with a file):
    # redacted over a view that keeps every other byte as it is (surrogateescape), and stored as bytes.
    view = raw.decode("utf-8", "surrogateescape")
    try:
        kept = redact_json_text(view).encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # re-serialised JSON wrote an escaped lone surrogate raw: by value shape only
        kept = redact_partial_json(view).encode("utf-8", "surrogateescape")
    return {"$b64": base64.b64encode(kept).decode("ascii")}


_canonical = tree_json  # every text here is of a tree: built from literals, or json.loads

VOLATILE_HEADERS = frozenset(
    {
        "user-agent",  # the client library and its version
        "traceparent",  # trace context: new ids every run
        "tracestate",
        "baggage",
        "date",
        "content-length",  # implied by the body, which is compared
        "transfer-encoding",  # how the body is framed, not what it is
        "connection",
        "keep-alive",
        "proxy-connection",
        "accept-encoding",  # the client decodes the answer whatever the encoding
        "te",
        "cookie",  # the server's own Set-Cookie values, sent back (see below)
    }
)
"""Request headers left out of the match: what the client adds per run or per attempt, not what the agent asked.

Also every ``x-stainless-*`` header (the OpenAI and Anthropic clients' telemetry: their OS, runtime and
package versions, retry count, timeouts). ``Cookie`` sends back what the server set: a recording stores
``Set-Cookie`` values redacted, so a rerun's jar holds other values, and among concurrent requests whether a
cookie is there yet depends on which answer came first. Every other header is compared, credentials included
(through the keyed hash, never stored; a rerun may compare them by presence only:
``rerun(credentials="presence")``)."""

_VOLATILE_PREFIXES = ("x-stainless-",)


def _text(value: Any) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else str(value)


def compared_headers(headers: Any) -> list[list[str]]:
    """The request headers a call is matched on: names lowercased, the volatile ones left out, sorted by name.

    Repeats of one name keep their order (it can matter).
    """
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    kept = []
    names = _compared_names
    for key, value in pairs:
        # The name's lowercased text and whether it is compared: worked out once per name seen (a client sends
        # the same few names on every request); only plain bytes and str names are remembered.
        known = names.get(key) if type(key) in (bytes, str) else None
        if known is None:
            lowered = _text(key).lower()
            known = (lowered, not (lowered in VOLATILE_HEADERS or lowered.startswith(_VOLATILE_PREFIXES)))
            if type(key) in (bytes, str) and len(names) < 4096:
                names[key] = known
        if known[1]:
            kept.append([known[0], value.decode("latin-1") if isinstance(value, bytes) else str(value)])
    kept.sort(key=_first)  # stable: repeats stay in order
    return kept


_compared_names: dict[bytes | str, tuple[str, bool]] = {}
"""Header name as given -> (its compared name, compared: not volatile), for :func:`compared_headers`."""
_first = operator.itemgetter(0)


def _legacy_text(method: str, url: str, body: BodySeen) -> str:
    """The arguments of codec 1 and 2 (stored and matched): method, redacted URL and body, no headers."""
    if not body.size:
        shown: Any = ""
    elif body.size > 65_536:
        shown = {"$sha256": body.hexdigest(), "bytes": body.size}
    else:
        shown = body_text(body.head)
    return json.dumps(
        {"method": method.upper(), "url": redact_url(url), "body": shown},
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    )


def request_texts(method: str, url: str, headers: Any, body: BodySeen, *, unread: bool = False) -> tuple[str, str]:
    """``(stored, matched)`` arguments of one request, under the codec in force.

    Codec 3: stored is the redacted method, URL, compared headers and body (its length and a keyed digest
    when longer than 64 KiB); matched is the unredacted method, full URL, compared headers and the body's
    digest and length, never stored (only its keyed hash is). Codecs 1 and 2: both are the redacted text of
    method, URL and body, as they were made (``unread``: a requests/urllib3 body that was not bytes or text,
    which they matched as empty).
    """
    matched, stored = request_texts_lazy(method, url, headers, body, unread=unread)
    return stored(), matched


def request_texts_lazy(
    method: str, url: str, headers: Any, body: BodySeen, *, unread: bool = False
) -> tuple[str, Callable[[], str]]:
    """:func:`request_texts` as ``(matched, a function building stored)``: the stored text only when needed.

    The matched text is all a call that matches needs; the stored text (redaction, part digests: a dozen
    keyed digests) is built when a recording stores it or a rerun's divergence shows it, with the digest key
    in force when the call was made.
    """
    if current_codec() < 3:
        text = _legacy_text(method, url, BodySeen.of(b"") if unread else body)
        return text, lambda: text
    kept = compared_headers(headers)
    digest: dict[str, Any] = {"sha256": body.hexdigest(), "bytes": body.size, "complete": body.complete}
    matched = _canonical({"method": method.upper(), "url": url, "headers": kept, "body": digest})
    key = digest_key()

    def stored() -> str:
        return _stored_text(key, method, url, kept, body, digest)

    return matched, stored


def _stored_text(
    key: bytes | None, method: str, url: str, kept: list[list[str]], body: BodySeen, digest: dict[str, Any]
) -> str:
    """The stored (redacted) arguments of a codec-3 request, with its part digests when keyed (``key``)."""
    shown: Any
    if not body.size and body.complete:
        shown = ""
    elif body.size <= 65_536 and body.complete:
        shown = body_text(body.head)
    else:
        shown = {"bytes": body.size, "digest": digest_with(key, digest["sha256"].encode())[:32]}
        if not body.complete:
            shown["unfinished"] = True  # the server answered (or the call failed) before it was all sent
    fields = {"method": method.upper(), "url": redact_url(url), "headers": redact_headers(kept), "body": shown}
    if key is not None:  # never a plain SHA-256 of a part: a short secret could be found by trying guesses
        fields["digests"] = _parts(key, method, url, kept, digest)
    return _canonical(fields)


_PART_LABEL = "otel-replay http part v1"
_PART_HEX = 16
_SCHEME_HEADERS = frozenset({"authorization", "proxy-authorization"})
_SCHEME = re.compile(r"([A-Za-z0-9!#$%&'*+.^_`|~-]+) +\S")
"""An auth scheme (RFC 9110 ``token``) followed by its credentials."""
_KNOWN_SCHEMES = frozenset(
    "basic bearer digest token negotiate ntlm hoba mutual oauth dpop hawk mac signature apikey key "
    "aws4-hmac-sha256 scram-sha-1 scram-sha-256 vapid ssws privatetoken concealed".split()
)
"""Schemes stored in clear (lowercased); any other first word is stored as a keyed digest, as it could be a key."""


def _scheme(key: bytes, value: str) -> str:
    found = _SCHEME.match(value)
    if found is None:
        return ""  # no scheme: the whole value is the credential
    word = found.group(1).lower()
    return word if word in _KNOWN_SCHEMES else "#" + _part(key, "scheme", word)


def _part(key: bytes, kind: str, data: str) -> str:
    """A short keyed digest of one part of a request (framed by ``kind``, so two parts never share one)."""
    framed = f"{_PART_LABEL}\0{len(kind)}:{kind}\0{data}"
    return digest_with(key, framed.encode("utf-8", "surrogatepass"))[:_PART_HEX]


def _parts(key: bytes, method: str, url: str, headers: list[list[str]], body: dict[str, Any]) -> dict[str, Any]:
    """The digest under ``key`` of each compared part of a request: what a divergence names when text is redacted.

    ``host``, ``path`` and ``query`` (with any fragment) split the full URL; ``headers`` holds one digest per
    compared header name (the values of repeats joined in order); ``schemes`` the auth scheme of an
    ``Authorization`` or ``Proxy-Authorization`` header (``bearer``: a known scheme is not secret, so it is
    stored in clear; an unknown first word is digested like the rest).
    """
    split = urlsplit(url)
    query = split.query + (f"#{split.fragment}" if split.fragment else "")
    values: dict[str, list[str]] = {}
    for name, value in headers:
        values.setdefault(name, []).append(value)
    schemes = {}
    for name in sorted(_SCHEME_HEADERS.intersection(values)):
        schemes[name] = ",".join(_scheme(key, value) for value in values[name])  # each repeat's, in order
    return {
        "method": _part(key, "method", method.upper()),
        "host": _part(key, "host", f"{split.scheme}://{split.netloc}"),
        "path": _part(key, "path", split.path),
        "query": _part(key, "query", query),
        "headers": {name: _part(key, f"header {name}", _canonical(shown)) for name, shown in values.items()},
        "schemes": schemes,
        "body": _part(key, "body", _canonical(body)),
    }


def split_parts(text: str) -> tuple[str, dict[str, Any] | None]:
    """Stored HTTP arguments as ``(text shown, part digests)``; ``None``: a recording without them (codec 1, 2)."""
    if '"digests":' not in text:
        return text, None
    try:
        data = json.loads(text)
    except ValueError:
        return text, None
    parts = data.pop("digests", None) if isinstance(data, dict) else None
    if not isinstance(parts, dict) or not isinstance(parts.get("headers"), dict):
        return text, None
    return _canonical(data), parts


def _header_differences(recorded: dict[str, Any], actual: dict[str, Any]) -> list[tuple[str, str]]:
    """``(name, how)`` per compared header that differs; how: value, scheme, missing (not sent), added."""
    have, want = recorded.get("headers") or {}, actual.get("headers") or {}
    have_schemes, want_schemes = recorded.get("schemes") or {}, actual.get("schemes") or {}
    found = []
    for name in sorted(set(have) | set(want)):
        if name not in want:
            found.append((name, "missing"))
        elif name not in have:
            found.append((name, "added"))
        elif have[name] != want[name]:
            same = have_schemes.get(name, "") == want_schemes.get(name, "")
            found.append((name, "value" if same else "scheme"))
    return found


def _scheme_shown(scheme: Any) -> str:
    if not scheme:
        return "none"
    return ",".join("another" if one.startswith("#") else one or "none" for one in str(scheme).split(","))


_SIMPLE_PARTS = ("method", "host", "path", "query", "body")


def part_differences(recorded: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """Which parts of two requests differ, in words (header names, never values): ``["header authorization"]``."""
    words = [key for key in _SIMPLE_PARTS[:4] if recorded.get(key) != actual.get(key)]
    for name, how in _header_differences(recorded, actual):
        if how == "missing":
            words.append(f"header {name} (recorded, not sent by the rerun)")
        elif how == "added":
            words.append(f"header {name} (sent by the rerun, not recorded)")
        elif how == "scheme":
            before = _scheme_shown((recorded.get("schemes") or {}).get(name))
            after = _scheme_shown((actual.get("schemes") or {}).get(name))
            words.append(f"header {name} (its scheme: recorded {before}, rerun {after})")
        else:
            words.append(f"header {name}")
    if recorded.get("body") != actual.get("body"):
        words.append("body")
    return words


def credentials_only(recorded: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """The credential headers that alone make two requests differ, each sent on both sides with one scheme.

    A credential header is a compared header whose name :func:`~otel_replay.redaction.is_secret_name`.
    Empty when anything else differs (method, URL, body, another header, a credential header missing on one
    side or sent with another scheme), or nothing does.
    """
    if any(recorded.get(key) != actual.get(key) for key in _SIMPLE_PARTS):
        return []
    found = _header_differences(recorded, actual)
    if all(how == "value" and is_secret_name(name) for name, how in found):
        return [name for name, _ in found]
    return []


def request_arguments(method: str, url: str, body: bytes, headers: Any = ()) -> str:
    """The stored (redacted) arguments of one request with a body given whole."""
    return request_texts(method, url, headers, BodySeen.of(body))[0]
