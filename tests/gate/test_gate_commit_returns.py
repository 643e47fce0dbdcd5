"""The gate's money path: commit() always returns, no receipt is dropped or called done early."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_replay
from otel_replay import (
    Action,
    ActionGate,
    AlreadyCompensated,
    FixAction,
    Receipt,
    ReferenceLedger,
    Verdict,
    audit,
)
from otel_replay.capture.recorder import Recorder, set_recorder
from otel_replay.cli import main
from otel_replay.errors import CompensationInProgress, ConfigError, GateError
from otel_replay.gate import reads
from otel_replay.gate.claims import ClaimState, CompensationClaims, idempotency_key
from otel_replay.gate.receipts import stored_receipt
from otel_replay.integrity import SigningKey

from .._support import payment, snapshot
from .test_gate_compensation import _execute

STALE = {"budget_remaining": 100, "allow_list": ["acme-supplies"]}  # every payment is a ROLLBACK now
KEY = SigningKey(b"k" * 32)


def _commit(dataset: Path, rail: Any, *actions: Action) -> str:
    """One sealed decision committing ``actions`` through ``rail``; returns the decision id."""
    telemetry = otel_replay.configure(dataset, set_global=False)
    gate = ActionGate(rail, dataset=dataset)
    with audit("vendor_payment", snapshot=snapshot()) as d:
        d.act(payment())
        for action in actions:
            gate.commit(action, record_id=d.record_id)
    telemetry.shutdown()
    return d.record_id


# --- 1: two different commits returning one receipt id are refused, never dropped --------------------------


class InvoiceRail:
    """A rail whose receipt id names the invoice: two partial payments of one invoice share it."""

    def __init__(self) -> None:
        self.charged: list[float] = []
        self.refunded: list[float] = []

    def commit(self, action: Action) -> dict:
        self.charged.append(action.cost or 0)
        return {"receipt_id": action.arguments["invoice"], "amount": action.cost}

    def compensate(self, receipt: Any, *, idempotency_key: str) -> None:
        self.refunded.append(receipt["amount"])


def _invoice(invoice: str, cost: float) -> Action:
    return Action("vendor_payment", {"recipient": "acme-supplies", "invoice": invoice}, cost=cost)


def test_two_commits_sharing_a_receipt_id_are_refused_by_name_while_the_others_are_refunded(dataset, caplog):
    rail = InvoiceRail()
    record_id = _commit(dataset, rail, _invoice("INV-1", 100), _invoice("INV-1", 4100), _invoice("INV-2", 7))
    assert f"returned receipt id INV-1 again for decision {record_id}" in caplog.text  # said at commit time too
    with otel_replay.open(dataset) as store:
        gate_ids = [g for g, _ in reads.commits_for(store, record_id)]
    with pytest.raises(GateError, match="2 different commits returned receipt id INV-1") as refused:
        _execute(dataset, record_id, rail)
    assert all(g in str(refused.value) for g in gate_ids[:2])  # both commits named, with their content
    assert '"amount":100' in str(refused.value) and '"amount":4100' in str(refused.value)
    assert rail.refunded == [7]  # the receipt with an id of its own is still refunded; neither INV-1 is
    assert any("receipt INV-2: rolled_back" in note for note in refused.value.__notes__)


# --- 2: a receipt whose conversion raises anything: commit() still returns it ---------------------------------


class LazyReceipt(Mapping):
    """A rail SDK's response object: iterating it fails while the SDK refreshes it."""

    def __getitem__(self, key: str) -> Any:
        return {"receipt_id": "ch_1", "amount": 42}[key]

    def __len__(self) -> int:
        return 2

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("dictionary changed size during iteration")


class LazyRail:
    def __init__(self) -> None:
        self.charges: list[float] = []

    def commit(self, action: Action) -> LazyReceipt:
        self.charges.append(action.cost or 0)
        return LazyReceipt()

    def compensate(self, receipt: Any, *, idempotency_key: str) -> None:
        raise AssertionError("not called here")


def test_a_receipt_whose_conversion_raises_is_returned_and_recorded_by_repr(dataset):
    rail = LazyRail()
    telemetry = otel_replay.configure(dataset, set_global=False)
    try:
        receipt = ActionGate(rail, dataset=dataset).commit(payment(42), record_id="d-lazy")
    finally:
        telemetry.shutdown()
    assert isinstance(receipt, LazyReceipt) and rail.charges == [42]  # returned once: nobody charges again
    with otel_replay.open(dataset) as store:
        (stored,) = reads.receipts_for(store, "d-lazy")
    assert "LazyReceipt" in stored["repr"]


