"""The span -> row conversion: one row builder, fed from SDK spans or OTLP protobuf.

Everything that decides what a row *is* (which attributes are promoted to
typed columns, how values become JSON, id and time encoding, the partition
date) lives in :class:`RowBuilder`. Two thin readers feed it: one walks SDK
``ReadableSpan`` objects (the in-process exporter), the other walks decoded
OTLP ``ResourceSpans`` (the OTLP receiver, ``ingest``). Both hand the builder
the same plain values, so a span exported in-process and the same span sent
over OTLP become byte-identical rows; ``tests/exporters/test_rows.py`` pins that by
pushing one set of spans through both (the SDK's own OTLP encoder on one side).

The SDK reader exists because encoding to protobuf and decoding it again in
the same process costs more than the whole row build (see benchmarks/).
"""

from __future__ import annotations

import collections
import itertools
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util import BoundedList

from otel_replay import semconv as sc
from otel_replay._json import compact_json, compact_json_bytes
from otel_replay.errors import PayloadError

from .otlp_wire import KEY_VALUES, LiteRequest, LiteResourceSpans, any_value, read_events
from .schema import DATE_COLUMN, EVENT_TYPE, LINK_TYPE, PROMOTED_ARROW_TYPES, SPAN_SCHEMA

__all__ = [
    "DATE_COLUMN",
    "TIME_LIMIT_NS",
    "RowBuilder",
    "any_value",
    "payload_to_table",
    "request_to_table",
    "resource_spans_to_table",
    "span_count_error",
    "span_time_error",
    "spans_to_table",
]

_OTLP_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
_OTLP_STATUS = ("UNSET", "OK", "ERROR")
_DAY_NS = 86_400 * 1_000_000_000
_dumps = compact_json

TIME_LIMIT_NS = 2**63 - 1
"""Span, end and event times must be below this (int64 nanoseconds; 2262-04-11, DuckDB's "infinity")."""
_TIME_LIMIT = TIME_LIMIT_NS
COUNT_LIMIT = 2**31 - 1
"""The ``dropped_*_count`` columns are int32: a count must not exceed this (OTLP's fields are uint32)."""
_COUNT_LIMIT = COUNT_LIMIT


def span_time_error(start_ns: int, end_ns: int, event_times: Iterable[int] = (), *, otlp: bool = False) -> str | None:
    """Why a span's times cannot be stored, or ``None`` when they can.

    A time must be a whole number of nanoseconds in ``[0, TIME_LIMIT_NS)``: the
    dataset stores ``timestamp(ns)`` (int64), and OTLP's unsigned fields can
    carry up to ``2**64-1``. An end before the start is storable (its
    ``duration_ns`` is NULL), so it is not an error by itself. Both span
    readers, the in-process exporter and the OTLP receiver (at admission, and
    again when it builds rows) call this per span, so one bad span is refused
    alone instead of failing its whole batch. ``otlp`` names the fields as the
    OTLP message does (``start_time_unix_nano``, ``events[0].time_unix_nano``).
    """
    start, end = ("start_time_unix_nano", "end_time_unix_nano") if otlp else ("start_time", "end_time")
    unit = "" if otlp else " ns"
    for label, value in ((start, start_ns), (end, end_ns)):
        if not 0 <= value < TIME_LIMIT_NS:
            return f"{label} {value}{unit} is out of range (0 to {TIME_LIMIT_NS - 1})"
    for index, value in enumerate(event_times):
        if not 0 <= value < TIME_LIMIT_NS:
            label = f"events[{index}].time_unix_nano" if otlp else f"event {index} time"
            return f"{label} {value}{unit} is out of range (0 to {TIME_LIMIT_NS - 1})"
    return None


def span_count_error(dropped: tuple[int, int, int]) -> str | None:
    """Why a span's dropped (attributes, events, links) counts cannot be stored, or ``None`` when they can.

    The receiver's admission and :class:`RowBuilder` both call this, so a span
    the row conversion would refuse is refused before it is acknowledged.
    """
    if (dropped[0] | dropped[1] | dropped[2]) > _COUNT_LIMIT:  # any above 2**31-1 (all are >= 0)
        return f"dropped counts {dropped} exceed {_COUNT_LIMIT}"
    return None


def _span_label(trace_id: str, span_id: str, name: str) -> str:
    return f"span {name!r} (trace {trace_id}, span {span_id})"


