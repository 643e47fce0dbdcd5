"""Captured content is redacted before it leaves the process; what cannot be redacted is dropped and counted."""

from __future__ import annotations

import re
import tracemalloc

import pytest

from otel_replay import redaction, settings
from otel_replay import semconv as sc
from otel_replay.errors import ConfigError
from otel_replay.instrumentation import OpenAIInstrumentor, tool
from otel_replay.redaction import MAX_CONTENT_CHARS, REDACTED, SCAN_CHARS, redact, scrub, stats

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



def test_a_huge_value_is_cut_to_its_start_before_it_is_redacted_or_rendered():
    piece = "w" * 1_000
    rows = [{"row": n, "text": piece} for n in range(20_000)]  # 20 MB rendered, a few MB as objects
    value = {"api_key": "sk-proj-" + "K" * 40, "rows": rows, "zz_password": "hunter2", "first": "x" * 200_000}
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        out = scrub(value)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * 1024 * 1024, f"{peak / 2**20:.1f} MiB"  # rendering it whole takes over 20 MB
    assert out is not None and len(out) < MAX_CONTENT_CHARS + 40 and out.endswith("chars cut]")
    assert '"api_key": "[REDACTED]"' in out and "KKKK" not in out and "hunter2" not in out
    assert out.startswith('{"api_key"') and '"rows": [{"row": 0, "text": "www' in out  # the start, as rendered


def test_a_text_in_a_value_is_never_cut_inside_a_secret_that_could_show():
    # the first member fills the budget; the second, rendered first, is kept whole and so redacted whole
    value = {"b": "x" * (SCAN_CHARS - 20), "a": "the key is sk-proj-" + "Q" * 40 + " ok"}
    out = scrub(value)
    assert out is not None and out.startswith('{"a": "the key is [REDACTED] ok"') and "QQQQ" not in out
    assert scrub({"list": [{"n": n} for n in range(5)], "t": ("a", 1)}) == (
        '{"list": [{"n": 0}, {"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}], "t": ["a", 1]}'
    )  # a small value is rendered whole, as it was

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


# --- the one engine (otel_replay.redaction): names by word, more shapes, cards, the user's rules ------------


@pytest.mark.parametrize(
    "name",
    [
        "password", "db_password", "new_password", "DB_PASSWORD", "dbPassword", "db-password", "db.password",
        "clientSecret", "client_secret", "CLIENT-SECRET", "aws_secret_access_key", "AWS_SECRET_ACCESS_KEY",
        "secret_key", "secretKey", "api_secret", "apiKey", "APIKey", "api-key", "x-api-key", "X-Api-Key",
        "Ocp-Apim-Subscription-Key", "X-Goog-Api-Key", "subscriptionKey", "AccountKey", "key", "api_key_value",
        "access_token", "accessToken", "id_token", "X-Auth-Token", "X-Amz-Security-Token", "token",
        "refresh_tokens", "session_id", "sessionId", "SESSION", "session_token", "Cookie", "set-cookie",
        "X-Amz-Signature", "sig", "Authorization", "proxy-authorization", "auth", "auth_header", "credentials",
        "privateKeyPem", "private_key", "passphrase", "db_pass", "cvv", "card_cvc", "mfa_otp", "Pwd",
    ],
)  # fmt: skip
def test_a_secret_name_in_any_case_or_separator_style_is_secret(name: str):
    assert redaction.is_secret_name(name)
    assert "zq-value-9" not in redact(f"{name}=zq-value-9")
    assert redaction.redact_value({name: "zq-value-9"}) == {name: REDACTED}


