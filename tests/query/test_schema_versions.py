"""Storage schema version 2: typed outcome and confidence columns, and datasets of older files.

Version 2 promoted three attributes to typed columns (``outcome_decision_id``,
``outcome_correct``, ``decision_confidence``). Both span readers write them;
a value of another type stays in the JSON; rehydration gives every attribute
back with its type. Version 1 files (the typed values in the JSON) read as
before, alone or mixed with version 2 files, and every query gives the same
answer over either. A typed column is never trusted on its own: the sealed
record restored from the row is what counts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_replay
from otel_replay import semconv as sc
from otel_replay.errors import DatasetError, QueryError
from otel_replay.exporters.rows import request_to_table, spans_to_table
from otel_replay.exporters.schema import SCHEMA_METADATA_KEY, SPAN_SCHEMA
from otel_replay.integrity import load_signing_key, restore_attributes
from otel_replay.storage import compact, live_files

from .._versions import V2_COLUMNS, rewrite_as_version_1

# --- rows ---------------------------------------------------------------------------------------
# attributes -> (outcome_decision_id, outcome_correct, decision_confidence) columns they must give
CASES: dict[str, tuple[dict[str, Any], tuple[Any, Any, Any]]] = {
    "outcome": ({sc.OUTCOME_DECISION_ID: "d-1", sc.OUTCOME_CORRECT: True}, ("d-1", True, None)),
    "wrong outcome": ({sc.OUTCOME_DECISION_ID: "d-2", sc.OUTCOME_CORRECT: False}, ("d-2", False, None)),
    "confident": ({sc.DECISION_CONFIDENCE: 0.25}, (None, None, 0.25)),
    "zero": ({sc.DECISION_CONFIDENCE: 0.0, sc.OUTCOME_CORRECT: False}, (None, False, 0.0)),
    "negative zero": ({sc.DECISION_CONFIDENCE: -0.0}, (None, None, -0.0)),
    # Only a value of the column's exact type moves; everything else stays in the JSON, as it was sent.
    "string confidence": ({sc.DECISION_CONFIDENCE: "0.9"}, (None, None, None)),
    "int confidence": ({sc.DECISION_CONFIDENCE: 1}, (None, None, None)),
    "bool confidence": ({sc.DECISION_CONFIDENCE: True}, (None, None, None)),
    "out of range": ({sc.DECISION_CONFIDENCE: 1e308 * 10}, (None, None, None)),  # inf: not finite
    "int correct": ({sc.OUTCOME_CORRECT: 1}, (None, None, None)),
    "string correct": ({sc.OUTCOME_CORRECT: "true"}, (None, None, None)),
    "int decision id": ({sc.OUTCOME_DECISION_ID: 7}, (None, None, None)),
    "list decision id": ({sc.OUTCOME_DECISION_ID: ("a", "b")}, (None, None, None)),
    "bare": ({"other": 1}, (None, None, None)),
}


def _spans() -> list[Any]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("scope", "1")
    for name, (attributes, _) in CASES.items():
        tracer.start_span(name, attributes=attributes).end()
    provider.shutdown()
    return list(memory.get_finished_spans())


def test_both_readers_write_the_typed_columns_and_rows_restore_exactly() -> None:
    spans = _spans()
    direct = spans_to_table(spans).sort_by("span_id")
    via_otlp = request_to_table(encode_spans(spans)).sort_by("span_id")
    assert direct.drop_columns(["links"]).equals(via_otlp.drop_columns(["links"]))  # byte for byte
    assert direct.schema.remove_metadata().equals(
        SPAN_SCHEMA.remove_metadata().append(pa.field("date", pa.string())), check_metadata=False
    )
    for column, kind in (("outcome_decision_id", pa.string()), ("outcome_correct", pa.bool_())):
        assert direct.schema.field(column).type == kind
    assert direct.schema.field("decision_confidence").type == pa.float64()
    sent = {span.name: dict(span.attributes or {}) for span in spans}
    for row in direct.drop_columns(["start_time", "end_time", "events"]).to_pylist():
        name = row["name"]
        assert tuple(row[c] for c in V2_COLUMNS) == CASES[name][1], name
        stored_json = json.loads(row["attributes"], parse_constant=lambda c: c)
        for column, key in V2_COLUMNS.items():
            # a promoted attribute lives in one place only
            assert (row[column] is None) == (key in stored_json or key not in sent[name]), (name, key)
        if name == "out of range":
            continue  # inf is not JSON: such a row was never rehydratable, before or after
        restored = restore_attributes(row)
        expected = {k: list(v) if isinstance(v, tuple) else v for k, v in sent[name].items()}
        assert restored == expected, name
        for key, value in expected.items():  # same types, not just equal values (True == 1 == 1.0)
            assert type(restored[key]) is type(value), (name, key)
        if name == "negative zero":
            assert math.copysign(1, restored[sc.DECISION_CONFIDENCE]) == -1


# --- datasets -----------------------------------------------------------------------------------
def _capture(dataset: Path) -> dict[str, Any]:
    """Two files: decisions (one with a string confidence, sent by hand) then their outcomes."""
    telemetry = otel_replay.configure(dataset, service_name="tests", set_global=False)
    tracer = otel_replay.DecisionTracer()
    ids = {}
    for i, confidence in enumerate((0.05, 0.35, 0.35, 0.72, 0.99, None)):
        chain = "trade-a" if i < 3 else "trade-b"
        ids[i] = tracer.decision("agent", "sizing", f"because {i}", confidence, correlation_id=chain)
    raw = telemetry.provider.get_tracer("foreign")
    raw.start_span(
        sc.SPAN_DECISION,
        attributes={sc.KIND: sc.KIND_DECISION, sc.RECORD_ID: "raw-1", sc.DECISION_CONFIDENCE: "0.55"},
    ).end()
    telemetry.force_flush()
    with otel_replay.correlation("somewhere-else"):  # the outcome still carries its decision's correlation id
        for i, correct in ((0, True), (1, False), (2, True), (3, True), (4, False)):
            tracer.record_outcome(ids[i], correct, note=f"note {i}")
    telemetry.shutdown()
    return ids


def _verify(store: otel_replay.Store) -> tuple[int, list[str]]:
    report = store.verify(load_signing_key())
    return report.records, sorted(str(p).split(" [")[0] for p in report.problems)  # less the file names


def _answers(dataset: Path, ids: dict[int, str]) -> dict[str, Any]:
    """Everything a reader asks of the dataset, as plain values."""
    with otel_replay.open(dataset) as store:
        builder = otel_replay.ReplayBuilder(store)
        return {
            "decisions": sorted(
                (r["record_id"], r["confidence"]) for r in store.rows("SELECT record_id, confidence FROM decisions")
            ),
            "outcomes": sorted(
                tuple(r.values())
                for r in store.rows(
                    "SELECT outcome_id, decision_id, outcome_correct, note, correlation_id FROM outcomes"
                )
            ),
            "calibration": store.calibration(),
            "outcomes_of": store.rows(
                "SELECT decision_id, outcome_correct FROM outcomes_of(?) ORDER BY decision_id", [[ids[0], ids[3]]]
            ),
            "outcome_spans_for": store.rows(
                "WITH d AS (SELECT record_id FROM decisions WHERE correlation_id = 'trade-a') "
                "SELECT count(*) AS n FROM outcome_spans_for('d')"
            ),
            "chains": [
                [(e["record_id"] if "record_id" in e else e["entry_id"], e.get("outcome_correct")) for e in c.events]
                for c in (builder.build_trade_chain("trade-a"), builder.build_trade_chain("trade-b"))
            ],
            "raw_chain": [
                (r["layer"], json.loads(r["body"]).get("outcome_correct"), json.loads(r["body"]).get("confidence"))
                for r in store.run("chains/trade", chain_id="trade-a", chain_limit=101)
            ],
            "traces": [
                json.loads(t["body"]).get("outcome_correct") for t in store.run("traces", correlation_id="trade-b")
            ],
            "verified": {
                k: (v["outcome_correct"], v["note"]) for k, v in store.verified_outcomes(list(ids.values())).items()
            },
            "records": [store.record(i).confidence for i in ids.values()],
            "verify": _verify(store),
        }


def test_version_1_files_mixed_files_and_compaction_give_the_same_answers(dataset: Path) -> None:
    ids = _capture(dataset)
    files = sorted((dataset / "spans").rglob("*.parquet"))
    assert len(files) == 2 and all(pq.read_schema(f).metadata[SCHEMA_METADATA_KEY] == b"2" for f in files)
    v2 = _answers(dataset, ids)
    assert v2["calibration"] == [
        {"bucket": 0.0, "decisions": 1, "correct": 1, "accuracy": 1.0, "mean_confidence": 0.05},
        {"bucket": 0.3, "decisions": 2, "correct": 1, "accuracy": 0.5, "mean_confidence": 0.35},
        {"bucket": 0.7, "decisions": 1, "correct": 1, "accuracy": 1.0, "mean_confidence": 0.72},
        {"bucket": 0.9, "decisions": 1, "correct": 0, "accuracy": 0.0, "mean_confidence": 0.99},
    ]
    assert ("raw-1", 0.55) in v2["decisions"]  # a string confidence stays in the JSON and reads as before
    assert v2["verified"][ids[1]] == (False, "note 1")
    assert v2["outcomes_of"] == sorted(
        [{"decision_id": ids[0], "outcome_correct": True}, {"decision_id": ids[3], "outcome_correct": True}],
        key=lambda r: r["decision_id"],
    )
    assert v2["outcome_spans_for"] == [{"n": 3}]
    assert (
        v2["verify"][0] == 12 and len(v2["verify"][1]) == 1 and "raw-1" in v2["verify"][1][0]
    )  # only the unsealed one
    assert all(c == "trade-a" for _, d, _, _, c in v2["outcomes"] if d in (ids[0], ids[1], ids[2]))
    # Mixed: the outcomes' file as version 1 (typed values back in its JSON), then every file.
    outcomes_file = next(f for f in files if pq.read_table(f, columns=["outcome_correct"])[0].null_count == 0)
    rewrite_as_version_1(outcomes_file)
    with otel_replay.open(dataset) as store:
        assert store.rows("SELECT count(*) AS n FROM spans WHERE outcome_correct IS NOT NULL") == [{"n": 0}]
    assert _answers(dataset, ids) == v2
    rewrite_as_version_1(next(f for f in files if f != outcomes_file))
    assert _answers(dataset, ids) == v2
    with otel_replay.open(dataset) as store:  # version 1 only: the typed columns still exist, NULL
        assert store.rows("SELECT count(outcome_decision_id) AS n, count(decision_confidence) AS c FROM spans") == [
            {"n": 0, "c": 0}
        ]
    # Compaction over a mix of versions keeps each version in its own files and the same answers.
    second = _capture(dataset.parent / "more")  # fresh version 2 rows alongside
    for path in sorted((dataset.parent / "more" / "spans").rglob("*.parquet")):
        target = dataset / "spans" / path.parent.name / f"part-9-{path.name[-20:]}"
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(path.read_bytes())
    mixed = _answers(dataset, ids)
    compact(dataset, grace_seconds=0)
    versions = {pq.read_schema(f).metadata[SCHEMA_METADATA_KEY] for f in live_files(dataset)}
    assert versions == {b"1", b"2"}
    after = _answers(dataset, ids)
    assert after == mixed
    with otel_replay.open(dataset) as store:
        assert set(store.verified_outcomes(list(second.values()))) == {second[i] for i in range(5)}


def _outcome_rows(dataset: Path, kind: str | None = "outcome") -> tuple[pa.Schema, list[dict[str, Any]]]:
    """The rows of ``kind`` (``None``: every row) as plain values (times as int64 ns) and the files' schema."""
    files = sorted((dataset / "spans").rglob("*.parquet"))
    table = pa.concat_tables([pq.read_table(f, partitioning=None) for f in files], promote_options="default")
    plain = pa.schema([f.with_type(pa.int64()) if pa.types.is_timestamp(f.type) else f for f in table.schema])
    rows = table.drop_columns(["events"]).cast(plain.remove(plain.get_field_index("events"))).to_pylist()
    return table.schema, [r for r in rows if kind is None or r["replay_kind"] == kind]