class RowBuilder:
    """Accumulates spans column by column and turns them into one Arrow table.

    Both span readers hand it whole batches through :meth:`extend` (plain
    lists, one per field: the SDK reader per export batch, the OTLP reader per
    ``ScopeSpans``); :meth:`add` takes one span by keyword. Everything that
    decides what a row *is* happens once per batch in :meth:`table`:
    promotion of attributes to typed columns, the attributes JSON (see
    :func:`otel_replay._json.compact_json_bytes`), durations and partition dates.

    Args:
        rejected: where to note spans that cannot be stored (one line each,
            naming the span and why); such spans are left out. Without it, the
            first such span raises :class:`~otel_replay.errors.PayloadError`.

    """

    def __init__(self, rejected: list[str] | None = None) -> None:
        """Start an empty batch."""
        self._cols: dict[str, list[Any]] = {name: [] for name in _COLUMNS}
        self._events: dict[str, list[Any]] = {name: [] for name in _EVENT_FIELDS}
        self._links: dict[str, list[Any]] = {name: [] for name in _LINK_FIELDS}
        self._rejected = rejected

    def __len__(self) -> int:
        """Spans accepted so far."""
        return len(self._cols["trace_id"])

    def _refuse(self, label: str, reason: str) -> None:
        if self._rejected is None:
            raise PayloadError(f"{label}: {reason}")
        self._rejected.append(f"{label}: {reason}")

    def add(
        self,
        *,
        trace_id: str,
        span_id: str,
        parent_span_id: str | None,
        trace_state: str | None,
        name: str,
        kind: str,
        resource: tuple[str | None, str],
        scope: tuple[str | None, str | None],
        start: int,
        end: int,
        status: tuple[str, str | None],
        attributes: dict[str, Any],
        events: list[dict[str, Any]],
        links: list[dict[str, Any]],
        dropped: tuple[int, int, int],
    ) -> bool:
        """Append one span; ``False`` when it was refused (see the class docstring).

        ``attributes`` is consumed (promoted keys are removed when the table is built).
        Each event is ``{"time", "name", "attributes"}`` and each link
        ``{"trace_id", "span_id", "trace_state", "attributes"}``, attributes as JSON text.
        """
        # The hot path: inline comparisons (span_time_error says why, when one fails).
        bad = not (0 <= start < _TIME_LIMIT and 0 <= end < _TIME_LIMIT)
        for ev in events:
            if not 0 <= ev["time"] < _TIME_LIMIT:
                bad = True
        if bad:
            why = span_time_error(start, end, [ev["time"] for ev in events])
            self._refuse(_span_label(trace_id, span_id, name), why or "time out of range")
            return False
        count_problem = span_count_error(dropped)
        if count_problem is not None:
            self._refuse(_span_label(trace_id, span_id, name), count_problem)
            return False
        for column, value in zip(
            _COLUMNS,
            (
                trace_id,
                span_id,
                parent_span_id,
                trace_state,
                name,
                kind,
                resource[0],
                scope[0],
                scope[1],
                start,
                end,
                status[0],
                status[1],
                attributes,
                resource[1],
                dropped[0],
                dropped[1],
                dropped[2],
                len(events),
                len(links),
            ),
            strict=True,
        ):
            self._cols[column].append(value)
        for ev in events:
            for field in _EVENT_FIELDS:
                self._events[field].append(ev[field])
        for link in links:
            for field in _LINK_FIELDS:
                self._links[field].append(link[field])
        return True

    def extend(self, columns: dict[str, list[Any]], events: dict[str, list[Any]], links: dict[str, list[Any]]) -> None:
        """Append a batch given as one list per field (the names of :meth:`add`'s columns; see ``_COLUMNS``).

        ``events`` and ``links`` hold the batch's events and links flattened
        in span order (``columns["event_count"]``/``["link_count"]`` say how
        many each span has). The whole batch is checked at once; when a span
        is unstorable, the batch goes through :meth:`add` span by span, so
        exactly the bad ones are refused.
        """
        starts, ends, times = columns["start"], columns["end"], events["time"]
        if not starts:
            return
        bad = min(starts) < 0 or max(starts) >= _TIME_LIMIT or min(ends) < 0 or max(ends) >= _TIME_LIMIT
        bad = bad or (bool(times) and (min(times) < 0 or max(times) >= _TIME_LIMIT))
        for key in ("dropped_attributes", "dropped_events", "dropped_links"):
            bad = bad or max(columns[key]) > _COUNT_LIMIT
        if not bad:
            for name in _COLUMNS:
                self._cols[name].extend(columns[name])
            for name in _EVENT_FIELDS:
                self._events[name].extend(events[name])
            for name in _LINK_FIELDS:
                self._links[name].extend(links[name])
            return
        ev_at = link_at = 0
        for i in range(len(starts)):
            ev_n, link_n = columns["event_count"][i], columns["link_count"][i]
            self.add(
                trace_id=columns["trace_id"][i],
                span_id=columns["span_id"][i],
                parent_span_id=columns["parent_span_id"][i],
                trace_state=columns["trace_state"][i],
                name=columns["name"][i],
                kind=columns["kind"][i],
                resource=(columns["service_name"][i], columns["resource_attributes"][i]),
                scope=(columns["scope_name"][i], columns["scope_version"][i]),
                start=starts[i],
                end=ends[i],
                status=(columns["status_code"][i], columns["status_message"][i]),
                attributes=columns["attributes"][i],
                events=[{f: events[f][j] for f in _EVENT_FIELDS} for j in range(ev_at, ev_at + ev_n)],
                links=[{f: links[f][j] for f in _LINK_FIELDS} for j in range(link_at, link_at + link_n)],
                dropped=(columns["dropped_attributes"][i], columns["dropped_events"][i], columns["dropped_links"][i]),
            )
            ev_at += ev_n
            link_at += link_n

    def table(self) -> pa.Table:
        """The batch as an Arrow table in :data:`SPAN_SCHEMA`, plus the ``date`` column.

        Call it once: promotion moves keys out of the attribute mappings it was given.
        """
        c = self._cols
        attributes = c["attributes"]
        promoted = {column: _promote(attributes, key) for key, column in sc.PROMOTED_COLUMNS.items()}
        start = pa.array(c["start"], pa.int64())
        end = pa.array(c["end"], pa.int64())
        duration = pc.if_else(pc.greater_equal(end, start), pc.subtract(end, start), pa.scalar(None, pa.int64()))
        arrays: dict[str, pa.Array] = {
            "start_time": start.cast(_TS),
            "end_time": end.cast(_TS),
            "duration_ns": duration,
            "attributes": _json_array(attributes),
            "events": _list_array(
                c["event_count"],
                [pa.array(self._events["time"], pa.int64()).cast(_TS)]
                + [pa.array(self._events[f], pa.string()) for f in _EVENT_FIELDS[1:]],
                EVENT_TYPE,
            ),
            "links": _list_array(
                c["link_count"], [pa.array(self._links[f], pa.string()) for f in _LINK_FIELDS], LINK_TYPE
            ),
            **promoted,
        }
        for field in SPAN_SCHEMA:
            if field.name not in arrays:
                arrays[field.name] = pa.array(c[_SOURCE.get(field.name, field.name)], field.type)
        table = pa.Table.from_arrays([arrays[f.name] for f in SPAN_SCHEMA], schema=SPAN_SCHEMA)
        return table.append_column(DATE_COLUMN, _dates(start))


