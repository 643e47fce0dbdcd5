"""Retention checkpoints: signed notes of where retention cut each hash chain, so ``verify`` can tell it from deletion.

Every record names its predecessor's id and hash. When retention drops a
partition, the first records left of a long-lived chain name predecessors
that are gone, which is exactly what a deletion looks like. Before it drops a
partition, retention writes ``<dataset>/_retention/<partition>-<token>.json``:
for each chain, the newest record of every run of that chain's records in the
partition (chain id, sequence number, record id, hash), signed with the
signing key. ``verify`` accepts a missing predecessor when a checkpoint signed
with one of its keys names that very record (id and hash): nothing else is
vouched for, and a checkpoint that fails its signature is reported.

A record is written into a checkpoint only once its own seal passed with the
key (hash, signature, place), so a forged row planted in a partition that
retention then drops cannot make a later deletion look like retention. Without
a signing key retention writes no checkpoint and says so; ``verify`` then
reports the cut chains as before ("or dropped by retention").
"""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from otel_replay import _duck as duck
from otel_replay import semconv as sc
from otel_replay._json import canonical_json, strict_loads
from otel_replay.errors import PayloadError
from otel_replay.integrity import SealCheck, SigningKey, VerifyProblem
from otel_replay.location import Location

__all__ = [
    "MARKS_DIR",
    "DroppedLink",
    "Links",
    "RetentionMark",
    "dropped_links",
    "read_marks",
    "vouched_links",
    "write_mark",
]

MARKS_DIR = "_retention"
"""Where retention checkpoints live, beside ``spans/``."""

MAX_MARK_BYTES = 32 * 1024 * 1024
"""A checkpoint larger than this is refused unread (one entry per chain run: a few MB at most in practice)."""

_FORMAT = 1
_COLUMNS = tuple(
    dict.fromkeys(
        ("record_id", "name", "trace_id", "span_id", "start_time", "attributes", *sc.PROMOTED_COLUMNS.values())
    )
)
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
    """One checkpoint as read back: the partition it was written for, its links and its signature."""

    path: str
    partition: str
    links: tuple[DroppedLink, ...]
    key_id: str
    signature: str
    body_digest: str = field(repr=False)

    def signed_by(self, keys: Mapping[str, SigningKey]) -> str | None:
        """``None`` when a key among ``keys`` (by key id) signed this checkpoint, else what is wrong."""
        key = keys.get(self.key_id)
        if key is None:
            return f"signed with key {self.key_id}, which is not a verification key"
        if not key.check(self.body_digest, self.signature):
            return "signature invalid (edited, or signed without the key)"
        return None


def _body(partition: str, links: Sequence[DroppedLink], key_id: str) -> dict[str, Any]:
    return {
        "otel_replay_retention": _FORMAT,
        "partition": partition,
        "key_id": key_id,
        "links": [[link.chain_id, link.seq, link.record_id, link.hash] for link in links],
    }


def _digest(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(dict(body), where="retention checkpoint").encode()).hexdigest()


def _record_rows(location: Location, files: Iterable[str], unreadable: list[str]) -> pa.Table | None:
    """The rows of ``files`` that carry a seal, with the columns the seal check and the links need.

    A file that cannot be read is listed in ``unreadable`` and left out (its
    records are not vouched for; retention still drops it).
    """
    parts: list[pa.Table] = []
    for path in files:
        try:
            schema = pq.read_schema(location.open_object(path) if location.remote else path)
            columns = [c for c in _COLUMNS if c in schema.names]
            table = pq.read_table(
                location.open_object(path) if location.remote else path, columns=columns, partitioning=None
            )
        except (OSError, pa.ArrowException):
            unreadable.append(path)
            continue
        if "attributes" not in table.column_names or not pa.types.is_string(table.schema.field("attributes").type):
            continue
        table = table.filter(pc.fill_null(pc.match_substring(table["attributes"], _HASH_NEEDLE), False))
        if "start_time" in table.column_names:  # as the seal hashes it: integer nanoseconds
            table = table.append_column("start_ns", pc.cast(table["start_time"], pa.int64())).drop_columns(
                ["start_time"]
            )
        if table.num_rows and {"name", "start_ns"} <= set(table.column_names):
            parts.append(table.append_column("filename", pa.array([path] * table.num_rows, pa.string())))
    if not parts:
        return None
    return pa.concat_tables(parts, promote_options="permissive")


