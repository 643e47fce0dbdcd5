"""The process's recorder: which tracer records go to, and the hash chain that seals them."""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.trace import Link, Tracer, TracerProvider

from otel_replay import semconv as sc
from otel_replay.capture import global_provider
from otel_replay.capture.context import scope_attributes
from otel_replay.capture.direct_spans import bare_tracer, ended_record_span, record_context
from otel_replay.capture.log_encoding import RequestEncoder  # the log's own encoding: a held record is one record
from otel_replay.capture.sampling import (
    always_samples,
    exported,
    follows_parent,
    parent_unsampled,
    sampling_problem,
)
from otel_replay.capture.sinks import MemorySink
from otel_replay.errors import CaptureError, ConfigError
from otel_replay.integrity import (
    SEAL_KEYS,
    Chain,
    SigningKey,
    hashes_plainly,
    load_signing_key,
    record_hash,
    span_place,
    unhashable,
)
from otel_replay.records import Seal, SpanRef, new_id
from otel_replay.voids import void_attributes

__all__ = ["HeldRecord", "Pipeline", "Recorder", "RecorderStats", "get_recorder", "mark_shut_down", "set_recorder"]

_VERSION = "0.1.0"

VOID_ORDER_WAIT = 10.0
"""Seconds :meth:`Recorder.void` waits for the pipeline's write order (as long as a claim store waits for it)."""
_log = logging.getLogger(__name__)

_shut_down: weakref.WeakSet[Any] = weakref.WeakSet()


_any_shut_down = False  # lets ``Recorder.closed`` skip the WeakSet lookup until something was shut down
_warned_nowhere = False  # one warning per process for records sealed with no pipeline to go to


def mark_shut_down(provider: TracerProvider) -> None:
    """Note that ``provider`` was shut down: records emitted through it are lost from now on.

    Spans the global provider forwards start on the next pipeline from now on (see
    :mod:`~otel_replay.capture.global_provider`).
    """
    global _any_shut_down
    _shut_down.add(provider)
    _any_shut_down = True
    global_provider.retire(provider)


RECORD_ATTRIBUTE_ROOM: int = 64
"""The fewest span attributes a provider must allow: a record carries up to about 35 (content, seal, scope ids)."""

_LENGTH_VARIABLES = "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT / OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT"
_COUNT_VARIABLES = "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT / OTEL_ATTRIBUTE_COUNT_LIMIT"


def limits_problem(tracer: Tracer) -> tuple[str | None, bool]:
    """Why spans from ``tracer`` could not hold a sealed record whole, or ``None``; and whether that is final.

    The SDK cuts attribute values to its length limit and drops attributes
    past its count limit *after* the record was sealed, so the stored record
    would fail its hash check for good. A provider with any value length
    limit is refused, since a record's size depends on its data: a limit that
    fits today's snapshot cuts tomorrow's. Not final while ``tracer`` is the
    API's proxy with no SDK provider behind it yet (it may get one later).
    """
    real: Any = tracer
    if isinstance(tracer, trace.ProxyTracer):
        real = tracer._tracer  # resolves to the global provider's tracer once one is installed
        if isinstance(real, trace.NoOpTracer):
            return None, False
    limits = getattr(real, "_span_limits", None)  # the SDK's Tracer; other implementations have no known limits
    length = getattr(limits, "max_span_attribute_length", None)
    if length is not None:
        return (
            f"the TracerProvider cuts span attribute values to {length} characters ({_LENGTH_VARIABLES} "
            "or its SpanLimits), so sealed records would be stored cut and fail verification: unset the "
            "variable, build the provider with SpanLimits(max_span_attribute_length=SpanLimits.UNSET), "
            "or use otel_replay.configure() (its provider has no length limit)"
        ), True
    count = getattr(limits, "max_span_attributes", None)
    if count is not None and count < RECORD_ATTRIBUTE_ROOM:
        return (
            f"the TracerProvider keeps only {count} attributes per span ({_COUNT_VARIABLES} or its SpanLimits); "
            f"a sealed record needs room for {RECORD_ATTRIBUTE_ROOM}: raise the limit or use otel_replay.configure()"
        ), True
    return None, True


_recorders: weakref.WeakSet[Recorder] = weakref.WeakSet()


def _new_chains_in_child() -> None:
    """After ``fork()``, in the child: every recorder starts a new hash chain on its next record.

    A child that kept its parent's chain (id, next sequence number,
    predecessor) would seal other records than the parent's under the same
    sequence numbers, and ``verify`` would report both as tampered.
    """
    for recorder in list(_recorders):
        recorder._forked()


