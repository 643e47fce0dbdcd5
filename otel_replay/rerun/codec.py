"""How recorded values and arguments become stable JSON, hashes and redacted text.

Two encodings:

* :func:`encode_value` / :func:`decode_value` round-trip the values a boundary
  returns (numbers, text, bytes, UUIDs, lists, dicts) exactly, so a rerun
  serves back what the original run received;
* :func:`stable_json` turns call arguments into canonical JSON for hashing; an
  object JSON cannot hold is named by its type only, so the hash never depends
  on a memory address.

Redaction is one function applied at record time and at match time alike; it builds on the
instrumentation's :func:`~otel_replay.instrumentation._redact.redact` (one set of secret shapes).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import uuid
from collections.abc import Mapping
from typing import Any

from otel_replay.instrumentation._redact import REDACTED, redact

__all__ = [
    "REDACTED",
    "arguments_hash",
    "decode_result",
    "decode_value",
    "encode_result",
    "encode_value",
    "redact_headers",
    "redact_json_text",
    "redact_url",
    "stable_json",
]

_SECRET_HEADER = re.compile(
    r"(proxy-)?authorization|(set-)?cookie|x-api-key|api-key|x-auth-token|.*-token|.*-secret|.*api-key",
    re.IGNORECASE,
)
_SECRET_KEY = re.compile(
    r"api[-_]?key|(access|refresh|id|auth|bearer)?[-_]?token|(client[-_])?secret|password|passwd"
    r"|authorization|private[-_]?key|session[-_]?id|cookie|signature|credentials?",
    re.IGNORECASE,
)
_stable = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=lambda o: _opaque(o))


def _opaque(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": hashlib.sha256(bytes(value)).hexdigest()}
    if isinstance(value, (set, frozenset)):
        return sorted(stable_json(v) for v in value)
    if isinstance(value, uuid.UUID):
        return {"$uuid": value.hex}
    return {"$object": f"{type(value).__module__}.{type(value).__qualname__}"}


def stable_json(value: Any) -> str:
    """Canonical JSON of call arguments; unknown objects by type name, NaN as text."""
    try:
        return _stable.encode(value)
    except ValueError:  # circular reference
        return json.dumps({"$object": type(value).__qualname__})
    except RecursionError:  # nested deeper than the encoder walks: named, never raised into the agent's call
        return json.dumps({"$object": f"{type(value).__qualname__} nested too deeply to encode"})


def arguments_hash(boundary: str, name: str, arguments_text: str) -> str:
    """The short hash that matches a rerun step against a recorded one."""
    # Length-prefixed framing: unambiguous, and no escaping pass over a large body.
    head = f"{len(boundary)}:{boundary}{len(name)}:{name}"
    return hashlib.sha256((head + arguments_text).encode("utf-8", "surrogatepass")).hexdigest()[:32]


def encode_value(value: Any) -> Any:
    """A returned value as plain JSON that :func:`decode_value` turns back into an equal value."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return {"$float": repr(value)}
        return value
    if isinstance(value, (bytes, bytearray)):
        return {"$b64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, uuid.UUID):
        return {"$uuid": str(value)}
    if isinstance(value, tuple):
        return {"$tuple": [encode_value(v) for v in value]}
    if isinstance(value, list):
        return [encode_value(v) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        if any(k.startswith("$") for k in value):
            return {"$dict": {k: encode_value(v) for k, v in value.items()}}
        return {k: encode_value(v) for k, v in value.items()}
    raise TypeError(f"{type(value).__module__}.{type(value).__qualname__} cannot be recorded")


def decode_value(value: Any) -> Any:
    """Inverse of :func:`encode_value`."""
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1:
            ((tag, inner),) = value.items()
            if tag == "$b64":
                return base64.b64decode(inner)
            if tag == "$uuid":
                return uuid.UUID(inner)
            if tag == "$tuple":
                return tuple(decode_value(v) for v in inner)
            if tag == "$float":
                return float(inner)
            if tag == "$dict":
                return {k: decode_value(v) for k, v in inner.items()}
        return {k: decode_value(v) for k, v in value.items()}
    return value


def redact_headers(headers: Any) -> list[list[str]]:
    """Header pairs with secret-bearing values replaced by ``[REDACTED]`` (order and repeats kept)."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    for key, value in pairs:
        name = key.decode("latin-1") if isinstance(key, bytes) else str(key)
        text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        out.append([name, REDACTED if _SECRET_HEADER.fullmatch(name) else redact(text)])
    return out


def redact_url(url: str) -> str:
    """``url`` with its password and secret query parameter values redacted.

    ``key=``, ``api_key=``, ``X-Amz-Signature=`` ...: the one redaction engine,
    :func:`~otel_replay.instrumentation._redact.redact`, knows URLs.
    """
    return redact(url)


def _redact_tree(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: REDACTED if _SECRET_KEY.fullmatch(k) else _redact_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_tree(v) for v in value]
    if isinstance(value, str):
        return redact(value)
    return value


_MAYBE_SECRET = re.compile(
    r"key|token|secret|passw|pwd|auth|cookie|session|signature|credential|bearer|basic|sk-|AKIA|ASIA|gh[pousr]_"
    r"|xox|eyJ|://[^/\s]*@",
    re.IGNORECASE,
)
"""Every text :func:`redact` could change matches this (the fast path: most bodies hold no secret)."""


def redact_json_text(text: str) -> str:
    """A body with secrets redacted: JSON by key name and value shape, other text by value shape."""
    if not _MAYBE_SECRET.search(text):
        return text  # the common case: nothing that could be a secret, no parsing
    stripped = text.lstrip()
    if stripped[:1] in ("{", "["):
        try:
            tree = json.loads(text)
            redacted = _redact_tree(tree)
        except (ValueError, RecursionError):  # not JSON, or nested too deep to walk: redact by value shape
            return redact(text)
        if redacted == tree:
            return text  # nothing secret: keep the exact bytes
        return json.dumps(redacted, ensure_ascii=False, separators=(",", ":"))
    return redact(text)


def encode_result(value: Any) -> Any:
    """A tool's or a rail's result as plain JSON; a :class:`~otel_replay.gate.Receipt` keeps its type.

    A value that cannot be recorded becomes ``{"$unrecordable": why}``: a rerun
    refuses to serve it rather than run the tool again.
    """
    from otel_replay.gate import Receipt
    from otel_replay.records import Action

    if isinstance(value, Receipt):
        return {"$receipt": value.to_json()}
    if isinstance(value, Action):
        return {"$action": {"type": value.type, "arguments": dict(value.arguments), "cost": value.cost}}
    try:
        return encode_value(value)
    except TypeError as exc:
        return {"$unrecordable": str(exc)}
    except RecursionError:
        return {"$unrecordable": f"{type(value).__qualname__} nested too deeply to record"}


def decode_result(value: Any) -> Any:
    """Inverse of :func:`encode_result` (``$unrecordable`` is the caller's to refuse)."""
    if isinstance(value, dict) and len(value) == 1 and "$receipt" in value:
        from otel_replay.gate import Receipt

        return Receipt.from_json(value["$receipt"])
    if isinstance(value, dict) and len(value) == 1 and "$action" in value:
        from otel_replay.records import Action

        data = value["$action"]
        return Action(data["type"], data.get("arguments") or {}, cost=data.get("cost"))
    return decode_value(value)
