"""One engine, many threads: evaluating never changes a state, so concurrent readers agree."""

from __future__ import annotations

import threading

from otel_replay.contracts.engine import Decision, Engine
from otel_replay.contracts.model import LoopDetection, SessionLimits, Source
from otel_replay.contracts.store import MemoryStateStore

from ._engine_support import call, calls, refund_bot, run_step

LIMITS = SessionLimits(
    max_tool_calls=20,
    max_calls_per_tool={"add_note": 4},
    loop_detection=LoopDetection(window=6, threshold=2, source=Source("session.yaml", 3)),
)


def test_threads_evaluating_one_state_get_the_same_decision_and_change_nothing() -> None:
    engine = Engine(refund_bot(limits=LIMITS), gate="strip_blocked")
    state = engine.new_state("s", None)
    run_step(engine, state, calls(("lookup_customer", {"customer_email": "a@b"}), ("add_note", {"n": 0})))
    before = state.to_json()
    response = calls(
        ("check_eligibility", {"order_id": "ORD-1"}),
        ("add_note", {"n": 0}),
        ("issue_refund", {"amount": 5, "customer_id": "C"}),
        ("add_note", {"n": 1}),
    )
    expected = engine.evaluate(state, response)
    seen: list[Decision] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(200):
            decision = engine.evaluate(state, response)
            engine.narrow(state, ["add_note", "issue_refund"])
            engine.precheck(state, None)
            with lock:
                seen.append(decision)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 1600
    assert all(decision == expected for decision in seen)
    assert state.to_json() == before
    assert [v.allowed for v in expected.verdicts] == [True, False, False, True]


def test_threads_stepping_one_session_through_a_store_keep_every_limit() -> None:
    """Twelve threads each ask for one add_note of their own: exactly max_calls_per_tool (4) get it."""
    engine = Engine(refund_bot(limits=LIMITS), gate="strip_blocked")
    store = MemoryStateStore()
    store.update("s", lambda _state: engine.new_state("s", None))
    allowed: list[int] = []
    lock = threading.Lock()

    def work(number: int) -> None:
        def change(state):  # type: ignore[no-untyped-def]
            decision = run_step(engine, state, [call("add_note", {"thread": number})])
            if decision.outcome == "allow":
                with lock:
                    allowed.append(number)
            return state

        store.update("s", change)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    final = store.load("s")
    assert final is not None
    assert len(allowed) == 4
    assert final.tool_call_counts == {"add_note": 4}
    assert (final.total_step_count, final.total_block_count) == (12, 8)
