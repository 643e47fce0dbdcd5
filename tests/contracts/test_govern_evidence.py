"""Evidence: one redacted ``replay.contract.decision`` span per decision, stored in the dataset beside the
session's other spans; no prompt text; a span whose redaction fails is dropped whole and counted."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import otel_replay
from otel_replay import semconv as sc
from otel_replay.contracts.session import govern
from otel_replay.contracts.store import FileStateStore
from otel_replay.errors import ReplayContractError
from otel_replay.instrumentation import scripted as s
from otel_replay.redaction import redact

from ..test_redaction_corpus import _stored_text
from .govern_support import CHAT_TOOLS, GPT, REFUND_BOT, Spans, close_clients, decisions, openai_client

SECRETS = {
    "e-mail": ("ana.zq01@example.com", "ana.zq01@example.com"),
    "openai key": ("sk-proj-zq02abcdefghijklmnopqrst", "zq02abcdefghijklmnopqrst"),
    "anthropic key": ("sk-ant-api03-zq03abcdefghijklmnop", "zq03abcdefghijklmnop"),
    "bearer": ("Authorization: Bearer zq04bearerTOKENvalue", "zq04bearerTOKENvalue"),
    "pem": ("-----BEGIN PRIVATE KEY-----\nZQ05pemBODY\n-----END PRIVATE KEY-----", "ZQ05pemBODY"),
    "connection url": ("postgres://app:zq06pgpw@db.internal:5432/app", "zq06pgpw"),
    "connection string": ("Server=tcp:db;User Id=sa;Password=zq07ado;Encrypt=true", "zq07ado"),
}
PROMPT = "my private story zq08prompt"


@pytest.mark.parametrize("what", sorted(SECRETS))
def test_each_secret_shape_issue_22_lists_is_redacted_by_the_one_engine(what: str) -> None:
    text, secret = SECRETS[what]
    assert secret not in redact(f"note: {text} end", personal=True)


def test_an_e_mail_address_is_redacted_in_evidence_and_text_that_only_looks_close_is_not() -> None:
    assert redact("write to a.b+c@mail.example.co.uk now", personal=True) == "write to [REDACTED] now"
    assert redact("user1@test and 3 @ 4", personal=True) == "user1@test and 3 @ 4"  # no dotted domain: no address
    hostile = "a" * 100_000 + "@" + "b." * 50_000  # no address (a local part is at most 64): left, in linear time
    assert redact(hostile + " ana@example.com", personal=True) == hostile + " [REDACTED]"
    # elsewhere an address is data the agent acts on (a customer to look up): recordings serve it back as it was
    assert redact("write to a.b+c@mail.example.co.uk now") == "write to a.b+c@mail.example.co.uk now"


def test_decision_spans_reach_the_dataset_redacted_and_never_hold_the_prompt(tmp_path: Path) -> None:
    dataset = tmp_path / "traces"
    telemetry = otel_replay.configure(dataset, service_name="govern", set_global=False)
    arguments = {"customer_email": SECRETS["e-mail"][0], "note": " | ".join(t for t, _ in SECRETS.values())}
    reply = s.chat_completion(None, model=GPT, tool_calls=[("c1", "lookup_customer", arguments)])
    try:
        with s.ScriptedServer([reply]) as server:
            session = govern(
                openai_client(server), REFUND_BOT, session_id="sess-evidence", tracer_provider=telemetry.provider
            )
            session.client.chat.completions.create(
                model=GPT, messages=[{"role": "user", "content": PROMPT}], tools=CHAT_TOOLS
            )
            assert session.flush()
        telemetry.force_flush()
    finally:
        close_clients()
        telemetry.shutdown()
    rows = []
    for path in sorted(dataset.rglob("*.parquet")):
        table = pq.read_table(path)
        rows += table.select([c for c in ("name", "session_id") if c in table.column_names]).to_pylist()
    mine = [row for row in rows if row.get("name") == sc.SPAN_CONTRACT_DECISION]
    assert len(mine) == 1
    assert mine[0]["session_id"] == "sess-evidence"
    stored, _ = _stored_text(dataset)
    assert "lookup_customer" in stored and "[REDACTED]" in stored
    for what, (_, secret) in SECRETS.items():
        assert secret not in stored, what
    assert "zq08prompt" not in stored


def test_a_decision_span_lists_the_calls_failures_narrowing_phases_and_digest(spans: Spans) -> None:
    reply = s.chat_completion(None, model=GPT, tool_calls=[("c1", "lookup_customer", {"customer_email": "bad"})])
    with s.ScriptedServer([reply]) as server:
        session = govern(openai_client(server), REFUND_BOT, gate="strip_blocked", tracer_provider=spans.provider)
        session.client.chat.completions.create(model=GPT, messages=[{"role": "user", "content": "x"}], tools=CHAT_TOOLS)
    (span,) = decisions(spans)
    assert span[sc.CONTRACT_OUTCOME] == "text_only"
    assert span[sc.CONTRACT_STEP] == 1
    assert span[sc.CONTRACT_PHASE_BEFORE] == "triage" and span[sc.CONTRACT_PHASE_AFTER] == "triage"
    assert span[sc.CONTRACT_DIGEST] == session.contracts.digest
    assert span[sc.CONTRACT_AGENT] == "refund-support-bot"
    assert span[sc.CONTRACT_TOOLS] == [
        {"call_id": "c1", "name": "lookup_customer", "allowed": False, "arguments": '{"customer_email":"bad"}'}
    ]
    (failure,) = span[sc.CONTRACT_FAILURES]
    assert failure["rule"] == "argument_invariant" and failure["path"] == "$.customer_email"
    assert (
        failure["source"].startswith(str(REFUND_BOT / "lookup_customer.yaml"))
        or "lookup_customer.yaml" in failure["source"]
    )
    assert span[sc.CONTRACT_NARROWED] == ["check_eligibility", "issue_refund"]


def test_a_span_whose_redaction_fails_is_dropped_whole_counted_and_the_call_still_gets_its_verdict(
    spans: Spans,
) -> None:
    # Nested 600 deep: the JSON decoder reads it, the redaction walk runs out of stack on it.
    deep = "[" * 600 + "]" * 600
    arguments = '{"customer_email": "ana@example.com", "x": ' + deep + "}"
    reply = s.chat_completion(None, model=GPT, tool_calls=[("c1", "lookup_customer", arguments)])
    events: list[dict[str, object]] = []
    with s.ScriptedServer([reply]) as server:
        session = govern(openai_client(server), REFUND_BOT, diagnostics=events.append, tracer_provider=spans.provider)
        response = session.client.chat.completions.create(
            model=GPT, messages=[{"role": "user", "content": "x"}], tools=CHAT_TOOLS
        )
    assert response.choices[0].message.tool_calls[0].id == "c1"  # allowed: the verdict does not need the span
    assert decisions(spans) == []
    health = session.get_health()
    assert health["evidence_dropped"] == 1 and health["evidence_spans"] == 0
    assert health["status"] == "degraded"
    assert [e["event"] for e in events] == ["evidence_dropped"]


def test_capture_level_none_writes_no_decision_span(spans: Spans) -> None:
    with s.ScriptedServer([s.chat_completion("hi", model=GPT)]) as server:
        session = govern(openai_client(server), REFUND_BOT, capture_level="none", tracer_provider=spans.provider)
        session.client.chat.completions.create(model=GPT, messages=[{"role": "user", "content": "x"}])
    assert decisions(spans) == []
    assert session.get_state()["total_step_count"] == 1


def test_get_state_never_shows_the_principal_or_the_recorded_output_values(spans: Spans) -> None:
    with s.ScriptedServer([]) as server:
        session = govern(
            openai_client(server),
            REFUND_BOT,
            principal={"role": "admin", "secret": "zq09principal"},
            tracer_provider=spans.provider,
        )
        session.governor.observe("check_eligibility", {"eligible": True, "email": "zq10@example.com"})
        state = session.get_state()
    text = json.dumps(state)
    assert state["principal"] is None
    assert "zq09principal" not in text and "zq10@example.com" not in text
    assert "check_eligibility" in state["satisfied_preconditions"]


def test_a_secret_the_model_puts_in_a_tool_name_or_call_id_is_stored_nowhere(tmp_path: Path) -> None:
    dataset = tmp_path / "traces"
    telemetry = otel_replay.configure(dataset, service_name="govern", set_global=False)
    key, key_secret = SECRETS["openai key"]
    mail, mail_secret = SECRETS["e-mail"]
    reply = s.chat_completion(None, model=GPT, tool_calls=[(mail, key, {"x": 1})])
    try:
        with s.ScriptedServer([reply]) as server:
            session = govern(
                openai_client(server),
                REFUND_BOT,
                store=FileStateStore.for_dataset(dataset),
                tracer_provider=telemetry.provider,
            )
            with pytest.raises(ReplayContractError) as caught:
                session.client.chat.completions.create(model=GPT, messages=[{"role": "user", "content": "x"}])
            assert session.flush()
            state = json.dumps(session.get_state())
            session.governor.store.close()
        telemetry.force_flush()
    finally:
        close_clients()
        telemetry.shutdown()
    stored, files = _stored_text(dataset)
    assert any(path.suffix == ".parquet" for path in files) and any("sessions" in path.name for path in files)
    for secret in (key_secret, mail_secret):
        assert secret not in stored
        assert secret not in str(caught.value) and secret not in state
