"""A foreign file whose span times are coarser than nanoseconds and past them (after 2262, before 1677).

Every reader casts span times to nanoseconds: such a file would stop every
query over the dataset (verify, lookups, chains) and compaction, naming no
file or the wrong thing. It is a corrupt file instead: named, refused, or
skipped with ``skip_corrupt`` while every other record is read and verified.
Real captures, real Parquet, real DuckDB.
"""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import otel_replay
from otel_replay import CorruptFileError, ReplayBuilder, audit
from otel_replay.cli import main
from otel_replay.exporters.schema import SPAN_SCHEMA
from otel_replay.integrity import load_signing_key
from otel_replay.storage import compact
from otel_replay.storage.span_columns import coarse_times

from .._support import payment, snapshot

_SECONDS = {9999: 253_402_300_799, 1000: -30_610_224_000}  # 9999-12-31T23:59:59Z and 1000-01-01T00:00:00Z
_WHEN = {9999: "9999-12-31T23:59:59Z", 1000: "1000-01-01T00:00:00Z"}
_PER_SECOND = {"ms": 10**3, "us": 10**6}
_CORRELATION = "far-1"


def _capture(telemetry) -> list:
    records = []
    for _ in range(2):
        with audit("vendor_payment", snapshot=snapshot(), correlation_id=_CORRELATION) as d:
            d.act(payment())
        records.append(d.record)
    telemetry.force_flush()
    return records


def _ours(dataset: Path) -> Path:
    (good,) = (dataset / "spans").rglob("*.parquet")
    return good


def _far_copy(good: Path, column: str, unit: str, year: int, *, name: str = "part-far.parquet", **write) -> Path:
    """A copy of ``good``'s rows beside it whose ``column`` (or each event's time) holds ``year`` in ``unit``."""
    table = pq.read_table(good, partitioning=None)
    value = _SECONDS[year] * _PER_SECOND[unit]
    n = table.num_rows
    if column == "events":
        event = pa.struct([("time", pa.timestamp(unit, "UTC")), ("name", pa.string()), ("attributes", pa.string())])
        far = pa.array([[{"time": value, "name": "far", "attributes": None}]] * n, pa.list_(event))
    else:
        far = pa.array([value] * n, pa.timestamp(unit, "UTC"))
    at = table.schema.get_field_index(column)
    table = table.set_column(at, pa.field(column, far.type), far)
    target = good.with_name(name)
    pq.write_table(table, target, **write)
    return target


def _files(dataset: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted((dataset / "spans").rglob("*")) if p.is_file()}


CASES = [
    ("start_time", "us", 9999),
    ("start_time", "us", 1000),
    ("start_time", "ms", 9999),
    ("start_time", "ms", 1000),
    ("end_time", "us", 9999),
    ("end_time", "us", 1000),
    ("end_time", "ms", 9999),
    ("end_time", "ms", 1000),
    ("events", "us", 9999),
    ("events", "ms", 1000),
]


@pytest.mark.parametrize(("column", "unit", "year"), CASES)
def test_store_names_the_file_and_skips_it_reading_every_other_record(telemetry, dataset, column, unit, year):
    records = _capture(telemetry)
    good = _ours(dataset)
    bad = _far_copy(good, column, unit, year)
    before = _files(dataset)
    shown = "events.time" if column == "events" else column
    with pytest.raises(CorruptFileError, match=rf"part-far\.parquet: column {shown} holds {_WHEN[year]}") as raised:
        otel_replay.open(dataset)
    assert "\n" not in str(raised.value) and f"timestamp[{unit}]" in str(raised.value)
    with otel_replay.open(dataset, skip_corrupt=True) as store:
        assert [p.path for p in store.skipped] == [str(bad)]
        assert store.files == [str(good)]
        (counted,) = store.rows("SELECT count(*) AS n, count(end_time) AS ended FROM spans")
        assert counted == {"n": pq.read_metadata(good).num_rows, "ended": pq.read_metadata(good).num_rows}
        assert [store.record(r.record_id) for r in records] == records
        chain = ReplayBuilder(store).build_trade_chain(_CORRELATION)
        assert sorted(t["record_id"] for t in chain.traces) == sorted(r.record_id for r in records)
        report = store.verify(load_signing_key(create=False))
        assert report.records == 2 and report.problems == [] and report.unreadable_files == [str(bad)]
    assert _files(dataset) == before  # nothing stored is touched


def _entry_point() -> str:
    script = Path(sys.executable).with_name("otel-replay")
    assert script.exists(), "the console script is installed with the package"
    return str(script)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_entry_point(), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("column", "unit", "year"), [("start_time", "us", 9999), ("end_time", "ms", 1000)])
def test_cli_verify_names_the_file_and_skip_corrupt_verifies_the_rest(telemetry, dataset, column, unit, year):
    _capture(telemetry)
    bad = _far_copy(_ours(dataset), column, unit, year)
    plain = _cli("verify", str(dataset))
    assert plain.returncode == 1 and len(plain.stderr.strip().splitlines()) == 1, plain.stderr
    assert plain.stderr.startswith(f"Error: corrupt Parquet file {bad}: column {column} holds {_WHEN[year]}")
    # The rest in-process (the process's exit and one-line error are shown above).
    skipping = CliRunner().invoke(main, ["verify", "--skip-corrupt", str(dataset)])
    assert skipping.exit_code == 1, skipping.output  # what was not read was not checked
    assert "0 problems in 2 records, 1 unreadable file" in skipping.stdout
    assert f"not checked: {bad}" in skipping.stdout
    assert f"warning: skipped {bad}: column {column} holds {_WHEN[year]}" in skipping.stderr
    bad.unlink()  # moved aside: the rest verifies
    fixed = CliRunner().invoke(main, ["verify", str(dataset)])
    assert fixed.exit_code == 0, fixed.output


