from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import otel_replay
from otel_replay import AuditLog, DecisionTracer, OtelReplayError, ReplayBuilder, correlation, session

T0 = datetime(2026, 3, 2, 14, 30, tzinfo=UTC)


def test_trade_chain_sorts_audit_entries_by_created_at_not_arrival(telemetry, dataset):
    log, tracer = AuditLog(), DecisionTracer()
    with correlation("trade-1"):
        # Arrival order differs from the writers' clocks.
        log.append("approval_requested", source_agent="sizer", created_at=T0 + timedelta(seconds=3))
        log.append("signal_received", source_agent="router", created_at=T0)
        log.append("evaluation_sent", source_agent="foresight", created_at=T0 + timedelta(seconds=1))
        first = tracer.decision("foresight", "signal_evaluation", "bullish", 0.74, {"signal": "S1"})
        second = tracer.decision("sizer", "position_sizing", "1.4x", 0.68, {"mult": 1.4})
    with correlation("trade-2"):
        log.append("unrelated", source_agent="x", created_at=T0)
    tracer.record_outcome(second, False)
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        chain = ReplayBuilder(store).build_trade_chain("trade-1")
    assert chain.chain_type == "trade" and chain.chain_id == "trade-1"
    assert [e["event_type"] for e in chain.audit_entries] == [
        "signal_received",
        "evaluation_sent",
        "approval_requested",
    ]
    assert [t["record_id"] for t in chain.traces] == [first, second]
    sizing = chain.traces[1]
    assert sizing["rationale"] == "1.4x" and sizing["confidence"] == 0.68 and sizing["inputs"] == {"mult": 1.4}
    assert sizing["outcome_correct"] is False and chain.traces[0]["outcome_correct"] is None
    assert len(chain.events) == 5


def test_session_chain_has_traces_only(telemetry, dataset):
    log, tracer = AuditLog(), DecisionTracer()
    with session("sess-9"), correlation("c"):
        tracer.decision("a", "step", "r1")
        tracer.decision("a", "step", "r2")
        log.append("msg", source_agent="a")
    tracer.decision("a", "step", "elsewhere", session_id="other")
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        chain = ReplayBuilder(store).build_session_chain("sess-9")
    assert [t["rationale"] for t in chain.traces] == ["r1", "r2"] and chain.audit_entries == []


def test_incident_chain_has_audit_entries_only(telemetry, dataset):
    log, tracer = AuditLog(), DecisionTracer()
    with correlation("inc-7"):
        log.append("kill_switch", source_agent="risk", created_at=T0 + timedelta(seconds=5))
        log.append("breach_detected", source_agent="monitor", created_at=T0)
        tracer.decision("risk", "halt", "drawdown")
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        chain = ReplayBuilder(store).build_incident_chain("inc-7")
    assert [e["event_type"] for e in chain.audit_entries] == ["breach_detected", "kill_switch"]
    assert chain.traces == []


def test_limits_default_per_chain_type(telemetry, dataset):
    log = AuditLog()
    with correlation("big"):
        for i in range(520):
            log.append("tick", source_agent="a", created_at=T0 + timedelta(seconds=i))
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        builder = ReplayBuilder(store)
        assert len(builder.build_trade_chain("big").audit_entries) == 100
        assert len(builder.build_directive_chain("big").audit_entries) == 500
        incident = builder.build_incident_chain("big")
        assert len(incident.audit_entries) == 500
        assert incident.audit_entries[0]["payload"] == {} and incident.audit_entries[-1]["created_at"].endswith(
            "14:38:19.000000+00:00"
        )
        assert len(builder.build_trade_chain("big", limit=7).audit_entries) == 7
        with pytest.raises(OtelReplayError, match="unknown chain type"):
            builder.build("weekly", "big")


def test_audit_log_query_in_process_and_from_store(telemetry, dataset):
    log = AuditLog()
    with correlation("q"):
        log.append("b", source_agent="x", created_at=T0 + timedelta(seconds=1), payload={"k": 1})
        log.append("a", source_agent="x", created_at=T0)
    log.append("other", source_agent="x")
    assert [e["event_type"] for e in log.query(correlation_id="q")] == ["b", "a"]
    assert len(log.query(limit=2)) == 2
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        stored = AuditLog(store=store).query(correlation_id="q")
    assert [e["event_type"] for e in stored] == ["b", "a"] and stored[0]["payload"] == {"k": 1}


