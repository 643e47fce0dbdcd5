"""The tool decorator, dotted-path wrapping, and gated tools that commit through the ActionGate rail."""

from __future__ import annotations

import asyncio
import enum
import inspect
import json

import openai
import pytest
from opentelemetry.trace import SpanKind, StatusCode

from otel_replay import Action, ActionGate, FixAction, ReferenceLedger, replay
from otel_replay import semconv as sc
from otel_replay.capture.recorder import get_recorder
from otel_replay.errors import CaptureError
from otel_replay.instrumentation import scripted as s
from otel_replay.instrumentation import tool, unwrap_tool, wrap_tool
from tests._support import budget_policy, snapshot

from .conftest import Pipeline


def test_tool_span_names_the_tool_and_keeps_content_out_by_default(pipeline: Pipeline):
    @tool(side_effect="read", tracer_provider=pipeline.provider)
    def get_rate(currency: str, amount: float = 1.0) -> float:
        """Look up an exchange rate.

        More text that is not the description.
        """
        return 1.1 * amount

    assert get_rate("EUR", amount=2) == pytest.approx(2.2)
    assert get_rate.__name__ == "get_rate" and "exchange rate" in (get_rate.__doc__ or "")
    span = pipeline.one("execute_tool")
    attrs = span.attributes
    assert span.name == "execute_tool get_rate" and span.kind is SpanKind.INTERNAL
    assert attrs[sc.GEN_AI_OPERATION_NAME] == "execute_tool" and attrs[sc.GEN_AI_TOOL_NAME] == "get_rate"
    assert attrs[sc.GEN_AI_TOOL_TYPE] == "function" and attrs[sc.KIND] == sc.KIND_TOOL
    assert attrs[sc.GEN_AI_TOOL_DESCRIPTION] == "Look up an exchange rate."
    assert attrs[sc.TOOL_SIDE_EFFECT] == "read"
    assert sc.GEN_AI_TOOL_CALL_ARGUMENTS not in attrs and sc.GEN_AI_TOOL_CALL_RESULT not in attrs


def test_captured_arguments_and_results_are_redacted(pipeline: Pipeline):
    @tool("connect", capture_content=True, tracer_provider=pipeline.provider)
    def connect(dsn: str, token: str) -> dict:
        return {"ok": True, "echo": token}

    connect("mysql://root:s3cr3tpw@db/app", token="Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.abcdefghijk")
    attrs = pipeline.one("execute_tool").attributes
    text = attrs[sc.GEN_AI_TOOL_CALL_ARGUMENTS] + attrs[sc.GEN_AI_TOOL_CALL_RESULT]
    assert "s3cr3tpw" not in text and "eyJzdWIiOiIxMjM0NTY3ODkwIn0" not in text
    assert json.loads(attrs[sc.GEN_AI_TOOL_CALL_RESULT])["ok"] is True


def test_an_exception_marks_the_tool_span_and_is_reraised_unchanged(pipeline: Pipeline):
    boom = LookupError("no such account")

    @tool(tracer_provider=pipeline.provider)
    def fetch(account: str) -> None:
        raise boom

    with pytest.raises(LookupError) as caught:
        fetch("acc-1")
    assert caught.value is boom
    span = pipeline.one("execute_tool")
    assert span.status.status_code is StatusCode.ERROR and span.attributes[sc.ERROR_TYPE] == "LookupError"


def test_async_tool(pipeline: Pipeline):
    @tool(tracer_provider=pipeline.provider)
    async def slow_lookup(key: str) -> str:
        await asyncio.sleep(0)
        return key.upper()

    assert inspect.iscoroutinefunction(slow_lookup)
    assert asyncio.run(slow_lookup("k")) == "K"
    assert pipeline.one("execute_tool").attributes[sc.GEN_AI_TOOL_NAME] == "slow_lookup"


def test_the_models_tool_call_is_linked_to_the_tool_execution(server, instrumented: Pipeline):
    @tool(tracer_provider=instrumented.provider)
    def get_rate(currency: str) -> float:
        return 1.1

    server.enqueue(s.chat_completion(None, tool_calls=[("call_eur", "get_rate", {"currency": "EUR"})]))
    with openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0) as c:
        reply = c.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "rate?"}])
    call = reply.choices[0].message.tool_calls[0]
    get_rate(**json.loads(call.function.arguments))
    get_rate("EUR")  # a second run answers no model call: it takes no call id
    model = instrumented.one("chat")
    first, second = instrumented.spans("execute_tool")
    assert first.attributes[sc.GEN_AI_TOOL_CALL_ID] == "call_eur"
    assert [link.context.span_id for link in first.links] == [model.context.span_id]
    assert sc.GEN_AI_TOOL_CALL_ID not in second.attributes and not second.links


