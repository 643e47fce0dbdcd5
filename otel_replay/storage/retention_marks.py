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

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from otel_replay import _duck as duck
from otel_replay import semconv as sc
from otel_replay._json import canonical_json, strict_loads
from otel_replay.errors import DatasetError, PayloadError
from otel_replay.integrity import SealCheck, SigningKey, VerifyProblem
from otel_replay.location import Location

__all__ = [
    "MARKS_DIR",
    "MAX_LINKS_PER_FILE",
    "DroppedLink",
    "Links",
    "RetentionMark",
    "dropped_links",
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
_FORMAT = 2
_DAY_NS = 86_400 * 1_000_000_000
_NEEDED = ("name", "trace_id", "span_id", "start_time", "attributes")
_COLUMNS = tuple(dict.fromkeys(("record_id", *_NEEDED, *sc.PROMOTED_COLUMNS.values())))
_HASH_NEEDLE = f'"{sc.RECORD_HASH}"'


@dataclass(frozen=True)
class DroppedLink:
    """The newest record of one run of a chain's records that retention dropped."""

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


@dataclass
class Links:
    """What :func:`dropped_links` found in a partition about to be dropped."""

    links: list[DroppedLink] = field(default_factory=list)
    failed: int = 0
    """Runs whose newest record failed its seal check or its day (forged, edited, another key, moved in)."""
    unreadable: list[str] = field(default_factory=list)
    """Files whose records could not be read: they are not vouched for."""


def _day_bounds(day: dt.date) -> tuple[int, int]:
    start = int(dt.datetime.combine(day, dt.time(), dt.UTC).timestamp()) * 1_000_000_000
    return start, start + _DAY_NS


def _read(location: Location, path: str, columns: Sequence[str]) -> pa.Table:
    source = location.open_object(path) if location.remote else path
    return pq.read_table(source, columns=list(columns), partitioning=None)


def _sealed_keys(location: Location, path: str, file_no: int) -> pa.Table | None:
    """(chain id, seq, file, row) of the rows of ``path`` that carry a seal; ``None`` when it cannot be read."""
    try:
        source = location.open_object(path) if location.remote else path
        names = set(pq.read_schema(source).names)
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
                    SELECT chain_id, seq, {file_no}::INTEGER AS file_no, row FROM (
                        SELECT row,
                               attributes ->> '$."replay.record.chain_id"' AS chain_id,
                               TRY_CAST(attributes ->> '$."replay.record.seq"' AS BIGINT) AS seq
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


MAX_STEPS = 64
"""How far below a run's newest row retention looks for one that passes before it gives the run up (unvouched)."""


def dropped_links(
    location: Location,
    files: Sequence[str],
    keys: SigningKey | Sequence[SigningKey],
    day: dt.date,
    before_ns: int,
) -> Links:
    """The links a checkpoint for the partition of ``day`` (its live ``files``) vouches for.

    Per chain, the newest record of each run of consecutive sequence numbers
    in ``files`` whose seal passes with one of ``keys`` and whose sealed start
    time is on ``day`` and before ``before_ns`` (the retention cutoff). A run's
    newest row that fails is passed over for the one below it (at most
    :data:`MAX_STEPS` times). Memory: one file's ``attributes`` column at a
    time, then four small columns per sealed row; each round reads the rows it
    checks one file at a time.
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
    window = (start, min(end, before_ns))
    check = SealCheck(keys)
    con = duck.connect()
    try:
        con.register("sealed", pa.concat_tables(parts))
        pending = con.execute(
            """
            SELECT DISTINCT a.chain_id, a.seq FROM sealed AS a
            WHERE NOT EXISTS (SELECT 1 FROM sealed AS b WHERE b.chain_id = a.chain_id AND b.seq = a.seq + 1)
            """
        ).fetchall()
        for _ in range(MAX_STEPS):
            if not pending:
                break
            con.register("wanted", pa.table({"chain_id": [c for c, _ in pending], "seq": [q for _, q in pending]}))
            places = con.execute(
                """
                SELECT s.chain_id, s.seq, s.file_no, s.row FROM sealed AS s
                JOIN wanted AS w ON s.chain_id = w.chain_id AND s.seq = w.seq
                ORDER BY s.file_no, s.row
                """
            ).fetchall()
            passed = _passing(location, files, places, check, window)
            below = []
            for chain_id, seq in pending:
                link = passed.get((chain_id, seq))
                if link is not None:
                    found.links.append(link)
                else:
                    found.failed += 1
                    below.append((chain_id, seq - 1))
            pending = below
            if pending:  # keep only the steps that stay inside a run
                con.register("wanted", pa.table({"chain_id": [c for c, _ in pending], "seq": [q for _, q in pending]}))
                pending = con.execute(
                    "SELECT DISTINCT w.chain_id, w.seq FROM wanted AS w "
                    "JOIN sealed AS s ON s.chain_id = w.chain_id AND s.seq = w.seq"
                ).fetchall()
    finally:
        con.close()
    found.links.sort(key=lambda link: (link.chain_id, link.seq))
    return found


def _passing(
    location: Location,
    files: Sequence[str],
    places: Sequence[tuple[str, int, int, int]],
    check: SealCheck,
    window: tuple[int, int],
) -> dict[tuple[str, int], DroppedLink]:
    """Per (chain id, seq) in ``places``: the link of its first row that passes the seal check, sealed in ``window``."""
    from otel_replay.store import stored_record  # the store imports this package

    passed: dict[tuple[str, int], DroppedLink] = {}
    by_file: dict[int, list[tuple[str, int, int]]] = {}
    for chain_id, seq, file_no, row_no in places:
        by_file.setdefault(file_no, []).append((chain_id, seq, row_no))
    for file_no, wanted in by_file.items():
        path = files[file_no]
        try:
            source = location.open_object(path) if location.remote else path
            names = pq.read_schema(source).names
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
            if problem is None and signed:
                digest = str(stored.attributes.get(sc.RECORD_HASH))
                passed[(chain_id, seq)] = DroppedLink(chain_id, seq, stored.record_id, digest)
    return passed


def write_marks(location: Location, partition: str, links: Sequence[DroppedLink], key: SigningKey) -> list[str]:
    """Write the signed checkpoint(s) for ``partition`` (durably, before the partition is dropped); their paths."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    token = uuid.uuid4().hex[:8]
    paths = []
    for n, first in enumerate(range(0, len(links), MAX_LINKS_PER_FILE)):
        part = links[first : first + MAX_LINKS_PER_FILE]
        body = canonical_json(
            {"day": partition.removeprefix("date="), "links": [[x.chain_id, x.seq, x.record_id, x.hash] for x in part]},
            where="retention checkpoint",
        ).encode()
        digest = hashlib.sha256(body).hexdigest()
        header = {"otel_replay_retention": _FORMAT, "key_id": key.key_id, "signature": key.sign(digest)}
        data = canonical_json(header, where="retention checkpoint").encode() + b"\n" + body
        path = location.join(MARKS_DIR, f"{partition}-{stamp}-{token}-{n}.json")
        _put(location, path, data)
        paths.append(path)
    return paths


def _put(location: Location, path: str, data: bytes) -> None:
    try:
        if location.remote:
            with location.fs.open_output_stream(location.fs_path(path)) as out:
                out.write(data)
            return
        from pathlib import Path

        from otel_replay.exporters.writer import fsync_dir, write_bytes_atomic

        write_bytes_atomic(data, Path(path))
        fsync_dir(location.local_root())  # the _retention/ directory itself, when it was just made
    except (OSError, pa.ArrowException) as exc:
        raise location.error(f"cannot write the retention checkpoint {path}", exc) from exc


def read_marks(
    location: Location, keys: SigningKey | Sequence[SigningKey] | None
) -> tuple[list[RetentionMark], list[VerifyProblem]]:
    """The checkpoints under ``_retention/`` that a key among ``keys`` signed; a problem for each other one.

    With no keys nothing is read (nothing could be trusted) and nothing is reported.
    """
    by_id = {k.key_id: k for k in ([keys] if isinstance(keys, SigningKey) else keys or [])}
    marks: list[RetentionMark] = []
    problems: list[VerifyProblem] = []
    if not by_id:
        return marks, problems
    try:
        listed = location.files_under(location.join(MARKS_DIR))
    except DatasetError as exc:  # e.g. a file named _retention where the directory should be
        return marks, [_problem(location.join(MARKS_DIR), f"cannot be listed ({exc})")]
    for info in listed:
        if not info.base_name.endswith(".json"):
            continue
        path = info.path if not location.remote else f"s3://{info.path}"
        if (info.size or 0) > MAX_MARK_BYTES:
            problems.append(_problem(path, f"larger than {MAX_MARK_BYTES} bytes: not one otel-replay writes"))
            continue
        try:
            data = location.read_bytes(path)
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
    day, raw = (doc.get("day"), doc.get("links")) if isinstance(doc, dict) else (None, None)
    if not isinstance(day, str) or not isinstance(raw, list):
        raise ValueError("has no day or links")
    links = []
    for item in raw:
        if (
            not isinstance(item, list)
            or len(item) != 4
            or not all(isinstance(v, str) for v in (item[0], item[2], item[3]))
            or isinstance(item[1], bool)
            or not isinstance(item[1], int)
        ):
            raise ValueError("has a link that is not [chain id, sequence number, record id, hash]")
        links.append(DroppedLink(item[0], item[1], item[2], item[3]))
    return RetentionMark(path, day, tuple(links))


def vouched_links(marks: Iterable[RetentionMark]) -> dict[tuple[str, int], tuple[str, str, str]]:
    """(chain id, seq) -> (record id, hash, day) of every link in ``marks`` (already checked by :func:`read_marks`)."""
    vouched: dict[tuple[str, int], tuple[str, str, str]] = {}
    for mark in marks:
        for link in mark.links:
            vouched[(link.chain_id, link.seq)] = (link.record_id, link.hash, mark.day)
    return vouched
