"""A claim is durable when it returns: synced in the claim store; concurrent claims share their syncs; a sync that
fails gives the claim back and says so."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time

import pytest

from otel_replay.errors import DatasetError, OutcomeAlreadyRecorded
from otel_replay.storage import outcome_claims
from otel_replay.storage.outcome_claims import claim_outcome


def _claimed(dataset) -> list[str]:
    with contextlib.closing(sqlite3.connect(dataset / "_outcomes" / "claims.sqlite3")) as con:
        return sorted(row[0] for row in con.execute("SELECT decision_id FROM outcome_claims"))


def test_concurrent_claims_share_their_syncs_and_each_decision_is_claimed_once(dataset, monkeypatch):
    # A slow disk (every sync takes 20 ms here): eight threads claiming 160 decisions, each decision twice,
    # need far fewer syncs than claims, and each decision is won exactly once.
    claim_outcome(dataset, "warm-up", "o", True)
    syncs = []
    real = os.fdatasync

    def slow(fd: int) -> None:
        syncs.append(fd)
        time.sleep(0.02)
        real(fd)

    monkeypatch.setattr(outcome_claims.os, "fdatasync", slow)
    won: list[str] = []
    refused: list[str] = []
    lock = threading.Lock()

    def claim(part: list[str]) -> None:
        for decision in part:
            try:
                claim_outcome(dataset, decision, f"o-{threading.get_ident()}", True)
                with lock:
                    won.append(decision)
            except OutcomeAlreadyRecorded:
                with lock:
                    refused.append(decision)

    decisions = [f"d-{i}" for i in range(160)]
    threads = [threading.Thread(target=claim, args=((decisions * 2)[k::8],)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(won) == sorted(decisions) and sorted(refused) == sorted(decisions)
    assert 1 <= len(syncs) <= len(decisions) // 2, len(syncs)
    assert sorted(_claimed(dataset)) == sorted([*decisions, "warm-up"])


def test_a_claim_whose_sync_fails_is_given_back_and_the_error_names_the_store(dataset, monkeypatch):
    claim_outcome(dataset, "first", "o-1", True)

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(outcome_claims.os, "fdatasync", broken)
    with pytest.raises(DatasetError) as raised:
        claim_outcome(dataset, "d-1\nforged line", "o-2", True)
    store = dataset / "_outcomes" / "claims.sqlite3"
    assert str(raised.value) == (
        f"outcome claim store {store}: cannot make the claim for decision 'd-1\\nforged line' durable "
        "([Errno 5] Input/output error)"
    )
    assert _claimed(dataset) == ["first"]  # not known to be on disk: given back
    monkeypatch.undo()
    claim_outcome(dataset, "d-1\nforged line", "o-3", True)  # the retry is not refused by the failed attempt
    assert _claimed(dataset) == ["d-1\nforged line", "first"]
