"""A CRC-32 of a whole span file in its own footer: a reader knows the file is byte for byte what this writer wrote.

Compaction reads many small files a DuckDB chunk at a time, at about half
pyarrow's CPU, but DuckDB checks no page checksum and reads some damaged pages
(one flipped bit in a page header, its levels or its dictionary indices) as the
right number of rows with other values, which pyarrow refuses. Only a file whose
bytes are proved intact is handed to DuckDB (:mod:`otel_replay.storage.compact_duck`);
every other file (older versions, other writers, the Collector, a mismatch) is
read by pyarrow, which names the damage as before.

The writer (:func:`parquet_parts`) puts the pair ``otel_replay.crc32`` =
eight lowercase hex digits first among the footer's key-value metadata, so
:mod:`.id_keys` still finds its pair followed by what it expects. The CRC-32
(zlib's) covers every byte of the file, footer included, with the eight digits
read as ``00000000``; the file's name, its Arrow schema and every reader
(pyarrow, DuckDB, Spark) are unchanged: the pair is only footer metadata, not
part of the Arrow schema a reader returns. Compaction, which streams its
larger files to disk, adds the pair with placeholder digits
(:data:`UNSTAMPED`) and fills them in once the file is written
(:func:`stamp`): a compacted local file can be checked too. (An ``s3://``
object has none: it is uploaded as it is written.)

:func:`checksum_matches` reads the file's bytes (25 KB for a 10-span file: a
few µs of CRC) and answers whether the stored digits are the file's CRC. A
single flipped bit anywhere, a cut or an appended byte never matches; nor does
a file another writer rewrote from a table of ours (a stale pair, if any).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "CHECKSUM_KEY",
    "MAX_CHECKED_BYTES",
    "UNSTAMPED",
    "checksum_matches",
    "parquet_bytes",
    "parquet_parts",
    "stamp",
]

CHECKSUM_KEY = b"otel_replay.crc32"
"""The footer key-value metadata key of a file's CRC-32 (eight lowercase hex digits)."""

MAX_CHECKED_BYTES = 64 * 2**20
"""Files larger than this are never checked (read whole for it, one would cost more than pyarrow's read of it)."""

_PLACEHOLDER = b"00000000"
# A Thrift compact KeyValue: field 1 (binary) the key, field 2 (binary) of length 8 the value.
_PAIR = b"\x18" + bytes([len(CHECKSUM_KEY)]) + CHECKSUM_KEY + b"\x18\x08"
_MAGIC = b"PAR1"
_PIECE = 1 << 20  # bytes read at a time when a written file is read back for its CRC

UNSTAMPED: Mapping[bytes, bytes] = MappingProxyType({CHECKSUM_KEY: _PLACEHOLDER})
"""The footer pair a streaming writer adds (``ParquetWriter.add_key_value_metadata``), for :func:`stamp` to fill in."""


def parquet_parts(
    table: pa.Table,
    compression: str,
    footer: Mapping[bytes, bytes] | None = None,
    *,
    row_group_size: int | None = None,
    **kw: object,
) -> tuple[memoryview, ...]:
    """``table`` as a Parquet file whose footer carries its CRC-32 (then ``footer``'s pairs): its bytes in parts.

    Written in memory (a span file is a few MB; the exporter's largest, at
    its 128 MB buffer, some tens), the parts are written one after another:
    the digits are put in without a second copy of the file.
    ``row_group_size`` and ``kw``: more ``ParquetWriter`` options. (A pair of
    the same key in ``table``'s schema metadata, a stale one, is replaced by
    the file's own: pyarrow keeps one value a key.)
    """
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, table.schema, compression=compression, **kw) as writer:
        writer.write_table(table, row_group_size=row_group_size)
        writer.add_key_value_metadata({CHECKSUM_KEY: _PLACEHOLDER, **(footer or {})})
    data = memoryview(sink.getvalue())
    at = _value_at(data)
    if at is None:  # the writer laid the pair out otherwise: a file without a checksum, read the pyarrow way
        return (data,)
    return data[:at], memoryview(b"%08x" % zlib.crc32(data)), data[at + 8 :]


def parquet_bytes(table: pa.Table, compression: str, footer: Mapping[bytes, bytes] | None = None, **kw: Any) -> bytes:
    """:func:`parquet_parts` joined: the file's bytes in one piece."""
    return b"".join(parquet_parts(table, compression, footer, **kw))


def _value_at(data: memoryview | bytes) -> int | None:
    """Where the checksum's eight digits are in a Parquet file's bytes (``None``: no such pair in its footer)."""
    size = len(data)
    if size < 12 or data[size - 4 :] != _MAGIC:
        return None
    length = int.from_bytes(data[size - 8 : size - 4], "little")
    start = size - 8 - length
    if not 0 < length <= size - 12:
        return None
    found = bytes(data[start : size - 8]).rfind(_PAIR)
    return None if found < 0 else start + found + len(_PAIR)


def stamp(handle: BinaryIO) -> bool:
    """Put the CRC-32 of the Parquet file just written to ``handle`` into its footer's :data:`UNSTAMPED` pair.

    For a file written by a streaming ``ParquetWriter`` (too large to build in
    memory, as :func:`parquet_parts` does): ``handle`` is open to read and
    write, the writer closed. The file is read back once, a piece at a time
    (it is in the page cache), and the eight digits are written in place; the
    caller fsyncs. ``False``, nothing written, when the footer holds no such
    pair with placeholder digits (the file then carries no checksum, as before).
    """
    handle.flush()
    size = handle.seek(0, os.SEEK_END)
    if size < 12:
        return False
    handle.seek(size - 8)
    tail = handle.read(8)
    length = int.from_bytes(tail[:4], "little")
    if tail[4:] != _MAGIC or not 0 < length <= size - 12:
        return False
    start = size - 8 - length
    handle.seek(start)
    footer = handle.read(length)
    found = footer.rfind(_PAIR)
    if found < 0 or footer[found + len(_PAIR) : found + len(_PAIR) + 8] != _PLACEHOLDER:
        return False
    handle.seek(0)
    crc = 0
    while piece := handle.read(_PIECE):
        crc = zlib.crc32(piece, crc)
    handle.seek(start + found + len(_PAIR))
    handle.write(b"%08x" % crc)
    handle.flush()
    return True


def checksum_matches(path: str | Path) -> bool:
    """Whether ``path`` holds a checksum (see the module docstring) that is the CRC-32 of its bytes.

    ``False`` also for a file without one, larger than :data:`MAX_CHECKED_BYTES`,
    or unreadable: the caller reads it the way that names what is wrong.
    """
    try:  # os.read of the file's size: a third of the CPU of open().read() for a 14 KB file
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size > MAX_CHECKED_BYTES:
                return False
            data = os.read(fd, size)  # a short read (the file changed) cannot match
        finally:
            os.close(fd)
    except OSError:
        return False
    at = _value_at(data)
    if at is None:
        return False
    view = memoryview(data)
    crc = zlib.crc32(view[at + 8 :], zlib.crc32(_PLACEHOLDER, zlib.crc32(view[:at])))
    return data[at : at + 8] == b"%08x" % crc
