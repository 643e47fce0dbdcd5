"""Which stored rows may drive replay, the gate and chains' outcome fields.

Any process that can write spans into the dataset (an OTLP sender, a copied
file, a user of another tool) can add rows that claim an existing record id.
Rows never decide anything by being first, newest or earliest: a row acts
only when :class:`~otel_replay.integrity.SealCheck` accepts it (sealed,
re-hashing to its seal, signed with a known key). Rows that fail are left out
and reported; trusted rows that disagree about one record are a
:class:`~otel_replay.errors.ConflictingRecords` error naming both files.

The seal covers the span a record was sealed in (``replay.record.span``), so
a verbatim copy stored at another span fails the seal check and the original
stays trusted. Records sealed before that attribute existed carry no place:
one of them found at two different spans is a copy made by someone (an OTLP
retry or a copied file keeps the ids), and :func:`select_trusted`, whose span
decides where a verdict links and which children form the decision's causal
tree, trusts neither place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from otel_replay import semconv as sc
from otel_replay.errors import ConflictingRecords, RecordNotFound, UntrustedRecord
from otel_replay.integrity import SealCheck, StoredRecord, VerifyProblem, copied_elsewhere
from otel_replay.records import SpanRef

__all__ = ["TrustedRecord", "select_trusted", "split_trusted"]


@dataclass(frozen=True)
class TrustedRecord:
    """The one row a record id resolves to, plus the rows that claimed it and were refused."""

    record_id: str
    name: str
    attributes: Mapping[str, Any]
    span: SpanRef
    file: str
    ignored: tuple[VerifyProblem, ...] = ()


def split_trusted(
    rows: Sequence[StoredRecord], check: SealCheck
) -> tuple[list[StoredRecord], list[VerifyProblem]]:
    """Partition rows into those the check accepts and the problems of the rest.

    For readers of sealed *content* (receipts, compensations, outcomes). A
    copy of a record sealed with its place is refused here like any failed
    row (its original is trusted). A copy of an older record, sealed without
    its place, is still the same sealed content, so its rows stay trusted
    here (``verify`` names the copy): refusing both places would let anyone
    who can drop a file hide a commit receipt (no refund) or a compensation
    (a second refund). A reader of a record's *place* uses
    :func:`select_trusted`, which refuses such a copy.
    """
    trusted: list[StoredRecord] = []
    refused: list[VerifyProblem] = []
    for rec in rows:
        problem, _ = check.problem(rec)
        if problem is None:
            trusted.append(rec)
        else:
            refused.append(VerifyProblem(rec.record_id, problem, rec.file))
    return trusted, refused


def _copied(trusted: Sequence[StoredRecord]) -> str | None:
    """The problem of a record whose trusted rows sit at more than one span, or ``None``."""
    first: dict[tuple[str, str], StoredRecord] = {}
    for rec in sorted(trusted, key=lambda r: (r.file, r.trace_id, r.span_id)):
        seen = first.setdefault((rec.record_id, str(rec.attributes[sc.RECORD_HASH])), rec)
        if (seen.trace_id, seen.span_id) != (rec.trace_id, rec.span_id):
            return copied_elsewhere(seen, rec)
    return None


def select_trusted(
    record_id: str, rows: Sequence[StoredRecord], check: SealCheck, *, where: str, what: str = "record"
) -> TrustedRecord:
    """The single trustworthy row for ``record_id`` among ``rows``.

    Raises:
        RecordNotFound: no row claims the id.
        UntrustedRecord: rows claim it, but none passes the seal check.
        ConflictingRecords: trusted rows claim it with different content, or
            with the same content at different spans (copied to another trace).

    """
    if not rows:
        raise RecordNotFound(f"no {what} {record_id!r} in {where}")
    trusted, refused = split_trusted(rows, check)
    if not trusted:
        first = refused[0]
        more = f" (and {len(refused) - 1} more row(s) like it)" if len(refused) > 1 else ""
        raise UntrustedRecord(
            f"record {record_id} cannot be trusted: {first.problem} [{first.file}]{more}; "
            "replay and the gate act only on sealed, verified records (run otel-replay verify)"
        )
    # The seal check re-hashed each row, so equal hashes mean equal sealed content.
    by_hash: dict[str, StoredRecord] = {}
    for rec in sorted(trusted, key=lambda r: (r.file, r.trace_id, r.span_id)):
        by_hash.setdefault(str(rec.attributes[sc.RECORD_HASH]), rec)
    if len(by_hash) > 1:
        a, b = list(by_hash.values())[:2]
        raise ConflictingRecords(
            f"record {record_id} is stored with different content in {a.file} and {b.file}; "
            "refusing to pick one (run otel-replay verify)"
        )
    copied = _copied(trusted)
    if copied is not None:
        raise ConflictingRecords(f"record {record_id}: {copied}; refusing to pick one (run otel-replay verify)")
    chosen = next(iter(by_hash.values()))
    return TrustedRecord(
        record_id=record_id,
        name=chosen.name,
        attributes=chosen.attributes,
        span=SpanRef(chosen.trace_id, chosen.span_id, chosen.start_ns),
        file=chosen.file,
        ignored=tuple(refused),
    )
