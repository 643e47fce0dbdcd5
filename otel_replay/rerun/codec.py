"""How recorded values and arguments become stable JSON, hashes and redacted text.

Two encodings:

* :func:`encode_value` / :func:`decode_value` round-trip the values a boundary
  returns exactly, so a rerun serves back what the original run received: only
  exact types are accepted (a subclass could carry more than its base holds);
  named tuples, enums, ``OrderedDict``, ``bytearray``, ``Decimal``, sets and the
  ``datetime`` values carry a tag that rebuilds them; anything else raises
  ``TypeError`` (stored as ``$unrecordable``, which a rerun refuses to serve);
* :func:`stable_json` turns call arguments into canonical JSON for hashing. Value
  types JSON cannot hold are encoded by value (``Decimal``, ``datetime``, enums,
  UUIDs, dataclasses, pydantic models, sets ...); a value with no stable value
  representation becomes ``{"$unmatchable": what}``, found by :func:`unmatchable`,
  and a rerun never matches such a call. One bad value never hides the others.

The argument encoding is versioned (:data:`ARGUMENTS_CODEC`, implied by the
recording's format): a recording made with codec 1 is rerun with codec 1, so
its hashes still match (:func:`arguments_codec`).

Redaction is :mod:`otel_replay.redaction`'s, applied at record time and at match time alike. A rerun of
a recording made before codec 3 redacts with the rules it was recorded with (its HTTP arguments were
matched redacted), kept here frozen.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import datetime as _dt
import decimal
import enum
import fractions
import hashlib
import hmac
import json
import pathlib
import re
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from otel_replay import redaction
from otel_replay._json import canonical_json
from otel_replay._seam import ARGUMENTS_CODEC, arguments_codec, current_codec
from otel_replay.errors import CaptureError
from otel_replay.gate import Receipt
from otel_replay.records import Action
from otel_replay.redaction import REDACTED, redact_headers

__all__ = [
    "ARGUMENTS_CODEC",
    "RECORDING_FORMAT",
    "REDACTED",
    "arguments_codec",
    "arguments_hash",
    "arguments_key",
    "keyed",
    "keyed_digest",
    "match_key",
    "codec_of_format",
    "current_codec",
    "decode_result",
    "decode_value",
    "decoded_json_text",
    "digest_key",
    "digest_with",
    "encode_result",
    "encode_value",
    "output_hash",
    "redact_headers",
    "redact_json_text",
    "redact_partial_json",
    "redact_url",
    "stable_json",
    "text_hash",
    "tree_json",
    "unmatchable",
]

RECORDING_FORMAT = 4
"""The recording format written. Format 2 is format 1's events with codec 2; format 3 is format 2's
events with codec 3; format 4 is format 3's events with codec 4 (old readers refuse each newer one).
A recording is rerun with the rules of its own format."""


def codec_of_format(version: int) -> int:
    """The argument codec (and so the matching rules) a recording of format ``version`` was made with."""
    return 1 if version < 2 else min(version, ARGUMENTS_CODEC)


# --- codec 1: kept byte for byte, for recordings made with it -------------------------------------------
_stable_v1 = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=lambda o: _opaque_v1(o)
)


def _opaque_v1(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": hashlib.sha256(bytes(value)).hexdigest()}
    if isinstance(value, (set, frozenset)):
        return sorted(_stable_json_v1(v) for v in value)
    if isinstance(value, uuid.UUID):
        return {"$uuid": value.hex}
    return {"$object": f"{type(value).__module__}.{type(value).__qualname__}"}


def _stable_json_v1(value: Any) -> str:
    try:
        return _stable_v1.encode(value)
    except (ValueError, TypeError):  # circular reference; a non-string key (never in a codec-1 recording)
        return json.dumps({"$object": type(value).__qualname__})
    except RecursionError:
        return json.dumps({"$object": f"{type(value).__qualname__} nested too deeply to encode"})


# --- codec 2: every value by value, or marked unmatchable ---------------------------------------------
_dumps = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


def _tree_encoder() -> Callable[[Any], str]:
    """:data:`_dumps` for a tree of plain JSON values (no container inside itself): one C encoder, built once.

    ``JSONEncoder.encode`` builds a new C encoder, with a dict to catch a container inside itself, on every
    call: a few microseconds per boundary call, more than encoding a small value. What :func:`_canon` returns
    and what ``json.loads`` returns are trees, so one encoder without that check writes the same text for
    them. Used only when it writes exactly :data:`_dumps`'s text on a sample (else :data:`_dumps` itself: a
    Python whose ``json`` has no C encoder, or another signature).
    """
    plain = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    make: Any = getattr(json.encoder, "c_make_encoder", None)
    basestring: Any = getattr(json.encoder, "c_encode_basestring", None)
    if make is None or basestring is None:
        return _dumps
    try:
        once = make(None, plain.default, basestring, None, ":", ",", True, False, True)
    except TypeError:
        return _dumps

    def encode(value: Any) -> str:
        return "".join(once(value, 0))

    sample = [{"b": [1, 2.5, -0.0, 1e300, None, True], "a": 'é"\n\u2028', "$c": {}}, "x", 10**30, float("nan")]
    try:
        same = encode(sample) == _dumps(sample) and encode("é") == _dumps("é") and encode(7) == _dumps(7)
    except Exception:
        same = False
    return encode if same else _dumps


_dumps_tree = _tree_encoder()


def tree_json(value: Any) -> str:
    """Canonical JSON (keys sorted, no spaces, UTF-8 kept) of a tree of plain JSON values.

    Dicts with ``str`` keys, lists, text, numbers, booleans and ``None``, no container inside itself (as
    ``json.loads`` or a literal makes them): the text ``json.dumps(value, sort_keys=True, ensure_ascii=False,
    separators=(",", ":"))`` writes, without building an encoder per call.
    """
    return _dumps_tree(value)


_MAX_DEPTH = 256
_MAX_NODES = 1_000_000
"""Values one :func:`stable_json` call walks at most; past it the whole value is unmatchable (a DAG that
fans out, a huge nested structure: hashing it must not cost the agent seconds)."""
_BIG_ARRAY = 4096
"""NumPy arrays with more elements than this are hashed (dtype, shape, content digest), not listed."""
_BIG_INT_BITS = 13_000
"""Ints wider than this (about 3,900 digits) are written in hex: ``int``'s decimal form stops at 4,300 digits."""
_REAL_DATETIME, _REAL_DATE, _REAL_TIME, _REAL_TIMEDELTA = _dt.datetime, _dt.date, _dt.time, _dt.timedelta
_UNMATCHABLE = '{"$unmatchable":'


