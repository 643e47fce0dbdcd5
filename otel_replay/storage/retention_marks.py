"""Retention checkpoints: signed notes of where retention cut each hash chain, so ``verify`` can tell it from deletion.

Every record names its predecessor's id and hash. When retention drops a
partition, the first records left of a long-lived chain name predecessors
that are gone, which is exactly what a deletion looks like. Before it drops a
partition, retention writes ``<dataset>/_retention/<partition>-<time>-<token>[-<n>].json``:
for each chain, the newest record of every run of that chain's records in the
partition (chain id, sequence number, record id, hash), signed with the
signing key.

Only a record whose own seal passes with a verification key (hash,
signature, place) and whose sealed start time falls on the partition's own
day, before the cutoff, goes in: neither a forged row nor a copy of a
record from another day (a kept partition's, a recent one's) placed in the
partition is vouched for.

``verify`` accepts a missing predecessor when a checkpoint signed with one
of its keys names that very record (id and hash) and the dataset no longer
stores any record of that chain sealed on that day (else the partition, or
part of it, is still there: a checkpoint copied in from another dataset, or
one left by a drop that then failed, covers nothing). A file holds a header
line (format, key id, signature of the body's SHA-256) and the body: the
signature is checked before the body is parsed. Without a signing key
retention writes no checkpoint and says so.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from otel_replay import _duck as duck
from otel_replay import semconv as sc
from otel_replay._json import canonical_json, strict_loads
from otel_replay.errors import DatasetError, PayloadError
from otel_replay.integrity import SealCheck, SigningKey, VerifyProblem, keys_by_id, stored_record
from otel_replay.location import Location
from otel_replay.voids import voided_link

from .backend import backend_for

__all__ = [
    "MARKS_DIR",
    "MAX_LINKS_PER_FILE",
    "DroppedLink",
    "Links",
    "RetentionMark",
    "VoidedLink",
    "dropped_links",
    "expected_before",
    "midnight_ns",
    "read_marks",
    "vouched_links",
    "write_marks",
]

MARKS_DIR = "_retention"
"""Where retention checkpoints live, beside ``spans/``."""

MAX_MARK_BYTES = 16 * 1024 * 1024
"""A checkpoint file larger than this is refused unread (retention writes at most :data:`MAX_LINKS_PER_FILE`)."""

MAX_LINKS_PER_FILE = 50_000
"""Links per checkpoint file (about 8 MB): a partition with more chains gets several files."""

_HEADER_BYTES = 4096
_FORMAT = 3
_DAY_NS = 86_400 * 1_000_000_000
_NEEDED = ("name", "trace_id", "span_id", "start_time", "attributes")
_COLUMNS = tuple(dict.fromkeys(("record_id", *_NEEDED, *sc.PROMOTED_COLUMNS.values())))
_HASH_NEEDLE = f'"{sc.RECORD_HASH}"'


@dataclass(frozen=True)
class DroppedLink:
    """One run of a chain's records that retention dropped: its newest record, and what its oldest one follows.

    ``seq``/``record_id``/``hash``: the newest record (a kept successor names
    it). ``bottom_seq``/``prev_id``/``prev_hash``: the oldest record's place
    and the predecessor it names, which ``verify`` still expects to find
    (stored, or dropped and vouched for), so a kept record whose only
    successor was dropped cannot be deleted unseen.
    """

    chain_id: str
    seq: int
    record_id: str
    hash: str
    bottom_seq: int
    prev_id: str
    prev_hash: str


@dataclass(frozen=True)
class VoidedLink:
    """A link a void record of a dropped partition gives up: sealed, never stored (:mod:`otel_replay.voids`)."""

    chain_id: str
    seq: int
    record_id: str
    hash: str


@dataclass(frozen=True)
class RetentionMark:
    """One checkpoint file as read back (body parsed only after its signature checked out)."""

    path: str
    day: str
    links: tuple[DroppedLink, ...]
    voided: tuple[VoidedLink, ...] = ()


@dataclass
class Links:
    """What :func:`dropped_links` found in a partition about to be dropped."""

    links: list[DroppedLink] = field(default_factory=list)
    failed: int = 0
    """Runs whose end records failed their seal check or their day (forged, edited, another key, moved in)."""
    unreadable: list[str] = field(default_factory=list)
    """Files whose records could not be read: they are not vouched for."""
    voided: list[VoidedLink] = field(default_factory=list)
    """Links the partition's void records (their seals checked) give up."""


