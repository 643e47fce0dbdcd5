"""An instrumented tool-calling agent: one line of setup, real ``openai`` client, a gated payment tool.

The agent asks a model (the real ``openai`` client against a local scripted
OpenAI-compatible server, so it runs offline) what to do with an invoice. The
model calls a read tool, then the payment tool; the payment tool is declared
with a gate, so the payment commits through the rail as a sealed decision.
Later the budget drops: the payment decision is read back from Parquet,
replayed under the live state, and the gate rolls it back.

Run: python examples/example_instrumented_agent.py [DATASET_DIR]
"""

from __future__ import annotations

import json
import sys
import tempfile

import openai

import otel_replay
import otel_replay.instrumentation as instrumentation
from otel_replay import Action, ActionGate, DependencySnapshot, FixAction, ReferenceLedger, replay
from otel_replay.instrumentation import scripted

BUDGET = {"budget_remaining": 10_000, "allow_list": ["acme-supplies"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_invoice", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "pay_vendor", "parameters": {"type": "object"}}},
]


def budget_policy(state, action):
    """Justified while the recipient is allow-listed and the payment fits the budget."""
    if action.arguments["recipient"] not in state.get("allow_list", []):
        return False, "Recipient not on the allow-list."
    if action.cost > state.get("budget_remaining", 0):
        return False, "Amount exceeds the remaining budget."
    return True, "Within budget and allow-list."


def model_script() -> list[scripted.Reply]:
    """What the scripted model answers, in order: read the invoice, pay it, report."""
    return [
        scripted.chat_completion(None, tool_calls=[("call_1", "get_invoice", {"invoice_id": "INV-4471"})]),
        scripted.chat_completion(
            None, tool_calls=[("call_2", "pay_vendor", {"recipient": "acme-supplies", "amount": 4200})]
        ),
        scripted.chat_stream(["Paid INV-4471 ", "(4,200 to acme-supplies)."]),
    ]


def main(dataset: str) -> int:
    telemetry = otel_replay.configure(dataset, service_name="payables")
    instrumentation.instrument()  # the one line: model calls and thread pools are now spans
    ledger = ReferenceLedger(balance=10_000)
    gate = ActionGate(ledger, dataset=dataset)

    @instrumentation.tool(side_effect="read")
    def get_invoice(invoice_id: str) -> dict:
        """Fetch an invoice from the payables system."""
        return {"invoice_id": invoice_id, "vendor": "acme-supplies", "amount": 4200}

    @instrumentation.tool(side_effect="financial", gate=gate, snapshot=lambda: DependencySnapshot(BUDGET, "v7"))
    def pay_vendor(recipient: str, amount: float) -> Action:
        """Pay a vendor: the rail moves the money, this returns what to move."""
        return Action("vendor_payment", {"recipient": recipient}, cost=amount)

    tools = {"get_invoice": get_invoice, "pay_vendor": pay_vendor}
    receipts = []
    with scripted.ScriptedServer(model_script()) as server, otel_replay.session(agent_id="payables-agent"):
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-example-not-a-real-key", max_retries=0)
        messages: list[dict] = [{"role": "user", "content": "Settle invoice INV-4471."}]
        for _ in range(2):  # model -> tool calls -> model ...
            reply = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls or ():
                result = tools[call.function.name](**json.loads(call.function.arguments))
                if call.function.name == "pay_vendor":
                    receipts.append(result)
                    result = result.to_json()
                messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
        stream = client.chat.completions.create(model="gpt-4o-mini", messages=messages, stream=True)
        print("agent:", "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices))
        client.close()
    print(f"paid; balance {ledger.balance:,.0f}")
    telemetry.force_flush()

    with otel_replay.open(dataset) as store:
        calls = store.rows(
            "SELECT model, input_tokens, output_tokens, tool_calls, streamed FROM model_calls "
            "WHERE provider = 'openai' ORDER BY start_time"
        )
        for row in calls:
            print(
                f"model call: {row['model']} tokens {row['input_tokens']}/{row['output_tokens']} "
                f"streamed={row['streamed']} tool_calls={row['tool_calls']}"
            )
        [paid] = store.rows("SELECT record_id FROM decisions WHERE decision_type = 'pay_vendor'")
        acts = store.rows(
            "SELECT source, action_type, tool_call_id FROM acts WHERE record_id = ? ORDER BY source",
            [paid["record_id"]],
        )
        print("payment decision acts:", [(a["source"], a["action_type"], a["tool_call_id"]) for a in acts])
        record = store.record(paid["record_id"])

    live_state = {**BUDGET, "budget_remaining": 3_000}
    verdict = replay(record, live_state=live_state, policy=budget_policy)
    outcome = gate.enforce_post_commit(verdict, receipt=receipts[0])
    print(f"verdict: {verdict.fix.value}; gate: {outcome.executed}; balance {ledger.balance:,.0f}")
    telemetry.shutdown()
    instrumentation.uninstrument()
    ok = len(calls) == 3 and verdict.fix is FixAction.ROLLBACK and ledger.balance == 10_000
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="otel-replay-agent-")))
