"""Void records: a record sealed and then not kept is named by a void, and verify does not read its gap as deleted.

Chains are sealed here directly (:class:`~otel_replay.integrity.Chain`) and
checked with :func:`~otel_replay.integrity.verify_records`, the function
``verify`` runs; the capture side (a store that gives an outcome back) is in
tests/capture/test_outcome_durability.py.
"""

from __future__ import annotations

import hashlib
import importlib
import json

import pytest

import otel_replay
from otel_replay import DecisionTracer
from otel_replay import semconv as sc
from otel_replay.integrity import Chain, SigningKey, StoredRecord, load_signing_key, record_hash, verify_records
from otel_replay.location import resolve
from otel_replay.storage import drop_older_than
from otel_replay.storage.retention_marks import read_marks
from otel_replay.voids import void_attributes

from .capture.test_outcome_durability import _pending_rows_refused
from .storage.test_retention_marks import OLD, _Clock, _read, _write

KEY = SigningKey(b"k" * 32)


def _seal(chain: Chain, record_id: str, name: str = sc.SPAN_DECISION, attrs: dict | None = None) -> StoredRecord:
    attributes = {sc.KIND: "decision", sc.RECORD_ID: record_id, **(attrs or {})}
    chain.seal(record_id, name, 1_700_000_000_000_000_000, attributes)
    return StoredRecord(record_id, name, 1_700_000_000_000_000_000, attributes, file="f.parquet")


def _seal_at(chain: Chain, record_id: str, start_ns: int, name: str = sc.SPAN_DECISION, **attrs) -> StoredRecord:
    attributes = {sc.KIND: "decision", sc.RECORD_ID: record_id, **attrs}
    chain.seal(record_id, name, start_ns, attributes)
    return StoredRecord(record_id, name, start_ns, attributes, file="f.parquet")


def _void(chain: Chain, voided: StoredRecord, void_id: str = "v") -> StoredRecord:
    attrs = void_attributes(void_id, voided.name, voided.record_id, voided.attributes[sc.RECORD_SEQ],
                            voided.attributes[sc.RECORD_HASH])
    return _seal(chain, void_id, sc.SPAN_VOID, attrs)


def _deleted(report) -> list[str]:
    return [p.record_id for p in report.problems if p.problem.startswith("deleted")]


def test_a_voided_record_leaves_a_gap_verify_counts_not_reads_as_deleted():
    chain = Chain(KEY)
    first, outcome = _seal(chain, "a"), _seal(chain, "o", sc.SPAN_OUTCOME)
    void, later = _void(chain, outcome), _seal(chain, "b")
    report = verify_records([first, void, later], KEY)
    assert (report.problems, report.voided, report.records) == ([], 1, 3)


def test_without_its_void_the_same_gap_is_a_deletion():
    chain = Chain(KEY)
    first, _, later = _seal(chain, "a"), _seal(chain, "o", sc.SPAN_OUTCOME), _seal(chain, "b")
    report = verify_records([first, later], KEY)
    assert _deleted(report) == ["o"] and report.voided == 0


def test_a_void_several_links_after_the_record_it_voids_excuses_that_gap_only():
    # Records sealed between the voided one and its void (other threads) are kept; deleting one of them is named.
    chain = Chain(KEY)
    a, o, b, c = _seal(chain, "a"), _seal(chain, "o", sc.SPAN_OUTCOME), _seal(chain, "b"), _seal(chain, "c")
    void, d = _void(chain, o), _seal(chain, "d")
    assert verify_records([a, b, c, void, d], KEY).voided == 1
    report = verify_records([a, b, void, d], KEY)  # c deleted as well
    assert _deleted(report) == ["c"] and report.voided == 1


def test_deleting_a_void_is_itself_a_deletion():
    chain = Chain(KEY)
    first, outcome = _seal(chain, "a"), _seal(chain, "o", sc.SPAN_OUTCOME)
    _void(chain, outcome)
    later = _seal(chain, "b")
    report = verify_records([first, later], KEY)
    assert _deleted(report) == ["v"] and report.voided == 0


