"""The ids a span file holds, as 64-bit keys in its own Parquet footer: a lookup finds its files without reading them.

A writer that leaves many small files (a flush per commit, many short-lived
processes) makes a dataset whose every lookup would otherwise open every file
until a compaction indexes them. So each file :func:`write_partitions
<otel_replay.exporters.writer.write_partitions>` writes carries, in its
footer's key-value metadata under :data:`ID_KEYS_METADATA_KEY`, one key per
distinct (kind, id) of its rows: the id columns of
:data:`KEY_KINDS` and the decision id of its gate records (kept in their
attributes JSON, where no column holds it). A reader already reads each
footer's bytes to check the file; finding this value there costs a byte
search, not a Parquet read (:class:`~otel_replay.query.files.FileTriage`).

The value is taken from the footer's bytes only where the footer's last
bytes prove it is the writer's: its key-value pair must be followed, to the
very end of the footer, by nothing but the other pairs this writer puts
there (their values plain text), the writer's name and its column orders
(:func:`footer_keys`). A span value that happens to hold the same bytes sits
in the statistics, before them, and is never taken for it.

A key is the first 8 bytes of BLAKE2b over ``kind``, NUL, ``id``, as an
unsigned little-endian integer: the same in every process (unlike
``hash()``). Two ids sharing a key only make a lookup read a file it need
not read; no id is ever left out. A file with more than
:data:`MAX_FOOTER_KEYS` distinct keys, or whose gate records' decision ids
cannot be read, carries none: it is read by the lookup instead.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import struct
import sys
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "GATE_KIND",
    "ID_KEYS_METADATA_KEY",
    "KEY_KINDS",
    "MAX_FOOTER_KEYS",
    "absent_key",
    "decode_keys",
    "encode_keys",
    "footer_metadata",
    "footer_keys",
    "footer_tail",
    "id_key",
    "table_keys",
    "unpack_keys",
]

ID_KEYS_METADATA_KEY = b"otel_replay.id_keys"
"""The footer key-value metadata key holding a file's id keys (base64 of packed little-endian uint64)."""

GATE_KIND = "gate_decision_id"
"""The kind of a gate record's decision id (``replay.gate.decision_id`` in its attributes JSON)."""

KEY_KINDS = ("correlation_id", "trace_id", "session_id", "record_id", "outcome_decision_id", GATE_KIND)
"""The kinds of id a file's keys cover: five span columns and the gate records' decision id."""

MAX_FOOTER_KEYS = 4096
"""The most keys a footer carries (32 KiB of keys, 43 KiB of base64); a file with more carries none."""

_GATE_ATTRIBUTE = "replay.gate.decision_id"
_LITTLE = sys.byteorder == "little" and struct.calcsize("Q") == 8  # native uint64 is the stored layout
_PAIR = b"\x18" + bytes([len(ID_KEYS_METADATA_KEY)]) + ID_KEYS_METADATA_KEY + b"\x18"
# The other pairs a span file's footer may hold after the keys, each with what its value must look like.
_BASE64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
_VERSION = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789."
# The other pairs a span file's footer may hold after the keys: the bytes their values are made of, and a length cap.
_FOLLOWERS = {b"ARROW:schema": (_BASE64, 1 << 20), b"otel_replay.schema_version": (_VERSION, 64)}
_WRITER = re.compile(rb"[ -~]{1,256}")  # created_by: printable ASCII


def id_key(kind: str, value: str) -> int:
    """The 64-bit key of one (kind, id) pair (stable across processes)."""
    data = f"{kind}\x00{value}".encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def absent_key(kind: str) -> int:
    """The key a file is given for a kind it cannot be searched by (no id maps to it: no NUL follows the kind)."""
    return int.from_bytes(hashlib.blake2b(f"{kind}\x01absent".encode(), digest_size=8).digest(), "little")


class _Pairs(list[tuple[str, object]]):
    """A JSON object as its (key, value) pairs, duplicates kept (``json.loads``' ``object_pairs_hook``)."""


_orjson_loads: Any
try:
    from orjson import loads as _orjson_loads
except ImportError:  # pragma: no cover - orjson is a dependency; without it every gate row takes the slow path
    _orjson_loads = None

_QUOTED_GATE = f'"{_GATE_ATTRIBUTE}"'
_SCALARS = frozenset({str, int, float, bool, type(None)})
_SLOW = object()
"""A gate row the quick parse leaves to :func:`_slow_gate_decision_id`."""
_UNREADABLE = object()
"""A gate row whose decision id cannot be read as one string (the file then carries no keys)."""