def midnight_ns(day: dt.date) -> int:
    """The start of ``day`` (UTC) in nanoseconds since the epoch."""
    return int(dt.datetime.combine(day, dt.time(), dt.UTC).timestamp()) * 1_000_000_000


def _day_bounds(day: dt.date) -> tuple[int, int]:
    start = midnight_ns(day)
    return start, start + _DAY_NS


def _read(location: Location, path: str, columns: Sequence[str]) -> pa.Table:
    return pq.read_table(backend_for(location).source(path), columns=list(columns), partitioning=None)


def _sealed_keys(location: Location, path: str, file_no: int) -> pa.Table | None:
    """(chain id, seq, file, row, is void) of the rows of ``path`` that carry a seal; ``None``: it cannot be read."""
    try:
        names = set(pq.read_schema(backend_for(location).source(path)).names)
        if not set(_NEEDED) <= names:
            return None
        table = _read(location, path, ["attributes"])
        attributes = pc.cast(table["attributes"], pa.string())  # a large_string column reads the same
        rows = pa.table({"row": pa.array(range(table.num_rows), pa.int64()), "attributes": attributes})
        rows = rows.filter(pc.fill_null(pc.match_substring(rows["attributes"], _HASH_NEEDLE), False))
        con = duck.connect()
        try:
            con.register("sealed", rows)
            keys = duck.arrow(
                con.execute(
                    f"""
                    SELECT chain_id, seq, {file_no}::INTEGER AS file_no, row, is_void FROM (
                        SELECT row,
                               attributes ->> '$."replay.record.chain_id"' AS chain_id,
                               TRY_CAST(attributes ->> '$."replay.record.seq"' AS BIGINT) AS seq,
                               coalesce(attributes ->> '$."replay.kind"' = 'void', false) AS is_void
                        FROM sealed WHERE json_valid(attributes)
                    ) WHERE chain_id IS NOT NULL AND seq >= 0
                    """
                )
            )
        finally:
            con.close()
    except (OSError, pa.ArrowException, ValueError, TypeError):  # a damaged or foreign file
        return None
    return keys


def dropped_links(
    location: Location,
    files: Sequence[str],
    keys: SigningKey | Sequence[SigningKey],
    day: dt.date,
    before_ns: int,
) -> Links:
    """The runs a checkpoint for the partition of ``day`` (its live ``files``) vouches for.

    Per chain, each run of consecutive sequence numbers in ``files`` whose
    newest and oldest records both pass the seal check with one of ``keys``
    and were sealed on ``day``, before ``before_ns`` (the retention cutoff).
    A run whose end row fails (forged, another day's record moved in, another
    key) is not vouched for and counted: ``verify`` then reports the cut.
    Memory: one file's ``attributes`` column at a time, then four small
    columns per sealed row; the rows checked are read one file at a time.
    """
    found = Links()
    parts = []
    for file_no, path in enumerate(files):
        keys_of_file = _sealed_keys(location, path, file_no)
        if keys_of_file is None:
            found.unreadable.append(path)
        elif keys_of_file.num_rows:
            parts.append(keys_of_file)
    if not parts:
        return found
    start, end = _day_bounds(day)
    check = SealCheck(keys)
    con = duck.connect()
    try:
        con.register("sealed", pa.concat_tables(parts))
        runs = con.execute(
            """
            WITH d AS (SELECT DISTINCT chain_id, seq FROM sealed),
            g AS (SELECT chain_id, seq, seq - row_number() OVER (PARTITION BY chain_id ORDER BY seq) AS island FROM d)
            SELECT chain_id, min(seq) AS bottom, max(seq) AS top FROM g GROUP BY chain_id, island
            ORDER BY chain_id, top
            """
        ).fetchall()
        ends = {(c, q) for c, bottom, top in runs for q in (bottom, top)}
        con.register("wanted", pa.table({"chain_id": [c for c, _ in ends], "seq": [q for _, q in ends]}))
        places = con.execute(
            """
            SELECT s.chain_id, s.seq, s.file_no, s.row FROM sealed AS s
            JOIN wanted AS w ON s.chain_id = w.chain_id AND s.seq = w.seq
            UNION
            SELECT chain_id, seq, file_no, row FROM sealed WHERE is_void
            ORDER BY 3, 4
            """
        ).fetchall()
    finally:
        con.close()
    passed = _passing(location, files, places, check, (start, min(end, before_ns)))
    for chain_id, bottom, top in runs:
        newest, oldest = passed.get((chain_id, top)), passed.get((chain_id, bottom))
        if newest is None or oldest is None:
            found.failed += 1
            continue
        found.links.append(DroppedLink(chain_id, top, newest[0], newest[1], bottom, oldest[2], oldest[3]))
    for (chain_id, seq), (*_, attrs) in sorted(passed.items()):
        link = voided_link(attrs, seq)  # a void that passed: the link it gives up splits a run, and is not stored
        if link is not None:
            found.voided.append(VoidedLink(chain_id, *link))
    return found