def test_an_edited_void_is_refused_and_excuses_nothing():
    # Someone without the key deletes a record and edits a void to name it: the void fails its seal check.
    chain = Chain(KEY)
    first, real = _seal(chain, "a"), _seal(chain, "real")
    refused = _seal(chain, "o", sc.SPAN_OUTCOME)
    void, later = _void(chain, refused), _seal(chain, "b")
    forged = dict(void.attributes)
    forged[sc.VOID_RECORD_ID], forged[sc.VOID_SEQ] = "real", real.attributes[sc.RECORD_SEQ]
    forged[sc.VOID_HASH] = real.attributes[sc.RECORD_HASH]
    edited = StoredRecord("v", sc.SPAN_VOID, void.start_ns, forged, file="f.parquet")
    report = verify_records([first, edited, later], KEY)
    assert report.voided == 0
    assert "v" in {p.record_id for p in report.problems} and _deleted(report) == ["o"]  # the edit, and the gap


def test_a_void_rehashed_without_the_key_excuses_nothing():
    chain = Chain(KEY)
    first, real = _seal(chain, "a"), _seal(chain, "real")
    void, later = _void(chain, _seal(chain, "o", sc.SPAN_OUTCOME)), _seal(chain, "b")
    forged = dict(void.attributes)
    forged[sc.VOID_RECORD_ID], forged[sc.VOID_SEQ] = "real", real.attributes[sc.RECORD_SEQ]
    forged[sc.VOID_HASH] = real.attributes[sc.RECORD_HASH]
    forged[sc.RECORD_HASH] = record_hash(sc.SPAN_VOID, void.start_ns, forged)  # a consistent hash, a wrong signature
    rehashed = StoredRecord("v", sc.SPAN_VOID, void.start_ns, forged, file="f.parquet")
    report = verify_records([first, rehashed, later], KEY)
    assert report.voided == 0 and _deleted(report) == ["o"]
    (problem,) = [p.problem for p in report.problems if p.record_id == "v"]
    assert problem.startswith("signature invalid")


def test_a_void_signed_with_a_key_verify_does_not_hold_excuses_nothing():
    other = SigningKey(b"o" * 32)
    chain = Chain(other)
    first, outcome = _seal(chain, "a"), _seal(chain, "o", sc.SPAN_OUTCOME)
    void, later = _void(chain, outcome), _seal(chain, "b")
    report = verify_records([first, void, later], KEY)
    assert report.voided == 0 and _deleted(report) == ["o"]


def test_a_void_that_names_another_hash_or_a_later_link_excuses_nothing():
    chain = Chain(KEY)
    first, _ = _seal(chain, "a"), _seal(chain, "o", sc.SPAN_OUTCOME)
    wrong_hash = _seal(chain, "v1", sc.SPAN_VOID, void_attributes("v1", sc.SPAN_OUTCOME, "o", 1, "0" * 64))
    ahead = _seal(chain, "v2", sc.SPAN_VOID, void_attributes("v2", sc.SPAN_DECISION, "x", 9, "1" * 64))
    later = _seal(chain, "b")
    report = verify_records([first, wrong_hash, ahead, later], KEY)
    assert _deleted(report) == ["o"]  # the void names "o" with a hash that is not the one its successor names
    assert report.voided == 1  # the voids counted are those whose record is missing and link lies before them


