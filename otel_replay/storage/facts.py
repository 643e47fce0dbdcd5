"""Decision and outcome facts: a narrow sidecar per compacted partition, for calibration and decision scans.

``calibration`` and a scan of ``decisions`` need five small columns of
decision and outcome spans, but reading them from the spans means reading
and parsing each row's ``attributes`` JSON (the duplicate-key check) and
deduplicating by ``(trace_id, span_id)`` over every decision. Compaction
therefore writes, beside each partition's compacted files, one
``_facts-g<gen>-<token>.pq`` file (Parquet; ``.pq`` so that the reader rule
never takes it for spans) holding exactly what the views would compute for
those files (``decision_facts_in`` / ``outcome_facts_in`` in
``queries/views.sql``, run by DuckDB over the very rows compacted).

The facts file covers the compacted files it lists in its footer
(``otel_replay.facts.files``: name and size of each). A reader
(:func:`plan`) uses a facts file only when that list is exactly the
compacted files it is reading for the partition, sizes included, and every
other file (arrivals since compaction, partitions never compacted, a facts
file missing, damaged or stale) is read from the spans: results are complete
and the same at every moment.

Deduplication stays exact without hashing every decision at query time. Each
decision row carries ``key`` (the hex value of its span id's first 16
characters, ``fact_key``), ``shared`` (the key is also in the facts file of
another partition that was current when this one was written, listed in
``otel_replay.facts.checked``) and ``repeated`` (``shared``, a NULL key, or a
key met twice in this file). At query time only repeated rows, and rows whose
key is shared anywhere or met among rows read from the spans, go through the
``DISTINCT ON (trace_id, span_id)``. Outcomes are keyed and flagged the same
way by their decision id: only outcomes whose decision may have another one
are ranked. Decisions join outcomes on ``id_hi``/``id_lo``/``id_text``, a
numeric form of the decision id that matches exactly when the ids are equal.
If two facts files in use were written without seeing each other (two
compactors at once), :func:`plan` says so and the Store reads the spans.

On an object store (``s3://``) :mod:`compact_s3` uploads the same file
(:func:`remote_facts_bytes`) under its final name before the manifest swap:
its generation and token tie it to compacted files no reader uses before the
swap. :func:`plan` then reads footers through the dataset's process cache and
takes sizes from the listing.

Trust: the ambiguity check is ours: it runs on the real ``attributes`` JSON
during compaction, never on a column a writer supplied. A facts file is data
in the dataset like the compacted files beside it: whoever can write the
dataset can forge either, and a forged facts file with a matching footer would
change calibration figures (never what replay, the gate or compensation do:
those act only on sealed, verified records). Stale or mismatched files,
wrong schemas and unreadable footers are ignored (logged) and the spans read
instead. Flags are written non-NULL; a forged file with a NULL ``repeated``
or ``key`` loses that row from the figures, like any other forged content.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from otel_replay import _duck as duck
from otel_replay.errors import DatasetError, message_line
from otel_replay.exporters.schema import SPANS_DIR
from otel_replay.location import Location, register_with

from .backend import backend_for, local_size
from .manifest import read_manifest, remote_partitions

__all__ = [
    "FACTS_SCHEMA",
    "CurrentFacts",
    "FactsExtractor",
    "FactsPlan",
    "extract_facts",
    "facts_name",
    "facts_of_index",
    "is_facts_name",
    "remote_facts_bytes",
    "plan",
    "point_facts",
    "unpoint_facts",
    "write_facts",
]

_log = logging.getLogger("otel_replay")

FORMAT = "2"
META_FORMAT = b"otel_replay.facts.format"
META_FILES = b"otel_replay.facts.files"
META_CHECKED = b"otel_replay.facts.checked"

FACTS_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("key", pa.uint64()),
        ("repeated", pa.bool_()),
        ("shared", pa.bool_()),
        ("trace_id", pa.string()),
        ("span_id", pa.string()),
        ("record_id", pa.string()),
        ("id_hi", pa.uint64()),
        ("id_lo", pa.uint64()),
        ("id_text", pa.string()),
        ("decision_type", pa.string()),
        ("confidence", pa.float64()),
        ("decision_id", pa.string()),
        ("outcome_correct", pa.bool_()),
        ("recorded_at", pa.timestamp("ns", tz="UTC")),
    ]
)
"""Columns of a facts file (README, "Facts files", says what each means)."""

_SLICE_ROWS = 262_144  # rows handed to DuckDB at a time: bounds the memory extraction adds to a batch
_NAME = re.compile(r"_facts-g(\d+)-([0-9a-f]{12})\.pq")
_COMPACTED = re.compile(r"compact-g(\d+)-\d+-([0-9a-f]{12})\.parquet")
_INDEX = re.compile(r"_index-g(\d+)-([0-9a-f]{12})\.pq")
_INPUT_COLUMNS = {
    "trace_id": pa.string(),
    "span_id": pa.string(),
    "record_id": pa.string(),
    "replay_kind": pa.string(),
    "decision_type": pa.string(),
    "attributes": pa.string(),
    "start_time": pa.timestamp("ns", tz="UTC"),
    "outcome_decision_id": pa.string(),
    "outcome_correct": pa.bool_(),
    "decision_confidence": pa.float64(),
}


def facts_name(generation: int, token: str) -> str:
    """The facts file of compaction generation ``generation`` with file token ``token``."""
    return f"_facts-g{generation}-{token}.pq"


def is_facts_name(name: str) -> bool:
    """Whether ``name`` is a facts file name (``_facts-g<gen>-<token>.pq``)."""
    return _NAME.fullmatch(name) is not None


def facts_of_index(index_name: str | None) -> str | None:
    """The facts file written with side index ``index_name`` (same generation and token), if any."""
    found = _INDEX.fullmatch(index_name or "")
    return facts_name(int(found.group(1)), found.group(2)) if found else None


def _sql(name: str) -> str:
    return resources.files("otel_replay.queries").joinpath(f"{name}.sql").read_text(encoding="utf-8")


def _input(table: pa.Table) -> pa.Table:
    """``table`` with every column the facts read (a version 1 file lacks the typed ones: NULL, as views read them)."""
    for name, kind in _INPUT_COLUMNS.items():
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, kind))
    return table


def extract_facts(table: pa.Table, spill: Path | None = None) -> pa.Table | Path | None:
    """The facts rows of ``table`` (spans as compaction read them), ``repeated`` not yet set.

    With ``spill`` (a ``._facts-….tmp`` path in the partition) the rows are
    written there and the path returned, so a compaction holds no facts in
    memory between batches (:func:`write_facts` reads and deletes it).

    Runs ``queries/facts_extract.sql`` with the views' own macros over the
    rows, through the same type normalization as ``queries/source.sql``.
    ``None`` (logged) when DuckDB cannot evaluate the rows, e.g. a file of a
    foreign schema: the partition then gets no facts file and readers compute
    its facts from the spans; compaction itself goes on. A run of many
    batches uses a :class:`FactsExtractor` (one connection) instead.
    """
    extractor = FactsExtractor()
    try:
        return extractor.extract(table, spill)
    finally:
        extractor.close()


class FactsExtractor:
    """:func:`extract_facts` for every batch of a compaction through one DuckDB connection, its views defined once.

    A connection and the views' DDL cost about 0.1 s of CPU; a run with many
    batches paid that per batch. Batches are extracted one at a time (on any
    one thread at a time). The views are bound to the input's columns, so a
    batch of another schema (another schema group) gets a new connection, as
    does the batch after a DuckDB error.
    """

    def __init__(self) -> None:
        """No connection yet: the first :meth:`extract` opens it."""
        self._con: duckdb.DuckDBPyConnection | None = None
        self._schema: pa.Schema | None = None
        self._lock = threading.Lock()

    def _connection(self, first: pa.Table) -> duckdb.DuckDBPyConnection:
        if self._schema is not None and not first.schema.equals(self._schema):
            self._drop()
        if self._con is None:
            con = duck.connect()
            try:
                con.execute("SET TimeZone = 'UTC'")
                # one DuckDB thread: compaction extracts facts on a worker beside others writing files (threads=...)
                con.execute("SET threads = 1")
                con.register("otel_replay_facts_input", first)  # the views bind over the input's columns
                con.execute(_sql("facts_input"))
                con.execute(_sql("views"))
                con.unregister("otel_replay_facts_input")
            except BaseException:
                con.close()
                raise
            self._con, self._schema = con, first.schema
        return self._con

    def extract(self, table: pa.Table, spill: Path | None = None) -> pa.Table | Path | None:
        """:func:`extract_facts` of ``table`` on this extractor's connection."""
        with self._lock:
            whole = _input(table)
            try:
                con = self._connection(whole.slice(0, 0))
                parts: list[pa.Table] = []
                for start in range(0, max(1, whole.num_rows), _SLICE_ROWS):
                    con.register("otel_replay_facts_input", whole.slice(start, _SLICE_ROWS))
                    try:
                        parts.append(duck.arrow(con.execute(_sql("facts_extract"))).cast(FACTS_SCHEMA))
                    finally:
                        con.unregister("otel_replay_facts_input")
                facts = pa.concat_tables(parts)
                if spill is not None:
                    pq.write_table(facts, spill, compression="lz4")
                    return spill
            except duckdb.Error as exc:
                self._drop()
                _log.warning("otel-replay: no facts file for these rows: %s", str(exc).splitlines()[0])
                return None
            return facts

    def _drop(self) -> None:
        if self._con is not None:
            self._con.close()
        self._con, self._schema = None, None

    def close(self) -> None:
        """Close the connection (extracting again opens a new one)."""
        with self._lock:
            self._drop()


