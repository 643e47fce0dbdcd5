"""``configure()``: one call from nothing to spans landing in a Parquet dataset."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, NamedTuple

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from otel_replay import redaction, settings
from otel_replay import semconv as sc
from otel_replay.capture.context import CorrelationSpanProcessor
from otel_replay.capture.global_provider import forward_globally
from otel_replay.capture.recorder import Recorder, get_recorder, mark_shut_down, set_recorder
from otel_replay.capture.sampling import RecordSampler
from otel_replay.capture.write_ahead import SpanLog, WriteAheadProcessor, recover
from otel_replay.errors import CaptureError, ConfigError, OtelReplayError
from otel_replay.exporters import ParquetSpanExporter
from otel_replay.integrity import load_signing_key
from otel_replay.storage.claim_store import sync_outcomes
from otel_replay.storage.outcome_claims import close_outcomes, flush_outcomes

__all__ = ["Pending", "Telemetry", "configure"]

_log = logging.getLogger(__name__)
_LOG_WAIT = 10.0
"""Seconds an outcome stored beside its claim waits at most for the gate records queued before it (logged)."""


class Pending(NamedTuple):
    """A record :meth:`Telemetry.queue_span` queued in the log (or could not): for :meth:`Telemetry.wait_logged`."""

    spans: list[ReadableSpan]
    """The record's span, last, after the held ones written with it."""
    queued: Any
    """What the log answered (its :class:`~otel_replay.capture.write_ahead.Queued`); ``None`` when not queued."""
    error: Exception | None
    """Why it was not queued."""


class _StillHeld(OtelReplayError):
    """A write-ahead's spans are held again: the store's commit of the records sealed before them was not synced."""


