"""A rerun's "matched" means the same actions in the same order, ending the same way (issue 19).

Order across tools, HTTP requests and decisions is part of a format-3 run; outcomes are compared by what they are
(exit status, qualified exception class and message); the first divergence is the verdict even when the agent
catches the error raised at it; a divergence has one step number, the recording's; a format-2 recording reruns by
its own rules and says so.
"""

from __future__ import annotations

import asyncio
import random
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests

import otel_replay
from otel_replay import DependencySnapshot, audit
from otel_replay import semconv as sc
from otel_replay.capture.recorder import get_recorder
from otel_replay.errors import ReplayMismatchError
from otel_replay.instrumentation import tool
from otel_replay.query.store import Store
from otel_replay.rerun import boundaries, recording, rerun
from otel_replay.rerun.codec import ARGUMENTS_CODEC, arguments_codec, stable_json
from otel_replay.rerun.load import load_recording

from .conftest import agent, record


@tool
def fraud_check(order: str) -> dict[str, Any]:
    """Whether the order may be refunded."""
    return {"order": order, "ok": True}


@tool
def refund(order: str, amount: int) -> dict[str, Any]:
    """Pays the order's amount back."""
    return {"order": order, "refunded": amount}


def _check_then_refund() -> Any:
    fraud_check("o-1")
    return refund("o-1", 100)


def _refund_then_check() -> Any:  # the refactor that moves the side effect ahead of its guard
    done = refund("o-1", 100)
    fraud_check("o-1")
    return done


# --- order across calls -------------------------------------------------------------------------------


def test_a_refund_moved_ahead_of_its_fraud_check_diverges(dataset: Path) -> None:
    _, recorded, _ = record(dataset, "swap", _check_then_refund)
    assert rerun(_check_then_refund, dataset=dataset, session_id="swap").matched
    result = rerun(_refund_then_check, dataset=dataset, session_id="swap")  # matched, same fingerprint, before
    assert not result.matched and result.fingerprint != recorded
    div = result.divergence
    assert div is not None and div.step == 0, result.report()
    assert "called out of order" in div.reason
    assert "tool refund (recorded step 1) before tool fraud_check (recorded step 0)" in div.reason
    assert div.expected.startswith("tool fraud_check") and div.actual.startswith("tool refund")
    with pytest.raises(ReplayMismatchError, match="out of order") as caught:
        rerun(_refund_then_check, dataset=dataset, session_id="swap", governance="strict")
    assert caught.value.step == 0 and str(caught.value).startswith("diverged at step 0: ")


def _check_then_pay(api: str) -> list[int]:
    with httpx.Client(base_url=api) as client:
        return [client.get("/check").status_code, client.post("/pay", json={"amount": 100}).status_code]


def _pay_then_check(api: str) -> list[int]:
    with httpx.Client(base_url=api) as client:
        paid = client.post("/pay", json={"amount": 100}).status_code
        return [client.get("/check").status_code, paid]


def test_a_payment_sent_before_its_check_diverges(dataset: Path) -> None:
    with agent.scripted_server() as api:
        record(dataset, "pay", lambda: _check_then_pay(api))
        assert rerun(lambda: _check_then_pay(api), dataset=dataset, session_id="pay").matched
        result = rerun(lambda: _pay_then_check(api), dataset=dataset, session_id="pay")
    assert not result.matched and result.divergence is not None, result.report()
    reason = result.divergence.reason
    assert reason.startswith(f"called out of order: the rerun made http POST {api}/pay (recorded step 1) before "), (
        reason
    )
    assert f"http GET {api}/check (recorded step 0)" in reason
    assert "/pay" in result.divergence.actual and "/check" in result.divergence.expected


def test_a_tool_and_an_http_request_swapped_diverge(dataset: Path) -> None:
    def check_then_pay(api: str) -> None:
        fraud_check("o-1")
        requests.post(f"{api}/pay", json={"amount": 100}, timeout=5)

    def pay_then_check(api: str) -> None:
        requests.post(f"{api}/pay", json={"amount": 100}, timeout=5)
        fraud_check("o-1")

    with agent.scripted_server() as api:
        record(dataset, "mixed", lambda: check_then_pay(api))
        assert rerun(lambda: check_then_pay(api), dataset=dataset, session_id="mixed").matched
        result = rerun(lambda: pay_then_check(api), dataset=dataset, session_id="mixed")
    assert not result.matched and result.divergence is not None
    assert (
        f"http POST {api}/pay (recorded step 1) before tool fraud_check (recorded step 0)" in result.divergence.reason
    )


