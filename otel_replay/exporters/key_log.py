"""A partition's log of the files written into it: a reader learns their id keys without opening each one.

Each span file this otel-replay writes on local disk carries its ids' keys in
its footer (:mod:`.id_keys`), so a lookup on a day no compaction has indexed
yet reads every file's footer once: about 80 µs of Python a file, a second and
a half for a day of 20,000 small files. After renaming a file into place, the
writer appends one line for it to :data:`KEY_LOG_NAME` in its partition: its
name, its size and modification time, a digest of its footer's bytes after the keys (the writer's
Arrow schema, storage schema version, name and column orders, one value for
all the files of one writer) and the keys. A reader
(:class:`~otel_replay.query.files.FileTriage`) reads the log once per
partition and takes a listed file's keys from its line instead of its footer,
but only when all of these hold:

- the line is whole: it ends with a newline and its CRC-32 matches (a torn or
  interleaved line, a crash in the middle of an append, is ignored);
- the file has the size and modification time the line records (a file
  replaced, copied without its times or truncated since is read as before);
- a file with the same footer digest was checked in full by this reader (its
  footer read, its schema judged): one file per writer schema is.

Anything else, a file written by an older version, by another writer, or
whose line was lost, is checked through its footer as before: the log only
saves reads, it never decides what is live or what a file holds beyond what
its own footer says. Lines are appended with ``O_APPEND`` in one write each
(processes writing the same partition at once append whole lines), and never
fsynced: a line lost in a crash only costs its file a footer read.
Compaction rewrites the log without the lines of the files it replaced
(:func:`rewrite_without`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import uuid
import zlib
from collections.abc import Collection, Mapping
from pathlib import Path

from .id_keys import ID_KEYS_METADATA_KEY, footer_tail

__all__ = ["KEY_LOG_NAME", "LoggedFile", "append_entry", "footer_digest", "parse_lines", "rewrite_without"]

KEY_LOG_NAME = "_id_keys.log"
"""The log's name in each ``date=…`` partition (not ``.parquet``: never listed as a data file)."""

_VERSION = b"k1"
_TAIL_READ = 64 * 1024
_MAX_FOOTER = 64 * 2**20

_log = logging.getLogger(__name__)


class LoggedFile:
    """One whole line of the log: a file's name, size, footer digest and keys (base64, as in its footer)."""

    __slots__ = ("digest", "keys", "stamp")

    def __init__(self, stamp: tuple[int, int], digest: bytes, keys: bytes) -> None:
        self.stamp, self.digest, self.keys = stamp, digest, keys
        """(size, mtime in ns) the file had when written; its footer digest; its keys."""


def footer_digest(footer: bytes) -> bytes | None:
    """The digest of a footer's bytes after its id keys (``None``: it carries no keys this writer put there)."""
    tail = footer_tail(footer)
    return None if tail is None else hashlib.blake2b(tail, digest_size=16).hexdigest().encode()