def test_causal_tree_and_calibration(telemetry, dataset):
    from otel_replay import audit

    from .._support import payment, snapshot

    with audit("vendor_payment", snapshot=snapshot()) as d:
        d.read(x=1)
        d.model("m")
        d.act(payment())
    tracer = DecisionTracer()
    for conf, correct in [(0.95, True), (0.91, True), (0.92, False), (0.55, True), (0.51, False), (0.12, False)]:
        tracer.record_outcome(tracer.decision("a", "sizing", "r", conf), correct)
    tracer.record_outcome(tracer.decision("a", "other", "r", 0.99), False)
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        tree = store.causal_tree(d.record_id)
        calib = store.calibration("sizing")
        everything = store.calibration()
    assert [(t["depth"], t["name"]) for t in tree] == [
        (0, "replay.decision"),
        (1, "replay.read"),
        (1, "replay.model"),
        (1, "replay.act"),
    ]
    assert [(c["bucket"], c["decisions"], c["correct"]) for c in calib] == [(0.1, 1, 0), (0.5, 2, 1), (0.9, 3, 2)]
    assert sum(c["decisions"] for c in everything) == 7



def test_causal_tree_is_pinned_to_the_decisions_trace(telemetry, dataset):
    # Span ids are unique only within a trace: another sender's trace reusing the decision's span id, with a
    # child under it, written in a file that sorts first, must not take over the decision's tree.
    import pyarrow as pa
    import pyarrow.parquet as pq

    from otel_replay import audit
    from otel_replay.storage import compact

    from .._support import snapshot

    with audit("vendor_payment", snapshot=snapshot(), correlation_id="c-1") as d:
        d.read(x=1)
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        honest = [(t["depth"], t["name"]) for t in store.causal_tree(d.record_id)]
        where = "WHERE record_id = ? AND name = 'replay.decision'"
        (mine,) = store.rows(f"SELECT trace_id, span_id, filename FROM spans {where}", [d.record_id])
    assert honest == [(0, "replay.decision"), (1, "replay.read")]
    forged = pq.read_table(mine["filename"]).slice(0, 2)
    for name, values in {
        "trace_id": ["0" * 32] * 2,
        "span_id": [mine["span_id"], "e" * 16],
        "parent_span_id": [None, mine["span_id"]],
        "name": ["other.root", "other.child"],
        "record_id": [None, None],
        "replay_kind": [None, None],
        "attributes": ["{}", "{}"],
    }.items():
        i = forged.schema.get_field_index(name)
        forged = forged.set_column(i, forged.schema.field(i), pa.array(values, forged.schema.field(i).type))
    folder = mine["filename"].rpartition("/")[0]
    pq.write_table(forged, f"{folder}/part-0000000000000000000-000.parquet")
    with otel_replay.open(dataset) as store:
        assert [(t["depth"], t["name"]) for t in store.causal_tree(d.record_id)] == honest
    compact(dataset, grace_seconds=0)  # sorted: the other trace's rows come first
    with otel_replay.open(dataset) as store:
        assert [(t["depth"], t["name"]) for t in store.causal_tree(d.record_id)] == honest


def test_audit_entry_timestamps_must_be_iso_with_offset():
    from otel_replay import CaptureError

    log = AuditLog()
    with pytest.raises(CaptureError, match="not ISO-8601"):
        log.append("x", source_agent="a", created_at="yesterday")
    with pytest.raises(CaptureError, match="no UTC offset"):
        log.append("x", source_agent="a", created_at="2026-03-02T14:30:00")
    naive = log.append("x", source_agent="a", created_at=datetime(2026, 3, 2, 14, 30))
    assert naive.created_at == "2026-03-02T14:30:00+00:00"