class Telemetry:
    """What :func:`configure` set up; flush it, shut it down, or use it as a context manager.

    ``recorder`` is the :class:`~otel_replay.capture.Recorder` capture uses
    while this pipeline is open (``recorder.flush()`` flushes this pipeline).
    ``bare_processors``: the provider's span processors as :func:`configure`
    set them up (``None`` without a write-ahead log); while they are all the
    provider has, a gate record bound for the log is built without the SDK's
    span (:mod:`otel_replay.capture.direct_spans`).
    """

    def __init__(
        self,
        provider: TracerProvider,
        exporter: ParquetSpanExporter,
        log: SpanLog | None = None,
        ahead: WriteAheadProcessor | None = None,
    ) -> None:
        """Internal: made by :func:`configure`."""
        self.provider = provider
        self.exporter = exporter
        self.log = log
        self._ahead = ahead
        if ahead is not None and log is not None:
            ahead.on_claimed = self.queue_span  # queued as the span ends: see queue_claimed
            ahead.before_release = self._sync_store  # an outcome's commit on disk before records sealed after it
        processors = getattr(provider._active_span_processor, "_span_processors", None)
        self.bare_processors = processors if log is not None and ahead is not None else None
        self.recorder: Recorder | None = None
        self._previous: Recorder | None = None
        self._store_sync: Callable[[], None] | None = None  # see sync_before_next_write
        self._closed = False

    def claim(self, span_id: int) -> bool:
        """Keep the span ``span_id`` out of the batch queue, for :meth:`write_ahead`; ``False``: no log here."""
        if self._ahead is None or self.log is None or self._closed:
            return False
        self._ahead.claim(span_id)
        return True

    @property
    def write_order(self) -> threading.RLock | None:
        """The lock a durable record is sealed and queued under (see :class:`WriteAheadProcessor`); ``None``: no log."""
        return self._ahead.write_order if self._ahead is not None and self.log is not None else None

    def queue_claimed(self, span_id: int) -> Pending | None:
        """:meth:`queue_span` for the claimed, ended span ``span_id``; ``None`` when it is not held here.

        The span was queued as it ended in the write-ahead processor (its
        ``on_claimed``), before the span processors added after it ran: a
        record one of them makes as it ends (a commit) follows this one in
        the chain, and so in the log.
        """
        assert self._ahead is not None
        taken = self._ahead.take(span_id)
        if taken is None or isinstance(taken, Pending):
            return taken
        return self.queue_span(taken)

    def queue_span(self, span: ReadableSpan) -> Pending:
        """Queue the ended ``span`` in the write-ahead log; :meth:`wait_logged` then waits for its fsync.

        Every record this process sealed before it goes first: the record
        spans held since the last append go into the same log record (one
        fsync), and when some went to the batch queue instead (before the
        first append, or released as too old or too many; see
        :class:`~otel_replay.capture.write_ahead.WriteAheadProcessor`) the
        queue and the exporter are flushed to Parquet before it. So a durable
        gate record is never preceded in its chain by a record a crash could
        still take (which ``verify`` would read as deleted).

        Called holding :attr:`write_order` from before the record's seal, so
        durable records are queued (and so made durable) in chain order; the
        wait is outside it, so concurrent commits still share an fsync. What
        could not be done is in the answer, for :meth:`wait_logged` to log and
        hand back.
        """
        assert self._ahead is not None and self.log is not None
        held, released = self._take_held()
        spans = [*held, span]
        try:
            self._sync_store()
        except Exception as exc:  # noqa: BLE001 - wait_logged reports it
            # Sealed after an outcome whose commit is not on disk: held again, as release_held keeps them, never
            # written to Parquet before that commit is (a machine crash could keep them and lose the outcome).
            self._ahead.hold_again(spans, released)
            return Pending(spans, None, _StillHeld(f"the outcomes committed before it are not synced ({exc})"))
        try:
            if released:
                self._flush_released()
            return Pending(spans, self.log.enqueue(spans), None)
        except Exception as exc:  # noqa: BLE001 - the spans still go to Parquet; wait_logged reports it
            return Pending(spans, None, exc)

    def sync_before_next_write(self, sync: Callable[[], None]) -> None:
        """``sync()`` puts a store's commit of records sealed so far on disk: the next write-ahead calls it first.

        Called holding :attr:`write_order` (by an outcome's hold, once its
        claim store committed it): the outcome and the records it took are
        then on disk before any gate record sealed after them is fsynced,
        also when the store does not sync its commits
        (``OTEL_REPLAY_OUTCOME_SYNC=process``) or syncs them later.
        """
        self._store_sync = sync

    def _sync_store(self) -> None:
        """The store commit :meth:`sync_before_next_write` named, on disk (kept for the next one if that failed)."""
        sync = self._store_sync
        if sync is not None:
            sync()
            self._store_sync = None

    def _take_held(self) -> tuple[list[ReadableSpan], bool]:
        """The record spans held since the last take (holding from now on), and whether some went to the queue."""
        assert self._ahead is not None and self.log is not None
        ahead = self._ahead
        ahead.hold_records(self.log.seal_seconds)
        return ahead.take_held()

    def _flush_released(self) -> None:
        """The batch queue, then the exporter's buffer, written to Parquet; raises when that failed."""
        # Not the exporter's force_flush: it also answers False for a span dropped earlier, which is counted, not
        # pending.
        if not self.provider.force_flush():
            raise OtelReplayError("the batch queue could not be flushed first (timed out)")
        self.exporter.writer.flush()

    def take_sealed_before(self) -> list[ReadableSpan]:
        """For a record a store other than the log makes durable (an outcome beside its claim): what goes with it.

        Called holding :attr:`write_order`, before the record is sealed.
        Every record this process sealed before it and a crash could still
        take is returned (the record spans held since the last write-ahead:
        the store keeps them in the same commit) or written to Parquet first
        (those that went to the batch queue meanwhile). So, as with a gate
        record (:meth:`queue_span`), a durable record never follows in its
        chain one a crash could take, which ``verify`` would read as deleted.
        Raises ``CaptureError`` once the pipeline is shut down (the outcome
        would land past shutdown's conversion), and when the batch queue
        could not be written; nothing is taken then.
        A gate record queued in the log on another thread (sealed before it,
        its fsync still to come) is waited for first.
        """
        assert self.log is not None
        if self._closed:  # past shutdown's conversion of the outcomes (and its batch queue shut down)
            raise CaptureError(
                "the telemetry pipeline was shut down (Telemetry.shutdown()), so the outcome would be lost; "
                "call otel_replay.configure() again before recording it"
            )
        if not self.log.wait_queued(_LOG_WAIT):
            _log.warning(
                "otel-replay: an outcome stored beside its claim did not wait for the write-ahead log (a record "
                "queued there for over %.0f s): a crash before it is fsynced could make verify read it as deleted",
                _LOG_WAIT,
            )
        held, released = self._take_held()
        if released:
            try:
                self._flush_released()
            except BaseException:
                assert self._ahead is not None
                self._ahead.give_back(held)  # also when none were held: the next one flushes first, as this did
                raise
        return held

    def hand_back(self, spans: list[ReadableSpan]) -> None:
        """Spans :meth:`take_sealed_before` returned that their store did not keep: to the batch queue after all."""
        if spans:
            assert self._ahead is not None
            self._ahead.give_back(spans)

    def wait_logged(self, pending: Pending) -> bool:
        """``True`` once the record :meth:`queue_span` queued is fsynced.

        ``False`` when it was not queued or its fsync failed: logged, and its
        spans handed to the batch queue, to reach Parquet the usual way.
        """
        assert self._ahead is not None and self.log is not None
        spans, queued, error = pending
        if queued is not None:
            try:
                self.log.wait(queued)
                return True
            except Exception as exc:  # noqa: BLE001 - the spans still go to Parquet; the caller reports it
                error = exc
        span = spans[-1]
        span_id = span.context.span_id if span.context is not None else 0
        _log.error(
            "otel-replay: span %016x could not be written to the write-ahead log %s: %s: %s",
            span_id,
            self.log.directory,
            type(error).__name__,
            error,
        )
        if not isinstance(error, _StillHeld):
            self._ahead.give_back(spans)
        return False

    @property
    def dataset(self) -> str:
        """The dataset directory spans are written to."""
        return self.exporter.dataset_dir

    @property
    def closed(self) -> bool:
        """True once :meth:`shutdown` was called."""
        return self._closed

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export every finished span and write it to Parquet now.

        ``False`` after shutdown, when the write failed, or when a span handed
        to the exporter since the previous flush was dropped (see ``exporter.stats``).
        """
        if self._closed:
            return False
        # Under the write order: a write-ahead that took the held records has queued them in the log (which the
        # seal below makes durable) before the flush begins, so none is left out of a flush that returns True.
        # The outcomes are flushed after it: their store seals and commits holding its own lock, then the write
        # order (claim_store._write_orders); taking that lock under the write order here would stall both.
        with self.write_order or contextlib.nullcontext():
            ok = self._force_flush(timeout_millis)
        return self._flush_outcomes() and ok

    def _force_flush(self, timeout_millis: int) -> bool:
        ok = self.provider.force_flush(timeout_millis)
        ok = self.exporter.force_flush(timeout_millis) and ok
        if self.log is not None:
            try:
                self.log.convert(seal=True)  # records already durable in the log: to Parquet too, for readers
            except Exception as exc:  # noqa: BLE001 - still in the log, converted later; reported as a failed flush
                _log.error("otel-replay: converting the write-ahead log %s failed: %s", self.log.directory, exc)
                return False
        return ok

    def _flush_outcomes(self) -> bool:
        """The outcomes this process holds beside their claims, written to Parquet; ``False`` when that failed."""
        try:
            flush_outcomes(self.dataset)  # outcomes held beside their claims: to Parquet too
        except Exception as exc:  # noqa: BLE001 - still held in the claim store, converted later; a failed flush
            _log.error("otel-replay: writing the outcomes held in %s failed: %s", self.dataset, exc)
            return False
        return True

    def shutdown(self) -> None:
        """Flush everything, stop the pipeline and restore the recorder that was current before.

        Records emitted through a shut-down pipeline are lost, so they are not
        silent: ``audit()`` refuses to start (``CaptureError``) and the tracer,
        the audit log and the gate log one warning and count the rest in
        ``get_recorder().stats.dropped_after_shutdown``. That includes the
        restored default recorder when this provider became the global one.
        """
        if self._closed:
            return
        order = self.write_order
        self._closed = True
        mark_shut_down(self.provider)
        # Under the write order: a write-ahead that took the held records queues them in the log before it closes
        # (never hands them back to the batch queue shut down meanwhile, which would drop them).
        with order or contextlib.nullcontext():
            self.provider.shutdown()
            if self.log is not None:
                self.log.close()  # what the gate made durable reaches Parquet too
        close_outcomes(self.dataset)  # and the outcomes held beside their claims
        if get_recorder() is self.recorder:
            # Skip recorders whose pipelines were shut down meanwhile (configure() calls closed out of order).
            previous = self._previous
            while previous is not None and isinstance(previous.pipeline, Telemetry) and previous.pipeline.closed:
                previous = previous.pipeline._previous
            if previous is not None:
                set_recorder(previous)

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()


def _resource(service_name: str | None) -> Resource:
    """The SDK's precedence (``OTEL_SERVICE_NAME``, then ``OTEL_RESOURCE_ATTRIBUTES``), an explicit name first."""
    if service_name is not None:
        return Resource.create({SERVICE_NAME: service_name})
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "otel-replay"}))
    return resource