_only_numbers = frozenset({float, bool, type(None)}).issuperset


def _path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _text_ok(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (os.fsdecode of a non-UTF-8 name): not storable as is
        return False
    return True


def _surrogates(text: str) -> dict[str, str]:
    return {"$surrogates": text.encode("utf-8", "surrogatepass").hex()}


class _Walk:
    """The state of one :func:`stable_json` walk: the containers on the current path, and the values seen."""

    __slots__ = ("nodes", "on_path")

    def __init__(self) -> None:
        self.on_path: dict[int, int] = {}
        """``id()`` of each value on the path from the root to here, with its level (for back-references)."""
        self.nodes = 0


class _TooBig(Exception):
    """The walk went over :data:`_MAX_NODES`: the whole value is marked, not a piece of it."""


def _canon(value: Any, walk: _Walk) -> Any:
    """``value`` as plain JSON that only an equal value maps to (one failing value is marked, not raised)."""
    cls = value.__class__
    walk.nodes += 1
    if value is None or cls is bool or cls is float:
        return value
    if cls is str:
        return value if _text_ok(value) else _surrogates(value)
    if cls is int:
        return value if value.bit_length() <= _BIG_INT_BITS else {"$int": format(value, "x")}
    if walk.nodes > _MAX_NODES:
        raise _TooBig
    key, level = id(value), len(walk.on_path)
    back = walk.on_path.get(key)
    if back is not None:  # a value that contains itself (a parent pointer): how many levels up, stably
        return {"$cycle": level - back}
    if level > _MAX_DEPTH:
        return {"$unmatchable": f"a value nested deeper than {_MAX_DEPTH} levels"}
    if cls is list or cls is tuple:
        if _only_numbers(map(type, value)):  # a vector of floats (an embedding): no walk per element
            return value
        if walk.nodes + len(value) > _MAX_NODES:
            raise _TooBig
    elif cls is dict and walk.nodes + len(value) > _MAX_NODES:
        raise _TooBig
    walk.on_path[key] = level
    try:
        if cls is list or cls is tuple:
            return [_canon(v, walk) for v in value]
        if cls is dict:
            return _canon_dict(value, walk)
        return _canon_typed(value, cls, walk)
    except _TooBig:
        raise
    except RecursionError:
        return {"$unmatchable": f"{_path(cls)} nested too deeply to encode"}
    except Exception as exc:  # a broken __eq__, model_dump, property ...: this value only, named
        return {"$unmatchable": f"{_path(cls)} ({type(exc).__name__} while encoding it)"}
    finally:
        del walk.on_path[key]


def _canon_dict(value: Mapping[Any, Any], walk: _Walk) -> Any:
    if all(k.__class__ is str for k in value):
        # "$" keys are ours (tags): a caller's own "$x" key is written "$$x", so no argument forges a tag
        return {
            ("$" + k if k.startswith("$") else k) if _text_ok(k) else "$surrogates:" + _surrogates(k)["$surrogates"]: (
                _canon(v, walk)
            )
            for k, v in value.items()
        }
    pairs = [(_dumps_tree(_canon(k, walk)), _canon(v, walk)) for k, v in value.items()]
    return {"$items": sorted(pairs, key=lambda pair: pair[0])}


def _canon_numpy(value: Any, cls: type, walk: _Walk) -> Any:
    """A NumPy array or scalar: small ones by value; a large array of plain numbers by dtype, shape and digest."""
    dtype = getattr(value, "dtype", None)
    size = getattr(value, "size", 1)
    if dtype is not None and not dtype.hasobject and isinstance(size, int) and size > _BIG_ARRAY:
        digest = hashlib.sha256(value.tobytes(order="C")).hexdigest()  # tobytes: C order whatever the strides
        return {"$numpy": [_path(cls), dtype.str, list(value.shape), digest]}
    walk.nodes += size if isinstance(size, int) else 0
    if walk.nodes > _MAX_NODES:
        raise _TooBig
    return {"$numpy": [_path(cls), str(dtype if dtype is not None else ""), _canon(value.tolist(), walk)]}


def _zone(tzinfo: Any) -> Any:
    if tzinfo is None:
        return None
    text = repr(tzinfo)
    if " at 0x" in text:  # a default repr names a memory address: no value to compare
        return {"$unmatchable": f"time zone {_path(type(tzinfo))}"}
    return text


_BASE_VALUES: tuple[tuple[type, Callable[[Any], Any]], ...] = (
    (str, str.__str__),
    (int, int.__int__),
    (float, float.__float__),
    (list, list.copy),
    (tuple, lambda value: tuple.__getitem__(value, slice(None))),
)
"""The value a subclass of a JSON type holds, read through the base type's own method: ``str(v)`` would call an
overriding ``__str__`` (a masking string type), and two different values would hash the same."""


def _canon_typed(value: Any, cls: type, walk: _Walk) -> Any:
    if isinstance(value, enum.Enum):
        return {"$enum": [_path(cls), _canon(value.value, walk)]}
    if isinstance(value, tuple) and hasattr(cls, "_fields"):
        return {"$namedtuple": [_path(cls), _canon(dict(zip(cls._fields, value, strict=False)), walk)]}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, _REAL_DATETIME):
        return {"$datetime": value.isoformat(), "tz": _zone(value.tzinfo)}
    if isinstance(value, _REAL_DATE):
        return {"$date": value.isoformat()}
    if isinstance(value, _REAL_TIME):
        return {"$time": value.isoformat(), "tz": _zone(value.tzinfo)}
    if isinstance(value, _REAL_TIMEDELTA):
        return {"$timedelta": [value.days, value.seconds, value.microseconds]}
    if isinstance(value, uuid.UUID):
        return {"$uuid": value.hex}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": [_path(cls), hashlib.sha256(bytes(value)).hexdigest()]}
    if isinstance(value, (set, frozenset)):
        items = sorted(((_dumps_tree(item), item) for item in (_canon(v, walk) for v in value)), key=lambda p: p[0])
        return {"$set": [_path(cls), [item for _, item in items]]}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _canon(getattr(value, f.name), walk) for f in dataclasses.fields(value)}
        return {"$dataclass": [_path(cls), fields]}
    if hasattr(cls, "model_fields") and hasattr(value, "model_dump"):  # pydantic 2
        return {"$model": [_path(cls), _canon(value.model_dump(), walk)]}
    if hasattr(cls, "__attrs_attrs__"):
        fields = {a.name: _canon(getattr(value, a.name), walk) for a in cls.__attrs_attrs__}
        return {"$attrs": [_path(cls), fields]}
    if isinstance(value, (fractions.Fraction, complex)):
        return {"$number": [_path(cls), str(value)]}
    if isinstance(value, pathlib.PurePath):
        return {"$path": [_path(cls), str(value)]}
    if isinstance(value, range):
        return {"$range": [value.start, value.stop, value.step]}
    if isinstance(value, type):
        return {"$type": _path(value)}
    if cls.__module__.startswith("numpy") and hasattr(value, "tolist"):
        return _canon_numpy(value, cls, walk)
    if isinstance(value, Mapping):  # a mappingproxy, a frozendict, a dict subclass: its items and its type
        return {"$mapping": [_path(cls), _canon(dict(value.items()), walk)]}
    if isinstance(value, collections.deque):
        return {"$typed": [_path(cls), _canon(list(value), walk)]}
    for base, plain in _BASE_VALUES:  # a subclass of a value type: its value (not its own __str__ ...) and its type
        if isinstance(value, base):
            return {"$typed": [_path(cls), _canon(plain(value), walk)]}
    # An object with no value representation (a client, a lock, a closure, a generator ...): never matched.
    return {"$unmatchable": _path(cls)}


