"""Decision and outcome facts (``_facts-*.pq``): calibration and the decision scan stay equal to the views.

Every check compares ``Store.calibration()`` / ``Store.decision_summary()``
(facts files where usable, spans elsewhere) with the same figures computed by
analyst SQL joining the ``decisions`` and ``outcomes`` views over the spans,
on a dataset built to be hostile: duplicate JSON keys, exact and conflicting
copies, two outcomes for one decision, outcomes in another partition,
version 1 files, typed and JSON values both present, confidence out of range,
NaN or a string, ids that are not hex, files arriving after compaction, and
facts files deleted, damaged, stale or forged.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otel_replay import semconv as sc
from otel_replay.exporters.schema import SPAN_SCHEMA
from otel_replay.query.store import Store
from otel_replay.storage import compact, drop_older_than, live_files
from otel_replay.storage.facts import FACTS_SCHEMA, plan

from .._versions import version_1_table

_DAY = 86_400 * 10**9
_BASE = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z

VIEWS_CALIBRATION = """
SELECT least(floor(d.confidence * 10) / 10, 0.9) AS bucket, count(*) AS decisions,
       count(*) FILTER (WHERE o.outcome_correct) AS correct,
       round(avg(CASE WHEN o.outcome_correct THEN 1.0 ELSE 0.0 END), 4) AS accuracy,
       round(avg(d.confidence), 4) AS mean_confidence
FROM decisions d JOIN outcomes o ON o.decision_id = d.record_id
WHERE d.confidence IS NOT NULL AND ($1 IS NULL OR d.decision_type = $1)
GROUP BY bucket ORDER BY bucket
"""
VIEWS_SUMMARY = """
SELECT decision_type, count(*) AS decisions, count(confidence) AS with_confidence,
       round(avg(confidence), 4) AS mean_confidence