def _passing(
    location: Location,
    files: Sequence[str],
    places: Sequence[tuple[str, int, int, int]],
    check: SealCheck,
    window: tuple[int, int],
) -> dict[tuple[str, int], tuple[str, str, str, str, Mapping[str, Any]]]:
    """Per (chain id, seq) in ``places``: (record id, hash, prev id, prev hash, attributes) of its first passing row.

    A row passes when its seal passes the check and it was sealed in ``window``.
    """
    passed: dict[tuple[str, int], tuple[str, str, str, str, Mapping[str, Any]]] = {}
    by_file: dict[int, list[tuple[str, int, int]]] = {}
    for chain_id, seq, file_no, row_no in places:
        by_file.setdefault(file_no, []).append((chain_id, seq, row_no))
    for file_no, wanted in by_file.items():
        path = files[file_no]
        try:
            names = pq.read_schema(backend_for(location).source(path)).names
            table = _read(location, path, [c for c in _COLUMNS if c in names]).take([r for _, _, r in wanted])
            starts = pc.cast(pc.cast(table["start_time"], pa.timestamp("ns", "UTC")), pa.int64()).to_pylist()
            rows = table.drop_columns(["start_time"]).to_pylist()
        except (OSError, pa.ArrowException, ValueError, TypeError):
            continue
        for (chain_id, seq, _), row, start_ns in zip(wanted, rows, starts, strict=True):
            if (chain_id, seq) in passed or not isinstance(row.get("name"), str) or start_ns is None:
                continue
            if not window[0] <= start_ns < window[1]:
                continue  # sealed on another day: a copy placed here, not this partition's record
            stored = stored_record({**row, "start_ns": start_ns, "filename": path})
            problem, signed = check.problem(stored)
            attrs = stored.attributes
            if problem is None and signed and attrs.get(sc.RECORD_CHAIN_ID) == chain_id:
                passed[(chain_id, seq)] = (
                    stored.record_id,
                    str(attrs.get(sc.RECORD_HASH)),
                    str(attrs.get(sc.RECORD_PREV_ID, "")),
                    str(attrs.get(sc.RECORD_PREV_HASH, "")),
                    attrs,
                )
    return passed


def write_marks(
    location: Location,
    partition: str,
    links: Sequence[DroppedLink],
    key: SigningKey,
    voided: Sequence[VoidedLink] = (),
) -> list[str]:
    """Write the signed checkpoint(s) for ``partition`` (durably, before the partition is dropped); their paths.

    ``voided``: the links the partition's void records give up, in the first file.
    """
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    token = uuid.uuid4().hex[:8]
    paths = []
    for n, first in enumerate(range(0, len(links), MAX_LINKS_PER_FILE)):
        part = links[first : first + MAX_LINKS_PER_FILE]
        doc: dict[str, Any] = {
            "day": partition.removeprefix("date="),
            "runs": [[x.chain_id, x.seq, x.record_id, x.hash, x.bottom_seq, x.prev_id, x.prev_hash] for x in part],
        }
        if voided and n == 0:
            doc["voided"] = [[v.chain_id, v.seq, v.record_id, v.hash] for v in voided]
        body = canonical_json(doc, where="retention checkpoint").encode()
        digest = hashlib.sha256(body).hexdigest()
        header = {"otel_replay_retention": _FORMAT, "key_id": key.key_id, "signature": key.sign(digest)}
        data = canonical_json(header, where="retention checkpoint").encode() + b"\n" + body
        path = location.join(MARKS_DIR, f"{partition}-{stamp}-{token}-{n}.json")
        _put(location, path, data)
        paths.append(path)
    return paths


def _put(location: Location, path: str, data: bytes) -> None:
    try:
        backend_for(location).write_atomic(path, data)  # locally, _retention/ itself is made durable too
    except (OSError, pa.ArrowException) as exc:
        raise location.error(f"cannot write the retention checkpoint {path}", exc) from exc


