"""Codec 2: arguments compared by value, results served with their type, odd values never break a recording.

Also: every ``random`` draw is recorded, an interrupted recording ends a rerun early
(never raising ``KeyboardInterrupt`` again), a whole-process recording keeps how the
process ended, and a recording made with codec 1 still reruns as it did.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import enum
import json
import os
import random
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pydantic
import pytest

import otel_replay
from otel_replay import semconv as sc
from otel_replay.capture.recorder import get_recorder
from otel_replay.errors import ReplayMismatchError
from otel_replay.instrumentation import tool
from otel_replay.query.store import Store
from otel_replay.rerun import recording, rerun
from otel_replay.rerun.codec import (
    arguments_codec,
    decode_value,
    decoded_json_text,
    encode_value,
    stable_json,
    tree_json,
)
from otel_replay.rerun.events import BoundaryCall, stream_key
from otel_replay.rerun.load import load_recording
from tests._support import Zygote

from .conftest import record, run_script

ROOT = Path(__file__).resolve().parents[2]

# --- finding 2: arguments JSON cannot hold are compared by value -----------------------------------------


class Side(enum.Enum):
    BUY = "buy"
    SELL = "sell"


@dataclasses.dataclass(frozen=True)
class Order:
    sku: str
    qty: int


class Payee(pydantic.BaseModel):
    iban: str
    amount: decimal.Decimal


ARGUMENT: list[Any] = [None]


@tool(side_effect="financial")
def transfer(account: str, amount: Any) -> dict[str, Any]:
    """A payment tool with a typed argument."""
    return {"ok": True}


def _transfers() -> bool:
    return bool(transfer("acme", ARGUMENT[0])["ok"])


PAIRS = [
    (decimal.Decimal("100.00"), decimal.Decimal("1000000.00")),
    (datetime.datetime(2026, 1, 2, 3, 4), datetime.datetime(2026, 1, 2, 3, 5)),
    (datetime.date(2026, 1, 2), datetime.date(2027, 1, 2)),
    (Side.BUY, Side.SELL),
    (uuid.UUID(int=1), uuid.UUID(int=2)),
    (Order("a", 1), Order("a", 100)),
    (Payee(iban="DE1", amount=decimal.Decimal("1")), Payee(iban="DE1", amount=decimal.Decimal("1000"))),
    ({1, 2, 3}, {1, 2, 4}),
    ({("EUR", "USD"): 1.08}, {("EUR", "GBP"): 1.08}),
]


@pytest.mark.parametrize(("recorded", "changed"), PAIRS, ids=lambda v: type(v).__name__)
def test_a_typed_argument_is_compared_by_value(dataset: Path, recorded: Any, changed: Any) -> None:
    ARGUMENT[0] = recorded
    record(dataset, "typed", _transfers)
    same = rerun(_transfers, dataset=dataset, session_id="typed")
    assert same.matched, same.report()
    ARGUMENT[0] = changed
    other = rerun(_transfers, dataset=dataset, session_id="typed")
    assert not other.matched and other.divergence is not None
    assert "other arguments" in other.divergence.reason


def test_an_argument_with_no_value_representation_never_matches(
    dataset: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ARGUMENT[0] = threading.Lock()  # no value to compare: two locks are never "the same argument"
    record(dataset, "opaque", _transfers)
    assert "tool transfer was called with _thread:lock, which has no value representation" in caplog.text
    relaxed = rerun(_transfers, dataset=dataset, session_id="opaque")
    assert not relaxed.matched and relaxed.divergence is not None
    assert "no value representation" in relaxed.divergence.reason and "_thread" in relaxed.divergence.reason
    with pytest.raises(ReplayMismatchError, match="no value representation"):
        rerun(_transfers, dataset=dataset, session_id="opaque", governance="strict")


def test_one_value_json_cannot_hold_does_not_hide_the_other_arguments(dataset: Path) -> None:
    ARGUMENT[0] = {"limit": 10**5000, "to": "acme"}  # past int's 4,300-digit text: once made all arguments opaque
    record(dataset, "wide", _transfers)
    assert rerun(_transfers, dataset=dataset, session_id="wide").matched
    ARGUMENT[0] = {"limit": 10**5000, "to": "mallory"}
    assert not rerun(_transfers, dataset=dataset, session_id="wide").matched


@tool
def price(table: Any) -> int:
    """Takes a table keyed by tuples or by mixed keys."""
    return len(table)


def _prices() -> int:
    return int(price({("EUR", "USD"): 1.08}) + price({1: "a", "b": 2}))


def test_keys_json_cannot_hold_are_recorded_without_raising_into_the_agent(dataset: Path) -> None:
    assert _prices() == 3
    output, _, events = record(dataset, "keys", _prices)  # raised TypeError into the agent before
    assert output == 3 and events == 2
    assert rerun(_prices, dataset=dataset, session_id="keys").matched


def test_a_callers_dollar_key_cannot_pass_for_a_tag() -> None:
    from otel_replay.rerun.codec import unmatchable

    assert stable_json({"x": {"$decimal": "1"}}) != stable_json({"x": decimal.Decimal("1")})
    assert unmatchable(stable_json({"$unmatchable": "x"})) is None
    assert unmatchable(stable_json([1, {"k": object()}])) == "builtins:object"
    assert stable_json({1: "a"}) != stable_json({"1": "a"})


# --- finding 6a: a served result has the type the recorded run saw ---------------------------------------

Quote = collections.namedtuple("Quote", "symbol price")


class Risk(enum.IntEnum):
    LOW = 1
    HIGH = 2


RESULTS: dict[str, Any] = {
    "quote": Quote("ACME", 101.5),
    "risk": Risk.HIGH,
    "ordered": collections.OrderedDict([("b", 1), ("a", 2)]),
    "buffer": bytearray(b"\x00\xff"),
    "money": decimal.Decimal("12345678901234567890.12"),
    "when": datetime.datetime(2026, 11, 26, 13, 0, tzinfo=datetime.UTC),
    "day": datetime.date(2026, 11, 26),
    "tags": frozenset({"a", "b"}),
    "ids": {3: "c", 1: "a"},
    "unsorted": {"z": 1, "a": {"y": 2, "b": 3}},  # stored JSON sorts keys: the order seen is kept
    "huge": 7**9000,
    "name": os.fsdecode(b"invoice-\xff.pdf"),  # a lone surrogate, as os.listdir returns for a non-UTF-8 name
}


@tool
def lookup(key: str) -> Any:
    """Returns a value of another type than JSON's."""
    return RESULTS[key]


