from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import otel_replay
from otel_replay import AuditLog, ConfigError, DecisionTracer, audit
from otel_replay import semconv as sc
from otel_replay.cli import main
from otel_replay.integrity import load_signing_key, record_hash, restore_attributes

from ._support import payment, snapshot, timestamps_as_ints


@pytest.fixture
def records(telemetry, dataset):
    ids = []
    for cost in (100, 200, 300):
        with audit("vendor_payment", snapshot=snapshot()) as d:
            d.act(payment(cost=cost))
        ids.append(d.record_id)
    tracer = DecisionTracer()
    decision = tracer.decision("a", "t", "r", 0.5)
    ids.append(decision)
    ids.append(tracer.record_outcome(decision, True).record_id)
    ids.append(AuditLog().append("msg", source_agent="a").entry_id)
    telemetry.shutdown()
    # The outcome was written ahead, so it landed in a file of its own: compacted into one, which _rewrite edits.
    result = CliRunner().invoke(main, ["compact", str(dataset), "--grace", "0"])
    assert result.exit_code == 0, result.output
    return ids


def _verify(dataset):
    with otel_replay.open(dataset) as store:
        return store.verify(load_signing_key())


def _rewrite(dataset: Path, edit) -> None:
    """Apply ``edit(rows) -> rows`` to the dataset's single data file (times as int ns)."""
    (path,) = list((dataset / "spans").rglob("*.parquet"))
    table = pq.read_table(path)
    plain = pa.schema([f.with_type(timestamps_as_ints(f.type)) for f in table.schema])
    rows = edit(table.cast(plain).to_pylist())
    pq.write_table(pa.Table.from_pylist(rows, schema=plain).cast(table.schema), path)


def _row(rows, record_id, name="replay.decision"):
    return next(r for r in rows if r["record_id"] == record_id and r["name"] == name)


def _patch(row, change, *, rehash=False, resign=False):
    attrs = json.loads(row["attributes"])
    change(attrs)
    if rehash:
        full = restore_attributes({**row, "attributes": json.dumps(attrs)})
        attrs[sc.RECORD_HASH] = record_hash(row["name"], row["start_time"], full)
        if resign:
            attrs[sc.RECORD_SIGNATURE] = load_signing_key().sign(attrs[sc.RECORD_HASH])
    row["attributes"] = json.dumps(attrs)


def test_untouched_dataset_verifies(records, dataset):
    report = _verify(dataset)
    assert report.ok and report.records == 6 and report.chains == 1


def test_edited_record_is_named(records, dataset):
    target = records[1]

    def edit(rows):
        _patch(_row(rows, target), lambda a: a.__setitem__(sc.ACTION_COST, 20_000))
        return rows

    _rewrite(dataset, edit)
    report = _verify(dataset)
    assert [(p.record_id, p.problem) for p in report.problems] == [(target, "content edited (hash mismatch)")]
    assert report.problems[0].file.endswith(".parquet")


def test_edited_timestamp_is_an_edit(records, dataset):
    target = records[3]

    def edit(rows):
        _row(rows, target)["start_time"] -= 10**9
        return rows

    _rewrite(dataset, edit)
    assert [p.record_id for p in _verify(dataset).problems] == [target]


def test_rehash_without_key_fails_the_signature(records, dataset):
    target = records[0]

    def edit(rows):
        _patch(_row(rows, target), lambda a: a.__setitem__(sc.ACTION_COST, 1.0), rehash=True)
        return rows

    _rewrite(dataset, edit)
    report = _verify(dataset)
    assert [(p.record_id, p.problem.split(" (")[0]) for p in report.problems] == [
        (target, "signature invalid"),
        (records[1], f"link broken: predecessor {target} was re-hashed after this record was sealed"),
    ]


def test_deleted_record_is_named_by_its_successor(records, dataset):
    target = records[1]

    def edit(rows):
        return [r for r in rows if not (r["record_id"] == target and r["name"] == "replay.decision")]

    _rewrite(dataset, edit)
    report = _verify(dataset)
    assert len(report.problems) == 1
    assert report.problems[0].record_id == target and report.problems[0].problem.startswith("deleted")
    assert records[2] in report.problems[0].problem


def test_reordered_records_are_named_even_when_resigned_with_the_key(records, dataset):
    a, b = records[1], records[2]

    def edit(rows):
        ra, rb = _row(rows, a), _row(rows, b)
        seq_a = json.loads(ra["attributes"])[sc.RECORD_SEQ]
        seq_b = json.loads(rb["attributes"])[sc.RECORD_SEQ]
        _patch(ra, lambda x: x.__setitem__(sc.RECORD_SEQ, seq_b), rehash=True, resign=True)
        _patch(rb, lambda x: x.__setitem__(sc.RECORD_SEQ, seq_a), rehash=True, resign=True)
        return rows

    _rewrite(dataset, edit)
    report = _verify(dataset)
    named = {p.record_id for p in report.problems}
    assert {a, b} <= named and all("out of order" in p.problem for p in report.problems)


