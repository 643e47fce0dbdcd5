"""Canonical JSON: the one byte form used for hashing, storage and equality."""

from __future__ import annotations

import base64
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from otel_replay.errors import CaptureError, PayloadError

_orjson: Any
try:  # the accelerator: it writes only values it encodes exactly as json does (tests/exporters/test_rows.py)
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised only without orjson installed
    _orjson = None

_encoder = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _bytes_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    raise TypeError(f"{type(value).__name__} is not an attribute value")


_compact = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=_bytes_default).encode

# Types whose orjson bytes equal json's: exact classes only (a subclass may
# override __repr__ or __str__), floats only where both print the same digits.
_PLAIN = frozenset({str, int, bool, type(None)})
_is_plain = _PLAIN.issuperset
_str_keys = frozenset({str}).issuperset
_CONTAINERS = (list, tuple)
_DEPTH = 32


def _same_bytes(value: Any, depth: int = 0) -> bool:
    """True when orjson writes ``value`` exactly as ``json`` does.

    Floats: both print the shortest round-trip digits, but orjson writes
    exponents as ``1e16`` where json writes ``1e+16`` and turns NaN into
    ``null``: only finite floats in ``[1e-4, 1e16)`` (and zero) qualify.
    """
    cls = value.__class__
    if cls in _PLAIN:
        return True
    if cls is float:
        return value == 0.0 or 1e-4 <= abs(value) < 1e16  # NaN fails both
    if depth > _DEPTH:
        return False
    if cls is dict:
        if not _str_keys(map(type, value)):
            return False
        value = value.values()
    elif cls is not list and cls is not tuple:
        return False
    if _is_plain(map(type, value)):
        return True
    depth += 1
    # Inline for the scalars (a record's dict holds one float among strings): a call per item cost more than
    # the rest of the check.
    for item in value:
        cls = item.__class__
        if cls in _PLAIN:
            continue
        if cls is float:
            if not (item == 0.0 or 1e-4 <= abs(item) < 1e16):  # NaN fails both
                return False
        elif not _same_bytes(item, depth):
            return False
    return True


def _fast_encoder(sort_keys: bool) -> Callable[[Any], bytes] | None:
    if _orjson is None:
        return None
    dumps, option = _orjson.dumps, _orjson.OPT_SORT_KEYS if sort_keys else 0
    return lambda value: dumps(value, option=option)


_fast_sorted = _fast_encoder(True)
_fast_compact = _fast_encoder(False)


def compact_json_bytes(values: dict[str, Any]) -> bytes:
    """The stored form of an attribute mapping, as UTF-8: keys in insertion order, no spaces, bytes as base64.

    Identical, byte for byte, to ``json`` with ``ensure_ascii=False`` and
    compact separators: orjson writes it when every value is of a kind both
    encode alike (see ``tests/exporters/test_rows.py``), ``json`` otherwise.
    """
    if _fast_compact is not None and _same_bytes(values):
        try:
            return _fast_compact(values)
        except TypeError:  # a str subclass key, an int past 64 bits, a lone surrogate: json decides
            pass
    return _compact(values).encode()


def compact_json(values: dict[str, Any]) -> str:
    """:func:`compact_json_bytes` as text."""
    if _fast_compact is not None and _same_bytes(values):
        try:
            return _fast_compact(values).decode()
        except TypeError:
            pass
    return _compact(values)


def canonical_json(value: Any, *, where: str) -> str:
    """Return ``value`` as canonical JSON (sorted keys, no spaces, UTF-8).

    Raises:
        CaptureError: naming ``where`` and the path of the first value JSON
            cannot represent (an object, a set, NaN, a non-string key ...).

    """
    if _fast_sorted is not None and _same_bytes(value):
        try:
            return _fast_sorted(value).decode()
        except TypeError:  # json decides: it encodes or names what is wrong
            pass
    try:
        return _encoder.encode(value)
    except RecursionError:
        raise CaptureError(_too_deep(where)) from None
    except (TypeError, ValueError) as exc:
        found = _find_unserialisable(value, "$")
        if found is None:  # pragma: no cover - every encoder refusal has a cause found above
            raise CaptureError(f"{where} is not JSON-serialisable: {exc}") from exc
        path, bad = found
        raise CaptureError(
            f"{where} is not JSON-serialisable: {path} is {bad} "
            "(use str, int, float, bool, None, lists and dicts with string keys)"
        ) from exc


_SCALARS = (str, int, float, bool, type(None))
_is_scalar = frozenset(_SCALARS).issuperset  # exact classes, checked in C


def flat_mapping_json(value: Any) -> tuple[str, dict[str, Any]] | None:
    """:func:`encode_mapping` of a flat dict of strings, ints, bools and ``None`` (the common case); else ``None``.

    The same text and copy, without the checks a nested or float value needs
    (and without building the error context, which only a failure uses).
    """
    if (
        value.__class__ is dict
        and _fast_sorted is not None
        and _str_keys(map(type, value))
        and _is_plain(map(type, value.values()))
    ):
        try:
            return _fast_sorted(value).decode(), value.copy()
        except TypeError:  # an int past 64 bits, a lone surrogate: json decides
            return None
    return None


def encode_mapping(value: Mapping[str, Any], *, where: str) -> tuple[str, dict[str, Any]]:
    """Canonical JSON of a mapping and a normalised deep copy of it.

    A flat mapping of string keys to scalars (the common case) is copied
    directly; anything nested goes through a JSON round trip.
    """
    flat = flat_mapping_json(value)
    if flat is not None:
        return flat
    text = canonical_json(value, where=where)
    if _str_keys(map(type, value)) and _is_scalar(map(type, value.values())):
        return text, dict(value)
    return text, _reload(text, where)