class CurrentFacts:
    """The dataset's current facts files per partition, found once per compaction run.

    Each partition's facts are checked against the other partitions' current
    ones (:func:`_other_keys`). Finding those reads every partition's manifest
    (on an object store: a listing of the whole dataset and a GET per
    manifest), so a run that compacts P partitions would do it P times;
    instead it is done on first use and the run records each facts file it
    makes current (:meth:`made_current`). A partition another compactor swaps
    meanwhile keeps its older entry here: the pair is then unchecked in the
    new footer, and readers read the spans for it, exactly as when that other
    compaction had come just after this one.
    """

    def __init__(self, root: Path | Location) -> None:
        """Facts of the local dataset directory ``root`` or of the remote dataset ``root``."""
        self._root = root
        self._found: dict[str, tuple[str, str]] | None = None

    def others(self, partition: str) -> list[tuple[str, str]]:
        """The usable current facts of every partition but ``partition`` (``date=…``): (``date=…/name``, path)."""
        if self._found is None:
            root = self._root
            self._found = _local_facts(root) if isinstance(root, Path) else _remote_facts(root)
        return [found for head, found in sorted(self._found.items()) if head != partition]

    def made_current(self, partition: str, name: str | None) -> None:
        """Record that ``partition``'s manifest now names facts file ``name`` (``None``: it has none)."""
        if self._found is None:
            return  # not looked up yet: the first lookup will see the manifest as it is now
        if name is None:
            self._found.pop(partition, None)
        elif isinstance(self._root, Path):
            self._found[partition] = (f"{partition}/{name}", str(self._root / SPANS_DIR / partition / name))
        else:
            self._found[partition] = (f"{partition}/{name}", self._root.join(SPANS_DIR, partition, name))


