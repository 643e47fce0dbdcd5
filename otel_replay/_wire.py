"""Protocol Buffers' unsigned varint, encoded: the one encoder the write-ahead record and log record writers share."""

from __future__ import annotations

__all__ = ["SMALL_VARINTS", "varint", "varint_of"]


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