def normalise(value: Any, *, where: str) -> Any:
    """Deep-copy ``value`` into plain JSON types (tuples become lists)."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    return _reload(canonical_json(value, where=where), where)


def _reload(text: str, where: str) -> Any:
    """``text`` parsed back: the decoder can run out of stack a little before the encoder did."""
    try:
        return json.loads(text)
    except RecursionError:
        raise CaptureError(_too_deep(where)) from None


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise _Duplicate(dup)
    return obj


class _Duplicate(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key




def strict_loads(data: str | bytes, *, where: str) -> Any:
    """Parse JSON the one way every reader agrees on, or raise :class:`PayloadError` naming ``where``.

    Refused: duplicate object keys (parsers disagree on which one wins, so a
    document with them has no single meaning), nesting too deep for the
    parser, ``NaN``/``Infinity``, a number too large for a float (``1e999``,
    which Python would read as infinity), and anything that is not UTF-8
    JSON. The message is one line: ``where``, what is wrong, and the line and
    column.
    """
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
        return _STRICT.decode(text)
    except _Duplicate as exc:
        raise PayloadError(f"{where}: duplicate key {exc.key!r} (a key may appear once per object)") from None
    except RecursionError:
        raise PayloadError(f"{where}: nested too deeply to parse") from None
    except UnicodeDecodeError as exc:
        raise PayloadError(f"{where}: not UTF-8 (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise PayloadError(f"{where}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except _Overflow as exc:
        number = exc.literal[:40]
        raise PayloadError(f"{where}: the number {number} is too large for a float{_at(text, exc.literal)}") from None
    except ValueError as exc:  # NaN / Infinity constants
        raise PayloadError(f"{where}: {exc}") from None


def _at(text: str, literal: str) -> str:
    """`` (line L, column C)`` of the first ``literal`` in ``text``, for an error that has no position of its own."""
    index = text.find(literal)
    if index < 0:  # pragma: no cover - the literal came from the text
        return ""
    line = text.count("\n", 0, index) + 1
    column = index - text.rfind("\n", 0, index)
    return f" (line {line}, column {column}; it would be read as infinity)"


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _Overflow(ValueError):
    def __init__(self, literal: str) -> None:
        super().__init__(literal)
        self.literal = literal


_INF = math.inf


def _finite_float(literal: str) -> float:
    """``float(literal)``, refusing a number past a float's range (``1e999``), which would become infinity."""
    value = float(literal)
    if value == _INF or value == -_INF:
        raise _Overflow(literal)
    return value


_STRICT = json.JSONDecoder(
    object_pairs_hook=_refuse_duplicates, parse_constant=_no_constants, parse_float=_finite_float
)


def loads(text: str | None, *, where: str = "stored JSON") -> Any:
    """Parse stored canonical JSON strictly (see :func:`strict_loads`); ``None`` stays ``None``."""
    return None if text is None else strict_loads(text, where=where)


_MAX_NESTING = 900
"""Roughly where Python's JSON encoder runs out of recursion depth (the limit is 1,000 frames)."""


def _find_unserialisable(value: Any, path: str) -> tuple[str, str] | None:
    """The path of the first value JSON cannot represent and what it is, or ``None`` (depth-first, in order).

    Iterative, so a deeply nested value cannot exhaust the stack while its
    error message is being built.
    """
    stack: list[tuple[Any, str]] = [(value, path)]
    open_ids: set[int] = set()  # containers on the path to the current one: a cycle leads back to one
    exits: list[tuple[int, int]] = []  # (stack size at which a container is done, its id)
    while stack:
        while exits and len(stack) <= exits[-1][0]:
            open_ids.discard(exits.pop()[1])
        value, path = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return path, repr(value)
        if isinstance(value, int) and not isinstance(value, bool):
            digits = _too_many_digits(value)
            if digits:
                return path, digits
            continue
        if value is None or isinstance(value, (str, float, bool)):
            continue
        if isinstance(value, Mapping) or (isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray))):
            if id(value) in open_ids:
                return path, "a reference back to a value that contains it (a cycle)"
            if len(exits) >= _MAX_NESTING:
                return path, f"nested more than {_MAX_NESTING} levels deep"
            children: list[tuple[Any, str]] = []
            if isinstance(value, Mapping):
                for key, item in value.items():
                    if not isinstance(key, str):
                        return f"{path}[{key!r}]", f"a key of type {type(key).__name__}"
                    children.append((item, f"{path}.{key}"))
            else:
                children = [(item, f"{path}[{index}]") for index, item in enumerate(value)]
            exits.append((len(stack), id(value)))
            open_ids.add(id(value))
            stack.extend(reversed(children))
            continue
        return path, f"a {type(value).__name__}"
    return None


def int_digits(value: int) -> int:
    """About how many decimal digits ``value`` has (without converting it, which Python refuses past 4,300)."""
    return int(abs(value).bit_length() * 0.30103) + 1


def _too_deep(where: str) -> str:
    return f"{where} is nested too deeply for JSON (Python's encoder stops near 1,000 levels)"


def _too_many_digits(value: int) -> str | None:
    """Why JSON cannot write the int ``value`` (more decimal digits than Python converts), or ``None``."""
    try:
        str(value)
    except ValueError:  # sys.get_int_max_str_digits(): 4,300 by default
        return f"an int of about {int_digits(value)} digits (more than {sys.get_int_max_str_digits()})"
    return None