def _lookups() -> list[tuple[str, Any]]:
    return [(type(v).__name__, v) for v in (lookup(k) for k in RESULTS)]


def test_results_are_served_with_the_type_and_value_the_recorded_run_saw(dataset: Path) -> None:
    original, _, _ = record(dataset, "types", _lookups)
    result = rerun(_lookups, dataset=dataset, session_id="types")
    assert result.matched, result.report()
    assert result.output == original
    assert [name for name, _ in result.output] == [type(v).__name__ for v in RESULTS.values()]
    assert list(result.output[2][1]) == ["b", "a"]  # OrderedDict keeps its order
    assert json.dumps(result.output[9][1]) == '{"z": 1, "a": {"y": 2, "b": 3}}'  # and so does a plain dict


@tool
def limits() -> Any:
    """Returns a defaultdict: its factory is code, which a recording cannot hold."""
    return collections.defaultdict(int, {"acme": 5000})


def test_a_result_whose_type_cannot_be_rebuilt_is_refused_not_served_as_another_type(dataset: Path) -> None:
    original, _, _ = record(dataset, "dd", lambda: limits()["nobody"])
    assert original == 0
    relaxed = rerun(lambda: limits()["nobody"], dataset=dataset, session_id="dd")
    assert not relaxed.matched and "could not hold" in str(relaxed.error)
    assert "collections.defaultdict" in str(relaxed.error)


def test_encoding_accepts_exact_types_only() -> None:
    class Mine(dict):  # type: ignore[type-arg]
        pass

    with pytest.raises(TypeError, match="Mine cannot be recorded"):
        encode_value(Mine(a=1))
    for value in RESULTS.values():
        back = decode_value(json.loads(json.dumps(encode_value(value))))
        assert type(back) is type(value) and back == value