def _decide(first: str, second: str) -> str:
    random.random()  # a recorded boundary besides the decisions
    for kind in (first, second):
        with audit(kind, snapshot=DependencySnapshot({"budget": 10_000})):
            pass
    return "done"


def test_two_decisions_made_in_the_other_order_diverge(dataset: Path) -> None:
    record(dataset, "decisions", lambda: _decide("screening", "payout"))
    assert rerun(lambda: _decide("screening", "payout"), dataset=dataset, session_id="decisions").matched
    result = rerun(lambda: _decide("payout", "screening"), dataset=dataset, session_id="decisions")
    assert not result.matched and result.divergence is not None, result.report()
    assert "decision payout (recorded step 2) before decision screening (recorded step 1)" in result.divergence.reason


def _two_workers(schedule: list[int]) -> list[str]:
    """Two threads, each in its own correlation scope, their calls made in the turns ``schedule`` gives."""
    position = [0]
    moved = threading.Condition()

    def in_turn(index: int, make: Callable[[], Any]) -> None:
        with moved:
            assert moved.wait_for(lambda: schedule[position[0]] == index, timeout=10)
        make()
        with moved:
            position[0] += 1
            moved.notify_all()

    def worker(index: int) -> None:
        with otel_replay.correlation(f"worker-{index}"):
            in_turn(index, lambda: fraud_check(f"o-{index}"))
            in_turn(index, lambda: refund(f"o-{index}", index))

    threads = [threading.Thread(target=worker, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    return ["done"]


@pytest.mark.parametrize("schedule", [[1, 1, 0, 0], [1, 0, 1, 0], [0, 1, 1, 0]])
def test_threads_in_their_own_correlation_scopes_match_under_any_interleaving(
    dataset: Path, schedule: list[int]
) -> None:
    _, recorded, events = record(dataset, "threads", lambda: _two_workers([0, 0, 1, 1]))
    assert events == 4
    result = rerun(lambda: _two_workers(schedule), dataset=dataset, session_id="threads")
    assert result.matched and result.fingerprint == recorded, result.report()


def _in_scope(scope: str, swap: bool) -> None:
    with otel_replay.correlation(scope):
        if swap:
            refund("o-1", 100)
        fraud_check("o-1")
        if not swap:
            refund("o-1", 100)


@pytest.mark.parametrize("scope", ["tenant|7", "tenant||🦊|", "", "x" * 5000])
def test_order_holds_in_a_correlation_scope_whatever_its_id(dataset: Path, scope: str) -> None:
    # A "|" in the id does not split the scope (stream keys are "boundary|name|consumer|correlation id").
    record(dataset, "scoped", lambda: _in_scope(scope, False))
    assert rerun(lambda: _in_scope(scope, False), dataset=dataset, session_id="scoped").matched
    result = rerun(lambda: _in_scope(scope, True), dataset=dataset, session_id="scoped")
    assert not result.matched and result.divergence is not None and "out of order" in result.divergence.reason


def _two_scopes_sharing_a_suffix(first: int) -> None:
    """Two threads whose correlation ids end alike ("a|shared", "b|shared"), one after the other."""
    for index in (first, 1 - first):
        thread = threading.Thread(target=_in_scope, args=(f"{'ab'[index]}|shared", False))
        thread.start()
        thread.join(10)


def test_scopes_whose_ids_end_alike_are_still_two_scopes(dataset: Path) -> None:
    record(dataset, "suffix", lambda: _two_scopes_sharing_a_suffix(0))
    result = rerun(lambda: _two_scopes_sharing_a_suffix(1), dataset=dataset, session_id="suffix")
    assert result.matched, result.report()


@tool
async def slow_quote(symbol: str) -> str:
    """A slow lookup."""
    await asyncio.sleep(0.2)
    return symbol + " 100"


@tool
async def quick_quote(symbol: str) -> str:
    """A quick lookup."""
    return symbol + " 101"


async def _gathered() -> list[str]:
    # Overlapping calls: the recording completes the quick one first (a race); the rerun makes the slow one first.
    found = list(await asyncio.gather(slow_quote("a"), quick_quote("b")))
    found.append(str(fraud_check("o-1")))  # after both: it must come after both
    return found


def test_calls_that_overlapped_in_the_recording_may_come_in_either_order(dataset: Path) -> None:
    original, _, _ = record(dataset, "gather", lambda: asyncio.run(_gathered()))
    with Store(dataset) as store:
        loaded = load_recording(store, "gather")
    assert [e.name for e in loaded.events] == ["quick_quote", "slow_quote", "fraud_check"]
    assert [e.after for e in loaded.events] == [0, 0, 2]
    result = rerun(lambda: asyncio.run(_gathered()), dataset=dataset, session_id="gather")
    assert result.matched and result.output == original, result.report()


async def _check_before_gather() -> list[str]:
    found = [str(fraud_check("o-1"))]
    found += await asyncio.gather(slow_quote("a"), quick_quote("b"))
    return found


def test_a_call_moved_ahead_of_calls_that_completed_before_it_began_diverges(dataset: Path) -> None:
    record(dataset, "gather", lambda: asyncio.run(_gathered()))
    result = rerun(lambda: asyncio.run(_check_before_gather()), dataset=dataset, session_id="gather")
    assert not result.matched and result.divergence is not None
    assert "called out of order: the rerun made tool fraud_check (recorded step 2)" in result.divergence.reason


# --- outcomes -----------------------------------------------------------------------------------------

EXIT = {"status": 2}


def _exits() -> None:
    fraud_check("o-1")
    sys.exit(EXIT["status"])


def _record_raising(dataset: Path, session_id: str, entrypoint: Callable[[], Any]) -> None:
    telemetry = otel_replay.configure(dataset, service_name="rerun-tests", set_global=False)
    try:
        with pytest.raises((SystemExit, Exception)), recording(session_id):  # the run's own end
            entrypoint()
        telemetry.force_flush()
    finally:
        telemetry.shutdown()


def test_an_exit_with_another_status_does_not_match(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _record_raising(dataset, "exit", _exits)
    with Store(dataset) as store:
        assert load_recording(store, "exit").outcome == "raised builtins:SystemExit: 2"
    assert rerun(_exits, dataset=dataset, session_id="exit").matched
    monkeypatch.setitem(EXIT, "status", 3)
    result = rerun(_exits, dataset=dataset, session_id="exit")  # matched before: both "SystemExit"
    assert not result.matched and result.divergence is None and not result.outcome_matched
    assert result.summary() == (
        "outcome differs: the original raised builtins:SystemExit: 2, the rerun raised builtins:SystemExit: 3"
    )


RAISE: dict[str, Callable[[str], BaseException]] = {"error": ConnectionError}


def _connects() -> None:
    fraud_check("o-1")
    raise RAISE["error"]("connection refused to api.example")


def test_an_error_of_another_class_with_the_same_name_does_not_match(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _record_raising(dataset, "conn", _connects)
    assert rerun(_connects, dataset=dataset, session_id="conn").matched
    monkeypatch.setitem(RAISE, "error", requests.exceptions.ConnectionError)
    result = rerun(_connects, dataset=dataset, session_id="conn")  # matched before: both "ConnectionError"
    assert not result.matched and "requests.exceptions:ConnectionError" in result.outcome, result.report()
    monkeypatch.setitem(RAISE, "error", lambda message: ConnectionError(message.replace("refused", "reset")))
    assert not rerun(_connects, dataset=dataset, session_id="conn").matched  # same class, another message


def test_an_outcome_message_is_compared_redacted_on_both_sides(dataset: Path) -> None:
    key = "sk-live-0123456789abcdefghijklmnop"

    def fails() -> None:
        fraud_check("o-1")
        raise ValueError(f"401 for https://api.example/v1?api_key={key}")

    _record_raising(dataset, "secret", fails)
    with Store(dataset) as store:
        assert key not in load_recording(store, "secret").outcome
    result = rerun(fails, dataset=dataset, session_id="secret")
    assert result.matched and key not in result.outcome, result.report()


# --- the first divergence is the verdict ----------------------------------------------------------------

ORDER = {"id": "o-1"}


def _framework_loop(model: str) -> str:
    """Like the Agents SDK: a tool's error becomes the tool's output, which goes to the model."""
    try:
        output = str(fraud_check(ORDER["id"]))
    except Exception as exc:  # noqa: BLE001 - a framework turning tool errors into tool output
        output = f"tool error: {exc}"
    reply = httpx.post(f"{model}/v1/chat/completions", json={"messages": [{"role": "tool", "content": output}]})
    return str(reply.json()["choices"][0]["message"]["content"])


def test_a_framework_that_catches_the_tool_divergence_still_gets_it_as_the_verdict(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with agent.scripted_server() as model:
        record(dataset, "framework", lambda: _framework_loop(model))
        monkeypatch.setitem(ORDER, "id", "o-9")
        with pytest.raises(ReplayMismatchError) as caught:  # the model call's changed body, before
            rerun(lambda: _framework_loop(model), dataset=dataset, session_id="framework", governance="strict")
        relaxed = rerun(lambda: _framework_loop(model), dataset=dataset, session_id="framework")
    err = caught.value
    assert "tool fraud_check called with other arguments" in str(err) and err.step == 0, str(err)
    assert str(err).count("diverged at step") == 1 and "strict rerun" not in str(err)
    assert relaxed.divergence is not None and "tool fraud_check" in relaxed.divergence.reason
    assert not relaxed.matched and relaxed.divergence.step == 0


@tool
def open_handle(name: str) -> Any:
    """Returns a lock: a value a recording cannot hold."""
    return threading.Lock()


def _catches_everything() -> str:
    try:
        open_handle("ledger")
    except Exception:  # noqa: BLE001 - an agent that swallows every error
        return "done"
    return "done"


def test_an_unservable_result_the_agent_catches_never_matches(dataset: Path) -> None:
    record(dataset, "unservable", _catches_everything)
    result = rerun(_catches_everything, dataset=dataset, session_id="unservable")  # matched, before
    assert not result.matched and result.divergence is not None, result.report()
    assert "could not hold" in result.divergence.reason and result.divergence.step == 0
    with pytest.raises(ReplayMismatchError, match="could not hold"):  # returned normally, before
        rerun(_catches_everything, dataset=dataset, session_id="unservable", governance="strict")


def test_an_unrecorded_tool_call_the_agent_catches_is_the_verdict_in_strict(dataset: Path) -> None:
    def agent_run() -> str:
        fraud_check("o-1")
        try:
            refund("o-1", 100)  # not in the recording: refused in both governance levels
        except ReplayMismatchError:
            pass
        return str(fraud_check("o-2"))  # not recorded either: a later divergence

    record(dataset, "late", lambda: fraud_check("o-1"))
    with pytest.raises(ReplayMismatchError, match="tool refund") as caught:
        rerun(agent_run, dataset=dataset, session_id="late", governance="strict")
    assert caught.value.step == 1 and "a call the recording does not hold" in str(caught.value)


# --- one step number ------------------------------------------------------------------------------------


def test_a_divergence_and_its_closest_recorded_calls_share_one_numbering(dataset: Path) -> None:
    def agent_run(amount: int, clock_first: bool) -> None:
        if clock_first:  # a clock read is not ordered: moving it is no divergence, but it shifts the calls after it
            time.time()
        fraud_check("o-1")
        refund("o-1", amount)
        if not clock_first:
            time.time()

    record(dataset, "steps", lambda: agent_run(100, False))
    assert rerun(lambda: agent_run(100, True), dataset=dataset, session_id="steps").matched
    with pytest.raises(ReplayMismatchError) as caught:  # "step 2" with the closest call listed as "step 1", before
        rerun(lambda: agent_run(999, True), dataset=dataset, session_id="steps", governance="strict")
    err = caught.value
    assert err.step == 1 and err.candidates[0].startswith("step 1: tool refund"), str(err)
    relaxed = rerun(lambda: agent_run(999, True), dataset=dataset, session_id="steps")
    assert relaxed.divergence is not None and relaxed.divergence.step == 1
    report = relaxed.report()
    assert "diverged at step 1: tool refund called with other arguments" in report
    assert "    step 1: tool refund" in report


def test_a_clock_read_by_another_function_explains_the_consumer_matcher(dataset: Path) -> None:
    def reads_clock() -> float:
        return time.time()

    def reads_elsewhere() -> float:
        return time.time()

    record(dataset, "consumer", reads_clock)
    result = rerun(reads_elsewhere, dataset=dataset, session_id="consumer")
    assert result.divergence is not None
    assert "served per consumer, the function that makes them" in result.divergence.reason
    assert "reads_elsewhere" in result.divergence.reason
    assert any("✗ consumer" in line for line in result.divergence.candidates)


# --- format-2 recordings: their own rules -------------------------------------------------------------

_SWAP = {"on": False}


def _v2_refund_agent() -> tuple[Any, ...]:
    t = time.time()
    if _SWAP["on"]:
        done = refund("o-1", 100)
        check = fraud_check("o-1")
    else:
        check = fraud_check("o-1")
        done = refund("o-1", 100)
    return check["ok"], done["refunded"], random.random() < 2, t > 0


def _v2_exiting_agent() -> None:
    fraud_check("o-2")
    sys.exit(EXIT["status"])


# Recorded by otel-replay 11fef40 (format 2, the last before format 3) from the two agents above, as they were
# then (without the swap): each session's one chunk, its attributes as stored.
_V2 = {
    "v2-refund": (
        '[{"a":"[[],{}]","b":"clock","h":"56bf23595724dc62298a2dc75c2578d2","n":"time.time","q":0,'
        '"s":"clock|time.time|tests.rerun.test_rerun_order:_v2_refund_agent|","th":"MainThread",'
        '"v":1795890198.834979},{"a":"{\\"order\\":\\"o-1\\"}","b":"tool","h":"73bd81031db8845c54591cf862bf1c98",'
        '"n":"fraud_check","q":1,"s":"tool|fraud_check||","th":"MainThread",'
        '"v":{"$ordered":[["order","o-1"],["ok",true]]}},{"a":"{\\"amount\\":100,\\"order\\":\\"o-1\\"}",'
        '"b":"tool","h":"e409ab5295ab46395e093f99617d339b","n":"refund","q":2,"s":"tool|refund||",'
        '"th":"MainThread","v":{"order":"o-1","refunded":100}},{"a":"[[],{}]","b":"entropy",'
        '"h":"fe6a48ce86b377f71394247376140b25","n":"random.random","q":3,'
        '"s":"entropy|random.random|tests.rerun.test_rerun_order:_v2_refund_agent|","th":"MainThread",'
        '"v":0.14966705442865147}]',
        "ae77e865846a52f1f62b85e3d1011d0aa5625bf9f4efed6b6508e44af7833f18",
        "returned",
        "c61ae047bcabfc7ee1d8803224a17907",
    ),
    "v2-exit": (
        '[{"a":"{\\"order\\":\\"o-2\\"}","b":"tool","h":"61a56e2cd85d06e8bb73638476c9c894","n":"fraud_check",'
        '"q":0,"s":"tool|fraud_check||","th":"MainThread","v":{"$ordered":[["order","o-2"],["ok",true]]}}]',
        "9c6fff8cd501ca98db723813e898a3e58af0c5a604224a7b7ae79c49d9263da4",
        "raised SystemExit: 2",
        "a57708500d70b261299321e509e2393b",
    ),
}


def _write_v2(dataset: Path) -> None:
    telemetry = otel_replay.configure(dataset, set_global=False)
    try:
        for session_id, (events, fingerprint, outcome, recording_id) in _V2.items():
            attrs = {
                sc.KIND: sc.KIND_RECORDING,
                sc.RECORD_SOURCE: "recording",
                sc.SESSION_ID: session_id,
                sc.RECORD_ID: f"{session_id}-chunk-0",
                sc.RECORDING_FORMAT: 2,
                sc.RECORDING_ID: recording_id,
                sc.RECORDING_CHUNK: 0,
                sc.RECORDING_FIRST_SEQ: 0,
                sc.RECORDING_EVENTS: events,
                sc.RECORDING_FINAL: True,
                sc.RECORDING_FINGERPRINT: fingerprint,
                sc.RECORDING_OUTCOME: outcome,
            }
            get_recorder().emit(sc.SPAN_RECORDING, f"{session_id}-chunk-0", attrs)
        telemetry.force_flush()
    finally:
        telemetry.shutdown()


def test_a_format_2_recording_reruns_by_its_own_rules_and_says_so(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_v2(dataset)
    with Store(dataset) as store:
        loaded = load_recording(store, "v2-refund")
    assert loaded.codec == 2 and loaded.fingerprint == _V2["v2-refund"][1]  # its stored (version-2) digest
    result = rerun(_v2_refund_agent, dataset=dataset, session_id="v2-refund")
    assert result.matched and result.fingerprint == loaded.fingerprint, result.report()
    assert result.output == (True, 100, True, True)
    rules = "recorded in format 2: order across calls not compared"
    assert result.rules.startswith(rules) and rules in result.report() and "record again" in result.report()
    # Its rules: order across calls was not part of a format-2 run, so the swap still matches it ...
    monkeypatch.setitem(_SWAP, "on", True)
    assert rerun(_v2_refund_agent, dataset=dataset, session_id="v2-refund").matched
    # ... and outcomes are compared by the exception's name, as then.
    monkeypatch.setitem(EXIT, "status", 3)
    exited = rerun(_v2_exiting_agent, dataset=dataset, session_id="v2-exit")
    assert exited.matched and rules in exited.report(), exited.report()


def test_a_new_recording_is_compared_in_full_and_says_nothing_of_older_rules(dataset: Path) -> None:
    record(dataset, "v3", _v2_refund_agent)
    result = rerun(_v2_refund_agent, dataset=dataset, session_id="v3")
    assert result.matched and result.rules == "" and "recorded in format" not in result.report()


MESSAGE = {"text": "first line\n" + "x" * 5000}


def _fails_with_a_long_message() -> None:
    fraud_check("o-1")
    raise ValueError(MESSAGE["text"])


def test_a_long_multi_line_outcome_is_compared_whole_and_summarised_on_one_line(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _record_raising(dataset, "long", _fails_with_a_long_message)
    assert rerun(_fails_with_a_long_message, dataset=dataset, session_id="long").matched
    monkeypatch.setitem(MESSAGE, "text", "first line\n" + "x" * 1000 + "y" + "x" * 3999)  # differs far in
    result = rerun(_fails_with_a_long_message, dataset=dataset, session_id="long")
    summary = result.summary()
    assert not result.matched and "\n" not in summary and len(summary) < 500, summary
    assert summary.startswith("outcome differs: the original raised builtins:ValueError: first line…")


# --- a read's arguments -----------------------------------------------------------------------------------


def _seed(value: int | None) -> Callable[[], float]:
    def agent() -> float:
        random.seed() if value is None else random.seed(value)
        return random.random()

    return agent


@pytest.mark.parametrize(("recorded", "made"), [(None, 7), (7, None), (7, 8)])
def test_a_read_made_with_other_arguments_than_recorded_diverges(
    dataset: Path, recorded: int | None, made: int | None
) -> None:
    # A read with no arguments is matched on a text written once per codec: one with arguments must never
    # be taken for it, either way round.
    record(dataset, "seed", _seed(recorded))
    assert rerun(_seed(recorded), dataset=dataset, session_id="seed").matched
    result = rerun(_seed(made), dataset=dataset, session_id="seed")
    assert not result.matched and result.divergence is not None, result.report()
    assert "called with other arguments" in result.divergence.reason


def test_the_text_of_a_read_with_no_arguments_is_stable_json_s_under_every_codec() -> None:
    assert set(boundaries._NO_ARGUMENTS_TEXT) == set(range(1, ARGUMENTS_CODEC + 1))
    for codec, text in boundaries._NO_ARGUMENTS_TEXT.items():
        with arguments_codec(codec):
            assert stable_json([(), {}]) == text
