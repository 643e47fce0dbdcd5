"""Issue 20: a gated commit is write-ahead; a process killed at any step leaves nothing half-said.

A child process (forked from the session's zygote: a real process of its own that skips the
interpreter's start and the imports) does a gated refund inside ``audit()`` (a read, a model call,
the act, ``gate.commit``) on a rail that notes each refund in a file, and
dies (``os._exit(0)`` or SIGKILL) at one step: before the rail, inside it,
right after ``commit()`` returned, or inside the conversion of the
write-ahead log to Parquet. The dataset is then reopened and checked.
"""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import pytest

import otel_replay
from otel_replay import FixAction, replay_stored
from otel_replay.errors import RecordNotFound
from otel_replay.gate import reads
from tests._support import Zygote

KEY = "write-ahead-test-key-0123456789abcdef"

_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import otel_replay
    from otel_replay import Action, ActionGate, DependencySnapshot, audit

    dataset, step, how, executed = sys.argv[1:5]

    def die():
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(0)

    class Rail:
        def commit(self, action):
            with open(executed, "a") as handle:  # the rail's own book: what really happened
                handle.write(action.arguments["order"] + "\\n")
                handle.flush()
                os.fsync(handle.fileno())
            if step == "inside_rail":
                die()
            return {"receipt_id": "refund-" + action.arguments["order"], "amount": action.cost}

        def compensate(self, receipt, *, idempotency_key):
            pass

    if step.startswith("converting"):
        import otel_replay.storage.convert as convert
        if step == "converting_bytes":
            import otel_replay.capture.kept_spans as kept_spans
            kept_spans.KEPT_BYTES = 0  # no record held as spans: the segment converts from its bytes
        real = convert.ChunkWriter.flush

        def flush_then_die(self):
            real(self)  # the segment's Parquet file is written, the segment not yet released
            if self.paths:
                print("converted-by:" + sys._getframe(1).f_globals["__name__"], flush=True)
                die()

        convert.ChunkWriter.flush = flush_then_die

    telemetry = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600)
    gate = ActionGate(Rail(), dataset=dataset)
    if step.startswith("fsync-"):  # die inside the log's Nth fdatasync: written, not yet acknowledged
        synced, real_sync = [0], os.fdatasync

        def dying_sync(fd):
            synced[0] += 1
            if synced[0] == int(step[6:]):
                die()
            real_sync(fd)

        os.fdatasync = dying_sync
    with audit("refund", snapshot=DependencySnapshot({"balance": 100}, version="v1"), correlation_id="trade-9") as d:
        print(d.record_id, flush=True)
        d.read(order="o-1", customer="c\\u00e9-9")
        d.model("gpt-x", decision_basis="refund policy", output={"refund": True})
        action = Action("refund", {"order": "o-1"}, cost=25.0)
        d.act(action)
        if step == "before_rail":
            die()
        if step == "after_commit_on_a_pool_thread":  # no context is carried there: the block is open elsewhere
            import concurrent.futures
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                pool.submit(gate.commit, action, record_id=d.record_id).result()
        else:
            gate.commit(action, record_id=d.record_id)
        print("acknowledged", flush=True)
        if step.startswith("after_commit"):
            die()
        if step.startswith("converting"):
            telemetry.force_flush()
    telemetry.shutdown()
    """
)


def _run(zygote: Zygote, tmp_path: Path, step: str, how: str) -> tuple[Path, str, list[str], list[str]]:
    """Run the child (a real process, forked from the session's zygote) to its death at ``step``: (dataset,
    decision id, its output lines, the rail's book)."""
    dataset = tmp_path / "traces"
    executed = tmp_path / "rail.txt"
    env = {**os.environ, "OTEL_REPLAY_SIGNING_KEY": KEY}
    child = zygote.run(_CHILD, str(dataset), step, how, str(executed), env=env)
    assert child.returncode in (0, -9), child.stderr
    lines = child.stdout.split()
    book = executed.read_text().split() if executed.exists() else []
    return dataset, lines[0], lines[1:], book


def _reopen(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the next agent does: ``configure()`` on the dataset (converting what the dead one left), then shut down."""
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", KEY)
    otel_replay.configure(dataset, set_global=False).shutdown()


def _gates(store: otel_replay.Store, decision_id: str) -> list[str]:
    rows = store.rows("SELECT executed FROM gates WHERE decision_id = ? ORDER BY recorded_at", [decision_id])
    return [row["executed"] for row in rows]


def _no_row_twice(store: otel_replay.Store) -> None:
    twice = store.rows("SELECT span_id, count(*) AS n FROM spans GROUP BY span_id HAVING count(*) > 1")
    assert twice == []


STALE = {"balance": 0}


def _policy(state, action):
    return state["balance"] >= action.cost, "balance covers it" if state["balance"] >= action.cost else "no balance"


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_process_dying_before_the_rail_leaves_nothing_executed_and_no_commit(zygote, tmp_path, monkeypatch, how):
    dataset, decision_id, said, book = _run(zygote, tmp_path, "before_rail", how)
    _reopen(dataset, monkeypatch)
    assert book == [] and said == []
    with otel_replay.open(dataset) as store:
        assert _gates(store, decision_id) == []
        assert reads.commits_for(store, decision_id) == []


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_process_dying_inside_the_rail_leaves_an_intent_shown_as_executed_unknown(zygote, tmp_path, monkeypatch, how):
    dataset, decision_id, said, book = _run(zygote, tmp_path, "inside_rail", how)
    assert book == ["o-1"] and said == []  # the rail refunded; commit() never returned
    _reopen(dataset, monkeypatch)
    with otel_replay.open(dataset) as store:
        assert _gates(store, decision_id) == ["intent"]  # never silently absent
        assert reads.commits_for(store, decision_id) == []
        [(intent_id, action)] = store.unknown_commits_for(decision_id)
        assert action.type == "refund" and action.arguments == {"order": "o-1"}
        report = store.verify(None)
        assert [p.record_id for p in report.unknown_commits] == [intent_id]
        assert "executed? unknown - check the rail" in str(report.unknown_commits[0])
        verdict = replay_stored(store, decision_id, live_state={"balance": 100}, policy=_policy)
    assert verdict.fix is FixAction.HUMAN_REVIEW  # the policy alone would allow it: a human checks the rail
    assert "executed? unknown - check the rail" in verdict.reason and intent_id in verdict.reason


@pytest.mark.parametrize("how", ["exit", "kill"])
@pytest.mark.parametrize("step", ["after_commit", "after_commit_on_a_pool_thread"], ids=["in-the-block", "pool-thread"])
def test_a_process_dying_right_after_commit_keeps_the_decision_it_executed(zygote, tmp_path, monkeypatch, how, step):
    # pool-thread: the commit runs on a thread of a pool while the block is open (run_in_executor, an executor's
    # submit): the thread has no context, so no current decision; the intent still carries the decision.
    dataset, decision_id, said, book = _run(zygote, tmp_path, step, how)
    assert book == ["o-1"] and said == ["acknowledged"]
    _reopen(dataset, monkeypatch)
    with otel_replay.open(dataset) as store:
        assert _gates(store, decision_id) == ["intent", "committed"]  # the acknowledged record is there
        assert [r["receipt_id"] for r in reads.receipts_for(store, decision_id)] == ["refund-o-1"]
        assert store.unknown_commits_for(decision_id) == []
        with pytest.raises(RecordNotFound):
            store.record(decision_id)  # the decision span itself was still in the batch queue
        acted = reads.intent_decision(store, decision_id)
        assert acted is not None and acted.record_id == decision_id
        assert acted.snapshot is not None and dict(acted.snapshot.state) == {"balance": 100}
        assert dict(acted.inputs) == {"order": "o-1", "customer": "c\u00e9-9"}
        assert [m.model_id for m in acted.models] == ["gpt-x"] and acted.action is not None
        assert acted.action.cost == 25.0
        verdict = replay_stored(store, decision_id, live_state=STALE, policy=_policy)  # was: RecordNotFound
        assert store.verify(None).unknown_commits == []
        _no_row_twice(store)
    assert verdict.fix is FixAction.ROLLBACK and verdict.record_id == decision_id


@pytest.mark.parametrize("how", ["exit", "kill"])
@pytest.mark.parametrize(
    ("step", "converter"),
    [("converting", "otel_replay.capture.kept_spans"), ("converting_bytes", "otel_replay.capture.log_recovery")],
    ids=["from-held-spans", "from-bytes"],
)
def test_a_process_dying_while_converting_its_log_leaves_every_record_once(
    zygote, tmp_path, monkeypatch, how, step, converter
):
    dataset, decision_id, said, book = _run(zygote, tmp_path, step, how)
    assert said == ["acknowledged", f"converted-by:{converter}"] and book == ["o-1"]
    written = sorted(p.name for p in (dataset / "spans").rglob("wal-*.parquet"))
    assert written  # the conversion had written its file when the process died
    _reopen(dataset, monkeypatch)
    assert sorted(p.name for p in (dataset / "spans").rglob("wal-*.parquet")) == written  # rewritten, not added
    assert not list((dataset / "_wal").glob("capture-*"))  # converted and removed
    with otel_replay.open(dataset) as store:
        assert _gates(store, decision_id) == ["intent", "committed"]
        _no_row_twice(store)
        assert store.verify(None).problems == []


@pytest.mark.parametrize("how", ["exit", "kill"])
@pytest.mark.parametrize("step", ["fsync-1", "fsync-2"], ids=["in-the-intents-fsync", "in-the-commit-records-fsync"])
def test_a_process_dying_inside_a_records_fsync_leaves_no_commit_without_its_intent(
    zygote, tmp_path, monkeypatch, how, step
):
    dataset, decision_id, said, book = _run(zygote, tmp_path, step, how)
    assert said == []  # commit() never returned
    assert book == ([] if step == "fsync-1" else ["o-1"])  # the rail runs only once the intent is durable
    _reopen(dataset, monkeypatch)
    with otel_replay.open(dataset) as store:
        gates = _gates(store, decision_id)
        unknown = [intent for intent, _ in store.unknown_commits_for(decision_id)]
        assert gates in ([], ["intent"], ["intent", "committed"])  # the written bytes may outlive the process
        assert bool(unknown) == (gates == ["intent"])  # an intent alone: executed? unknown, never silent
        assert [p.record_id for p in store.verify(None).unknown_commits] == unknown
        _no_row_twice(store)


def test_without_a_gate_nothing_is_written_ahead(tmp_path):
    dataset = tmp_path / "traces"
    with otel_replay.configure(dataset, set_global=False):
        with otel_replay.audit("refund", snapshot=otel_replay.DependencySnapshot({})) as d:
            d.act(otel_replay.Action("refund", {"order": "o-2"}))
        assert not (dataset / "_wal").exists()  # no log directory, no fsync: nothing waits on the disk


def _left_behind(zygote: Zygote, tmp_path: Path) -> tuple[Path, str]:
    """A dataset whose only copy of an acknowledged commit is the write-ahead log of a process that died."""
    dataset, decision_id, said, _ = _run(zygote, tmp_path, "after_commit", "kill")
    assert said == ["acknowledged"] and list((dataset / "_wal").glob("capture-*/*.wal"))
    return dataset, decision_id


def test_compact_converts_the_log_a_dead_process_left(zygote, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from otel_replay.cli import main

    dataset, decision_id = _left_behind(zygote, tmp_path)
    result = CliRunner().invoke(main, ["compact", str(dataset)])
    assert result.exit_code == 0, result.output
    assert "recovered 2 span(s) from write-ahead logs left by processes that died" in result.output
    assert not list((dataset / "_wal").glob("capture-*"))
    with otel_replay.open(dataset) as store:
        assert _gates(store, decision_id) == ["intent", "committed"]


def test_serve_converts_the_log_a_dead_process_left_instead_of_calling_it_stranded(zygote, tmp_path):
    from otel_replay.server import Receiver, ServerConfig
    from otel_replay.server.server import stranded_wal_dirs

    dataset, decision_id = _left_behind(zygote, tmp_path)
    config = ServerConfig(dataset, grpc=None, http=None, convert_workers=0)
    receiver = Receiver(config)
    try:
        assert receiver.recovered_capture_spans == 2
        assert receiver.stranded == [] and stranded_wal_dirs(config) == []
    finally:
        receiver.stop()
    with otel_replay.open(dataset) as store:
        assert _gates(store, decision_id) == ["intent", "committed"]


_FORKED = textwrap.dedent(
    """
    import os, sys, warnings
    import otel_replay
    from otel_replay import Action, ActionGate, ReferenceLedger

    warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded, fork() may deadlock": none is held
    dataset = sys.argv[1]
    telemetry = otel_replay.configure(dataset, set_global=False)
    gate = ActionGate(ReferenceLedger(1000), dataset=dataset)
    gate.commit(Action("refund", {"order": "parent-1"}, cost=1.0), record_id="parent-1")
    with otel_replay.audit("refund", snapshot=otel_replay.DependencySnapshot({})):
        pass  # a record held for the parent's next write-ahead: the parent's, never the child's too
    pid = os.fork()
    if pid == 0:
        gate.commit(Action("refund", {"order": "child-1"}, cost=1.0), record_id="child-1")
        telemetry.shutdown()  # the child's own log: the parent's is neither sealed nor removed
        os._exit(0)
    os.waitpid(pid, 0)
    gate.commit(Action("refund", {"order": "parent-2"}, cost=1.0), record_id="parent-2")
    telemetry.shutdown()
    """
)


def test_a_forked_child_commits_through_a_log_of_its_own(zygote, tmp_path):
    dataset = tmp_path / "traces"
    env = {**os.environ, "OTEL_REPLAY_SIGNING_KEY": KEY}
    child = zygote.run(_FORKED, str(dataset), env=env)
    assert child.returncode == 0, child.stderr
    assert "write-ahead log" not in child.stderr
    with otel_replay.open(dataset) as store:
        for decision_id in ("parent-1", "child-1", "parent-2"):
            assert _gates(store, decision_id) == ["intent", "committed"], decision_id
        assert len(store.rows("SELECT record_id FROM decisions")) == 1
        _no_row_twice(store)


_DISK_FULL = textwrap.dedent(
    """
    import resource, signal, sys
    import otel_replay
    from otel_replay import Action, ActionGate, ReferenceLedger
    from otel_replay.errors import GateError

    dataset = sys.argv[1]
    telemetry = otel_replay.configure(dataset, set_global=False)
    ledger = ReferenceLedger(1000)
    gate = ActionGate(ledger, dataset=dataset)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, hard))  # the log cannot take the intent
    try:
        gate.commit(Action("refund", {"order": "o-3"}, cost=5.0), record_id="full-1")
    except GateError as exc:
        print("refused:", exc)
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    telemetry.shutdown()
    print("balance", ledger.balance)
    """
)


def test_a_commit_whose_intent_cannot_be_made_durable_is_refused_before_the_rail(zygote, tmp_path):
    dataset = tmp_path / "traces"
    env = {**os.environ, "OTEL_REPLAY_SIGNING_KEY": KEY}
    child = zygote.run(_DISK_FULL, str(dataset), env=env)
    assert child.returncode == 0, child.stderr
    assert "refused: refund (decision full-1) was not committed: its intent could not be written" in child.stdout
    assert "balance 1000.0" in child.stdout  # the rail was never called
    with otel_replay.open(dataset) as store:
        assert _gates(store, "full-1") == ["intent", "commit_refused"]  # the intent is answered: not "unknown"
        assert store.unknown_commits_for("full-1") == []
        assert reads.commits_for(store, "full-1") == []


def test_a_damaged_log_left_behind_is_salvaged_record_by_record(zygote, tmp_path, caplog):
    dataset, decision_id = _left_behind(zygote, tmp_path)
    (segment,) = (dataset / "_wal").glob("capture-*/*.wal")
    data = bytearray(segment.read_bytes())
    data[40] ^= 0xFF  # inside the first record (the intent); the commit record after it is whole
    segment.write_bytes(bytes(data))
    with otel_replay.open(dataset) as store:  # was: the log kept failing, and the commit never reached Parquet
        assert _gates(store, decision_id) == ["committed"]
    assert "could not be converted whole" in caplog.text and "dropped 0 span(s) and 1 record(s)" in caplog.text
    assert not list((dataset / "_wal").glob("capture-*/*.wal"))  # nothing left to convert (the damaged one: kept)


def test_a_process_that_exits_without_shutdown_converts_its_log_at_exit(zygote, tmp_path):
    dataset = tmp_path / "traces"
    code = textwrap.dedent(
        """
        import sys
        import otel_replay
        from otel_replay import Action, ActionGate, ReferenceLedger

        otel_replay.configure(sys.argv[1], set_global=False)
        ActionGate(ReferenceLedger(10), dataset=sys.argv[1]).commit(Action("refund", {"o": 1}), record_id="d-9")
        """
    )
    env = {**os.environ, "OTEL_REPLAY_SIGNING_KEY": KEY}
    child = zygote.run(code, str(dataset), env=env)  # a script that ends normally: its exit handlers run
    assert child.returncode == 0, child.stderr
    assert not list((dataset / "_wal").glob("capture-*"))  # converted by the process itself, at exit
    assert list((dataset / "spans").rglob("wal-capture-*.parquet"))


def test_an_empty_log_directory_is_left_alone_until_it_is_old(tmp_path, monkeypatch):
    from otel_replay.capture.write_ahead import recover

    dataset = tmp_path / "traces"
    young = dataset / "_wal" / "capture-1-0000abcd"  # maybe a log opening right now, before it takes its lock
    young.mkdir(parents=True)
    recover(str(dataset))
    assert young.is_dir()
    os.utime(young, (1_000_000_000, 1_000_000_000))  # a dead process's empty leftover
    recover(str(dataset))
    assert not young.exists()


def test_a_gated_tool_seals_its_decision_in_the_intent_before_the_rail(tmp_path, monkeypatch):
    from otel_replay.instrumentation import tool

    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", KEY)
    dataset = tmp_path / "traces"
    ledger = otel_replay.ReferenceLedger(100)
    seen: list[str] = []

    class Rail:
        def commit(self, action):
            seen.extend(_logged_executed(dataset))  # what is durable when the rail is called
            return ledger.commit(action)

        def compensate(self, receipt, *, idempotency_key):
            ledger.compensate(receipt, idempotency_key=idempotency_key)

    gate = otel_replay.ActionGate(Rail(), dataset=dataset)
    state = otel_replay.DependencySnapshot({"limit": 50}, version="v2")

    @tool(side_effect="financial", gate=gate, snapshot=state)
    def refund(order: str, amount: float) -> otel_replay.Action:
        return otel_replay.Action("refund", {"order": order}, cost=amount)

    with otel_replay.configure(dataset, set_global=False):
        receipt = refund("o-7", 20.0)
    assert seen == ["intent"]  # the intent was fsynced before the rail ran
    with otel_replay.open(dataset) as store:
        (decision_id,) = [r["decision_id"] for r in store.rows("SELECT decision_id FROM gates WHERE executed='intent'")]
        acted = reads.intent_decision(store, decision_id)
        assert acted is not None and acted.decision_type == "refund"
        assert acted.snapshot is not None and acted.snapshot.version == "v2"
        assert acted.action == otel_replay.Action("refund", {"order": "o-7"}, cost=20.0)
        assert store.record(decision_id).action == acted.action  # the block ended: its own record agrees
        assert [r["receipt_id"] for r in reads.receipts_for(store, decision_id)] == [receipt.receipt_id]


def _logged_executed(dataset: Path) -> list[str]:
    """``replay.gate.executed`` of every gate span fsynced in the dataset's capture write-ahead logs now."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from otel_replay.storage.wal import read_records

    found = []
    for segment in sorted((dataset / "_wal").glob("capture-*/*.wal")):
        for payload in read_records(segment):
            request = ExportTraceServiceRequest.FromString(payload)
            for span in (s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans):
                attrs = {kv.key: kv.value.string_value for kv in span.attributes}
                if "replay.gate.executed" in attrs:
                    found.append(attrs["replay.gate.executed"])
    return found