FROM decisions WHERE $1 IS NULL OR decision_type = $1
GROUP BY decision_type ORDER BY decision_type NULLS FIRST
"""


def _hex(n: int, width: int) -> str:
    return f"{n:0{width}x}"


def span(
    n: int,
    kind: str,
    *,
    day: int = 0,
    at: int = 0,
    trace: str | None = None,
    span_id: str | None = None,
    record: str | None = None,
    dtype: str | None = "entry",
    conf: float | None = None,
    decision_id: str | None = None,
    correct: bool | None = None,
    attrs: dict[str, Any] | str | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """One stored span row (storage schema version 2), typed columns as given (a forger may set anything)."""
    start = _BASE + day * _DAY + at * 10**9 + n
    text = attrs if isinstance(attrs, str) else json.dumps(attrs or {"replay.record.source": "audit"})
    return {
        "trace_id": trace or _hex(n, 32),
        "span_id": span_id or _hex(n + 1, 16),
        "parent_span_id": None,
        "trace_state": None,
        "name": name or f"replay.{kind}",
        "kind": "INTERNAL",
        "service_name": "svc",
        "scope_name": "otel_replay",
        "scope_version": "1",
        "start_time": start,
        "end_time": start + 1000,
        "duration_ns": 1000,
        "status_code": "UNSET",
        "status_message": None,
        "correlation_id": f"c-{n % 7}",
        "session_id": None,
        "agent_id": "agent",
        "record_id": record or rid(n),
        "replay_kind": kind,
        "decision_type": dtype if kind == "decision" else None,
        "outcome_decision_id": decision_id,
        "outcome_correct": correct,
        "decision_confidence": conf,
        "attributes": text,
        "resource_attributes": '{"service.name":"svc"}',
        "events": [],
        "links": [],
        "dropped_attributes_count": 0,
        "dropped_events_count": 0,
        "dropped_links_count": 0,
    }


def rid(n: int) -> str:
    """Record id ``n``: 32 hex digits spread like a random id's (an id's first 16 are its fact key)."""
    return _hex((n * 0x9E3779B97F4A7C15F39CC0605CEDC835) % 2**128, 32)


def write(dataset: Path, day: int, name: str, rows: list[dict[str, Any]], *, version_1: bool = False) -> Path:
    """``rows`` as one span file of partition ``day`` (a version 1 file when asked)."""
    folder = dataset / "spans" / f"date=2026-01-0{day + 1}"
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows, schema=SPAN_SCHEMA)
    if version_1:
        table = version_1_table(table)
    path = folder / f"part-{name}.parquet"
    pq.write_table(table, path, compression="zstd")
    return path


def decision(n: int, conf: float | None, *, day: int = 0, at: int = 0, **kw: Any) -> dict[str, Any]:
    return span(n, "decision", day=day, at=at, conf=conf, **kw)


def outcome(n: int, of: int, correct: bool | None, *, day: int = 0, at: int = 100, **kw: Any) -> dict[str, Any]:
    return span(n, "outcome", day=day, at=at, decision_id=rid(of), correct=correct, **kw)


def hostile_dataset(root: Path) -> Path:
    """Two day partitions of hostile decisions and outcomes (see the module docstring)."""
    ds = root / "ds"
    dup = decision(4, 0.45, at=4)
    conflicting = decision(15, 0.65, at=15)
    day0 = [
        decision(1, 0.15, at=1, dtype="alpha"),
        outcome(101, 1, True),
        decision(2, 0.95, at=2),
        outcome(102, 2, False, at=200),
        # the attributes JSON repeats a key: left out by every view, whatever its typed column says
        decision(3, 0.99, at=3, attrs='{"replay.decision.confidence":0.1,"replay.decision.confidence":0.9}'),
        outcome(103, 3, True),
        dup,
        dict(dup),  # an exact copy, as an OTLP retry stores it
        outcome(104, 4, True),
        decision(5, None, at=5, attrs={sc.DECISION_CONFIDENCE: "0.35"}),  # a string in the JSON: TRY_CAST
        outcome(105, 5, False),
        decision(6, None, at=6, attrs={sc.DECISION_CONFIDENCE: "high"}),  # no number: no confidence
        outcome(106, 6, True),
        decision(7, math.nan, at=7),  # a forged NaN in the typed column
        outcome(107, 7, True),
        decision(8, 1.7, at=8, dtype="alpha"),  # out of range, both ways
        outcome(108, 8, True),
        decision(9, -0.3, at=9),
        outcome(109, 9, False),
        decision(10, 0.42, at=10, attrs={sc.DECISION_CONFIDENCE: 0.88}),  # typed and JSON: the typed one
        outcome(110, 10, None, attrs={sc.OUTCOME_CORRECT: "yes"}),  # correctness not a boolean: NULL
        decision(11, 0.55, at=11, span_id="zz-not-hex"),  # no key: always the exact path
        decision(12, 0.25, at=12, span_id="00000000000000aa"),  # two traces, one span id
        decision(13, 0.27, at=13, span_id="00000000000000aa"),
        outcome(111, 11, True),
        outcome(112, 12, False),
        outcome(113, 13, True),
        # an ambiguous outcome (left out) and a valid later one for the same decision
        decision(14, 0.75, at=14),
        outcome(114, 14, True, at=50, attrs='{"replay.outcome.note":"a","replay.outcome.note":"b"}'),
        outcome(115, 14, False, at=60),
        conflicting,
        {**conflicting, "name": "replay.decision.copy"},  # same ids, other content, same facts
        outcome(116, 15, True),
    ]
    write(ds, 0, "0001", day0[:18])
    write(ds, 0, "0002", day0[18:])
    day1 = [
        outcome(201, 2, True, day=1, at=1),  # a second outcome, later: the first (day 0) wins
        outcome(202, 1, False, day=1, at=2),
        decision(16, 0.05, day=1, at=16),
        outcome(216, 16, True, day=1, at=200),
        # the same (trace_id, span_id) as decision 1, stored on another day: counted once
        decision(1, 0.15, day=1, at=30, trace=_hex(1, 32), span_id=_hex(2, 16), record=rid(1), dtype="alpha"),
    ]
    write(ds, 1, "0001", day1)
    write(
        ds,
        1,
        "0002",
        [decision(18, None, day=1, at=18, attrs={sc.DECISION_CONFIDENCE: 0.82}), outcome(218, 18, True, day=1)],
        version_1=True,
    )
    return ds


def late_files(ds: Path) -> None:
    """Files arriving after compaction: a retry copy, an earlier outcome (it becomes the first), a new pair."""
    write(ds, 0, "9001", [decision(4, 0.45, at=4), outcome(301, 2, True, at=0), decision(19, 0.31, at=19)])
    write(ds, 1, "9001", [outcome(319, 19, True, day=1, at=5)])


def _norm(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    def one(value: Any) -> Any:
        return "nan" if isinstance(value, float) and math.isnan(value) else value

    return [tuple(one(v) for v in row.values()) for row in rows]


def check_same(ds: Path, *, facts_expected: bool) -> Store:
    store = Store(ds)
    found = plan(store.files)
    assert bool(found.fact_files) == facts_expected, found
    for dtype in (None, "alpha", "entry"):
        assert _norm(store.calibration(dtype)) == _norm(store.rows(VIEWS_CALIBRATION, [dtype])), dtype
        assert _norm(store.decision_summary(dtype)) == _norm(store.rows(VIEWS_SUMMARY, [dtype])), dtype
    return store


def _facts_files(ds: Path) -> list[Path]:
    return sorted(ds.glob("spans/*/_facts-*.pq"))


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return hostile_dataset(tmp_path)


def test_hostile_rows_give_the_views_figures_before_and_after_compaction(dataset: Path) -> None:
    with check_same(dataset, facts_expected=False) as store:
        before = store.calibration()
        summary = store.decision_summary()
    # What the views say, spelled out: 18 decision spans; 3 (ambiguous JSON) is out, the copies of 4, 15
    # and 1 count once, 12 and 13 (one span id, two traces) count twice: 16. 6 has no confidence: 15, and
    # all of those have an outcome (14's ambiguous one is skipped for its valid one).
    assert sum(r["decisions"] for r in summary) == 16
    assert sum(r["with_confidence"] for r in summary) == 15
    assert sum(r["decisions"] for r in before) == 15
    compact(dataset, grace_seconds=0)
    assert len(_facts_files(dataset)) == 2
    with check_same(dataset, facts_expected=True) as store:
        assert _norm(store.calibration()) == _norm(before)
        assert _norm(store.decision_summary()) == _norm(summary)


def test_files_arriving_after_compaction_are_read_from_the_spans(dataset: Path) -> None:
    compact(dataset, grace_seconds=0)
    with Store(dataset) as store:
        before = store.calibration()
    late_files(dataset)
    with check_same(dataset, facts_expected=True) as store:
        after = store.calibration()
        assert store.decision_summary()[-1]["decisions"] == 15  # entry: 14, +19 (4 is a copy)
    assert after != before  # decision 2's first outcome is now the late, earlier one; 19 joined
    compact(dataset, grace_seconds=0)  # generation 2: the late files merged, facts rewritten
    with check_same(dataset, facts_expected=True) as store:
        assert _norm(store.calibration()) == _norm(after)
    assert len(_facts_files(dataset)) == 2  # the superseded generation's facts deleted with grace 0


def test_missing_damaged_stale_or_foreign_facts_are_ignored(dataset: Path, caplog: pytest.LogCaptureFixture) -> None:
    compact(dataset, grace_seconds=0)
    first, second = _facts_files(dataset)
    with Store(dataset) as store:
        expected = _norm(store.calibration())
    first.unlink()  # deleted
    with check_same(dataset, facts_expected=True) as store:
        assert _norm(store.calibration()) == expected
    first.write_bytes(b"PAR1 not really parquet PAR1")  # damaged
    with check_same(dataset, facts_expected=True) as store:
        assert _norm(store.calibration()) == expected
    assert "not used" in caplog.text
    # stale: the covered file list no longer matches (a compacted file rewritten to another size)
    table = pq.read_table(second)
    meta = dict(table.schema.metadata)
    covered = json.loads(meta[b"otel_replay.facts.files"])
    covered[0][1] += 1
    meta[b"otel_replay.facts.files"] = json.dumps(covered).encode()
    pq.write_table(table.replace_schema_metadata(meta), second)
    with check_same(dataset, facts_expected=False) as store:
        assert _norm(store.calibration()) == expected
    # another schema under the right name
    pq.write_table(pa.table({"kind": ["decision"]}).replace_schema_metadata(meta), second)
    with check_same(dataset, facts_expected=False) as store:
        assert _norm(store.calibration()) == expected


def test_a_forged_facts_file_that_matches_its_footer_changes_the_figures(dataset: Path) -> None:
    """The documented limit: facts are data like the compacted files; a forger who can write them wins both ways."""
    compact(dataset, grace_seconds=0)
    with Store(dataset) as store:
        honest = store.calibration()
    path = _facts_files(dataset)[0]
    table = pq.read_table(path)
    conf = table.column("confidence").to_pylist()
    forged = table.set_column(
        table.schema.get_field_index("confidence"),
        "confidence",
        pa.array([0.05 if c is not None else None for c in conf]),
    )
    pq.write_table(forged, path)
    with Store(dataset) as store:
        assert store.calibration() != honest  # the facts are what the figures are made of
        assert _norm(store.rows(VIEWS_CALIBRATION, [None])) == _norm(honest)  # the views still read the spans


def test_an_ambiguity_flag_cannot_come_from_the_writer(tmp_path: Path) -> None:
    """A span file carrying its own `repeated` / `shared` / `key` columns changes nothing: facts are computed."""
    ds = tmp_path / "ds"
    rows = [decision(1, 0.5), outcome(101, 1, True), decision(2, 0.6), outcome(102, 2, False)]
    path = write(ds, 0, "0001", rows)
    table = pq.read_table(path)
    n = table.num_rows
    table = (
        table.append_column("repeated", pa.array([False] * n))
        .append_column("shared", pa.array([False] * n))
        .append_column("key", pa.array([1] * n, pa.uint64()))
        .append_column("kind_", pa.array(["decision"] * n))
    )
    pq.write_table(table, path)
    write(ds, 0, "0002", [decision(3, 0.7, attrs='{"a":1,"a":2}'), outcome(103, 3, True)])
    compact(ds, grace_seconds=0)
    facts = pq.read_table(_facts_files(ds)[0])
    assert facts.schema.remove_metadata().equals(FACTS_SCHEMA)
    assert sorted(facts.column("record_id").to_pylist()) == sorted([rid(1), rid(2), rid(101), rid(102), rid(103)])
    assert set(facts.column("key").to_pylist()) != {1}
    with check_same(ds, facts_expected=True) as store:
        assert sum(r["decisions"] for r in store.calibration()) == 2


def test_cross_partition_keys_are_flagged_and_unchecked_pairs_fall_back(dataset: Path) -> None:
    compact(dataset, grace_seconds=0)
    day0, day1 = _facts_files(dataset)
    # day 1 was compacted after day 0: it saw day 0's facts and flags decision 1's copy as shared
    t1 = pq.read_table(day1)
    shared = [r for r in t1.select(["kind", "shared", "record_id"]).to_pylist() if r["shared"]]
    assert [r["record_id"] for r in shared if r["kind"] == "decision"] == [rid(1)]
    # outcomes are keyed by their decision: day 1's second outcomes of decisions 1 and 2
    assert sorted(r["record_id"] for r in shared if r["kind"] == "outcome") == [rid(201), rid(202)]
    assert json.loads(t1.schema.metadata[b"otel_replay.facts.checked"]) == [f"date=2026-01-01/{day0.name}"]
    # as if both had been written at once: neither lists the other
    meta = dict(t1.schema.metadata)
    meta[b"otel_replay.facts.checked"] = b"[]"
    pq.write_table(t1.replace_schema_metadata(meta), day1)
    with Store(dataset) as store:
        assert plan(store.files).unchecked
    check_same(dataset, facts_expected=True).close()


def test_superseded_and_leftover_facts_are_cleaned_and_retention_drops_them(dataset: Path) -> None:
    compact(dataset, grace_seconds=600)
    first = _facts_files(dataset)
    late_files(dataset)
    compact(dataset, grace_seconds=600)
    names = {p.name for p in _facts_files(dataset)}
    assert {p.name for p in first} <= names and len(names) == 4  # the old ones wait out the grace period
    manifest = json.loads((first[0].parent / "_manifest.json").read_text())
    assert first[0].name in manifest["superseded"]
    orphan = first[0].parent / "_facts-g9-0123456789ab.pq"  # a crashed compaction's leftover (its run pending)
    shutil.copy(sorted(first[0].parent.glob("_facts-g2-*.pq"))[0], orphan)
    manifest["pending"] = {"0123456789ab": 1.0}
    (first[0].parent / "_manifest.json").write_text(json.dumps(manifest))
    compact(dataset, grace_seconds=0)
    assert not orphan.exists()
    assert len(_facts_files(dataset)) == 2
    check_same(dataset, facts_expected=True).close()
    report = drop_older_than(dataset, 0, today=__import__("datetime").date(2026, 1, 2))
    assert report.dropped == ["date=2026-01-01"]
    assert len(_facts_files(dataset)) == 1
    assert all("date=2026-01-01" not in f for f in live_files(dataset))
    check_same(dataset, facts_expected=True).close()


def test_a_facts_file_is_never_read_as_spans(dataset: Path) -> None:
    compact(dataset, grace_seconds=0)
    assert not [f for f in live_files(dataset) if "_facts-" in f]
    with Store(dataset) as store:
        total = store.rows("SELECT count(*) AS n FROM spans")[0]["n"]
    rows = sum(pq.read_metadata(f).num_rows for f in live_files(dataset))
    assert total == rows


@pytest.mark.slow
def test_big_enough_to_span_row_groups(make_dataset: Any) -> None:
    """The generator's trade chains (retries included), compacted in several batches: same figures, facts used."""
    ds, _ = make_dataset(spans=20_000, ids=2_000, rows_per_file=700, duplicates=0.02)
    compact(ds, grace_seconds=0, max_batch_rows=6_000)
    store = check_same(ds, facts_expected=True)
    store.close()
    assert os.path.getsize(_facts_files(ds)[0]) > 0