_TS = pa.timestamp("ns", tz="UTC")
_COLUMNS = (
    "trace_id",
    "span_id",
    "parent_span_id",
    "trace_state",
    "name",
    "kind",
    "service_name",
    "scope_name",
    "scope_version",
    "start",
    "end",
    "status_code",
    "status_message",
    "attributes",
    "resource_attributes",
    "dropped_attributes",
    "dropped_events",
    "dropped_links",
    "event_count",
    "link_count",
)
_SOURCE = {
    "dropped_attributes_count": "dropped_attributes",
    "dropped_events_count": "dropped_events",
    "dropped_links_count": "dropped_links",
}
_EVENT_FIELDS = ("time", "name", "attributes")
_LINK_FIELDS = ("trace_id", "span_id", "trace_state", "attributes")


def _promote(attributes: list[dict[str, Any]], key: str) -> pa.Array:
    """Move ``key`` out of each mapping into its typed column; a value of any other type stays put.

    The column's type is ``semconv.PROMOTED_TYPES[key]`` (``str`` when not
    listed): only a value of exactly that type moves (a bool is not promoted
    to a string column, ``'0.9'`` or ``1`` not to a double column, ``1`` not to
    a bool column), and a double column takes finite floats only, so the
    attribute comes back from the column with its type and value unchanged.
    """
    wanted = sc.PROMOTED_TYPES.get(key, str)
    arrow_type = _PROMOTED_ARROW[key]
    values = list(map(dict.get, attributes, itertools.repeat(key)))
    if wanted is str and _only_str_or_none(map(type, values)):  # the common case: absent or a string everywhere
        holders = [a for a, v in zip(attributes, values, strict=True) if v is not None]
        if holders:
            collections.deque(map(dict.pop, holders, itertools.repeat(key)), maxlen=0)
        return pa.array(values, arrow_type)
    if values.count(None) == len(values):  # absent everywhere: most spans carry no outcome or confidence
        return pa.nulls(len(values), arrow_type)
    kept: list[Any]
    if wanted is float:
        kept = [v if v.__class__ is float and math.isfinite(v) else None for v in values]
    else:
        kept = [v if v.__class__ is wanted else None for v in values]
    for mapping, value in zip(attributes, kept, strict=True):
        if value is not None:
            del mapping[key]
    return pa.array(kept, arrow_type)


