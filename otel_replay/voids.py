"""Void records: a record sealed into its chain and then not kept by its store, said so in the chain itself.

A record takes its chain's next link when it is sealed. An outcome is sealed
inside the claim store's transaction that keeps it (beside its claim); when
that transaction rolls back, or its commit cannot be made durable and is
undone, the outcome is refused to its caller (who may record it again) and
the link it took names a record the dataset never gets. The records sealed
after it would make ``verify`` read that gap as a deletion.

So the writer seals a **void record** right away (``replay.void``, kind
``void``), naming the link it gives up: the record's id, span name, sequence
number and hash. It is a record like any other: hashed, signed and linked, so
only a holder of the signing key can make one, and deleting it is itself a
gap. ``verify`` counts a missing record that a valid void of its chain names
(same id and hash, an earlier sequence number) in
:attr:`~otel_replay.integrity.VerifyReport.voided`, not as deleted; a record
a void names that *is* stored is a problem (its writer was told it was not
kept).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from otel_replay import semconv as sc

__all__ = ["NOT_KEPT", "Voids", "void_attributes", "voided_link"]

NOT_KEPT = "sealed, then not kept: its store refused or undid the transaction that was to keep it"
"""The reason a void record gives when a store gives back a record it sealed."""


def void_attributes(
    void_id: str, name: str, record_id: str, seq: int, digest: str, reason: str = NOT_KEPT
) -> dict[str, Any]:
    """The attributes of void record ``void_id`` for record ``record_id`` (span ``name``), sealed at ``seq``."""
    return {
        sc.KIND: sc.KIND_VOID,
        sc.RECORD_ID: void_id,
        sc.RECORD_SOURCE: "tracer",
        sc.VOID_RECORD_ID: record_id,
        sc.VOID_NAME: name,
        sc.VOID_SEQ: seq,
        sc.VOID_HASH: digest,
        sc.VOID_REASON: reason,
    }


def voided_link(attrs: Mapping[str, Any], seq: int) -> tuple[int, str, str] | None:
    """(seq, record id, hash) of the link a void record sealed at ``seq`` gives up; ``None``: not a void, or none.

    A void names a link before its own (it is sealed after the record it
    voids); one naming its own place or a later one gives up nothing. The
    caller has checked the record's seal.
    """
    if attrs.get(sc.KIND) != sc.KIND_VOID:
        return None
    voided, digest = attrs.get(sc.VOID_RECORD_ID), attrs.get(sc.VOID_HASH)
    try:
        at = int(attrs.get(sc.VOID_SEQ))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if isinstance(voided, str) and isinstance(digest, str) and 0 <= at < seq:
        return at, voided, digest
    return None


@dataclass(frozen=True, slots=True)
class _Void:
    void_id: str
    seq: int
    record_id: str
    digest: str
    file: str


class Voids:
    """The links that valid void records give up, per chain, as ``verify`` reads them."""

    def __init__(self) -> None:
        """No void seen yet."""
        self._links: dict[tuple[str, int], _Void] = {}
        self._failed: set[int] = set()  # id() of stored rows that failed their seal check (rare; verify keeps them)

    def note(self, chain_id: str, seq: int, record_id: str, attrs: Mapping[str, Any], file: str = "") -> None:
        """Take note of a stored record that passed its seal check: if it is a void, of the link it gives up."""
        link = voided_link(attrs, seq)
        if link is not None:
            at, voided, digest = link
            self._links.setdefault((chain_id, at), _Void(record_id, seq, voided, digest, file))

    def excuses(self, chain_id: str, seq: int, record_id: Any, digest: Any) -> bool:
        """Whether a void of ``chain_id`` gives up link ``seq`` holding exactly that record (id and hash)."""
        void = self._links.get((chain_id, seq))
        return void is not None and (void.record_id, void.digest) == (record_id, digest)

    def note_failed(self, row: object) -> None:
        """Take note of a stored row that failed its seal check (it stays in ``verify``'s chains, reported)."""
        self._failed.add(id(row))

    def count_missing(
        self, chains: Mapping[str, Mapping[int, Iterable[Any]]]
    ) -> tuple[int, list[tuple[str, str, str]]]:
        """(voided records not stored, (record id, problem, file) of each voided record stored after all).

        A stored row that claims to be a voided record and failed its own seal
        check is neither: its problem is reported already.
        """
        missing = 0
        stored: list[tuple[str, str, str]] = []
        for (chain_id, seq), void in self._links.items():
            there = [r for r in chains.get(chain_id, {}).get(seq, ()) if r.record_id == void.record_id]
            kept = [r for r in there if id(r) not in self._failed and r.attributes.get(sc.RECORD_HASH) == void.digest]
            if not there:
                missing += 1
            elif kept:
                stored.append(
                    (
                        void.record_id,
                        f"stored, yet void record {void.void_id} (seq {void.seq}) says its writer did not keep it: "
                        "it was refused to its caller, who may have recorded it again",
                        there[0].file,
                    )
                )
        return missing, stored