@pytest.mark.parametrize(
    "name",
    [
        "max_tokens", "input_tokens", "output_tokens", "total_tokens", "prompt_tokens", "completion_tokens",
        "max_completion_tokens", "maxTokens", "tokens", "token_count", "token_limit", "max_token",
        "x-ratelimit-remaining-tokens", "anthropic-ratelimit-input-tokens-remaining", "author", "authors",
        "keyboard", "monkey", "turkey", "keys_pressed", "primary_key", "sort_key", "idempotency_key",
        "Idempotency-Key", "key_id", "access_key_id", "auth_type", "session_name", "passenger", "bypass",
        "compass", "signal", "design", "tokenizer", "secretary", "model", "", "123",
    ],
)  # fmt: skip
def test_a_name_that_only_contains_a_secret_word_is_not_secret(name: str):
    assert not redaction.is_secret_name(name)
    assert redact(f"{name}=zq-value-9") == f"{name}=zq-value-9"


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ('{"clientSecret": "zq-cs-1"}', "zq-cs-1"),
        ("{'secret_key': 'zq sk 2'}", "zq sk 2"),
        ('{\\"db_password\\":\\"zq pw 3\\"}', "zq pw 3"),
        ("Ocp-Apim-Subscription-Key: zq-ocp-4", "zq-ocp-4"),
        ("postgres://app:zq-pg-5@db.internal:5432/app", "zq-pg-5"),
        ("mongodb+srv://app:zq-mongo-6@cluster0.example.net/db", "zq-mongo-6"),
        ("redis://:zq-redis-7@cache:6379/0", "zq-redis-7"),
        ("Server=tcp:db,1433;Database=app;User Id=sa;Password=zq-ado-8;Encrypt=true", "zq-ado-8"),
        ("Driver={ODBC Driver 18};Server=db;Uid=sa;Pwd=zq-odbc-9;", "zq-odbc-9"),
        ("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=zqAzure10+/=;EndpointSuffix=x", "zqAzure10"),
        ("stripe sk_live_" + "z" * 24, "z" * 24),
        ("github_pat_" + "Z" * 40, "Z" * 40),
        ("gitlab glpat-" + "q" * 20, "q" * 20),
        ("slack xapp-1-A0-" + "9" * 12, "9" * 12),
        ("hf hf_" + "H" * 34, "H" * 34),
        ("-----BEGIN PGP PRIVATE KEY BLOCK-----\nzqpgpbody\n-----END PGP PRIVATE KEY BLOCK-----", "zqpgpbody"),
        ("card 4111 1111 1111 1111 charged", "1111 1111 1111"),
        ("card 4111-1111-1111-1111 charged", "1111-1111-1111"),
        ("card 5555555555554444 charged", "5555555555554444"),
        ("amex 378282246310005.", "378282246310005"),
        ("https://api.example/v1?q=x&api_key=zq-url-11&page=2", "zq-url-11"),
        ("password: zq-colon-12", "zq-colon-12"),
        ('{"token": "a\\"b zq-escaped-13"}', "zq-escaped-13"),
    ],
)
def test_each_shape_the_one_engine_knows_is_redacted(text: str, secret: str):
    out = redact(text)
    assert secret not in out and REDACTED in out, out


@pytest.mark.parametrize(
    "text",
    [
        "order 12345678901234567890 shipped",  # 20 digits: no card is that long
        "card 4111 1111 1111 1112 declined",  # fails Luhn
        "epoch ms 1732800000000 and 1732800000007",  # 13 digits starting with 1: not a card range
        "phone +1 555 123 4567, invoice INV-2024-000123",
        '{"max_tokens": 512, "input_tokens": 40, "author": "ann", "monkey": "see"}',
    ],
)
def test_numbers_and_words_that_are_not_secrets_are_left_alone(text: str):
    assert redact(text) == text


def test_null_and_booleans_under_a_secret_name_are_kept_and_the_text_left_as_it_was():
    text = '{"auth": false, "token": null, "max_tokens": 5}'
    assert redaction.redact_json_text(text) == text


def test_a_card_number_held_as_a_json_number_is_redacted():
    assert redaction.redact_json_text('{"amount": 12, "pan": 4111111111111111}') == '{"amount":12,"pan":"[REDACTED]"}'