_PROMOTED_ARROW = {key: PROMOTED_ARROW_TYPES[column] for key, column in sc.PROMOTED_COLUMNS.items()}
_only_str_or_none = frozenset({str, type(None)}).issuperset


def _json_array(mappings: list[dict[str, Any]]) -> pa.Array:
    """One string column from the mappings' stored JSON, assembled from one joined buffer.

    The bytes are valid UTF-8 by construction (orjson refuses lone
    surrogates and json's text is encoded strictly), so Arrow need not check.
    """
    blobs = [compact_json_bytes(m) for m in mappings]
    data = b"".join(blobs)
    if len(data) >= _OFFSET_LIMIT:
        return pa.array(blobs, pa.large_binary()).cast(pa.string())
    offsets = pa.array(itertools.accumulate(map(len, blobs), initial=0), pa.int32())
    return pa.StringArray.from_buffers(len(blobs), offsets.buffers()[1], pa.py_buffer(data))


_OFFSET_LIMIT = 2**31 - 1


def _list_array(counts: list[int], children: list[pa.Array], item: pa.StructType) -> pa.Array:
    offsets = pa.array(itertools.accumulate(counts, initial=0), pa.int32())
    values = pa.StructArray.from_arrays(children, fields=list(item))
    return pa.ListArray.from_arrays(offsets, values, type=pa.list_(item))


def _dates(start: pa.Array) -> pa.Array:
    """``YYYY-MM-DD`` (UTC) of each start time, formatted once per distinct day."""
    days = pc.divide(start, _DAY_NS)  # integer division: times are >= 0
    unique = pc.unique(days)
    names = pa.array(
        [datetime.fromtimestamp(day * 86_400, tz=UTC).strftime("%Y-%m-%d") for day in unique.to_pylist()],
        pa.string(),
    )
    return pc.take(names, pc.index_in(days, unique))

def _resource(attributes: Mapping[str, Any]) -> tuple[str | None, str]:
    service = attributes.get(sc.SERVICE_NAME)
    return (service if isinstance(service, str) else None), _dumps(dict(attributes))


# --- OTLP protobuf reader ------------------------------------------------------
# Column by column over the lean view of otlp_wire: each span's fields are read
# with one C-level call (operator.attrgetter) and transposed, and each
# attribute list becomes a dict of KEY_VALUES pairs (mostly remembered) in C.

_SCALAR_KINDS = frozenset({"string_value", "bool_value", "int_value", "double_value"})
# Value types whose JSON orjson writes byte for byte as json does, whatever the value
# (a float's bytes depend on its value: those go through compact_json's check).
_PLAIN_TYPES = frozenset({str, int, bool})
_key_value = KEY_VALUES.__getitem__

_orjson_dumps: Any
try:
    from orjson import dumps as _orjson_dumps
except ImportError:  # pragma: no cover - orjson is a dependency; compact_json falls back to json without it
    _orjson_dumps = None


def _pb_attrs(kvs: Iterable[Any]) -> dict[str, Any]:
    """Decoded ``KeyValue`` messages as a dict (a repeated key: first position, last value)."""
    out: dict[str, Any] = {}
    for kv in kvs:  # scalars inline; arrays, kvlists and bytes through any_value
        value = kv.value
        kind = value.WhichOneof("value")
        out[kv.key] = getattr(value, kind) if kind in _SCALAR_KINDS else any_value(value)
    return out


