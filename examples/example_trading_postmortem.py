"""Seed 002's post-mortem: two agents size a trade 40% larger than normal; rebuild why.

A signal-evaluation agent and a position-sizing agent share one correlation id,
exchange messages through the audit log (one agent's clock runs 2 s fast), and
record reasoning traces. After the trade goes wrong we record the outcome, then
rebuild the trade chain and the session chain from the Parquet dataset.

Run: python examples/example_trading_postmortem.py [DATASET_DIR]
"""

from __future__ import annotations

import contextvars
import sys
import tempfile
import threading
from datetime import UTC, datetime, timedelta

import otel_replay
from otel_replay import AuditLog, DecisionTracer, ReplayBuilder, correlation, session

T0 = datetime(2026, 3, 2, 14, 30, tzinfo=UTC)


def evaluation_agent(tracer: DecisionTracer, log: AuditLog, signal_id: str) -> str:
    log.append(
        "signal_received",
        source_agent="signal-router",
        target_agent="foresight",
        payload={"signal_id": signal_id},
        created_at=T0,
    )
    decision = tracer.decision(
        agent_id="foresight",
        decision_type="signal_evaluation",
        rationale=f"Signal {signal_id} evaluated: high confidence bullish bias on ES",
        confidence=0.74,
        inputs={"signal_id": signal_id, "market": "ES", "factors": 5},
    )
    log.append(
        "evaluation_sent",
        source_agent="foresight",
        target_agent="sizer",
        payload={"bias": "bullish", "confidence": 0.74},
        created_at=T0 + timedelta(seconds=1),
    )
    return decision


def sizing_agent(tracer: DecisionTracer, log: AuditLog) -> str:
    # This agent's clock runs 2 s fast, and it writes its entries out of order.
    skew = timedelta(seconds=2)
    log.append(
        "vp_approval_requested",
        source_agent="sizer",
        target_agent="vp",
        payload={"multiplier": 1.4},
        created_at=T0 + timedelta(seconds=3) + skew,
    )
    decision = tracer.decision(
        agent_id="sizer",
        decision_type="position_sizing",
        rationale="Sizing at 1.4x normal based on elevated conviction from 3 confirming signals",
        confidence=0.68,
        inputs={"base_size": 100, "conviction_multiplier": 1.4},
    )
    log.append(
        "sizing_started",
        source_agent="sizer",
        target_agent=None,
        payload={"base_size": 100},
        created_at=T0 + timedelta(seconds=1.5) + skew,
    )
    return decision


def main(dataset: str) -> int:
    telemetry = otel_replay.configure(dataset, service_name="trading-desk")
    tracer, log = DecisionTracer(), AuditLog()
    with session(agent_id="desk") as session_id, correlation() as trade_id:
        evaluation = evaluation_agent(tracer, log, "SIG-9912")
        # The sizing agent runs in its own thread; the correlation scope follows
        # because the thread runs in a copy of the context.
        result: dict[str, str] = {}
        ctx = contextvars.copy_context()
        worker = threading.Thread(target=lambda: result.update(sizing=ctx.run(sizing_agent, tracer, log)))
        worker.start()
        worker.join()
    tracer.record_outcome(evaluation, True, note="bias was right")
    tracer.record_outcome(result["sizing"], False, note="position moved against the portfolio")
    telemetry.shutdown()

    with otel_replay.open(dataset) as store:
        builder = ReplayBuilder(store)
        trade = builder.build_trade_chain(trade_id)
        print(f"trade chain {trade_id}:")
        for entry in trade.audit_entries:
            target = entry["target_agent"] or "*"
            print(f"  {entry['created_at']}  {entry['source_agent']:>13} -> {target:<8} {entry['event_type']}")
        sizing = next(t for t in trade.traces if t["decision_type"] == "position_sizing")
        print(
            f"  position_sizing: {sizing['rationale']!r} confidence={sizing['confidence']} "
            f"inputs={sizing['inputs']} outcome_correct={sizing['outcome_correct']}"
        )
        sessions = builder.build_session_chain(session_id)
        print(f"session {session_id}: {[t['decision_type'] for t in sessions.traces]}")
        order = [e["event_type"] for e in trade.audit_entries]
    expected = ["signal_received", "evaluation_sent", "sizing_started", "vp_approval_requested"]
    return 0 if order == expected and sizing["outcome_correct"] is False else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="trading-postmortem-")))
