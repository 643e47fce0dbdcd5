"""Governed sessions rerun: a recorded governed run reruns offline with the same verdicts, and a rerun under changed
contracts names the first step whose verdict differs. Real ``openai`` client, scripted local server, real Parquet.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

import otel_replay
from otel_replay.contracts.backtest import backtest_dataset
from otel_replay.contracts.engine import Failure, ToolCallView
from otel_replay.contracts.evidence import MAX_VERDICT_CHARS, DecisionEvidence, verdict_text
from otel_replay.contracts.loader import load_contracts
from otel_replay.contracts.session import govern
from otel_replay.contracts.store import FileStateStore
from otel_replay.errors import ReplayContractError, ReplayMismatchError
from otel_replay.gate import ActionGate, Receipt, ReferenceLedger
from otel_replay.instrumentation import OpenAIInstrumentor
from otel_replay.instrumentation import scripted as s
from otel_replay.query.store import Store
from otel_replay.rerun import recording, rerun
from otel_replay.rerun.load import load_recording
from otel_replay.rerun.record import RecordMode

from .govern_support import CHAT_TOOLS, GPT, REFUND_BOT, executors

# "ana@support" passes the contract's e-mail pattern (a rerun is served the stored response: a value the recording
# redacts, a key say, is "[REDACTED]" in a rerun; an e-mail address is kept, see the test below).
LOOKUP = {"customer_email": "ana@support"}
ORDER = {"order_id": "ORD-123"}
REFUND = {"customer_id": "C42", "amount": 40.0, "currency": "USD"}
SESSION = "refund-1"
"""The governed session's id, given to govern(): a rerun that resumed the stored session would see its counts."""


def _reply(call_id: str, name: str, args: Any) -> s.Reply:
    return s.chat_completion(None, model=GPT, tool_calls=[(call_id, name, args)], response_id=f"r-{call_id}")


FLOW = [_reply("c1", "lookup_customer", LOOKUP), _reply("c2", "check_eligibility", ORDER)]
FLOW += [_reply("c3", "issue_refund", REFUND), s.chat_completion("Refunded.", model=GPT)]


class Agent:
    """The refund bot as an entrypoint: its contracts and mode, and the server it was recorded against.

    ``governed``: how many of its ``asks`` go through the governed client; the later ones are made on the
    client itself, with the tools the session would offer (the same requests, and no verdict).
    """

    url = ""
    """The scripted server's URL while recording (a rerun's requests name it too: it is served, never reached)."""

    def __init__(self, contracts: Path, mode: str = "enforce", *, asks: int = 4, governed: int = 4) -> None:
        self.contracts, self.mode, self.asks, self.governed = contracts, mode, asks, governed

    def __call__(self) -> list[str]:
        ledger = ReferenceLedger(balance=1000.0)
        with openai.OpenAI(base_url=self.url, api_key="sk-test-not-a-key", max_retries=0) as client:
            session = govern(
                client, self.contracts, session_id=SESSION, mode=self.mode, tools=executors(ledger, ActionGate(ledger))
            )
            messages: list[Any] = [{"role": "user", "content": "Refund order ORD-123 for ana@support"}]
            for ask in range(self.asks):
                if ask < self.governed:
                    response = session.client.chat.completions.create(model=GPT, messages=messages, tools=CHAT_TOOLS)
                else:
                    names = [tool["function"]["name"] for tool in CHAT_TOOLS]
                    offered = session.governor.engine.narrow(session.governor.state(), names).kept
                    tools = [tool for tool in CHAT_TOOLS if tool["function"]["name"] in offered]
                    response = client.chat.completions.create(model=GPT, messages=messages, tools=tools)
                message = response.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                for call in message.tool_calls or ():
                    run = session.tools[call.function.name](json.loads(call.function.arguments))
                    result = run.result.to_json() if isinstance(run.result, Receipt) else run.result
                    content = json.dumps(result, sort_keys=True)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
            return [session.get_state()["current_phase"], str(ledger.balance)]


@pytest.fixture
def telemetry(dataset: Path) -> Iterator[otel_replay.Telemetry]:
    handle = otel_replay.configure(dataset, service_name="govern-rerun", set_global=False)
    yield handle
    handle.shutdown()