def stable_json(value: Any) -> str:
    """Canonical JSON of call arguments, for hashing (codec :data:`ARGUMENTS_CODEC` unless told otherwise).

    Never raises: a value with no stable value representation is written
    ``{"$unmatchable": what}`` (see :func:`unmatchable`), the others as they are.
    """
    if current_codec() == 1:
        return _stable_json_v1(value)
    try:
        return _dumps_tree(_canon(value, _Walk()))
    except _TooBig:
        return _dumps({"$unmatchable": f"{_path(type(value))} holding more than {_MAX_NODES} values"})
    except (RecursionError, ValueError) as exc:  # the caller's stack was already nearly full
        return _dumps({"$unmatchable": f"{_path(type(value))} ({type(exc).__name__} while encoding it)"})


def stable_json_in(codec: int, value: Any) -> str:
    """:func:`stable_json` of ``value`` under argument ``codec`` (whatever codec is in force now)."""
    with arguments_codec(codec):
        return stable_json(value)


_LONG_DIGITS = re.compile(r"[0-9]{3900}")
"""A run of digits as long as an int too wide for :func:`stable_json`'s decimal form (it writes those in hex)."""


def decoded_json_text(value: Any) -> str | None:
    """:func:`stable_json` of a value decoded from JSON text, by the C encoder in one pass (or ``None``).

    ``None`` when that text could differ from :func:`stable_json`'s: then call it. Only for values made of the
    exact types ``json.loads`` returns (``dict`` with ``str`` keys, ``list``, ``str``, ``int``, ``float``,
    ``bool``, ``None``), as a loaded recording's values are: the encoder would take a subclass (an ``IntEnum``)
    for its base. For such values :func:`stable_json`'s walk changes nothing unless the value has a ``"$"`` key
    (escaped), a string with a lone surrogate (tagged), an int wider than :data:`_BIG_INT_BITS` (hex), nesting
    deeper than :data:`_MAX_DEPTH` or more than :data:`_MAX_NODES` values (unmatchable); the text is returned
    only when it shows none of them.
    """
    if current_codec() == 1:
        return None
    try:
        text = _dumps_tree(value)  # a tree: json.loads made it
    except (ValueError, TypeError, RecursionError):
        return None
    if (
        len(text) >= _MAX_NODES  # every value takes a character at least: fewer characters, fewer values
        or '"$' in text  # a "$" key, or (needlessly, but safely) a string that starts with "$"
        or text.count("[") + text.count("{") > _MAX_DEPTH  # no deeper than there are brackets at all
        or (len(text) >= 3900 and _LONG_DIGITS.search(text) is not None)
        or not _text_ok(text)
    ):
        return None
    return text