class Unit(enum.Enum):
    C = "celsius"
    F = "fahrenheit"


def test_a_call_as_an_agent_framework_validated_it_is_linked_to_the_models_call(server, instrumented: Pipeline):
    @tool(tracer_provider=instrumented.provider)
    def forecast(city: str, days: int = 1, unit: Unit = Unit.C, hours: list[int] | None = None) -> str:
        return city

    asked = [
        ("call_default", "forecast", {"city": "Oslo"}),
        ("call_convert", "forecast", {"city": "Rome", "days": "2", "unit": "fahrenheit", "hours": ["6", 12.0]}),
        ("call_exact", "forecast", {"city": "Bern", "days": 3}),
    ]
    server.enqueue(s.chat_completion(None, tool_calls=asked))
    with openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0) as c:
        c.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "forecast?"}])
    # as LangGraph's ToolNode and pydantic-ai call a tool: the model's arguments validated, defaults filled in
    forecast(city="Rome", days=2, unit=Unit.F, hours=[6, 12])
    forecast(city="Oslo", days=1, unit=Unit.C, hours=None)
    forecast(city="Bern", days=4, unit=Unit.C, hours=None)  # not the model's value
    forecast(city="Bern", days=3, unit=Unit.F, hours=None)  # a parameter the model left out, not at its default
    forecast(city="Bern", days=True)  # a flag is not a number
    deep: list = []
    for _ in range(5_000):
        deep = [deep]
    forecast(city="Bern", days=3, hours=deep)  # nested past any recursion limit: compared, never raised
    forecast("Bern", days=3)
    ids = [span.attributes.get(sc.GEN_AI_TOOL_CALL_ID) for span in instrumented.spans("execute_tool")]
    assert ids == ["call_convert", "call_default", None, None, None, None, "call_exact"]


def test_gated_tool_commits_through_the_rail_as_one_decision(pipeline: Pipeline):
    ledger = ReferenceLedger(balance=10_000)
    gate = ActionGate(ledger)

    @tool(side_effect="financial", gate=gate, snapshot=snapshot, tracer_provider=pipeline.provider)
    def pay_vendor(recipient: str, amount: float) -> Action:
        return Action("vendor_payment", {"recipient": recipient}, cost=amount)

    receipt = pay_vendor("acme-supplies", 4200)
    assert ledger.balance == 5_800 and receipt.amount == 4200
    decision = pipeline.one("replay.decision")
    record_id = decision.attributes[sc.RECORD_ID]
    tool_span = pipeline.one("execute_tool")
    act = pipeline.one("replay.act")
    intent, gate_span = pipeline.spans("replay.gate")  # the intent (before the rail), then the commit record
    assert intent.attributes[sc.GATE_EXECUTED] == "intent" and intent.attributes[sc.GATE_DECISION_ID] == record_id
    assert tool_span.parent.span_id == decision.context.span_id
    assert tool_span.attributes[sc.RECORD_ID] == record_id and act.attributes[sc.RECORD_ID] == record_id
    assert tool_span.attributes[sc.TOOL_SIDE_EFFECT] == "financial"
    assert gate_span.attributes[sc.GATE_DECISION_ID] == record_id
    assert gate_span.attributes[sc.GATE_EXECUTED] == "committed"
    # the decision record is sealed with the action, so the policy replay applies to the tool call
    record = get_recorder().sink.get(record_id)
    assert record.action.cost == 4200 and record.decision_type == "pay_vendor"
    verdict = replay(
        record, live_state={"budget_remaining": 3_000, "allow_list": ["acme-supplies"]}, policy=budget_policy
    )
    assert verdict.fix is FixAction.ROLLBACK
    outcome = gate.enforce_post_commit(verdict, receipt=receipt)
    assert outcome.executed == "rolled_back" and ledger.balance == 10_000


def test_a_gated_tool_that_returns_no_action_commits_nothing(pipeline: Pipeline):
    ledger = ReferenceLedger(balance=100)

    @tool(gate=ActionGate(ledger), tracer_provider=pipeline.provider)
    def pay(amount: float) -> dict:
        return {"amount": amount}

    with pytest.raises(CaptureError, match="pay' is gated: it must return the Action to commit, got dict"):
        pay(5)
    assert ledger.balance == 100 and ledger.entries == []
    decision = pipeline.one("replay.decision")
    assert decision.status.status_code is StatusCode.ERROR
    assert pipeline.spans("replay.gate") == []