def _local_facts(root: Path) -> dict[str, tuple[str, str]]:
    """The current facts files of local dataset ``root`` whose footer reads, by partition."""
    found: dict[str, tuple[str, str]] = {}
    spans = root / SPANS_DIR
    for other in sorted(spans.iterdir()) if spans.is_dir() else []:
        if not other.is_dir() or not other.name.startswith("date="):
            continue
        try:
            manifest = read_manifest(other)
        except DatasetError:
            continue
        name = facts_of_index(manifest.index if manifest else None)
        if name is None or isinstance(_footer(str(other / name)), str):
            continue  # missing or unusable: a reader will not use it either (plan() checks it again)
        found[other.name] = (f"{other.name}/{name}", str(other / name))
    return found


def _remote_facts(location: Location) -> dict[str, tuple[str, str]]:
    """:func:`_local_facts` on an object store: the manifests read before the listing, as readers do."""
    found: dict[str, tuple[str, str]] = {}
    partitions, _ = remote_partitions(location, missing=[])  # a missing span file is the readers' concern, not here
    for head, manifest, names in partitions:
        name = facts_of_index(manifest.index if manifest else None)
        if name is None or name not in names:
            continue
        path = location.join(SPANS_DIR, head, name)
        if isinstance(_footer(path, location), str):
            continue  # missing or unusable: a reader will not use it either (plan() checks it again)
        found[head] = (f"{head}/{name}", path)
    return found