def _attr_dicts(lists: Iterable[Any]) -> list[dict[str, Any]]:
    """One dict per list of encoded ``KeyValue`` messages; a repeated key keeps its first position and last value."""
    return list(map(dict, map(map, itertools.repeat(_key_value), lists)))


def _json_texts(mappings: list[dict[str, Any]]) -> list[str]:
    """Each mapping's stored JSON text: :func:`compact_json`, with its per-value check done once for the batch."""
    if _orjson_dumps is not None and _PLAIN_TYPES.issuperset(
        map(type, itertools.chain.from_iterable(map(dict.values, mappings)))
    ):
        try:
            return [blob.decode() for blob in map(_orjson_dumps, mappings)]
        except TypeError:  # defensive: compact_json decides (upb strings are valid UTF-8, ints 64-bit)
            pass
    return list(map(_dumps, mappings))


class _EnumNames(dict[int, str]):
    """Enum number -> name; a number the enum does not define reads as its digits."""

    def __missing__(self, key: int) -> str:
        return str(key)


_KIND_NAME = _EnumNames(enumerate(_OTLP_KINDS)).__getitem__
_STATUS_NAME = _EnumNames(enumerate(_OTLP_STATUS)).__getitem__
_SPAN_FIELDS = operator.attrgetter(
    "trace_id",
    "span_id",
    "parent_span_id",
    "trace_state",
    "name",
    "kind",
    "start_time_unix_nano",
    "end_time_unix_nano",
    "status",
    "attributes",
    "dropped_attributes_count",
    "dropped_events_count",
    "dropped_links_count",
    "events",
    "links",
)
_STATUS_FIELDS = operator.attrgetter("code", "message")
_PB_LINK_FIELDS = operator.attrgetter("trace_id", "span_id", "trace_state", "attributes")


def _otlp_events(per_span: Sequence[Any]) -> dict[str, list[Any]]:
    times, names, texts = read_events(itertools.chain.from_iterable(per_span))
    return {"time": times, "name": names, "attributes": texts}


def _otlp_links(per_span: Sequence[Any]) -> dict[str, list[Any]]:
    flat = list(itertools.chain.from_iterable(per_span))
    if not flat:
        return {name: [] for name in _LINK_FIELDS}
    trace_ids, span_ids, states, attrs = zip(*map(_PB_LINK_FIELDS, flat), strict=True)
    return {
        "trace_id": list(map(bytes.hex, trace_ids)),
        "span_id": list(map(bytes.hex, span_ids)),
        "trace_state": [state or None for state in states],
        "attributes": _json_texts(_attr_dicts(attrs)),
    }


def _scope_columns(
    spans: Sequence[Any], resource: tuple[str | None, str], scope: tuple[str | None, str | None]
) -> tuple[dict[str, list[Any]], dict[str, list[Any]], dict[str, list[Any]]]:
    """The :meth:`RowBuilder.extend` columns of one ``ScopeSpans``' spans (``otlp_wire`` messages)."""
    n = len(spans)
    (trace_ids, span_ids, parents, states, names, kinds, starts, ends, statuses, attrs, d_attrs, d_events, d_links,
     events, links) = zip(*map(_SPAN_FIELDS, spans), strict=True)  # fmt: skip
    codes, messages = zip(*map(_STATUS_FIELDS, statuses), strict=True)
    columns: dict[str, list[Any]] = {
        "trace_id": list(map(bytes.hex, trace_ids)),
        "span_id": list(map(bytes.hex, span_ids)),
        "parent_span_id": [parent.hex() or None for parent in parents],
        "trace_state": [state or None for state in states],
        "name": list(names),
        "kind": list(map(_KIND_NAME, kinds)),
        "service_name": [resource[0]] * n,
        "scope_name": [scope[0]] * n,
        "scope_version": [scope[1]] * n,
        "start": list(starts),
        "end": list(ends),
        "status_code": list(map(_STATUS_NAME, codes)),
        "status_message": [message or None for message in messages],
        "attributes": _attr_dicts(attrs),
        "resource_attributes": [resource[1]] * n,
        "dropped_attributes": list(d_attrs),
        "dropped_events": list(d_events),
        "dropped_links": list(d_links),
        "event_count": list(map(len, events)),
        "link_count": list(map(len, links)),
    }
    return columns, _otlp_events(events), _otlp_links(links)