def test_a_void_of_another_chain_excuses_nothing_here():
    mine, theirs = Chain(KEY), Chain(KEY)
    first, outcome, later = _seal(mine, "a"), _seal(mine, "o", sc.SPAN_OUTCOME), _seal(mine, "b")
    their_first = _seal(theirs, "x")
    # A void in their chain naming my record's link and hash: chains are separate, so it gives up nothing of mine.
    seq, digest = outcome.attributes[sc.RECORD_SEQ], outcome.attributes[sc.RECORD_HASH]
    attrs = void_attributes("v", outcome.name, "o", seq, digest)
    void = _seal(theirs, "v", sc.SPAN_VOID, attrs)
    report = verify_records([first, later, their_first, void], KEY)
    assert report.voided == 0 and _deleted(report) == ["o"]


def test_a_voided_record_that_is_stored_after_all_is_a_problem():
    # Its writer was told it was not kept (and may have recorded it again): stored anyway, it is named.
    chain = Chain(KEY)
    first, outcome = _seal(chain, "a"), _seal(chain, "o", sc.SPAN_OUTCOME)
    void = _void(chain, outcome)
    report = verify_records([first, outcome, void], KEY)
    assert report.voided == 0
    assert [(p.record_id, p.problem.split(",")[0]) for p in report.problems] == [("o", "stored")]
    assert "void record v" in report.problems[0].problem


def test_a_stored_copy_of_a_voided_record_with_other_content_is_not_taken_for_it():
    chain = Chain(KEY)
    first, outcome = _seal(chain, "a"), _seal(chain, "o", sc.SPAN_OUTCOME)
    void, later = _void(chain, outcome), _seal(chain, "b")
    edited = dict(outcome.attributes)
    edited[sc.OUTCOME_CORRECT] = True
    report = verify_records(
        [first, StoredRecord("o", outcome.name, outcome.start_ns, edited, file="g.parquet"), void, later], KEY
    )
    assert [p.record_id for p in report.problems] == ["o"]  # the edit is named; no "stored, yet voided"
    assert "stored, yet" not in report.problems[0].problem


def _voided_on_an_old_day(dataset, monkeypatch) -> list[str]:
    """A decision, its outcome, a decision, an outcome the claim store refuses (voided), a decision: all sealed on an
    old day (January 2020, a partition of its own); then a decision today. The stored decisions' ids."""
    recorder_module = importlib.import_module("otel_replay.capture.recorder")
    with otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600):
        tracer = DecisionTracer()
        with monkeypatch.context() as patched:
            patched.setattr(recorder_module, "time", _Clock())
            ids = [tracer.decision("agent", "approve", "r1")]
            tracer.record_outcome(ids[0], True)
            ids.append(tracer.decision("agent", "approve", "r2"))
            _pending_rows_refused(dataset, True)
            with pytest.raises(Exception, match="disk says no"):
                tracer.record_outcome(ids[1], True)  # sealed, then rolled back: voided
            _pending_rows_refused(dataset, False)
            ids.append(tracer.decision("agent", "approve", "r3"))
        ids.append(tracer.decision("agent", "approve", "r4"))
    return ids


def test_a_voided_record_verifies_as_voided_before_retention_drops_its_day(dataset, monkeypatch):
    _voided_on_an_old_day(dataset, monkeypatch)
    with otel_replay.open(dataset) as store:
        report = store.verify(load_signing_key(create=False))
    assert (report.problems, report.voided) == ([], 1)


def test_retention_that_drops_the_day_of_a_voided_record_and_its_void_leaves_no_deletion(dataset, monkeypatch):
    # A voided link splits the dropped day's run in two; the later run's oldest record names the voided record,
    # which is never stored. The checkpoint carries the link the day's void (its seal checked) gives up.
    _voided_on_an_old_day(dataset, monkeypatch)
    dropped = drop_older_than(dataset, 30)
    assert dropped.dropped == [OLD], dropped
    with otel_replay.open(dataset) as store:
        report = store.verify(load_signing_key(create=False))
    assert report.problems == [] and report.dropped_by_retention == 1
    (mark,) = read_marks(resolve(dataset), load_signing_key(create=False))[0]
    assert len(mark.voided) == 1 and mark.voided[0].record_id not in {link.record_id for link in mark.links}