def _other_keys(
    others: Sequence[tuple[str, str]], facts: pa.Table, location: Location | None = None
) -> tuple[list[str], dict[str, pa.Array]]:
    """Names of the other partitions' current facts files, and per kind the keys of ``facts`` they also hold.

    DuckDB streams the other files' ``kind`` and ``key`` columns against a hash
    table of this partition's keys, so memory is bounded by this partition,
    not by the dataset. When they cannot be read, no file is listed as
    checked: readers then see an unchecked pair and read the spans.
    """
    none = {kind: pa.array([], pa.uint64()) for kind in ("decision", "outcome")}
    if not others:
        return [], none
    con = duck.connect()
    try:
        if location is not None:
            register_with(con, location)  # s3:// through the pyarrow filesystem, as the Store reads
        con.register("otel_replay_mine", facts.select(["kind", "key"]))
        result = con.execute(
            "SELECT DISTINCT o.kind, o.key FROM read_parquet(?) AS o "
            "SEMI JOIN otel_replay_mine AS m ON m.kind = o.kind AND m.key = o.key",
            [duck.literal_paths([path for _, path in others])],  # each file as itself, never as a DuckDB glob
        )
        shared = duck.arrow(result)
    except (duckdb.Error, DatasetError) as exc:
        _log.warning(
            "otel-replay: other partitions' facts not readable (%s); facts flagged unchecked", message_line(exc)
        )
        return [], none
    finally:
        con.close()
    keys = {
        kind: shared.filter(pc.equal(shared.column("kind"), kind)).column("key").combine_chunks().cast(pa.uint64())
        for kind in none
    }
    return [name for name, _ in others], keys


def _flagged(rows: pa.Table, elsewhere: pa.Array) -> pa.Table:
    """``rows`` (one kind) with ``shared`` (key in ``elsewhere``) and ``repeated`` (shared, NULL, or met twice) set."""
    keys = rows.column("key")
    counts = pa.table({"key": keys}).group_by("key").aggregate([([], "count_all")])
    twice = counts.filter(pc.greater(counts.column("count_all"), 1)).column("key").combine_chunks()
    shared = pc.fill_null(pc.is_in(keys, value_set=elsewhere), False)
    again = pc.fill_null(pc.is_in(keys, value_set=twice.cast(pa.uint64())), False)
    repeated = pc.or_(pc.or_(pc.is_null(keys), again), shared)
    rows = rows.set_column(rows.schema.get_field_index("repeated"), "repeated", repeated)
    return rows.set_column(rows.schema.get_field_index("shared"), "shared", shared)


def _flag_repeated(facts: pa.Table, elsewhere: Mapping[str, pa.Array]) -> pa.Table:
    """``facts`` with every row's ``repeated`` and ``shared`` set, per kind (see the module docstring)."""
    parts = [
        _flagged(facts.filter(pc.fill_null(pc.equal(facts.column("kind"), kind), False)), keys)
        for kind, keys in elsewhere.items()
    ]
    return pa.concat_tables(parts)


def _collect(parts: Sequence[pa.Table | Path | None]) -> pa.Table | None:
    """``parts`` (:func:`extract_facts` results) as one table, spilled ones read and deleted; ``None``: one failed."""
    spilled = [p for p in parts if isinstance(p, Path)]
    try:
        if any(p is None for p in parts):
            return None
        tables = [pq.read_table(p, partitioning=None) if isinstance(p, Path) else p for p in parts if p is not None]
    finally:
        for path in spilled:
            path.unlink(missing_ok=True)
    return pa.concat_tables(tables) if tables else FACTS_SCHEMA.empty_table()