if hasattr(os, "register_at_fork"):  # not on Windows, where there is no fork
    os.register_at_fork(after_in_child=_new_chains_in_child)


class Pipeline(Protocol):
    """What a recorder made by :func:`otel_replay.configure` flushes through (``Telemetry``)."""

    @property
    def closed(self) -> bool:
        """True once the pipeline was shut down."""

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Write every finished span to the dataset now."""


@dataclass
class RecorderStats:
    """What a recorder could not record: counted, never silent."""

    dropped_after_shutdown: int = 0
    """Records emitted after their pipeline was shut down (their spans are lost)."""
    capture_errors: int = 0
    """Records that could not be sealed, emitted, stored or handed to the sink (``audit()`` blocks, gate records)."""


class Recorder:
    """Holds the tracer records are emitted through, the hash chain and the default sink.

    The tracer defaults to the global ``TracerProvider`` (resolved lazily, so a
    provider set up after import is used). The chain is created on first use
    with the key from :func:`otel_replay.integrity.load_signing_key`;
    :func:`otel_replay.configure` resolves the key up front instead, so a bad
    key fails there.

    Attributes:
        dataset: the dataset :func:`otel_replay.configure` writes to (``None``
            for the default recorder); the gate keeps its compensation claims there.
        stats: records that could not be recorded (:class:`RecorderStats`).

    """

    def __init__(
        self,
        tracer: Tracer | None = None,
        key: SigningKey | None = None,
        *,
        dataset: str | None = None,
        pipeline: Pipeline | None = None,
    ) -> None:
        """Create a recorder; ``tracer`` and ``key`` default as described above."""
        self.tracer: Tracer = tracer or trace.get_tracer(sc.INSTRUMENTATION_NAME, _VERSION)
        self.sink = MemorySink()
        self.dataset = dataset
        self._sealed_nowhere = False  # a record was sealed while it went nowhere (see check_destination)
        self.stats = RecorderStats()
        self._pipeline = pipeline
        self._key = key
        self._chain: Chain | None = None
        self._vetted: Tracer | None = None  # the tracer whose span limits were checked and found fine
        self._samples_all: Tracer | None = None  # the tracer whose sampler samples every record (no probe needed)
        self._follows_parent: Tracer | None = None  # the tracer whose sampler is the SDK's ParentBased(ALWAYS_ON)
        self._unrecorded = 0  # records refused since the last flush() because their span would not be exported
        self._lock = threading.Lock()
        self._warned = False
        self._encoder: RequestEncoder | None = None
        _recorders.add(self)

    def _forked(self) -> None:
        # The parent's lock may have been held by another thread at fork time: the child gets its own.
        self._lock = threading.Lock()
        chain, self._chain = self._chain, None
        if chain is not None and self._key is None:
            self._key = chain.key  # the same key; only the chain is new

    @property
    def pipeline(self) -> Pipeline | None:
        """The pipeline :func:`otel_replay.configure` made this recorder for (``None``: the global provider)."""
        return self._pipeline

    @property
    def closed(self) -> bool:
        """True when spans emitted now would be lost: the pipeline behind the tracer was shut down."""
        if self._pipeline is not None:
            return self._pipeline.closed
        if not _any_shut_down:
            return False
        provider = trace.get_tracer_provider()
        return provider in _shut_down or global_provider.dropping(provider)

    def flush(self, timeout_millis: int = 30_000) -> bool:
        """Make every record emitted so far durable in the dataset; ``False`` if that failed.

        Without a pipeline from :func:`otel_replay.configure`, flushes the
        global SDK ``TracerProvider`` and then every open ``ParquetSpanExporter``
        (``False`` when records were sealed while there was neither: they
        went to OpenTelemetry's no-op tracer and are nowhere).

        ``False`` also when, since the previous flush, a record was refused
        because the tracer's sampler did not sample its span (see :meth:`emit`).
        """
        with self._lock:
            unrecorded, self._unrecorded = self._unrecorded, 0
        return self._flush(timeout_millis) and not unrecorded

    def _flush(self, timeout_millis: int) -> bool:
        if self._pipeline is not None:
            return self._pipeline.force_flush(timeout_millis)
        if self.closed or (self._sealed_nowhere and self.goes_nowhere):
            return False
        flush = getattr(trace.get_tracer_provider(), "force_flush", None)
        if flush is None:
            return True
        from otel_replay.exporters.parquet import flush_exporters  # pyarrow only when there is an SDK

        handed_over = bool(flush(timeout_millis))
        return flush_exporters(timeout_millis) and handed_over

    @property
    def goes_nowhere(self) -> bool:
        """True when records go to OpenTelemetry's no-op default: no ``configure()`` and no SDK provider."""
        return (
            self._pipeline is None
            and isinstance(self.tracer, trace.ProxyTracer)
            and isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
        )

    def check_destination(self, name: str, record_id: str) -> None:
        """Before sealing a record: note (and warn once per process) when it would go nowhere."""
        if self._sealed_nowhere or not self.goes_nowhere:
            return
        global _warned_nowhere
        self._sealed_nowhere = True
        if not _warned_nowhere:
            _warned_nowhere = True
            _log.warning(
                "otel-replay: %s is sealed but not stored anywhere: no tracer provider is configured (call "
                "otel_replay.configure(...) first, or run under opentelemetry-instrument); flush() returns False. "
                "Further records are not warned about",
                f"{name} record {record_id}",
            )

    def note_capture_error(self) -> None:
        """Count an ``audit()`` record that could not be sealed, emitted or handed to its sink."""
        with self._lock:
            self.stats.capture_errors += 1

    def note_lost(self, what: str) -> None:
        """Count a record emitted after shutdown; the first one per recorder is logged as a warning."""
        with self._lock:
            self.stats.dropped_after_shutdown += 1
            first, self._warned = not self._warned, True
        if first:
            _log.warning(
                "otel-replay: %s was emitted after the telemetry pipeline was shut down and is lost; "
                "call otel_replay.configure() again (counted in get_recorder().stats.dropped_after_shutdown; "
                "further losses are counted, not logged)",
                what,
            )

    @property
    def chain(self) -> Chain:
        """The hash chain this process seals records into.

        Raises:
            ConfigError: the tracer's provider would cut or drop a sealed
                record's attributes (see :func:`limits_problem`); nothing is
                sealed through it.

        """
        chain = self._chain
        if chain is None or self._vetted is not self.tracer:
            self._vet_tracer()
            chain = self._chain
            if chain is None:
                with self._lock:
                    if self._chain is None:
                        key = self._key or load_signing_key()
                        assert key is not None
                        self._chain = Chain(key)
                    chain = self._chain
        return chain

    def check_tracer(self) -> None:
        """Refuse now, before an action runs, a tracer that could not store a sealed record made here.

        Raises:
            ConfigError: the provider would cut the record (see
                :func:`limits_problem`, the same check :attr:`chain` makes when
                sealing), or its sampler would drop a record span started in
                the current context (see
                :func:`~otel_replay.capture.sampling.sampling_problem`).

        """
        tracer = self.tracer
        if self._vetted is not tracer:
            self._vet_tracer()
        if self._samples_all is tracer:
            return
        if self._follows_parent is tracer:  # the SDK's default sampler: its answer is the parent's flag
            if not parent_unsampled():
                return
        elif self.goes_nowhere:
            return
        elif always_samples(tracer):
            self._samples_all = tracer
            return
        elif follows_parent(tracer):
            self._follows_parent = tracer
            if not parent_unsampled():
                return
        problem = sampling_problem(tracer)
        if problem is not None:
            raise ConfigError(f"otel-replay cannot record through this tracer here: {problem}")

    def refuse_unexported(self, span: Any, name: str, record_id: str) -> None:
        """Refuse (``CaptureError``, counted for :meth:`flush`) a record whose ``span`` will not be exported.

        Called right after the span starts and before the record is sealed, so
        a record the sampler dropped uses no chain sequence number (``verify``
        would report a gap) and is never silently lost. A recorder that goes
        nowhere (no provider at all) is left to :meth:`check_destination`.
        """
        if exported(span) or self.goes_nowhere or (self._pipeline is None and self.closed):  # lost: counted in _emit
            return
        span.end()  # a RECORD_ONLY span is not exported either; ending it frees what processors hold for it
        with self._lock:
            self._unrecorded += 1
        raise CaptureError(
            f"{name} record {record_id} was not recorded: the tracer's sampler did not sample its span "
            "(an unsampled parent, or a ratio sampler); build the provider with "
            "sampler=otel_replay.RecordSampler(...) or use otel_replay.configure()"
        )

    def _vet_tracer(self) -> None:
        tracer = self.tracer
        problem, final = limits_problem(tracer)
        if problem is not None:
            raise ConfigError(f"otel-replay cannot record through this tracer: {problem}")
        if final:
            self._vetted = tracer

    def emit(
        self,
        name: str,
        record_id: str,
        attributes: dict[str, Any],
        *,
        links: Sequence[Link] = (),
    ) -> tuple[SpanRef, Seal]:
        """Emit a finished record as one sealed span under the current context.

        Raises:
            CaptureError: the record cannot be sealed, or the tracer's sampler
                did not sample its span (nothing sealed; :meth:`flush` then
                returns ``False``).
            ConfigError: the tracer would cut the record (see :attr:`chain`).

        """
        ref, seal, _ = self._emit(name, record_id, attributes, links, durable=False)
        return ref, seal

    def emit_durable(
        self,
        name: str,
        record_id: str,
        attributes: dict[str, Any],
        *,
        links: Sequence[Link] = (),
    ) -> tuple[SpanRef, Seal, bool | None]:
        """:meth:`emit`, then make the record durable before returning, through the pipeline's write-ahead log.

        The third value: ``True`` once the record is fsynced in the log,
        ``False`` when that failed (logged; the span then goes the usual way,
        to Parquet later), ``None`` when the pipeline has no log (a provider
        not made by :func:`otel_replay.configure`, or one shut down): the
        caller decides whether to :meth:`flush`. Raises as :meth:`emit` does.
        """
        return self._emit(name, record_id, attributes, links, durable=True)

    def void(self, name: str, record_id: str, seal: Seal) -> None:
        """Seal a void record for ``record_id`` (span ``name``): sealed with ``seal``, then not kept by its store.

        Never raises (it runs where a store is already failing): a void that
        cannot be emitted is logged and counted in ``stats.capture_errors``;
        ``verify`` then reads the gap as deleted (docs/troubleshooting.md).
        """
        void_id = new_id()
        # A store gives a record back holding its own lock; a thread holding the write order may be waiting for that
        # lock (a span processor recording an outcome as a record ends): the order is waited for a bounded time.
        order = getattr(self._pipeline, "write_order", None)
        try:
            if order is not None and not order.acquire(timeout=VOID_ORDER_WAIT):
                raise TimeoutError(f"the pipeline's write order was held elsewhere for over {VOID_ORDER_WAIT:.0f} s")
            try:
                self.emit(sc.SPAN_VOID, void_id, void_attributes(void_id, name, record_id, seal.seq, seal.hash))
            finally:
                if order is not None:
                    order.release()
        except Exception as exc:  # noqa: BLE001 - logged and counted; the caller reports its own failure
            self.note_capture_error()
            _log.error(
                "otel-replay: %s record %s was sealed (seq %d of chain %s) and not kept, and its void record could "
                "not be emitted (%s: %s): verify will read that link as deleted",
                name,
                record_id,
                seal.seq,
                seal.chain_id,
                type(exc).__name__,
                exc,
            )

    def held(
        self, name: str, record_id: str, attributes: dict[str, Any], *, links: Sequence[Link] = ()
    ) -> HeldRecord | None:
        """The record as a :class:`HeldRecord`, for a store to seal and keep; ``None``: use :meth:`emit_durable`.

        Only where the span the SDK would end is built directly (see
        :mod:`otel_replay.capture.direct_spans`) through a pipeline
        :func:`otel_replay.configure` made, open; the record is then checked
        here as :meth:`emit` checks it (raising as it does) but not sealed.
        """
        pipeline = self._pipeline
        processors = getattr(pipeline, "bare_processors", None)
        if processors is None or pipeline is None or pipeline.closed:
            return None
        limits = getattr(self.tracer, "_span_limits", None)
        if links and (limits is None or limits.max_links is None or len(links) > limits.max_links):
            return None
        if any(link.__class__ is not Link or link.attributes for link in links):
            return None  # a link of attributes gets the SDK's limits applied to them
        attributes.update(scope_attributes(attributes))
        self.check_destination(name, record_id)
        chain = self.chain
        try:
            if not hashes_plainly(name, attributes):
                record_hash(name, time.time_ns(), attributes)
        except (UnicodeError, RecursionError) as exc:
            raise CaptureError(f"{name} record {record_id} cannot be sealed: {unhashable(exc)}") from None
        if not bare_tracer(self.tracer, processors, attributes, ()):
            return None
        return HeldRecord(self, name, record_id, attributes, links, chain)

    def encode(self, spans: Sequence[Any]) -> bytes:
        """``spans`` (ended, of one resource and scope) as one OTLP ``ExportTraceServiceRequest``'s bytes."""
        encoder = self._encoder
        if encoder is None:
            encoder = self._encoder = RequestEncoder()
        return encoder.encode(spans)

    def _emit(
        self, name: str, record_id: str, attributes: dict[str, Any], links: Sequence[Link], *, durable: bool
    ) -> tuple[SpanRef, Seal, bool | None]:
        # Stamp the scope's ids now, as the span processor would at start, so
        # the sealed hash covers exactly the attributes the span will carry.
        attributes.update(scope_attributes(attributes))
        self.check_destination(name, record_id)
        chain = self.chain  # a tracer that would cut the record is refused before a span starts
        start_ns = time.time_ns()
        # What would make sealing fail (text JSON cannot encode, nesting too deep) fails here, before a span
        # starts: a span started and never ended would sit in span processors that track open spans.
        try:
            if not hashes_plainly(name, attributes):  # a record of plain ASCII values is not hashed twice
                record_hash(name, start_ns, attributes)
        except (UnicodeError, RecursionError) as exc:  # a CaptureError (not JSON) passes as it is
            raise CaptureError(f"{name} record {record_id} cannot be sealed: {unhashable(exc)}") from None
        if durable:
            direct = self._direct(name, record_id, attributes, links, start_ns, chain)
            if direct is not None:
                return direct
        # Started first, so the seal covers the span the record is stored in; a record that cannot be
        # sealed leaves its span unended, and an unended span is never exported.
        span = self.tracer.start_span(name, attributes=attributes, links=links, start_time=start_ns)
        self.refuse_unexported(span, name, record_id)  # before sealing: a dropped record takes no sequence number
        ctx = span.get_span_context()
        # A durable record is sealed and queued in the log under the pipeline's write order (see _direct); any
        # other is sealed and its span ended under it: a write-ahead on another thread, which takes the held
        # records under it, never finds a record sealed and not yet ended.
        write_order = getattr(self._pipeline, "write_order", None)
        if write_order is not None:
            write_order.acquire()
        pending = None
        try:
            seal = chain.seal(record_id, name, start_ns, attributes, span_place(ctx.trace_id, ctx.span_id))
            span.set_attributes({key: attributes[key] for key in SEAL_KEYS})
            claim = getattr(self._pipeline, "claim", None) if durable else None
            logged = claim is not None and claim(ctx.span_id)  # kept from the batch queue: it goes to the log
            span.end(end_time=start_ns)
            if logged:
                pending = self._pipeline.queue_claimed(ctx.span_id)  # type: ignore[union-attr]
        finally:
            if write_order is not None:
                write_order.release()
        if getattr(span, "dropped_attributes", 0):  # the SDK's count: what a span processor added pushed some out
            self.note_capture_error()
            _log.error(
                "otel-replay: %s record %s lost %d attribute(s) to the span attribute count limit (%s) "
                "and will fail verification",
                name,
                record_id,
                span.dropped_attributes,  # type: ignore[attr-defined]
                _COUNT_VARIABLES,
            )
        if self.closed:
            self.note_lost(f"{name} record {record_id}")
        if not logged:
            written = None
        else:
            written = pending is not None and self._pipeline.wait_logged(pending)  # type: ignore[union-attr]
        return SpanRef(f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}", start_ns), seal, written

    def _direct(
        self,
        name: str,
        record_id: str,
        attributes: dict[str, Any],
        links: Sequence[Link],
        start_ns: int,
        chain: Chain,
    ) -> tuple[SpanRef, Seal, bool | None] | None:
        """A durable record sealed into a span built here and appended to the log; ``None``: take the SDK's path.

        Where the SDK would add nothing to the span (see
        :mod:`otel_replay.capture.direct_spans`), the span it would end as is
        made directly: same ids, same stored bytes, a fraction of the CPU.
        """
        pipeline = self._pipeline
        if getattr(pipeline, "queue_span", None) is None or pipeline.closed:  # type: ignore[union-attr]
            return None
        tracer = self.tracer
        if not bare_tracer(tracer, getattr(pipeline, "bare_processors", None), attributes, links):
            return None
        parent, ctx = record_context(tracer)
        # Sealed and queued in the log under one lock: a durable record never reaches the log before one sealed
        # ahead of it in the chain (the wait for the fsync is outside it, shared with other threads).
        with pipeline.write_order:  # type: ignore[union-attr]
            seal = chain.seal(record_id, name, start_ns, attributes, span_place(ctx.trace_id, ctx.span_id))
            pending = pipeline.queue_span(  # type: ignore[union-attr]
                ended_record_span(tracer, parent, ctx, name, start_ns, attributes)
            )
        written = pipeline.wait_logged(pending)  # type: ignore[union-attr]
        return SpanRef(f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}", start_ns), seal, written


class HeldRecord:
    """A record sealed when called (by a store, inside the transaction that keeps it): its span and the span's bytes.

    Made by :meth:`Recorder.held`; after the call, :attr:`ref` and
    :attr:`seal` say where the record is and how it is sealed.
    """

    def __init__(
        self,
        recorder: Recorder,
        name: str,
        record_id: str,
        attributes: dict[str, Any],
        links: Sequence[Link],
        chain: Chain,
    ) -> None:
        """Internal: made by :meth:`Recorder.held` once the record is known to be sealable."""
        self._recorder, self._name, self._record_id = recorder, name, record_id
        self._pipeline: Any = recorder.pipeline  # a Telemetry: a record is held only through one (see Recorder.held)
        self._before: list[Any] = []  # records sealed before this one (their spans), taken to be stored with it
        self._attributes, self._links, self._chain = attributes, links, chain
        self.ref: SpanRef | None = None
        self.seal: Seal | None = None
        self._unkept: Seal | None = None  # its seal until kept or voided (see give_back)
        self.write_order: Any = getattr(recorder.pipeline, "write_order", None)
        """The pipeline's write order (see :class:`~otel_replay.capture.write_ahead.WriteAheadProcessor`): a store
        seals the record and commits it holding it, so no gate record sealed after it is durable before it."""
        # Here, in the caller's thread: the span's parent is the caller's current span (the store may seal the
        # record on another thread, committing several callers' records at once).
        self._parent, self._context = record_context(recorder.tracer)
        log = getattr(recorder.pipeline, "log", None)
        self.convert_seconds: float | None = getattr(log, "seal_seconds", None)
        """How long the store may hold it before writing it to Parquet: the pipeline's file age."""

    def __call__(self) -> tuple[list[Any], bytes]:
        """Seal the record now (it takes the chain's next link): the ended spans to store, and their OTLP bytes.

        The spans are the records sealed before it that are not durable yet
        (see :meth:`otel_replay.Telemetry.take_sealed_before`), then its own.
        Called once, on any thread, holding the pipeline's write order; if its
        store does not keep them after all, it calls :meth:`give_back`.
        """
        tracer, name, attributes = self._recorder.tracer, self._name, self._attributes
        # The records sealed before this one that a crash could still take: kept in the same commit (or written to
        # Parquet first), so this record, durable once it commits, never follows a lost one in its chain.
        before = self._before = self._pipeline.take_sealed_before()
        try:
            start_ns = time.time_ns()
            parent, ctx = self._parent, self._context
            seal = self._unkept = self._chain.seal(
                self._record_id, name, start_ns, attributes, span_place(ctx.trace_id, ctx.span_id)
            )
            span = ended_record_span(tracer, parent, ctx, name, start_ns, attributes, self._links)
            spans = [*before, span]
            body = self._recorder.encode(spans)
        except BaseException:
            self.give_back()
            raise
        self.ref, self.seal = SpanRef(f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}", start_ns), seal
        return spans, body

    def committed(self, sync: Callable[[], None]) -> None:
        """Its store committed it (holding the write order): ``sync()`` puts that commit on disk.

        The pipeline calls it before its next fsync of a record sealed after
        this one, so no such record is on disk ahead of this one (and of the
        records it took) when the store does not sync each commit itself.
        """
        self._pipeline.sync_before_next_write(sync)

    def give_back(self) -> None:
        """Its store did not keep it: the records :meth:`__call__` took go to the batch queue; a sealed one is voided.

        Once sealed, the record took its chain's next link: a void record
        sealed now names that link (:mod:`otel_replay.voids`), so ``verify``
        does not read the gap it leaves as a deletion. Called at most once
        to effect (again: nothing more happens).
        """
        before, self._before = self._before, []
        if before:
            self._pipeline.hand_back(before)
        seal, self._unkept = self._unkept, None
        if seal is not None:
            self._recorder.void(self._name, self._record_id, seal)


_current = Recorder()


def get_recorder() -> Recorder:
    """The recorder capture APIs use."""
    return _current


def set_recorder(recorder: Recorder) -> Recorder:
    """Replace the recorder; returns the previous one (to restore later)."""
    global _current
    previous, _current = _current, recorder
    return previous
