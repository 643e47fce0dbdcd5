"""Protocol Buffers' unsigned varint: the one encoder the writers share, and the one decoder of 64-bit varints.

The decoder serves every reader of 64-bit varints: the write-ahead log's
record walk, the log record wrapper, the request regrouper (protobuf), and
the Parquet footer reader (Thrift's compact protocol writes the same
encoding). Two readers of 32-bit Thrift lengths keep their own loop on
purpose (exporters/id_keys.py, query/files.py): they stop after five bytes.
"""

from __future__ import annotations

import mmap

__all__ = ["MAX_VARINT_BYTES", "SMALL_VARINTS", "read_varint", "varint", "varint_of"]

MAX_VARINT_BYTES = 10
"""The longest varint :func:`read_varint` reads (64 bits of value, seven a byte)."""


def varint_of(value: int) -> bytes:
    """The varint of ``value`` (>= 0), computed."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


SMALL_VARINTS = tuple(varint_of(n) for n in range(1 << 12))
"""The varints of 0 to 4,095 (lengths and counts of small fields), made once: a lookup instead of a loop."""


def varint(value: int) -> bytes:
    """The varint of ``value`` (>= 0), from the table when it is small."""
    return SMALL_VARINTS[value] if value < 4096 else varint_of(value)


def read_varint(data: bytes | bytearray | mmap.mmap, at: int, end: int | None = None) -> tuple[int, int]:
    """The unsigned varint at ``at`` and the position after it; ``(0, -1)`` when none ends before ``end``.

    ``end`` defaults to the length of ``data``. A varint longer than
    :data:`MAX_VARINT_BYTES` does not fit either: a reader of damaged or
    hostile bytes gets ``-1``, never a loop over the whole buffer. Callers
    that raise say so at their call (each has its own error for it).
    """
    stop = len(data) if end is None else end
    value = shift = 0
    while at < stop and shift < 7 * MAX_VARINT_BYTES:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
    return 0, -1