def test_a_secret_named_header_is_redacted_whole_and_rate_limit_counts_are_kept():
    out = dict(
        redaction.redact_headers(
            [("Ocp-Apim-Subscription-Key", "zq-ocp"), ("x-ratelimit-remaining-tokens", "999"), ("X-Custom", "x")]
        )
    )
    assert out == {"Ocp-Apim-Subscription-Key": REDACTED, "x-ratelimit-remaining-tokens": "999", "X-Custom": "x"}


def test_names_and_patterns_added_by_the_user_are_redacted_everywhere():
    try:
        redaction.add_secret_names("member_ref", "ssn")
        redaction.add_secret_patterns(r"ACCT-[0-9]{6}", re.compile(r"zq-internal-\w+"))
        assert redaction.is_secret_name("memberRef") and redaction.is_secret_name("customer_SSN")
        assert not redaction.is_secret_name("member")
        out = redact("memberRef=zq-a1 SSN: zq-a2 see ACCT-123456 and zq-internal-x9")
        assert not any(s in out for s in ("zq-a1", "zq-a2", "123456", "x9")), out
        assert scrub({"old-member-ref": "zq-a3", "n": 1}) == '{"n": 1, "old-member-ref": "[REDACTED]"}'
    finally:
        redaction.reset_secret_rules()
    assert redact("memberRef=zq-a1") == "memberRef=zq-a1"


def test_names_and_patterns_from_the_environment_are_redacted(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(settings.REDACT_NAMES, "member_ref, ssn")
    monkeypatch.setenv(settings.REDACT_PATTERNS, "ACCT-[0-9]{6}\nINV-[A-Z]{4}")
    try:
        redaction.check_settings()  # what configure(), a recording and the instrumentors do at set-up
        out = redact("member-ref=zq-e1 ssn=zq-e2 ACCT-654321 INV-ABCD")
        assert not any(s in out for s in ("zq-e1", "zq-e2", "654321", "ABCD")), out
    finally:
        monkeypatch.delenv(settings.REDACT_NAMES)
        monkeypatch.delenv(settings.REDACT_PATTERNS)
        redaction.check_settings()
    assert redact("ssn=zq-e2") == "ssn=zq-e2"


def test_an_invalid_pattern_in_the_environment_is_a_one_line_error_naming_the_variable_and_pattern(
    monkeypatch: pytest.MonkeyPatch, pipeline: Pipeline
):
    monkeypatch.setenv(settings.REDACT_PATTERNS, "ok-[0-9]+\nbad-(unclosed")
    with pytest.raises(ConfigError) as raised:
        redaction.check_settings()
    message = str(raised.value)
    assert "OTEL_REPLAY_REDACT_PATTERNS" in message and "'bad-(unclosed'" in message and "\n" not in message
    with pytest.raises(ConfigError, match="OTEL_REPLAY_REDACT_PATTERNS"):
        OpenAIInstrumentor().instrument(tracer_provider=pipeline.provider)
    with pytest.raises(ConfigError, match="add_secret_patterns: '\\(' is not a valid"):
        redaction.add_secret_patterns("(")
    with pytest.raises(ConfigError, match="matches the empty text"):
        redaction.add_secret_patterns("x*")


@pytest.mark.parametrize(
    "hostile",
    [
        "a" * 1_000_000,
        "1" * 1_000_000,
        "4 " * 500_000,
        "1-" * 500_000,
        "password=" * 110_000,
        "a=" * 500_000,
        '"k": "' * 160_000,
        "aB" * 500_000,
        "x://a:" * 160_000,
        "-----BEGIN RSA PRIVATE KEY-----" * 32_000,
        '\\"secret\\":\\"' * 70_000,
    ],
)
def test_a_hostile_megabyte_is_redacted_in_one_pass(hostile: str):
    """Each built to make a rule rescan; completing (the suite's timeout) is the assertion, not a timing."""
    assert isinstance(redact(hostile), str)
    assert isinstance(redaction.redact_json_text(hostile), str)
