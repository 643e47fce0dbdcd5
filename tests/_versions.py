"""Write files as older otel-replay versions did (storage schema version 1), for the version tests."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from otel_replay import semconv as sc
from otel_replay.exporters.schema import SCHEMA_METADATA_KEY

V2_COLUMNS = {
    "outcome_decision_id": sc.OUTCOME_DECISION_ID,
    "outcome_correct": sc.OUTCOME_CORRECT,
    "decision_confidence": sc.DECISION_CONFIDENCE,
}
"""The columns schema version 2 added -> the attribute each holds."""


def version_1_table(table: pa.Table) -> pa.Table:
    """``table`` (storage schema version 2 rows) as version 1 stored it: the typed values back in the JSON."""
    rows = table.select(["attributes", *V2_COLUMNS]).to_pylist()
    attributes = []
    for row in rows:
        attrs = json.loads(row["attributes"]) if row["attributes"] else {}
        for column, key in V2_COLUMNS.items():
            if row[column] is not None:
                attrs[key] = row[column]
        attributes.append(json.dumps(attrs, separators=(",", ":"), ensure_ascii=False))
    at = table.schema.get_field_index("attributes")
    old = table.set_column(at, table.schema.field(at), pa.array(attributes, pa.string())).drop_columns(list(V2_COLUMNS))
    metadata = dict(table.schema.metadata or {})
    metadata.pop(b"ARROW:schema", None)
    metadata[SCHEMA_METADATA_KEY] = b"1"
    return old.replace_schema_metadata(metadata)


def rewrite_as_version_1(path: Path, target: Path | None = None) -> Path:
    """Rewrite the Parquet file ``path`` (into ``target``, default in place) as a version 1 writer would have."""
    table = pq.read_table(path, partitioning=None)
    out = target or path
    tmp = out.with_name(f".{out.name}.tmp")
    pq.write_table(version_1_table(table), tmp, compression="zstd")
    tmp.replace(out)
    return out
