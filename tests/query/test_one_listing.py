"""A chain's lookups share one listing of the dataset; lookups outside such a scope each list it again."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from otel_replay.query.chains import ReplayBuilder
from otel_replay.query.store import Store
from otel_replay.storage import live_files

from ..storage.conftest import load_generator

CHAIN = "trade-000000004"


def _arrival(dataset: Path, name: str) -> None:
    """A copy of two of CHAIN's spans under new span ids, as a file arriving now (two more rows for its lookups)."""
    table = pq.read_table(live_files(dataset))
    mine = table.filter(pc.equal(table.column("correlation_id"), CHAIN)).slice(0, 2)
    ids = pa.array([name[:16].ljust(16, "0"), name[:15].ljust(16, "1")], pa.string())
    mine = mine.set_column(mine.schema.get_field_index("span_id"), "span_id", ids)
    partition = Path(live_files(dataset)[0]).parent
    target = partition / f"part-{name}.parquet"
    pq.write_table(mine.drop_columns([c for c in ("date",) if c in mine.column_names]), target)


def test_lookups_inside_one_listing_see_the_dataset_as_at_the_first_and_after_it_what_arrived(tmp_path: Path) -> None:
    dataset = tmp_path / "ds"
    load_generator().generate(dataset, spans=100, ids=10, days=1, rows_per_file=10, duplicates=0.0, seed=2)
    with Store(dataset) as store:
        ids = {"correlation_id": CHAIN}
        before = store.run_for("chains/trade", ids, chain_id=CHAIN)
        with store.engine.one_listing():
            first = store.run_for("chains/trade", ids, chain_id=CHAIN)
            _arrival(dataset, "aaaaaaaaaaaaaaaa")
            assert store.run_for("chains/trade", ids, chain_id=CHAIN) == first == before  # the one listing
        after = store.run_for("chains/trade", ids, chain_id=CHAIN)  # listed again: the arrival is read
        assert len(after) > len(before)
        with Store(dataset) as fresh:
            assert after == fresh.run("chains/trade", chain_id=CHAIN)
            # A chain built now (one listing for its four lookups) shows what a fresh store's does.
            assert (
                ReplayBuilder(store).build("trade", CHAIN).to_json()
                == ReplayBuilder(fresh).build("trade", CHAIN).to_json()
            )