SPAN_ATTRIBUTE_COUNT = 1024
"""``configure()``'s provider keeps at least this many attributes per span (the SDK's default is 128)."""
_LENGTH_VARIABLES = ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT")


def _span_limits() -> SpanLimits:
    """The SDK's limits from the environment, less what would cut a sealed record after it was sealed.

    Values are never cut (``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` and
    ``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT`` do not apply to this provider)
    and a span keeps at least :data:`SPAN_ATTRIBUTE_COUNT` attributes: a cut
    value or a dropped attribute would make the record fail its hash check.
    """
    try:
        env = SpanLimits()  # the SDK's reading of every OTEL_*_LIMIT variable
    except ValueError as exc:  # the SDK's message names the variable
        raise ConfigError(str(exc)) from None
    ignored = [name for name in _LENGTH_VARIABLES if settings.env_text(name)]
    if ignored:
        _log.info("otel-replay: configure() ignores %s: sealed records are stored whole", " and ".join(ignored))
    count = env.max_span_attributes
    return SpanLimits(
        max_span_attributes=SpanLimits.UNSET if count is None else max(count, SPAN_ATTRIBUTE_COUNT),
        max_attribute_length=SpanLimits.UNSET,
        max_span_attribute_length=SpanLimits.UNSET,
    )


