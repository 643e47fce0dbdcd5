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
from typing import IO

import zstandard
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_replay.errors import DatasetError

from .convert import ChunkWriter, sanitize
from .otlp_json import PayloadError, request_from_json

__all__ = ["IngestReport", "Ingestor"]

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_HEAD = 4096
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


def _hash_file(path: Path, sizes: list[int]) -> tuple[str, str, dict[int, str]]:
    """Full SHA-256, SHA-256 of the first 4 KiB, and the SHA-256 of each prefix length in ``sizes``."""
    full, prefixes = hashlib.sha256(), {}
    wanted = sorted(set(sizes))
    done, head = 0, b""
    with open(path, "rb") as handle:
        while True:
            block = handle.read(min(1 << 20, wanted[0] - done) if wanted else 1 << 20)
            if not block:
                break
            if len(head) < _HEAD:
                head += block[: _HEAD - len(head)]
            full.update(block)
            done += len(block)
            while wanted and wanted[0] <= done:
                if wanted.pop(0) == done:
                    prefixes[done] = full.copy().hexdigest()
    return full.hexdigest(), hashlib.sha256(head).hexdigest(), prefixes


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


def _parse_json(data: bytes | str) -> ExportTraceServiceRequest:
    return request_from_json(data)


def _parse_payload(payload: bytes) -> ExportTraceServiceRequest:
    if payload[:4] == _ZSTD_MAGIC:
        try:
            payload = zstandard.ZstdDecompressor().decompressobj().decompress(payload)
        except zstandard.ZstdError as exc:
            raise PayloadError(f"bad zstd frame: {exc}") from None
    if payload.lstrip()[:1] == b"{":
        return _parse_json(payload)
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(payload)
    except DecodeError as exc:
        raise PayloadError(f"not a protobuf TracesData: {exc}") from None
    return request


Record = tuple[str, "ExportTraceServiceRequest | PayloadError"]


def _records(stream: io.BufferedReader) -> Iterator[Record]:
    """Yield (location, request or error) for every record in ``stream``."""
    first = stream.peek(64)[:64].lstrip()
    if first[:1] in (b"{", b""):
        yield from _json_records(stream)
        return
    index = 0
    while True:
        index += 1
        header = stream.read(4)
        if not header:
            return
        where = f"record {index}"
        if len(header) < 4:
            yield where, PayloadError("truncated length prefix at end of file")
            return
        (length,) = struct.unpack(">I", header)
        if length > _MAX_FRAME:
            yield where, PayloadError(f"length prefix {length} is implausible; not a file-exporter proto file?")
            return
        payload = stream.read(length)
        if len(payload) < length:
            yield where, PayloadError("truncated record at end of file")
            return
        try:
            yield where, _parse_payload(payload)
        except PayloadError as exc:
            yield where, exc


def _json_records(stream: io.BufferedReader) -> Iterator[Record]:
    first = stream.readline()
    try:
        json.loads(first)
        one_per_line = True
    except ValueError:
        one_per_line = False
    if not one_per_line:  # a single (pretty-printed) OTLP/JSON document
        text = first + stream.read()
        try:
            yield "document", _parse_json(text)
        except PayloadError as exc:
            yield "document", exc
        return
    number, line = 1, first
    while line:
        if line.strip():
            try:
                yield f"line {number}", _parse_json(line)
            except PayloadError as exc:
                yield f"line {number}", exc
        number += 1
        line = stream.readline()


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
        digest, head, prefixes = _hash_file(path, sizes)
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
            source: IO[bytes] = counted  # type: ignore[assignment]
            if whole_zstd:
                source = zstandard.ZstdDecompressor().stream_reader(counted, read_across_frames=True)
            stream = io.BufferedReader(source, buffer_size=1 << 20)  # type: ignore[arg-type]
            try:
                for where, item in _records(stream):
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
        self._record(
            {
                "sha256": digest,
                "bytes": size,
                "head": head,
                "source": str(path.resolve()),
                "start": start,
                "spans": report.spans,
                "files": [str(p.relative_to(self.dataset)) for p in writer.paths],
                "ingested_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        )
        return report
