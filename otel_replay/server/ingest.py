"""``otel-replay ingest``: load Collector file-exporter output and OTLP/JSON files.

Accepted inputs (detected from the content, not the file name):

* JSON lines, one ``TracesData`` per line (the file exporter's ``format: json``);
* one OTLP/JSON document (possibly pretty-printed);
* length-prefixed records (``<u32 big-endian length><payload>``, the file
  exporter's ``format: proto`` and/or ``compression: zstd``), each payload a
  protobuf ``TracesData`` or OTLP/JSON, optionally a zstd frame;
* any of the above compressed as a whole with zstd.

Idempotency: a manifest under ``<dataset>/_ingest/`` records the SHA-256 and
length of every ingested file. The same content again is skipped; a file that
has grown since (the file exporter appends) is ingested from where the earlier
content ended. Output files are named after the content hash and start offset,
so an ingest interrupted by a crash and repeated rewrites the same files.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import zstandard
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_replay.errors import DatasetError

from .convert import ChunkWriter, sanitize
from .otlp_json import PayloadError, request_from_json

__all__ = ["IngestReport", "Ingestor"]

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_MAX_FRAME = 1 << 30
INGEST_DIR = "_ingest"
MANIFEST = "manifest.jsonl"

Progress = Callable[[int], None]


@dataclass
class IngestReport:
    """What ingesting one file did."""

    path: str
    status: str = "ingested"  # ingested | skipped
    spans: int = 0
    rejected: int = 0
    malformed: list[tuple[str, str]] = field(default_factory=list)
    start_offset: int = 0
    message: str = ""


def _hash_file(path: Path, sizes: list[int]) -> tuple[str, dict[int, str]]:
    """Full SHA-256, and the SHA-256 of each prefix length in ``sizes``."""
    full, prefixes = hashlib.sha256(), {}
    wanted = sorted(set(sizes))
    done = 0
    with open(path, "rb") as handle:
        while True:
            block = handle.read(min(1 << 20, wanted[0] - done) if wanted else 1 << 20)
            if not block:
                break
            full.update(block)
            done += len(block)
            while wanted and wanted[0] <= done:
                if wanted.pop(0) == done:
                    prefixes[done] = full.copy().hexdigest()
    return full.hexdigest(), prefixes


class _Counting(io.RawIOBase):
    """A raw stream that reports how many bytes were read from the wrapped file."""

    def __init__(self, raw: IO[bytes], progress: Progress) -> None:
        self.raw, self.progress = raw, progress

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        n = self.raw.readinto(buffer)  # type: ignore[attr-defined]
        if n:
            self.progress(n)
        return n or 0


def _parse_payload(payload: bytes) -> ExportTraceServiceRequest:
    if payload[:4] == _ZSTD_MAGIC:
        try:
            payload = zstandard.ZstdDecompressor().decompressobj().decompress(payload)
        except zstandard.ZstdError as exc:
            raise PayloadError(f"bad zstd frame: {exc}") from None
    if payload.lstrip()[:1] == b"{":
        return request_from_json(payload)
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(payload)
    except DecodeError as exc:
        raise PayloadError(f"not a protobuf TracesData: {exc}") from None
    return request


class Incomplete(PayloadError):
    """The last record is cut short: a writer is still appending. Left for the next run."""


Record = tuple[str, "ExportTraceServiceRequest | PayloadError", int]
"""(where, request or error, stream offset just past the record)."""


def _records(stream: io.BufferedReader) -> Iterator[Record]:
    """Yield every record in ``stream``, with the offset where it ends."""
    if _looks_like_json(stream.peek(1 << 16)):
        yield from _json_records(stream)
        return
    index = pos = 0
    while True:
        index += 1
        header = stream.read(4)
        if not header:
            return
        where = f"record {index}"
        if len(header) < 4:
            yield where, Incomplete("length prefix cut short at end of file"), pos
            return
        (length,) = struct.unpack(">I", header)
        if length > _MAX_FRAME:
            yield where, PayloadError(f"length prefix {length} is implausible; not a file-exporter proto file?"), pos
            return
        payload = stream.read(length)
        if len(payload) < length:
            yield where, Incomplete("record cut short at end of file"), pos
            return
        pos += 4 + length
        try:
            yield where, _parse_payload(payload), pos
        except PayloadError as exc:
            yield where, exc, pos


def _looks_like_json(head: bytes) -> bool:
    """JSON starts with ``{``; so does the second line of JSON lines whose first line is garbage.

    A length-prefixed proto file starts with a 4-byte big-endian length, which
    is not printable text, so a printable first line followed by ``{`` is JSON.
    """
    stripped = head.lstrip()
    if stripped[:1] in (b"{", b""):
        return True
    line, newline, rest = stripped.partition(b"\n")
    return bool(newline) and rest.lstrip()[:1] == b"{" and line.decode("utf-8", "replace").isprintable()


def _is_json(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def _json_records(stream: io.BufferedReader) -> Iterator[Record]:
    # JSON lines unless neither of the first two lines is JSON on its own:
    # then it is one (pretty-printed) document. A bad first line alone does
    # not turn a JSON-lines file into a "document".
    head = [stream.readline()]
    if not _is_json(head[0]):
        head.append(stream.readline())
        if not _is_json(head[1]):
            text = b"".join(head) + stream.read()
            try:
                yield "document", request_from_json(text), len(text)
            except PayloadError as exc:
                if b"\n" not in text:  # one unfinished line: a writer is mid-way through it
                    yield "document", Incomplete(str(exc)), 0
                else:
                    yield "document", exc, len(text)
            return
    pos, number = 0, 0
    for line in _chain(head, stream):
        number += 1
        if not line.strip():
            pos += len(line)
            continue
        try:
            request = request_from_json(line)
        except PayloadError as exc:
            if not line.endswith(b"\n"):
                yield f"line {number}", Incomplete(f"last line unfinished ({exc})"), pos
                return
            pos += len(line)
            yield f"line {number}", exc, pos
            continue
        pos += len(line)
        yield f"line {number}", request, pos


def _chain(head: list[bytes], stream: io.BufferedReader) -> Iterator[bytes]:
    yield from (line for line in head if line)
    yield from iter(stream.readline, b"")


class Ingestor:
    """Ingest files into ``dataset``; see the module docstring for formats and idempotency."""

    def __init__(self, dataset: str | os.PathLike[str]) -> None:
        """Open the dataset's ingest manifest (created on first use)."""
        self.dataset = Path(dataset)
        if self.dataset.exists() and not self.dataset.is_dir():
            raise DatasetError(f"dataset {self.dataset} is a file, not a directory")
        self.manifest_path = self.dataset / INGEST_DIR / MANIFEST
        self.entries: list[dict[str, object]] = []
        if self.manifest_path.exists():
            for line in self.manifest_path.read_text(encoding="utf-8").splitlines():
                try:
                    self.entries.append(json.loads(line))
                except ValueError:
                    continue  # a torn last line from a crash: that ingest is simply redone

    def _record(self, entry: dict[str, object]) -> None:
        self.manifest_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.manifest_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.entries.append(entry)

    def ingest(self, path: str | os.PathLike[str], progress: Progress = lambda n: None) -> IngestReport:
        """Ingest one file; never raises for bad content (see :attr:`IngestReport.malformed`)."""
        path = Path(path)
        report = IngestReport(str(path))
        size = path.stat().st_size
        sizes = [int(e["bytes"]) for e in self.entries if 0 < int(e["bytes"]) < size]  # type: ignore[call-overload]
        digest, prefixes = _hash_file(path, sizes)
        if any(e["sha256"] == digest for e in self.entries):
            report.status, report.message = "skipped", "already ingested (same content)"
            progress(size)
            return report
        with open(path, "rb") as handle:
            whole_zstd = handle.read(4) == _ZSTD_MAGIC
        start = 0
        if not whole_zstd:
            for e in self.entries:
                n = int(e["bytes"])  # type: ignore[call-overload]
                if prefixes.get(n) == e["sha256"] and n > start:
                    start = n
        report.start_offset = start
        progress(start)
        writer = ChunkWriter(self.dataset, f"ingest-{digest[:20]}-{start:x}")
        with open(path, "rb") as raw:
            raw.seek(start)
            counted = _Counting(raw, progress)
            source: Any = counted
            if whole_zstd:
                source = zstandard.ZstdDecompressor().stream_reader(source, read_across_frames=True)
            stream: Any = io.BufferedReader(source, buffer_size=1 << 20)
            consumed = 0
            try:
                for where, item, end in _records(stream):
                    if isinstance(item, Incomplete):
                        report.message = f"{where}: {item}; it is read on the next ingest"
                        break
                    consumed = end
                    if isinstance(item, PayloadError):
                        report.malformed.append((where, str(item)))
                        continue
                    accepted, rejected, message = sanitize(item)
                    report.rejected += rejected
                    if rejected:
                        report.malformed.append((where, f"{rejected} span(s) dropped: {message}"))
                    if accepted:
                        writer.add_request(item)
                        report.spans += accepted
            except zstandard.ZstdError as exc:
                report.malformed.append(("file", f"zstd stream is corrupt: {exc}"))
            finally:
                stream.close()
        writer.flush()
        # Remember only what was read whole: an unfinished tail is read again next time.
        end = size if whole_zstd or not report.message else start + consumed
        self._record(
            {
                "sha256": digest if end == size else _hash_file(path, [end])[1][end],
                "bytes": end,
                "source": str(path.resolve()),
                "start": start,
                "spans": report.spans,
                "files": [str(p.relative_to(self.dataset)) for p in writer.paths],
                "ingested_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        )
        return report