def _check_arguments(service_name: Any, signing_key: Any, set_global: Any) -> None:
    """Arguments of the wrong type refused with a one-line ``ConfigError``, not a ``TypeError`` or a wrong resource."""
    if service_name is not None and (not isinstance(service_name, str) or not service_name.strip()):
        raise ConfigError(f"service_name={service_name!r}"[:120] + " must be non-blank text")
    if signing_key is not None and not isinstance(signing_key, (str, bytes)):
        raise ConfigError(f"signing_key must be str or bytes, not {type(signing_key).__name__}")
    if not isinstance(set_global, bool):
        raise ConfigError(f"set_global={set_global!r}"[:120] + " must be True or False")


def _queue_size() -> int:
    """The batch queue: ``OTEL_BSP_MAX_QUEUE_SIZE`` checked here, else :data:`settings.CAPTURE_QUEUE_SIZE`.

    The SDK would log a malformed value and carry on with its default, or
    raise a ``ValueError`` naming no variable for a queue smaller than its
    export batch; both are refused here, before anything is set up.
    """
    size = int(
        settings.env_number(settings.BSP_MAX_QUEUE_SIZE, settings.CAPTURE_QUEUE_SIZE, integer=True, maximum=2**40)
    )
    raw = settings.env_text(_BSP_EXPORT_BATCH_SIZE)
    try:
        batch = int(raw) if raw is not None else _SDK_EXPORT_BATCH_SIZE
    except ValueError:  # the SDK logs it and uses its default
        batch = _SDK_EXPORT_BATCH_SIZE
    if batch > size:
        raise ConfigError(
            f"{settings.BSP_MAX_QUEUE_SIZE}={size} must be at least the export batch size "
            f"({_BSP_EXPORT_BATCH_SIZE}, {batch})"
        )
    return size


_BSP_EXPORT_BATCH_SIZE = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"
_SDK_EXPORT_BATCH_SIZE = 512
"""The SDK's default export batch size."""


