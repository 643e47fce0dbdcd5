"""Captured content is redacted before it leaves the process; what cannot be redacted is dropped and counted."""

from __future__ import annotations

import pytest

from otel_replay import semconv as sc
from otel_replay.instrumentation import tool
from otel_replay.instrumentation._redact import MAX_CONTENT_CHARS, REDACTED, redact, scrub, stats

from .conftest import Pipeline


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("OPENAI_API_KEY=sk-proj-AbCdEfGhIjKlMnOpQrStUv", "AbCdEfGhIjKlMnOpQrStUv"),
        ("x-api-key: sk-ant-api03-abcdefghijklmnopqrstuvwxyz", "abcdefghijklmnopqrstuvwxyz"),
        ("Authorization: Bearer ya29.a0AfH6SMBxyz123456", "ya29.a0AfH6SMBxyz123456"),
        ("aws AKIAIOSFODNN7EXAMPLE key", "AKIAIOSFODNN7EXAMPLE"),
        ("token ghp_abcdefghijklmnopqrstuvwxyz0123456789", "ghp_abcdefghijklmnopqrstuvwxyz0123456789"),
        ("redis://default:topsecretpw@cache:6379/0", "topsecretpw"),
        ('{"password": "correct horse battery"}', "correct horse"),
        ("client_secret=abc123def456&grant=x", "abc123def456"),
        (
            "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----",
            "MIIEvQIBADANBgkq",
        ),
        ("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIIrYSSNQFaA2Hwf1du (cut off, no END)", "MHcCAQEEIIrYSSNQ"),
        ("GET https://maps.example/geo?key=Zz9-url-key-value&q=x", "Zz9-url-key-value"),
        ("https://s3.example/o?X-Amz-Signature=abcdef0123456789&X-Amz-Credential=AKID%2F1", "abcdef0123456789"),
        ("https://s3.example/o?X-Amz-Credential=AKID%2F20260101%2Fus&x=1", "AKID%2F20260101"),
        ("a google key AIzaSyA-1234567890abcdefghijklmnopqrstu in text", "AIzaSyA-1234567890abcdefghij"),
        ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhYmMifQ.dBjftJeZ4CVPmB92K27uhbUJU1p1r", "dBjftJeZ4CVPmB92K27"),
    ],
)
def test_each_kind_of_secret_is_redacted(text: str, secret: str):
    out = redact(text)
    assert secret not in out and REDACTED in out


def test_ordinary_text_is_left_alone():
    text = "Pay invoice INV-4471 of 4,200 EUR to acme-supplies; the token budget is fine."
    assert redact(text) == text


def test_huge_content_is_capped_with_a_marker_and_a_secret_past_the_cap_never_leaks():
    text = "a" * (MAX_CONTENT_CHARS - 10) + " sk-proj-" + "Z" * 40 + " " + "b" * 10_000_000
    out = scrub(text)
    assert out is not None and len(out) < MAX_CONTENT_CHARS + 40 and "chars cut]" in out
    assert "ZZZZZZZZ" not in out


def test_unrenderable_content_is_dropped_and_counted():
    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no repr for you")

    deep: list = []
    node = deep
    for _ in range(100_000):
        node.append([])
        node = node[0]
    before = stats.dropped
    assert scrub({"x": Hostile()}) is None
    assert scrub(deep) is None
    assert scrub(float("nan")) is None
    assert stats.dropped == before + 3


def test_a_tool_whose_arguments_cannot_be_redacted_runs_with_its_content_dropped(pipeline: Pipeline):
    class Opaque:
        def __repr__(self) -> str:
            raise ValueError("opaque")

    @tool(capture_content=True, tracer_provider=pipeline.provider)
    def handle(obj: Opaque) -> str:
        return "handled"

    assert handle(Opaque()) == "handled"
    attrs = pipeline.one("execute_tool").attributes
    assert sc.GEN_AI_TOOL_CALL_ARGUMENTS not in attrs and attrs[sc.TOOL_CONTENT_DROPPED] == 1
    assert attrs[sc.GEN_AI_TOOL_CALL_RESULT] == "handled"


@pytest.mark.parametrize(
    "hostile",
    [
        "a-" * 60_000,
        "eyJ-" * 30_000,
        "a://" * 30_000,
        "api_key_" * 15_000,
        "-----BEGIN PRIVATE KEY-----" * 5_000,
        "a.b+c-" * 20_000,
        "Bearer " * 20_000,
    ],
)
def test_hostile_text_built_to_make_the_patterns_backtrack_is_handled(hostile: str):
    """Each of these took the first version of the rules tens of seconds (quadratic rescans); now one pass."""
    out = scrub(hostile)
    assert out is not None and len(out) <= MAX_CONTENT_CHARS + 40


def test_a_secret_inside_a_dashed_or_underscored_key_is_still_found():
    assert "s3cr3t-value" not in redact("my-api-key=s3cr3t-value and session_token: s3cr3t-value")