def _add(dataset: Path, name: str, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
    """Write ``rows`` (plain values, no events) into the dataset as a foreign writer would, in ``schema``."""
    plain = pa.schema([f.with_type(pa.int64()) if pa.types.is_timestamp(f.type) else f for f in schema])
    plain = plain.remove(plain.get_field_index("events"))
    table = pa.Table.from_pylist(rows, schema=plain).cast(schema.remove(schema.get_field_index("events")))
    table = table.append_column("events", pa.nulls(len(rows), schema.field("events").type))
    pq.write_table(table.select(schema.names), next((dataset / "spans").iterdir()) / name)


def test_a_forged_typed_column_does_not_act(dataset: Path) -> None:
    ids = _capture(dataset)
    schema, outcomes = _outcome_rows(dataset)
    first = next(r for r in outcomes if r["outcome_decision_id"] == ids[0])
    earlier = first["start_time"] - 10**9


    def placed(span_id: str, **changes: object) -> dict[str, object]:
        """``first`` moved to ``span_id``, its sealed place rewritten to match (so the views show it)."""
        attrs = json.loads(first["attributes"])
        attrs[sc.RECORD_SPAN] = f"{first['trace_id']}-{span_id}"
        return dict(first, span_id=span_id, attributes=json.dumps(attrs), **changes)

    flipped = placed("f" * 16, outcome_correct=False)  # seal kept, typed value changed
    redirected = placed("e" * 16, outcome_decision_id=ids[5])  # now claims the undecided one
    both = placed("c" * 16, outcome_correct=False)  # the value in the column and in the JSON
    both_attrs = json.loads(str(both["attributes"]))
    both_attrs[sc.OUTCOME_CORRECT] = True
    both["attributes"] = json.dumps(both_attrs)
    forged = [dict(r, start_time=earlier) for r in (flipped, redirected, both)]
    _add(dataset, "forged.parquet", forged, schema)
    with otel_replay.open(dataset) as store:
        verified = store.verified_outcomes(list(ids.values()))
        assert verified[ids[0]]["outcome_correct"] is True and verified[ids[0]]["outcome_id"] == first["record_id"]
        assert ids[5] not in verified and not store.has_outcome(ids[5])
        # The descriptive views show the stored rows, forged ones included (the earliest wins the rank) ...
        shown = {r["decision_id"]: r["outcome_correct"] for r in store.rows("SELECT * FROM outcomes")}
        assert shown[ids[0]] is False and shown[ids[5]] is True
        # ... while the chain's outcome fields come only from the verified record.
        traces = otel_replay.ReplayBuilder(store).build_trade_chain("trade-b").traces
        assert [t["outcome_correct"] for t in traces if t["record_id"] == ids[5]] == [None]
        traces = otel_replay.ReplayBuilder(store).build_trade_chain("trade-a").traces
        assert [t["outcome_correct"] for t in traces if t["record_id"] == ids[0]] == [True]
        problems = _verify(store)[1]
        assert sum("content edited (hash mismatch)" in p for p in problems) == 2  # flipped, redirected
        assert sum("stored both in column outcome_correct and in the JSON" in p for p in problems) == 1


def test_a_typed_column_stored_as_another_type_changes_no_other_row(dataset: Path) -> None:
    ids = _capture(dataset)
    before = _answers(dataset, ids)
    schema, outcomes = _outcome_rows(dataset)
    odd = pa.schema([f.with_type(pa.string()) if f.name == "outcome_correct" else f for f in schema])
    row = dict(outcomes[0], span_id="a" * 16, outcome_correct="maybe", outcome_decision_id=ids[5])
    _add(dataset, "odd.parquet", [row], odd)
    after = _answers(dataset, ids)
    assert after["verified"] == before["verified"] and after["calibration"] == before["calibration"]


def test_a_newer_major_version_beside_older_ones_is_refused_by_name(dataset: Path) -> None:
    _capture(dataset)
    files = sorted((dataset / "spans").rglob("*.parquet"))
    rewrite_as_version_1(files[0])
    table = pq.read_table(files[1], partitioning=None)
    future = files[1].with_name("part-3-future.parquet")
    pq.write_table(table.replace_schema_metadata({SCHEMA_METADATA_KEY: b"3"}), future)
    with pytest.raises(DatasetError, match="part-3-future.parquet.*version 3"):
        otel_replay.open(dataset)
    future.unlink()
    with otel_replay.open(dataset) as store:
        assert len(store.files) == 2


def _unplaced(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` without the sealed place (``replay.record.span``), as records were written before it existed."""
    attrs = json.loads(row["attributes"])
    attrs.pop(sc.RECORD_SPAN, None)
    return dict(row, attributes=json.dumps(attrs))


def test_an_older_file_arriving_after_open_is_read_by_a_narrowed_lookup(dataset: Path) -> None:
    """Views defined over version 2 files only are redefined when a lookup reaches only version 1 files."""
    ids = _capture(dataset)
    compact(dataset, grace_seconds=0)  # a side index: run_for reads the indexed files plus newer arrivals
    with otel_replay.open(dataset) as store:
        assert len(store.run_for("chains/trade", {"correlation_id": "trade-a"}, chain_id="trade-a")) == 3
        schema, rows = _outcome_rows(dataset, kind=None)
        decision = next(r for r in rows if r["record_id"] == ids[0] and r["replay_kind"] == "decision")
        outcome = next(r for r in rows if r["outcome_decision_id"] == ids[0])
        late = [  # written by a version 1 writer, before records carried their sealed place
            dict(_unplaced(decision), span_id="b" * 16, record_id="late-decision", correlation_id="trade-c"),
            dict(_unplaced(outcome), span_id="c" * 16, record_id="late-outcome", outcome_decision_id="late-decision"),
        ]
        _add(dataset, "part-9-late.parquet", late, schema)
        rewrite_as_version_1(next((dataset / "spans").rglob("part-9-late.parquet")))
        # Only the late version 1 file can hold trade-c: the lookup reads it alone.
        found = store.run_for("chains/trade", {"correlation_id": "trade-c"}, chain_id="trade-c")
        (body,) = [json.loads(r["body"]) for r in found]
        assert body["record_id"] == "late-decision" and body["outcome_id"] == "late-outcome"
        assert body["confidence"] == 0.05


def test_an_outcome_recorded_by_another_process_carries_its_decisions_correlation_id(dataset: Path) -> None:
    ids = _capture(dataset)
    telemetry = otel_replay.configure(dataset, service_name="later", set_global=False)
    with otel_replay.open(dataset) as store:
        tracer = otel_replay.DecisionTracer(store=store)  # the decision is known only from the dataset
        with otel_replay.correlation("unrelated"):
            tracer.record_outcome(ids[5], True, note="settled late")
        telemetry.force_flush()
        store.refresh()
        (row,) = store.rows("SELECT correlation_id, outcome_correct FROM outcomes WHERE decision_id = ?", [ids[5]])
        assert row == {"correlation_id": "trade-b", "outcome_correct": True}
    telemetry.shutdown()


def test_calibration_counts_a_retried_decision_once_and_leaves_out_an_ambiguous_one(dataset: Path) -> None:
    ids = _capture(dataset)
    before = _answers(dataset, ids)["calibration"]
    schema, rows = _outcome_rows(dataset, kind="decision")
    first = next(r for r in rows if r["record_id"] == ids[0])
    second = next(r for r in rows if r["record_id"] == ids[3])
    ambiguous = dict(second, span_id="a" * 16, record_id="twice", decision_confidence=None)
    ambiguous["attributes"] = ambiguous["attributes"][:-1] + ',"replay.decision.confidence":0.5,"x":1,"x":2}'
    _add(dataset, "retry-and-forged.parquet", [first, ambiguous], schema)  # an exact retry copy, and a dup-key row
    outcome = dict(_outcome_rows(dataset)[1][0], span_id="b" * 16, record_id="o-twice", outcome_decision_id="twice")
    _add(dataset, "its-outcome.parquet", [outcome], schema)
    with otel_replay.open(dataset) as store:
        assert store.calibration() == before
        assert store.rows("SELECT count(*) AS n FROM decisions WHERE record_id = 'twice'") == [{"n": 0}]
        assert store.rows("SELECT count(*) AS n FROM spans WHERE record_id = ?", [ids[0]]) == [{"n": 2}]


def test_the_stores_own_variables_cannot_be_set_by_a_caller(dataset: Path) -> None:
    _capture(dataset)
    with otel_replay.open(dataset) as store:
        with pytest.raises(QueryError, match="otel_replay_legacy_outcomes"):
            store.run("chains/trade", chain_id="trade-a", otel_replay_legacy_outcomes=False)
        with pytest.raises(QueryError, match="otel_replay_files"):
            store.run("record", record_id="x", otel_replay_files=["/etc/passwd"])
        assert len(store.run("chains/trade", chain_id="trade-a")) == 3