@dataclass
class Links:
    """What :func:`dropped_links` found in a partition about to be dropped."""

    links: list[DroppedLink] = field(default_factory=list)
    failed: int = 0
    """Newest rows of a run that failed their seal check (forged, edited, another key) and were passed over."""
    unreadable: list[str] = field(default_factory=list)
    """Files that could not be read: their records are not vouched for."""


def dropped_links(location: Location, files: Sequence[str], key: SigningKey, before_ns: int) -> Links:
    """The links a checkpoint for a partition made of ``files`` vouches for.

    Per chain, the newest record of each run of consecutive sequence numbers
    in ``files`` whose seal passes with ``key`` and whose sealed start time is
    before ``before_ns`` (the retention cutoff). A run's newest row that fails
    (forged, signed with another key, or a recent record moved into an old
    partition so that retention would delete it) is passed over for the one
    below it.
    """
    from otel_replay.store import stored_record  # the store imports this package

    found_links = Links()
    rows = _record_rows(location, files, found_links.unreadable)
    if rows is None:
        return found_links
    con = duck.connect()
    try:
        con.register("record_rows", rows)
        found = con.execute(
            """
            SELECT row_number() OVER () - 1 AS i,
                   attributes ->> '$."replay.record.chain_id"' AS chain_id,
                   TRY_CAST(attributes ->> '$."replay.record.seq"' AS BIGINT) AS seq
            FROM record_rows
            """
        ).fetchall()
    finally:
        con.close()
    by_chain: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for index, chain_id, seq in found:
        if chain_id is not None and seq is not None and seq >= 0:
            by_chain[chain_id][seq].append(index)
    check = SealCheck(key)
    for chain_id, seqs in by_chain.items():
        for top in [s for s in seqs if s + 1 not in seqs]:
            seq = top
            while seq in seqs:
                link = _passing(rows, seqs[seq], check, stored_record, chain_id, seq, before_ns)
                if link is not None:
                    found_links.links.append(link)
                    break
                found_links.failed += 1
                seq -= 1
    found_links.links.sort(key=lambda link: (link.chain_id, link.seq))
    return found_links


def _passing(
    rows: pa.Table, indices: list[int], check: SealCheck, stored_record: Any, chain_id: str, seq: int, before_ns: int
) -> DroppedLink | None:
    for index in indices:
        row = {name: rows[name][index].as_py() for name in rows.column_names}
        if row.get("start_ns") is None or row.get("name") is None or row["start_ns"] >= before_ns:
            continue
        stored = stored_record(row)
        problem, signed = check.problem(stored)
        if problem is None and signed:
            digest = stored.attributes.get(sc.RECORD_HASH)
            return DroppedLink(chain_id, seq, stored.record_id, str(digest))
    return None


def write_mark(location: Location, partition: str, links: Sequence[DroppedLink], key: SigningKey) -> str:
    """Write the signed checkpoint for ``partition`` (durably, before the partition is dropped); its path."""
    body = _body(partition, links, key.key_id)
    doc = {**body, "signature": key.sign(_digest(body))}
    data = canonical_json(doc, where="retention checkpoint").encode()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    name = f"{partition}-{stamp}-{uuid.uuid4().hex[:8]}.json"
    path = location.join(MARKS_DIR, name)
    if location.remote:
        try:
            with location.fs.open_output_stream(location.fs_path(path)) as out:
                out.write(data)
        except (OSError, pa.ArrowException) as exc:
            raise location.error(f"cannot write the retention checkpoint {path}", exc) from exc
        return path
    from pathlib import Path

    from otel_replay.exporters.writer import fsync_dir, write_bytes_atomic

    write_bytes_atomic(data, Path(path))
    fsync_dir(location.local_root())  # the new _retention/ directory itself
    return path