@pytest.mark.parametrize(("column", "unit", "year"), [("start_time", "us", 9999), ("end_time", "ms", 1000)])
def test_compact_stops_naming_the_file_and_changes_nothing(telemetry, dataset, column, unit, year):
    records = _capture(telemetry)
    bad = _far_copy(_ours(dataset), column, unit, year)
    before = _files(dataset)
    with pytest.raises(CorruptFileError, match=rf"part-far\.parquet: column {column} holds {_WHEN[year]}"):
        compact(dataset, grace_seconds=0)
    assert _files(dataset) == before
    out = _cli("compact", str(dataset))
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith(f"Error: corrupt Parquet file {bad}: column {column} holds {_WHEN[year]}")
    assert "skip-corrupt" not in out.stderr  # compaction cannot leave a file out: the hint names what works
    assert _files(dataset) == before
    bad.unlink()  # moved aside: compaction goes on, every record still there
    compact(dataset, grace_seconds=0)
    with otel_replay.open(dataset) as store:
        assert [store.record(r.record_id) for r in records] == records


def test_a_file_without_statistics_is_checked_by_reading_the_column(telemetry, dataset):
    _capture(telemetry)
    bad = _far_copy(_ours(dataset), "start_time", "us", 9999, write_statistics=False)
    assert not pq.read_metadata(bad).row_group(0).column(SPAN_SCHEMA.get_field_index("start_time")).is_stats_set
    with pytest.raises(CorruptFileError, match=r"part-far\.parquet: column start_time holds 9999-12-31"):
        otel_replay.open(dataset)


def test_legacy_int96_times_past_nanoseconds_are_refused_not_wrapped(telemetry, dataset):
    """pyarrow reads INT96 as nanoseconds by default, wrapping 9999 round to 1816: compaction would store that."""
    _capture(telemetry)
    bad = _far_copy(_ours(dataset), "start_time", "us", 9999, use_deprecated_int96_timestamps=True)
    assert pq.read_metadata(bad).schema.column(SPAN_SCHEMA.get_field_index("start_time")).physical_type == "INT96"
    before = _files(dataset)
    with pytest.raises(CorruptFileError, match=r"part-far\.parquet: column start_time holds 9999-12-31"):
        otel_replay.open(dataset)
    with pytest.raises(CorruptFileError, match=r"part-far\.parquet: column start_time holds 9999-12-31"):
        compact(dataset, grace_seconds=0)
    assert _files(dataset) == before


def test_a_footer_claiming_nanoseconds_is_caught_when_the_query_fails(telemetry, dataset):
    """Admission trusts a footer's Arrow schema (ours are nanoseconds); one that lies is named by the failed query."""
    records = _capture(telemetry)
    good = _ours(dataset)
    ours = pq.ParquetFile(good).metadata.metadata[b"ARROW:schema"]
    table = pq.read_table(good, partitioning=None)
    at = table.schema.get_field_index("start_time")
    far = pa.array([_SECONDS[9999] * 10**6] * table.num_rows, pa.timestamp("us", "UTC"))
    table = table.set_column(at, pa.field("start_time", far.type), far)
    bad = good.with_name("part-forged.parquet")
    with pq.ParquetWriter(bad, table.schema, store_schema=False) as writer:
        writer.write_table(table)
        writer.add_key_value_metadata({b"ARROW:schema": ours})
    claimed = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(pq.ParquetFile(bad).metadata.metadata[b"ARROW:schema"])))
    assert claimed.field("start_time").type == pa.timestamp("ns", "UTC")  # the footer claims nanoseconds
    with otel_replay.open(dataset) as store:
        assert store.files == [str(good), str(bad)]  # admitted on its footer
        with pytest.raises(CorruptFileError, match=r"part-forged\.parquet: column start_time holds 9999-12-31"):
            store.verify(load_signing_key(create=False))
    with otel_replay.open(dataset, skip_corrupt=True) as store:
        report = store.verify(load_signing_key(create=False))
        assert report.records == 2 and report.problems == [] and report.unreadable_files == [str(bad)]
        assert [store.record(r.record_id) for r in records] == records


def test_coarse_times_in_range_are_read(telemetry, dataset):
    """Microseconds that fit are not refused: DuckDB casts them up to nanoseconds."""
    _capture(telemetry)
    good = _ours(dataset)
    table = pq.read_table(good, partitioning=None)
    at = table.schema.get_field_index("start_time")
    table = table.set_column(at, "start_time", table.column(at).cast(pa.timestamp("us", "UTC"), safe=False))
    pq.write_table(table, good.with_name("part-micro.parquet"))
    with otel_replay.open(dataset) as store:
        assert len(store.files) == 2 and store.skipped == []
        assert store.rows("SELECT count(*) AS n FROM spans") == [{"n": 2 * table.num_rows}]


def test_our_schema_takes_the_fast_path():
    """Span files we write store nanoseconds: admission never reads past their footer's Arrow schema."""
    assert not coarse_times(SPAN_SCHEMA)