def test_a_rail_refusal_is_recorded_and_reraised(pipeline: Pipeline):
    gate = ActionGate(ReferenceLedger(balance=10))

    @tool(side_effect="financial", gate=gate, tracer_provider=pipeline.provider)
    def pay(amount: float) -> Action:
        return Action("vendor_payment", {"recipient": "x"}, cost=amount)

    with pytest.raises(ValueError, match="exceeds the balance"):
        pay(50)
    assert [g.attributes[sc.GATE_EXECUTED] for g in pipeline.spans("replay.gate")] == ["intent", "commit_failed"]
    assert pipeline.one("execute_tool").status.status_code is StatusCode.ERROR


def test_tool_options_are_checked_when_declared():
    with pytest.raises(CaptureError, match="gate must be an ActionGate"):
        tool(gate="not a gate")(lambda: None)
    with pytest.raises(CaptureError, match="snapshot must be a DependencySnapshot"):
        tool(snapshot={"budget": 1})(lambda: None)


def test_wrap_tool_by_dotted_path_and_unwrap_restores_the_original(pipeline: Pipeline, tmp_path, monkeypatch):
    (tmp_path / "agent_tools_mod.py").write_text(
        "class Payments:\n"
        "    def refund(self, order: str) -> str:\n"
        "        return 'refunded ' + order\n"
        "def lookup(key):\n"
        "    return key * 2\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import agent_tools_mod as mod

    original_lookup, original_refund = mod.lookup, mod.Payments.__dict__["refund"]
    wrap_tool("agent_tools_mod:lookup", tracer_provider=pipeline.provider)
    wrap_tool("agent_tools_mod:lookup", tracer_provider=pipeline.provider)  # twice: still one wrapper
    wrap_tool("agent_tools_mod.Payments.refund", side_effect="financial", tracer_provider=pipeline.provider)
    try:
        assert mod.lookup("ab") == "abab"
        assert mod.Payments().refund("o-1") == "refunded o-1"
    finally:
        unwrap_tool("agent_tools_mod:lookup")
        unwrap_tool("agent_tools_mod.Payments.refund")
    assert mod.lookup is original_lookup and mod.Payments.__dict__["refund"] is original_refund
    names = sorted(s.name for s in pipeline.spans("execute_tool"))
    assert names == ["execute_tool lookup", "execute_tool refund"]
    mod.lookup("x")
    assert len(pipeline.spans("execute_tool")) == 2


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("nodots", "give a dotted path"),
        ("no_such_module_xyz:fn", "cannot import 'no_such_module_xyz'"),
        ("no_such_module_xyz.fn", "cannot import 'no_such_module_xyz'"),
        ("json:no_such_function", "'no_such_function' is not a callable in json"),
        ("json:Missing.method", "json has no 'Missing'"),
    ],
)
def test_wrap_tool_names_what_is_wrong_with_a_path(path: str, message: str):
    with pytest.raises(CaptureError, match=message):
        wrap_tool(path)


def test_a_decorated_method_records_its_arguments_without_self(pipeline: Pipeline):
    class Desk:
        @tool(capture_content=True, tracer_provider=pipeline.provider)
        def quote(self, pair: str, size: int = 1) -> float:
            return 1.25 * size

    assert Desk().quote("EURUSD") == 1.25
    assert json.loads(pipeline.one("execute_tool").attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS]) == {"pair": "EURUSD"}


def test_a_gated_tool_inside_audit_is_that_decisions_act(pipeline: Pipeline):
    """Inside an audit() block a gated tool acts for the enclosing decision: one decision, one act, one commit."""
    from otel_replay import audit

    ledger = ReferenceLedger(balance=10_000)
    gate = ActionGate(ledger)

    @tool(side_effect="financial", gate=gate, tracer_provider=pipeline.provider)
    def pay_vendor(recipient: str, amount: float) -> Action:
        return Action("vendor_payment", {"recipient": recipient}, cost=amount)

    with audit("vendor_payment", snapshot=snapshot()) as d:
        d.read(invoice="INV-1")
        receipt = pay_vendor("acme-supplies", 4200)
        assert d.acted
        with pytest.raises(CaptureError, match="already called"):
            d.act(Action("vendor_payment", {"recipient": "x"}, cost=1))
        # a second gated call cannot be this decision's action too: it gets a decision of its own
        pay_vendor("acme-supplies", 100)
    decisions = pipeline.spans("replay.decision")
    assert len(decisions) == 2 and ledger.balance == 5_700
    (decision,) = [s for s in decisions if s.attributes[sc.RECORD_ID] == d.record_id]
    assert decision.attributes[sc.RECORD_ID] == d.record_id
    assert d.record_id in {g.attributes[sc.GATE_DECISION_ID] for g in pipeline.spans("replay.gate")}
    assert d.record_id in {a.attributes[sc.RECORD_ID] for a in pipeline.spans("replay.act")}
    assert receipt.amount == 4200
    record = get_recorder().sink.get(d.record_id)
    assert record.action.cost == 4200 and record.inputs == {"invoice": "INV-1"}