def test_verify_without_the_key_checks_hashes_and_links_only(records, dataset, monkeypatch):
    monkeypatch.delenv("OTEL_REPLAY_SIGNING_KEY")
    assert load_signing_key(create=False) is None
    with otel_replay.open(dataset) as store:
        report = store.verify(None)
    assert report.ok and report.unsigned_checked == 6


def test_key_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv("OTEL_REPLAY_SIGNING_KEY")
    with pytest.raises(ConfigError, match="too short"):
        load_signing_key("short")
    key_file = tmp_path / "k"
    key_file.write_text("a-file-secret-of-enough-length\n")
    monkeypatch.setenv("OTEL_REPLAY_KEY_FILE", str(key_file))
    assert load_signing_key().secret == b"a-file-secret-of-enough-length"
    monkeypatch.delenv("OTEL_REPLAY_KEY_FILE")
    created = load_signing_key()  # HOME is a temp dir in tests
    default = Path.home() / ".config/otel-replay/signing.key"
    assert default.exists() and oct(default.stat().st_mode & 0o777) == "0o600"
    assert load_signing_key().key_id == created.key_id
    with pytest.raises(ConfigError, match="does not exist"):
        load_signing_key(key_file=tmp_path / "missing")


def test_forged_key_id_is_not_waved_through(records, dataset):
    target = records[2]

    def edit(rows):
        _patch(
            _row(rows, target),
            lambda a: a.update({sc.ACTION_COST: 1, sc.RECORD_KEY_ID: "0" * 16}),
            rehash=True,
        )
        return rows

    _rewrite(dataset, edit)
    report = _verify(dataset)
    assert [p.record_id for p in report.problems][:1] == [target]
    assert "not a verification key" in report.problems[0].problem


def test_unsealed_record_span_is_reported(records, dataset):
    def edit(rows):
        forged = dict(_row(rows, records[0]))
        attrs = {k: v for k, v in json.loads(forged["attributes"]).items() if not k.startswith("replay.record.")}
        attrs[sc.ACTION_COST] = 99
        forged.update(record_id="f" * 32, span_id="1" * 16, attributes=json.dumps(attrs))
        return [*rows, forged]

    _rewrite(dataset, edit)
    report = _verify(dataset)
    assert [(p.record_id, p.problem.split(":")[0]) for p in report.problems] == [
        ("f" * 32, "unsealed replay.decision span")
    ]


def test_the_same_record_stored_twice_counts_once(records, dataset):
    (path,) = list((dataset / "spans").rglob("*.parquet"))
    path.with_name("copy-of-" + path.name).write_bytes(path.read_bytes())  # e.g. an OTLP retry
    report = _verify(dataset)
    assert report.ok and report.records == 6
    with otel_replay.open(dataset) as store:
        assert store.rows("SELECT count(*) AS n FROM decisions")[0]["n"] == 4


def test_rotated_keys_verify_together(records, dataset, monkeypatch):
    old = load_signing_key()
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", "a-rotated-signing-key-0123456789")
    telemetry = otel_replay.configure(dataset, set_global=False)
    with audit("vendor_payment", snapshot=snapshot()) as d:
        d.act(payment())
    telemetry.shutdown()
    new = load_signing_key()
    with otel_replay.open(dataset) as store:
        assert store.verify([old, new]).ok
        only_new = store.verify(new)
    assert len(only_new.problems) == 6 and all("not a verification key" in p.problem for p in only_new.problems)
    with pytest.raises(otel_replay.IntegrityError, match="not a verification key"):
        only_new.raise_if_failed()


def test_duplicated_files_do_not_multiply_chains_or_trees(records, dataset):
    (path,) = list((dataset / "spans").rglob("*.parquet"))
    path.with_name("copy-of-" + path.name).write_bytes(path.read_bytes())
    with otel_replay.open(dataset) as store:
        tree = store.causal_tree(records[0])
        assert [t["name"] for t in tree] == ["replay.decision", "replay.act"]
        assert store.rows("SELECT count(*) AS n FROM audit_entries")[0]["n"] == 1
        assert store.rows("SELECT count(*) AS n FROM spans")[0]["n"] == 2 * 9