def _footer_of(path: Path) -> bytes | None:
    """The Thrift footer of the Parquet file at ``path`` (``None``: its framing is not Parquet's)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - _TAIL_READ)
        data = os.pread(fd, size - start, start)
        if len(data) < 12 or data[-4:] != b"PAR1":
            return None
        length = int.from_bytes(data[-8:-4], "little")
        if not 0 < length <= min(size - 12, _MAX_FOOTER):
            return None
        if length + 8 <= len(data):
            return data[len(data) - 8 - length : len(data) - 8]
        footer = os.pread(fd, length, size - 8 - length)
        return footer if len(footer) == length else None
    finally:
        os.close(fd)


def _line(name: str, stamp: tuple[int, int], digest: bytes, keys: bytes) -> bytes:
    size, mtime = (str(value).encode() for value in stamp)
    body = b"\t".join((_VERSION, name.encode("utf-8", "surrogateescape"), size, mtime, digest, keys))
    return body + b"\t" + f"{zlib.crc32(body):08x}".encode() + b"\n"


def append_entry(path: Path | str, footer: Mapping[bytes, bytes]) -> None:
    """Append the line of the file just renamed to ``path`` (written with ``footer``) to its partition's log.

    Best effort: a file without keys gets no line, and an error (a full
    disk, a read-only folder) is logged at debug level and leaves the file
    without one; either way readers read its footer instead.
    """
    keys = footer.get(ID_KEYS_METADATA_KEY)
    if keys is None or not isinstance(path, Path):  # an object's URL: object storage keeps no key log
        return
    try:
        st = os.stat(path)
        written = _footer_of(path)
        digest = footer_digest(written) if written is not None else None
        if digest is None:
            return
        line = _line(path.name, (st.st_size, st.st_mtime_ns), digest, keys)
        # O_NONBLOCK: a FIFO in the log's place fails at once (no reader) instead of holding the writer.
        fd = os.open(path.parent / KEY_LOG_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
        try:
            os.write(fd, line)  # one write: appends of several processes never interleave within a line
        finally:
            os.close(fd)
    except (OSError, ValueError) as exc:
        _log.debug("otel-replay: no key log line for %s: %s", path, exc)


def parse_lines(data: bytes) -> tuple[dict[str, LoggedFile], int]:
    """The whole, intact lines of ``data`` by file name, and how many bytes of it end in a newline.

    A line that is torn, interleaved or damaged (wrong field count, CRC,
    numbers) is skipped; for a name logged twice the last line stands. Kept
    to a few operations a line: a day's log holds 20,000 of them.
    """
    end = data.rfind(b"\n") + 1
    found: dict[str, LoggedFile] = {}
    crc32 = zlib.crc32
    for line in data[:end].split(b"\n"):
        fields = line.split(b"\t")
        if len(fields) != 7 or fields[0] != _VERSION or len(fields[6]) != 8:
            continue
        _, name, size, mtime, digest, keys, crc = fields
        try:
            if int(crc, 16) != crc32(line[:-9]):  # the CRC covers all before its tab
                continue
        except ValueError:
            continue
        # At most 20 digits (a uint64): a longer number is no stamp a file can have (nor one int() should parse).
        if not (size.isdigit() and mtime.isdigit()) or len(size) > 20 or len(mtime) > 20:
            continue
        found[name.decode("utf-8", "surrogateescape")] = LoggedFile((int(size), int(mtime)), digest, keys)
    return found, end


def rewrite_without(partition: Path, replaced: Collection[str]) -> None:
    """Rewrite ``partition``'s log without the lines of ``replaced`` files (compaction's inputs, once swapped).

    A log left with no line is deleted. Replaced atomically (temp file, rename); a line another process appends
    meanwhile may be lost, which only costs its file a footer read.
    Best effort, like :func:`append_entry`.
    """
    log = partition / KEY_LOG_NAME
    try:
        data = _regular_bytes(log)
    except FileNotFoundError:
        return
    except OSError as exc:
        _log.debug("otel-replay: key log %s not pruned: %s", log, exc)
        return
    if data is None:  # not a regular file (a FIFO, a folder): not the writer's, left alone
        return
    gone = set(replaced)
    end = data.rfind(b"\n") + 1
    kept = [line + b"\n" for line in data[:end].split(b"\n")[:-1] if _name_of(line) not in gone]
    if not kept:  # every file it named was replaced: the partition keeps no log until the next arrival
        log.unlink(missing_ok=True)
        return
    # a writer temp name: cleaned if stale
    tmp = partition / f".{KEY_LOG_NAME}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
    try:
        tmp.write_bytes(b"".join(kept))
        os.replace(tmp, log)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        _log.debug("otel-replay: key log %s not pruned: %s", log, exc)


def _regular_bytes(path: Path) -> bytes | None:
    """The bytes of the regular file ``path`` (``None``: something else is there; a FIFO never blocks here)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        return os.pread(fd, info.st_size, 0)
    finally:
        os.close(fd)


def _name_of(line: bytes) -> str | None:
    fields = line.split(b"\t", 2)
    return fields[1].decode("utf-8", "surrogateescape") if len(fields) == 3 else None