def _quick_gate_decision_id(text: str) -> object:
    r"""What :func:`_slow_gate_decision_id` gives for ``text``, found without the pairs hook; or :data:`_SLOW`.

    Taken only when the text holds no ``\u`` (so any key equal to
    ``replay.gate.decision_id`` is spelled plainly: no other escape gives its
    characters) and ``"replay.gate.decision_id"`` at most once (so the object
    has that key at most once at its top level: a copy inside a nested JSON
    string is ``\"replay.gate.decision_id\"``, never counted; a count of two
    may be one key and a string's tail, which the slow path sorts out). orjson
    accepts no text ``json`` refuses but for nesting past ``json``'s recursion
    limit, so its answer is kept only for one object of scalars (nothing
    nested: ``json`` reads it too); a text it refuses (``NaN``, ``1e400``,
    which ``json`` reads) takes the slow path.
    """
    if "\\u" in text or text.count(_QUOTED_GATE) > 1:
        return _SLOW
    try:
        parsed = _orjson_loads(text)
    except ValueError:  # orjson's JSONDecodeError
        return _SLOW
    if parsed.__class__ is not dict or not _SCALARS.issuperset(map(type, parsed.values())):
        return _SLOW
    value = parsed.get(_GATE_ATTRIBUTE)
    return value if value is None or value.__class__ is str else _UNREADABLE


def _slow_gate_decision_id(text: str) -> object:
    """The decision id of one gate row's attributes JSON: a string, ``None`` (none) or :data:`_UNREADABLE`."""
    try:
        pairs = json.loads(text, object_pairs_hook=_Pairs)
    except (TypeError, ValueError):
        return _UNREADABLE
    values = [v for k, v in pairs if k == _GATE_ATTRIBUTE] if isinstance(pairs, _Pairs) else []
    if len(values) > 1:
        return _UNREADABLE  # the key twice: which one a query reads is not this module's to guess
    value = values[0] if values else None
    if value is not None and not isinstance(value, str):
        return _UNREADABLE  # a number or object: how a query would compare it as text is not this module's to guess
    return value


def _gate_decision_ids(table: pa.Table) -> list[str] | None:
    """The decision ids of ``table``'s gate records (``None``: one cannot be read as a string id).

    Each row's answer is :func:`_slow_gate_decision_id`'s; most rows' is
    found by :func:`_quick_gate_decision_id` instead, at about half its CPU
    (a log converting its gate records parses two such rows a trade).
    """
    if "replay_kind" not in table.column_names:
        return []
    is_gate = pc.fill_null(pc.equal(table.column("replay_kind"), "gate"), False)
    if not pc.any(is_gate).as_py():
        return []
    if "attributes" not in table.column_names:
        return None
    attributes = table.column("attributes").filter(is_gate)
    text_type = pa.types.is_string(attributes.type) or pa.types.is_large_string(attributes.type)
    quick = _orjson_loads is not None and text_type  # another type: json's verdict alone, as it always was
    found = []
    for text in attributes.to_pylist():
        if text is None:
            continue
        value = _quick_gate_decision_id(text) if quick else _SLOW
        if value is _SLOW:
            value = _slow_gate_decision_id(text)
        if value is _UNREADABLE:
            return None
        if isinstance(value, str):
            found.append(value)
    return found


def table_keys(table: pa.Table) -> list[int] | None:
    """The sorted distinct keys of ``table``'s ids (see the module docstring); ``None`` when it carries none.

    ``None`` when a kind's column is missing or not text, a gate record's
    decision id cannot be read, or there are more than :data:`MAX_FOOTER_KEYS`.
    """
    keys: set[int] = set()
    for kind in KEY_KINDS[:-1]:
        if kind not in table.column_names:
            return None
        column = table.column(kind)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            return None
        values = pc.unique(column).drop_null().to_pylist()
        keys.update(id_key(kind, value) for value in values)
        if len(keys) > MAX_FOOTER_KEYS:
            return None
    gates = _gate_decision_ids(table)
    if gates is None:
        return None
    keys.update(id_key(GATE_KIND, value) for value in gates)
    return sorted(keys) if len(keys) <= MAX_FOOTER_KEYS else None


def encode_keys(keys: Iterable[int]) -> bytes:
    """``keys`` as the footer value: base64 of each as 8 little-endian bytes."""
    keys = list(keys)
    return base64.b64encode(struct.pack(f"<{len(keys)}Q", *keys))  # one call for all (a file has thousands)


def unpack_keys(raw: bytes) -> bytes | None:
    """A footer value's keys as packed 8-byte little-endian integers (``None``: not one :func:`encode_keys` made)."""
    try:
        packed = binascii.a2b_base64(raw, strict_mode=True)  # base64.b64decode(validate=True), without its wrapper
    except (binascii.Error, ValueError):
        return None
    if len(packed) % 8 or len(packed) > 8 * MAX_FOOTER_KEYS:
        return None
    return packed