def _record(telemetry: otel_replay.Telemetry, agent: Agent, replies: list[s.Reply], sid: str = "gov-1") -> Any:
    with s.ScriptedServer(replies) as server:
        Agent.url = server.base_url
        with recording(sid) as mode:
            output = agent()
    assert mode is not None and mode.dropped == 0
    telemetry.force_flush()
    return output


def _verdicts(dataset: Path, sid: str = "gov-1") -> list[tuple[int, dict[str, Any]]]:
    with Store(dataset) as store:
        events = load_recording(store, sid).events
    return [(e.seq, json.loads(e.arguments)) for e in events if e.boundary == "contract"]


def _changed(tmp_path: Path, limit: int) -> Path:
    """The refund bot's contracts with the refund limit lowered to ``limit``."""
    changed = tmp_path / "changed-contracts"
    shutil.copytree(REFUND_BOT, changed)
    refund = changed / "issue_refund.yaml"
    refund.write_text(refund.read_text().replace("lte: 500", f"lte: {limit}"))
    return changed


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_governed_run_reruns_offline_with_the_same_verdicts_and_leaves_the_recorded_store_alone(
    dataset: Path, telemetry: otel_replay.Telemetry
) -> None:
    output = _record(telemetry, Agent(REFUND_BOT), FLOW)
    assert output == ["refund_issued", "960.0"]
    verdicts = _verdicts(dataset)
    assert [v["outcome"] for _, v in verdicts] == ["allow"] * 4, "one verdict per decision, in order"
    assert [v["phase_after"] for _, v in verdicts] == [
        "customer_identified",
        "eligibility_checked",
        "refund_issued",
        "refund_issued",
    ]
    assert verdicts[0][1]["calls"] == [{"allowed": True, "name": "lookup_customer"}]
    assert verdicts[0][1]["narrowed"] == ["check_eligibility", "issue_refund"]
    # no ids, times, state versions or contract digests: what a rerun can reproduce
    assert not {"step", "state_version", "digest", "session_id", "call_id"} & set(verdicts[0][1])
    # the recorded run kept its state in the dataset's file store (govern()'s default there)
    store_file = dataset / "_governance" / "sessions.sqlite3"
    # The recorded agent dropped its session without closing it: its store's connection closes (and SQLite folds
    # its write-ahead file into the database) whenever the session is collected. Collect it now, so what follows
    # can only change the file if the rerun writes to it.
    gc.collect()
    reader = FileStateStore(store_file)
    try:
        recorded_state = reader.load(SESSION)
    finally:
        reader.close()
    assert recorded_state is not None and recorded_state.current_phase == "refund_issued"
    before = _digest(store_file), store_file.stat().st_mtime_ns

    result = rerun(Agent(REFUND_BOT), dataset=dataset, session_id="gov-1", write=False)

    assert result.matched, result.report()
    # the rerun started fresh (the stored session forbids a second refund: resuming it would have refused it),
    # and its refund was served from the recording: the rail was not called again
    assert result.output == ["refund_issued", "1000.0"]
    assert (_digest(store_file), store_file.stat().st_mtime_ns) == before


def test_a_rerun_under_a_lowered_refund_limit_names_the_first_verdict_that_differs(
    dataset: Path, telemetry: otel_replay.Telemetry, tmp_path: Path
) -> None:
    _record(telemetry, Agent(REFUND_BOT), FLOW)
    refund_step = next(seq for seq, v in _verdicts(dataset) if v["calls"][0]["name"] == "issue_refund")
    lowered = _changed(tmp_path, 30)  # the recorded refund of 40 is over it

    result = rerun(Agent(lowered), dataset=dataset, session_id="gov-1", write=False)

    assert not result.matched
    found = result.divergence
    assert found is not None and found.step == refund_step, result.report()
    assert found.reason.startswith("the contract verdict differs from the recorded one (outcome:")
    assert 'recorded "allow", rerun "reject"' in found.reason
    assert '"outcome":"allow"' in found.expected and '"failures":[]' in found.expected
    assert '"outcome":"reject"' in found.actual
    assert '{"path":"$.amount","rule":"argument_invariant","tool":"issue_refund"}' in found.actual
    assert result.error is not None and "ReplayContractError" in result.error  # the agent saw the refusal

    with pytest.raises(ReplayMismatchError) as strict:
        rerun(Agent(lowered), dataset=dataset, session_id="gov-1", governance="strict", write=False)
    assert strict.value.step == refund_step and "the contract verdict differs" in str(strict.value)

    # a limit the recorded refund stays under changes no verdict
    assert rerun(Agent(_changed(tmp_path / "x", 100)), dataset=dataset, session_id="gov-1", write=False).matched


