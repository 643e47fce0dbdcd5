"""The spans of a write-ahead log's records, held until their segment converts: the rows without the decode.

A :class:`otel_replay.capture.write_ahead.SpanLog` converts each sealed
segment of its log to Parquet. From its bytes, that decodes every record and
builds its row from the OTLP message; while the process that appended the
records lives, their ended spans are at hand, and the exporter's conversion
(:func:`otel_replay.exporters.rows.spans_to_table`) gives the same rows from
them at a fraction of the CPU. :class:`KeptSpans` holds them, bounded.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan

from otel_replay.capture.direct_spans import RecordSpan

__all__ = ["KEPT_BYTES", "KeptSpans"]

KEPT_BYTES = 16 * 1024 * 1024
"""Bytes of records held as spans at most (their spans take about three times as much memory); past it, from bytes.

A log seals its segment every ``max_file_age_seconds`` (5 s by default), and
sooner once a quarter of this is held (:data:`otel_replay.capture.write_ahead.SEAL_HELD`),
so a segment's records fit; a record past it is not held, and its segment
converts from its bytes, as before.
"""


class KeptSpans:
    """The spans of records appended and not yet converted, by their record's bytes; a bounded, thread-safe map.

    Converting a segment of the log decodes every record's OTLP bytes and
    builds its row from them (~110 µs of CPU per gate record, plus the
    decode). While the process that appended them lives, the ended spans
    are still at hand: :func:`otel_replay.exporters.rows.spans_to_table`,
    the exporter's conversion, gives the same rows from them in a third of
    the time (``tests/capture/test_kept_spans.py`` compares the two). Which
    records a segment holds is read from the segment itself, never assumed:
    a segment converts from the spans only when each of its records is held
    here (found by its exact bytes); else from its bytes, as after a crash.
    Either way the files get the names the segment gives them, so a crash
    between the write and the segment's release, and the recovery that
    converts it again from its bytes, rewrites the same files: no row twice.
    A gate's records (:class:`~otel_replay.capture.direct_spans.RecordSpan`,
    of a known shape) are held, and so are the spans the SDK ended that a
    write-ahead carries with them (the records sealed before it, such as the
    decision), unless they have links.
    """

    def __init__(self) -> None:
        # A record's one span as it is (most records: one object fewer for the cyclic GC to walk), several as a tuple.
        self._spans: dict[bytes, ReadableSpan | tuple[ReadableSpan, ...]] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.rows = 0
        """Rows converted from held spans (the others were converted from the log's bytes)."""

    @property
    def held(self) -> int:
        """Records held now."""
        return len(self._spans)

    @property
    def held_bytes(self) -> int:
        """Bytes of the records held now (at most :data:`KEPT_BYTES`)."""
        return self._bytes

    def keep(self, payload: bytes, spans: Sequence[ReadableSpan]) -> bool:
        """Hold ``spans``, the record ``payload``'s, until its segment converts; ``False``: not held (full, other)."""
        if not spans:
            return False
        for span in spans:
            # A link's trace state is read from the bytes by the SDK's parser, which drops one it finds invalid
            # where the span kept it: a span the SDK ended with links is left to its bytes. A record span's
            # links are of a known shape.
            if span.links and span.__class__ is not RecordSpan:
                return False
        with self._lock:
            if payload in self._spans or self._bytes + len(payload) > KEPT_BYTES:
                return False  # the log's bytes convert it
            self._spans[payload] = spans[0] if len(spans) == 1 else tuple(spans)
            self._bytes += len(payload)
        return True

    def drop(self, payloads: Sequence[bytes]) -> None:
        """Forget the records ``payloads`` (converted, or never written)."""
        with self._lock:
            for payload in payloads:
                if self._spans.pop(payload, None) is not None:
                    self._bytes -= len(payload)

    def _take(self, records: Sequence[bytes]) -> list[ReadableSpan] | None:
        """The spans of ``records`` in their order, each record forgotten; ``None`` when one was not held."""
        spans: list[ReadableSpan] | None = []
        with self._lock:
            for record in records:
                held = self._spans.pop(record, None)
                if held is None:
                    spans = None
                    continue
                self._bytes -= len(record)
                if spans is not None:
                    if isinstance(held, tuple):
                        spans.extend(held)
                    else:
                        spans.append(held)
        return spans

    def convert(self, path: Path, dataset: str, prefix: str) -> int | None:
        """Convert the segment ``path`` from the spans held for its records; rows written, ``None``: not done.

        ``None`` when a record of the segment is not held, the segment does
        not read whole, a span does not convert, or the rows would not fit
        one chunk (the converter of the bytes then decides, and names the
        files, as it always does). The records read are forgotten either way.
        """
        if not self._spans:
            return None
        # start-up cost: the row conversion and the receiver's writer load only when a gate's log is converted
        from otel_replay.exporters.rows import spans_to_table
        from otel_replay.storage.convert import CHUNK_BYTES, CHUNK_ROWS, ChunkWriter
        from otel_replay.storage.wal import read_records

        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # as the conversion of the bytes holds it
            try:
                records = list(read_records(path))
            except Exception:  # noqa: BLE001 - damage: the salvage of the bytes decides; held spans forgotten
                with self._lock:
                    self._spans.clear()
                    self._bytes = 0
                return None
            spans = self._take(records)
            if not spans:
                return None
            try:
                table = spans_to_table(spans)
            except Exception:  # noqa: BLE001 - the conversion of the bytes refuses it, or says why
                return None
            # The bytes' conversion starts a new chunk at CHUNK_ROWS rows or CHUNK_BYTES of Arrow; well under
            # both, it writes one chunk too, so both ways name the same files.
            if table.num_rows >= CHUNK_ROWS or 2 * table.nbytes >= CHUNK_BYTES:
                return None
            writer = ChunkWriter(dataset, prefix)
            writer.add(table)
            writer.flush()
            self.rows += writer.rows_written
            return writer.rows_written
        finally:
            os.close(fd)
