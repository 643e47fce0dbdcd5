"""``otel-replay ingest``: load Collector file-exporter output and OTLP/JSON files.

Accepted inputs (detected from the content, not the file name):

* JSON lines, one ``TracesData`` or ``LogsData`` per line (the file exporter's ``format: json``);
* one OTLP/JSON document (possibly pretty-printed);
* length-prefixed records (``<u32 big-endian length><payload>``, the file
  exporter's ``format: proto`` and/or ``compression: zstd``), each payload a
  protobuf ``TracesData`` or ``LogsData`` or OTLP/JSON, optionally a zstd frame;

Each record's signal is told from its content (:mod:`.signals`): spans go
to ``spans/``, log records to ``logs/`` (as ``serve`` stores them), under
the same manifest entry, crash safety and bounds.
* any of the above compressed as a whole with zstd or gzip (several frames or
  members are read in turn).

What is recorded as ingested: the manifest ``<dataset>/_ingest/manifest.jsonl``
holds one entry per run and file, with the length and SHA-256 of exactly the
prefix that was read, up to the end of its last whole record. The file is read
only up to the size it had when the run began; a line still being written and
anything appended meanwhile are left for the next run, which resumes at the
longest recorded prefix the file still starts with. The same content again,
under any name, is skipped. A compressed file is all or nothing.

Crash safety: before writing Parquet files a run leaves a marker in
``_ingest/pending/``; the manifest entry is fsynced before the marker goes. A
run that finds a marker (its writer crashed) first removes the files that
writer wrote, so an interrupted ingest is redone, never counted twice. An
exclusive lock on ``_ingest/lock`` lets one process ingest into a dataset at a
time (per file).

Bad input: a record that cannot be parsed or stored is skipped and reported in
:attr:`IngestReport.malformed` as ``(where, reason)``, and the rest is read;
spans and log records that cannot be rows (bad ids, times past 2262) are
dropped, counted and reported. A file that cannot be read as a whole (a truncated or corrupt
compressed stream, one that inflates more than ``max_ratio`` times, a length
prefix that cannot be right) sets :attr:`IngestReport.error`.

Bounds: no line, record or document longer than ``max_line`` bytes is held
(it is skipped and reported), and compressed input is inflated a bounded step
at a time, so memory stays bounded whatever the file expands to.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import json
import os
import stat
import struct
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import zstandard
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from otel_replay._json import strict_loads
from otel_replay.errors import DatasetError, PayloadError
from otel_replay.exporters.rows import request_to_table
from otel_replay.exporters.writer import fsync_dir
from otel_replay.location import resolve
from otel_replay.settings import INGEST_MAX_LINE, INGEST_MAX_RATIO, check_number, env_number
from otel_replay.storage.backend import backend_for
from otel_replay.storage.convert import CHUNK_ROWS, MAX_SHARED_BYTES_PER_REQUEST, ChunkWriter, sanitize, split_request
from otel_replay.storage.logs import LogWriter, admit_logs

from .signals import OtlpRequest, otlp_from_json, otlp_from_proto

__all__ = ["DEFAULT_MAX_LINE", "DEFAULT_MAX_RATIO", "IngestReport", "Ingestor"]

MiB = 1 << 20
DEFAULT_MAX_LINE = 32 * MiB
"""Largest line, length-prefixed record or document held in memory (the receiver's request limit)."""
DEFAULT_MAX_RATIO = 1000
"""Largest decompressed/compressed ratio accepted once the output passes 64 MiB."""
_RATIO_FLOOR = 64 * MiB
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_STEP = 512  # compressed bytes per zstd call: at most ~16 MiB out (zstd's ratio tops out near 32768)
_GZIP_STEP = MiB  # decompressed bytes per zlib call
_READ = 64 * 1024
_RECORD_STARTS = (b"\x0a", b"\x28", b"{", b" ", b"\t", b"\r", b"\n")  # TracesData field 1, zstd, JSON
INGEST_DIR = "_ingest"
MANIFEST = "manifest.jsonl"
PENDING = "pending"
LOCK = "lock"

Progress = Callable[[int], None]


@dataclass
class IngestReport:
    """What ingesting one file did.

    ``status`` is ``ingested``, ``skipped`` (nothing new) or ``failed`` (the
    file could not be read as a whole: nothing from it is kept or recorded).
    ``malformed`` lists each skipped record or dropped span group as
    ``(where, reason)``; ``rejected`` counts dropped spans; ``error`` is a
    problem with the file itself; ``message`` is information (an unfinished
    last record left for the next run). ``start_offset``/``end_offset`` are
    the byte range of the file recorded as ingested by this run.
    """

    path: str
    status: str = "ingested"
    spans: int = 0
    rejected: int = 0
    log_records: int = 0
    """Log records written (under ``logs/``)."""
    log_records_rejected: int = 0
    """Log records dropped (bad ids, times past 2262, too much resource repeated per record)."""
    malformed: list[tuple[str, str]] = field(default_factory=list)
    start_offset: int = 0
    end_offset: int = 0
    message: str = ""
    error: str = ""

    @property
    def clean(self) -> bool:
        """True when nothing was skipped, dropped or refused."""
        return not (self.malformed or self.error or self.rejected or self.log_records_rejected)


# --- byte sources ----------------------------------------------------------------


class _Slice(io.RawIOBase):
    """Bytes ``[start, end)`` of an open file; ``progress`` and ``hasher`` see every byte read."""

    def __init__(self, handle: IO[bytes], start: int, end: int, progress: Progress, hasher: Any = None) -> None:
        handle.seek(start)
        self.handle, self.left, self.progress, self.hasher = handle, end - start, progress, hasher
        self.read_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")[: max(0, self.left)]
        if not len(view):
            return 0
        n = self.handle.readinto(view) or 0  # type: ignore[attr-defined]
        if not n:  # the file shrank under us: stop here
            self.left = 0
            return 0
        self.left -= n
        self.read_bytes += n
        if self.hasher is not None:
            self.hasher.update(view[:n])
        self.progress(n)
        return n


def _is_frame_start(kind: str, data: bytes) -> bool:
    if kind == "gzip":
        return data[:2] == _GZIP_MAGIC
    skippable = len(data) >= 4 and data[0] & 0xF0 == 0x50 and data[1:4] == b"\x2a\x4d\x18"
    return data[:4] == _ZSTD_MAGIC or skippable


class _Inflate(io.RawIOBase):
    """A whole-stream zstd or gzip decoder with bounded output per step.

    Reads every frame (zstd) or member (gzip) in turn; raises
    :class:`PayloadError` when the input ends inside one (truncated), is
    corrupt, is followed by bytes that are not another frame, or expands more
    than ``max_ratio`` times once past 64 MiB of output.
    """

    def __init__(self, source: IO[bytes] | io.RawIOBase, kind: str, max_ratio: float) -> None:
        self.source, self.kind, self.max_ratio = source, kind, max_ratio
        self.bytes_in = self.bytes_out = 0
        self._input, self._ipos = b"", 0
        self._out, self._opos = b"", 0
        self._decoder: Any = None
        self._frames = 0
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._opos >= len(self._out):
            if self._done:
                return 0
            self._out, self._opos = self._step(), 0
        view = memoryview(buffer).cast("B")
        n = min(len(view), len(self._out) - self._opos)
        view[:n] = self._out[self._opos : self._opos + n]
        self._opos += n
        return n

    def _fill(self, at_least: int) -> None:
        while len(self._input) - self._ipos < at_least:
            more = self.source.read(_READ)
            if not more:
                return
            self.bytes_in += len(more)
            self._input = self._input[self._ipos :] + more
            self._ipos = 0

    def _step(self) -> bytes:
        self._fill(1 if self._decoder is not None else 4)
        pending = len(self._input) - self._ipos
        if self._decoder is None:
            if pending == 0:
                if not self._frames:
                    raise PayloadError(f"empty {self.kind} stream")
                self._done = True
                return b""
            head = self._input[self._ipos : self._ipos + 4]
            if not _is_frame_start(self.kind, head):
                raise PayloadError(
                    f"{self.kind} stream: bytes after frame {self._frames} are not {self.kind} data "
                    f"(at compressed byte {self.bytes_in - pending})"
                )
            self._decoder = (
                zlib.decompressobj(wbits=31) if self.kind == "gzip" else zstandard.ZstdDecompressor().decompressobj()
            )
        elif pending == 0:
            raise PayloadError(
                f"{self.kind} stream is truncated: the file ends inside frame {self._frames + 1} "
                f"(after {self.bytes_in} compressed bytes)"
            )
        try:
            out = self._zlib_step() if self.kind == "gzip" else self._zstd_step()
        except (zlib.error, zstandard.ZstdError) as exc:
            raise PayloadError(f"{self.kind} stream is corrupt: {exc}") from None
        self.bytes_out += len(out)
        if self.bytes_out > _RATIO_FLOOR and self.bytes_out > self.max_ratio * self.bytes_in:
            raise PayloadError(
                f"{self.kind} data expands more than {self.max_ratio:g} times ({self.bytes_out} bytes from "
                f"{self.bytes_in}): refused as a decompression bomb (OTEL_REPLAY_INGEST_MAX_RATIO raises the limit)"
            )
        return out

    def _zstd_step(self) -> bytes:
        chunk = self._input[self._ipos : self._ipos + _ZSTD_STEP]
        self._ipos += len(chunk)
        out: bytes = self._decoder.decompress(chunk)
        if self._decoder.eof:
            self._ipos -= len(self._decoder.unused_data)
            self._decoder, self._frames = None, self._frames + 1
        return out

    def _zlib_step(self) -> bytes:
        data = self._input[self._ipos :]
        out: bytes = self._decoder.decompress(data, _GZIP_STEP)
        self._ipos += len(data) - len(self._decoder.unconsumed_tail) - len(self._decoder.unused_data)
        if self._decoder.eof:
            self._decoder, self._frames = None, self._frames + 1
        return out


def _inflate_record(payload: bytes, limit: int) -> bytes:
    """A length-prefixed record's zstd frame, decompressed, refusing more than ``limit`` bytes."""
    reader = _Inflate(io.BytesIO(payload), "zstd", float("inf"))
    parts: list[bytes] = []
    total = 0
    while True:
        part = reader.read(MiB)
        if not part:
            return b"".join(parts)
        total += len(part)
        if total > limit:
            raise PayloadError(f"zstd frame expands past the {limit}-byte record limit")
        parts.append(part)


# --- records ---------------------------------------------------------------------


@dataclass
class _Item:
    """One record read: a request, or why it is skipped / left / the end of what can be read."""

    where: str
    request: OtlpRequest | None = None
    problem: str = ""  # skipped and reported; reading goes on
    unfinished: str = ""  # cut short at the end of what was read: left for the next run
    fatal: str = ""  # the rest of the stream cannot be read


def _parse_payload(payload: bytes, limit: int) -> OtlpRequest:
    if payload[:4] == _ZSTD_MAGIC:
        payload = _inflate_record(payload, limit)
    if payload.lstrip()[:1] == b"{":
        return otlp_from_json(payload)
    return otlp_from_proto(payload)


def _looks_like_json(head: bytes, limit: int) -> bool:
    """Text, not length-prefixed records: JSON starts with ``{`` (or ``[``, to be reported as such).

    A length-prefixed proto file starts with a 4-byte big-endian length, which
    is not printable text; printable text read as a length is at least 512 MiB,
    past any record limit. So printable text is JSON (lines), whatever its first
    line holds.
    """
    stripped = head.lstrip()
    if stripped[:1] in (b"{", b"[", b""):
        return True
    if len(head) >= 4 and struct.unpack(">I", head[:4])[0] > limit:
        return head[:4].decode("ascii", "replace").isprintable()
    line, newline, rest = stripped.partition(b"\n")
    return bool(newline) and rest.lstrip()[:1] == b"{" and line.decode("utf-8", "replace").isprintable()


def _is_json(line: bytes) -> bool:
    try:
        strict_loads(line, where="probe")
    except PayloadError:
        return False
    return True


class _Reader:
    """Splits a decoded byte stream into records; ``pos`` and ``hasher`` cover exactly the records taken.

    ``final`` says the stream's end is the real end (a complete compressed
    stream): a record cut short there is an error, not a record in progress.
    """

    def __init__(self, stream: io.BufferedReader, *, limit: int, final: bool, hasher: Any = None) -> None:
        self.stream, self.limit, self.final, self.hasher = stream, limit, final, hasher
        self.pos = 0

    def _take(self, data: bytes) -> None:
        self.pos += len(data)
        if self.hasher is not None:
            self.hasher.update(data)

    def items(self) -> Iterator[_Item]:
        """Every record, in order; stops after an ``unfinished`` or ``fatal`` item."""
        if _looks_like_json(self.stream.peek(_READ)[:_READ], self.limit):
            yield from self._json()
        else:
            yield from self._framed()

    # JSON lines, or one document
    def _line(self) -> bytes:
        return self.stream.readline(self.limit + 1)

    def _json(self) -> Iterator[_Item]:
        # JSON lines unless neither of the first two lines is JSON on its own
        # and the text is one (pretty-printed) document. Bad lines at the start
        # of a JSON-lines file never turn the rest of it into a "document".
        first = self._line()
        if not first:
            return
        head = [first]
        if len(first) <= self.limit and not _is_json(first):
            second = self._line()
            if second:
                head.append(second)
            if not second or (len(second) <= self.limit and not _is_json(second)):
                document, head = self._document(b"".join(head))
                if document is not None:
                    yield document
                    return
        number = 0
        for line in _chain(head, self._line):
            number += 1
            item = self._json_line(f"line {number}", line)
            if item is not None:
                yield item
                if item.unfinished:
                    return

    def _json_line(self, where: str, line: bytes) -> _Item | None:
        if len(line) > self.limit:
            self._take(line)
            total, ended = len(line), line.endswith(b"\n")
            while not ended:  # skip the rest of the line without holding it
                piece = self.stream.readline(MiB)
                if not piece:
                    break
                self._take(piece)
                total += len(piece)
                ended = piece.endswith(b"\n")
            size = f"{total} bytes" if ended else f"{total}+ bytes, unfinished"
            return _Item(where, problem=f"longer than the {self.limit}-byte line limit ({size}); skipped")
        if not line.strip():
            self._take(line)
            return None
        try:
            request = otlp_from_json(line)
        except PayloadError as exc:
            if not line.endswith(b"\n") and not self.final:
                return _Item(where, unfinished=f"last line unfinished ({exc})")
            self._take(line)
            return _Item(where, problem=str(exc))
        self._take(line)
        return _Item(where, request=request)

    def _document(self, head: bytes) -> tuple[_Item | None, list[bytes]]:
        """One document, or ``None`` and the lines read so far when the text is JSON lines after all."""
        text = head + self.stream.read(max(0, self.limit + 1 - len(head)))
        if len(text) > self.limit:
            if any(_is_object_line(line) for line in _split_lines(text)[2:-1]):  # JSON lines after all
                return None, _lines_with_rest(text, self._line)
            self._take(text)
            while piece := self.stream.read(MiB):
                self._take(piece)
            return _Item("document", problem=f"longer than the {self.limit}-byte document limit; skipped"), []
        try:
            request = otlp_from_json(text)
        except PayloadError as exc:
            if b"\n" not in text and not self.final:  # one unfinished line: a writer is mid-way through it
                return _Item("document", unfinished=str(exc)), []
            lines = _split_lines(text)
            if any(_is_object_line(line) for line in lines[2:]):  # JSON lines after all
                return None, lines
            self._take(text)
            return _Item("document", problem=str(exc)), []
        self._take(text)
        return _Item("document", request=request), []

    # length-prefixed records
    def _cut(self, where: str, what: str) -> _Item:
        if self.final:
            return _Item(where, fatal=f"{what}: the stream ends inside a record")
        return _Item(where, unfinished=what)

    def _framed(self) -> Iterator[_Item]:
        index = 0
        while True:
            header = self.stream.read(4)
            if not header:
                return
            index += 1
            where = f"record {index}"
            if len(header) < 4:
                yield self._cut(where, "length prefix cut short at end of file")
                return
            (length,) = struct.unpack(">I", header)
            if length == 0 or length > self.limit:
                why = "0" if length == 0 else f"{length} is over the {self.limit}-byte record limit"
                yield _Item(
                    where, fatal=f"length prefix {why}: not a file-exporter record, so nothing after it can be read"
                )
                return
            payload = self.stream.read(length)
            if len(payload) < length:
                if payload and payload[:1] not in _RECORD_STARTS:  # not a record in progress: garbage
                    yield _Item(
                        where,
                        fatal=f"cut short, and its payload starts with byte 0x{payload[:1].hex()}, "
                        "not a TracesData, zstd frame or JSON: not a file-exporter record",
                    )
                    return
                yield self._cut(where, "record cut short at end of file")
                return
            self._take(header)
            self._take(payload)
            try:
                yield _Item(where, request=_parse_payload(payload, self.limit))
            except PayloadError as exc:
                yield _Item(where, problem=str(exc))


def _is_object_line(line: bytes) -> bool:
    """A whole JSON object on one line: what JSON lines hold and a pretty-printed document never does."""
    return line.lstrip()[:1] == b"{" and _is_json(line)


def _split_lines(text: bytes) -> list[bytes]:
    """Lines as ``readline`` makes them: split after each newline only, newlines kept."""
    parts = text.split(b"\n")
    return [part + b"\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _lines_with_rest(text: bytes, more: Callable[[], bytes]) -> list[bytes]:
    """``text`` split into lines, its last one completed from ``more`` when ``text`` stopped inside it."""
    lines = _split_lines(text)
    if lines and not lines[-1].endswith(b"\n"):
        lines[-1] += more()
    return lines


def _chain(head: list[bytes], more: Callable[[], bytes]) -> Iterator[bytes]:
    yield from head
    yield from iter(more, b"")


# --- the manifest ------------------------------------------------------------------


def _prefix_hashes(handle: IO[bytes], sizes: list[int]) -> dict[int, Any]:
    """SHA-256 state after each prefix length in ``sizes`` (each ``<=`` the file size)."""
    states: dict[int, Any] = {}
    digest, done = hashlib.sha256(), 0
    handle.seek(0)
    for size in sorted(set(sizes)):
        while done < size:
            block = handle.read(min(MiB, size - done))
            if not block:
                return states
            digest.update(block)
            done += len(block)
        states[size] = digest.copy()
    return states


def _manifest_entries(data: bytes) -> list[dict[str, Any]]:
    """The entries in whole manifest lines; a torn line (a crash mid-write) is ignored."""
    entries: list[dict[str, Any]] = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            entry = strict_loads(line, where="manifest")
            int(entry["bytes"]), str(entry["sha256"])
        except (PayloadError, KeyError, TypeError, ValueError):
            continue  # torn by a crash: the pending marker of that run makes the next run redo it
        entries.append(entry)
    return entries


class Ingestor:
    """Ingest files into ``dataset``; see the module docstring for formats, durability and bounds."""

    def __init__(
        self,
        dataset: str | os.PathLike[str],
        *,
        max_line: int | None = None,
        max_ratio: float | None = None,
        chunk_rows: int = CHUNK_ROWS,
    ) -> None:
        """Open the dataset's ingest manifest (created on first use).

        ``max_line`` (bytes; default ``OTEL_REPLAY_INGEST_MAX_LINE``, else 32 MiB)
        bounds a line, record or document; ``max_ratio`` (default
        ``OTEL_REPLAY_INGEST_MAX_RATIO``, else 1000) bounds decompression;
        ``chunk_rows`` rows are buffered before a Parquet file is written.
        """
        location = resolve(dataset)
        directory = backend_for(location).directory  # file:///abs -> /abs
        if directory is None:
            raise DatasetError(f"dataset {location.uri}: ingest writes a local dataset (then compact or copy it up)")
        self.dataset = directory
        if self.dataset.exists() and not self.dataset.is_dir():
            raise DatasetError(f"dataset {self.dataset} is a file, not a directory")
        # capped: a limit past 1 TiB means nothing here, and past 2**63 readline() cannot take it
        self.max_line = int(
            env_number(INGEST_MAX_LINE, DEFAULT_MAX_LINE, maximum=2**40, integer=True)
            if max_line is None
            else check_number("max_line", max_line, maximum=2**40, integer=True)
        )
        self.max_ratio = (
            env_number(INGEST_MAX_RATIO, DEFAULT_MAX_RATIO)
            if max_ratio is None
            else check_number("max_ratio", max_ratio, maximum=2**40)
        )
        self.chunk_rows = int(check_number("chunk_rows", chunk_rows, maximum=2**31, integer=True))
        self.dir = self.dataset / INGEST_DIR
        self.manifest_path = self.dir / MANIFEST
        self.pending_dir = self.dir / PENDING
        self.entries: list[dict[str, Any]] = []
        self._manifest_read = 0
        self._refresh()
        self.recovered: list[str] = []
        """Prefixes of output files removed because the run that wrote them crashed."""

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.pending_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise DatasetError(f"cannot write the ingest manifest under {self.dir}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._refresh()  # another process may have added entries
            self._recover()
            yield
        finally:
            os.close(fd)

    def _refresh(self) -> None:
        """Read the manifest lines added since the last read (all of it if it was replaced)."""
        try:
            with open(self.manifest_path, "rb") as handle:
                if os.fstat(handle.fileno()).st_size < self._manifest_read:
                    self.entries, self._manifest_read = [], 0
                handle.seek(self._manifest_read)
                data = handle.read()
        except FileNotFoundError:
            return
        whole = data[: data.rfind(b"\n") + 1]  # a torn last line is read again once it is followed by more
        self.entries += _manifest_entries(whole)
        self._manifest_read += len(whole)

    def _recover(self) -> None:
        """Remove what crashed runs wrote but never recorded (called under the lock)."""
        done = {e.get("token") for e in self.entries}
        for marker in sorted(self.pending_dir.glob("*.json")):
            token = marker.stem
            if token not in done:
                self._remove_outputs(token)
                self.recovered.append(f"ingest-{token}")
            marker.unlink(missing_ok=True)

    def _remove_outputs(self, token: str) -> None:
        for kind in ("spans", "logs"):
            for pattern in (f"date=*/ingest-{token}-*.parquet", f"date=*/.ingest-{token}-*.tmp"):
                for path in (self.dataset / kind).glob(pattern):
                    path.unlink(missing_ok=True)

    def _append(self, entry: dict[str, Any]) -> None:
        with open(self.manifest_path, "ab+") as handle:
            handle.seek(0, os.SEEK_END)
            torn = False
            if handle.tell():
                handle.seek(-1, os.SEEK_END)
                torn = handle.read(1) != b"\n"
            # A torn line from a crash must not swallow this entry.
            handle.write((b"\n" if torn else b"") + json.dumps(entry, sort_keys=True).encode() + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        fsync_dir(self.dir)
        self._refresh()

    def ingest(self, path: str | os.PathLike[str], progress: Progress = lambda n: None) -> IngestReport:
        """Ingest one file; bad content is reported in the result, never raised.

        Raises:
            OSError: the file cannot be read, or is not a regular file (a FIFO, device, socket or directory).
            DatasetError: the dataset cannot be written (what this run wrote is removed first).

        """
        path = Path(path)
        if path.resolve().is_relative_to(self.dataset.resolve()):
            report = IngestReport(str(path), status="skipped", message="inside the dataset itself")
            return report
        with _open_regular(path) as handle, self._locked():
            return self._ingest(path, handle, progress)

    def _ingest(self, path: Path, handle: IO[bytes], progress: Progress) -> IngestReport:
        report = IngestReport(str(path))
        size = os.fstat(handle.fileno()).st_size  # read no further: what is appended meanwhile is the next run's
        states = _prefix_hashes(handle, [int(e["bytes"]) for e in self.entries if 0 < int(e["bytes"]) <= size])
        known = {(int(e["bytes"]), str(e["sha256"])) for e in self.entries}
        matched = [n for n, state in states.items() if (n, state.hexdigest()) in known]
        start = max(matched, default=0)
        report.start_offset = report.end_offset = start
        if start == size:
            report.status = "skipped"
            report.message = "already ingested (same content)" if size else "empty file"
            progress(size)
            return report
        progress(start)
        hasher = states[start] if start else hashlib.sha256()
        handle.seek(start)
        magic = handle.read(4)
        kind = "gzip" if magic[:2] == _GZIP_MAGIC else "zstd" if _is_frame_start("zstd", magic) else ""
        token = uuid.uuid4().hex[:16]
        marker = self.pending_dir / f"{token}.json"
        marker.write_text(json.dumps({"source": str(path.resolve()), "start": start}))
        fsync_dir(self.pending_dir)
        writer = ChunkWriter(self.dataset, f"ingest-{token}", chunk_rows=self.chunk_rows)
        logs = LogWriter(self.dataset, f"ingest-{token}", chunk_rows=self.chunk_rows)
        try:
            raw = _Slice(handle, start, size, progress, hasher if kind else None)
            source: Any = _Inflate(raw, kind, self.max_ratio) if kind else raw
            with io.BufferedReader(source, buffer_size=MiB) as stream:
                reader = _Reader(stream, limit=self.max_line, final=bool(kind), hasher=None if kind else hasher)
                for item in reader.items():
                    self._take(item, writer, logs, report)
            end = start + (raw.read_bytes if kind else reader.pos)
            writer.flush()
            logs.flush()
        except PayloadError as exc:  # the compressed stream as a whole is bad: keep nothing from it
            self._remove_outputs(token)
            marker.unlink(missing_ok=True)
            report.status, report.error, report.spans = "failed", f"{exc}; nothing from this file was kept", 0
            report.log_records = 0
            return report
        except BaseException:
            self._remove_outputs(token)
            marker.unlink(missing_ok=True)
            raise
        if kind and report.error:  # a length prefix gone wrong inside a compressed file: all or nothing
            self._remove_outputs(token)
            marker.unlink(missing_ok=True)
            report.status, report.spans, report.log_records = "failed", 0, 0
            report.error += "; nothing from this file was kept"
            return report
        report.end_offset = end
        if end > start:
            self._append(
                {
                    "sha256": hasher.hexdigest(),
                    "bytes": end,
                    "source": str(path.resolve()),
                    "start": start,
                    "spans": report.spans,
                    "log_records": report.log_records,
                    "token": token,
                    "files": [str(Path(p).relative_to(self.dataset)) for p in [*writer.paths, *logs.paths]],
                    "ingested_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
            )
        marker.unlink(missing_ok=True)
        return report

    def _take(self, item: _Item, writer: ChunkWriter, logs: LogWriter, report: IngestReport) -> None:
        if item.unfinished:
            report.message = f"{item.where}: {item.unfinished}; it is read on the next ingest"
            return
        if item.fatal:
            report.error = f"{item.where}: {item.fatal}"
            return
        if item.request is None:
            report.malformed.append((item.where, item.problem))
            return
        if isinstance(item.request, ExportLogsServiceRequest):
            _take_logs(item.where, item.request, logs, report)
            return
        accepted, rejected, message = sanitize(item.request)
        if rejected:
            report.rejected += rejected
            report.malformed.append((item.where, f"{rejected} span(s) dropped: {message}"))
        if not accepted:
            return
        rows = 0
        try:  # in pieces when its resources and scopes, repeated per row, would take too much memory at once
            for piece in split_request(item.request):
                table = request_to_table(piece)
                writer.add(table)
                rows += table.num_rows
        except (ValueError, TypeError, OverflowError, pa.ArrowException) as exc:
            report.rejected += accepted - rows
            report.malformed.append((item.where, f"{accepted - rows} span(s) cannot be stored: {exc}"))
            report.spans += rows
            return
        if rows < accepted:
            report.rejected += accepted - rows
            report.malformed.append((item.where, f"{accepted - rows} span(s) dropped by the row conversion"))
        report.spans += rows


_NOT_REGULAR = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def _open_regular(path: Path) -> IO[bytes]:
    """``path`` opened for reading, refusing what is not a regular file (nothing says where its content ends).

    Opened without blocking: a FIFO would hold the run in ``open()`` until
    some process wrote to it.

    Raises:
        OSError: it cannot be opened, or it is a FIFO, device, socket or directory.

    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = next((name for test, name in _NOT_REGULAR if test(mode)), "not a file")
            raise OSError(errno.EINVAL, f"not a regular file ({what}); ingest reads files", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _take_logs(where: str, request: ExportLogsServiceRequest, logs: LogWriter, report: IngestReport) -> None:
    """Admit a record's log records as ``serve`` does (bounded resource repeated per record) and write them."""
    admitted = admit_logs(request, max_shared_bytes=MAX_SHARED_BYTES_PER_REQUEST)
    if admitted.rejected:
        report.log_records_rejected += admitted.rejected
        report.malformed.append((where, f"{admitted.rejected} log record(s) dropped: {admitted.message}"))
    if admitted.accepted:
        report.log_records += logs.add_request(request)
