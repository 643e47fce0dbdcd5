from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import otel_replay
from otel_replay import CorruptFileError, DecisionTracer, RecordNotFound, audit, replay
from otel_replay.errors import DatasetError, QueryError
from otel_replay.storage import compact

from .._support import budget_policy, payment, snapshot

REPO = Path(__file__).resolve().parents[2]


def _capture(telemetry):
    with audit("vendor_payment", snapshot=snapshot(), correlation_id="c-1", session_id="s-1", agent_id="a-1") as d:
        d.read(invoice="INV-1")
        d.model("gpt-x", decision_basis="ok", output={"score": 0.9})
        d.act(payment())
    telemetry.force_flush()
    return d.record


def test_rehydrated_record_equals_in_process_record(telemetry, dataset):
    record = _capture(telemetry)
    with otel_replay.open(dataset) as store:
        again = store.record(record.record_id)
    assert again == record
    live = {"budget_remaining": 3_000, "allow_list": ["acme-supplies"]}
    assert replay(again, live_state=live, policy=budget_policy) == replay(record, live_state=live, policy=budget_policy)


def test_rehydration_in_a_new_process_gives_the_same_verdict(telemetry, dataset, tmp_path):
    record = _capture(telemetry)
    live = {"budget_remaining": 3_000, "allow_list": ["acme-supplies"]}
    expected = replay(record, live_state=live, policy=budget_policy)
    script = textwrap.dedent(
        f"""
        import json, otel_replay
        from tests._support import budget_policy
        store = otel_replay.open({str(dataset)!r})
        rec = store.record({record.record_id!r})
        v = otel_replay.replay(rec, live_state={live!r}, policy=budget_policy)
        print(json.dumps([v.fix.value, v.reason, rec.seal.hash, rec.snapshot.state, rec.action.cost]))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO)
    fix, reason, digest, state, cost = json.loads(out.stdout)
    assert (fix, reason, digest, state, cost) == (
        expected.fix.value,
        expected.reason,
        record.seal.hash,
        dict(record.snapshot.state),
        record.action.cost,
    )


def test_views_unpack_the_decision(telemetry, dataset):
    record = _capture(telemetry)
    with otel_replay.open(dataset) as store:
        d = store.rows("SELECT * FROM decisions")[0]
        reads = store.rows("SELECT * FROM reads")
        models = store.rows("SELECT * FROM model_calls")
        acts = store.rows("SELECT * FROM acts")
    assert d["record_id"] == record.record_id and d["source"] == "audit" and d["action_cost"] == 4200
    assert json.loads(d["snapshot_state"]) == dict(record.snapshot.state) and d["snapshot_version"] == "v7"
    assert json.loads(reads[0]["inputs"]) == {"invoice": "INV-1"}
    assert models[0]["model"] == "gpt-x" and json.loads(models[0]["output"]) == {"score": 0.9}
    assert acts[0]["action_type"] == "vendor_payment" and json.loads(acts[0]["action_arguments"]) == {
        "recipient": "acme-supplies"
    }
    assert {reads[0]["correlation_id"], models[0]["session_id"], acts[0]["agent_id"]} == {"c-1", "s-1", "a-1"}


def test_empty_and_missing_dataset_give_empty_results(tmp_path):
    with otel_replay.open(tmp_path / "nothing-here") as store:
        views = ("spans", "decisions", "reads", "model_calls", "acts", "agents", "audit_entries", "outcomes", "gates")
        for view in views:
            assert store.rows(f"SELECT * FROM {view}") == [], view
        assert otel_replay.ReplayBuilder(store).build_trade_chain("x").empty
        assert store.verify(None).ok and store.calibration() == []


def test_unknown_record_is_a_clear_error(telemetry, dataset):
    _capture(telemetry)
    with otel_replay.open(dataset) as store:
        with pytest.raises(RecordNotFound, match="no decision record 'nope'"):
            store.record("nope")


def test_corrupt_file_is_named_and_can_be_skipped(telemetry, dataset):
    record = _capture(telemetry)
    good = next((dataset / "spans").rglob("*.parquet"))
    bad = good.with_name("part-truncated.parquet")
    bad.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    with pytest.raises(CorruptFileError, match="part-truncated.parquet"):
        otel_replay.open(dataset)
    with otel_replay.open(dataset, skip_corrupt=True) as store:
        assert [p.path for p in store.skipped] == [str(bad)]
        assert store.record(record.record_id) == record
    assert good.exists() and bad.exists()  # nothing stored is touched


def test_temp_files_are_never_read(telemetry, dataset):
    record = _capture(telemetry)
    folder = next((dataset / "spans").rglob("*.parquet")).parent
    (folder / ".part-inflight.parquet.tmp").write_bytes(b"PAR1 half written")
    with otel_replay.open(dataset) as store:
        assert store.record(record.record_id) == record


def test_sql_errors_are_query_errors(tmp_path):
    with otel_replay.open(tmp_path) as store:
        with pytest.raises(QueryError, match="nope"):
            store.rows("SELECT * FROM nope")


def test_dataset_that_is_a_file_is_refused(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(DatasetError, match="is a file"):
        otel_replay.open(path)


def test_refresh_sees_new_files(telemetry, dataset):
    _capture(telemetry)
    store = otel_replay.open(dataset)
    assert len(store.rows("SELECT * FROM decisions")) == 1
    _capture(telemetry)
    assert len(store.rows("SELECT * FROM decisions")) == 1
    store.refresh()
    assert len(store.rows("SELECT * FROM decisions")) == 2
    store.close()


def damage_pages(source: Path, target: Path) -> Path:
    """Copy ``source`` to ``target`` with every column's first data page header overwritten; the footer stays intact."""
    import pyarrow.parquet as pq

    data = bytearray(source.read_bytes())
    group = pq.read_metadata(source).row_group(0)
    for i in range(group.num_columns):
        offset = group.column(i).data_page_offset
        data[offset : offset + 4] = b"\xff\xff\xff\xff"
    target.write_bytes(bytes(data))
    assert pq.read_metadata(target).num_rows == pq.read_metadata(source).num_rows  # the footer still reads
    return target


def test_a_damaged_data_page_is_named_and_can_be_skipped(telemetry, dataset):
    record = _capture(telemetry)
    good = next((dataset / "spans").rglob("*.parquet"))
    bad = damage_pages(good, good.with_name("part-damaged.parquet"))
    before = {p: p.read_bytes() for p in (good, bad)}
    with otel_replay.open(dataset) as store:  # the footer check passes: the damage shows only when pages are read
        with pytest.raises(CorruptFileError, match="part-damaged.parquet"):
            store.rows("SELECT * FROM spans")
        with pytest.raises(CorruptFileError, match="part-damaged.parquet"):
            store.record(record.record_id)
        with pytest.raises(CorruptFileError, match="part-damaged.parquet"):
            store.verify(None)
    with otel_replay.open(dataset, skip_corrupt=True) as store:
        assert len(store.rows("SELECT * FROM spans")) == len(pq_rows(good))
        assert [p.path for p in store.skipped] == [str(bad)]
        assert store.record(record.record_id) == record
        report = store.verify(None)
        assert not report.ok and report.unreadable_files == [str(bad)]
    assert {p: p.read_bytes() for p in (good, bad)} == before  # nothing stored is touched


def pq_rows(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path, columns=["span_id"]).to_pylist()


def test_rows_keep_repeated_columns_and_out_of_range_times(tmp_path):
    with otel_replay.open(tmp_path) as store:
        assert store.rows("SELECT 1 AS a, 2 AS a") == [{"a": 1, "a_2": 2}]
        row = store.rows("SELECT 'infinity'::TIMESTAMP AS t, '-infinity'::DATE AS d, TIMESTAMP '2026-01-02' AS ok")[0]
    assert row["t"] == "infinity" and row["d"] == "-infinity" and row["ok"].year == 2026


def test_run_loads_only_shipped_query_files(tmp_path):
    with otel_replay.open(tmp_path) as store:
        for name in ("../store", "chains/../../store", "/etc/passwd", "views.sql", "chains/trade/x"):
            with pytest.raises(QueryError, match="bad query name"):
                store.run(name)
        with pytest.raises(QueryError, match="no SQL file queries/nope.sql"):
            store.run("nope")


def test_a_long_lived_store_follows_a_compaction_that_deleted_its_files(tmp_path):
    """Files a compaction replaced vanish under an open store: it reads the live set, never errors or double counts."""
    from otel_replay.storage import compact

    dataset = tmp_path / "traces"
    telemetry = otel_replay.configure(dataset, set_global=False)
    tracer = otel_replay.DecisionTracer()
    for batch in range(3):
        for i in range(5):
            tracer.decision("agent", "step", f"r{batch}-{i}", correlation_id=f"c{i}")
        telemetry.force_flush()
    telemetry.shutdown()
    with otel_replay.open(dataset) as store:
        before = store.rows("SELECT count(*) AS n, count(DISTINCT span_id) AS d FROM spans")[0]
        assert before["n"] == before["d"] == 15 and len(store.files) >= 3
        old_files = list(store.files)
        report = compact(dataset, grace_seconds=0)
        assert report is not None and not any(Path(f).exists() for f in old_files)
        after = store.rows("SELECT count(*) AS n, count(DISTINCT span_id) AS d FROM spans")[0]
        assert after == before and store.files != old_files
        assert len(otel_replay.ReplayBuilder(store).build_trade_chain("c1").traces) == 3


def _rewrite_version(source: Path, target: Path, version: str | None, *, name: str | None = None) -> Path:
    """Copy ``source``'s rows to ``target`` with the storage schema version ``version`` (``None``: no version key)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from otel_replay.exporters.schema import SCHEMA_METADATA_KEY

    table = pq.read_table(source, partitioning=None)
    if name is not None:
        table = table.set_column(table.schema.get_field_index("name"), "name", pa.array([name] * table.num_rows))
    metadata = {k: v for k, v in (table.schema.metadata or {}).items() if k != SCHEMA_METADATA_KEY}
    if version is not None:
        metadata[SCHEMA_METADATA_KEY] = version.encode()
    pq.write_table(table.replace_schema_metadata(metadata), target)
    return target


def test_a_file_from_a_newer_major_schema_version_is_refused_by_name(telemetry, dataset):
    from otel_replay.query.files import schema_version

    record = _capture(telemetry)
    good = next((dataset / "spans").rglob("*.parquet"))
    newer = _rewrite_version(good, good.with_name("part-from-the-future.parquet"), "3.0")
    with pytest.raises(DatasetError, match="part-from-the-future.parquet") as raised:
        otel_replay.open(dataset)
    assert "3.0" in str(raised.value) and len(str(raised.value).splitlines()) == 1
    with pytest.raises(DatasetError, match="part-from-the-future.parquet"):  # not a damaged file: never skipped
        otel_replay.open(dataset, skip_corrupt=True)
    for version in ("x.1", "99999999999", ""):
        _rewrite_version(good, newer, version)
        with pytest.raises(DatasetError, match="unreadable storage schema version"):
            otel_replay.open(dataset)
    for version in ("2.9", "1", "0", None):  # same major, older, or written before versions were recorded
        _rewrite_version(good, newer, version)
        with otel_replay.open(dataset) as store:
            assert str(newer) in store.files and store.record(record.record_id) == record
    # A span name that spells the version key in the column statistics does not pass for the writer's version.
    forged = "\x18\x1aotel_replay.schema_version\x18\x019"
    _rewrite_version(good, newer, "1", name=forged)
    footer = newer.read_bytes()
    assert forged.encode() in footer and schema_version(footer) == "1"
    with otel_replay.open(dataset) as store:
        assert str(newer) in store.files


def test_opening_reads_no_footer_twice(telemetry, dataset):
    """refresh() re-checks only files whose size or mtime changed."""
    _capture(telemetry)
    good = next((dataset / "spans").rglob("*.parquet"))
    with otel_replay.open(dataset) as store:
        assert store.files == [str(good)]
        good.write_bytes(good.read_bytes()[:-9])  # damaged after it was checked: the new stamp is checked again
        with pytest.raises(CorruptFileError, match=good.name):
            store.refresh()


def test_files_with_different_columns_are_read_by_name(telemetry, dataset):
    """One writer schema in every footer: one footer binds the views; any other file: union_by_name."""
    import pyarrow.parquet as pq

    _capture(telemetry)
    good = next((dataset / "spans").rglob("*.parquet"))
    with otel_replay.open(dataset) as store:
        (one,) = store.rows("SELECT count(*) AS n, count(scope_name) AS named FROM spans")
    older = good.with_name("part-older-writer.parquet")
    pq.write_table(pq.read_table(good).drop_columns(["scope_name", "status_message"]), older)
    with otel_replay.open(dataset) as store:
        (both,) = store.rows("SELECT count(*) AS n, count(scope_name) AS named FROM spans")
        assert both == {"n": 2 * one["n"], "named": one["named"]}
        assert len(store.rows("SELECT * FROM decisions")) == 1  # the copy of each span counts once


def _foreign_copy(good: Path, file_name: str, **columns) -> Path:
    """A copy of ``good``'s rows as a foreign writer might store them: no otel-replay metadata, ``columns`` replaced."""
    import pyarrow.parquet as pq

    table = pq.read_table(good, partitioning=None).replace_schema_metadata(None)
    for column, values in columns.items():
        table = table.set_column(table.schema.get_field_index(column), column, values(table.num_rows))
    target = good.with_name(file_name)
    pq.write_table(table, target)
    return target


def test_a_foreign_files_other_scalar_types_leave_every_other_rows_types_alone(telemetry, dataset):
    # union_by_name took the widest type of each column over every file: one file's binary `name` made the column
    # BLOB for every row (verify: "TypeError: Object of type bytes is not JSON serializable", exit 3), its text
    # `duration_ns` made that column VARCHAR (sum(duration_ns) failed). The views cast each scalar column to the
    # span schema's type: the foreign file's unreadable values become NULL in its own rows only.
    import pyarrow as pa

    record = _capture(telemetry)
    good = next((dataset / "spans").rglob("*.parquet"))
    with otel_replay.open(dataset) as store:
        before = store.rows("SELECT name, duration_ns, dropped_events_count FROM spans ORDER BY span_id")
    _foreign_copy(
        good,
        "part-foreign-writer.parquet",
        name=lambda n: pa.array([b"op"] * n, pa.binary()),
        duration_ns=lambda n: pa.array(["long"] * n),
        dropped_events_count=lambda n: pa.array(["none"] * n),
    )
    with otel_replay.open(dataset) as store:
        types = store.rows(
            "SELECT DISTINCT typeof(name) AS n, typeof(duration_ns) AS d, typeof(dropped_events_count) AS e FROM spans"
        )
        assert types == [{"n": "VARCHAR", "d": "BIGINT", "e": "INTEGER"}]
        ours = "SELECT name, duration_ns, dropped_events_count FROM spans WHERE filename = ? ORDER BY span_id"
        assert store.rows(ours, [str(good)]) == before
        # the foreign rows' "long" is NULL: the sum is the dataset's own
        (total,) = store.rows("SELECT count(*) AS n, sum(duration_ns) AS ns FROM spans")
        assert total == {"n": 2 * len(before), "ns": sum(row["duration_ns"] for row in before)}
        assert store.record(record.record_id) == record
        assert not store.verify(None).ok  # the copies' records are not sealed as they stand: reported, not raised


def test_a_foreign_file_with_text_that_is_not_utf8_is_named(telemetry, dataset):
    # Read as text (binary_as_string), a value that is not UTF-8 fails the read: the file is named and can be skipped.
    import pyarrow as pa

    record = _capture(telemetry)
    good = next((dataset / "spans").rglob("*.parquet"))
    foreign = _foreign_copy(good, "part-foreign-binary.parquet", name=lambda n: pa.array([b"\xff"] * n, pa.binary()))
    with pytest.raises(CorruptFileError, match="part-foreign-binary.parquet"):
        with otel_replay.open(dataset) as store:
            store.rows("SELECT * FROM spans")
    with otel_replay.open(dataset, skip_corrupt=True) as store:
        store.rows("SELECT * FROM spans")
        assert [p.path for p in store.skipped] == [str(foreign)]
        assert store.record(record.record_id) == record


def test_a_foreign_file_without_optional_columns_leaves_the_views_whole(telemetry, dataset):
    # The views bind over the first file: a foreign one lacking `attributes` (sorted first) made every view that
    # reads it fail ("Referenced column attributes not found"), naming no file. Every span column is now supplied.
    import pyarrow.parquet as pq

    record = _capture(telemetry)
    good = next((dataset / "spans").rglob("*.parquet"))
    lacking = ["attributes", "resource_attributes", "events", "links", "status_message", "dropped_links_count"]
    table = pq.read_table(good, partitioning=None).replace_schema_metadata(None).drop_columns(lacking)
    pq.write_table(table, good.with_name("part-0-foreign.parquet"))  # listed before the dataset's own file
    with otel_replay.open(dataset) as store:
        assert store.files[0].endswith("part-0-foreign.parquet")
        assert [d["record_id"] for d in store.rows("SELECT record_id FROM decisions")] == [record.record_id]
        assert len(store.rows("SELECT * FROM acts")) == 1
        assert store.record(record.record_id) == record


@pytest.mark.parametrize(("name", "sibling"), [("ds[1]", "ds1"), ("ds*", "ds-other"), ("ds?", "dsX")])
def test_a_dataset_path_with_glob_characters_reads_only_its_own_files(telemetry, dataset, tmp_path, name, sibling):
    # DuckDB reads each listed path as a glob: "ds[1]/spans/.../part-N.parquet" also matched ds1's file of that
    # name (a copy of the dataset), so a lookup read a dataset it was not given (here a damaged one) or was refused.
    record = _capture(telemetry)
    telemetry.shutdown()
    own, other = tmp_path / name, tmp_path / sibling
    shutil.copytree(dataset, own)
    shutil.copytree(dataset, other)
    for path in (other / "spans").rglob("*.parquet"):
        path.write_bytes(path.read_bytes()[:100])  # not the dataset asked for: must never be read
    with otel_replay.open(own) as store:
        assert store.record(record.record_id) == record
        files = {row["filename"] for row in store.rows("SELECT DISTINCT filename FROM spans")}
        assert files and all(Path(f).is_relative_to(own) for f in files), files
        assert store.verify(None).ok


def test_a_damaged_file_is_named_in_a_dataset_path_with_glob_characters(telemetry, dataset, tmp_path):
    # The damaged-file probe read its path as a glob too: it decoded ds1's intact copy and named nothing.
    _capture(telemetry)
    telemetry.shutdown()
    own, other = tmp_path / "ds[1]", tmp_path / "ds1"
    shutil.copytree(dataset, own)
    shutil.copytree(dataset, other)
    good = next((own / "spans").rglob("*.parquet"))
    damage_pages(good, good)
    with pytest.raises(CorruptFileError) as raised:
        with otel_replay.open(own) as store:
            store.rows("SELECT * FROM spans")
    assert raised.value.path == str(good)


def test_calibration_from_facts_files_in_a_dataset_path_with_glob_characters(telemetry, dataset, tmp_path, caplog):
    # The facts view read its files as globs: ds[1]'s facts view read ds1's (here damaged) copy too, failed, and
    # calibration fell back to the spans with a warning; a sound copy was read alongside its own.
    tracer = DecisionTracer()
    for confidence, correct in [(0.95, True), (0.91, False), (0.55, True)]:
        tracer.record_outcome(tracer.decision("a", "sizing", "r", confidence), correct)
    telemetry.shutdown()
    own, other = tmp_path / "ds[1]", tmp_path / "ds1"
    shutil.copytree(dataset, own)
    compact(own, grace_seconds=0)
    assert list((own / "spans").rglob("_facts-*.pq"))  # calibration reads the facts files
    with otel_replay.open(own) as store:
        alone = store.calibration()
    shutil.copytree(own, other)
    for path in (other / "spans").rglob("_facts-*.pq"):
        path.write_bytes(path.read_bytes()[:100])
    with caplog.at_level(logging.WARNING, logger="otel_replay"), otel_replay.open(own) as store:
        assert store.calibration() == alone
    assert not [r.getMessage() for r in caplog.records if "facts" in r.getMessage()]
    assert [(c["bucket"], c["decisions"], c["correct"]) for c in alone] == [(0.5, 1, 1), (0.9, 2, 1)]


def test_a_dataset_path_that_is_not_utf8_is_refused_by_name(telemetry, dataset, tmp_path):
    # DuckDB takes only UTF-8 paths: opening ds\xff failed while defining the views, with "Python Conversion
    # Failure: cannot encode str as UTF-8, surrogate '\udcff' at position 2 is not allowed".
    _capture(telemetry)
    telemetry.shutdown()
    own = Path(os.fsdecode(bytes(tmp_path) + b"/ds\xff"))
    shutil.copytree(dataset, own)
    with pytest.raises(DatasetError, match=r"is not valid UTF-8 \(byte 0xff\).*rename") as raised:
        otel_replay.open(own)
    assert len(str(raised.value).splitlines()) == 1 and "ds\\xff" in str(raised.value)