def _finished(
    facts: pa.Table, others: Sequence[tuple[str, str]], covered: list[list[Any]], location: Location | None = None
) -> pa.Table:
    """``facts`` flagged against ``others`` (see :func:`_other_keys`), sorted, with the footer naming ``covered``."""
    checked, elsewhere = _other_keys(others, facts, location)
    facts = _flag_repeated(facts, elsewhere)
    # flagged rows first within each kind: the exact check reads them from the first row group(s) only
    order = pc.sort_indices(facts, sort_keys=[("kind", "ascending"), ("repeated", "descending"), ("key", "ascending")])
    facts = facts.take(order)
    metadata = {
        META_FORMAT: FORMAT.encode(),
        META_FILES: json.dumps(covered).encode(),
        META_CHECKED: json.dumps(checked).encode(),
    }
    return facts.replace_schema_metadata(metadata)


def _write_to(facts: pa.Table, sink: Any) -> None:
    pq.write_table(facts, sink, compression="zstd", row_group_size=1 << 16, use_dictionary=["kind", "decision_type"])


def write_facts(
    partition: Path,
    name: str,
    parts: Sequence[pa.Table | Path | None],
    files: Sequence[str],
    others: Sequence[tuple[str, str]] | None = None,
) -> bool:
    """Write ``partition``'s facts file ``name`` (temp name, fsync, rename) covering compacted ``files``.

    ``parts`` are :func:`extract_facts` results for every batch compacted;
    when one is ``None`` nothing is written (``False``). Decision rows are
    flagged ``repeated`` against this partition's own rows and the current
    facts of every other partition (``others``, see :meth:`CurrentFacts.others`;
    found now when not given; recorded as checked).
    """
    facts = _collect(parts)
    if facts is None:
        return False
    covered = [[file, (partition / file).stat().st_size] for file in files]
    if others is None:
        others = CurrentFacts(partition.parent.parent).others(partition.name)
    facts = _finished(facts, others, covered)
    tmp = partition / f".{name}.tmp"
    with open(tmp, "wb") as handle:
        _write_to(facts, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, partition / name)
    return True


def remote_facts_bytes(
    location: Location,
    partition: str,
    parts: Sequence[pa.Table | Path | None],
    files: Sequence[tuple[str, int]],
    others: Sequence[tuple[str, str]] | None = None,
) -> bytes | None:
    """The facts file of remote ``partition`` (``date=…``) covering compacted ``files`` (name, size), as bytes.

    What :func:`write_facts` writes on disk, for :mod:`compact_s3` to upload
    under its final name before the manifest swap (an object PUT is atomic;
    the file's generation and token tie it to the files it covers). The
    other partitions' current facts are ``others`` (:meth:`CurrentFacts.others`; found now when not given).
    ``None`` when an extraction failed (no facts file for this partition).
    """
    facts = _collect(parts)
    if facts is None:
        return None
    if others is None:
        others = CurrentFacts(location).others(partition)
    facts = _finished(facts, others, [list(f) for f in files], location)
    sink = pa.BufferOutputStream()
    _write_to(facts, sink)
    return bytes(sink.getvalue().to_pybytes())