def configure(
    dataset: str | os.PathLike[str] | None = None,
    service_name: str | None = None,
    *,
    signing_key: str | bytes | None = None,
    set_global: bool = True,
    max_file_age_seconds: float | None = None,
) -> Telemetry:
    """Wire a ``TracerProvider`` + ``BatchSpanProcessor`` + :class:`ParquetSpanExporter`.

    Args:
        dataset: dataset directory (``OTEL_REPLAY_DATASET``, default ``./traces``);
            a relative path is made absolute here, against the current directory.
        service_name: ``service.name`` resource attribute. Given, it wins;
            otherwise the SDK's order applies (``OTEL_SERVICE_NAME``, then
            ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``), then ``otel-replay``.
            Other ``OTEL_RESOURCE_ATTRIBUTES`` are kept either way.
        signing_key: the record signing secret (see :mod:`otel_replay.integrity`);
            resolved now, so a bad or missing key fails here.
        set_global: also send other instrumentations' spans (the global
            provider's) to this pipeline, when no provider of the user's is
            installed: the global one is a forwarder, installed once, that
            follows the next ``configure()`` after a shutdown (see
            :mod:`otel_replay.capture.global_provider`).
        max_file_age_seconds: how long spans may sit in the exporter's buffer.

    Raises:
        ConfigError: the signing key, ``max_file_age_seconds`` or an
            ``OTEL_REPLAY_*`` variable is invalid (one line naming it).
        DatasetError: the dataset directory cannot be created.

    The provider stores sealed records whole: the SDK's attribute value
    length limits do not apply to it and it keeps at least
    :data:`SPAN_ATTRIBUTE_COUNT` attributes per span. It samples with
    :class:`~otel_replay.RecordSampler`: every record span is kept, under an
    unsampled parent too; other spans are sampled as ``OTEL_TRACES_SAMPLER`` says.

    Users with their own ``TracerProvider`` skip this and add
    ``CorrelationSpanProcessor()`` and ``BatchSpanProcessor(ParquetSpanExporter(dir))``,
    and build it with ``sampler=RecordSampler(their sampler)``.

    """
    # Absolute now: a later chdir must not move where this process's records, receipts and claims go.
    dataset = settings.absolute_dataset(settings.dataset_dir(dataset))
    _check_arguments(service_name, signing_key, set_global)
    redaction.check_settings()  # a bad OTEL_REPLAY_REDACT_* is refused here, not at the first write
    sync_outcomes()  # a bad OTEL_REPLAY_OUTCOME_SYNC is refused here, not at the first outcome
    queue = _queue_size()
    key = load_signing_key(signing_key)  # a bad or missing key fails here, not at the first seal
    if key is None:  # pragma: no cover - create=True makes a key when there is none
        raise ConfigError("no signing key could be found or created")
    limits = _span_limits()
    exporter = ParquetSpanExporter(dataset, max_age_seconds=max_file_age_seconds)
    # Every record span is sampled (audit data must not be sampled away); other spans follow OTEL_TRACES_SAMPLER.
    provider = TracerProvider(resource=_resource(service_name), span_limits=limits, sampler=RecordSampler())
    provider.add_span_processor(CorrelationSpanProcessor())
    # A deeper queue than the SDK's 2,048 unless the user set OTEL_BSP_MAX_QUEUE_SIZE: spans wait there
    # (not dropped) while the exporter hands a large file to its writer thread.
    # Records a gate must have durable before it returns skip the batch queue: they go to a write-ahead log of
    # this process (fsynced, group commit), converted to Parquet in the background. Logs a crashed process
    # left on this dataset are converted first.
    recover(dataset)
    log = SpanLog(dataset, seal_seconds=exporter.writer.max_age_seconds)
    ahead = WriteAheadProcessor(BatchSpanProcessor(exporter, max_queue_size=queue))  # sizes checked above
    provider.add_span_processor(ahead)
    if set_global:  # the global provider forwards to this pipeline while it is open: see global_provider
        forward_globally(provider)
    telemetry = Telemetry(provider, exporter, log, ahead)
    telemetry.recorder = Recorder(
        provider.get_tracer(sc.INSTRUMENTATION_NAME), key=key, dataset=dataset, pipeline=telemetry
    )
    telemetry._previous = set_recorder(telemetry.recorder)
    return telemetry
