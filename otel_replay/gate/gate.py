"""``ActionGate``: execute a verdict through a rail, and record what happened.

==============  ======================  ==================================
verdict         enforce_pre_commit      enforce_post_commit
==============  ======================  ==================================
ALLOW           allowed                 allowed (the action stands)
HUMAN_REVIEW    held                    held
ROLLBACK        blocked                 rolled_back (rail.compensate)
BLOCK           blocked                 reversed (rail.compensate)
(no receipt)    -                       compensation_unavailable
(rail raised)   -                       compensation_failed, re-raised
(done before)   -                       AlreadyCompensated raised, rail untouched
==============  ======================  ==================================

(:func:`otel_replay.execute_verdict`, which compensates every stored receipt
of a decision, reports a receipt done before as an ``already_compensated``
outcome and raises :class:`AlreadyCompensated` only when all of them were.)

Every call emits a sealed ``replay.gate`` span linked to the decision span,
so the dataset holds the whole story: decision, verdict, and what the gate did.

Compensation happens at most once per receipt, across threads, processes and
crashes: before the rail is called the gate takes a durable claim
(:mod:`otel_replay.gate.claims`) in the dataset, and the rail is handed an
idempotency key per receipt (``rail.compensate(receipt, idempotency_key=...)``)
so a resumed claim cannot refund twice on a rail that honours it. A
compensation's own gate record is flushed to the dataset before
:meth:`ActionGate.enforce_post_commit` returns.
"""

from __future__ import annotations

import atexit
import copy
import functools
import inspect
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_replay import semconv as sc
from otel_replay.capture.audit import current_decision, decision_in_block
from otel_replay.capture.context import current_ids
from otel_replay.capture.recorder import get_recorder
from otel_replay.capture.tracer import link_to
from otel_replay.errors import GateError
from otel_replay.gate.claims import ClaimState, CompensationClaims, idempotency_key
from otel_replay.gate.policy import FixAction, Verdict
from otel_replay.gate.rails import Rail
from otel_replay.gate.receipts import _text, receipt_id_of, stored_receipt
from otel_replay.location import resolve
from otel_replay.records import Action, GateRecord, SpanRef, new_id
from otel_replay.storage.backend import backend_for

_log = logging.getLogger(__name__)

__all__ = ["ALREADY_COMPENSATED", "ActionGate", "GateOutcome"]

ALREADY_COMPENSATED = "already_compensated"
"""``GateOutcome.executed`` of a receipt :func:`otel_replay.execute_verdict` skipped: compensated before."""


@dataclass(frozen=True)
class GateOutcome:
    """What the gate did: the fix applied, ``executed`` and a human-readable detail."""

    fix: FixAction | None
    executed: str
    detail: str
    receipt: Any = None