def test_truncation_is_flagged_per_layer_never_silent(telemetry, dataset):
    log, tracer = AuditLog(), DecisionTracer()
    with correlation("big"):
        for i in range(101):
            log.append("tick", source_agent="a", created_at=T0 + timedelta(seconds=i))
        for _ in range(3):
            tracer.decision("a", "step", "r")
    with correlation("exact"):
        for i in range(100):
            log.append("tick", source_agent="a", created_at=T0 + timedelta(seconds=i))
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        builder = ReplayBuilder(store)
        trade = builder.build_trade_chain("big")
        assert trade.truncated and trade.truncated_layers == ("audit",) and trade.limit == 100
        assert len(trade.audit_entries) == 100
        assert trade.audit_entries[-1]["created_at"].startswith("2026-03-02T14:31:39")
        assert builder.build_trade_chain("big", limit=2).truncated_layers == ("audit", "trace")
        assert not builder.build_trade_chain("exact").truncated  # exactly at the cap is complete
        assert not builder.build_directive_chain("big").truncated
        as_json = trade.to_json()
        assert as_json["truncated"] is True and as_json["truncated_layers"] == ["audit"] and as_json["limit"] == 100
        for bad in (0, -1, True, 2.5):
            with pytest.raises(OtelReplayError, match="positive integer"):
                builder.build("trade", "big", bad)


def test_compact_created_at_is_normalised_and_sorts_in_place(telemetry, dataset):
    log = AuditLog()
    with correlation("compact"):
        log.append("third", source_agent="a", created_at=T0 + timedelta(seconds=2))
        compact = log.append("second", source_agent="a", created_at="20260302T143001Z")
        log.append("first", source_agent="a", created_at="2026-03-02T16:30:00+02:00")
    assert compact.created_at == "2026-03-02T14:30:01+00:00"
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        chain = ReplayBuilder(store).build_incident_chain("compact")
    assert [(e["event_type"], e["created_at"]) for e in chain.audit_entries] == [
        ("first", "2026-03-02T14:30:00.000000+00:00"),
        ("second", "2026-03-02T14:30:01.000000+00:00"),
        ("third", "2026-03-02T14:30:02.000000+00:00"),
    ]


_SHARED_TRACE_FIELDS = (
    "record_id", "source", "decision_type", "agent_id", "session_id", "correlation_id", "rationale", "confidence",
    "inputs", "record_hash", "created_at", "trace_id", "span_id", "outcome_id", "outcome_correct", "outcome_note",
    "layer",
)
_SHARED_AUDIT_FIELDS = (
    "entry_id", "event_type", "source_agent", "target_agent", "correlation_id", "session_id", "created_at", "payload",
    "layer",
)


def _shared(chain):
    def pick(e):
        return {k: e.get(k) for k in (_SHARED_TRACE_FIELDS if e["layer"] == "trace" else _SHARED_AUDIT_FIELDS)}

    return [pick(e) for e in chain.events], chain.truncated_layers


def test_in_process_builder_matches_the_dataset(telemetry, dataset):
    """Seed 002's ReplayBuilder(tracer, audit_log) gives the chains the dataset gives."""
    log, tracer = AuditLog(), DecisionTracer()
    with correlation("trade-9"), session("s-9"):
        log.append("approval", source_agent="sizer", target_agent="vp", created_at=T0 + timedelta(seconds=3))
        log.append("signal", source_agent="router", created_at=T0, payload={"px": 101.5})
        first = tracer.decision("foresight", "evaluation", "bullish", 0.71, {"signal": "S1"})
        second = tracer.decision("sizer", "sizing", "1.4x", 0.68, {"mult": 1.4})
    tracer.decision("sizer", "sizing", "other trade", 0.5, correlation_id="trade-10", session_id="s-9")
    tracer.record_outcome(second, False, note="oversized")
    tracer.record_outcome(first, True)
    in_process = ReplayBuilder(tracer, log)
    memory = {
        (kind, cid, limit): in_process.build(kind, cid, limit)
        for kind, cid in (("trade", "trade-9"), ("session", "s-9"), ("directive", "trade-9"), ("incident", "trade-9"))
        for limit in (None, 1)
    }
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        stored = ReplayBuilder(store)
        for (kind, cid, limit), chain in memory.items():
            assert _shared(chain) == _shared(stored.build(kind, cid, limit)), (kind, limit)
        from_store = ReplayBuilder(DecisionTracer(store=store), AuditLog(store=store)).build_trade_chain("trade-9")
        assert _shared(from_store) == _shared(memory[("trade", "trade-9", None)])
    trade = memory[("trade", "trade-9", None)]
    assert [e["layer"] for e in trade.events] == ["audit", "audit", "trace", "trace"]  # T0 is in the past
    assert trade.traces[1]["outcome_correct"] is False and trade.traces[1]["outcome_note"] == "oversized"
    assert memory[("trade", "trade-9", 1)].truncated_layers == ("audit", "trace")