def test_verify_names_an_intent_without_a_commit_record_as_executed_unknown(zygote, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from otel_replay.cli import main

    dataset, decision_id, _, book = _run(zygote, tmp_path, "inside_rail", "kill")
    assert book == ["o-1"]
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", KEY)
    result = CliRunner().invoke(main, ["verify", str(dataset)])
    assert result.exit_code == 0, result.output  # not an integrity failure: every record verified
    assert "commit intent of 'refund' for decision " + decision_id in result.output
    assert "has no commit record: executed? unknown - check the rail" in result.output


def test_a_rail_call_interrupted_shows_in_the_trade_chain_as_executed_unknown(tmp_path, monkeypatch, capsys):
    from otel_replay.cli.render import print_chain

    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", KEY)
    dataset = tmp_path / "traces"

    class Rail:
        def commit(self, action):
            raise KeyboardInterrupt  # Ctrl-C while the payment call was in flight: did it go through?

        def compensate(self, receipt, *, idempotency_key):
            pass

    gate = otel_replay.ActionGate(Rail(), dataset=dataset)
    with otel_replay.configure(dataset, set_global=False):
        with pytest.raises(KeyboardInterrupt):
            with otel_replay.audit("refund", snapshot=otel_replay.DependencySnapshot({}), correlation_id="t-1") as d:
                action = otel_replay.Action("refund", {"order": "o-8"}, cost=3.0)
                d.act(action)
                gate.commit(action, record_id=d.record_id)
    with otel_replay.open(dataset) as store:
        chain = otel_replay.ReplayBuilder(store).build_trade_chain("t-1")
        [(intent_id, _)] = store.unknown_commits_for(d.record_id)
    [trace] = chain.traces
    assert trace["record_id"] == d.record_id and trace["unknown_commits"] == [intent_id]
    print_chain(chain)
    assert "executed? unknown" in capsys.readouterr().out  # the outcome column (--json: the intent ids)


@pytest.mark.parametrize(
    ("step", "unknown"), [("inside_rail", True), ("after_commit", False), ("after_commit_on_a_pool_thread", False)]
)
def test_the_trade_chain_shows_a_decision_lost_with_its_process_from_its_intent(
    zygote, tmp_path, monkeypatch, step, unknown
):
    dataset, decision_id, _, _ = _run(zygote, tmp_path, step, "kill")
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", KEY)
    with otel_replay.open(dataset) as store:
        chain = otel_replay.ReplayBuilder(store).build_trade_chain("trade-9")
        intents = [gate_id for gate_id, _ in store.unknown_commits_for(decision_id)]
    [trace] = chain.traces  # was: an empty chain, the refund nowhere in it
    assert trace["record_id"] == decision_id and trace["from_intent"] is True
    assert trace["action_type"] == "refund" and trace["snapshot_state"] == {"balance": 100}
    assert trace["unknown_commits"] == intents and bool(intents) is unknown


def _spans_of_every_kind() -> list:
    """Finished SDK spans with every field and attribute type OTLP carries, hostile values included."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import (
        Link,
        NonRecordingSpan,
        SpanContext,
        SpanKind,
        Status,
        StatusCode,
        TraceState,
        set_span_in_context,
    )

    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "caf\u00e9 \U0001f600", "n": 3, "z": 0.0}, schema_url="https://r/1"),
        span_limits=SpanLimits(max_attributes=40, max_events=2, max_links=2),
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("scope \u00e9", "1.2", schema_url="https://s/2", attributes={"scope.attr": 1})
    values = {
        "text": "r\u00e9sum\u00e9 \U0001f600 \x00 nul",
        "empty": "",
        "no": False,
        "yes": True,
        "zero": 0,
        "negative": -5,
        "int64 max": (1 << 63) - 1,
        "int64 min": -(1 << 63),
        "past 64 bits": 1 << 70,  # the SDK's encoder drops it (and logs): the log's record must do the same
        "lone surrogate": "\ud800",  # likewise
        "float zero": 0.0,
        "negative zero": -0.0,
        "nan": float("nan"),
        "inf": float("-inf"),
        "tiny": 5e-324,
        "strings": ("a", "", "\U0001f600"),
        "ints": [1, -2, 0],
        "bools": [True, False],
        "floats": (1.5, 0.0),
        "with none": ["a", None],
        "empty list": [],
        "long": "x" * 70_000,  # lengths past the one- and two-byte varints
        "\u00e9 key": "v",
    }
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_state=TraceState([("k", "v"), ("k2", "v2")]))
    with tracer.start_as_current_span("parent", kind=SpanKind.SERVER) as parent:
        span = tracer.start_span(
            "child \u00e9", kind=SpanKind.CLIENT, attributes=values, links=[Link(parent.get_span_context(), {"l": 1})]
        )
        for i in range(3):  # one more than the limit: a dropped event is counted
            span.add_event(f"event {i}", {"i": i, "s": "x"}, timestamp=1000 + i)
        span.add_event("", {})
        span.set_status(Status(StatusCode.ERROR, "boom \u00e9"))
        span.end()
        tracer.start_span("", kind=SpanKind.PRODUCER, start_time=0).end(end_time=1)
        for extra in range(3):
            span = tracer.start_span("links", links=[Link(remote, {"x": extra}), Link(remote), Link(remote)])
            span.end()
    with tracer.start_as_current_span("remote parent", context=set_span_in_context(NonRecordingSpan(remote))):
        tracer.start_span("consumer", kind=SpanKind.CONSUMER).end()
    many = tracer.start_span("many", attributes={f"a{i}": i for i in range(50)})  # past the attribute limit
    many.set_status(Status(StatusCode.OK))
    many.end()
    return list(exporter.get_finished_spans())


def test_log_records_hold_the_message_the_sdk_encoder_makes_for_every_kind_of_span(caplog):
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from otel_replay.capture.write_ahead import _RequestEncoder

    spans = _spans_of_every_kind()
    encoder = _RequestEncoder()
    groups = [[span] for span in spans] + [spans, spans[:3]]  # one record may hold several spans
    for group in groups:
        ours = ExportTraceServiceRequest.FromString(encoder.encode(group))
        theirs = encode_spans(group)
        assert ours.SerializeToString(deterministic=True) == theirs.SerializeToString(deterministic=True), group
    child = spans[0]
    assert child.name == "child \u00e9" and child.dropped_events == 2 and child.dropped_links == 0
    [request] = [ExportTraceServiceRequest.FromString(encoder.encode([child]))]
    kept = {kv.key for kv in request.resource_spans[0].scope_spans[0].spans[0].attributes}
    assert "text" in kept and "past 64 bits" not in kept and "lone surrogate" not in kept  # as the SDK does


def test_log_records_of_spans_from_two_providers_each_keep_their_own_resource():
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_replay.capture.write_ahead import _RequestEncoder

    spans = []
    for name in ("one", "two"):
        exporter = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({"service.name": name}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        provider.get_tracer(name).start_span("s").end()
        spans += exporter.get_finished_spans()
    encoder = _RequestEncoder()
    for group in ([spans[0]], [spans[1]], [spans[0]], spans):  # the second resource is not served the first's
        ours = type(encode_spans(group)).FromString(encoder.encode(group))
        assert ours.SerializeToString(deterministic=True) == encode_spans(group).SerializeToString(deterministic=True)


def test_log_records_of_spans_made_by_hand_with_plain_attribute_mappings_hold_the_sdk_encoders_message():
    """The log reads an SDK span's attribute dict directly; a span holding another mapping is read as it is."""
    from types import MappingProxyType

    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext

    from otel_replay.capture.write_ahead import _RequestEncoder

    resource, scope = Resource.create({"service.name": "hand"}), InstrumentationScope("hand", "1")
    values = {"text": "r\u00e9sum\u00e9 \U0001f600", "n": 3, "long": "x" * 5_000, "flags": (True, False), "f": 0.5}
    spans = [
        ReadableSpan(
            name=f"by hand {i}",
            context=SpanContext(0xABC + i, 0xDEF + i, is_remote=False),
            resource=resource,
            attributes=attributes,
            instrumentation_scope=scope,
            start_time=10,
            end_time=20,
        )
        for i, attributes in enumerate([values, MappingProxyType(values), {}, None])
    ]
    encoder = _RequestEncoder()
    for group in [[span] for span in spans] + [spans]:
        assert encoder._encode(group)  # written by the log's own encoder, not handed to the SDK's
        ours = type(encode_spans(group)).FromString(encoder.encode(group))
        assert ours.SerializeToString(deterministic=True) == encode_spans(group).SerializeToString(deterministic=True)


def test_log_records_hold_the_sdk_encoders_message_for_texts_of_every_length_once_their_prefixes_are_kept(
    monkeypatch,
):
    """A text field's bytes before the text are kept per key and length (bounded): kept or not, the same bytes."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Link, SpanContext

    from otel_replay.capture import log_encoding

    monkeypatch.setattr(log_encoding, "_KEY_INFOS", {b"\x4a": {}, b"\x1a": {}, b"\x22": {}})
    monkeypatch.setattr(log_encoding, "_PREFIX_SIZES", 3)  # past it, lengths are computed each time
    monkeypatch.setattr(log_encoding, "_PREFIX_KEYS", 2)  # past it, keys are computed each time
    resource, scope = Resource.create({"service.name": "lengths"}), InstrumentationScope("lengths", "1")
    lengths = [0, 1, 2, 120, 121, 127, 128, 4090, 4096, 16_380, 16_384, 70_000]
    spans = []
    for i, size in enumerate(lengths * 2):  # each length twice: computed, then (within the bounds) kept
        text = ("\u00e9" * (size // 2) + "x" * (size % 2)) if i % 3 == 0 else "y" * size
        attributes = {"same key": text, f"key {i % 4}": text, "n": i}
        spans.append(
            ReadableSpan(
                name=f"texts {size}",
                context=SpanContext(0xABC + i, 0xDEF + i, is_remote=False),
                resource=resource,
                attributes=attributes,
                events=[Event("e", {"same key": text}, timestamp=5)],
                links=[Link(SpanContext(0x123, 0x456 + i, is_remote=True), {"same key": text})],
                instrumentation_scope=scope,
                start_time=10,
                end_time=20,
            )
        )
    encoder = log_encoding.RequestEncoder()
    for span in spans:
        assert encoder._encode([span])  # written by the log's own encoder, not handed to the SDK's
        ours = type(encode_spans([span])).FromString(encoder.encode([span]))
        assert ours.SerializeToString(deterministic=True) == encode_spans([span]).SerializeToString(deterministic=True)
    infos = log_encoding._KEY_INFOS.values()
    assert all(len(info[1]) <= 3 for keys in infos for info in keys.values())  # lengths kept per key
    assert all(len(keys) <= 2 for keys in infos)  # keys kept per tag
    assert any(len(info[1]) == 3 for keys in infos for info in keys.values())  # kept up to the bound


@pytest.mark.parametrize("failing", ["intent", "committed"])
def test_a_gate_record_whose_fsync_failed_is_stored_once(tmp_path, monkeypatch, failing):
    import errno

    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", KEY)
    dataset = tmp_path / "traces"
    ledger = otel_replay.ReferenceLedger(100)
    gate = otel_replay.ActionGate(ledger, dataset=dataset)
    real = os.fdatasync
    calls: list[int] = []

    def flaky(fd: int) -> None:
        calls.append(fd)
        if len(calls) == (1 if failing == "intent" else 2):  # the log's disk reports an I/O error once
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    with otel_replay.configure(dataset, set_global=False):
        monkeypatch.setattr(os, "fdatasync", flaky)
        try:
            gate.commit(otel_replay.Action("refund", {"order": "o-5"}, cost=1.0), record_id="d-5")
        except otel_replay.GateError:
            assert failing == "intent"
        monkeypatch.setattr(os, "fdatasync", real)
    with otel_replay.open(dataset) as store:
        # Was: the record's bytes stayed in the log (written, not synced) while its span went to the batch queue
        # as one that never reached the log: converted from both, it was stored twice.
        _no_row_twice(store)
        expected = ["intent", "commit_refused"] if failing == "intent" else ["intent", "committed"]
        assert sorted(_gates(store, "d-5")) == sorted(expected)


def test_a_clock_stepped_back_inside_the_rail_leaves_the_commit_answering_its_intent(tmp_path, monkeypatch):

    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", KEY)
    dataset = tmp_path / "traces"
    real = time.time_ns

    class Rail:
        def commit(self, action):  # NTP steps the clock back two days while the payment is in flight
            monkeypatch.setattr(time, "time_ns", lambda: real() - 2 * 86_400 * 10**9)
            return {"receipt_id": "r-back"}

        def compensate(self, receipt, *, idempotency_key):
            pass

    gate = otel_replay.ActionGate(Rail(), dataset=dataset)
    with otel_replay.configure(dataset, set_global=False):
        with otel_replay.audit("refund", snapshot=otel_replay.DependencySnapshot({}), correlation_id="t-b") as d:
            action = otel_replay.Action("refund", {"order": "o-b"}, cost=2.0)
            d.act(action)
            gate.commit(action, record_id=d.record_id)
    monkeypatch.setattr(time, "time_ns", real)
    with otel_replay.open(dataset) as store:
        assert sorted(_gates(store, d.record_id)) == ["committed", "intent"]  # the commit recorded "before" it
        assert store.unknown_commits_for(d.record_id) == []
        assert store.verify(None).problems == [] and store.verify(None).unknown_commits == []
        assert [r["receipt_id"] for r in reads.receipts_for(store, d.record_id)] == ["r-back"]
        _no_row_twice(store)


@pytest.mark.parametrize(
    "decision_id",
    ["x' OR '1'='1", "../../etc/passwd", "a\nb\r\n", "\x00nul", " ", "é✓🙂", "None", "d" * 100_000],
    ids=["sql", "path", "newlines", "nul", "space", "unicode", "none-text", "100k"],
)
def test_an_intent_under_a_hostile_decision_id_is_found_by_that_id_and_named_by_verify(
    tmp_path, monkeypatch, decision_id
):
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", KEY)
    dataset = tmp_path / "traces"

    class Rail:
        def commit(self, action):
            raise KeyboardInterrupt  # the payment call was in flight: did it go through?

        def compensate(self, receipt, *, idempotency_key):
            pass

    gate = otel_replay.ActionGate(Rail(), dataset=dataset)
    with otel_replay.configure(dataset, set_global=False):
        for record_id in ("plain", decision_id):
            with pytest.raises(KeyboardInterrupt):
                gate.commit(otel_replay.Action("refund", {"order": "o-h"}, cost=1.0), record_id=record_id)
    with otel_replay.open(dataset) as store:
        [(intent_id, action)] = store.unknown_commits_for(decision_id)
        assert action.arguments == {"order": "o-h"}
        [plain] = store.unknown_commits_for("plain")  # each id finds its own intent only
        assert plain[0] != intent_id
        named = {p.record_id: p.problem for p in store.verify(None).unknown_commits}
    assert set(named) == {intent_id, plain[0]} and f"for decision {decision_id} has no" in named[intent_id]
