"""Sessions under concurrency and across restarts: two sessions on two clients share nothing; one session used
from several threads or asyncio tasks stays consistent; a restarted process resumes the session from its
FileStateStore (phase, counts, forbidden tools, recorded outputs) and the double refund stays refused."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

import otel_replay
from otel_replay.contracts.session import govern
from otel_replay.contracts.store import FileStateStore
from otel_replay.errors import ReplayContractError
from otel_replay.gate import ActionGate, ReferenceLedger
from otel_replay.instrumentation import scripted as s

from .._support import in_forked_child
from .govern_support import CHAT_TOOLS, GOOD, GPT, HELLO, REFUND_BOT, Spans, executors, openai_client

LOOKUP = s.chat_completion(None, model=GPT, tool_calls=[("c1", "lookup_customer", GOOD)])


def test_two_sessions_on_two_clients_share_nothing(spans: Spans) -> None:
    with s.ScriptedServer([LOOKUP, LOOKUP, LOOKUP]) as server:
        first = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        second = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        first.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
        first.kill()
        second.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
        second.narrow(["lookup_customer"])
    assert first.session_id != second.session_id
    a, b = first.get_state(), second.get_state()
    assert a["killed"] is True and b["killed"] is False
    assert a["current_phase"] == b["current_phase"] == "customer_identified"
    assert a["total_step_count"] == b["total_step_count"] == 1
    assert a["control_revision"] == 0 and b["control_revision"] == 1


def test_one_session_from_eight_threads_allows_the_phase_advancing_call_exactly_once(spans: Spans) -> None:
    with s.ScriptedServer(default=LOOKUP) as server:
        session = govern(openai_client(server), REFUND_BOT, tracer_provider=spans.provider)
        outcomes: list[str] = []
        lock = threading.Lock()
        start = threading.Barrier(8)

        def agent() -> None:
            start.wait()
            try:
                session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
                result = "allowed"
            except ReplayContractError:
                result = "rejected"
            with lock:
                outcomes.append(result)

        threads = [threading.Thread(target=agent) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert sorted(outcomes) == ["allowed"] + ["rejected"] * 7
    state = session.get_state()
    assert state["total_step_count"] == 8
    assert state["tool_call_counts"] == {"lookup_customer": 1}
    assert state["current_phase"] == "customer_identified"
    assert session.get_health()["bypass_detected"] is False


def test_one_session_from_eight_asyncio_tasks_stays_consistent(spans: Spans) -> None:
    async def run(server: s.ScriptedServer) -> tuple[list[str], dict[str, Any]]:
        session = govern(openai_client(server, aio=True), REFUND_BOT, tracer_provider=spans.provider)

        async def agent() -> str:
            try:
                await session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
            except ReplayContractError:
                return "rejected"
            return "allowed"

        try:
            outcomes = await asyncio.gather(*(agent() for _ in range(8)))
        finally:
            await session.client.close()
        return list(outcomes), session.get_state()

    with s.ScriptedServer(default=LOOKUP) as server:
        outcomes, state = asyncio.run(run(server))
    assert sorted(outcomes) == ["allowed"] + ["rejected"] * 7
    assert state["tool_call_counts"] == {"lookup_customer": 1} and state["total_step_count"] == 8


def _first_process(server: s.ScriptedServer, path: Path) -> str:
    """The first life of session ``resume-me``: two steps taken, their state in the file store at ``path``."""
    ledger = ReferenceLedger(1000.0)
    session = govern(
        openai_client(server),
        REFUND_BOT,
        session_id="resume-me",
        store=FileStateStore(path),
        tools=executors(ledger, ActionGate(ledger)),
    )
    steps = (("lookup_customer", {"customer_email": "ana@example.com"}), ("check_eligibility", {"order_id": "ORD-1"}))
    for name, args in steps:
        session.client.chat.completions.create(
            model=GPT, messages=[{"role": "user", "content": "go"}], tools=CHAT_TOOLS
        )
        session.tools[name](args)
    return str(session.get_state()["current_phase"])


def test_a_restarted_process_resumes_the_session_from_its_file_store(spans: Spans, tmp_path: Path) -> None:
    path = tmp_path / "_governance" / "sessions.sqlite3"
    replies = [
        s.chat_completion(None, model=GPT, tool_calls=[("c1", "lookup_customer", GOOD)]),
        s.chat_completion(None, model=GPT, tool_calls=[("c2", "check_eligibility", {"order_id": "ORD-1"})]),
        s.chat_completion(
            None, model=GPT, tool_calls=[("c3", "issue_refund", {"customer_id": "C42", "amount": 9, "currency": "EUR"})]
        ),
        s.chat_completion(
            None, model=GPT, tool_calls=[("c4", "issue_refund", {"customer_id": "C42", "amount": 9, "currency": "EUR"})]
        ),
    ]
    with s.ScriptedServer(replies) as server:
        # The first life runs in a process of its own that ends with its session in memory: a child forked from
        # this one (which has openai, anthropic and the package imported already) dies as a restarted process's
        # predecessor would, without paying a new interpreter's imports; this process never saw the session.
        assert in_forked_child(lambda: _first_process(server, path)) == "eligibility_checked"
        ledger = ReferenceLedger(1000.0)
        resumed = govern(
            openai_client(server),
            REFUND_BOT,
            session_id="resume-me",
            store=FileStateStore(path),
            tools=executors(ledger, ActionGate(ledger)),
            tracer_provider=spans.provider,
        )
        response = resumed.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
        offered = [t["function"]["name"] for t in server.requests[2]["json"]["tools"]]
        call = response.choices[0].message.tool_calls[0]
        resumed.tools.issue_refund({"customer_id": "C42", "amount": 9, "currency": "EUR"})
        with pytest.raises(ReplayContractError) as caught:
            resumed.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
    assert offered == ["issue_refund"]  # the phase and the satisfied precondition came back from the file
    assert call.function.name == "issue_refund"
    assert ledger.balance == 991.0
    assert "forbidden" in {f.rule for f in caught.value.failures}
    state = resumed.get_state()
    assert state["tool_call_counts"] == {"lookup_customer": 1, "check_eligibility": 1, "issue_refund": 1}
    assert resumed.get_health()["durability"] == "file"


def test_with_a_configured_dataset_the_state_lives_in_its_governance_store(spans: Spans, tmp_path: Path) -> None:
    dataset = tmp_path / "traces"
    telemetry = otel_replay.configure(dataset, service_name="govern", set_global=False)
    try:
        with s.ScriptedServer([LOOKUP]) as server:
            session = govern(openai_client(server), REFUND_BOT, session_id="in-dataset", tracer_provider=spans.provider)
            session.client.chat.completions.create(model=GPT, messages=HELLO, tools=CHAT_TOOLS)
            session.restore()  # closes the store govern() opened; the state stays in the file
    finally:
        telemetry.shutdown()
    assert session.get_health()["durability"] == "file"
    saved = FileStateStore(dataset / "_governance" / "sessions.sqlite3")
    state = saved.load("in-dataset")
    saved.close()
    assert state is not None and state.current_phase == "customer_identified"