def test_query_traces_filters_and_limits(telemetry, dataset):
    tracer = DecisionTracer()
    with correlation("c1"), session("s1"):
        ids = [tracer.decision("a", "step", f"r{i}") for i in range(3)]
    tracer.decision("a", "step", "elsewhere", correlation_id="c2", session_id="s1")
    assert [t["record_id"] for t in tracer.query_traces(correlation_id="c1")] == ids
    assert len(tracer.query_traces(session_id="s1")) == 4
    assert [t["rationale"] for t in tracer.query_traces(correlation_id="c2", session_id="s1")] == ["elsewhere"]
    assert [t["record_id"] for t in tracer.query_traces(correlation_id="c1", limit=2)] == ids[:2]
    assert tracer.query_traces(correlation_id="nope") == []
    with pytest.raises(otel_replay.CaptureError, match="positive integer"):
        tracer.query_traces(limit=0)
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        stored = DecisionTracer(store=store).query_traces(correlation_id="c1", limit=2)
    assert [t["record_id"] for t in stored] == ids[:2]


# --- review 14 (chains): hostile ids and shapes ----------------------------------------------------------------

_LOOK_ALIKES = ("42", "042", "42.0", "+42", " 42")  # one trade each: as numbers, all of them are 42


def _chain_rows_from_any_duckdb(dataset, query: str, chain_id: object) -> list[dict]:
    """Rows of ``queries/<query>.sql`` in a DuckDB of the analyst's own, loaded as the SQL guide says."""
    from importlib.resources import files

    import duckdb

    from otel_replay.storage import live_files

    queries = files("otel_replay.queries")
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.execute("SET VARIABLE otel_replay_files = ?", [live_files(dataset)])
        for name in ("source.sql", "views.sql"):
            con.execute(queries.joinpath(name).read_text())
        con.execute("SET VARIABLE chain_id = ?", [chain_id])
        con.execute("SET VARIABLE chain_limit = NULL")
        cursor = con.execute(queries.joinpath(f"{query}.sql").read_text())
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    finally:
        con.close()


def test_a_number_given_as_a_chain_id_never_matches_another_trades_id(telemetry, dataset):
    import json

    log, tracer = AuditLog(), DecisionTracer()
    for cid in _LOOK_ALIKES:
        with correlation(cid), session(cid):
            log.append("message", source_agent="a", payload={"trade": cid})
            tracer.decision("a", "step", cid)
    telemetry.force_flush()
    # The SQL from any DuckDB: `SET VARIABLE chain_id = 42` (a number) reads the chain "42", never a chain whose id
    # DuckDB can cast to 42 (was: the trade chain 42 held the records of "042", "42.0", "+42" and " 42" too).
    for query in ("chains/trade", "chains/session", "chains/directive", "chains/incident"):
        rows = _chain_rows_from_any_duckdb(dataset, query, 42)
        ids = {json.loads(row["body"]).get("correlation_id") for row in rows}
        assert rows and ids == {"42"}, (query, ids)
    with otel_replay.open(dataset) as store:
        # The Store API: a number is refused, not compared as a number.
        with pytest.raises(OtelReplayError, match=r"a chain id is text \(str\), got int 42"):
            ReplayBuilder(store).build("trade", 42)  # type: ignore[arg-type]
        assert [t["correlation_id"] for t in store.traces(correlation_id=42)] == ["42"]  # type: ignore[arg-type]
        assert [e["correlation_id"] for e in store.audit_entries(correlation_id=42)] == ["42"]  # type: ignore[arg-type]
        for cid in _LOOK_ALIKES:  # each text id, its own chain only
            chain = ReplayBuilder(store).build_trade_chain(cid)
            assert [t["rationale"] for t in chain.traces] == [cid]
            assert [e["payload"] for e in chain.audit_entries] == [{"trade": cid}]