def _process_claims_dir() -> Path:
    # The claims of a gate without a dataset live and die with this process: the
    # directory is removed at exit, so each such process does not leave one behind.
    path = Path(tempfile.mkdtemp(prefix="otel-replay-claims-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


_PROCESS_CLAIMS = functools.cache(_process_claims_dir)


def _takes_idempotency_key(rail: Any) -> bool:
    try:
        params = inspect.signature(rail.compensate).parameters
    except (TypeError, ValueError):
        return True
    return "idempotency_key" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _receipt_id(receipt: Any) -> str:
    """The id claims and idempotency keys use: derived from the stored form, so ``replay --execute`` agrees."""
    return receipt_id_of(stored_receipt(receipt))


def _handed(receipt: Any) -> Any:
    """What the rail's ``compensate`` is handed: a deep copy of ``receipt`` (itself if it cannot be copied).

    A rail that notes the refund on what it was handed cannot change the
    caller's receipt, whose identity a retry must find unchanged.
    """
    try:
        return copy.deepcopy(receipt)
    except Exception:  # noqa: BLE001 - an object that refuses copying: its id was taken before the rail runs
        return receipt


def _safe_receipt_id(receipt: Any) -> str:
    """:func:`_receipt_id` for a log line, which must not raise after the money moved."""
    try:
        return _receipt_id(receipt)
    except Exception:  # noqa: BLE001
        return f"<{type(receipt).__name__}>"


def _safe_text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises
        return f"<{type(exc).__name__}>"


_RETURNED_KEPT = 4096  # (decision, receipt id) pairs a gate remembers to warn about a repeated receipt id

COMMIT_FLUSH_TIMEOUT = 2.0
"""Seconds :meth:`ActionGate.commit` waits for its gate record to be flushed (an exporter retrying a
collector that is down would otherwise hold the caller for the SDK's 30 s)."""

_flushing: tuple[Any, threading.Thread] | None = None  # (recorder, its commit flush) while one may be running
_flushing_lock = threading.Lock()


def _bounded_flush(recorder: Any, timeout: float) -> bool | None:
    """Flush ``recorder`` waiting at most ``timeout`` seconds: its answer, or ``None`` when it is still running.

    The SDK's batch processor ignores a flush's timeout and exports in the
    caller's thread, so the flush runs in a daemon thread that is left to
    finish on its own. While one is still running no other is started: the
    next commit waits (within its own ``timeout``) for it first.
    """
    global _flushing
    deadline = time.monotonic() + timeout
    with _flushing_lock:
        busy = _flushing[1] if _flushing is not None and _flushing[0] is recorder else None
    if busy is not None and busy.is_alive():
        busy.join(max(0.0, deadline - time.monotonic()))
        if busy.is_alive():
            return None
    result: list[bool] = []

    def run() -> None:
        try:
            result.append(bool(recorder.flush()))
        except Exception as exc:  # noqa: BLE001 - reported by the caller as a flush that failed
            _log.error("otel-replay: flushing a commit's gate record raised %s: %s", type(exc).__name__, exc)
            result.append(False)

    thread = threading.Thread(target=run, name="otel-replay-commit-flush", daemon=True)
    with _flushing_lock:
        _flushing = (recorder, thread)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    return result[0] if result else None


class ActionGate:
    """Route verdicts to a :class:`Rail`: commit, hold, block or compensate.

    Args:
        rail: the backend that commits and compensates.
        dataset: where compensation claims are kept (``<dataset>/_compensations``,
            objects on an ``s3://`` dataset), shared with every other gate and
            ``otel-replay replay --execute`` on that dataset, on any host.
            Default: the dataset :func:`otel_replay.configure` writes to;
            without one, claims hold within this process only (a warning says so).
        flush_timeout: how long :meth:`commit` and a compensation wait for
            their gate record to be flushed (:data:`COMMIT_FLUSH_TIMEOUT`); a
            flush still running then is logged and counted, and the receipt
            (or the compensation's outcome) is returned.

    """

    def __init__(
        self,
        rail: Rail,
        *,
        dataset: str | os.PathLike[str] | None = None,
        flush_timeout: float = COMMIT_FLUSH_TIMEOUT,
    ) -> None:
        """Gate actions through ``rail``; see the class docstring."""
        self.rail = rail
        self.flush_timeout = flush_timeout
        self._returned: OrderedDict[tuple[str, str], None] = OrderedDict()  # (decision, receipt id) committed lately
        self._returned_lock = threading.Lock()
        # id(receipt) -> (receipt, its stored form at commit), newest _RETURNED_KEPT: a receipt this gate returned
        # keeps the identity it was committed under, however the caller changes it before compensating it.
        self._committed: OrderedDict[int, tuple[Any, Any]] = OrderedDict()
        self._warned_content_id = False
        directory = None if dataset is None else backend_for(resolve(dataset)).directory
        if directory is not None:
            dataset = os.path.abspath(directory)  # now: a later chdir must not move the claims
        self._dataset = dataset
        self._claims: CompensationClaims | None = None
        self._keyed = _takes_idempotency_key(rail)

    @property
    def claims(self) -> CompensationClaims:
        """The compensation claims this gate honours (resolved on first compensation)."""
        if self._claims is None:
            dataset = self._dataset if self._dataset is not None else get_recorder().dataset
            if dataset is None:
                _log.warning(
                    "otel-replay: ActionGate has no dataset, so compensation is deduplicated within this "
                    "process only; pass dataset= (or configure()) to share claims with otel-replay replay --execute"
                )
                dataset = _PROCESS_CLAIMS()
            self._claims = CompensationClaims(dataset)
        return self._claims

    def commit(self, action: Action, *, record_id: str | None = None) -> Any:
        """Run ``action`` through the rail; returns the rail's receipt.

        Write-ahead: before the rail is called, an ``intent`` gate record is
        sealed and made durable: the action and, inside the ``audit()`` block
        of decision ``record_id``, the decision as it stands (snapshot, reads,
        model calls, action). Once the rail has returned, the ``committed``
        gate record (the stored receipt a later ``replay --execute``
        compensates) is made durable before this returns. Durable means
        fsynced in the pipeline's write-ahead log (one fsync shared by
        concurrent commits; :func:`otel_replay.configure` sets it up and
        turns it into Parquet in the background); with a provider of the
        user's own there is no log: the commit record is flushed instead
        (waiting at most ``flush_timeout`` seconds) and the intent is not
        waited for. A process that dies inside the rail leaves the intent
        without a commit record: ``replay`` and ``verify`` report it as
        "executed? unknown - check the rail".

        Once the rail has returned, this returns its receipt whatever happens
        to the record: a failure to record or store it is logged and counted
        in ``get_recorder().stats.capture_errors`` rather than raised, since
        a caller that saw an error would commit again. A rail that raises is
        recorded as a ``commit_failed`` gate span, then re-raised.

        Raises:
            ConfigError: the tracer could not store the record whole (an
                attribute length limit); checked before the rail is called,
                so nothing was committed.
            GateError: the intent could not be made durable (the log's disk
                failed); nothing was committed.

        """
        get_recorder().check_tracer()  # before the money moves: a record that cannot be stored refuses the commit
        # Read from the context once: the intent and the commit record name the same correlation id.
        correlation_id = current_ids().correlation_id
        if correlation_id is None and record_id is not None:
            # Its block open on another thread (a pool's, with no context): the decision's, as inside the block.
            named = decision_in_block(record_id)
            correlation_id = named._ids.get(sc.CORRELATION_ID) if named is not None else None
        intent_id = self._intent(action, record_id, correlation_id)
        try:
            receipt = self.rail.commit(action)
        except Exception as exc:
            self._record(
                "commit",
                "commit_failed",
                f"{action.type}: {exc}",
                record_id=record_id,
                receipt=None,
                action=action,
                intent_id=intent_id,
                correlation_id=correlation_id,
            )
            raise
        stored, rid = self._remember(receipt)
        if record_id is not None:
            self._note_returned(record_id, rid)
        committed = f"{action.type} committed"
        durable = self._record(
            "commit",
            "committed",
            committed,
            record_id=record_id,
            receipt=stored,
            action=action,
            intent_id=intent_id,
            stored=True,
            correlation_id=correlation_id,
        )
        if durable is None:  # no write-ahead log (a provider of the user's own): flush the dataset instead
            recorder = get_recorder()
            durable = True if recorder.closed else _bounded_flush(recorder, self.flush_timeout)  # closed: counted
        if durable is not True:
            get_recorder().note_capture_error()
            _log.error(
                "otel-replay: %s committed (receipt %s, decision %s) but its gate record %s; until it is "
                "stored, the receipt returned to the caller is its only copy",
                action.type,
                _safe_receipt_id(receipt),
                record_id,
                "could not be made durable"
                if durable is False
                else f"was not flushed to the dataset within {self.flush_timeout:g} s (still trying)",
            )
        return receipt

    def _intent(self, action: Action, record_id: str | None, correlation_id: str | None) -> str:
        """Seal the commit's intent and make it durable before the rail runs; its gate record id.

        Inside the ``audit()`` block of decision ``record_id`` the intent
        carries the decision as it stands, so it survives a process that dies
        before the block ends. ``correlation_id``: the one in scope.

        Raises:
            GateError: the pipeline has a write-ahead log and the intent
                could not be written to it (nothing was committed).

        """
        decision = current_decision()
        if record_id is not None and (decision is None or decision.record_id != record_id):
            decision = decision_in_block(record_id)  # its block open on another thread: no context is carried there
        acted = None
        if decision is not None and record_id is not None and decision.record_id == record_id:
            acted = decision._as_acted()
        detail = f"{action.type} about to be committed: executed? unknown until its commit record - check the rail"
        record = GateRecord(
            record_id=new_id(),
            decision_id=record_id,
            stage="commit",
            fix=None,
            executed=sc.GATE_INTENT,
            detail=detail,
            correlation_id=correlation_id,
            action=action.to_json(),
            decision=acted,
        )
        _, _, durable = get_recorder().emit_durable(sc.SPAN_GATE, record.record_id, record.to_attributes())
        if durable is False:
            # The intent still reaches Parquet the usual way: answer it, so it never reads as "executed? unknown".
            self._record(
                "commit",
                "commit_refused",
                f"{action.type} not committed: its intent could not be made durable; the rail was not called",
                record_id=record_id,
                receipt=None,
                action=action,
                intent_id=record.record_id,
                durable=False,
                correlation_id=correlation_id,
            )
            raise GateError(
                f"{action.type} (decision {record_id}) was not committed: its intent could not be written to the "
                "write-ahead log (see the error logged before this)"
            )
        return record.record_id

    def _remember(self, receipt: Any) -> tuple[Any, str]:
        """Note ``receipt``'s stored form; it and the id that names it (never raises).

        Warns once per gate when the receipt's identity is its content (no id field).
        """
        stored = stored_receipt(receipt)
        try:
            rid = receipt_id_of(stored)
        except Exception:  # noqa: BLE001 - the rail has moved the money: nothing here may raise
            rid = f"<{type(stored).__name__}>"
            named_by_content = False
        else:
            named_by_content = receipt is not None and rid.startswith("sha256:")
        with self._returned_lock:
            self._committed[id(receipt)] = (receipt, stored)  # the receipt is held, so its id() is not reused
            if len(self._committed) > _RETURNED_KEPT:
                self._committed.popitem(last=False)
            warn = named_by_content and not self._warned_content_id
            self._warned_content_id = self._warned_content_id or warn
        if warn:
            _log.warning(
                "otel-replay: the rail's receipt has no receipt_id or id field, so its identity is a digest of its "
                "content: it must not change before replay --execute compensates it (this gate remembers it "
                "as committed); have the rail return an id"
            )
        return stored, rid

    def _committed_form(self, receipt: Any) -> Any:
        """The stored form ``receipt`` was committed under when this gate returned it; else its stored form now."""
        with self._returned_lock:
            kept = self._committed.get(id(receipt))
        if kept is not None and kept[0] is receipt:
            return kept[1]
        return stored_receipt(receipt)

    def _note_returned(self, record_id: str, rid: str) -> None:
        """Log loudly when the rail returns, for one decision, a receipt id it returned before (never raises).

        ``rid``: the receipt's id, as its stored form (:func:`stored_receipt`)
        names it. Two commits sharing a receipt id cannot be compensated
        apart (one claim, one idempotency key), so ``replay --execute``
        refuses both.
        """
        with self._returned_lock:
            seen = (record_id, rid) in self._returned
            self._returned[(record_id, rid)] = None
            if len(self._returned) > _RETURNED_KEPT:
                self._returned.popitem(last=False)
        if seen:
            _log.error(
                "otel-replay: the rail returned receipt id %s again for decision %s: two commits with one receipt "
                "id cannot be compensated apart (one idempotency key), so replay --execute will refuse both; "
                "have the rail give each commit its own receipt id",
                rid,
                record_id,
            )

    def _record(
        self,
        stage: str,
        executed: str,
        detail: str,
        *,
        record_id: str | None,
        receipt: Any,
        action: Action,
        intent_id: str | None = None,
        durable: bool = True,
        stored: bool = False,
        correlation_id: str | None = None,
    ) -> bool | None:
        """Emit a commit's gate record (durably by default), with the action committed; whether it is durable.

        ``True``: fsynced in the write-ahead log; ``None``: emitted, but the
        pipeline has no log (or not ``durable``); ``False`` (logged and
        counted) when emitting failed. ``stored``: ``receipt`` is already
        its stored form (:func:`stored_receipt`), kept as it is.
        """
        try:
            return self._emit(
                stage,
                None,
                executed,
                detail,
                record_id=record_id,
                receipt=receipt,
                action=action,
                intent_id=intent_id,
                durable=durable,
                stored=stored,
                correlation_id=correlation_id,
            )
        except Exception as exc:
            get_recorder().note_capture_error()
            _log.error(
                "otel-replay: the gate record of a commit (%s, decision %s, receipt %s) could not be recorded: "
                "%s: %s; the rail's answer stands and is returned to the caller",
                executed,
                record_id,
                _safe_receipt_id(receipt) if receipt is not None else None,
                type(exc).__name__,
                _safe_text(exc),
            )
            return False

    def enforce_pre_commit(self, verdict: Verdict, action: Action) -> GateOutcome:
        """Before the action runs: ALLOW allows, HUMAN_REVIEW holds, ROLLBACK/BLOCK block."""
        if verdict.fix is FixAction.ALLOW:
            return self._outcome("pre_commit", verdict, "allowed", f"{action.type} may proceed: {verdict.reason}")
        if verdict.fix is FixAction.HUMAN_REVIEW:
            return self._outcome("pre_commit", verdict, "held", f"{action.type} held for review: {verdict.reason}")
        return self._outcome("pre_commit", verdict, "blocked", f"{action.type} blocked before commit: {verdict.reason}")

    def enforce_post_commit(self, verdict: Verdict, *, receipt: Any = None, resume: bool = False) -> GateOutcome:
        """After the action committed: ALLOW stands, HUMAN_REVIEW holds, ROLLBACK/BLOCK compensate.

        Raises:
            AlreadyCompensated: ``receipt`` was compensated before.
            CompensationInProgress: another claimant is compensating it right
                now (an ``AlreadyCompensated`` that is not done yet).
            CompensationPending: an earlier attempt crashed or failed; pass
                ``resume=True`` to retry it with the same idempotency key.

        """
        if verdict.fix is FixAction.ALLOW:
            return self._outcome(
                "post_commit", verdict, "allowed", f"committed action stands: {verdict.reason}", receipt
            )
        if verdict.fix is FixAction.HUMAN_REVIEW:
            return self._outcome("post_commit", verdict, "held", f"held for review: {verdict.reason}", receipt)
        if receipt is None:
            return self._outcome(
                "post_commit",
                verdict,
                "compensation_unavailable",
                f"{verdict.fix.value} routed but no receipt to compensate: {verdict.reason}",
            )
        # The identity it was committed under (this gate returned it), so a retry finds the same claim and key
        # however the receipt changed since; the rail gets a copy, so it cannot change the caller's.
        stored = self._committed_form(receipt)
        rid = receipt_id_of(stored)
        key = idempotency_key(verdict.record_id, rid)
        claim = self.claims.claim(key, decision_id=verdict.record_id, receipt_id=rid, resume=resume)
        try:
            if self._keyed:
                self.rail.compensate(_handed(receipt), idempotency_key=key)
            else:
                _log.warning("otel-replay: rail %s takes no idempotency_key; it cannot deduplicate retries", self.rail)
                legacy: Any = self.rail
                legacy.compensate(_handed(receipt))
        except Exception as exc:
            self.claims.finish(claim, ClaimState.FAILED, error=f"{type(exc).__name__}: {exc}")
            failed = f"{verdict.fix.value}: {exc}"
            self._outcome("post_commit", verdict, "compensation_failed", failed, receipt, stored=stored)
            raise
        except BaseException:
            self.claims.release(claim)  # interrupted: the claim stays "claimed", visible and resumable
            raise
        executed = "rolled_back" if verdict.fix is FixAction.ROLLBACK else "reversed"
        self.claims.finish(claim, ClaimState.DONE, executed=executed)
        detail = f"compensated {rid}: {verdict.reason}"
        kept = stored if stored is not None else receipt
        durable: bool | None
        try:
            durable = self._emit(
                "post_commit", verdict, executed, detail, record_id=verdict.record_id, receipt=kept, durable=True
            )
        except Exception as exc:  # noqa: BLE001 - the rail has refunded: an error now would read as "not refunded"
            _log.error(
                "otel-replay: decision %s's compensation of receipt %s could not be recorded: %s: %s",
                _text(verdict.record_id),
                _text(rid),
                type(exc).__name__,
                _safe_text(exc),
            )
            durable = False
        self._flush(_text(verdict.record_id), durable)
        return GateOutcome(verdict.fix, executed, detail, receipt)

    def _flush(self, record_id: str, durable: bool | None) -> None:
        """Make the compensation's gate record durable before returning (see :meth:`commit`).

        Written to the write-ahead log when the pipeline has one (``durable``
        says how that went), else flushed, waiting at most ``flush_timeout``
        seconds. The compensation is done and recorded in its claim either
        way: a record not stored is logged and counted (``capture_errors``),
        as :meth:`commit` does, rather than holding the caller for the SDK's 30 s.
        """
        recorder = get_recorder()
        flushed = durable
        if flushed is None:
            flushed = True if recorder.closed else _bounded_flush(recorder, self.flush_timeout)
        if flushed is not True:
            recorder.note_capture_error()
            _log.error(
                "otel-replay: the gate record of decision %s's compensation %s (the compensation itself is done "
                "and recorded in its claim)",
                record_id,
                "could not be flushed to the dataset"
                if flushed is False
                else f"was not flushed to the dataset within {self.flush_timeout:g} s (still trying)",
            )

    def _outcome(
        self, stage: str, verdict: Verdict, executed: str, detail: str, receipt: Any = None, *, stored: Any = None
    ) -> GateOutcome:
        # ``stored``: the receipt's stored form as committed, so the record names the receipt the commit stored.
        kept = receipt if stored is None else stored
        self._emit(stage, verdict, executed, detail, record_id=verdict.record_id, receipt=kept)
        return GateOutcome(verdict.fix, executed, detail, receipt)

    def _emit(
        self,
        stage: str,
        verdict: Verdict | None,
        executed: str,
        detail: str,
        *,
        record_id: str | None,
        receipt: Any,
        action: Action | None = None,
        intent_id: str | None = None,
        durable: bool = False,
        stored: bool = False,
        correlation_id: str | None = None,
    ) -> bool | None:
        """Emit a gate record; with ``durable``, made durable first (see :meth:`Recorder.emit_durable`).

        ``stored``: ``receipt`` is already its stored form, not converted again. ``correlation_id``: the one
        in scope when the caller has read it already (else it is read here).
        """
        record = GateRecord(
            record_id=new_id(),
            decision_id=record_id,
            stage=stage,
            fix=verdict.fix.value if verdict else None,
            executed=executed,
            detail=_text(detail),  # a reason may quote a live state's lone surrogate: sealed escaped, never refused
            justified=verdict.justified if verdict else None,
            reason=_text(verdict.reason) if verdict else None,
            receipt=receipt if stored else stored_receipt(receipt),
            correlation_id=(verdict.correlation_id if verdict else None)
            or correlation_id
            or current_ids().correlation_id,
            action=action.to_json() if action is not None else None,
            intent_id=intent_id,
        )
        link = link_to(SpanRef(verdict.trace_id, verdict.span_id)) if verdict else None
        recorder = get_recorder()
        links = [link] if link else []
        if durable:
            return recorder.emit_durable(sc.SPAN_GATE, record.record_id, record.to_attributes(), links=links)[2]
        recorder.emit(sc.SPAN_GATE, record.record_id, record.to_attributes(), links=links)
        return None