@dataclass
class FactsPlan:
    """What a query reads from facts files: the files, the span files they cover, and whether every pair was checked."""

    fact_files: list[str] = field(default_factory=list)
    covered: list[str] = field(default_factory=list)
    unchecked: list[tuple[str, str]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


def _footer(path: str, location: Location | None = None) -> tuple[list[tuple[str, int]], list[str]] | str:
    """(covered files with sizes, checked names) from a facts file's footer, or why it cannot be used.

    ``location``: the remote dataset ``path`` (an ``s3://`` URL) is in, read
    through its process cache (a facts object is written once under its name).
    """
    try:
        meta = pq.read_metadata(backend_for(location).source(path) if location is not None else path)
    except FileNotFoundError:
        return "missing"
    except (OSError, pa.ArrowException, DatasetError) as exc:
        return f"unreadable ({message_line(exc)})"
    kv = meta.metadata or {}
    if kv.get(META_FORMAT) != FORMAT.encode():
        return f"unknown facts format {kv.get(META_FORMAT)!r}"
    try:
        if not meta.schema.to_arrow_schema().remove_metadata().equals(FACTS_SCHEMA):
            return "not the facts schema"
    except (pa.ArrowException, ValueError) as exc:  # a schema pyarrow cannot map to Arrow types
        return f"unreadable schema ({message_line(exc)})"
    try:
        covered = json.loads(kv.get(META_FILES, b""))
        checked = json.loads(kv.get(META_CHECKED, b""))
        files = [(str(name), int(size)) for name, size in covered]
        names = [str(n) for n in checked]
    except (ValueError, TypeError, RecursionError) as exc:  # RecursionError: a deeply nested footer
        return f"bad footer ({type(exc).__name__}: {str(exc)[:200]})"
    return files, names


def plan(files: Sequence[str], sizes: Mapping[str, int] | None = None, location: Location | None = None) -> FactsPlan:
    """The facts files usable for span ``files``, and the files they cover.

    A partition's compacted files in ``files`` (one generation, one token)
    are covered by ``_facts-g<gen>-<token>.pq`` beside them when its footer
    lists exactly those files with the sizes in ``sizes`` (or on disk, or in
    the listing of ``location`` when ``files`` are its ``s3://`` URLs).
    Anything else is left to be read from the spans.
    """
    result = FactsPlan()
    groups: dict[tuple[str, int, str], list[str]] = {}
    for path in files:
        head, _, name = path.rpartition("/")
        found = _COMPACTED.fullmatch(name)
        if found:
            groups.setdefault((head, int(found.group(1)), found.group(2)), []).append(path)
    seen: dict[str, list[str]] = {}
    for (head, generation, token), paths in groups.items():
        name = facts_name(generation, token)
        path = f"{head}/{name}"
        footer = _footer(path, location)
        if isinstance(footer, str):
            if footer != "missing":
                _log.warning("otel-replay: facts file %s not used: %s", path, footer)
            result.ignored.append(path)
            continue
        covered, checked = footer
        actual = {}
        for p in paths:
            size = sizes.get(p) if sizes else None
            if size is None:
                stored = backend_for(location).size(p) if location is not None else local_size(p)
                size = -1 if stored is None else stored
            actual[p.rpartition("/")[2]] = size
        if dict(covered) != actual or len(covered) != len(actual):
            _log.warning("otel-replay: facts file %s not used: it covers other files than the partition's", path)
            result.ignored.append(path)
            continue
        result.fact_files.append(path)
        result.covered.extend(paths)
        seen[f"{head.rpartition('/')[2]}/{name}"] = checked
    names = list(seen)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if b not in seen[a] and a not in seen[b]:
                result.unchecked.append((a, b))
    return result


def point_facts(
    con: duckdb.DuckDBPyConnection,
    files: Sequence[str],
    sizes: Mapping[str, int] | None = None,
    location: Location | None = None,
) -> bool:
    """Point ``span_facts`` / ``fact_covered()`` on ``con`` at the facts usable for ``files``; whether any were.

    ``con`` must have the views (``queries/views.sql``) defined over ``files``
    (and, for a remote ``location``, read its ``s3://`` URLs: ``register_with``).
    Undo with :func:`unpoint_facts`.
    """
    found = plan(files, sizes, location)
    if found.unchecked:  # written without seeing each other: their shared keys are unknown
        a, b = found.unchecked[0]
        _log.info("otel-replay: facts files %s and %s were written concurrently; reading the spans", a, b)
        return False
    if not found.fact_files:
        return False
    try:
        con.execute("SET VARIABLE otel_replay_fact_files = ?", [found.fact_files])
        con.execute("SET VARIABLE otel_replay_fact_covered = ?", [found.covered])
        con.execute(_sql("facts_source"))
    except duckdb.Error as exc:  # a facts file gone or unreadable since the plan: read the spans
        _log.warning("otel-replay: facts files not used: %s", str(exc).splitlines()[0])
        unpoint_facts(con)
        return False
    return True


def unpoint_facts(con: duckdb.DuckDBPyConnection) -> None:
    """Back to no facts files on ``con`` (every fact computed from the spans)."""
    con.execute(_sql("facts_none"))
    con.execute("SET VARIABLE otel_replay_fact_covered = NULL")