def test_a_decision_joins_only_its_own_trades_chain_through_an_intent(telemetry, dataset):
    from otel_replay import Action, ActionGate, DependencySnapshot, ReferenceLedger, audit

    gate = ActionGate(ReferenceLedger(balance=10_000))
    with audit("vendor_payment", snapshot=DependencySnapshot({}), correlation_id="trade-1") as d:
        action = Action("vendor_payment", {"recipient": "acme"}, cost=5.0)
        d.act(action)
        with correlation("trade-2"):  # the commit runs under another trade's id: its intent is filed there
            gate.commit(action, record_id=d.record_id)
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        builder = ReplayBuilder(store)
        [own] = builder.build_trade_chain("trade-1").traces
        assert own["record_id"] == d.record_id and own["from_intent"] is False
        other = builder.build_trade_chain("trade-2")
        # was: trade-1's decision, stored and whole, shown in trade-2's chain as a decision lost with its process
        assert other.traces == [] and [t["record_id"] for t in builder.build_directive_chain("trade-2").traces] == []


def test_a_chain_limit_past_what_sql_counts_returns_the_whole_chain(telemetry, dataset):
    log, tracer = AuditLog(), DecisionTracer()
    with correlation("huge-limit"):
        log.append("message", source_agent="a")
        tracer.decision("a", "step", "r")
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        for limit in (2**63 - 1, 10**30):  # was: QueryError "INT128 ... out of range for ... INT64" (limit + 1)
            chain = ReplayBuilder(store).build("trade", "huge-limit", limit)
            assert [e["layer"] for e in chain.events] == ["audit", "trace"] and not chain.truncated
            assert chain.limit == limit


_MALFORMED = {  # one unsealed span any OTLP client may send under a trade's id: attribute -> value
    "inputs_not_json": ("replay.decision.inputs", "{not json"),
    "models_cut_short": ("replay.decision.models", "[1,"),
    "inputs_too_deep": ("replay.decision.inputs", "[" * 5000 + "]" * 5000),
    "confidence_nan": ("replay.decision.confidence", float("nan")),
    "cost_infinite": ("replay.action.cost", float("-inf")),
    "payload_not_json": ("replay.audit.payload", "nope"),
}


@pytest.mark.parametrize("case", sorted(_MALFORMED))
def test_one_malformed_foreign_span_never_hides_a_trades_chain(telemetry, dataset, case):
    import json

    from otel_replay._json import strict_loads

    key, value = _MALFORMED[case]
    kind = "audit_entry" if key.startswith("replay.audit.") else "decision"
    with correlation("trade-1"):
        honest = DecisionTracer().decision("a", "step", "honest")
        AuditLog().append("message", source_agent="a")
    foreign = telemetry.provider.get_tracer("a-foreign-client")
    attributes = {"replay.kind": kind, "replay.correlation_id": "trade-1", key: value}
    with foreign.start_as_current_span("forged", attributes=attributes):
        pass
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        for name in ("chains/trade", "chains/directive", "chains/incident"):  # the SQL's body is strict JSON
            for row in store.run(name, chain_id="trade-1"):
                strict_loads(row["body"], where=f"{name} body")
        # was: PayloadError "trade chain trade-1 row None field inputs: not valid JSON ..." and no chain at all
        chain = ReplayBuilder(store).build_trade_chain("trade-1")
        traces = store.traces(correlation_id="trade-1")
    assert honest in [t["record_id"] for t in chain.traces]
    assert "message" in [e["event_type"] for e in chain.audit_entries]
    assert len(chain.events) == 3 and len(traces) == (2 if kind == "decision" else 1)
    [forged] = [e for e in chain.events if e.get("record_id") is None and e.get("entry_id") is None]
    field = key.rpartition(".")[2].replace("cost", "action_cost")
    assert forged[field] == (value if isinstance(value, str) else None)  # shown as stored; no number: null
    json.dumps(chain.to_json(), allow_nan=False)


def test_audit_entries_from_the_store_keep_a_payload_that_is_not_json(telemetry, dataset):
    with correlation("q"):
        AuditLog().append("honest", source_agent="x", payload={"k": 1})
    attributes = {"replay.kind": "audit_entry", "replay.correlation_id": "q", "replay.audit.payload": "{oops"}
    with telemetry.provider.get_tracer("a-foreign-client").start_as_current_span("forged", attributes=attributes):
        pass
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        # was: PayloadError "payload of audit entry None: not valid JSON ...", and no entry of "q" at all
        entries = AuditLog(store=store).query(correlation_id="q")
    assert sorted(str(e["payload"]) for e in entries) == ["{'k': 1}", "{oops"]