# --- 3: receipts that refer back to themselves, or share parts, are stored at once -----------------------------


def _in_time(func: Any, seconds: float = 30.0) -> Any:
    """``func()``'s result, failing (not hanging the suite) if it does not return within ``seconds``."""
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(func()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert result, f"did not return within {seconds} s"
    return result[0]


def test_a_self_referencing_receipt_is_committed_and_stored_with_its_cycles_marked(dataset):
    class GraphRail(InvoiceRail):
        def commit(self, action: Action) -> dict:  # type: ignore[override]
            self.charged.append(action.cost or 0)
            receipt: dict[str, Any] = {"receipt_id": "ch_1", "amount": action.cost}
            receipt["self"] = receipt
            receipt["parent"] = receipt  # back-references, as SDK object graphs have
            return receipt

    rail = GraphRail()
    telemetry = otel_replay.configure(dataset, set_global=False)
    try:
        receipt = _in_time(lambda: ActionGate(rail, dataset=dataset).commit(payment(42), record_id="d-cycle"))
    finally:
        telemetry.shutdown()
    assert receipt["receipt_id"] == "ch_1" and rail.charged == [42]
    with otel_replay.open(dataset) as store:
        (stored,) = reads.receipts_for(store, "d-cycle")
    assert stored == {"receipt_id": "ch_1", "amount": 42, "self": "<cycle>", "parent": "<cycle>"}


def test_a_receipt_sharing_one_part_at_every_level_is_cut_not_expanded_exponentially():
    part: Any = {"leaf": 1}
    for _ in range(30):
        part = [part, part]  # 2**30 paths to the leaf, yet a handful of objects
    stored = _in_time(lambda: stored_receipt({"receipt_id": "ch_2", "graph": part}))
    assert stored["receipt_id"] == "ch_2" and "<cut: more than" in json.dumps(stored)
    assert len(json.dumps(stored)) < 1_000_000


# --- 4: a compensation in progress elsewhere is not reported as done --------------------------------------------


def test_a_receipt_being_compensated_elsewhere_is_pending_not_done(dataset):
    ledger = ReferenceLedger(10_000)
    record_id = _commit(dataset, ledger, payment(4200), payment(100))
    key = idempotency_key(record_id, "rcpt-0002")
    claims = CompensationClaims(dataset)
    held = claims.claim(key, decision_id=record_id, receipt_id="rcpt-0002")  # another claimant, mid rail call
    try:
        with pytest.raises(CompensationInProgress, match="rcpt-0002 is being compensated by") as pending:
            _execute(dataset, record_id, ledger)
        assert any("receipt rcpt-0001: rolled_back" in note for note in pending.value.__notes__)
        assert ledger.balance == 10_000 - 100  # the other receipt was refunded; this one is not done
    finally:
        claims.finish(held, ClaimState.FAILED, error="ConnectionError: rail timed out")  # and its rail failed
    outcomes = _execute(dataset, record_id, ledger, resume=True)  # so it is still owed, and a resume pays it
    assert [o.executed for o in outcomes] == ["rolled_back", "already_compensated"]
    assert ledger.balance == 10_000


def test_the_cli_exits_non_zero_while_a_receipt_is_being_compensated_elsewhere(dataset, tmp_path, monkeypatch):
    ledger_file = tmp_path / "ledger.json"
    monkeypatch.setenv("OTEL_REPLAY_TEST_LEDGER", str(ledger_file))
    from ..rails import file_ledger

    record_id = _commit(dataset, file_ledger(), payment(4200))
    with otel_replay.open(dataset) as store:
        (stored,) = reads.receipts_for(store, record_id)
    claims = CompensationClaims(dataset)
    held = claims.claim(idempotency_key(record_id, stored["receipt_id"]), decision_id=record_id, receipt_id="r")
    try:
        (tmp_path / "live.json").write_text(json.dumps(STALE))
        args = ["replay", record_id, "-d", str(dataset), "--live-state", str(tmp_path / "live.json")]
        args += ["--policy", "otel_replay.demo:budget_policy", "--execute", "--rail", "tests.rails:file_ledger"]
        result = CliRunner().invoke(main, args)
    finally:
        claims.release(held)
    assert result.exit_code == 1, result.output
    assert "in progress elsewhere" in result.output and "a bug in otel-replay" not in result.output


# --- 5: a tracer that cannot hold the record is refused before the money moves ----------------------------------


def test_a_provider_with_a_length_limit_is_refused_before_the_block_and_the_commit_run():
    provider = TracerProvider(span_limits=SpanLimits(max_span_attribute_length=8192))
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    ledger = ReferenceLedger(10_000)
    previous = set_recorder(Recorder(provider.get_tracer("tests"), key=KEY))
    ran = []
    try:
        with pytest.raises(ConfigError, match="cuts span attribute values to 8192"):
            with audit("vendor_payment", snapshot=snapshot()) as d:
                ran.append(d)
        with pytest.raises(ConfigError, match="cuts span attribute values to 8192"):
            ActionGate(ledger).commit(payment())
    finally:
        set_recorder(previous)
        provider.shutdown()
    assert ran == [] and ledger.balance == 10_000 and ledger.entries == []  # nothing ran, nothing charged


# --- 7: a flush that does not finish does not hold the commit ---------------------------------------------------


class StuckExporter(SpanExporter):
    """An exporter whose collector does not answer until released (OTLP retrying a collector that is down)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def export(self, spans: Any) -> SpanExportResult:
        self.release.wait(60)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()


class ProviderPipeline:
    """A pipeline that is just the user's own SDK provider."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider

    @property
    def closed(self) -> bool:
        return False

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.provider.force_flush(timeout_millis)


@contextmanager
def stuck_recorder() -> Iterator[Recorder]:
    """The active recorder, on a provider whose exporter does not answer until the block ends."""
    exporter = StuckExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=60_000))  # exported by the flush
    recorder = Recorder(provider.get_tracer("tests"), key=KEY, pipeline=ProviderPipeline(provider))
    previous = set_recorder(recorder)
    try:
        yield recorder
    finally:
        set_recorder(previous)
        exporter.release.set()
        provider.shutdown()


