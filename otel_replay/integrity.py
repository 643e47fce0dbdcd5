"""Record integrity: canonical hashing, HMAC signatures and hash chains.

Every record span (decision, outcome, audit entry, gate outcome) carries a
:class:`~otel_replay.records.Seal`: its chain id, sequence number, the id and
hash of its predecessor, its own hash and an HMAC-SHA256 signature of that hash.

The hash covers the span name, its start time and every ``replay.*`` attribute
except the hash and signature themselves, so editing any stored field, or a
timestamp, changes it. Among those attributes, ``replay.record.span`` names the
trace and span the record was sealed in: a verbatim copy stored at another
span fails the check as a copy (records sealed before that attribute existed
lack it; ``verify`` names their copies by comparing places). The signature makes a re-computed hash detectable: only
a holder of the key can sign. See README "Integrity and keys" for key handling.

Keys, and the order they are looked for in: :mod:`otel_replay.signing_keys`.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import operator
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_replay import semconv as sc
from otel_replay._json import _orjson, canonical_json, strict_loads
from otel_replay.errors import ConfigError, IntegrityError, PayloadError
from otel_replay.records import Seal, _seal
from otel_replay.signing_keys import SigningKey, load_signing_key
from otel_replay.voids import Voids

__all__ = [
    "GENESIS_HASH",
    "Chain",
    "SealCheck",
    "UNREADABLE",
    "SigningKey",
    "StoredRecord",
    "VerifyProblem",
    "VerifyReport",
    "MISPLACED",
    "SEAL_KEYS",
    "copied_elsewhere",
    "hashes_plainly",
    "keys_by_id",
    "load_signing_key",
    "span_place",
    "unhashable",
    "record_hash",
    "restore_attributes",
    "stored_record",
    "verify_records",
]

GENESIS_HASH = "0" * 64


def span_place(trace_id: int, span_id: int) -> str:
    """The ``replay.record.span`` value of a record stored in span ``span_id`` of trace ``trace_id``."""
    return f"{trace_id:032x}-{span_id:016x}"


SEAL_KEYS = (
    sc.RECORD_SPAN,
    sc.RECORD_CHAIN_ID,
    sc.RECORD_SEQ,
    sc.RECORD_PREV_ID,
    sc.RECORD_PREV_HASH,
    sc.RECORD_KEY_ID,
    sc.RECORD_HASH,
    sc.RECORD_SIGNATURE,
)
"""The attributes :meth:`Chain.seal` adds to a record sealed with its place."""

MISPLACED = "stored at another span than it was sealed in: "
"""How :meth:`SealCheck.problem` starts the problem of a verbatim copy of a record sealed with its place."""
_frame = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
def _encode(value: Any) -> str:
    # Type-tagged and canonical: what goes in comes back out of Parquet equal.
    if isinstance(value, str):
        return "s" + value
    if isinstance(value, bool):
        return "b1" if value else "b0"
    if isinstance(value, int):
        return f"i{value}"
    if isinstance(value, float):
        return f"f{value!r}"
    if isinstance(value, (list, tuple)):
        return "l" + canonical_json(list(value), where="attribute")
    return "j" + canonical_json(value, where="attribute")


def record_hash(name: str, start_ns: int, attributes: Mapping[str, Any]) -> str:
    """SHA-256 over the span name, start time and ``replay.*`` attributes.

    The parts are framed as a JSON array of strings and values are
    type-tagged, so no two different records encode to the same bytes.
    """
    keys = tuple(attributes)
    layout = _LAYOUTS.get(keys)
    if layout is None:
        layout = _layout(attributes)
        if len(_LAYOUTS) < _LAYOUTS_MAX:
            _LAYOUTS[keys] = layout
    frame, values = layout
    parts = frame.copy()
    parts[0] = name
    parts[1] = str(int(start_ns))
    # The covered keys' values, sorted by key, each after its key (already in the frame).
    parts[3::2] = [
        "s" + value if (cls := value.__class__) is str else f"i{value}" if cls is int else _encode(value)
        for value in values(attributes)
    ]
    # A JSON array of strings is an unambiguous framing.
    digest = _SHA256.copy()  # copying a ready context is cheaper than OpenSSL's per-call setup
    digest.update(_frame_bytes(parts))
    return digest.hexdigest()


_SHA256 = hashlib.sha256()
_UNHASHED = sc.INTEGRITY_FIELDS
_HASHED: dict[str, bool] = {}
"""Whether the hash covers an attribute key, remembered for the first keys seen (the schema's own, in practice)."""
_HASHED_MAX = 4096  # stored spans can carry any keys: the memo stays bounded

_Layout = tuple[list[Any], Callable[[Mapping[str, Any]], Sequence[Any]]]
_LAYOUTS: dict[tuple[str, ...], _Layout] = {}
"""Per key set (in the mapping's order): the frame with the covered keys in place, and a getter of their values.

A record type's spans carry the same keys each time, so sorting and
filtering them is done once per shape rather than once per record.
"""
_LAYOUTS_MAX = 512  # stored rows can come in any shape: the memo stays bounded


def _covered(key: str) -> bool:
    covered = key.startswith("replay.") and key not in _UNHASHED
    if len(_HASHED) < _HASHED_MAX and key.__class__ is str:
        _HASHED[key] = covered
    return covered


def _layout(attributes: Mapping[str, Any]) -> _Layout:
    """The frame ``[name, start, key1, value1, ...]`` (values left empty) and the covered keys' value getter."""
    hashed = _HASHED.get
    order = []
    for key in sorted(attributes):
        covered = hashed(key)
        if covered is None:
            covered = _covered(key)
        if covered:
            order.append(key)
    frame: list[Any] = [None, None]
    for key in order:
        frame += (key, None)
    if len(order) > 1:
        return frame, operator.itemgetter(*order)
    return frame, lambda mapping: [mapping[key] for key in order]  # itemgetter of one key returns no tuple


def _frame_bytes(parts: list[str]) -> bytes:
    """``parts`` as compact JSON (UTF-8): orjson writes strings exactly as json does; json decides otherwise."""
    if _orjson is not None:
        try:
            return _orjson.dumps(parts)
        except TypeError:  # a lone surrogate: json's encoding raises as it always did
            pass
    return _frame(parts).encode()


_INT_PLAIN = 1 << 64  # an int this small prints well within the interpreter's digit limit


def hashes_plainly(name: str, attributes: Mapping[str, Any]) -> bool:
    """True when :func:`record_hash` cannot fail on ``name`` and ``attributes`` (a quick look, no hashing).

    So when every key and text is an ASCII ``str`` (no lone surrogate to
    refuse) and every value a ``str``, ``bool``, ``float`` or an ``int`` of
    at most 64 bits (nothing to serialise as JSON). ``False`` says nothing:
    the record may still hash; :func:`record_hash` decides.
    """
    if name.__class__ is not str or not name.isascii():
        return False
    for key, value in attributes.items():
        if key.__class__ is not str or not key.isascii():
            return False
        cls = value.__class__
        if cls is str:
            if not value.isascii():
                return False
        elif cls is int:
            if not -_INT_PLAIN < value < _INT_PLAIN:
                return False
        elif cls is not bool and cls is not float:
            return False
    return True


class Chain:
    """Seals records into one hash chain; thread-safe, one per process by default."""

    def __init__(self, key: SigningKey, chain_id: str | None = None) -> None:
        """Start a new chain signed with ``key`` (a fresh chain id unless given)."""
        self.key = key
        self.chain_id = chain_id or uuid.uuid4().hex
        self._lock = threading.Lock()
        self._seq = 0
        self._prev_id = ""
        self._prev_hash = GENESIS_HASH

    def seal(
        self, record_id: str, name: str, start_ns: int, attributes: dict[str, Any], place: str | None = None
    ) -> Seal:
        """Link ``attributes`` into the chain: adds the seal fields to it in place.

        ``place``: the span the record is stored in (:func:`span_place`), sealed
        with it as ``replay.record.span``; every record otel-replay emits has one.
        """
        key = self.key
        if place is not None:
            attributes[sc.RECORD_SPAN] = place
        with self._lock:  # the link and the hash it feeds forward are taken in one step: seq order is link order
            seq, prev_id, prev_hash = self._seq, self._prev_id, self._prev_hash
            attributes[sc.RECORD_CHAIN_ID] = self.chain_id
            attributes[sc.RECORD_SEQ] = seq
            attributes[sc.RECORD_PREV_ID] = prev_id
            attributes[sc.RECORD_PREV_HASH] = prev_hash
            attributes[sc.RECORD_KEY_ID] = key.key_id
            digest = record_hash(name, start_ns, attributes)
            signature = key.sign(digest)
            # Advanced only once the record is fully sealed: a failure above leaves the chain as it was.
            self._seq = seq + 1
            self._prev_id = record_id
            self._prev_hash = digest
        attributes[sc.RECORD_HASH] = digest
        attributes[sc.RECORD_SIGNATURE] = signature
        return _seal(self.chain_id, seq, prev_id, prev_hash, digest, signature, key.key_id, place)


@dataclass(frozen=True)
class StoredRecord:
    """A sealed record as read back from the dataset, and where it is stored."""

    record_id: str
    name: str
    start_ns: int
    attributes: Mapping[str, Any]
    file: str = ""
    trace_id: str = ""
    span_id: str = ""
    unreadable: str | None = None
    """Why the stored attributes could not be read (duplicate keys, bad JSON), or ``None``."""


def restore_attributes(row: Mapping[str, Any]) -> dict[str, Any]:
    """A span's full attribute dict: the JSON column plus the promoted columns.

    Raises:
        PayloadError: the JSON is not one unambiguous object (duplicate keys,
            too deep, not an object), or an attribute is stored both in its
            promoted column and in the JSON (two places could disagree).

    """
    where = f"attributes of span {row.get('span_id') or '?'}"
    attrs: dict[str, Any] = strict_loads(row["attributes"], where=where) if row.get("attributes") else {}
    if not isinstance(attrs, dict):
        raise PayloadError(f"{where}: not a JSON object")
    for key, column in sc.PROMOTED_COLUMNS.items():
        value = row.get(column)
        if value is not None:
            if key in attrs:
                raise PayloadError(f"{where}: {key!r} is stored both in column {column} and in the JSON")
            attrs[key] = value
    return attrs


def stored_record(row: Mapping[str, Any]) -> StoredRecord:
    """A record row as the seal check sees it; unreadable attributes are marked, not raised."""
    try:
        attrs, unreadable = restore_attributes(row), None
    except PayloadError as exc:
        attrs, unreadable = {}, str(exc)
    return StoredRecord(
        str(row.get("record_id") or "?"),
        row["name"],
        int(row["start_ns"]),
        attrs,
        str(row.get("filename") or ""),
        row.get("trace_id") or "",
        row.get("span_id") or "",
        unreadable,
    )


@dataclass(frozen=True)
class VerifyProblem:
    """One failed check: which record, what is wrong, and where it is stored."""

    record_id: str
    problem: str
    file: str = ""

    def __str__(self) -> str:
        where = f" [{self.file}]" if self.file else ""
        return f"record {self.record_id}: {self.problem}{where}"


@dataclass
class VerifyReport:
    """The result of :func:`verify_records`."""

    records: int = 0
    chains: int = 0
    unsigned_checked: int = 0
    problems: list[VerifyProblem] = field(default_factory=list)
    unreadable_files: list[str] = field(default_factory=list)
    """Files that could not be read at all, so their records were not checked."""
    dropped_by_retention: int = 0
    """Chains whose missing predecessor a signed retention checkpoint names (cut by retention, not deleted)."""
    voided: int = 0
    """Records sealed and then not kept by their store (an outcome refused), each named by a void record after it
    (:mod:`otel_replay.voids`): the gap they leave is not a deletion."""
    unknown_commits: list[VerifyProblem] = field(default_factory=list)
    """Commit intents no commit record answers: executed? unknown - check the rail (not an integrity failure).

    Also compensations claimed and never finished (their claimant died inside the rail, or is in it now):
    compensated? unknown - check the rail.
    """

    @property
    def ok(self) -> bool:
        """True when every record verified and every file could be read."""
        return not self.problems and not self.unreadable_files

    def raise_if_failed(self) -> None:
        """Raise :class:`IntegrityError` naming the first problem (for scripts and CI jobs)."""
        if self.problems:
            more = f" (and {len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
            raise IntegrityError(f"{self.problems[0]}{more}")
        if self.unreadable_files:
            raise IntegrityError(f"{len(self.unreadable_files)} file(s) could not be read: {self.unreadable_files[0]}")


UNREADABLE = "unreadable attributes: "
"""How :meth:`SealCheck.problem` starts the problem of a row whose attributes cannot be read or hashed."""


def unhashable(exc: BaseException) -> str:
    """One line on why a stored row's attributes cannot be hashed (never the offending text itself)."""
    if isinstance(exc, UnicodeError):
        return "a value holds text that is not valid Unicode (a lone surrogate such as \\ud800)"
    if isinstance(exc, RecursionError):
        return "a value is nested too deeply to hash"
    return f"a value cannot be hashed ({type(exc).__name__}: {str(exc)[:200]})"


def keys_by_id(keys: SigningKey | Sequence[SigningKey] | None) -> dict[str, SigningKey]:
    """``keys`` (one, several or none) by their key id: how a stored key id finds its key."""
    return {k.key_id: k for k in ([keys] if isinstance(keys, SigningKey) else keys or [])}


class SealCheck:
    """Decides whether one stored record is what its seal says: the single rule for verify, replay and the gate.

    A record passes when its attributes parse unambiguously, it carries a
    seal, its content re-hashes to the sealed hash and, when signatures are
    checked, the signature verifies with a known key. With
    ``require_signed=False`` a record signed with a key not among ``keys`` is
    accepted on its hash alone (a known key's bad signature still fails).
    """

    def __init__(self, keys: SigningKey | Sequence[SigningKey] | None, *, require_signed: bool = True) -> None:
        """Check with ``keys`` (several for rotation); ``require_signed`` needs at least one key."""
        self.keys = keys_by_id(keys)
        self.require_signed = require_signed
        if require_signed and not self.keys:
            raise ConfigError(
                "cannot check record signatures: no verification key "
                "(set OTEL_REPLAY_SIGNING_KEY or OTEL_REPLAY_KEY_FILE, pass --key-file, "
                "or turn signature checks off with --no-require-signed where that is allowed)"
            )

    def problem(self, rec: StoredRecord) -> tuple[str | None, bool]:
        """``(problem or None, whether the signature was checked)`` for one stored record.

        Never raises for what a row holds: a value the hash cannot encode (an
        escaped lone surrogate, nesting too deep) is an unreadable row, refused
        like any other, so one forged row cannot stop the others from verifying.
        """
        if rec.unreadable is not None:
            return UNREADABLE + rec.unreadable, False
        attrs = rec.attributes
        stored = attrs.get(sc.RECORD_HASH)
        if stored is None:
            return f"unsealed {rec.name} span: no seal (forged, or not written by otel-replay)", False
        try:
            digest = record_hash(rec.name, rec.start_ns, attrs)
        except (UnicodeError, ValueError, RecursionError) as exc:  # CaptureError is a ValueError
            return UNREADABLE + unhashable(exc), False
        if digest != stored:
            return "content edited (hash mismatch)", False
        misplaced = _misplaced(rec)
        key = self.keys.get(str(attrs.get(sc.RECORD_KEY_ID)))
        if key is None:
            if self.require_signed:
                return f"signed with key {attrs.get(sc.RECORD_KEY_ID)}, which is not a verification key", False
            return misplaced, False
        if not key.check(str(stored), str(attrs.get(sc.RECORD_SIGNATURE, ""))):
            return "signature invalid (hash recomputed without the key)", True
        return misplaced, True


def _misplaced(rec: StoredRecord) -> str | None:
    """The problem of a row stored at another span than its sealed ``replay.record.span``, or ``None``."""
    sealed_in = rec.attributes.get(sc.RECORD_SPAN)
    if sealed_in is None:  # sealed before places were sealed: verify_records compares the copies' places
        return None
    here = f"{rec.trace_id or '?'}-{rec.span_id or '?'}"
    if sealed_in == here:
        return None
    shown = _cap(str(sealed_in))  # a forged value cannot get this far (it is hashed and signed); bounded anyway
    return (
        f"{MISPLACED}sealed in span {shown}, stored in {_cap(here)}: a verbatim copy, not the record "
        "(the row stored in the sealed span is the record; remove the copy)"
    )


def verify_records(
    records: Iterable[StoredRecord],
    keys: SigningKey | Sequence[SigningKey] | None,
    *,
    dropped: Mapping[tuple[str, int], tuple[str, str, str]] | None = None,
    expected: Sequence[tuple[str, int, str, str, str]] = (),
) -> VerifyReport:
    """Check hashes, signatures and chain links of every record span.

    Detects a record span with no seal (forged, or written by another tool),
    content edited (hash mismatch), a hash recomputed without the key
    (signature mismatch), a key id that none of ``keys`` has, attributes that
    cannot be read unambiguously (duplicate keys), a deleted record (a
    successor names a predecessor that is absent, unless a void record names
    it: :mod:`otel_replay.voids`) and reordering (a link
    points at the wrong record, or two different records claim one sequence
    number). A row is re-hashed before it is recognised as a copy of another:
    the same record stored twice at the same span (an OTLP retry, a copied
    file) counts once, a copy with edited content is named, and so is a copy
    at another trace or span id: a record sealed with its place
    (``replay.record.span``) names the copy as stored in another span and
    keeps the original; for older records, whose seal does not cover the ids,
    neither place can be trusted (see :func:`copied_elsewhere`). Deleting the
    newest records of a chain leaves no successor to notice. With no ``keys``,
    hashes and links are checked and signatures are not (counted in
    :attr:`VerifyReport.unsigned_checked`).

    ``dropped``: (chain id, sequence number) -> (record id, hash, UTC day) of
    records that retention dropped and vouched for in signed checkpoints
    (:func:`otel_replay.storage.retention_marks.vouched_links`). A missing
    predecessor that matches one, in a chain that stores no record sealed on
    that day any more, is counted in :attr:`VerifyReport.dropped_by_retention`,
    not reported. ``expected``: (chain id, oldest seq, prev id, prev hash,
    day) of each dropped run: the predecessor its oldest record named must
    still be stored, or be a dropped record vouched for in ``dropped``, else it
    is reported as deleted (its only successor was dropped, so nothing else
    would notice).
    """
    check = SealCheck(keys, require_signed=False)
    report = VerifyReport()
    voids = Voids()
    chains: dict[str, dict[int, list[StoredRecord]]] = {}
    copies: set[tuple[str, str, str]] = set()  # (record id, trace id, span id) of copies already named
    for rec in records:
        problem, signed = check.problem(rec)
        attrs = rec.attributes
        if problem is not None and (
            problem.startswith((UNREADABLE, MISPLACED)) or sc.RECORD_HASH not in attrs
        ):  # not the record: a misplaced copy takes no place in its chain (the original is there)
            report.records += 1
            report.problems.append(VerifyProblem(rec.record_id, problem, rec.file))
            continue
        stored = attrs.get(sc.RECORD_HASH)
        chain = chains.setdefault(str(attrs.get(sc.RECORD_CHAIN_ID)), {})
        group = chain.setdefault(_seq(attrs), [])
        if problem is None:
            same = [r for r in group if r.attributes.get(sc.RECORD_HASH) == stored and r.record_id == rec.record_id]
            if same:
                # Re-hashed and identical to a record already counted: the same record stored twice,
                # unless it sits at another span, which only a copy does (a retry keeps the ids).
                place = (rec.record_id, rec.trace_id, rec.span_id)
                other = next((r for r in same if (r.trace_id, r.span_id) != place[1:]), None)
                if other is not None and place not in copies:
                    copies.add(place)
                    report.problems.append(VerifyProblem(rec.record_id, copied_elsewhere(other, rec), rec.file))
                continue
        group.append(rec)
        report.records += 1
        if problem is None and not signed:
            if check.keys:
                problem = f"signed with key {attrs.get(sc.RECORD_KEY_ID)}, which is not a verification key"
            else:
                report.unsigned_checked += 1
        if problem is not None:
            report.problems.append(VerifyProblem(rec.record_id, problem, rec.file))
            voids.note_failed(rec)
        else:
            voids.note(str(attrs.get(sc.RECORD_CHAIN_ID)), _seq(attrs), rec.record_id, attrs, rec.file)
    report.chains = len(chains)
    for chain_id, by_seq in chains.items():
        _check_links(chain_id, by_seq, report, dropped or {}, voids)
    _check_dropped_runs(chains, expected, dropped or {}, report, voids)
    report.voided, stored_voided = voids.count_missing(chains)
    report.problems += [VerifyProblem(*found) for found in stored_voided]
    return report


def _check_dropped_runs(
    chains: Mapping[str, Mapping[int, list[StoredRecord]]],
    expected: Sequence[tuple[str, int, str, str, str]],
    dropped: Mapping[tuple[str, int], tuple[str, str, str]],
    report: VerifyReport,
    voids: Voids,
) -> None:
    """Report a predecessor a dropped run's oldest record named that is neither stored, vouched for, nor voided."""
    days: dict[str, set[str]] = {}
    for chain_id, bottom, prev_id, prev_hash, day in expected:
        by_seq = chains.get(chain_id)
        if by_seq is None or bottom <= 0:
            continue  # nothing of the chain is stored any more, or the run started the chain
        if chain_id not in days:
            days[chain_id] = _sealed_days(by_seq)
        if day in days[chain_id]:
            continue  # that day's records are still stored: their own links are checked
        stored = any(
            r.record_id == prev_id and r.attributes.get(sc.RECORD_HASH) == prev_hash
            for r in by_seq.get(bottom - 1, ())
        )
        vouched = dropped.get((chain_id, bottom - 1))
        if stored or (vouched is not None and vouched[:2] == (prev_id, prev_hash)):
            continue
        if voids.excuses(chain_id, bottom - 1, prev_id, prev_hash):
            continue  # never kept: a void still stored says so (sealed after midnight, its record's day dropped)
        report.problems.append(
            VerifyProblem(
                _cap(prev_id),
                f"deleted: missing from the dataset (seq {bottom - 1} of chain {_cap(chain_id)}), yet the record "
                f"after it, dropped by retention on {day}, named it (its retention checkpoint says so)",
            )
        )


def copied_elsewhere(first: StoredRecord, other: StoredRecord) -> str:
    """The problem of one sealed record stored at two different spans (trace id, span id).

    For records sealed before ``replay.record.span`` existed: their seal
    covers the content, not the span it is stored in, so a verbatim copy in
    another trace passes every hash and signature check; an
    OTLP retry or a copied file keeps the span's ids. Which place is the
    original cannot be told from the dataset, so neither is trusted.
    """
    return (
        f"copied to another trace: the same sealed record is stored at trace {_cap(first.trace_id or '?')} "
        f"span {_cap(first.span_id or '?')} [{first.file}] and at trace {_cap(other.trace_id or '?')} "
        f"span {_cap(other.span_id or '?')} [{other.file}]; its seal (an older record's) does not "
        "cover the span ids, so neither place is trusted (remove the copy that is not yours)"
    )


def _utc_day(start_ns: int) -> str:
    """The UTC day (``YYYY-MM-DD``) of a start time in nanoseconds (a time out of range reads as no day)."""
    try:
        return datetime.datetime.fromtimestamp(start_ns // 1_000_000_000, datetime.UTC).date().isoformat()
    except (OverflowError, OSError, ValueError):
        return ""


def _sealed_days(by_seq: Mapping[int, list[StoredRecord]]) -> set[str]:
    """The UTC days a chain's stored records were sealed on."""
    return {_utc_day(r.start_ns) for group in by_seq.values() for r in group}


def _cap(text: str, limit: int = 49) -> str:
    """``text`` cut to ``limit`` characters: stored ids are whatever a writer put there (a 32 + 1 + 16 id fits)."""
    return text if len(text) <= limit else text[:limit] + "…"


def _seq(attrs: Mapping[str, Any]) -> int:
    try:
        return int(attrs.get(sc.RECORD_SEQ, -1))
    except (TypeError, ValueError):
        return -1


def _check_links(
    chain_id: str,
    by_seq: dict[int, list[StoredRecord]],
    report: VerifyReport,
    dropped: Mapping[tuple[str, int], tuple[str, str, str]],
    voids: Voids,
) -> None:
    days: set[str] | None = None  # the days this chain's stored records were sealed on, found when first needed
    first = min(by_seq)
    for seq in sorted(by_seq):
        group = by_seq[seq]
        if len(group) > 1:
            ids = ", ".join(r.record_id for r in group)
            report.problems.append(
                VerifyProblem(
                    group[0].record_id,
                    f"sequence number {seq} claimed by several records ({ids}): reordered or duplicated",
                    group[0].file,
                )
            )
            continue
        rec = group[0]
        prev_id = rec.attributes.get(sc.RECORD_PREV_ID, "")
        prev_hash = rec.attributes.get(sc.RECORD_PREV_HASH)
        if seq == 0:
            if prev_hash != GENESIS_HASH:
                report.problems.append(
                    VerifyProblem(rec.record_id, "first record of its chain does not start at genesis", rec.file)
                )
            continue
        before = by_seq.get(seq - 1)
        cut = dropped.get((chain_id, seq - 1)) if not before else None
        if cut is not None and cut[:2] == (prev_id, prev_hash):
            if days is None:
                days = _sealed_days(by_seq)
            if cut[2] not in days:  # the very predecessor a signed checkpoint names, and its day is gone
                report.dropped_by_retention += 1
                continue
        if not before and voids.excuses(chain_id, seq - 1, prev_id, prev_hash):
            continue  # sealed, then not kept: its writer voided it (counted in report.voided)
        if not before:
            # With nothing earlier of its chain left, retention (compact --older-than) may have dropped the start.
            retention = " (or dropped by retention: no earlier record of its chain is left)" if seq == first else ""
            report.problems.append(
                VerifyProblem(
                    str(prev_id),
                    f"deleted{retention}: missing from the dataset, yet record {rec.record_id} (seq {seq}) follows it",
                    rec.file,
                )
            )
        elif before[0].record_id != prev_id:
            report.problems.append(
                VerifyProblem(
                    rec.record_id,
                    f"out of order: its predecessor should be {prev_id}, found {before[0].record_id}",
                    rec.file,
                )
            )
        elif before[0].attributes.get(sc.RECORD_HASH) != prev_hash:
            report.problems.append(
                VerifyProblem(
                    rec.record_id,
                    f"link broken: predecessor {prev_id} was re-hashed after this record was sealed",
                    rec.file,
                )
            )