# --- finding 7: a value that cannot be stored costs that event only --------------------------------------


def _draws_a_huge_number() -> int:
    values = [random.random() for _ in range(300)]  # a chunk of 256 is sealed mid-run
    return int(random.getrandbits(16_000) % 97 + len(values))


def test_an_int_past_4300_digits_is_recorded_and_served(dataset: Path) -> None:
    original, _, events = record(dataset, "huge", _draws_a_huge_number)  # raised CaptureError before
    assert events == 301
    result = rerun(_draws_a_huge_number, dataset=dataset, session_id="huge")
    assert result.matched and result.output == original


def _unstorable_step() -> float:
    # A boundary whose stored form JSON cannot hold (NaN, as a value no encoder touched).
    through = otel_replay._seam.through
    for _ in range(260):
        time.time()
    through(BoundaryCall("clock", "odd", stream=stream_key("clock", "odd"), arguments_text="[]"), lambda: float("nan"))
    return time.time()


def test_an_event_that_cannot_be_stored_is_dropped_alone_and_leaves_no_gap(
    dataset: Path, caplog: pytest.LogCaptureFixture
) -> None:
    telemetry = otel_replay.configure(dataset, service_name="rerun-tests", set_global=False)
    try:
        with recording("odd") as mode:
            _unstorable_step()
        telemetry.force_flush()
    finally:
        telemetry.shutdown()
    assert mode is not None and mode.dropped == 1 and mode.events == 261
    assert "dropped the clock odd event" in caplog.text
    with Store(dataset) as store:
        loaded = load_recording(store, "odd")  # refused as "out of order" before: the dropped event left a gap
    assert [e.seq for e in loaded.events] == list(range(261)) and loaded.complete
    assert "dropped 1 event(s)" in loaded.outcome


# --- finding 5: every random draw is recorded and served ------------------------------------------------

VENDORS = [f"vendor-{i}" for i in range(1000)]


def _draws() -> tuple[Any, ...]:
    a = random.sample(VENDORS, k=3, counts=[1] * len(VENDORS))
    b = random.sample(population=VENDORS, k=3)
    c = random.choices(population=VENDORS, k=3)
    d = random.choice(seq=VENDORS)
    variates = (
        random.lognormvariate(0, 1),
        random.gammavariate(2, 2),
        random.paretovariate(3),
        random.weibullvariate(1, 2),
        random.vonmisesvariate(0, 1),
    )
    return a, b, c, d, variates


def test_every_random_draw_is_recorded_and_served(dataset: Path) -> None:
    random.seed(1)
    original, _, events = record(dataset, "draws", _draws)
    assert events == 9
    random.seed(2)  # a rerun drawing from the generator would now get other values
    result = rerun(_draws, dataset=dataset, session_id="draws")
    assert result.output == original
    assert result.matched and not result.leaks and not result.warnings


def _other_reads() -> tuple[Any, ...]:
    """Clock and entropy reads beside time.time() and uuid4: each differs from run to run."""
    return (
        str(uuid.uuid1()),
        time.clock_gettime_ns(time.CLOCK_REALTIME),
        time.clock_gettime(time.CLOCK_MONOTONIC),
        time.process_time_ns(),
        time.thread_time(),
        tuple(time.localtime()),
        tuple(time.gmtime()),
        time.ctime(),
        time.asctime(),
        time.strftime("%Y-%m-%d %H:%M:%S"),
        time.strftime("%Y", time.gmtime(0)),  # given its time: no read of the clock, nothing recorded
    )


def test_the_other_clock_and_uuid_reads_are_recorded_and_served(dataset: Path) -> None:
    """uuid1, clock_gettime, process and thread time, and the current local time were read live in a rerun
    that still said matched: its output differed from the recording's."""
    original, _, events = record(dataset, "reads", _other_reads)
    assert events == 10
    result = rerun(_other_reads, dataset=dataset, session_id="reads")
    assert result.output == original
    assert result.matched and not result.leaks and not result.warnings, result.report()