def test_a_commit_whose_flush_does_not_finish_returns_within_its_timeout(caplog):
    ledger = ReferenceLedger(10_000)
    with stuck_recorder() as recorder:
        started = time.monotonic()
        receipt = ActionGate(ledger, flush_timeout=0.5).commit(payment(), record_id="d-slow")
        took = time.monotonic() - started
    assert receipt.receipt_id == "rcpt-0001" and ledger.balance == 5_800
    assert took < 30  # not the SDK's 30 s flush (no timing claim beyond that: the machine is shared)
    assert recorder.stats.capture_errors == 1
    assert "was not flushed to the dataset within 0.5 s" in caplog.text


def test_a_compensation_whose_flush_does_not_finish_returns_within_the_gates_timeout(caplog, tmp_path):
    ledger = ReferenceLedger(10_000)
    with stuck_recorder() as recorder:
        receipt = ledger.commit(payment())
        gate = ActionGate(ledger, dataset=tmp_path / "ds", flush_timeout=0.5)
        started = time.monotonic()
        outcome = gate.enforce_post_commit(Verdict(FixAction.ROLLBACK, False, "stale", "d-slow"), receipt=receipt)
        took = time.monotonic() - started
    assert outcome.executed == "rolled_back" and ledger.balance == 10_000  # the refund happened, once
    assert took < 30  # not the SDK's 30 s flush (no timing claim beyond that: the machine is shared)
    assert recorder.stats.capture_errors == 1
    assert "compensation was not flushed to the dataset within 0.5 s" in caplog.text


# --- 8: the CLI says what this run refunded and what the rail refused -------------------------------------------

_RAILS = """
import json, os
from otel_replay import ReferenceLedger

class Refusing(ReferenceLedger):
    def compensate(self, receipt, *, idempotency_key):
        if receipt.receipt_id == "rcpt-0002":
            raise RuntimeError("card network declined the refund")
        super().compensate(receipt, idempotency_key=idempotency_key)

def refusing():
    return Refusing(10_000)
"""