def read_marks(
    location: Location, keys: SigningKey | Sequence[SigningKey] | None
) -> tuple[list[RetentionMark], list[VerifyProblem]]:
    """The checkpoints under ``_retention/`` that a key among ``keys`` signed; a problem for each other one.

    With no keys nothing is read (nothing could be trusted) and nothing is reported.
    """
    by_id = keys_by_id(keys)
    marks: list[RetentionMark] = []
    problems: list[VerifyProblem] = []
    if not by_id:
        return marks, problems
    backend = backend_for(location)
    try:
        listed = backend.files_under(location.join(MARKS_DIR))
    except DatasetError as exc:  # e.g. a file named _retention where the directory should be
        return marks, [_problem(location.join(MARKS_DIR), f"cannot be listed ({exc})")]
    for info in listed:
        if not info.base_name.endswith(".json"):
            continue
        path = backend.path_of(info)
        if (info.size or 0) > MAX_MARK_BYTES:
            problems.append(_problem(path, f"larger than {MAX_MARK_BYTES} bytes: not one otel-replay writes"))
            continue
        try:
            data = backend.read_bytes(path)
        except DatasetError as exc:
            problems.append(_problem(path, f"cannot be read ({exc})"))
            continue
        if data is None:  # removed since the listing
            continue
        try:
            marks.append(_parse(path, data, by_id))
        except (PayloadError, ValueError, TypeError) as exc:
            problems.append(_problem(path, str(exc)[:300]))
    return marks, problems


def _problem(path: str, what: str) -> VerifyProblem:
    return VerifyProblem("-", f"retention checkpoint {what}", path)


def _parse(path: str, data: bytes, keys: Mapping[str, SigningKey]) -> RetentionMark:
    """One checkpoint file: the header's signature checked against the body's bytes, then the body parsed."""
    head, newline, body = data.partition(b"\n")
    if not newline or len(head) > _HEADER_BYTES:
        raise ValueError("is not one: no header line")
    header = strict_loads(head, where="its header")
    if not isinstance(header, dict) or header.get("otel_replay_retention") != _FORMAT:
        raise ValueError(f"is not a version {_FORMAT} retention checkpoint")
    key_id, signature = header.get("key_id"), header.get("signature")
    if not isinstance(key_id, str) or not isinstance(signature, str):
        raise ValueError("has no key id or signature")
    key = keys.get(key_id)
    if key is None:
        raise ValueError(f"is signed with key {key_id[:32]}, which is not a verification key")
    if not key.check(hashlib.sha256(body).hexdigest(), signature):
        raise ValueError("has an invalid signature (edited, or signed without the key)")
    doc = strict_loads(body, where="its body")
    day, raw = (doc.get("day"), doc.get("runs")) if isinstance(doc, dict) else (None, None)
    if not isinstance(day, str) or not isinstance(raw, list):
        raise ValueError("has no day or runs")
    links = []
    for item in raw:
        if (
            not isinstance(item, list)
            or len(item) != 7
            or not all(isinstance(item[i], str) for i in (0, 2, 3, 5, 6))
            or not all(isinstance(item[i], int) and not isinstance(item[i], bool) for i in (1, 4))
        ):
            raise ValueError(
                "has a run that is not [chain id, newest seq, record id, hash, oldest seq, prev id, prev hash]"
            )
        links.append(DroppedLink(*item))
    voided = []
    for item in doc.get("voided") or ():  # written since void records exist
        if (
            not isinstance(item, list)
            or len(item) != 4
            or not all(isinstance(item[i], str) for i in (0, 2, 3))
            or not isinstance(item[1], int)
            or isinstance(item[1], bool)
        ):
            raise ValueError("has a voided link that is not [chain id, seq, record id, hash]")
        voided.append(VoidedLink(*item))
    return RetentionMark(path, day, tuple(links), tuple(voided))


def vouched_links(marks: Iterable[RetentionMark]) -> dict[tuple[str, int], tuple[str, str, str]]:
    """(chain id, seq) -> (record id, hash, day) of every dropped run's newest record in ``marks``."""
    vouched: dict[tuple[str, int], tuple[str, str, str]] = {}
    for mark in marks:
        for link in mark.links:
            vouched[(link.chain_id, link.seq)] = (link.record_id, link.hash, mark.day)
        for void in mark.voided:  # never stored: vouched for as dropped, so the run after it names a known link
            vouched.setdefault((void.chain_id, void.seq), (void.record_id, void.hash, mark.day))
    return vouched


def expected_before(marks: Iterable[RetentionMark]) -> list[tuple[str, int, str, str, str]]:
    """(chain id, oldest seq, prev id, prev hash, day) of every dropped run: the predecessors verify must still find."""
    return [(x.chain_id, x.bottom_seq, x.prev_id, x.prev_hash, mark.day) for mark in marks for x in mark.links]
