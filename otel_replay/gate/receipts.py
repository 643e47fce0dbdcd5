"""The stored form of a rail's receipt, and the id that names it: both total functions.

A rail's ``commit`` has already moved the money when the gate records its
receipt, so recording must not fail on what the rail returned:
:func:`stored_receipt` turns any receipt into JSON that canonical JSON accepts
(a ``Decimal`` or ``datetime`` becomes its text, an object JSON cannot hold
becomes ``{"receipt_id", "repr"}``), and :func:`receipt_id_of` names it the
same way in the process that committed and in any later ``replay --execute``
that reads it back, so both derive the same idempotency key.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Mapping
from typing import Any

from otel_replay._receipt_id import receipt_id_of
from otel_replay.gate.rails import Receipt

__all__ = ["RECEIPT_TYPE", "RECEIPT_TYPE_KEY", "receipt_id_of", "stored_receipt"]

_DEPTH = 32  # deeper receipts are cut (a receipt is a handful of fields; this only stops runaway nesting)
_NODES = 10_000  # containers and values past this many are cut: a shared sub-object is expanded at each use
_HUGE_INT_BITS = 13_000  # past ~4,000 digits str(int) raises (sys.int_info.str_digits_check_threshold)


def _text(value: str) -> str:
    """``value`` as text UTF-8 can hold (a lone surrogate would fail the seal's encoding)."""
    if value.isascii():  # most text: ASCII holds no surrogate (a flag CPython keeps, so no copy is made to know)
        return value
    try:
        value.encode()
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode()
    return value


def _plain(value: Any, depth: int, path: set[int] | None = None, budget: list[int] | None = None) -> Any:
    """``value`` with everything JSON cannot hold replaced by its text.

    A container already on the path from the root (a receipt that refers back
    to itself) becomes ``"<cycle>"``, and past :data:`_NODES` values the rest
    is cut, so an object graph with back-references or shared parts cannot
    make this walk exponential.
    """
    if budget is None:
        budget = [_NODES]
    budget[0] -= 1
    if budget[0] < 0:
        return f"<cut: more than {_NODES} values>"
    if value is None or value is True or value is False:
        return value
    cls = value.__class__
    if cls is str:  # the exact built-in types first: what a receipt holds, without an ABC check each
        return _text(value)
    if cls is int:
        return value if value.bit_length() < _HUGE_INT_BITS else hex(value)
    if cls is float:
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return _text(str.__str__(value))
    if isinstance(value, bool):  # a bool subclass
        return bool(value)
    if isinstance(value, int):
        return int(value) if value.bit_length() < _HUGE_INT_BITS else hex(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else str(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return _safe_str(value.isoformat())  # exact text, whatever a subclass's isoformat returns
    if depth >= _DEPTH:
        return f"<cut: nested deeper than {_DEPTH} levels>"
    if cls is not dict and cls is not list and not isinstance(value, (Mapping, list, tuple)):
        return _safe_str(value)
    path = set() if path is None else path
    if id(value) in path:
        return "<cycle>"
    path.add(id(value))
    try:
        if cls is dict or isinstance(value, Mapping):
            return {
                (k if k.__class__ is str and k.isascii() else _key(k)): _plain(v, depth + 1, path, budget)
                for k, v in value.items()
            }
        return [_plain(item, depth + 1, path, budget) for item in value]
    finally:
        path.discard(id(value))


def _key(key: Any) -> str:
    """A mapping key as exact text: a ``str`` subclass's own characters (its methods are not called), else its text."""
    return _text(str.__str__(key)) if isinstance(key, str) else _safe_str(key)


def _safe_str(value: Any) -> str:
    """``value``'s text as an exact ``str`` (a ``__str__`` may return a subclass of it)."""
    try:
        text = str(value)
        return _text(text if text.__class__ is str else str.__str__(text))
    except Exception:  # a broken __str__: the type still says what it was
        return f"<{type(value).__name__}>"


def _safe_repr(value: Any) -> str:
    try:
        return _text(repr(value))[:2000]
    except Exception:
        return f"<{type(value).__name__}>"


def stored_receipt(receipt: Any) -> Any:
    """The JSON value the gate stores for ``receipt``; never raises.

    ``receipt.to_json()`` when the receipt has one (a :class:`~otel_replay.gate.rails.Receipt`),
    else the receipt itself when it is JSON-like (a mapping, list, string or
    number), else a dataclass's fields; values JSON cannot hold are stored as
    their text (dates as ISO 8601), a back-reference to a container on the
    path as ``"<cycle>"``, and values past the 10,000th are cut. A
    :class:`~otel_replay.gate.rails.Receipt` is marked (``"otel_replay.type":
    "Receipt"``) so that only it is rebuilt as one at compensation. Anything
    else, or a receipt whose conversion raises anything, is stored as
    ``{"receipt_id": ..., "repr": repr(receipt)}``.
    """
    if receipt is None:
        return None
    try:
        return _stored(receipt)
    except Exception:  # noqa: BLE001 - whatever the receipt object does: the rail has already moved the money
        pass
    try:
        rid = getattr(receipt, "receipt_id", None)
    except Exception:  # noqa: BLE001 - a property that raises
        rid = None
    return {"receipt_id": _safe_str(rid) if rid is not None else None, "repr": _safe_repr(receipt)}


def _stored(receipt: Any) -> Any:
    """:func:`stored_receipt`'s JSON-like path; may raise (then the receipt is stored as id plus repr)."""
    value: Any = receipt
    to_json = getattr(receipt, "to_json", None)
    if callable(to_json):
        value = to_json()
    elif dataclasses.is_dataclass(receipt) and not isinstance(receipt, type):
        value = dataclasses.asdict(receipt)
    # A dict, what most rails return, first: the ABC check of Mapping costs more than the rest of the test.
    if value.__class__ is not dict and not isinstance(value, (Mapping, list, tuple, str, int, float)):
        raise TypeError(f"not JSON-like: {type(value).__name__}")
    # What _plain returns canonical JSON always holds (exact built-in types, text UTF-8 can hold, finite
    # floats, ints of printable size, text keys, at most _DEPTH levels): it is not encoded here only to be sure.
    return _marked(receipt, _plain(value, 0))


RECEIPT_TYPE_KEY = "otel_replay.type"
"""Key of the marker :func:`stored_receipt` adds to a :class:`~otel_replay.gate.rails.Receipt`'s stored form."""
RECEIPT_TYPE = "Receipt"


def _marked(receipt: Any, plain: Any) -> Any:
    """``plain``, marked as made from otel-replay's ``Receipt`` when it was (so only then is one rebuilt)."""
    if type(receipt) is Receipt and isinstance(plain, dict):
        return {**plain, RECEIPT_TYPE_KEY: RECEIPT_TYPE}
    return plain



