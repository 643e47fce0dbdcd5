"""Only sealed, verified, unambiguous rows drive replay and the gate (copied, edited, unsealed rows never win)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import otel_replay
from otel_replay import (
    ActionGate,
    ConfigError,
    ConflictingRecords,
    FixAction,
    ReferenceLedger,
    UntrustedRecord,
    audit,
    replay,
)
from otel_replay import semconv as sc
from otel_replay.cli import main
from otel_replay.gate import reads
from otel_replay.integrity import SigningKey, load_signing_key, record_hash, restore_attributes

from .._support import budget_policy, payment, snapshot, timestamps_as_ints

LIVE = {"budget_remaining": 3_000, "allow_list": ["acme-supplies"]}


@pytest.fixture
def paid(tmp_path, dataset):
    """One sealed $4,200 payment, committed through a reference ledger; stale under LIVE (ROLLBACK)."""
    telemetry = otel_replay.configure(dataset, set_global=False)
    ledger = ReferenceLedger(10_000)
    with audit("vendor_payment", snapshot=snapshot()) as d:
        d.act(payment())
        ActionGate(ledger, dataset=dataset).commit(payment(), record_id=d.record_id)
    telemetry.shutdown()
    live = tmp_path / "live.json"
    live.write_text(json.dumps(LIVE))
    return d.record, live


class Rows(list):
    """A data file's rows with times as int ns, and the schema to write them back with."""

    schema: pa.Schema


def _rows(dataset: Path) -> tuple[Path, Rows]:
    # The gate flushes its commit record at once, so a dataset may hold several files: merged into one here.
    path, *others = sorted((dataset / "spans").rglob("*.parquet"))
    table = pa.concat_tables([pq.read_table(p) for p in (path, *others)])
    if others:
        pq.write_table(table, path)
        for other in others:
            other.unlink()
    rows = Rows(table.cast(pa.schema([f.with_type(timestamps_as_ints(f.type)) for f in table.schema])).to_pylist())
    rows.schema = table.schema
    return path, rows


def _write(path: Path, rows: list[dict], schema: pa.Schema) -> Path:
    plain = pa.schema([f.with_type(timestamps_as_ints(f.type)) for f in schema])
    pq.write_table(pa.Table.from_pylist(rows, schema=plain).cast(schema), path)
    return path


def _add_file(dataset: Path, rows: list[dict], schema: pa.Schema, name: str = "forged.parquet") -> Path:
    """Write extra rows into the dataset, as `sql COPY` or a foreign writer would."""
    (part,) = list((dataset / "spans").iterdir())
    return _write(part / name, rows, schema)


def _decision_row(rows: list[dict], record_id: str) -> dict:
    return next(r for r in rows if r["record_id"] == record_id and r["name"] == sc.SPAN_DECISION)


def _replay_cli(record_id: str, dataset: Path, live: Path, *extra: str):
    args = ["replay", record_id, "-d", str(dataset), "--live-state", str(live)]
    return CliRunner().invoke(main, [*args, "--policy", "otel_replay.demo:budget_policy", *extra])


def test_copied_decision_row_with_edited_cost_and_earlier_start_never_wins(paid, dataset):
    record, live = paid
    _, table = _rows(dataset)
    forged = dict(_decision_row(table, record.record_id))
    attrs = json.loads(forged["attributes"])
    attrs[sc.ACTION_COST] = 42  # the copied seal no longer matches
    forged["attributes"] = json.dumps(attrs)
    forged["span_id"] = "f" * 16
    forged["start_time"] -= 10**9
    path = _add_file(dataset, [dict(forged)], table.schema)
    with otel_replay.open(dataset) as store:
        report = store.verify(load_signing_key())
        assert not report.ok
        assert any(
            p.record_id == record.record_id and "hash mismatch" in p.problem and p.file == str(path)
            for p in report.problems
        )
        assert store.record(record.record_id) == record  # the original, never the copy
    result = _replay_cli(record.record_id, dataset, live)
    assert result.exit_code == 0 and "ROLLBACK" in result.output and "ALLOW" not in result.output