def _gated_with_one_span_lost(telemetry, dataset) -> list[str]:
    """Three gated decisions of trade "gated", session "s-gated"; the second one's decision span lost (its id last)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from otel_replay import Action, ActionGate, DependencySnapshot, ReferenceLedger, audit

    gate = ActionGate(ReferenceLedger(balance=10_000))
    decided = []
    snapshot = DependencySnapshot({})
    for _ in range(3):
        with session("s-gated"), audit("vendor_payment", snapshot=snapshot, correlation_id="gated") as d:
            action = Action("vendor_payment", {"recipient": "acme"}, cost=1.0)
            d.act(action)
            gate.commit(action, record_id=d.record_id)
        decided.append(d.record_id)
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        [row] = store.rows("SELECT filename FROM spans WHERE record_id = ? AND replay_kind = 'decision'", [decided[1]])
    table = pq.read_table(row["filename"], partitioning=None)  # a process that died inside the second audit() block
    lost = pc.and_(pc.equal(table["record_id"], decided[1]), pc.equal(table["replay_kind"], "decision"))
    pq.write_table(table.filter(pc.invert(lost)), row["filename"])
    return decided


def test_a_chain_reads_the_intents_of_lost_decisions_only(telemetry, dataset):
    # A chain of many gated decisions read, checked and parsed every decision's commit intent (one per decision)
    # to find the few with no decision span: 20,000 gated decisions cost 6 CPU-seconds for a 100-row chain.
    decided = _gated_with_one_span_lost(telemetry, dataset)
    with otel_replay.open(dataset) as store:
        intents = store.run("lost_decisions", correlation_id="gated")
        assert intents == store.run("lost_decisions", session_id="s-gated")
        chain = ReplayBuilder(store).build_trade_chain("gated")
    assert [r["name"] for r in intents] == ["replay.gate"] and decided[1] in intents[0]["attributes"]
    assert [(t["record_id"], t["from_intent"]) for t in chain.traces] == [
        (decided[0], False),
        (decided[1], True),
        (decided[2], False),
    ]


def test_a_session_chain_shows_a_decision_lost_with_its_process(telemetry, dataset):
    decided = _gated_with_one_span_lost(telemetry, dataset)
    with otel_replay.open(dataset) as store:
        chain = ReplayBuilder(store).build_session_chain("s-gated")
        other = ReplayBuilder(store).build_session_chain("s-other")
    # was: the trade chain showed it from its intent, the session chain left it out without a word
    assert [(t["record_id"], t["from_intent"]) for t in chain.traces] == [
        (decided[0], False),
        (decided[1], True),
        (decided[2], False),
    ]
    assert other.empty


@pytest.mark.parametrize("loop", ["to_itself", "to_its_child"])
def test_causal_tree_lists_each_span_once_when_parent_ids_loop(telemetry, dataset, loop):
    # A copy of the decision span (a foreign writer's, an edited file) that names its own span, or its child's,
    # as its parent makes the parent ids a loop; the copy with a parent sorts before the stored root.
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from otel_replay import audit

    from .._support import snapshot

    with audit("vendor_payment", snapshot=snapshot(), correlation_id="c-1") as d:
        d.read(x=1)
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        honest = [(t["depth"], t["name"]) for t in store.causal_tree(d.record_id)]
        [mine] = store.rows(
            "SELECT span_id, filename FROM spans WHERE record_id = ? AND name = 'replay.decision'", [d.record_id]
        )
        [child] = store.rows("SELECT span_id FROM spans WHERE record_id = ? AND name = 'replay.read'", [d.record_id])
    assert honest == [(0, "replay.decision"), (1, "replay.read")]
    stored = pq.read_table(mine["filename"], partitioning=None)
    copy = stored.filter(pc.equal(stored["span_id"], mine["span_id"]))
    parent = mine["span_id"] if loop == "to_itself" else child["span_id"]
    at = copy.schema.get_field_index("parent_span_id")
    copy = copy.set_column(at, copy.schema.field(at), pa.array([parent], pa.string()))
    pq.write_table(copy, mine["filename"].rpartition("/")[0] + "/part-0000000000000000001-copy.parquet")
    with otel_replay.open(dataset) as store:
        tree = [(t["depth"], t["name"]) for t in store.causal_tree(d.record_id)]
    assert tree == honest  # was: the decision and its read listed again at every level, 65 and 64 times


def test_a_decision_given_a_number_as_correlation_id_is_in_that_chain_or_refused(telemetry, dataset):
    from otel_replay import CaptureError

    tracer = DecisionTracer()
    try:
        record_id = tracer.decision("a", "step", "numbered", correlation_id=42)  # type: ignore[arg-type]
    except CaptureError:
        return  # refused where it was given: nothing goes missing
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        chain = ReplayBuilder(store).build_trade_chain("42")
    assert [t["record_id"] for t in chain.traces] == [record_id]  # is: an empty chain, "nothing was recorded"


@pytest.mark.xfail(
    strict=True,
    reason="the record views leave out a row whose JSON repeats a key (no single meaning), not one that holds a "
    "promoted id both in its column and in the JSON, differently; `verify` names both unreadable. Leaving it out of "
    "decisions_in/audit_entries_in changes the rule compaction's facts files were written with (storage/facts.py)",
)
def test_a_record_whose_id_column_and_json_disagree_is_in_no_chain(telemetry, dataset):
    import json

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from otel_replay.integrity import load_signing_key

    tracer = DecisionTracer()
    record_id = tracer.decision("a", "step", "which trade?", correlation_id="trade-a")
    telemetry.force_flush()
    with otel_replay.open(dataset) as store:
        [row] = store.rows("SELECT filename FROM spans WHERE record_id = ?", [record_id])
    table = pq.read_table(row["filename"], partitioning=None)
    mine = pc.equal(table["record_id"], record_id)
    edited = [
        json.dumps({**json.loads(a), "replay.correlation_id": "trade-b"}) if m else a
        for a, m in zip(table["attributes"].to_pylist(), mine.to_pylist(), strict=True)
    ]
    at = table.schema.get_field_index("attributes")
    pq.write_table(table.set_column(at, table.schema.field(at), pa.array(edited, pa.string())), row["filename"])
    with otel_replay.open(dataset) as store:
        [problem] = store.verify([load_signing_key(create=False)]).problems
        assert "stored both in column correlation_id and in the JSON" in str(problem)  # verify: no single meaning
        chains = {cid: ReplayBuilder(store).build_trade_chain(cid).traces for cid in ("trade-a", "trade-b")}
    assert chains == {"trade-a": [], "trade-b": []}  # is: trade-a's chain shows it as trade-a's, nothing said


@pytest.mark.xfail(
    strict=True,
    reason="the record views count a span once per (trace_id, span_id), and DISTINCT ON takes NULL ids as equal: "
    "distinct records without ids (a foreign file's; OTLP ingest refuses such spans) collapse into one. Fix: key "
    "rows without ids by their content, or have the file triage refuse a span file whose id columns hold NULLs",
)
def test_records_of_a_foreign_file_without_span_ids_are_not_collapsed_into_one(dataset):
    import pyarrow as pa
    import pyarrow.parquet as pq

    partition = dataset / "spans" / "date=2026-11-30"
    partition.mkdir(parents=True)
    n = 3
    pq.write_table(
        pa.table(
            {
                "trace_id": pa.array([None] * n, pa.string()),
                "span_id": pa.array([None] * n, pa.string()),
                "name": ["replay.audit_entry"] * n,
                "start_time": pa.array([1_796_000_000_000_000_000 + i for i in range(n)], pa.timestamp("ns", tz="UTC")),
                "correlation_id": ["inc-9"] * n,
                "replay_kind": ["audit_entry"] * n,
                "record_id": [f"entry-{i}" for i in range(n)],
                "attributes": [f'{{"replay.audit.event_type": "step {i}"}}' for i in range(n)],
            }
        ),
        partition / "foreign.parquet",
    )
    with otel_replay.open(dataset) as store:
        chain = ReplayBuilder(store).build_incident_chain("inc-9")
    assert [e["event_type"] for e in chain.audit_entries] == ["step 0", "step 1", "step 2"]  # is: ["step 0"]
