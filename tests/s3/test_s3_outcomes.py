"""Outcome claims on an s3:// dataset: a conditional PUT (If-None-Match: *) lets one outcome per decision win."""

from __future__ import annotations

from typing import Any

import pytest

import otel_replay
from otel_replay import DecisionTracer, OutcomeAlreadyRecorded
from otel_replay.errors import DatasetError
from otel_replay.storage import objects
from otel_replay.storage.outcome_claims import claim_outcome

from .conftest import keys, losing_the_first_response


def test_a_second_outcome_is_refused_through_the_buckets_claim(bucket: str, s3: Any) -> None:
    uri = f"s3://{bucket}/team/traces"
    telemetry = otel_replay.configure(uri, set_global=False)
    try:
        decision = DecisionTracer().decision("a", "approve_loan", "fine")
        DecisionTracer().record_outcome(decision, True)  # a tracer of its own: only the bucket's claim refuses
        with pytest.raises(OutcomeAlreadyRecorded, match=rf"claimed by pid .* in s3://{bucket}/team/traces/_outcomes/"):
            DecisionTracer().record_outcome(decision, False)
    finally:
        telemetry.shutdown()
    assert keys(s3, bucket, "team/traces/_outcomes/") == [f"team/traces/_outcomes/{decision}.json"]


def test_a_released_remote_claim_can_be_taken_again(bucket: str, s3: Any) -> None:
    uri = f"s3://{bucket}/p"
    claim = claim_outcome(uri, "d1", "o1", True)
    with pytest.raises(OutcomeAlreadyRecorded):
        claim_outcome(uri, "d1", "o2", False)
    claim.release()
    assert keys(s3, bucket, "p/_outcomes/") == []
    claim_outcome(uri, "d1", "o3", False)
    assert keys(s3, bucket, "p/_outcomes/") == ["p/_outcomes/d1.json"]


def test_a_claim_whose_put_succeeded_but_whose_response_was_lost_is_still_its_claimants(
    bucket: str, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The claimant's own retry must not refuse it: that would leave the claim and no outcome, the decision
    # never to get one, while the error says another claimant took it.
    uri = f"s3://{bucket}/p"
    telemetry = otel_replay.configure(uri, set_global=False)
    try:
        decision = DecisionTracer().decision("a", "approve_loan", "fine")
        real = objects.client
        monkeypatch.setattr(objects, "client", losing_the_first_response(real, "/_outcomes/"))
        outcome = DecisionTracer().record_outcome(decision, True)
        monkeypatch.setattr(objects, "client", real)
        with pytest.raises(OutcomeAlreadyRecorded, match=rf"outcome {outcome.record_id}\)"):
            DecisionTracer().record_outcome(decision, False)  # another claimant's is still refused
        assert telemetry.force_flush()
    finally:
        telemetry.shutdown()
    with otel_replay.open(uri) as store:
        assert [r["outcome_id"] for r in store.rows("SELECT outcome_id FROM outcomes")] == [outcome.record_id]
    assert keys(s3, bucket, "p/_outcomes/") == [f"p/_outcomes/{decision}.json"]


def test_a_lost_response_does_not_make_another_claimants_claim_ours(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"s3://{bucket}/p"
    claim_outcome(uri, "d1", "o1", True)
    monkeypatch.setattr(objects, "client", losing_the_first_response(objects.client, "/_outcomes/"))
    with pytest.raises(OutcomeAlreadyRecorded, match=r"\(outcome o1\)"):
        claim_outcome(uri, "d1", "o2", True)


def test_a_claim_whose_put_was_stored_but_never_answered_at_all_is_still_its_claimants(
    bucket: str, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No retry this time (one attempt): the PUT stored the claim and the call failed. Raised, the claim stays
    # without an outcome and refuses this caller's next try (a new outcome id), so the decision never gets one.
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    uri = f"s3://{bucket}/p"
    telemetry = otel_replay.configure(uri, set_global=False)
    try:
        decision = DecisionTracer().decision("a", "approve_loan", "fine")
        real = objects.client
        monkeypatch.setattr(objects, "client", losing_the_first_response(real, "/_outcomes/"))
        tracer = DecisionTracer()
        try:
            outcome = tracer.record_outcome(decision, True)
        except DatasetError:  # not known to be claimed: the caller tries again, and that try must not be refused
            outcome = tracer.record_outcome(decision, True)
        monkeypatch.setattr(objects, "client", real)
        with pytest.raises(OutcomeAlreadyRecorded, match=rf"outcome {outcome.record_id}\)"):
            DecisionTracer().record_outcome(decision, False)
        assert telemetry.force_flush()
    finally:
        telemetry.shutdown()
    with otel_replay.open(uri) as store:
        assert [r["outcome_id"] for r in store.rows("SELECT outcome_id FROM outcomes")] == [outcome.record_id]


def test_a_claim_given_back_between_a_refused_put_and_its_read_is_taken_not_refused(
    bucket: str, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first claimant's emit failed and it gave the claim back right after this claimant's PUT was refused:
    # the read finds no claim. Refused then, the refusal would name a claim that no longer exists.
    uri = f"s3://{bucket}/p"
    first = claim_outcome(uri, "d1", "o1", True)
    real = objects.client

    def given_back_before_the_read(location: Any) -> Any:
        client = real(location)

        def release_first(**_: Any) -> None:
            first.release()

        client.meta.events.register_first("before-call.s3.GetObject", release_first, unique_id="release-first")
        return client

    monkeypatch.setattr(objects, "client", given_back_before_the_read)
    claim = claim_outcome(uri, "d1", "o2", False)
    monkeypatch.setattr(objects, "client", real)
    objects.close_clients()  # the shared client carries release_first: the claims below get one without it
    assert claim.where == f"s3://{bucket}/p/_outcomes/d1.json"
    assert b'"outcome_id": "o2"' in s3.get_object(Bucket=bucket, Key="p/_outcomes/d1.json")["Body"].read()
    with pytest.raises(OutcomeAlreadyRecorded, match=r"\(outcome o2\)"):
        claim_outcome(uri, "d1", "o3", True)