def _lite_resource_spans_to_builder(builder: RowBuilder, lite: Any) -> None:
    resource = _resource(dict(map(_key_value, lite.resource.attributes)))
    for ss in lite.scope_spans:
        if ss.spans:
            scope = ss.scope
            builder.extend(*_scope_columns(ss.spans, resource, (scope.name or None, scope.version or None)))


def resource_spans_to_table(resource_spans: Sequence[ResourceSpans], rejected: list[str] | None = None) -> pa.Table:
    """Convert OTLP ``ResourceSpans`` messages to one Arrow table (plus ``date``).

    Each ``ScopeSpans`` is read column by column into the :class:`RowBuilder`
    (through the lean view of :mod:`otel_replay.exporters.otlp_wire`).
    A span that cannot be stored (see :func:`span_time_error`) is noted in
    ``rejected`` and left out; without ``rejected`` it raises ``PayloadError``.
    """
    builder = RowBuilder(rejected)
    for rs in resource_spans:
        _lite_resource_spans_to_builder(builder, LiteResourceSpans.FromString(rs.SerializeToString()))
    return builder.table()


def request_to_table(request: ExportTraceServiceRequest, rejected: list[str] | None = None) -> pa.Table:
    """Convert a decoded OTLP ``ExportTraceServiceRequest`` to rows (``rejected``: as above)."""
    return payload_to_table(request.SerializeToString(), rejected)


def payload_to_table(payload: bytes, rejected: list[str] | None = None) -> pa.Table:
    """Convert a serialized ``ExportTraceServiceRequest`` to rows (``rejected``: as above).

    ``payload`` must be bytes the real ``ExportTraceServiceRequest`` parser
    accepts (the receiver's WAL holds only such records; decode first when
    unsure): this reader skips what that parser checks inside attribute values.
    """
    builder = RowBuilder(rejected)
    for lite in LiteRequest.FromString(payload).resource_spans:
        _lite_resource_spans_to_builder(builder, lite)
    return builder.table()


# --- SDK span reader -----------------------------------------------------------

_FIELDS = ("context", "parent", "name", "kind", "resource", "instrumentation_scope", "status", "start_time", "end_time")
# ReadableSpan keeps each behind a property; its ``_``-prefixed attribute is read without a Python call.
_FIELD_RAW = tuple(operator.attrgetter(f"_{name}") for name in _FIELDS)
_FIELD_PUBLIC = tuple(operator.attrgetter(name) for name in _FIELDS)


def _span_context_getters() -> tuple[Any, Any, Any]:
    # SpanContext is a tuple (trace_id, span_id, is_remote, flags, state, ...): its items read in C,
    # its properties through a Python call each. Checked once, in case a future API changes the layout.
    from opentelemetry.trace import SpanContext, TraceState

    state = TraceState([("k", "v")])
    probe = SpanContext(0x1234, 0x56, is_remote=False, trace_state=state)
    if isinstance(probe, tuple) and probe[0] == 0x1234 and probe[1] == 0x56 and probe[4] is state:
        return operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(4)
    return tuple(operator.attrgetter(n) for n in ("trace_id", "span_id", "trace_state"))  # type: ignore[return-value]


_TRACE_ID, _SPAN_ID, _TRACE_STATE = _span_context_getters()


def _fields(spans: Sequence[ReadableSpan]) -> list[list[Any]]:
    """The values of ``_FIELDS`` across the batch, one list per field."""
    try:
        return [list(map(get, spans)) for get in _FIELD_RAW]
    except AttributeError:  # a span object that is not an SDK ReadableSpan: its public properties
        return [list(map(get, spans)) for get in _FIELD_PUBLIC]


# The raw containers, not the copies the public properties make on every call
# (ReadableSpan.__init__ sets these; a span object without them takes the public path).
_RAW = tuple(operator.attrgetter(name) for name in ("_attributes", "_events", "_links"))
_PUBLIC = tuple(operator.attrgetter(name) for name in ("attributes", "events", "links"))
_HAS_DQ = hasattr(BoundedList(1), "_dq")
_FAST_ATTRS = BoundedAttributes if hasattr(BoundedAttributes(), "_dict") else None  # its plain dict, copied in C


def _containers(spans: Sequence[ReadableSpan]) -> list[list[Any]]:
    """Each span's attributes, events and links containers, three lists across the batch."""
    try:
        return [list(map(get, spans)) for get in _RAW]
    except AttributeError:
        return [list(map(get, spans)) for get in _PUBLIC]


