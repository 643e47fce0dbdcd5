"""Outcome claims on an s3:// dataset: a conditional PUT (If-None-Match: *) lets one outcome per decision win."""

from __future__ import annotations

from typing import Any

import pytest

import otel_replay
from otel_replay import DecisionTracer, OutcomeAlreadyRecorded
from otel_replay.storage.outcome_claims import claim_outcome

from .conftest import keys


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
