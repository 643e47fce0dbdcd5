"""Verify a dataset: every record span's seal (hash, signature, chain links) and the retention marks.

What ``otel-replay verify`` and :meth:`~otel_replay.query.store.Store.verify`
report: records dropped by retention are vouched for by its signed marks
(:mod:`otel_replay.storage.retention_marks`), and a commit intent no gate
record answers is named (executed? unknown - check the rail), as is a
compensation claim marked done whose gate record the dataset lacks (a problem:
the refund was made and its record is missing).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from otel_replay import semconv as sc
from otel_replay._flock import held_elsewhere
from otel_replay._json import loads
from otel_replay._receipt_id import receipt_id_of
from otel_replay.capture.log_recovery import log_root, quarantined
from otel_replay.exporters.schema import COMPENSATIONS_DIR
from otel_replay.integrity import SigningKey, StoredRecord, VerifyProblem, VerifyReport, stored_record, verify_records
from otel_replay.location import Location
from otel_replay.query.engine import Engine
from otel_replay.storage.backend import backend_for
from otel_replay.storage.retention_marks import expected_before, read_marks, vouched_links

__all__ = ["Keys", "verify"]

Keys = SigningKey | Sequence[SigningKey] | None


def verify(engine: Engine, keys: Keys) -> VerifyReport:
    """Check every record span's seal: hash, signature (with ``keys``) and chain links.

    Files left out as corrupt (``skip_corrupt``), and segments of capture
    write-ahead logs kept in quarantine after losing records to damage, are
    listed in :attr:`VerifyReport.unreadable_files`, and the report is then
    not ok: what could not be read was not checked.
    """
    if not engine.files:
        report = VerifyReport()
        unknown, unrecorded = _compensations(engine.location, [])
        report.problems += unrecorded
        report.unknown_commits = unknown
        report.unreadable_files = _unreadable(engine)
        return report
    marks, refused_marks = read_marks(engine.location, keys)
    gates: list[StoredRecord] = []

    def rows() -> Iterator[StoredRecord]:
        for row in engine.run("sealed_records"):
            rec = stored_record(row)
            if rec.attributes.get(sc.KIND) == sc.KIND_GATE:
                gates.append(rec)  # kept for the commit intents no commit record answers
            yield rec

    report = verify_records(rows(), keys, dropped=vouched_links(marks), expected=expected_before(marks))
    report.problems += refused_marks
    unknown, unrecorded = _compensations(engine.location, gates)
    report.problems += unrecorded
    report.unknown_commits = _unknown_commits(gates) + unknown
    report.unreadable_files = _unreadable(engine)
    return report


def _unreadable(engine: Engine) -> list[str]:
    """Files left out as corrupt, and capture log segments kept in quarantine: what they held was not checked.

    A segment of a gate's write-ahead log that lost a record to damage may
    have held an intent or a commit record: never silently absent.
    """
    return [problem.path for problem in engine.skipped] + quarantined(str(engine.location))


def _unknown_commits(rows: Sequence[StoredRecord]) -> list[VerifyProblem]:
    """The commit intents among ``rows`` that no gate row answers (names as its intent): executed? unknown."""
    gates = [r for r in rows if r.attributes.get(sc.KIND) == sc.KIND_GATE]
    answered = {r.attributes.get(sc.GATE_INTENT_ID) for r in gates}
    unknown: dict[str, VerifyProblem] = {}
    for rec in gates:
        attrs = rec.attributes
        if attrs.get(sc.GATE_EXECUTED) != sc.GATE_INTENT or rec.record_id in answered or rec.record_id in unknown:
            continue
        action = loads(attrs.get(sc.GATE_ACTION), where=f"action of intent record {rec.record_id}") or {}
        what = action.get("type") if isinstance(action, dict) else None
        unknown[rec.record_id] = VerifyProblem(
            rec.record_id,
            f"commit intent of {what!r} for decision {attrs.get(sc.GATE_DECISION_ID)} has no commit record: "
            "executed? unknown - check the rail",
            rec.file,
        )
    return list(unknown.values())


def _compensations(
    location: Location, gates: Sequence[StoredRecord]
) -> tuple[list[VerifyProblem], list[VerifyProblem]]:
    """Compensation claims not matched by the dataset: (claimed, never finished; done, with no gate record).

    The gate takes a durable claim under ``_compensations/`` before it calls
    the rail's ``compensate`` and finishes it once the rail answered; a claim
    still ``claimed`` is the only sign of a refund that may have gone
    through (compensated? unknown - check the rail). A claim marked ``done``
    says the refund was made: the gate then writes the compensation's gate
    record (``rolled_back`` or ``reversed``, for that decision and receipt);
    a done claim with no such record in ``gates`` is a problem (the process
    died between the two, or the record was lost or deleted), named by the
    decision id, the receipt and the claim's key. (Retention drops the
    claims of the days it drops with their records.) Claims on the local file
    system (an ``s3://`` dataset's claim objects are not listed here).
    """
    directory = backend_for(location).directory
    if directory is None:
        return [], []
    unknown: list[VerifyProblem] = []
    unrecorded: list[VerifyProblem] = []
    recorded: set[tuple[str, str]] | None = None
    live: bool | None = None
    for path in sorted(Path(directory, COMPENSATIONS_DIR).glob("*.json")):
        try:
            claim = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # a claim being written, or damaged: the gate refuses it and names it
        if not isinstance(claim, dict):
            continue
        state = claim.get("state")
        if state == "claimed":
            unknown.append(
                VerifyProblem(
                    str(claim.get("decision_id")),
                    f"compensation of receipt {claim.get('receipt_id')} claimed by {claim.get('claimant')} at "
                    f"{claim.get('claimed_at')} has no outcome: compensated? unknown - check the rail "
                    "(replay --execute --resume retries it with the same idempotency key)",
                    str(path),
                )
            )
        elif state == "done":
            if recorded is None:
                recorded = _compensated(gates)
            if (str(claim.get("decision_id")), str(claim.get("receipt_id"))) in recorded:
                continue
            if live is None:
                live = _written_ahead_live(directory)
            if live:  # its record may be durable in a live process's log, not yet converted: not known missing
                unknown.append(
                    VerifyProblem(
                        str(claim.get("decision_id")),
                        f"compensation of receipt {claim.get('receipt_id')} (claim {claim.get('key')}) is marked "
                        f"done ({claim.get('executed', 'done')} by {claim.get('claimant')} at "
                        f"{claim.get('finished_at')}); its gate record is not in the dataset's files yet, and a live "
                        "process writes ahead to the dataset (its log may hold it): verify again once it has "
                        "flushed or shut down",
                        str(path),
                    )
                )
                continue
            unrecorded.append(
                VerifyProblem(
                    str(claim.get("decision_id")),
                    f"compensation of receipt {claim.get('receipt_id')} (claim {claim.get('key')}) is marked done "
                    f"({claim.get('executed', 'done')} by {claim.get('claimant')} at {claim.get('finished_at')}) "
                    "but the dataset holds no gate record of it: the refund was made and its record is missing",
                    str(path),
                )
            )
    return unknown, unrecorded


def _written_ahead_live(dataset: str | Path) -> bool:
    """Whether a live process holds a capture write-ahead log of ``dataset`` (its records may not be in Parquet yet).

    A log directory's lock (:data:`~otel_replay.storage.wal.LOCK_NAME`) is
    held while its process lives; the logs of a dead one are converted by the
    next :func:`otel_replay.configure`.
    """
    root = log_root(str(dataset))
    try:
        names = os.listdir(root)
    except OSError:  # no capture log was ever kept for the dataset
        return False
    # start-up cost: the log's module loads only when a log directory is there to probe
    from otel_replay.storage.wal import LOCK_NAME

    return any(held_elsewhere(root / name / LOCK_NAME) for name in names)


def _compensated(gates: Sequence[StoredRecord]) -> set[tuple[str, str]]:
    """(decision id, receipt id) of every compensation gate record (``rolled_back`` or ``reversed``) in ``gates``."""
    found: set[tuple[str, str]] = set()
    for rec in gates:
        attrs = rec.attributes
        if attrs.get(sc.GATE_STAGE) != "post_commit" or attrs.get(sc.GATE_EXECUTED) not in ("rolled_back", "reversed"):
            continue
        try:
            stored = loads(attrs.get(sc.GATE_RECEIPT), where=f"receipt of gate record {rec.record_id}")
        except ValueError:  # a receipt that does not parse names no receipt; the seal check reports the record
            continue
        if stored is not None:
            found.add((str(attrs.get(sc.GATE_DECISION_ID)), receipt_id_of(stored)))
    return found