def unmatchable(arguments_text: str) -> str | None:
    """What in :func:`stable_json` text has no value representation (``None``: every value has one)."""
    if current_codec() == 1:
        return None
    at = arguments_text.find(_UNMATCHABLE)
    if at < 0:
        return None
    try:
        found, _ = json.JSONDecoder().raw_decode(arguments_text, at)
        return str(found["$unmatchable"])
    except (ValueError, KeyError, TypeError):  # pragma: no cover - the tag is always complete JSON
        return "an argument"


def output_hash(value: Any) -> str:
    """The hash of what an entrypoint returned, compared by value between a recording and its rerun."""
    return text_hash(stable_json(value))


def text_hash(text: str) -> str:
    """:func:`output_hash` of the value whose :func:`stable_json` text is ``text`` (not walked again)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


_key: bytes | None = None
"""The key :func:`arguments_hash` is keyed with now (codec 3 and later): the key of the recording being made or
rerun (see :func:`match_key`), installed for its length by the interceptor; ``None``: a plain SHA-256."""

_MATCH_KEY_LABEL = b"otel-replay argument match key v1"


def match_key(secret: bytes) -> bytes:
    """The argument-hash key of a recording sealed with the signing key ``secret``.

    Derived (HMAC of a fixed label) rather than the signing secret itself, so a hash of arguments can never
    be taken for a record signature or the other way round. A reader of the dataset has the seals and the
    hashes but not the secret, so a short or guessable argument cannot be tested against its hash offline;
    a rerun verifies each chunk's seal with that signing key, so it derives the same key.
    """
    return hmac.new(secret, _MATCH_KEY_LABEL, hashlib.sha256).digest()


@contextmanager
def arguments_key(key: bytes | None) -> Iterator[None]:
    """Key the argument hashes with ``key`` inside (process-wide, as one recording or rerun runs at a time)."""
    global _key
    previous, _key = _key, key
    try:
        yield
    finally:
        _key = previous


def keyed_digest(data: bytes) -> str:
    """A hex digest of ``data``: HMAC-SHA256 under the key in force (codec 3 and later), else plain SHA-256."""
    return digest_with(digest_key(), data)


def digest_key() -> bytes | None:
    """The key :func:`keyed_digest` uses now (``None``: a plain SHA-256), for a digest computed later.

    A text built after the call that needs it (an HTTP request's stored text, read only when a divergence
    shows it) is digested with the key of the moment the call was made, through :func:`digest_with`.
    """
    return _key if current_codec() >= 3 else None


def digest_with(key: bytes | None, data: bytes) -> str:
    """:func:`keyed_digest` under ``key`` (from :func:`digest_key`): HMAC-SHA256, or SHA-256 when ``None``."""
    if key is None:
        return hashlib.sha256(data).hexdigest()
    keyed_state = _keyed_states.get(key)
    if keyed_state is None:
        if len(_keyed_states) >= 4:  # one recording's key at a time, in practice
            _keyed_states.clear()
        keyed_state = _keyed_states[key] = hmac.new(key, digestmod=hashlib.sha256)
    mac = keyed_state.copy()  # the key's padded state, copied: not derived again for each digest
    mac.update(data)
    return mac.hexdigest()


_keyed_states: dict[bytes, hmac.HMAC] = {}
"""An HMAC-SHA256 with nothing fed yet, per key in use: the copy of one is a fresh HMAC under that key."""


def keyed() -> bool:
    """Whether :func:`keyed_digest` is keyed now (codec 3 and later, under a recording's key)."""
    return current_codec() >= 3 and _key is not None


def arguments_hash(boundary: str, name: str, arguments_text: str) -> str:
    """The short hash that matches a rerun step against a recorded one.

    Keyed (HMAC-SHA256 under the recording's :func:`match_key`) with codec 3 and later, so the stored hash of
    arguments that held a secret does not let anyone test guesses of that secret offline; codecs 1 and 2
    keep their plain SHA-256, so their recordings still match.
    """
    # Length-prefixed framing: unambiguous, and no escaping pass over a large body.
    head = f"{len(boundary)}:{boundary}{len(name)}:{name}"
    return keyed_digest((head + arguments_text).encode("utf-8", "surrogatepass"))[:32]


def _resolve(path: str) -> Any:
    """The class at ``module:qualname``, looked up in modules already imported (a rerun never imports code)."""
    module_name, _, qualname = path.partition(":")
    found: Any = sys.modules.get(module_name)
    for part in qualname.split(".") if found is not None else ("",):
        found = getattr(found, part, None)
    if not isinstance(found, type):
        raise LookupError(f"cannot rebuild a recorded {path}: the class is not loaded in this run")
    return found


def _exact_time(value: Any, parse: Any) -> str:
    """The ISO text of a datetime or time that parses back to the same value, zone and fold; else TypeError."""
    text = value.isoformat()
    back = parse(text)
    if back != value or back.fold != value.fold or repr(back.tzinfo) != repr(value.tzinfo):
        raise TypeError(f"{_path(type(value))} with time zone {value.tzinfo!r} cannot be recorded exactly")
    return str(text)


def encode_value(value: Any) -> Any:
    """A returned value as plain JSON that :func:`decode_value` turns back into an equal value of the same type.

    Exact types only: a subclass of ``dict``, ``tuple``, ``int`` ... is not taken
    for its base (the program would get another type back); the subclasses it
    knows carry a tag. Raises ``TypeError`` naming a type it cannot rebuild.
    """
    cls = value.__class__
    if value is None or cls is bool:
        return value
    if cls is str:
        return value if _text_ok(value) else {"$str": value.encode("utf-8", "surrogatepass").hex()}
    if cls is int:
        return value if value.bit_length() <= _BIG_INT_BITS else {"$int": format(value, "x")}
    if cls is float:
        if value != value or value in (float("inf"), float("-inf")):
            return {"$float": repr(value)}
        return value
    if cls is list:
        return [encode_value(v) for v in value]
    if cls is dict:
        if all(k.__class__ is str and _text_ok(k) for k in value):
            keys = list(value)
            if keys != sorted(keys):  # stored JSON sorts keys: the order the program saw is kept as pairs
                return {"$ordered": [[k, encode_value(v)] for k, v in value.items()]}
            if any(k.startswith("$") for k in value):
                return {"$dict": {k: encode_value(v) for k, v in value.items()}}
            return {k: encode_value(v) for k, v in value.items()}
        return {"$items": [[encode_value(k), encode_value(v)] for k, v in value.items()]}
    if cls is tuple:
        return {"$tuple": [encode_value(v) for v in value]}
    if cls is bytes:
        return {"$b64": base64.b64encode(value).decode("ascii")}
    return _encode_typed(value, cls)


def _encode_typed(value: Any, cls: type) -> Any:
    if cls is bytearray:
        return {"$bytearray": base64.b64encode(value).decode("ascii")}
    if cls is uuid.UUID:
        return {"$uuid": str(value)}
    if cls is decimal.Decimal:
        return {"$decimal": str(value)}
    if cls is _REAL_DATETIME:
        return {"$datetime": _exact_time(value, _REAL_DATETIME.fromisoformat)}
    if cls is _REAL_DATE:
        return {"$date": value.isoformat()}
    if cls is _REAL_TIME:
        return {"$time": _exact_time(value, _REAL_TIME.fromisoformat)}
    if cls is _REAL_TIMEDELTA:
        return {"$timedelta": [value.days, value.seconds, value.microseconds]}
    if cls is set or cls is frozenset:
        return {"$" + cls.__name__: [encode_value(v) for v in value]}
    if cls is collections.OrderedDict:
        return {"$ordereddict": [[encode_value(k), encode_value(v)] for k, v in value.items()]}
    if isinstance(value, enum.Enum) and "<locals>" not in cls.__qualname__:
        return {"$enum": [_path(cls), encode_value(value.value)]}
    named = isinstance(value, tuple) and isinstance(getattr(cls, "_fields", None), tuple)
    if named and "<locals>" not in cls.__qualname__:
        return {"$namedtuple": [_path(cls), [encode_value(v) for v in value]]}
    # defaultdict (its factory is code), dataclasses, models, other subclasses: no faithful rebuild.
    raise TypeError(f"{cls.__module__}.{cls.__qualname__} cannot be recorded")


def decode_value(value: Any) -> Any:
    """Inverse of :func:`encode_value` (``LookupError`` when a tagged class is not loaded in this run)."""
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1:
            ((tag, inner),) = value.items()
            if tag[:1] == "$":
                decoder = _DECODERS.get(tag)
                if decoder is not None:
                    return decoder(inner)
        return {k: decode_value(v) for k, v in value.items()}
    return value


def _decode_pairs(inner: Any) -> Any:
    return [(decode_value(k), decode_value(v)) for k, v in inner]


def _decode_enum(inner: Any) -> Any:
    return _resolve(inner[0])(decode_value(inner[1]))


def _decode_namedtuple(inner: Any) -> Any:
    return _resolve(inner[0])._make(decode_value(v) for v in inner[1])


_DECODERS: dict[str, Any] = {
    "$b64": base64.b64decode,
    "$uuid": uuid.UUID,
    "$tuple": lambda inner: tuple(decode_value(v) for v in inner),
    "$float": float,
    "$dict": lambda inner: {k: decode_value(v) for k, v in inner.items()},
    "$str": lambda inner: bytes.fromhex(inner).decode("utf-8", "surrogatepass"),
    "$int": lambda inner: int(inner, 16),
    "$items": lambda inner: dict(_decode_pairs(inner)),
    "$ordered": lambda inner: {k: decode_value(v) for k, v in inner},
    "$bytearray": lambda inner: bytearray(base64.b64decode(inner)),
    "$decimal": decimal.Decimal,
    "$datetime": _REAL_DATETIME.fromisoformat,
    "$date": _REAL_DATE.fromisoformat,
    "$time": _REAL_TIME.fromisoformat,
    "$timedelta": lambda inner: _REAL_TIMEDELTA(*inner),
    "$set": lambda inner: {decode_value(v) for v in inner},
    "$frozenset": lambda inner: frozenset(decode_value(v) for v in inner),
    "$ordereddict": lambda inner: collections.OrderedDict(_decode_pairs(inner)),
    "$enum": _decode_enum,
    "$namedtuple": _decode_namedtuple,
}


def redact_url(url: str) -> str:
    """``url`` with its password and secret query values redacted (:func:`otel_replay.redaction.redact_url`)."""
    return redaction.redact_url(url) if current_codec() >= 3 else _redact_v2(url)


def redact_partial_json(text: str) -> str:
    """JSON-like text that does not parse, redacted (:func:`otel_replay.redaction.redact_partial_json`)."""
    return redaction.redact_partial_json(text) if current_codec() >= 3 else _redact_partial_json_v2(text)


def redact_json_text(text: str) -> str:
    """A body or arguments text with secrets redacted (:func:`otel_replay.redaction.redact_json_text`)."""
    return redaction.redact_json_text(text) if current_codec() >= 3 else _redact_json_text_v2(text)


# --- the redaction of codecs 1 and 2, frozen: a format-2 recording's HTTP arguments were matched redacted -----
_V2_RUN = r"(?<![A-Za-z0-9_.+-])"
_V2_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY-----(?:.*?-----END[A-Z0-9 ]{0,40}PRIVATE KEY-----|.*\Z)", re.DOTALL
        ),
        REDACTED,
    ),
    (
        re.compile(_V2_RUN + r"([a-zA-Z][a-zA-Z0-9+.-]{1,20}://)([^\s:/@\"']{1,256}):([^\s@/\"']{1,256})@"),
        r"\1\2:" + REDACTED + "@",
    ),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 " + REDACTED),
    (re.compile(_V2_RUN + r"sk-(?:ant-|proj-)?[A-Za-z0-9_-]{16,}"), REDACTED),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), REDACTED),
    (re.compile(_V2_RUN + r"AIza[0-9A-Za-z_-]{35}"), REDACTED),
    (
        re.compile(
            r"(?i)([?&](?:[a-z0-9]+[_.-])*"
            r"(?:key|apikey|sig|signature|credentials?|token|secret|password|passwd|pwd|auth|authorization|session[_-]?id)=)([^&#\s\"']{1,2048})"
        ),
        r"\1" + REDACTED,
    ),
    (re.compile(_V2_RUN + r"gh[pousr]_[A-Za-z0-9]{30,}"), REDACTED),
    (re.compile(_V2_RUN + r"xox[abprs]-[A-Za-z0-9-]{10,}"), REDACTED),
    (re.compile(_V2_RUN + r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), REDACTED),
    (
        re.compile(
            r"(?i)(" + _V2_RUN + r"(?:[a-z0-9]+[_-])*(?:api[_-]?key|secret|password|passwd|pwd|token|access[_-]?key|"
            r"auth(?:orization)?|private[_-]?key)\b[\"']?\s*[:=]\s*[\"']?)([^\s\"',;}&]{3,})"
        ),
        r"\1" + REDACTED,
    ),
)
_V2_SECRET_KEY = re.compile(
    r"api[-_]?key|(access|refresh|id|auth|bearer)?[-_]?token|(client[-_])?secret|password|passwd"
    r"|authorization|private[-_]?key|session[-_]?id|cookie|signature|credentials?",
    re.IGNORECASE,
)
_V2_MAYBE_SECRET = re.compile(
    r"key|token|secret|passw|pwd|auth|cookie|session|signature|credential|bearer|basic|sk-|AKIA|ASIA|gh[pousr]_"
    r"|xox|eyJ|://[^/\s]*@",
    re.IGNORECASE,
)
_V2_JSON_STRING_MEMBER = re.compile(r'"((?:[^"\\]|\\.)*)"(\s*:\s*)"(?:[^"\\]|\\.)*("|\Z)', re.DOTALL)