def test_the_cli_names_what_was_refunded_when_the_rail_refuses_a_receipt(dataset, tmp_path, monkeypatch):
    record_id = _commit(dataset, ReferenceLedger(10_000), payment(4200), payment(100))
    (tmp_path / "second_rails.py").write_text(_RAILS)
    (tmp_path / "live.json").write_text(json.dumps(STALE))
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["replay", record_id, "-d", str(dataset), "--live-state", str(tmp_path / "live.json")]
    args += ["--policy", "otel_replay.demo:budget_policy", "--execute", "--rail", "second_rails:refusing"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    last = result.output.strip().splitlines()[-1]
    assert "receipt rcpt-0002: RuntimeError: card network declined the refund" in last
    assert "receipt rcpt-0001: rolled_back" in last
    assert "a bug in otel-replay" not in result.output


# --- 9: a dict rail gets its dict back, even one with Receipt's four keys ----------------------------------------


class FourKeyRail(InvoiceRail):
    def commit(self, action: Action) -> dict:  # type: ignore[override]
        self.charged.append(action.cost or 0)
        return {"receipt_id": "ch_9", "action_type": action.type, "amount": action.cost, "details": {"card": "x1"}}


def test_a_dict_rail_with_receipts_shaped_like_receipt_gets_its_dict_back(dataset):
    rail = FourKeyRail()
    record_id = _commit(dataset, rail, payment(42))
    (outcome,) = _execute(dataset, record_id, rail)
    assert outcome.executed == "rolled_back" and rail.refunded == [42]
    handed = {"receipt_id": "ch_9", "action_type": "vendor_payment", "amount": 42, "details": {"card": "x1"}}
    assert outcome.receipt == handed and type(outcome.receipt) is dict


def test_a_receipt_object_is_still_rebuilt_for_the_reference_ledger(dataset):
    ledger = ReferenceLedger(10_000)
    record_id = _commit(dataset, ledger, payment(4200))
    (outcome,) = _execute(dataset, record_id, ledger)
    assert isinstance(outcome.receipt, Receipt) and outcome.receipt.receipt_id == "rcpt-0001"
    assert ledger.balance == 10_000
    with pytest.raises(AlreadyCompensated):
        _execute(dataset, record_id, ledger)


def test_a_receipt_of_built_in_and_subclassed_values_is_stored_as_their_plain_json():
    """The exact built-in types take a shorter path; subclasses, odd numbers and odd text are stored as before."""
    import enum
    import math

    class Code(enum.IntEnum):
        OK = 7

    class Text(str):
        def __str__(self) -> str:
            return "overridden"

    receipt = {
        "receipt_id": "ch_3",
        "text": "r\u00e9sum\u00e9 \U0001f600",
        "lone": "a\ud800b",
        "int": 42,
        "huge": 1 << 20_000,
        "float": 2.5,
        "nan": float("nan"),
        "inf": float("inf"),
        "flag": True,
        "none": None,
        "code": Code.OK,
        "subtext": Text("kept"),
        "nested": [{"x": (1, 2.0, "y")}],
    }
    stored = stored_receipt(receipt)
    assert stored == {
        "receipt_id": "ch_3",
        "text": "r\u00e9sum\u00e9 \U0001f600",
        "lone": "a\\ud800b",
        "int": 42,
        "huge": hex(1 << 20_000),
        "float": 2.5,
        "nan": "nan",
        "inf": "inf",
        "flag": True,
        "none": None,
        "code": 7,
        "subtext": "kept",
        "nested": [{"x": [1, 2.0, "y"]}],
    }
    assert type(stored["code"]) is int and type(stored["subtext"]) is str
    assert not math.isnan(stored["float"])


def test_a_receipt_of_hostile_text_subclasses_is_stored_as_exact_text_that_canonical_json_holds():
    """Keys, ``__str__`` and ``isoformat`` results that are ``str`` subclasses (one refuses to be compared)."""
    import datetime as dt

    from otel_replay._json import canonical_json

    class Touchy(str):
        def __lt__(self, other: object) -> bool:
            raise RuntimeError("compared")

        def __gt__(self, other: object) -> bool:
            raise RuntimeError("compared")

    class Named:
        def __str__(self) -> str:
            return Touchy("named \ud800")

    class When(dt.date):
        def isoformat(self) -> str:
            return Touchy("2026-11-29")

    receipt = {
        "receipt_id": "ch_9",
        Touchy("b"): 1,
        Touchy("a\u00e9"): [Named(), When(2026, 11, 29)],
        7: {Touchy("x"): Named()},
    }
    stored = stored_receipt(receipt)
    named = "named \\ud800"
    assert stored == {"receipt_id": "ch_9", "b": 1, "a\u00e9": [named, "2026-11-29"], "7": {"x": named}}
    text = json.dumps(stored)
    assert all(type(key) is str for key in stored) and type(stored["a\u00e9"][0]) is str
    assert type(stored["a\u00e9"][1]) is str and type(next(iter(stored["7"]))) is str
    assert json.loads(canonical_json(stored, where="receipt")) == json.loads(text)