def test_a_void_kept_after_retention_dropped_the_day_of_the_record_it_voids_explains_that_link():
    # The outcome is sealed just before midnight and voided just after it: retention drops the first day (the
    # decision before the outcome and the one after it), the void is kept. The dropped run after the outcome names
    # it as its predecessor; the void still in the dataset says it was never kept (found on s14-void: "deleted").
    chain, day_one, day_two = Chain(KEY), 1_700_000_000_000_000_000, 1_700_100_000_000_000_000
    a, o, b = (_seal_at(chain, record_id, day_one) for record_id in ("a", "o", "b"))
    seq, digest = o.attributes[sc.RECORD_SEQ], o.attributes[sc.RECORD_HASH]
    void = _seal_at(chain, "v", day_two, sc.SPAN_VOID, **void_attributes("v", o.name, "o", seq, digest))
    later = _seal_at(chain, "c", day_two)
    chain_id, day = a.attributes[sc.RECORD_CHAIN_ID], "2023-11-14"
    # What retention vouches for as it drops day one: per run (a; b) its newest record, and its oldest's predecessor.
    dropped = {(chain_id, 0): ("a", a.attributes[sc.RECORD_HASH], day)}
    dropped[(chain_id, 2)] = ("b", b.attributes[sc.RECORD_HASH], day)
    expected = [(chain_id, 0, "", "0" * 64, day), (chain_id, 2, "o", digest, day)]
    report = verify_records([void, later], KEY, dropped=dropped, expected=expected)
    assert (report.problems, report.voided, report.dropped_by_retention) == ([], 1, 1)


def test_a_void_edited_in_a_partition_retention_drops_is_not_carried_and_the_gap_stays_a_deletion(
    dataset, monkeypatch
):
    # Whoever can write files edits the old day's void to name another link: its seal fails, retention leaves it out
    # of the checkpoint, and the split run's gap is reported as before.
    _voided_on_an_old_day(dataset, monkeypatch)
    for path in (dataset / "spans" / OLD).rglob("*.parquet"):
        schema, rows = _read(path)
        voids = [row for row in rows if row["name"] == sc.SPAN_VOID]
        if voids:
            attrs = json.loads(voids[0]["attributes"])
            attrs[sc.VOID_HASH] = "0" * 64
            voids[0]["attributes"] = json.dumps(attrs)
            _write(path, rows, schema)
            break
    else:
        raise AssertionError("no void in the old partition")
    assert drop_older_than(dataset, 30).dropped == [OLD]
    (mark,) = read_marks(resolve(dataset), load_signing_key(create=False))[0]
    assert mark.voided == ()
    with otel_replay.open(dataset) as store:
        problems = [p.problem for p in store.verify(load_signing_key(create=False)).problems]
    assert any(p.startswith("deleted") for p in problems), problems


@pytest.mark.parametrize("entry", [["c", "3", "r", "h"], ["c", 3, "r"], ["c", True, "r", "h"], "c:3:r:h"])
def test_a_checkpoint_whose_voided_links_are_malformed_is_named_even_when_signed(dataset, monkeypatch, entry):
    _voided_on_an_old_day(dataset, monkeypatch)
    drop_older_than(dataset, 30)
    (mark,) = list((dataset / "_retention").iterdir())
    head, body = mark.read_text().split("\n", 1)
    doc = json.loads(body)
    doc["voided"] = [entry]
    body = json.dumps(doc)
    key = load_signing_key(create=False)
    header = dict(json.loads(head), signature=key.sign(hashlib.sha256(body.encode()).hexdigest()))
    mark.write_text(json.dumps(header) + "\n" + body)
    with otel_replay.open(dataset) as store:
        report = store.verify(key)
    named = [p for p in report.problems if p.problem.startswith("retention checkpoint")]
    assert len(named) == 1 and "voided link that is not" in named[0].problem, report.problems