def test_concurrent_capture_from_many_threads_forms_one_valid_chain(telemetry, dataset):
    import contextvars
    import threading

    def agent(n):
        for i in range(25):
            with audit("vendor_payment", snapshot=snapshot(), agent_id=f"agent-{n}") as d:
                d.read(i=i)
                d.act(payment(cost=i + 1))

    workers = [threading.Thread(target=contextvars.copy_context().run, args=(agent, n)) for n in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    telemetry.shutdown()
    report = _verify(dataset)
    assert report.ok and report.records == 200 and report.chains == 1
    with otel_replay.open(dataset) as store:
        seqs = store.rows("SELECT count(DISTINCT attributes ->> '$.\"replay.record.seq\"') AS n FROM decisions d "
                          "JOIN spans s USING (span_id)")
    assert seqs[0]["n"] == 200


def test_a_record_that_cannot_be_sealed_leaves_the_chain_unchanged():
    from otel_replay.integrity import GENESIS_HASH, Chain, SigningKey

    chain = Chain(SigningKey(b"k" * 32))
    with pytest.raises(otel_replay.CaptureError):
        chain.seal("bad", sc.SPAN_DECISION, 1, {"replay.kind": "decision", "replay.x": {1, 2}})
    attrs = {"replay.kind": "decision", "replay.record.id": "r1"}
    seal = chain.seal("r1", sc.SPAN_DECISION, 2, attrs)
    assert (seal.seq, seal.prev_id, seal.prev_hash) == (0, "", GENESIS_HASH)
    assert attrs[sc.RECORD_HASH] == seal.hash == record_hash(sc.SPAN_DECISION, 2, attrs)
    assert chain.key.check(seal.hash, seal.signature) and attrs[sc.RECORD_SIGNATURE] == seal.signature
    nxt = chain.seal("r2", sc.SPAN_DECISION, 3, {"replay.kind": "decision"})
    assert (nxt.seq, nxt.prev_id, nxt.prev_hash) == (1, "r1", seal.hash)


def test_record_hash_covers_the_same_keys_however_many_were_seen(monkeypatch):
    """The memo of covered keys is bounded; hashes do not depend on it (hostile rows can carry any keys)."""
    import otel_replay.integrity as integrity

    attrs = {"replay.kind": "decision", "replay.record.hash": "h", "other.key": "x", "replay.n": 1, "replay.f": 0.5}
    before = record_hash("n", 5, attrs)
    monkeypatch.setattr(integrity, "_HASHED", {})
    for i in range(integrity._HASHED_MAX + 10):
        record_hash("n", 5, {f"replay.junk{i}": "x", f"junk{i}": "y"})
    assert len(integrity._HASHED) == integrity._HASHED_MAX
    assert record_hash("n", 5, attrs) == before
    assert record_hash("n", 5, {**attrs, "replay.record.signature": "s", "other": 1}) == before
    assert record_hash("n", 5, {**attrs, "replay.kind": "edited"}) != before


_PLAIN_RECORD = {
    sc.KIND: "gate",
    sc.RECORD_ID: "a" * 32,
    "replay.gate.detail": "vendor_payment committed",
    "replay.gate.justified": True,
    sc.RECORD_SEQ: (1 << 64) - 1,
    "replay.n": -(1 << 64) + 1,
    "replay.cost": 1.5,
    "replay.nan": float("nan"),
    "replay.inf": float("-inf"),
    "replay.empty": "",
    "other.key": "not covered, still plain",
}


class _Text(str):
    pass


class _Number(int):
    pass


@pytest.mark.parametrize(
    "name, extra",
    [
        ("replay.gate \u00e9", {}),
        ("replay.gate \ud800", {}),
        ("replay.gate", {"replay.text": "r\u00e9sum\u00e9"}),
        ("replay.gate", {"replay.text": "lone \ud800"}),
        ("replay.gate", {"other.text": "\ud800 even where the hash does not look"}),
        ("replay.gate", {"replay.big": 1 << 64}),
        ("replay.gate", {"replay.big": -(1 << 64)}),
        ("replay.gate", {"replay.huge": 10**5000}),
        ("replay.gate", {"replay.list": ["a", 1]}),
        ("replay.gate", {"replay.tuple": ("a",)}),
        ("replay.gate", {"replay.dict": {"a": 1}}),
        ("replay.gate", {"replay.none": None}),
        ("replay.gate", {"replay.bytes": b"x"}),
        ("replay.gate", {"replay.subclass": _Text("x")}),
        ("replay.gate", {"replay.subclass": _Number(3)}),
        ("replay.gate", {3: "a key that is no str"}),
        ("replay.gate", {_Text("replay.k"): "a key of a str subclass"}),
        ("replay.gate", {"replay.\u00e9": "a key that is not ASCII"}),
        (_Text("replay.gate"), {}),
    ],
)
def test_a_record_is_hashed_once_only_when_nothing_in_it_can_make_hashing_fail(name, extra):
    """The gate's records skip the hash made to fail early before a span starts only when it cannot fail."""
    from otel_replay.integrity import hashes_plainly

    assert hashes_plainly("replay.gate", _PLAIN_RECORD)
    assert len(record_hash("replay.gate", 1, _PLAIN_RECORD)) == 64
    assert not hashes_plainly(name, {**_PLAIN_RECORD, **extra})