@pytest.mark.parametrize("make", [random.Random, random.SystemRandom], ids=["Random", "SystemRandom"])
def test_a_generator_of_the_agents_own_is_recorded_and_served(dataset: Path, make: Any) -> None:
    original, _, _ = record(dataset, "own", lambda: make().random())
    result = rerun(lambda: make().random(), dataset=dataset, session_id="own")
    assert result.output == original or not result.matched


_BOUND_BEFORE = {"time": time.time, "uuid4": uuid.uuid4, "now": datetime.datetime.now}
"""Functions an agent module bound at import (``from time import time``), before any recording started."""


@pytest.mark.parametrize("name", sorted(_BOUND_BEFORE))
def test_a_clock_or_entropy_function_bound_before_recording_is_recorded_or_reported(dataset: Path, name: str) -> None:
    original, _, _ = record(dataset, "bound", lambda: str(_BOUND_BEFORE[name]()))
    result = rerun(lambda: str(_BOUND_BEFORE[name]()), dataset=dataset, session_id="bound")
    assert result.output == original or not result.matched


# --- finding 8: a recording stopped by Ctrl-C ends its rerun early ----------------------------------------


@tool
def wait_for_approval() -> str:
    """The user pressed Ctrl-C while the recorded run waited here."""
    if os.environ.get("RCODEC_INTERRUPT"):
        raise KeyboardInterrupt
    return "approved"


def _approval() -> str:
    time.time()
    return wait_for_approval()