def _lengths(containers: list[Any]) -> list[int]:
    # BoundedList.__len__ is Python code taking a lock; its deque answers directly.
    if _HAS_DQ:
        return [len(c._dq) if c.__class__ is BoundedList else len(c) for c in containers]  # type: ignore[attr-defined]
    return list(map(len, containers))


def _sdk_attrs(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    # Tuples need no conversion: JSON encodes them as arrays, like OTLP arrays.
    if not attributes:
        return {}
    # The SDK's BoundedAttributes keeps a plain dict: copying it skips a Python-level walk of the mapping.
    inner = getattr(attributes, "_dict", None)
    return dict(inner) if isinstance(inner, dict) else dict(attributes)


def _per_object(objects: list[Any], convert: Any) -> list[Any]:
    """``convert(o)`` for each object, computed once per distinct object (resources and scopes repeat)."""
    seen: dict[int, Any] = {}
    for obj in objects:
        if id(obj) not in seen:
            seen[id(obj)] = convert(obj)
    if len(seen) == 1:
        return [next(iter(seen.values()))] * len(objects)
    return [seen[id(obj)] for obj in objects]


def _scope(scope: Any) -> tuple[str | None, str | None]:
    return (scope.name or None, scope.version or None) if scope is not None else (None, None)


def spans_to_table(spans: Sequence[ReadableSpan], rejected: list[str] | None = None) -> pa.Table:
    """Convert SDK spans to rows (the same rows OTLP-encoding them would give).

    Each field is pulled across the whole batch at once and handed to the
    :class:`RowBuilder` as a list. A span that cannot be stored (see
    :func:`span_time_error`) is noted in ``rejected`` and left out; without
    ``rejected`` it raises ``PayloadError``.
    """
    builder = RowBuilder(rejected)
    if not spans:
        return builder.table()
    contexts, parents, names, kinds, resource_objs, scope_objs, statuses, starts, ends = _fields(spans)
    resources = _per_object(resource_objs, lambda res: _resource(res.attributes))
    scopes = _per_object(scope_objs, _scope)
    attrs, events, links = _containers(spans)
    columns: dict[str, list[Any]] = {
        "trace_id": list(map(format, map(_TRACE_ID, contexts), itertools.repeat("032x"))),
        "span_id": list(map(format, map(_SPAN_ID, contexts), itertools.repeat("016x"))),
        "parent_span_id": [None if p is None else format(_SPAN_ID(p), "016x") for p in parents],
        "trace_state": [(t.to_header() or None) if t else None for t in map(_TRACE_STATE, contexts)],
        "name": names,
        "kind": [k._name_ for k in kinds],  # Enum.name is a Python-level property
        "service_name": [r[0] for r in resources],
        "resource_attributes": [r[1] for r in resources],
        "scope_name": [s[0] for s in scopes],
        "scope_version": [s[1] for s in scopes],
        "start": [t or 0 for t in starts],
        "end": [t or 0 for t in ends],
        "status_code": [s.status_code._name_ for s in statuses],
        "status_message": [s.description or None for s in statuses],
        "attributes": [dict(a._dict) if a.__class__ is _FAST_ATTRS else _sdk_attrs(a) for a in attrs],
        "dropped_attributes": [a.dropped if isinstance(a, BoundedAttributes) else 0 for a in attrs],
        "dropped_events": [e.dropped if isinstance(e, BoundedList) else 0 for e in events],
        "dropped_links": [k.dropped if isinstance(k, BoundedList) else 0 for k in links],
        "event_count": _lengths(events),
        "link_count": _lengths(links),
    }
    flat_events = [ev for evs in events for ev in evs] if any(columns["event_count"]) else []
    flat_links = [link for ls in links for link in ls] if any(columns["link_count"]) else []
    builder.extend(
        columns,
        {
            "time": [ev.timestamp for ev in flat_events],
            "name": [ev.name for ev in flat_events],
            "attributes": [_dumps(_sdk_attrs(ev.attributes)) for ev in flat_events],
        },
        {
            "trace_id": [f"{link.context.trace_id:032x}" for link in flat_links],
            "span_id": [f"{link.context.span_id:016x}" for link in flat_links],
            "trace_state": [
                (link.context.trace_state.to_header() or None) if link.context.trace_state else None
                for link in flat_links
            ],
            "attributes": [_dumps(_sdk_attrs(link.attributes)) for link in flat_links],
        },
    )
    return builder.table()