@pytest.mark.parametrize("prefix", ["0000000000000000", "not-hex-at-all-"])
def test_ids_sharing_a_key_or_without_one_take_the_exact_path(tmp_path: Path, prefix: str) -> None:
    """Decision ids with one 16-character prefix (one outcome key for all) or no hex at all: still exact."""
    ds = tmp_path / "ds"
    rows: list[dict[str, Any]] = []
    for n in range(1, 9):
        record = f"{prefix}{n:016x}"
        rows.append(decision(n, n / 10, at=n, record=record, span_id=f"{prefix[:8]}{n:08x}"))
        rows.append(span(100 + n, "outcome", at=50 + n, decision_id=record, correct=n % 2 == 0))
        if n % 3 == 0:  # a second, later outcome on the next day: the first still wins
            rows.append(span(200 + n, "outcome", day=1, at=n, decision_id=record, correct=n % 2 == 1))
    write(ds, 0, "0001", [r for r in rows if r["start_time"] < _BASE + _DAY])
    write(ds, 1, "0001", [r for r in rows if r["start_time"] >= _BASE + _DAY])
    compact(ds, grace_seconds=0)
    facts = pq.read_table(_facts_files(ds)[0])
    outcomes = facts.filter(pa.compute.equal(facts.column("kind"), "outcome"))
    assert all(outcomes.column("repeated").to_pylist())  # one key for all (or none): no outcome skips ranking
    with check_same(ds, facts_expected=True) as store:
        assert sum(r["decisions"] for r in store.calibration()) == 8
        assert sum(r["correct"] for r in store.calibration()) == 4


