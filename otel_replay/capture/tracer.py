"""``DecisionTracer``: reasoning traces and their outcomes (seed 002's tracer).

A traced decision is a ``replay.decision`` span with source ``tracer``: who
decided, what type of decision, the rationale, the confidence and the inputs.
An outcome is a ``replay.outcome`` span linked to its decision. Outcomes are
immutable: a second outcome for one decision is refused, across processes
when there is a dataset (a claim per decision is taken before the outcome is
emitted, or, in the dataset :func:`otel_replay.configure` writes to, in the
same commit that stores the outcome beside it), and an outcome is durable
when ``record_outcome()`` returns (see :meth:`DecisionTracer.record_outcome`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from opentelemetry.trace import Link, SpanContext, TraceFlags

from otel_replay import semconv as sc
from otel_replay._json import normalise
from otel_replay.capture.context import current_ids
from otel_replay.capture.reader import DatasetReader
from otel_replay.capture.recorder import HeldRecord, Recorder, get_recorder
from otel_replay.capture.sinks import Sink
from otel_replay.errors import CaptureError, OutcomeAlreadyRecorded, RecordNotFound
from otel_replay.records import DecisionRecord, OutcomeRecord, SpanRef, id_problem, new_id, trace_body
from otel_replay.storage.claim_store import shown_id
from otel_replay.storage.outcome_claims import claim_outcome, claim_outcomes

__all__ = ["DecisionTracer", "RecordedOutcomes", "link_to", "trace_body"]

_log = logging.getLogger(__name__)


def _same(one: str | os.PathLike[str], other: str | os.PathLike[str]) -> bool:
    """Whether two datasets are one local directory (an ``s3://`` dataset never is)."""
    first, second = os.fspath(one), os.fspath(other)
    if "://" in first or "://" in second:
        return False
    return first == second or os.path.abspath(first) == os.path.abspath(second)


def link_to(span: SpanRef, attributes: dict[str, Any] | None = None) -> Link | None:
    """An OpenTelemetry link to a recorded span (``None`` when the ref is empty)."""
    if not span.trace_id or set(span.trace_id) == {"0"}:
        return None
    ctx = SpanContext(int(span.trace_id, 16), int(span.span_id, 16), is_remote=True, trace_flags=TraceFlags(1))
    return Link(ctx, attributes)


def _held_outcome(outcome: OutcomeRecord, hold: HeldRecord, claim: object) -> OutcomeRecord:
    """The outcome ``hold`` sealed in its claim's transaction; raises the claim's failure instead."""
    if isinstance(claim, BaseException):
        raise claim
    assert hold.ref is not None and hold.seal is not None
    # Built, not replace()d: replace() looks the fields up again for every record.
    o = outcome
    return OutcomeRecord(o.record_id, o.decision_id, o.outcome_correct, o.note, o.correlation_id, hold.ref, hold.seal)


MEMORY = 100_000
"""How many decisions a tracer remembers in process (span refs and outcomes)."""


def _remember(table: dict[str, Any], key: str, value: Any) -> None:
    table[key] = value
    if len(table) > MEMORY:
        del table[next(iter(table))]


@dataclass
class RecordedOutcomes:
    """What :meth:`DecisionTracer.record_outcomes` did, by decision id.

    A decision given once is in exactly one of the two; one given twice is
    recorded once (the first) and in :attr:`failed` for the repeat.
    """

    recorded: dict[str, OutcomeRecord] = field(default_factory=dict)
    """The outcomes recorded (sealed, durable as :meth:`DecisionTracer.record_outcome` makes one)."""
    failed: dict[str, Exception] = field(default_factory=dict)
    """Why the others were not: what :meth:`DecisionTracer.record_outcome` would have raised (nothing recorded)."""


class DecisionTracer:
    """Record reasoning decisions and, later, whether they were correct.

    Args:
        sink: receives every sealed :class:`DecisionRecord` and
            :class:`OutcomeRecord` (default: the recorder's memory sink).
        store: an open :class:`otel_replay.Store`; when given, outcomes are also
            checked against the dataset, and the outcome claim is taken in
            the store's dataset (without one, in the dataset
            :func:`otel_replay.configure` writes to, if any), so immutability
            holds across processes.

    """

    def __init__(self, sink: Sink | None = None, store: DatasetReader | None = None) -> None:
        """Create a tracer; see the class docstring."""
        self._sink = sink
        self._store = store
        self._lock = threading.Lock()
        # Bounded: a long-running agent must not grow without limit. Beyond the
        # newest MEMORY decisions, the store (when given) is what enforces the rule.
        self._spans: dict[str, SpanRef] = {}
        self._outcomes: dict[str, OutcomeRecord | None] = {}  # None: an outcome seen only in the store
        self._records: dict[str, DecisionRecord] = {}

    def _append(self, record: Any) -> None:
        (self._sink if self._sink is not None else get_recorder().sink).append(record)

    def decision(
        self,
        agent_id: str,
        decision_type: str,
        rationale: str,
        confidence: float | None = None,
        inputs: dict[str, Any] | None = None,
        session_id: str | None = None,
        correlation_id: str | None = None,
    ) -> str:
        """Record one reasoning decision; returns its decision id (the record id)."""
        if confidence is not None and not (isinstance(confidence, (int, float)) and 0.0 <= confidence <= 1.0):
            raise CaptureError(f"decision {decision_type!r}: confidence must be a number in [0, 1], got {confidence!r}")
        problem = id_problem({"agent_id": agent_id, "session_id": session_id, "correlation_id": correlation_id})
        if problem is not None:
            raise CaptureError(f"decision {decision_type!r}: {problem}")
        scope = current_ids()
        record = DecisionRecord(
            record_id=new_id(),
            source="tracer",
            decision_type=decision_type,
            inputs=normalise(inputs or {}, where=f"decision {decision_type!r} inputs"),
            rationale=rationale,
            confidence=None if confidence is None else float(confidence),
            correlation_id=correlation_id or scope.correlation_id,
            session_id=session_id or scope.session_id,
            agent_id=agent_id or scope.agent_id,
        )
        span, seal = get_recorder().emit(sc.SPAN_DECISION, record.record_id, record.to_attributes())
        sealed = replace(record, span=span, seal=seal)
        with self._lock:
            _remember(self._spans, record.record_id, span)
            _remember(self._records, record.record_id, sealed)
        self._append(sealed)
        return record.record_id

    def record_outcome(self, decision_id: str, outcome_correct: bool, note: str | None = None) -> OutcomeRecord:
        """Record whether ``decision_id`` turned out correct. Allowed once per decision.

        With a dataset (the store's, else the one :func:`otel_replay.configure`
        writes to) the decision's outcome claim is taken there first
        (:mod:`otel_replay.storage.outcome_claims`), so a second outcome is
        refused in any process, also while the first is still unflushed.
        When emitting fails, the claim is given back and the outcome can be
        recorded again.

        Durable on return. In the local dataset :func:`otel_replay.configure`
        writes to, with only its span processors: sealed inside the claim's
        transaction and stored with the claim in one SQLite commit
        (:mod:`otel_replay.storage.outcome_log`), which survives the process
        being killed; with ``OTEL_REPLAY_OUTCOME_SYNC=machine`` also a machine
        crash (the commit is synced; concurrent calls share the sync). It is
        written to Parquet in the background, at ``force_flush()`` and at
        shutdown, and recovered by the next ``configure()`` or
        ``otel_replay.open()`` after a crash. Otherwise (processors of your
        own, another dataset, ``s3://``): the claim is synced, then the
        outcome fsynced in the pipeline's write-ahead log. Through a provider
        of your own the outcome is queued like any span: call ``flush()``
        where you need it stored.

        Raises:
            OutcomeAlreadyRecorded: an outcome exists (or is claimed) for this decision already.
            RecordNotFound: a store was given and holds no such decision.
            CaptureError: the telemetry pipeline was shut down (the outcome would be lost).

        """
        if not isinstance(outcome_correct, bool):
            raise CaptureError(f"outcome for {shown_id(decision_id)}: outcome_correct must be True or False")
        recorder = get_recorder()
        if recorder.closed:
            raise CaptureError(
                f"outcome for {shown_id(decision_id)}: the telemetry pipeline was shut down (Telemetry.shutdown()), "
                "so it would be lost; call otel_replay.configure() again before recording it"
            )
        with self._lock:
            if self._store is not None:
                self._store.refresh()  # see what other processes wrote since the store was opened
            decided, span = self._reserve(decision_id)
        try:
            sealed = self._emit_outcome(recorder, decision_id, outcome_correct, note, decided, span)
        except OutcomeAlreadyRecorded:
            raise  # claimed elsewhere: the reservation stands for it
        except BaseException:
            self._give_back(decision_id)
            raise
        with self._lock:
            _remember(self._outcomes, decision_id, sealed)
        self._append(sealed)
        return sealed

    def _reserve(self, decision_id: str) -> tuple[DecisionRecord | None, SpanRef | None]:
        """Reserve ``decision_id``'s outcome in this process (caller holds the lock): the decision and its span.

        A second call in this process is refused from here on; the caller gives
        the reservation back when its outcome fails other than by a refusal.
        """
        if decision_id in self._outcomes:
            raise OutcomeAlreadyRecorded(
                f"decision {shown_id(decision_id)} already has an outcome; outcomes are immutable"
            )
        span = self._spans.get(decision_id)
        decided = self._records.get(decision_id)
        if self._store is not None:
            if decided is None:
                decided = self._stored_decision(decision_id)
            span = span or (decided.span if decided is not None else None)
            if self._store.has_outcome(decision_id):
                _remember(self._outcomes, decision_id, None)
                raise OutcomeAlreadyRecorded(
                    f"decision {shown_id(decision_id)} already has an outcome in {self._store.dataset}; outcomes are "
                    "immutable"
                )
            if span is None:
                raise RecordNotFound(f"no decision {shown_id(decision_id)} in {self._store.dataset}")
        _remember(self._outcomes, decision_id, None)
        return decided, span

    def _give_back(self, decision_id: str) -> None:
        with self._lock:
            if decision_id in self._outcomes and self._outcomes[decision_id] is None:
                del self._outcomes[decision_id]

    def record_outcomes(self, outcomes: Iterable[tuple[str, bool] | tuple[str, bool, str | None]]) -> RecordedOutcomes:
        """Record many outcomes, ``(decision_id, outcome_correct)`` or ``(decision_id, outcome_correct, note)`` each.

        For reconciliation jobs: each decision gets its outcome exactly once,
        as through :meth:`record_outcome` (same records, same durability on
        return, same refusals), but in the local dataset
        :func:`otel_replay.configure` writes to, the claims and outcomes share
        SQLite transactions (up to 1,000 decisions per commit). A decision's
        failure is its own: it is in :attr:`RecordedOutcomes.failed` with the
        exception :meth:`record_outcome` would have raised, and the others are
        recorded. A decision id given twice gets one outcome (the first); the
        second is refused.

        Raises:
            CaptureError: an entry is not such a tuple, or the telemetry pipeline was shut down (nothing recorded).

        """
        items: list[tuple[str, bool, str | None]] = []
        for at, entry in enumerate(outcomes):
            if not isinstance(entry, tuple) or len(entry) not in (2, 3) or not isinstance(entry[0], str):
                raise CaptureError(f"record_outcomes: entry {at} must be (decision_id, outcome_correct[, note]), "
                                   f"got {str(entry)[:200]!r}")
            if not isinstance(entry[1], bool) or (len(entry) == 3 and not isinstance(entry[2], (str, type(None)))):
                raise CaptureError(f"record_outcomes: entry {at} (decision {shown_id(entry[0])}): outcome_correct "
                                   "must be True or False and the note a string or None")
            items.append((entry[0], entry[1], entry[2] if len(entry) == 3 else None))
        recorder = get_recorder()
        if recorder.closed:
            raise CaptureError("record_outcomes: the telemetry pipeline was shut down (Telemetry.shutdown()), so "
                               "they would be lost; call otel_replay.configure() again before recording them")
        result = RecordedOutcomes()
        reserved: list[tuple[str, bool, str | None, DecisionRecord | None, SpanRef | None]] = []
        with self._lock:
            if self._store is not None:
                self._store.refresh()
            for decision_id, correct, note in items:
                try:
                    reserved.append((decision_id, correct, note, *self._reserve(decision_id)))
                except Exception as exc:  # noqa: BLE001 - this decision's (reserved only when already recorded)
                    result.failed.setdefault(decision_id, exc)
        dataset = self._store.dataset if self._store is not None else recorder.dataset
        local = bool(dataset and recorder.dataset and _same(dataset, recorder.dataset))
        held: list[tuple[OutcomeRecord, HeldRecord]] = []
        scope_correlation: str | None = None  # the scope's, looked up once for the call (it is the same throughout)
        for decision_id, correct, note, decided, span in reserved:
            hold = None
            if local:  # sealed in the claims' shared transactions, as record_outcome() seals one in its own
                try:
                    correlation = _text_id(decided.correlation_id) if decided else None
                    if not correlation:
                        if scope_correlation is None:
                            scope_correlation = current_ids().correlation_id or ""
                        correlation = scope_correlation or None
                    outcome = OutcomeRecord(new_id(), decision_id, correct, note, correlation)
                    link = link_to(span) if span is not None else None
                    links = [link] if link else []
                    hold = recorder.held(sc.SPAN_OUTCOME, outcome.record_id, outcome.to_attributes(), links=links)
                except Exception as exc:  # noqa: BLE001 - this decision's failure
                    self._give_back(decision_id)
                    result.failed[decision_id] = exc
                    continue
            if hold is not None:
                held.append((outcome, hold))
            else:  # one at a time, as record_outcome() does it
                self._settle(result, decision_id, partial(self._emit_outcome, recorder, decision_id, correct, note,
                                                          decided, span))
        if held:
            assert dataset is not None
            claims = claim_outcomes(dataset, [(o.decision_id, o.record_id, o.outcome_correct, h) for o, h in held])
            sealed: list[OutcomeRecord] = []
            for (outcome, hold), claim in zip(held, claims, strict=True):
                try:
                    sealed.append(_held_outcome(outcome, hold, claim))
                except OutcomeAlreadyRecorded as exc:
                    result.failed[outcome.decision_id] = exc  # claimed elsewhere: the reservation stands for it
                except Exception as exc:  # noqa: BLE001 - this decision's failure; the others go on
                    self._give_back(outcome.decision_id)
                    result.failed[outcome.decision_id] = exc
            with self._lock:  # once for all of them
                for record in sealed:
                    _remember(self._outcomes, record.decision_id, record)
            for record in sealed:
                self._append(record)
                result.recorded[record.decision_id] = record
        return result

    def _settle(self, result: RecordedOutcomes, decision_id: str, emit: Callable[[], OutcomeRecord]) -> None:
        """One decision of :meth:`record_outcomes`: its outcome from ``emit()``, or its failure."""
        try:
            sealed = emit()
        except OutcomeAlreadyRecorded as exc:
            result.failed[decision_id] = exc  # claimed elsewhere: the reservation stands for it
            return
        except Exception as exc:  # noqa: BLE001 - this decision's failure; the others go on
            self._give_back(decision_id)
            result.failed[decision_id] = exc
            return
        with self._lock:
            _remember(self._outcomes, decision_id, sealed)
        self._append(sealed)
        result.recorded[decision_id] = sealed

    def _emit_outcome(
        self,
        recorder: Recorder,
        decision_id: str,
        outcome_correct: bool,
        note: str | None,
        decided: DecisionRecord | None,
        span: SpanRef | None,
    ) -> OutcomeRecord:
        """Claim the decision's outcome in the dataset (if any), then seal and emit it; the sealed record."""
        # The decision's correlation id, so the outcome is stored (and compacted) beside its chain's spans;
        # the scope's when the decision is not known here.
        stored = _text_id(decided.correlation_id) if decided is not None else None
        correlation_id = stored or current_ids().correlation_id
        outcome = OutcomeRecord(new_id(), decision_id, outcome_correct, note, correlation_id)
        dataset = self._store.dataset if self._store is not None else recorder.dataset
        link = link_to(span) if span is not None else None
        if dataset and recorder.dataset and _same(dataset, recorder.dataset):
            links = [link] if link else []
            held = recorder.held(sc.SPAN_OUTCOME, outcome.record_id, outcome.to_attributes(), links=links)
            if held is not None:  # sealed inside the claim's transaction and stored with it: durable as it commits
                return _held_outcome(outcome, held, claim_outcome(dataset, decision_id, outcome.record_id,
                                                                  outcome_correct, held))
        claim = claim_outcome(dataset, decision_id, outcome.record_id, outcome_correct) if dataset else None
        try:
            ref, seal, durable = recorder.emit_durable(
                sc.SPAN_OUTCOME, outcome.record_id, outcome.to_attributes(), links=[link] if link else []
            )
        except BaseException:
            if claim is not None:
                claim.release()  # nothing was emitted: the decision may still get its outcome
            raise
        if durable is False:  # logged by the pipeline; the outcome still reaches Parquet the usual way
            recorder.note_capture_error()
            _log.error(
                "otel-replay: outcome %s of decision %s is claimed and emitted, but could not be made durable "
                "before record_outcome() returned; a crash before the next flush loses it (its claim stays)",
                outcome.record_id,
                decision_id,
            )
        return replace(outcome, span=ref, seal=seal)

    def _stored_decision(self, decision_id: str) -> DecisionRecord | None:
        assert self._store is not None
        try:
            return self._store.record(decision_id)
        except RecordNotFound:
            return None

    def query_traces(
        self, correlation_id: str | None = None, session_id: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Decisions by correlation and/or session id (``None`` matches any), oldest first, at most ``limit``.

        Each is a dict with the ``decisions`` view's fields plus its outcome
        (``outcome_id``, ``outcome_correct``, ``outcome_note``). With a store
        this reads the dataset (outcomes only from verified records); without
        one, the newest :data:`MEMORY` decisions of this process.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise CaptureError(f"query_traces: limit must be a positive integer, got {limit!r}")
        if self._store is not None:
            self._store.refresh()
            return self._store.traces(correlation_id=correlation_id, session_id=session_id, limit=limit)
        with self._lock:
            records = [
                r
                for r in self._records.values()
                if (correlation_id is None or r.correlation_id == correlation_id)
                and (session_id is None or r.session_id == session_id)
            ]
            outcomes = {r.record_id: self._outcomes.get(r.record_id) for r in records}
        records.sort(key=lambda r: (r.span.start_ns, r.record_id))
        return [trace_body(r, outcomes[r.record_id]) for r in records[:limit]]


def _text_id(value: object) -> str | None:
    """A stored decision's correlation id as text: a build from before ids were refused unless text stored a number."""
    return value if value is None or isinstance(value, str) else str(value)