def test_a_limit_that_now_stops_a_model_call_before_it_is_made_is_the_verdict_that_differs(
    dataset: Path, telemetry: otel_replay.Telemetry, tmp_path: Path
) -> None:
    _record(telemetry, Agent(REFUND_BOT), FLOW)
    third = _verdicts(dataset)[2][0]
    fewer = tmp_path / "fewer-steps"
    shutil.copytree(REFUND_BOT, fewer)
    (fewer / "session.yaml").write_text((fewer / "session.yaml").read_text().replace("max_steps: 10", "max_steps: 2"))

    result = rerun(Agent(fewer), dataset=dataset, session_id="gov-1", write=False)

    found = result.divergence
    assert found is not None and found.step == third, result.report()
    assert 'outcome: recorded "allow", rerun "reject"' in found.reason
    assert '"precheck":[{"path":null,"rule":"max_steps","tool":null}]' in found.actual
    assert '"calls":[]' in found.actual  # the model was not asked: no call to judge


class StreamingAgent(Agent):
    """The refund bot on the async client, every answer streamed: a tool call is gated once its arguments are in."""

    def __call__(self) -> list[str]:
        return asyncio.run(self._run())

    async def _run(self) -> list[str]:
        async with openai.AsyncOpenAI(base_url=self.url, api_key="sk-test-not-a-key", max_retries=0) as client:
            session = govern(client, self.contracts, session_id=SESSION, mode=self.mode)
            messages: list[Any] = [{"role": "user", "content": "Refund order ORD-123 for ana@support"}]
            names = []
            for _ in range(self.asks):
                stream = await session.client.chat.completions.create(
                    model=GPT, messages=messages, tools=CHAT_TOOLS, stream=True
                )
                calls: dict[int, dict[str, str]] = {}
                async for chunk in stream:
                    for delta in chunk.choices[0].delta.tool_calls or () if chunk.choices else ():
                        call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                        call["id"] += delta.id or ""
                        if delta.function is not None:
                            call["name"] += delta.function.name or ""
                            call["arguments"] += delta.function.arguments or ""
                for call in calls.values():  # the tool's answer goes back with the next request (with_output)
                    names.append(call["name"])
                    function = {"name": call["name"], "arguments": call["arguments"]}
                    messages.append(
                        {
                            "role": "assistant",
                            "tool_calls": [{"id": call["id"], "type": "function", "function": function}],
                        }
                    )
                    result = {"eligible": True} if call["name"] == "check_eligibility" else {"customer_id": "C42"}
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})
            return [*names, session.get_state()["current_phase"]]


STREAMED = [
    s.chat_stream((), model=GPT, tool_calls=[("c1", "lookup_customer", LOOKUP)], response_id="r1"),
    s.chat_stream((), model=GPT, tool_calls=[("c2", "check_eligibility", ORDER)], response_id="r2"),
    s.chat_stream((), model=GPT, tool_calls=[("c3", "issue_refund", REFUND)], response_id="r3"),
]


def test_an_async_streamed_governed_run_reruns_matched_and_a_lowered_limit_diverges_at_the_refund(
    dataset: Path, telemetry: otel_replay.Telemetry, tmp_path: Path
) -> None:
    output = _record(telemetry, StreamingAgent(REFUND_BOT, asks=3), STREAMED)
    assert output == ["lookup_customer", "check_eligibility", "issue_refund", "refund_issued"]
    verdicts = _verdicts(dataset)
    assert [v["calls"][0]["name"] for _, v in verdicts] == ["lookup_customer", "check_eligibility", "issue_refund"]

    same = rerun(StreamingAgent(REFUND_BOT, asks=3), dataset=dataset, session_id="gov-1", write=False)
    assert same.matched, same.report()
    assert same.output == output

    changed = rerun(StreamingAgent(_changed(tmp_path, 30), asks=3), dataset=dataset, session_id="gov-1", write=False)
    assert not changed.matched and changed.divergence is not None
    assert changed.divergence.step == verdicts[2][0]
    assert "the contract verdict differs" in changed.divergence.reason