def _redact_v2(text: str) -> str:
    for pattern, replacement in _V2_RULES:
        text = pattern.sub(replacement, text)
    return text


def _redact_tree_v2(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: REDACTED if _V2_SECRET_KEY.fullmatch(k) else _redact_tree_v2(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_tree_v2(v) for v in value]
    if isinstance(value, str):
        return _redact_v2(value)
    return value


def _redact_partial_json_v2(text: str) -> str:
    def member(match: re.Match[str]) -> str:
        if not _V2_SECRET_KEY.fullmatch(match.group(1)):
            return match.group(0)
        return f'"{match.group(1)}"{match.group(2)}"{REDACTED}{match.group(3)}'

    if "{" in text:
        text = _V2_JSON_STRING_MEMBER.sub(member, text)
    return _redact_v2(text)


def _redact_json_text_v2(text: str) -> str:
    if not _V2_MAYBE_SECRET.search(text):
        return text
    if text.lstrip()[:1] in ("{", "["):
        try:
            tree = json.loads(text)
            redacted = _redact_tree_v2(tree)
        except (ValueError, RecursionError):
            return _redact_partial_json_v2(text)
        if redacted == tree:
            return text
        return json.dumps(redacted, ensure_ascii=False, separators=(",", ":"))
    return _redact_v2(text)


def encode_result(value: Any) -> Any:
    """A tool's or a rail's result as plain JSON; a :class:`~otel_replay.gate.Receipt` keeps its type.

    A value that cannot be recorded becomes ``{"$unrecordable": why}``: a rerun
    refuses to serve it rather than run the tool again.
    """
    if isinstance(value, Receipt):
        data = value.to_json()
        try:  # a Decimal amount or an object in its details: stored as unrecordable, not dropped when written
            canonical_json(data, where="the Receipt")
        except CaptureError as exc:
            return {"$unrecordable": str(exc)}
        return {"$receipt": data}
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
        return Receipt.from_json(value["$receipt"])
    if isinstance(value, dict) and len(value) == 1 and "$action" in value:
        data = value["$action"]
        return Action(data["type"], data.get("arguments") or {}, cost=data.get("cost"))
    return decode_value(value)