def test_the_numeric_join_key_matches_exactly_what_the_string_join_matches(tmp_path: Path) -> None:
    """Uppercase hex is not lowercase hex; an MD5-keyed id never meets a hex id; NULL meets nothing."""
    ds = tmp_path / "ds"
    upper, lower = "AB" * 16, "ab" * 16
    rows = [
        decision(1, 0.15, record=upper),
        decision(2, 0.25, record=lower),
        decision(3, 0.35, record="dec-3"),
        decision(4, 0.45, record=__import__("hashlib").md5(b"dec-3").hexdigest()),  # the MD5 key of "dec-3"
        span(101, "outcome", at=50, decision_id=lower, correct=True),
        span(102, "outcome", at=51, decision_id="dec-3", correct=False),
        span(103, "outcome", at=52, decision_id=None, correct=True, attrs={"replay.record.source": "audit"}),
    ]
    write(ds, 0, "0001", rows)
    compact(ds, grace_seconds=0)
    with check_same(ds, facts_expected=True) as store:
        got = {(r["bucket"], r["decisions"], r["correct"]) for r in store.calibration()}
    assert got == {(0.2, 1, 1), (0.3, 1, 0)}  # decision 2 (lower) and 3 ("dec-3") only


def watch_facts_use(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each calibration / decision summary from now on read facts files (the Store's own answer)."""
    import otel_replay.query.engine as store_module

    used: list[bool] = []
    real = store_module.point_facts

    def watching(*args: Any, **kwargs: Any) -> bool:
        used.append(real(*args, **kwargs))
        return used[-1]

    monkeypatch.setattr(store_module, "point_facts", watching)
    return used


def test_the_store_uses_facts_after_a_narrowed_lookup_too(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lookup through the side index points the views at a few files; calibration still reads every file."""
    used = watch_facts_use(monkeypatch)
    compact(dataset, grace_seconds=0)
    with Store(dataset) as store:
        everything = _norm(store.calibration())
        store.run_for("record", {"record_id": rid(1)}, record_id=rid(1))
        assert _norm(store.calibration()) == everything
        assert _norm(store.rows(VIEWS_CALIBRATION, [None])) == everything
        store.run_for("record", {"record_id": rid(2)}, record_id=rid(2))
        assert _norm(store.decision_summary()) == _norm(store.rows(VIEWS_SUMMARY, [None]))
    assert used == [True, True, True]


@pytest.mark.parametrize("grace", [600.0, 0.0])
def test_a_compaction_between_open_and_calibration_never_mixes_generations(dataset: Path, grace: float) -> None:
    """The Store's listing predates the swap: old facts with old files (grace), or a refresh (files gone)."""
    compact(dataset, grace_seconds=0)
    late_files(dataset)
    with Store(dataset) as fresh:
        expected = _norm(fresh.rows(VIEWS_CALIBRATION, [None]))
    with Store(dataset) as store:
        listed = list(store.files)
        compact(dataset, grace_seconds=grace)  # generation 2 swaps in while the store holds generation 1's list
        assert _norm(store.calibration()) == expected
        assert _norm(store.decision_summary()) == _norm(store.rows(VIEWS_SUMMARY, [None]))
        if grace:
            assert store.files == listed  # it used generation 1's facts with generation 1's files
    with check_same(dataset, facts_expected=True) as store:
        assert _norm(store.calibration()) == expected


def test_a_facts_file_damaged_past_its_footer_falls_back_to_the_spans(
    dataset: Path, caplog: pytest.LogCaptureFixture
) -> None:
    compact(dataset, grace_seconds=0)
    with Store(dataset) as store:
        expected = _norm(store.calibration())
        summary = _norm(store.decision_summary())
    path = _facts_files(dataset)[0]
    data = bytearray(path.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little") + 8
    for at in range(8, len(data) - footer - 8, 7):  # every page, header and data, scrambled; the footer intact
        data[at] ^= 0x5A
    path.write_bytes(bytes(data))
    assert plan(live_files(dataset)).fact_files  # the footer still matches: the damage shows only when read
    with Store(dataset) as store:
        assert _norm(store.calibration()) == expected
        assert _norm(store.decision_summary()) == summary
    assert "computing it from the spans" in caplog.text


def count_calls(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    """Count the calls ``module`` makes to its ``name`` (the function still runs)."""
    calls = [0]
    real = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def one_pair_a_day(ds: Path, days: int) -> None:
    """A decision and its outcome in each of ``days`` partitions."""
    for day in range(days):
        write(ds, day, "1", [decision(10 * day + 1, 0.5, day=day), outcome(10 * day + 2, 10 * day + 1, True, day=day)])


def test_one_run_finds_the_other_partitions_facts_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each compacted partition's facts are checked against every other partition's: found once per run, not
    # once per partition (P partitions would read P² manifests). Each later partition still checks the facts
    # this run made current for the earlier ones.
    from otel_replay.storage import facts as facts_module

    ds = tmp_path / "ds"
    one_pair_a_day(ds, 5)
    compact(ds, partitions=["2026-01-01"], grace_seconds=0)
    reads = count_calls(monkeypatch, facts_module, "read_manifest")
    compact(ds, grace_seconds=0)
    assert reads[0] == 5  # one listing of the five partitions
    for day, path in enumerate(_facts_files(ds)):
        checked = json.loads(pq.read_schema(path).metadata[b"otel_replay.facts.checked"])
        # day 0 was current before the run (it names nobody); each later day names every earlier one's current facts
        assert checked == [f"{p.parent.name}/{p.name}" for p in _facts_files(ds)[:day]] if day else checked == []
    check_same(ds, facts_expected=True).close()


def test_a_run_of_many_batches_defines_the_facts_views_once_per_schema_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A DuckDB connection and the views' DDL cost about 0.1 s of CPU: paid per batch before, now once per run and
    # per schema group (the views bind to the input's columns: a version 1 group gets its own connection).
    from otel_replay.storage import facts as facts_module

    ds = tmp_path / "ds"
    for n in range(12):  # twelve files, four of them version 1: two schema groups, a batch per two files
        rows = [decision(100 * n + 1, 0.25 + n / 48), outcome(100 * n + 2, 100 * n + 1, n % 3 == 0)]
        write(ds, 0, f"{n:02d}", rows, version_1=n % 3 == 1)
    views: list[str] = []
    real = facts_module._sql

    def watched(name: str) -> str:
        views.append(name)
        return real(name)

    monkeypatch.setattr(facts_module, "_sql", watched)
    report = compact(ds, grace_seconds=0, max_batch_rows=4)
    assert report.output_rows == 24
    assert views.count("facts_extract") == 6 and views.count("views") == 2  # six batches, two groups
    monkeypatch.undo()
    check_same(ds, facts_expected=True).close()


def test_other_partitions_facts_under_a_path_duckdb_would_read_as_a_glob_are_read_as_themselves(tmp_path: Path) -> None:
    """DuckDB reads ``ds[1]/…`` as a glob matching ``ds1/…``: the keys flagged shared must be ``ds[1]``'s own."""
    from otel_replay.storage.facts import _other_keys

    for root, keys in (("ds[1]", [1]), ("ds1", [2])):  # a sibling holding a file of the same name
        (tmp_path / root).mkdir()
        table = pa.table({"kind": ["decision"] * len(keys), "key": pa.array(keys, pa.uint64())})
        pq.write_table(table, tmp_path / root / "facts-a.parquet")
    mine = pa.table({"kind": ["decision", "decision"], "key": pa.array([1, 2], pa.uint64())})
    checked, shared = _other_keys([("date=x/facts-a.parquet", str(tmp_path / "ds[1]" / "facts-a.parquet"))], mine)
    assert checked == ["date=x/facts-a.parquet"]
    assert shared["decision"].to_pylist() == [1]  # was [2]: the sibling's key, and never its own