def test_an_e_mail_address_in_a_tool_call_is_recorded_as_it_was_and_reruns_matched(
    dataset: Path, telemetry: otel_replay.Telemetry
) -> None:
    # an address is data the agent acts on: the recording keeps it (only contract evidence redacts it), so the
    # rerun's model asks lookup_customer("ana@example.com") again and the contract judges it as recorded
    email = [_reply("c1", "lookup_customer", {"customer_email": "ana@example.com"})]
    _record(telemetry, Agent(REFUND_BOT, asks=1), email)

    result = rerun(Agent(REFUND_BOT, asks=1), dataset=dataset, session_id="gov-1", write=False)

    assert result.matched, result.report()
    assert _verdicts(dataset)[0][1]["outcome"] == "allow"


def test_shadow_verdicts_are_compared_though_shadow_changes_nothing_the_agent_sees(
    dataset: Path, telemetry: otel_replay.Telemetry, tmp_path: Path
) -> None:
    _record(telemetry, Agent(REFUND_BOT, "shadow"), FLOW)
    assert {v["mode"] for _, v in _verdicts(dataset)} == {"shadow"}
    assert rerun(Agent(REFUND_BOT, "shadow"), dataset=dataset, session_id="gov-1", write=False).matched

    result = rerun(Agent(_changed(tmp_path, 30), "shadow"), dataset=dataset, session_id="gov-1", write=False)

    # every HTTP call and tool call is the same (shadow blocks nothing): only the verdict tells the runs apart
    assert not result.matched and result.error is None
    assert result.divergence is not None and "the contract verdict differs" in result.divergence.reason
    assert '"mode":"shadow","narrowed"' in result.divergence.actual and '"outcome":"reject"' in result.divergence.actual


def test_a_log_only_session_records_its_verdicts_and_reruns_matched(
    dataset: Path, telemetry: otel_replay.Telemetry
) -> None:
    _record(telemetry, Agent(REFUND_BOT, "log-only"), FLOW)
    verdicts = _verdicts(dataset)
    assert len(verdicts) == 4 and {v["outcome"] for _, v in verdicts} == {"logged"}
    assert rerun(Agent(REFUND_BOT, "log-only"), dataset=dataset, session_id="gov-1", write=False).matched


def test_a_recorded_verdict_the_rerun_does_not_make_is_named(dataset: Path, telemetry: otel_replay.Telemetry) -> None:
    _record(telemetry, Agent(REFUND_BOT, asks=1), FLOW[-1:])  # one governed call answered with text
    ((step, _),) = _verdicts(dataset)

    result = rerun(Agent(REFUND_BOT, asks=1, governed=0), dataset=dataset, session_id="gov-1", write=False)

    assert not result.matched and result.divergence is not None
    assert result.divergence.step == step, result.report()
    assert result.divergence.reason.startswith("the contract verdict differs: the rerun made none here")
    assert "contract verdict" in result.divergence.expected


def test_a_verdict_the_recording_does_not_hold_is_named(dataset: Path, telemetry: otel_replay.Telemetry) -> None:
    # recorded: the second request made on the client itself (a text answer: no verdict); the rerun governs it
    _record(telemetry, Agent(REFUND_BOT, asks=2, governed=1), [FLOW[0], FLOW[-1]])
    assert len(_verdicts(dataset)) == 1

    result = rerun(Agent(REFUND_BOT, asks=2, governed=2), dataset=dataset, session_id="gov-1", write=False)

    assert not result.matched and result.divergence is not None, result.report()
    found = result.divergence
    assert found.reason == "the contract verdict differs: the recording holds no contract verdict here"
    assert found.expected == "" and '"outcome":"allow"' in found.actual


