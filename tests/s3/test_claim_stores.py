"""Both ways of keeping compensation claims, a directory and an object store, held to the same behaviour.

Each test runs once on a local directory and once on a bucket of the local
S3-compatible server: what the gate relies on (one lock holder at a time,
a state read back whole, one winner of a race) must not depend on where the
dataset lives.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from otel_replay.errors import AlreadyCompensated, CompensationInProgress, DatasetError
from otel_replay.gate.claim_stores import (
    ClaimChanged,
    ClaimStore,
    FileClaimStore,
    ObjectClaimStore,
    claim_store_for,
)
from otel_replay.gate.claims import ClaimState, CompensationClaims
from otel_replay.location import resolve
from otel_replay.storage import objects

from .conftest import keys, losing_the_first_response

KEY = "c" * 32


@pytest.fixture(params=["local", "s3"])
def dataset(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A dataset that does not hold any claim yet: a directory not made yet, or a prefix of a fresh bucket."""
    if request.param == "local":
        return str(tmp_path / "not-made-yet" / "traces")
    bucket = request.getfixturevalue("bucket")
    return f"s3://{bucket}/traces"


def _store(dataset: str) -> ClaimStore:
    return claim_store_for(resolve(dataset), ttl_seconds=30.0)


def test_the_store_is_picked_from_what_the_dataset_can_do(dataset: str) -> None:
    store = _store(dataset)
    if dataset.startswith("s3://"):
        assert isinstance(store, ObjectClaimStore)
        assert store.path(KEY) == f"{dataset}/_compensations/{KEY}.json"
    else:
        assert isinstance(store, FileClaimStore)
        assert store.path(KEY) == Path(dataset) / "_compensations" / f"{KEY}.json"


def test_nothing_is_stored_before_the_first_claim_and_a_state_reads_back_whole(dataset: str) -> None:
    store = _store(dataset)
    assert store.read(KEY) == (None, None)
    claim = store.lock(KEY)
    assert claim is not None
    try:
        store.write(claim, b'{"state": "claimed"}', final=False)
        store.write(claim, b'{"state": "done", "note": "' + b"x" * 100_000 + b'"}', final=True)
    finally:
        store.release(claim)
    text, _ = _store(dataset).read(KEY)  # another claimant's view
    assert text is not None and text.startswith('{"state": "done"') and text.endswith('"}') and len(text) > 100_000


def test_a_second_claimant_is_refused_the_lock_until_the_first_gives_it_back(dataset: str) -> None:
    first, second = _store(dataset), _store(dataset)
    held = first.lock(KEY)
    assert held is not None
    assert second.lock(KEY) is None
    other = second.lock("d" * 32)
    assert other is not None  # another receipt's lock is free
    second.release(other)  # and given back: a held lease renews on a thread of its own for the worker's life
    first.release(held)
    again = second.lock(KEY)
    assert again is not None
    second.release(again)


def test_of_eight_claimants_racing_for_one_lock_exactly_one_wins(dataset: str) -> None:
    stores = [_store(dataset) for _ in range(8)]
    start = threading.Barrier(len(stores))
    won: list[Any] = []
    failed: list[BaseException] = []

    def race(store: ClaimStore) -> None:
        start.wait()
        try:
            claim = store.lock(KEY)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            failed.append(exc)
            return
        if claim is not None:
            won.append((store, claim))

    threads = [threading.Thread(target=race, args=(store,)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for store, claim in won:
        store.release(claim)  # stops its lease's renewal thread, which would go on writing for the worker's life
    assert failed == []
    assert len(won) == 1


def test_two_claim_objects_racing_through_the_gate_s_claims_let_one_claim_through(dataset: str) -> None:
    first, second = CompensationClaims(dataset), CompensationClaims(dataset)
    held = first.claim(KEY, decision_id="d-1", receipt_id="r-1")
    with pytest.raises(CompensationInProgress, match="r-1 is being compensated by"):
        second.claim(KEY, decision_id="d-1", receipt_id="r-1")
    first.finish(held, ClaimState.DONE, executed="rolled_back")
    with pytest.raises(AlreadyCompensated, match="already compensated by"):
        second.claim(KEY, decision_id="d-1", receipt_id="r-1", resume=True)


def test_a_dataset_whose_bucket_is_missing_fails_in_one_line_naming_it(tmp_path: Path) -> None:
    missing = f"s3://otel-replay-missing-{uuid.uuid4().hex[:8]}/traces"
    store = _store(missing)
    with pytest.raises(DatasetError, match="NoSuchBucket|does not exist") as caught:
        store.read(KEY)
    assert "\n" not in str(caught.value) and missing.split("/")[2] in str(caught.value)
    with pytest.raises(DatasetError):
        CompensationClaims(missing).claim(KEY, decision_id="d", receipt_id="r-1")


def test_a_local_dataset_that_is_a_file_is_refused_and_left_alone(tmp_path: Path) -> None:
    blocker = tmp_path / "traces"
    blocker.write_text("not a directory")
    with pytest.raises(OSError):
        _store(str(blocker)).lock(KEY)
    assert blocker.read_text() == "not a directory"


def test_an_object_claim_changed_since_it_was_read_is_not_overwritten(bucket: str, s3: Any) -> None:
    uri = f"s3://{bucket}/traces"
    mine, theirs = _store(uri), _store(uri)
    claim = mine.lock(KEY)
    assert claim is not None
    mine.write(claim, b'{"state": "claimed", "claimant": "me"}', final=False)
    # Another claimant took over after this one's lock lapsed, and wrote its own state.
    _, etag = theirs.read(KEY)
    s3.put_object(Bucket=bucket, Key=f"traces/_compensations/{KEY}.json", Body=b'{"state": "done", "claimant": "them"}')
    assert etag != theirs.read(KEY)[1]
    with pytest.raises(ClaimChanged):
        mine.write(claim, b'{"state": "claimed", "claimant": "me again"}', final=False)
    assert '"them"' in (theirs.read(KEY)[0] or "")
    mine.write(claim, b'{"state": "failed", "claimant": "me"}', final=True)  # how it ended is recorded
    assert '"failed"' in (theirs.read(KEY)[0] or "")
    mine.release(claim)
    assert keys(s3, bucket, "traces/.locks/") == []


@pytest.mark.parametrize("final", [False, True], ids=["claiming", "finishing"])
def test_an_object_claim_whose_write_was_stored_but_whose_response_was_lost_is_still_this_claimants(
    bucket: str, monkeypatch: pytest.MonkeyPatch, final: bool
) -> None:
    # The retried PUT finds the claim changed, by this claimant's own first attempt: that is no other claimant
    # taking over (which would refuse a compensation no one else is making), and the next write goes on from it.
    uri = f"s3://{bucket}/traces"
    monkeypatch.setattr(objects, "client", losing_the_first_response(objects.client, f"/_compensations/{KEY}.json"))
    store = _store(uri)
    claim = store.lock(KEY)
    assert claim is not None
    try:
        store.write(claim, b'{"state": "claimed", "claimant": "me"}', final=final)
        assert store.read(KEY) == ('{"state": "claimed", "claimant": "me"}', claim.etag)
        store.write(claim, b'{"state": "done", "claimant": "me"}', final=False)
        assert store.read(KEY)[0] == '{"state": "done", "claimant": "me"}'
    finally:
        store.release(claim)
