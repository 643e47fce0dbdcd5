"""The refund bot, governed by contracts: the model may only do what the workflow allows, when it allows it.

A support agent on the real ``openai`` client (against a local scripted
OpenAI-compatible server, so it runs offline) refunds an order in three
steps: look the customer up, check the order is eligible, refund it. The
contracts in ``contracts/`` say so: each tool is offered only in its phase,
the refund needs an eligibility check that said yes, its amount is bounded,
and it can happen once. The scripted model then asks for a second refund:
``govern()`` refuses it before anything runs. The refund itself commits
through an ``ActionGate`` (it is a financial tool), so replay can later
compensate it.

Everything lands in the dataset: the model calls (with their tool calls),
the tool spans, the gate's records and one ``replay.contract.decision`` span
per enforcement decision. The script ends by reading the decisions back with
SQL and by backtesting the recorded session against the contracts offline:
the backtest blocks the same call the live session did.

Run: python examples/refund_bot/refund_bot.py [DATASET_DIR]
Then: otel-replay contracts check --contracts examples/refund_bot/contracts --dataset DATASET_DIR
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import openai

import otel_replay
import otel_replay.instrumentation as instrumentation
from otel_replay import Action, ActionGate, ReferenceLedger
from otel_replay.contracts.backtest import backtest_dataset
from otel_replay.contracts.loader import load_contracts
from otel_replay.contracts.session import govern
from otel_replay.errors import ReplayContractError
from otel_replay.gate import Receipt
from otel_replay.instrumentation import scripted

CONTRACTS = Path(__file__).resolve().parent / "contracts"
SESSION_ID = "refund-0001"
MODEL = "gpt-4o-mini"
REFUND = {"customer_id": "C42", "amount": 35.0, "currency": "USD"}


def _function(name: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": properties}}}


TOOLS = [
    _function("lookup_customer", {"customer_email": {"type": "string"}}),
    _function("check_eligibility", {"order_id": {"type": "string"}}),
    _function("issue_refund", {"customer_id": {"type": "string"}, "amount": {"type": "number"}, "currency": {}}),
]


def model_script() -> list[scripted.Reply]:
    """What the scripted model answers, in order: the workflow, one refund too many, then the reply."""
    return [
        scripted.chat_completion(
            None, tool_calls=[("call_1", "lookup_customer", {"customer_email": "ana@example.com"})]
        ),
        scripted.chat_completion(None, tool_calls=[("call_2", "check_eligibility", {"order_id": "ORD-1042"})]),
        scripted.chat_completion(None, tool_calls=[("call_3", "issue_refund", REFUND)]),
        scripted.chat_completion(None, tool_calls=[("call_4", "issue_refund", REFUND)]),  # again: refused
        scripted.chat_completion("Your refund of 35.00 USD is on its way."),
    ]


def run_agent(dataset: str) -> None:
    """The governed agent loop: ask the model, run the tool calls it is allowed, until it answers in text."""
    ledger = ReferenceLedger(balance=1_000)
    gate = ActionGate(ledger, dataset=dataset)

    def lookup_customer(customer_email: str) -> dict[str, Any]:
        """Find the customer by e-mail."""
        return {"customer_id": "C42", "name": "Ana"}

    def check_eligibility(order_id: str) -> dict[str, Any]:
        """Whether the order can be refunded."""
        return {"eligible": True, "reason": "delivered"}

    @instrumentation.tool(side_effect="financial", gate=gate)
    def issue_refund(customer_id: str, amount: float, currency: str) -> Action:
        """Refund the customer: the rail moves the money, this returns what to move."""
        return Action("refund", {"customer_id": customer_id, "currency": currency}, cost=amount)

    executors = {
        "lookup_customer": lookup_customer,
        "check_eligibility": check_eligibility,
        "issue_refund": issue_refund,
    }
    with scripted.ScriptedServer(model_script()) as server, otel_replay.session(SESSION_ID, agent_id="refund-bot"):
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-example-not-a-real-key", max_retries=0)
        session = govern(client, CONTRACTS, session_id=SESSION_ID, tools=executors)
        messages: list[Any] = [{"role": "user", "content": "Please refund order ORD-1042, I am ana@example.com."}]
        for _ in range(8):
            try:
                reply = session.client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
            except ReplayContractError as refused:
                tools = ", ".join(sorted({str(f.tool) for f in refused.failures}))
                rules = ", ".join(sorted({f.rule for f in refused.failures}))
                print(f"blocked before it ran: {tools} ({rules})")
                messages.append({"role": "user", "content": "That call was refused by policy; answer the customer."})
                continue
            message = reply.choices[0].message
            if not message.tool_calls:
                print(f"agent: {message.content}")
                break
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                run = session.tools[call.function.name](json.loads(call.function.arguments))
                result = run.result.to_json() if isinstance(run.result, Receipt) else run.result
                print(f"ran {call.function.name}: passed={run.constraint_verdict.passed}")
                messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result, default=str)})
        offered = [[t["function"]["name"] for t in r["json"].get("tools", [])] for r in server.requests]
        print(f"tools the model was shown, per request: {offered}")
        state = session.get_state()
        print(
            f"phase {state['current_phase']}; calls {state['tool_call_counts']}; forbidden {state['forbidden_tools']}"
        )
        print(f"ledger balance {ledger.balance:,.2f} (one refund committed through the gate)")
        session.restore()
        client.close()


def main(dataset: str) -> int:
    """Run the governed agent into ``dataset``, then read its evidence and backtest it."""
    telemetry = otel_replay.configure(dataset, service_name="refund-bot")
    instrumentation.instrument(capture_content=True)  # model calls and their tool calls become spans
    try:
        run_agent(dataset)
    finally:
        telemetry.shutdown()

    with otel_replay.open(dataset) as store:
        decisions = store.rows(
            "SELECT step, outcome, phase_after FROM contract_decisions WHERE session_id = ? ORDER BY step, recorded_at",
            [SESSION_ID],
        )
        print("evidence: " + ", ".join(f"step {d['step']} {d['outcome']}" for d in decisions))
        report = backtest_dataset(load_contracts(CONTRACTS), store, session_id=SESSION_ID)
    for session in report.sessions:
        for call in session.blocked:
            rules = ", ".join(sorted({f.rule for f in call.failures}))
            print(f"backtest: step {call.step} {call.tool} would have been blocked ({rules})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="refund-bot-")))