def test_an_interrupted_recording_ends_its_rerun_early_without_raising_keyboardinterrupt(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RCODEC_INTERRUPT", "1")
    with pytest.raises(KeyboardInterrupt):
        record(dataset, "stopped", _approval)
    monkeypatch.delenv("RCODEC_INTERRUPT")
    for governance in ("relaxed", "strict"):
        result = rerun(_approval, dataset=dataset, session_id="stopped", governance=governance)  # type: ignore[arg-type]
        assert not result.matched and result.ended_early, result.report()
        assert "interrupted here" in str(result.error) and "KeyboardInterrupt" in str(result.error)


def _stopped_between_calls() -> str:
    time.time()
    if os.environ.get("RCODEC_INTERRUPT"):
        raise KeyboardInterrupt  # Ctrl-C while the agent computes: no call is running
    return wait_for_approval()


def test_a_run_stopped_between_calls_reruns_up_to_where_it_stopped(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RCODEC_INTERRUPT", "1")
    with pytest.raises(KeyboardInterrupt):
        record(dataset, "between", _stopped_between_calls)
    monkeypatch.delenv("RCODEC_INTERRUPT")
    result = rerun(_stopped_between_calls, dataset=dataset, session_id="between", governance="strict")
    assert result.ended_early and not result.matched, result.report()
    assert "ended early" in str(result.error)  # not a tool call "the recording does not hold"


@tool
def shut_down() -> None:
    """Ends the process, as some tools do."""
    sys.exit(3)


def test_a_tool_that_exits_is_reproduced_and_matches(dataset: Path) -> None:
    with pytest.raises(SystemExit):
        record(dataset, "exits", shut_down)
    result = rerun(shut_down, dataset=dataset, session_id="exits")
    assert result.matched and result.error == "SystemExit: 3", result.report()


# --- finding 9: a whole-process recording keeps how the process ended -------------------------------------

_PROCESS = """
import sys, random, otel_replay
from otel_replay.rerun.autostart import RecordingInstrumentor
otel_replay.configure(sys.argv[1], service_name="whole-process", set_global=True)
RecordingInstrumentor().instrument()
random.random()
if sys.argv[2] == "crash":
    raise RuntimeError("agent crashed")
if sys.argv[2] == "exit":
    sys.exit(3)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "code", "outcome"),
    [
        ("crash", 1, "raised builtins:RuntimeError: agent crashed"),
        ("exit", 3, "raised builtins:SystemExit: 3"),
        ("ok", 0, "returned"),
    ],
)
def test_a_whole_process_recording_records_how_the_process_ended(
    dataset: Path, zygote: Zygote, how: str, code: int, outcome: str
) -> None:
    env = {**os.environ, "OTEL_REPLAY_RECORD_SESSION": "whole"}
    done = run_script(zygote, _PROCESS, str(dataset), how, env=env, raises=how == "crash")
    assert done.returncode == code, done.stderr
    if how == "crash":
        assert "RuntimeError: agent crashed" in done.stderr  # the chained hook still prints the traceback
    with Store(dataset) as store:
        assert load_recording(store, "whole").outcome == outcome


# --- lower: an error needing more than a message keeps its type ----------------------------------------


class QuotaError(Exception):
    """An error with fields: cannot be built from its message alone."""

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@tool
def charge() -> str:
    """Raises an error with fields."""
    raise QuotaError("over quota", retry_after=2.0)


def _charges() -> str:
    try:
        return charge()
    except QuotaError as exc:
        return f"fallback: {exc}"


def test_a_recorded_error_that_needs_more_than_a_message_is_raised_with_its_type(dataset: Path) -> None:
    original, _, _ = record(dataset, "quota", _charges)
    result = rerun(_charges, dataset=dataset, session_id="quota")
    assert result.output == original == "fallback: over quota" and result.matched


# --- codec 1: a recording made before codec 2 still reruns as it did ----------------------------------------

AMOUNT = [decimal.Decimal("100.00")]


@tool
def legacy_transfer(account: str, amount: Any) -> dict[str, Any]:
    """The tool the codec-1 recording below called."""
    return {"ok": True, "amount": str(amount)}


@tool
def legacy_tag(labels: Any) -> list[str]:
    """Takes a dict with a "$" key: codec 1 wrote it as is, codec 2 escapes it."""
    return sorted(labels)


def _legacy_agent() -> tuple[Any, ...]:
    t = time.time()
    a = legacy_transfer("acme", AMOUNT[0])
    b = legacy_tag({"$ref": "inv-1"})
    return a["ok"], b, random.random() < 2, t > 0


# Recorded by otel-replay 3873eba (codec 1) from this very agent: its final chunk's attributes, as stored.
_LEGACY_EVENTS = (
    '[{"a":"[[],{}]","b":"clock","h":"56bf23595724dc62298a2dc75c2578d2","n":"time.time","q":0,'
    '"s":"clock|time.time|tests.rerun.test_rerun_codec:_legacy_agent|","th":"MainThread","v":1795698680.887761},'
    '{"a":"{\\"account\\":\\"acme\\",\\"amount\\":{\\"$object\\":\\"decimal.Decimal\\"}}","b":"tool",'
    '"h":"cc39a34c56a56610eeac71663a95f623","n":"legacy_transfer","q":1,"s":"tool|legacy_transfer||",'
    '"th":"MainThread","v":{"amount":"100.00","ok":true}},'
    '{"a":"{\\"labels\\":{\\"$ref\\":\\"inv-1\\"}}","b":"tool","h":"6abd29c5a13c73d8cc4067a26b74ea26",'
    '"n":"legacy_tag","q":2,"s":"tool|legacy_tag||","th":"MainThread","v":["$ref"]},'
    '{"a":"[[],{}]","b":"entropy","h":"fe6a48ce86b377f71394247376140b25","n":"random.random","q":3,'
    '"s":"entropy|random.random|tests.rerun.test_rerun_codec:_legacy_agent|","th":"MainThread",'
    '"v":0.09100660113820525}]'
)
_LEGACY_FINGERPRINT = "88e17ee3796408d6fb13b43dce35ce17a8485826c7e5369851a437719b6d524e"


def _write_legacy(dataset: Path) -> None:
    telemetry = otel_replay.configure(dataset, set_global=False)
    try:
        attrs = {
            sc.KIND: sc.KIND_RECORDING,
            sc.RECORD_SOURCE: "recording",
            sc.SESSION_ID: "legacy",
            sc.RECORD_ID: "legacy-chunk-0",
            sc.RECORDING_FORMAT: 1,
            sc.RECORDING_ID: "1bfe538d2b996e51d5efe1ab6a47e2d5",
            sc.RECORDING_CHUNK: 0,
            sc.RECORDING_FIRST_SEQ: 0,
            sc.RECORDING_EVENTS: _LEGACY_EVENTS,
            sc.RECORDING_FINAL: True,
            sc.RECORDING_FINGERPRINT: _LEGACY_FINGERPRINT,
            sc.RECORDING_OUTCOME: "returned",
        }
        get_recorder().emit(sc.SPAN_RECORDING, "legacy-chunk-0", attrs)
        telemetry.force_flush()
    finally:
        telemetry.shutdown()


def test_a_codec_1_recording_still_reruns_and_matches(dataset: Path) -> None:
    _write_legacy(dataset)
    with Store(dataset) as store:
        loaded = load_recording(store, "legacy")
    assert loaded.codec == 1
    # Its stored fingerprint is the version-1 digest of its events (hashed with codec 1): recognised, it is
    # compared by the version-2 digest a rerun computes now.
    assert loaded.fingerprint != _LEGACY_FINGERPRINT
    result = rerun(_legacy_agent, dataset=dataset, session_id="legacy")
    assert result.matched, result.report()
    assert result.fingerprint == loaded.fingerprint and result.output == (True, ["$ref"], True, True)
    # Codec 1 compared a Decimal by type only; its recordings keep that meaning (record again for codec 2).
    AMOUNT[0] = decimal.Decimal("1000000.00")
    try:
        assert rerun(_legacy_agent, dataset=dataset, session_id="legacy").matched
    finally:
        AMOUNT[0] = decimal.Decimal("100.00")


def test_a_new_recording_is_format_4_and_compares_by_value(dataset: Path) -> None:
    record(dataset, "fresh", _legacy_agent)
    with Store(dataset) as store:
        rows = store.run("rerun_events", session_id="fresh")
        assert load_recording(store, "fresh").codec == 4
    assert {json.loads(r["attributes"])[sc.RECORDING_FORMAT] for r in rows} == {4}
    AMOUNT[0] = decimal.Decimal("1000000.00")
    try:
        assert not rerun(_legacy_agent, dataset=dataset, session_id="fresh").matched
    finally:
        AMOUNT[0] = decimal.Decimal("100.00")


# --- lower: what the entrypoint returned, when the recording is told -------------------------------------


@tool
def quote(symbol: str) -> dict[str, float]:
    """A price quote."""
    return {"price": 101.5}


def _orders() -> dict[str, float]:
    return {"order_qty": round(10_000 / quote("ACME")["price"], 2)}


def _orders_with_a_units_bug() -> dict[str, float]:
    return {"order_qty": round(1_000_000 / quote("ACME")["price"], 2)}


def test_a_rerun_returning_another_value_than_the_recorded_run_does_not_match(dataset: Path) -> None:
    telemetry = otel_replay.configure(dataset, service_name="rerun-tests", set_global=False)
    try:
        with recording("output") as mode:
            assert mode is not None
            mode.set_output(_orders())
        telemetry.force_flush()
    finally:
        telemetry.shutdown()
    assert rerun(_orders, dataset=dataset, session_id="output").matched
    other = rerun(_orders_with_a_units_bug, dataset=dataset, session_id="output")
    assert not other.matched and other.divergence is not None, other.report()
    assert "returned another value" in other.divergence.reason and "9852.22" in other.divergence.actual


def _opens_a_non_utf8_name() -> None:
    time.time()
    raise FileNotFoundError(os.fsdecode(b"invoice-\xff.pdf"))


def test_a_run_ending_in_an_error_that_names_a_non_utf8_file_is_recorded_whole(dataset: Path) -> None:
    # The outcome's lone surrogate made the final chunk unsealable: CaptureError replaced the agent's own error.
    with pytest.raises(FileNotFoundError):
        record(dataset, "name", _opens_a_non_utf8_name)
    with Store(dataset) as store:
        loaded = load_recording(store, "name")
    assert loaded.complete and loaded.outcome == "raised builtins:FileNotFoundError: invoice-\\udcff.pdf"
    assert rerun(_opens_a_non_utf8_name, dataset=dataset, session_id="name").matched


def test_other_mappings_and_sequences_are_compared_by_value_with_their_type() -> None:
    import types

    proxy = stable_json({"m": types.MappingProxyType({"a": 1})})
    assert proxy == stable_json({"m": types.MappingProxyType({"a": 1})}) != stable_json({"m": {"a": 1}})
    assert proxy != stable_json({"m": types.MappingProxyType({"a": 2})})
    assert stable_json(collections.deque([1, 2])) != stable_json(collections.deque([2, 1]))
    assert "$unmatchable" not in proxy + stable_json(collections.deque([1]))


def test_an_event_numbered_past_float_range_is_a_one_line_dataset_error(dataset: Path) -> None:
    from otel_replay.errors import DatasetError

    from .test_rerun_safety import _emit_chunk

    events = '[{"q": 1e400, "b": "clock", "n": "time.time", "s": "x", "a": "[]", "h": "0"}]'
    _emit_chunk(dataset, "inf", "chunk-inf", version=1, events=events)
    with pytest.raises(DatasetError, match="recording chunk chunk-inf of session 'inf': the number 1e400 is too large"):
        rerun(time.time, dataset=dataset, session_id="inf")


# --- rev-rr2: an Action whose type is a StrEnum --------------------------------------------------------


class Kind(enum.StrEnum):
    PAY = "pay"


_LEDGER = otel_replay.ReferenceLedger(balance=1_000)


@tool(side_effect="financial", gate=otel_replay.ActionGate(_LEDGER), snapshot=otel_replay.DependencySnapshot({"b": 1}))
def pay_enum(amount: float) -> otel_replay.Action:
    """A gated tool whose action type is an enum member."""
    return otel_replay.Action(Kind.PAY, {"to": "acme"}, cost=amount)


def _pays_enum() -> str:
    return str(pay_enum(12.5).receipt_id)


def test_an_action_typed_by_a_str_enum_reruns_to_a_match(dataset: Path) -> None:
    assert type(otel_replay.Action(Kind.PAY).type) is str  # kept as the plain string it is stored as
    original, _, _ = record(dataset, "enum", _pays_enum)
    result = rerun(_pays_enum, dataset=dataset, session_id="enum", governance="strict")
    assert result.matched and result.output == original, result.report()


class _Masked(str):
    """A string type that masks itself when printed."""

    def __str__(self) -> str:
        return "***"


class _Hidden(list[int]):
    def __iter__(self) -> Any:
        return iter([])


def test_a_subclass_of_a_value_type_is_compared_by_its_value_not_its_own_str_or_iter() -> None:
    assert stable_json(_Masked("key-a")) != stable_json(_Masked("key-b"))  # once both '***': the same argument
    assert stable_json(_Hidden([1])) != stable_json(_Hidden([2]))
    assert stable_json(_Masked("x")) == '{"$typed":["' + __name__ + ':_Masked","x"]}'


@tool
def settle() -> Any:
    """A tool handing back a receipt whose amount JSON cannot hold."""
    from otel_replay.gate import Receipt

    return Receipt("r-1", "vendor_payment", decimal.Decimal("12.50"))  # type: ignore[arg-type]


def test_a_receipt_json_cannot_hold_is_stored_unrecordable_not_dropped(dataset: Path) -> None:
    output, _, events = record(dataset, "receipt", lambda: settle().receipt_id)
    assert output == "r-1" and events == 1  # the event was dropped when written, before
    with Store(dataset) as store:
        (event,) = load_recording(store, "receipt").events
    assert "$.amount is a Decimal" in event.value["$unrecordable"]
    with pytest.raises(ReplayMismatchError, match="could not hold"):
        rerun(lambda: settle().receipt_id, dataset=dataset, session_id="receipt", governance="strict")


# --- a loaded value's text in one pass ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("stored", "one_pass"),
    [
        ('{"b":1,"a":[1,2.5,null,true,"é","😀"]}', True),
        ('{"status":200,"body":"{\\"q\\": 1}","headers":[["a","b"]]}', True),
        ("[" * 256 + "]" * 256, True),
        ('{"$b64":"AAEC"}', False),  # a "$" key: stable_json escapes it as "$$b64"
        ('["$5.00"]', False),  # text starting with "$": declined too (safe, not needed)
        ('{"k":"\\ud800"}', False),  # a lone surrogate: tagged by stable_json
        ('{"\\udc00":1}', False),
        ("[" * 258 + "]" * 258, False),  # deeper than stable_json goes: unmatchable there
        ("[" + "9" * 3950 + "]", False),  # an int wider than 13,000 bits: written in hex there
        ('{"a":1e308,"b":-0.0,"c":' + "9" * 3000 + "}", True),
    ],
)
def test_a_decoded_values_text_is_stable_jsons_or_declined(stored: str, one_pass: bool) -> None:
    value = json.loads(stored)
    text = decoded_json_text(value)
    assert (text is not None) == one_pass
    if text is not None:
        assert text == stable_json(value)


def test_a_decoded_values_text_is_never_other_than_stable_jsons_on_random_hostile_values() -> None:
    pieces = ["a", "$", '"', "\\", "{", "[", "é", "\udcff", " ", "0"]
    rng = random.Random(19)

    def value(depth: int = 0) -> Any:
        roll = rng.random()
        if depth > 4 or roll < 0.3:
            choices = [None, True, False, rng.randint(-(10**20), 10**20), rng.random() * 1e6]
            return rng.choice([*choices, "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))])
        if roll < 0.65:
            return [value(depth + 1) for _ in range(rng.randint(0, 4))]
        return {"".join(rng.choice(pieces) for _ in range(rng.randint(0, 3))): value(depth + 1) for _ in range(3)}

    taken = 0
    for _ in range(3000):
        made = value()
        text = decoded_json_text(made)
        if text is not None:
            taken += 1
            assert text == stable_json(made), made
    assert taken > 500  # most values are taken in one pass


_HOSTILE = {
    "b": [1, 2.5, -0.0, float("inf"), None, True],
    "a": 'é"\n\u2028\udc80',
    "$c": {},
    3: {1, 2},
    "d": decimal.Decimal("1.10"),
    "t": datetime.datetime(2026, 1, 2, 3, 4, 5),
    "u": uuid.UUID(int=5),
    "n": 10**40,
}
_HOSTILE_TEXT = (
    '{"$items":[["\\"$c\\"",{}],["\\"a\\"",{"$surrogates":"c3a9220ae280a8edb280"}],'
    '["\\"b\\"",[1,2.5,-0.0,Infinity,null,true]],["\\"d\\"",{"$decimal":"1.10"}],'
    '["\\"n\\"",10000000000000000000000000000000000000000],["\\"t\\"",{"$datetime":"2026-01-02T03:04:05","tz":null}],'
    '["\\"u\\"",{"$uuid":"00000000000000000000000000000005"}],["3",{"$set":["builtins:set",[1,2]]}]]}'
)


@pytest.mark.parametrize("codec", [2, 3, 4])
def test_arguments_are_written_as_recordings_made_before_wrote_them(codec: int) -> None:
    # Written by the code before the canonical JSON encoder was built once (2026-11-29): a recorded hash
    # must still equal its rerun's.
    with arguments_codec(codec):
        assert stable_json(_HOSTILE) == _HOSTILE_TEXT


def test_canonical_json_of_a_tree_is_json_dumps_text_and_a_loop_is_never_written_as_one() -> None:
    tree = json.loads('{"z": [1, 1e300, -0.0, "\\u00e9\\"\\n\\u2028"], "a": {"$k": null, "b": false}, "m": 1e-7}')
    plain = json.dumps(tree, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    assert tree_json(tree) == plain
    assert decoded_json_text(tree) is None  # a "$" key: stable_json escapes it, so not this text
    del tree["a"]["$k"]
    assert (
        decoded_json_text(tree)
        == stable_json(tree)
        == json.dumps(tree, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    )
    loop: list[Any] = []
    loop.append(loop)
    assert decoded_json_text([loop]) is None  # never raised into the agent, never a text
    assert stable_json(loop) == '[{"$cycle":1}]'  # marked where it loops back, as before