def test_a_recording_made_before_verdicts_were_recorded_reruns_as_before(
    dataset: Path, telemetry: otel_replay.Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as old:  # a recorder that does not know verdicts: the recording holds none
        old.delattr(RecordMode, "contract_verdict")
        _record(telemetry, Agent(REFUND_BOT), FLOW)
    assert _verdicts(dataset) == []
    assert rerun(Agent(REFUND_BOT), dataset=dataset, session_id="gov-1", write=False).matched


def test_hostile_tool_calls_give_a_bounded_verdict_that_reruns_matched(
    dataset: Path, telemetry: otel_replay.Telemetry
) -> None:
    # thousands of tool calls, a huge name, a name with a lone surrogate and one with control characters
    names = ["x" * 50_000, "\ud800bad", "new\nline"] + [f"tool_{i}" for i in range(3000)]
    storm = s.chat_completion(None, model=GPT, tool_calls=[(f"h{i}", n, {}) for i, n in enumerate(names)])

    class Storm(Agent):
        def __call__(self) -> list[str]:
            with openai.OpenAI(base_url=self.url, api_key="sk-test-not-a-key", max_retries=0) as client:
                session = govern(client, self.contracts, session_id=SESSION)
                with pytest.raises(ReplayContractError):  # unmatched tools: the response is refused, clearly
                    session.client.chat.completions.create(model=GPT, messages=[{"role": "user", "content": "go"}])
                return [session.get_state()["current_phase"]]

    _record(telemetry, Storm(REFUND_BOT), [storm])
    ((_, verdict),) = _verdicts(dataset)
    assert verdict["cut"]["calls"] == len(names) and len(verdict["calls"]) == 32
    assert verdict["calls"][0]["name"] == "x" * 120 + "..." and verdict["outcome"] == "reject"
    assert rerun(Storm(REFUND_BOT), dataset=dataset, session_id="gov-1", write=False).matched


def test_the_verdict_text_is_ascii_canonical_and_a_difference_past_the_cut_still_counts() -> None:
    def evidence(last: str) -> DecisionEvidence:
        calls = [ToolCallView.parse(i, f"id{i}", f"tool_{i}", "{}") for i in range(4000)]
        calls.append(ToolCallView.parse(4000, "idz", last, "{}"))
        failures = [Failure("unmatched", "no contract", tool=c.name, call_id=c.call_id) for c in calls]
        allowed = {c.index: False for c in calls}
        return DecisionEvidence(
            "enforce", "openai", "chat", False, "reject", 7, 3, "a", "a", calls, allowed, failures, ()
        )

    first, again, other = verdict_text(evidence("zeta")), verdict_text(evidence("zeta")), verdict_text(evidence("eta"))
    assert first == again and first.isascii() and first != other
    assert len(first) < MAX_VERDICT_CHARS and json.loads(first)["cut"]["failures"] == 4001
    one = DecisionEvidence("enforce", "openai", "chat", False, "allow", 1, 99, None, "b", [], {}, [], ["x"])
    shown = json.loads(verdict_text(one))
    assert shown == {
        "calls": [],
        "failures": [],
        "mode": "enforce",
        "narrowed": ["x"],
        "outcome": "allow",
        "phase_after": "b",
        "phase_before": None,
        "precheck": [],
    }
    assert "99" not in verdict_text(one)  # the state version is not part of it


def test_govern_puts_its_session_in_scope_so_the_backtest_finds_it_unwrapped(
    dataset: Path, telemetry: otel_replay.Telemetry
) -> None:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=telemetry.provider, capture_content=True)
    try:
        with s.ScriptedServer(FLOW + FLOW[:1]) as server:
            Agent.url = server.base_url
            assert Agent(REFUND_BOT)() == ["refund_issued", "960.0"]  # no otel_replay.session() around it
            with openai.OpenAI(base_url=server.base_url, api_key="sk-test-not-a-key", max_retries=0) as client:
                kept = govern(client, REFUND_BOT, session_id="inner")
                with otel_replay.session("outer"):  # the caller's session is kept
                    kept.client.chat.completions.create(model=GPT, messages=[{"role": "user", "content": "hi"}])
    finally:
        instrumentor.uninstrument()
    telemetry.force_flush()
    with Store(dataset) as store:
        report = backtest_dataset(load_contracts(REFUND_BOT), store)
    by_id = {found.session_id: found for found in report.sessions}
    assert SESSION in by_id and "outer" in by_id and "inner" not in by_id
    assert by_id[SESSION].passed and len(by_id[SESSION].steps) == 4
