"""A span file carries the keys of its ids in its footer, and only a footer's own keys are ever taken for them."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otel_replay.exporters import id_keys
from otel_replay.exporters.id_keys import (
    GATE_KIND,
    ID_KEYS_METADATA_KEY,
    MAX_FOOTER_KEYS,
    encode_keys,
    footer_keys,
    id_key,
    table_keys,
)
from otel_replay.exporters.rows import DATE_COLUMN
from otel_replay.exporters.schema import SPAN_SCHEMA
from otel_replay.exporters.writer import write_partitions


def _rows(n: int, *, correlation: str = "trade-1", gate: str | None = None, status: str | None = None) -> pa.Table:
    """``n`` span rows of the real schema, each with its own record id; the last one a gate record when ``gate``."""
    columns: dict[str, list[object]] = {field.name: [None] * n for field in SPAN_SCHEMA}
    columns["trace_id"] = [f"{i:032x}" for i in range(n)]
    columns["span_id"] = [f"{i:016x}" for i in range(n)]
    columns["name"] = ["replay.decision"] * n
    columns["start_time"] = [1_767_225_600 * 10**9 + i for i in range(n)]
    columns["end_time"] = columns["start_time"]
    columns["correlation_id"] = [correlation] * n
    columns["record_id"] = [f"rec-{i}" for i in range(n)]
    columns["replay_kind"] = ["decision"] * n
    columns["attributes"] = ["{}"] * n
    columns["status_message"] = [status] * n
    if gate is not None:
        columns["replay_kind"][-1] = "gate"
        columns["attributes"][-1] = json.dumps({"replay.gate.decision_id": gate, "replay.gate.executed": "intent"})
    table = pa.Table.from_pydict(columns, schema=SPAN_SCHEMA)
    return table.append_column(DATE_COLUMN, pa.array(["2026-01-01"] * n))


def _footer(path: Path) -> bytes:
    data = path.read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    return data[-8 - length : -8]


def _write(tmp_path: Path, table: pa.Table) -> Path:
    [path] = write_partitions(table, tmp_path / "spans", lambda date: "part-1-aaaaaaaaaaaa.parquet")
    assert isinstance(path, Path)
    return path


def test_a_written_file_carries_the_key_of_each_of_its_ids_and_of_its_gate_records_decision(tmp_path):
    path = _write(tmp_path, _rows(5, gate="decision-9"))
    keys = footer_keys(_footer(path))
    assert keys is not None
    assert id_key("correlation_id", "trade-1") in keys and id_key("record_id", "rec-4") in keys
    assert id_key("trace_id", f"{3:032x}") in keys and id_key(GATE_KIND, "decision-9") in keys
    assert id_key("correlation_id", "trade-2") not in keys and id_key("record_id", "decision-9") not in keys
    # in the footer only: the Arrow schema read back (and carried by compaction) never holds them
    assert ID_KEYS_METADATA_KEY not in (pq.read_table(path).schema.metadata or {})
    assert ID_KEYS_METADATA_KEY in (pq.read_metadata(path).metadata or {})


def test_a_file_with_more_ids_than_a_footer_holds_carries_none_and_is_read_instead(tmp_path):
    path = _write(tmp_path, _rows(MAX_FOOTER_KEYS))  # a record id each, plus their trace ids: over the cap
    assert footer_keys(_footer(path)) is None
    assert ID_KEYS_METADATA_KEY not in (pq.read_metadata(path).metadata or {})


def test_gate_records_whose_decision_id_is_ambiguous_or_not_text_give_the_file_no_keys():
    twice = _rows(2, gate="d-1")
    text = '{"replay.gate.decision_id": "d-1", "replay.gate.decision_id": "d-2"}'
    attributes = twice.column("attributes").to_pylist()[:-1] + [text]
    assert table_keys(twice.set_column(twice.schema.get_field_index("attributes"), "attributes", [attributes])) is None
    number = '{"replay.gate.decision_id": 12}'
    attributes = twice.column("attributes").to_pylist()[:-1] + [number]
    assert table_keys(twice.set_column(twice.schema.get_field_index("attributes"), "attributes", [attributes])) is None
    broken = twice.column("attributes").to_pylist()[:-1] + ["{not json"]
    assert table_keys(twice.set_column(twice.schema.get_field_index("attributes"), "attributes", [broken])) is None


def _forged_pair(keys: list[int]) -> bytes:
    """The bytes a footer's key pair would have, then a writer's name, column orders and the end."""
    value = encode_keys(keys)
    writer = b"parquet-cpp-arrow version 26.0.1"
    return (
        b"\x18\x13"
        + ID_KEYS_METADATA_KEY
        + b"\x18"
        + bytes([len(value)])
        + value
        + b"\x00\x18"
        + bytes([len(writer)])
        + writer
        + b"\x00"
    )


def test_keys_forged_inside_a_span_value_are_never_taken_for_the_footers(tmp_path):
    # An older writer's file (no keys) whose status message, stored as the column's statistics, holds bytes
    # shaped like the keys' pair claiming the file holds only another trade.
    forged = _forged_pair([id_key("correlation_id", "trade-other")]).decode("ascii")
    table = _rows(3, status=forged).drop_columns([DATE_COLUMN])
    path = tmp_path / "old.parquet"
    pq.write_table(table, path)
    footer = _footer(path)
    assert ID_KEYS_METADATA_KEY in footer  # the forged bytes are in the footer, in the statistics
    assert footer_keys(footer) is None
    # a genuine file whose status holds the same bytes: its own keys, written last, are the ones taken
    genuine = _write(tmp_path, _rows(3, status=forged))
    keys = footer_keys(_footer(genuine))
    assert keys is not None and id_key("correlation_id", "trade-1") in keys
    assert id_key("correlation_id", "trade-other") not in keys


def test_a_footer_value_that_is_not_whole_keys_or_is_cut_short_gives_no_keys(tmp_path):
    path = _write(tmp_path, _rows(3))
    footer = _footer(path)
    assert footer_keys(footer) is not None
    assert footer_keys(footer[:-1]) is None  # the end of the footer is part of the proof
    at = footer.rfind(ID_KEYS_METADATA_KEY) + len(ID_KEYS_METADATA_KEY) + 3  # inside the base64 value
    assert footer_keys(footer[:at] + b"!" + footer[at + 1 :]) is None


def _gate_rows(texts: list[str | None]) -> pa.Table:
    """One gate row per text (its attributes JSON), behind a decision row, in the real schema."""
    table = _rows(len(texts) + 1, gate="d-0")
    kinds = ["decision"] + ["gate"] * len(texts)
    table = table.set_column(table.schema.get_field_index("replay_kind"), "replay_kind", pa.array(kinds))
    return table.set_column(table.schema.get_field_index("attributes"), "attributes", pa.array(["{}", *texts]))


def _slow_ids(texts: list[str | None]) -> list[str] | None:
    """What the pairs-hook parse alone gives for these gate rows (the reference the quick parse must match)."""
    found = []
    for text in texts:
        if text is None:
            continue
        value = id_keys._slow_gate_decision_id(text)
        if value is id_keys._UNREADABLE:
            return None
        if isinstance(value, str):
            found.append(value)
    return found


_K = '"replay.gate.decision_id"'
HOSTILE_GATE_TEXTS = [
    '{"replay.gate.decision_id":"d-1","replay.gate.executed":"intent"}',
    '{"replay.gate.decision_id":"d-1","replay.gate.decision_id":"d-2"}',  # twice: unreadable
    '{"\\u0072eplay.gate.decision_id":"d-1","replay.gate.decision_id":"d-2"}',  # twice, once escaped
    '{"\\u0072eplay.gate.decision_id":"d-3"}',  # only escaped: the id is d-3
    '{"replay.gate.decision_i\\u0064":"d-4","x":"\\\\u"}',
    '{"replay.gate.decision_id":"d-5","r":"{\\"replay.gate.decision_id\\":\\"d-6\\"}"}',  # a copy in a nested string
    '{"r":"{\\"replay.gate.decision_id\\":\\"d-6\\"}"}',  # only in a nested string: no id
    '{"r":"x\\"replay.gate.decision_id","replay.gate.decision_id":"d-7"}',  # a string's tail counted: slow path
    '{"n":{"replay.gate.decision_id":"d-8"}}',  # in a nested object: no id
    '{"replay.gate.decision_id":12}',  # not text
    '{"replay.gate.decision_id":123456789012345678901234567890}',  # a big number: not text either way
    '{"replay.gate.decision_id":null}',  # none
    '{"replay.gate.decision_id":["d-9"]}',
    '{"replay.gate.decision_id":{"id":"d-9"}}',
    '{"replay.gate.decision_id":""}',
    '{"replay.gate.decision_id":"d-\\"10\\\\\\/\\n"}',  # escapes in the value
    '{"replay.gate.decision_id":"d-11","x":NaN}',  # json reads NaN, orjson does not: the slow path decides
    '{"replay.gate.decision_id":"d-12","x":1e400}',
    '{not json',
    "",
    "[]",
    '["replay.gate.decision_id","d-13"]',
    '"replay.gate.decision_id"',
    '{"replay.gate.decision_id":"d-14"} x',
    ' \t{"replay.gate.decision_id" : "d-15" }\n',
    '{"replay.gate.decision_id":"d-16","deep":' + "[" * 40 + "]" * 40 + "}",
    '{"replay.gate.decision_id":"d-17","deep":' + "[" * 1010 + "]" * 1010 + "}",  # past json's depth, not orjson's
    '{"replay.gate.decision_id":"d-17","deep":' + "[" * 2000 + "]" * 2000 + "}",
    '{"replay.gate.decision_id":"d-18","x":"\x01"}',  # a raw control character: invalid
    '{"replay.gate.decision_id":"d-19","x":"\\ud800"}',  # a lone surrogate escape: json reads it
    '{"replay.gate.decision_id":"d-\u00e9\u2028\U0001f600"}',
    None,
]


def _or_recursion(find: object, texts: list[str | None]) -> object:
    try:
        return find(texts)  # type: ignore[operator]
    except RecursionError:  # json's parse of a text nested too deep (the slow path raises it today)
        return RecursionError


def test_each_hostile_gate_row_gives_the_decision_id_the_slow_parse_gives():
    for text in HOSTILE_GATE_TEXTS:
        got = _or_recursion(lambda texts: id_keys._gate_decision_ids(_gate_rows(texts)), [text])
        assert got == _or_recursion(_slow_ids, [text]), text
    readable = [t for t in HOSTILE_GATE_TEXTS if _or_recursion(_slow_ids, [t]) not in (None, RecursionError)]
    assert len(readable) > 10  # enough of them readable that a whole table of them means something
    assert id_keys._gate_decision_ids(_gate_rows(readable)) == _slow_ids(readable)
    assert id_keys._gate_decision_ids(_gate_rows(HOSTILE_GATE_TEXTS[:2])) is None


def test_the_quick_parse_leaves_every_doubtful_gate_row_to_the_slow_one():
    quick = [id_keys._quick_gate_decision_id(text) for text in HOSTILE_GATE_TEXTS[:9]]
    # plain, twice, escaped twice, escaped, escaped with "\\u", nested copy, nested only, a string's tail, nested object
    slow = id_keys._SLOW
    assert quick == ["d-1", slow, slow, slow, slow, "d-5", None, slow, slow]
    deep = [t for t in HOSTILE_GATE_TEXTS if t is not None and '"deep"' in t]
    assert len(deep) == 3 and all(id_keys._quick_gate_decision_id(t) is slow for t in deep)


def test_a_real_gate_row_gives_its_decision_id_and_the_file_its_key():
    record = {
        "replay.record.source": "gate",
        "replay.gate.decision_id": "93022968850f2e4c4af4f310e4376805",
        "replay.gate.action": json.dumps({"arguments": {"invoice": "INV-4471"}, "cost": 1.0}),
        "replay.gate.decision_record": json.dumps({"replay.record.id": "9302", "replay.gate.decision_id": "other"}),
        "replay.record.seq": 0,
    }
    table = _gate_rows([json.dumps(record, separators=(",", ":"))])
    assert id_keys._quick_gate_decision_id(table.column("attributes")[1].as_py()) == "93022968850f2e4c4af4f310e4376805"
    assert id_keys._gate_decision_ids(table) == ["93022968850f2e4c4af4f310e4376805"]
    keys = table_keys(table)
    assert keys is not None and id_key(GATE_KIND, "93022968850f2e4c4af4f310e4376805") in keys
    assert id_key(GATE_KIND, "other") not in keys and id_key(GATE_KIND, "d-0") not in keys


def test_gate_rows_in_other_column_types_give_what_they_always_gave():
    text = '{"replay.gate.decision_id":"x"}'
    as_binary = pa.table({"replay_kind": ["gate", None], "attributes": pa.array([text.encode(), None], pa.binary())})
    assert id_keys._gate_decision_ids(as_binary) == ["x"]  # json reads bytes; the quick parse is not tried
    as_large = pa.table({"replay_kind": ["gate"], "attributes": pa.array([text], pa.large_string())})
    assert id_keys._gate_decision_ids(as_large) == ["x"]
    assert id_keys._gate_decision_ids(pa.table({"replay_kind": ["gate"], "attributes": [3]})) is None
    assert id_keys._gate_decision_ids(pa.table({"replay_kind": ["gate"]})) is None  # no attributes to read
    empty = pa.table({"replay_kind": pa.array([], pa.string()), "attributes": pa.array([], pa.string())})
    assert id_keys._gate_decision_ids(empty) == []
    assert id_keys._gate_decision_ids(pa.table({"replay_kind": ["read"], "attributes": [3]})) == []
    assert id_keys._gate_decision_ids(pa.table({"replay_kind": ["read", None]})) == []  # no gate: nothing to read


def test_keys_are_written_as_8_little_endian_bytes_each_and_a_key_outside_64_bits_is_refused():
    keys = [0, 1, 2**64 - 1, 0x0102030405060708]
    packed = b"".join(key.to_bytes(8, "little") for key in keys)
    assert encode_keys(keys) == base64.b64encode(packed) == encode_keys(iter(keys))
    assert encode_keys([]) == b""
    for bad in ([-1], [2**64]):
        with pytest.raises(struct.error):
            encode_keys(bad)