def test_duplicate_json_keys_are_refused_by_verify_replay_and_the_views(paid, dataset):
    record, live = paid
    path, rows = _rows(dataset)
    row = _decision_row(rows, record.record_id)
    row["attributes"] = '{"replay.action.cost":42,' + row["attributes"][1:]
    _write(path, rows, rows.schema)
    with otel_replay.open(dataset) as store:
        report = store.verify(load_signing_key())
        assert any("duplicate key 'replay.action.cost'" in p.problem for p in report.problems)
        with pytest.raises(UntrustedRecord, match="duplicate key"):
            store.record(record.record_id)
        assert store.rows("SELECT action_cost FROM decisions") == []  # refused, not shown as 42
    result = _replay_cli(record.record_id, dataset, live)
    assert result.exit_code == 1 and result.exception is not None and isinstance(result.exception, SystemExit)
    assert "duplicate key" in result.output and len(result.output.strip().splitlines()) == 1


def test_unsealed_gate_commit_posted_over_otlp_is_never_compensated(paid, dataset):
    """An unauthenticated OTLP sender posts a commit receipt for 999,999 to "attacker"."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from otel_replay.server import Receiver, ServerConfig

    record, live = paid
    receiver = Receiver(ServerConfig(dataset, grpc=None, http="127.0.0.1:0", convert_workers=0, flush_seconds=0.1))
    receiver.start()
    try:
        provider = TracerProvider()
        url = f"http://127.0.0.1:{receiver.http_address[1]}/v1/traces"
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=url, timeout=10)))
        receipt = {
            "receipt_id": "evil",
            "action_type": "vendor_payment",
            "amount": 999_999,
            "details": {"to": "attacker"},
        }
        tracer = provider.get_tracer("attacker")
        tracer.start_span(
            sc.SPAN_GATE,
            attributes={
                sc.KIND: sc.KIND_GATE,
                sc.RECORD_ID: "evil-gate",
                sc.GATE_STAGE: "commit",
                sc.GATE_EXECUTED: "committed",
                sc.GATE_DECISION_ID: record.record_id,
                sc.GATE_RECEIPT: json.dumps(receipt),
            },
            start_time=record.span.start_ns - 10,
        ).end()
        forged = record.to_attributes()
        forged[sc.ACTION_COST] = 1.0
        tracer.start_span(sc.SPAN_DECISION, attributes=forged, start_time=record.span.start_ns - 10).end()
        provider.shutdown()
    finally:
        receiver.stop()
    with otel_replay.open(dataset) as store:
        assert store.rows("SELECT count(*) AS n FROM gates WHERE gate_id = 'evil-gate'")[0]["n"] == 1  # it is stored
        assert [r["receipt_id"] for r in reads.receipts_for(store, record.record_id)] == ["rcpt-0001"]
        assert store.record(record.record_id) == record
    ledger_calls = []

    class Recording(ReferenceLedger):
        def compensate(self, receipt, *, idempotency_key=None):
            ledger_calls.append(receipt.receipt_id)

    import tests.query.test_trust as here

    here.recording_rail = lambda: Recording(10_000)
    rail = "tests.query.test_trust:recording_rail"
    result = _replay_cli(record.record_id, dataset, live, "--execute", "--rail", rail)
    assert result.exit_code == 0, result.output
    assert "ROLLBACK" in result.output and ledger_calls == ["rcpt-0001"]


recording_rail = None


def test_rows_signed_with_an_unknown_key_do_not_act_unless_signatures_are_off(paid, dataset):
    record, live = paid
    _, table = _rows(dataset)
    row = dict(_decision_row(table, record.record_id))
    other = SigningKey(b"another-key-of-sixteen-or-more")
    attrs = json.loads(row["attributes"])
    attrs[sc.RECORD_KEY_ID] = other.key_id
    attrs[sc.RECORD_SPAN] = f"{row['trace_id']}-{'e' * 16}"  # the forger seals the place it stores the row in
    full = restore_attributes({**row, "attributes": json.dumps(attrs)})
    start_ns = record.span.start_ns
    attrs[sc.RECORD_HASH] = record_hash(row["name"], start_ns, full)
    attrs[sc.RECORD_SIGNATURE] = other.sign(attrs[sc.RECORD_HASH])
    row["attributes"] = json.dumps(attrs)
    row["span_id"] = "e" * 16
    _add_file(dataset, [row], table.schema)
    with otel_replay.open(dataset) as store:
        assert store.record(record.record_id) == record  # the foreign-key row is ignored
    with otel_replay.open(dataset, require_signed=False) as store:
        with pytest.raises(ConflictingRecords, match=f"record {record.record_id} is stored with different content in"):
            store.record(record.record_id)  # hash-only mode: both pass, they differ, neither is picked
    refused = _replay_cli(record.record_id, dataset, live, "--no-require-signed", "--execute", "--rail", "x:y")
    assert refused.exit_code == 1 and "--execute acts only on signed records" in refused.output


def test_no_key_means_signed_replay_is_refused_with_a_clear_error(paid, dataset, monkeypatch):
    record, live = paid
    monkeypatch.delenv("OTEL_REPLAY_SIGNING_KEY")
    with otel_replay.open(dataset) as store, pytest.raises(ConfigError, match="no verification key"):
        store.record(record.record_id)
    with otel_replay.open(dataset, require_signed=False) as store:
        assert store.record(record.record_id) == record
    result = _replay_cli(record.record_id, dataset, live)
    assert result.exit_code == 1 and "no verification key" in result.output


def test_exact_duplicate_rows_of_one_record_count_once(paid, dataset):
    record, _ = paid
    path, table = _rows(dataset)
    _add_file(dataset, list(table), table.schema, "retry-copy.parquet")
    with otel_replay.open(dataset) as store:
        assert store.verify(load_signing_key()).ok
        assert store.record(record.record_id) == record
        assert len(reads.receipts_for(store, record.record_id)) == 2  # the commit row twice: same receipt
        assert {r["receipt_id"] for r in reads.receipts_for(store, record.record_id)} == {"rcpt-0001"}


def test_run_never_reuses_a_variable_from_an_earlier_call(dataset):
    telemetry = otel_replay.configure(dataset, set_global=False)
    log = otel_replay.AuditLog()
    for i in range(4):
        log.append("msg", source_agent="a", correlation_id="inc-1", payload={"i": i})
    telemetry.shutdown()
    with otel_replay.open(dataset) as store:
        assert len(store.run("chains/trade", chain_id="inc-1", chain_limit=2)) == 2
        assert len(store.run("chains/incident", chain_id="inc-1")) == 4


def test_outcome_fields_come_only_from_verified_outcomes(dataset):
    telemetry = otel_replay.configure(dataset, set_global=False)
    tracer = otel_replay.DecisionTracer()
    decided = tracer.decision("agent", "sizing", "because", 0.9, correlation_id="t-1")
    tracer.record_outcome(decided, True)
    telemetry.shutdown()
    path, rows = _rows(dataset)
    table = rows
    outcome = next(r for r in rows if r["replay_kind"] == "outcome")
    forged = dict(outcome, span_id="d" * 16, record_id="forged-outcome")
    attrs = json.loads(forged["attributes"])
    attrs.pop(sc.RECORD_HASH)
    attrs.pop(sc.RECORD_SPAN)  # an unsealed row names no sealed place: the views show it
    forged["outcome_correct"] = False  # its typed column (storage schema version 2)
    forged["attributes"] = json.dumps(attrs)
    forged["start_time"] -= 10**9
    _add_file(dataset, [forged], table.schema)
    with otel_replay.open(dataset) as store:
        outcomes = store.verified_outcomes([decided])
        assert outcomes[decided]["outcome_correct"] is True and outcomes[decided]["outcome_id"] != "forged-outcome"
        assert store.has_outcome(decided)
        # The descriptive view shows the earlier, forged row; the chain shows only the verified one.
        assert store.rows("SELECT outcome_correct FROM outcomes")[0]["outcome_correct"] is False
        (trace,) = otel_replay.ReplayBuilder(store).build_trade_chain("t-1").traces
        assert trace["outcome_correct"] is True and trace["outcome_id"] == outcomes[decided]["outcome_id"]


def test_replay_of_the_verified_record_gives_the_expected_verdict(paid, dataset):
    record, _ = paid
    with otel_replay.open(dataset) as store:
        assert replay(store.record(record.record_id), live_state=LIVE, policy=budget_policy).fix is FixAction.ROLLBACK


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"[" * 100_000, "nested too deeply"),
        (b'{"budget_remaining": 1, "budget_remaining": 9999999}', "duplicate key 'budget_remaining'"),
        (b'{"budget_remaining": NaN}', "NaN is not JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b'{"a": 1', "not valid JSON (line 1"),
        (b"[1, 2]", "must be a JSON object"),
    ],
)
def test_hostile_live_state_is_a_one_line_error(paid, dataset, tmp_path, content, message):
    record, _ = paid
    live = tmp_path / "hostile.json"
    live.write_bytes(content)
    result = _replay_cli(record.record_id, dataset, live)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert message in result.output and len(result.output.strip().splitlines()) == 1