def read_marks(location: Location) -> tuple[list[RetentionMark], list[VerifyProblem]]:
    """Every checkpoint under ``_retention/``, and a problem for each one that cannot be read as one."""
    marks: list[RetentionMark] = []
    problems: list[VerifyProblem] = []
    for info in location.files_under(location.join(MARKS_DIR)):
        if not info.base_name.endswith(".json"):
            continue
        path = info.path if not location.remote else f"s3://{info.path}"
        if (info.size or 0) > MAX_MARK_BYTES:
            problems.append(_problem(path, f"larger than {MAX_MARK_BYTES} bytes: not a retention checkpoint"))
            continue
        data = location.read_bytes(path)
        if data is None:  # removed since the listing
            continue
        try:
            marks.append(_parse(path, data))
        except (PayloadError, ValueError, TypeError) as exc:
            problems.append(_problem(path, str(exc)))
    return marks, problems


def _problem(path: str, what: str) -> VerifyProblem:
    return VerifyProblem("-", f"retention checkpoint: {what}", path)


def _parse(path: str, data: bytes) -> RetentionMark:
    doc = strict_loads(data, where="retention checkpoint")
    if not isinstance(doc, dict) or doc.get("otel_replay_retention") != _FORMAT:
        raise ValueError(f"not a version {_FORMAT} retention checkpoint")
    partition, key_id, signature, raw = doc.get("partition"), doc.get("key_id"), doc.get("signature"), doc.get("links")
    if not (isinstance(partition, str) and isinstance(key_id, str) and isinstance(signature, str)):
        raise ValueError("partition, key_id and signature must be strings")
    if not isinstance(raw, list):
        raise ValueError("links must be a list")
    links = []
    for item in raw:
        if (
            not isinstance(item, list)
            or len(item) != 4
            or not all(isinstance(v, str) for v in (item[0], item[2], item[3]))
            or isinstance(item[1], bool)
            or not isinstance(item[1], int)
        ):
            raise ValueError("each link must be [chain id, sequence number, record id, hash]")
        links.append(DroppedLink(item[0], item[1], item[2], item[3]))
    body = _body(partition, links, key_id)
    return RetentionMark(path, partition, tuple(links), key_id, signature, _digest(body))


def vouched_links(
    marks: Sequence[RetentionMark],
    keys: SigningKey | Sequence[SigningKey] | None,
    present: Iterable[str] = (),
) -> tuple[dict[tuple[str, int], tuple[str, str]], list[VerifyProblem]]:
    """(chain id, seq) -> (record id, hash) from the checkpoints a key among ``keys`` signed; problems for the rest.

    A checkpoint vouches only while its partition is gone from the dataset
    (not among ``present``): while the partition is there its records are
    too, and a checkpoint copied in from another dataset (or written by a run
    that then failed to drop) must not cover a deletion from it. With no keys
    nothing is vouched for and nothing is reported (the cut chains are then
    reported as before).
    """
    still_there = set(present)
    by_id = {k.key_id: k for k in ([keys] if isinstance(keys, SigningKey) else keys or [])}
    vouched: dict[tuple[str, int], tuple[str, str]] = {}
    problems: list[VerifyProblem] = []
    if not by_id:
        return vouched, problems
    for mark in marks:
        wrong = mark.signed_by(by_id)
        if wrong is not None:
            problems.append(_problem(mark.path, wrong))
            continue
        if mark.partition in still_there:
            continue
        for link in mark.links:
            vouched[(link.chain_id, link.seq)] = (link.record_id, link.hash)
    return vouched, problems