def decode_keys(raw: bytes) -> frozenset[int] | None:
    """The keys of a footer value (``None`` when it is not one :func:`encode_keys` made)."""
    packed = unpack_keys(raw)
    if packed is None:
        return None
    if _LITTLE:  # read in place (a lookup on a day of small files decodes one footer's keys per file)
        return frozenset(memoryview(packed).cast("Q"))
    return frozenset(struct.unpack(f"<{len(packed) // 8}Q", packed))


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """The unsigned varint at ``at`` and the position after it (``-1``: none fits).

    Not :func:`~otel_replay._wire.read_varint` on purpose: a Thrift length or
    list size is 32 bits, so this stops after five bytes, and a longer varint
    in a footer is not one the writer made.
    """
    value, shift = 0, 0
    while at < len(data) and shift < 35:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
    return 0, -1


def _text(data: bytes, at: int) -> tuple[bytes, int]:
    """A Thrift binary at ``at`` (varint length, bytes) and the position after it (``-1``: it does not fit)."""
    length, at = _varint(data, at)
    if at < 0 or at + length > len(data):
        return b"", -1
    return data[at : at + length], at + length


_KNOWN_TAILS: dict[bytes, bool] = {}
"""Verdicts of :func:`_tail_after` by the tail's bytes: one writer's files share it (their schema, name, orders)."""
_KNOWN_TAILS_MAX = 64


def _tail_after(footer: bytes, at: int) -> bool:
    """Whether ``footer`` from ``at`` is exactly: known key-value pairs, the writer's name, column orders, the end.

    ``at`` is just past the keys' pair (its closing stop byte included). The
    verdict depends on those bytes alone, so it is kept for the next footer
    that ends the same way (a day of small files from one writer: one walk).
    """
    tail = footer[at:]
    known = _KNOWN_TAILS.get(tail)
    if known is None:
        known = _walk_tail(tail)
        if len(_KNOWN_TAILS) < _KNOWN_TAILS_MAX:
            _KNOWN_TAILS[tail] = known
    return known


def _walk_tail(footer: bytes) -> bool:
    """:func:`_tail_after` of ``footer`` from its first byte, walked."""
    at = 0
    while at < len(footer) and footer[at] == 0x18 and footer[at + 1 : at + 2] != b"\x00":
        key, after = _text(footer, at + 1)
        allowed = _FOLLOWERS.get(key)
        if after < 0 or allowed is None:
            break  # not a pair this writer puts after the keys: the writer's name, checked below
        if footer[after : after + 1] == b"\x00":  # a pair without a value
            at = after + 1
            continue
        if footer[after : after + 1] != b"\x18":
            return False
        value, after = _text(footer, after + 1)
        if after < 0 or len(value) > allowed[1] or value.translate(None, allowed[0]):
            return False
        if footer[after : after + 1] != b"\x00":
            return False
        at = after + 1
    if footer[at : at + 1] != b"\x18":  # field 6, created_by
        return False
    writer, at = _text(footer, at + 1)
    if at < 0 or not _WRITER.fullmatch(writer):
        return False
    if footer[at : at + 1] == b"\x19":  # field 7, column_orders: a list of TypeDefinedOrder
        head = footer[at + 1] if at + 1 < len(footer) else 0
        if head & 0x0F != 0x0C:
            return False
        count, at = head >> 4, at + 2
        if count == 15:
            count, at = _varint(footer, at)
            if at < 0:
                return False
        if footer[at : at + 3 * count] != b"\x1c\x00\x00" * count:
            return False
        at += 3 * count
    return at == len(footer) - 1 and footer[at] == 0


def _keys_value(footer: bytes) -> tuple[bytes, int] | None:
    """The keys' raw value in ``footer`` and where its tail starts, when the tail is what this writer puts there."""
    at = footer.rfind(_PAIR)
    if at < 0:
        return None
    value, after = _text(footer, at + len(_PAIR))
    if after < 0 or footer[after : after + 1] != b"\x00" or not _tail_after(footer, after + 1):
        return None
    return value, after + 1


def footer_keys(footer: bytes) -> frozenset[int] | None:
    """The id keys a span file's Thrift footer carries, or ``None`` when it carries none this writer put there.

    See the module docstring: the value is taken only when what follows it,
    to the end of the footer, is what the writer puts after it.
    """
    found = _keys_value(footer)
    return None if found is None else decode_keys(found[0])


def footer_tail(footer: bytes) -> bytes | None:
    """The bytes after the id keys in a span file's footer (``None``: it carries none this writer put there).

    They hold the writer's Arrow schema, storage schema version, name and
    column orders, and nothing of the file's rows: one value for every file a
    writer makes with one schema (see :mod:`.key_log`).
    """
    found = _keys_value(footer)
    return None if found is None or decode_keys(found[0]) is None else footer[found[1] :]


def footer_metadata(table: pa.Table) -> dict[bytes, bytes]:
    """The key-value metadata that gives a file of ``table``'s rows its id keys (empty when it carries none).

    Written to the Parquet footer only, never into the Arrow schema stored
    there: the schema stays the same for every file of a writer, so readers
    still find one schema across them.
    """
    keys = table_keys(table)
    return {} if keys is None else {ID_KEYS_METADATA_KEY: encode_keys(keys)}
