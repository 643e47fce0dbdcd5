"""The :class:`Store`: an open dataset, read through DuckDB views over its Parquet files.

The facade over the read side's rooms: which files are live
(:mod:`~otel_replay.query.files`), the DuckDB engine that runs the shipped
``queries/*.sql`` and analyst SQL (:mod:`~otel_replay.query.engine`), trusted
record reads (:mod:`~otel_replay.query.stored`) and verification
(:mod:`~otel_replay.query.verify`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from otel_replay.capture.log_recovery import recover
from otel_replay.errors import CorruptFileError, DatasetError, RecordNotFound
from otel_replay.integrity import SealCheck, StoredRecord, VerifyReport, load_signing_key
from otel_replay.location import resolve
from otel_replay.query import stored
from otel_replay.query.engine import Engine, Params
from otel_replay.query.trust import TrustedRecord
from otel_replay.query.verify import Keys, verify
from otel_replay.records import Action, DecisionRecord, SpanRef

__all__ = ["Store", "open_store"]

_log = logging.getLogger(__name__)


class Store:
    """An open dataset: DuckDB views over its Parquet files.

    Args:
        dataset: the dataset directory (the one holding ``spans/``), or an
            ``s3://bucket/prefix`` URI (see :mod:`otel_replay.location`).
        skip_corrupt: leave unreadable Parquet files out (listed in
            :attr:`skipped`) instead of raising :class:`CorruptFileError`.
        database: a DuckDB database path, default in-memory.
        keys: verification keys for records that drive replay and the gate
            (default: the signing key from the environment or key file, never created).
        require_signed: records must carry a valid signature from one of
            ``keys`` (default). ``False`` accepts a record signed with an
            unknown key on its hash alone; unsealed and edited rows are never accepted.

    Files written after opening are seen after :meth:`refresh`. Rows are
    trusted per :mod:`otel_replay.query.trust`: :meth:`record`,
    :meth:`verified_outcomes` and the gate's reads
    (:mod:`otel_replay.gate.reads`) use only rows that pass the seal check;
    the SQL views show every stored row. :meth:`query` and :meth:`rows` run
    analyst SQL read-only: they can read the dataset's files and nothing else
    (:mod:`otel_replay.query.analyst`).

    """

    def __init__(
        self,
        dataset: str | os.PathLike[str],
        *,
        skip_corrupt: bool = False,
        database: str = ":memory:",
        keys: Keys = None,
        require_signed: bool = True,
    ) -> None:
        """Open ``dataset``; see the class docstring."""
        self.location = resolve(dataset)
        self.dataset: Path | str = self.location.native(self.location.root)
        self._keys = keys
        self.require_signed = require_signed
        self._seal_check: SealCheck | None = None
        if isinstance(self.dataset, Path) and self.dataset.exists() and not self.dataset.is_dir():
            raise DatasetError(f"dataset {self.dataset} is a file, not a directory")
        self.location.check()
        self.skip_corrupt = skip_corrupt
        self.engine = Engine(self.location, self.dataset, skip_corrupt=skip_corrupt, database=database)
        """The DuckDB connections and the shipped queries (:class:`~otel_replay.query.engine.Engine`)."""
        _recover_logs(self.location.root)
        self.refresh()

    @property
    def files(self) -> list[str]:
        """The live, readable Parquet files the views read (as of the last :meth:`refresh`)."""
        return self.engine.files

    @property
    def skipped(self) -> list[CorruptFileError]:
        """The files left out as corrupt (``skip_corrupt``)."""
        return self.engine.skipped

    def refresh(self) -> None:
        """Rescan the dataset's files, validate new ones, and (re)define the views.

        A file that vanishes between the listing and the check or the binding
        (retention dropped its partition, a compaction's grace period ended)
        is simply not live, and the listing that named it is stale (it may miss
        what replaced the file): the dataset is listed again, up to five times.
        """
        self.engine.refresh()

    # --- SQL ------------------------------------------------------------------
    def query(self, sql: str, params: Params = None) -> pa.Table:
        """Run analyst ``sql`` read-only on the dataset's views; returns an Arrow table.

        Parameters are bound, never interpolated. Every statement must be a
        query (see :mod:`otel_replay.query.analyst`); with several, the last one's
        result is returned.

        Raises:
            ReadOnlyViolation: a statement would write, attach, configure, or
                read a file that is not one of the dataset's.
            CorruptFileError: a dataset file is damaged (names it), unless
                the store skips corrupt files.
            QueryError: DuckDB refused or failed the query.

        """
        return self.engine.query(sql, params)

    def rows(self, sql: str, params: Params = None) -> list[dict[str, Any]]:
        """Like :meth:`query`, as a list of dicts (a repeated column name gets ``_2``, ``_3``)."""
        return self.engine.rows(sql, params)

    def run(self, name: str, **variables: Any) -> list[dict[str, Any]]:
        """Run ``queries/<name>.sql`` with DuckDB variables set (``SET VARIABLE``).

        Every variable the file reads and the call does not give is set to
        NULL first: a variable persists on the connection, and a value left by
        an earlier call must never leak into this one. ``calibration`` and
        ``decision_summary`` read compaction's facts files, as :meth:`calibration` does.
        """
        return self.engine.run(name, **variables)

    def run_for(self, name: str, ids: Mapping[str, str | None], **variables: Any) -> list[dict[str, Any]]:
        """Like :meth:`run`, reading only the files that may hold rows carrying one of ``ids``.

        ``ids`` maps an indexed column (``correlation_id``, ``trace_id``,
        ``session_id``, ``record_id``) to a value; the dataset's side index
        (written by ``otel-replay compact``) names the compacted files holding
        it, and every file written since the index is read too. Without an
        index (or with no id that is not ``None``) every file is read. For a
        query that joins outcomes (the chains, ``traces``), an outcome may be
        stored under any correlation id and in any file: the side index also
        maps each decision id to the files holding its outcomes, and the
        query runs again with those files when one was not read; a dataset
        holding storage schema version 1 files (outcome decision ids only in
        the JSON) is read whole for such a query. The rows are
        those of :meth:`run` (see :meth:`Engine.run_for
        <otel_replay.query.engine.Engine.run_for>` for the planning).
        """
        return self.engine.run_for(name, ids, **variables)

    def calibration(self, decision_type: str | None = None) -> list[dict[str, Any]]:
        """Confidence buckets against outcome correctness (``queries/calibration.sql``).

        Reads compaction's facts files for the partitions they cover and the
        spans for everything else (:mod:`otel_replay.storage.facts`): the same
        rows as joining the ``decisions`` and ``outcomes`` views.
        """
        return self.engine.run_with_facts("calibration", decision_type=decision_type)

    def decision_summary(self, decision_type: str | None = None) -> list[dict[str, Any]]:
        """A scan of every decision: per type, count, count with a confidence, mean confidence.

        ``queries/decision_summary.sql``; the same figures as grouping the
        ``decisions`` view, read like :meth:`calibration`.
        """
        return self.engine.run_with_facts("decision_summary", decision_type=decision_type)

    # --- records: only rows that pass the seal check act ----------------------
    @property
    def seal_check(self) -> SealCheck:
        """The rule rows must pass to drive replay and the gate (built on first use)."""
        if self._seal_check is None:
            keys = self._keys if self._keys is not None else load_signing_key(create=False)
            self._seal_check = SealCheck(keys, require_signed=self.require_signed)
        return self._seal_check

    def record_rows(self, **filters: Any) -> list[StoredRecord]:
        """Every stored row of ``queries/record.sql`` matching ``filters``, untrusted (:func:`.stored.record_rows`)."""
        return stored.record_rows(self.engine, **filters)

    def trusted_record(self, record_id: str, *, what: str = "record") -> TrustedRecord:
        """The one verified row of ``record_id`` (:func:`otel_replay.query.stored.trusted_record`)."""
        return stored.trusted_record(self.engine, self.seal_check, record_id, what=what)

    def record(self, record_id: str) -> DecisionRecord:
        """Rehydrate the decision record ``record_id`` from its verified row."""
        return stored.record(self.engine, self.seal_check, record_id)

    def decision_span(self, decision_id: str) -> SpanRef | None:
        """Where the verified decision ``decision_id`` is stored, or ``None`` when nothing claims it."""
        try:
            return self.record(decision_id).span
        except RecordNotFound:
            return None

    def verified_outcomes(self, decision_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The verified outcome of each decision that has one (:func:`otel_replay.query.stored.verified_outcomes`)."""
        return stored.verified_outcomes(self.engine, self.seal_check, decision_ids)

    def has_outcome(self, decision_id: str) -> bool:
        """Whether a verified outcome for ``decision_id`` is stored."""
        return decision_id in self.verified_outcomes([decision_id])

    def intent_decisions(self, correlation_id: str) -> list[DecisionRecord]:
        """The decisions of ``correlation_id`` as their verified commit intents sealed them, oldest first."""
        return stored.intent_decisions(self.engine, self.seal_check, correlation_id)

    def unknown_commits_for(self, decision_id: str) -> list[tuple[str, Action]]:
        """The commit intents of ``decision_id`` no commit record answers: executed? unknown - check the rail.

        Each as (intent gate record id, action). The gate seals an intent
        durably before it calls the rail and a ``committed`` or
        ``commit_failed`` record naming it after the rail answered: an intent
        alone means the process died inside the rail (or before its record
        was stored), so whether the action happened is known to the rail only.
        """
        return self.unknown_commits_of([decision_id]).get(decision_id, [])

    def unknown_commits_of(self, decision_ids: Sequence[str]) -> dict[str, list[tuple[str, Action]]]:
        """:meth:`unknown_commits_for` of several decisions in one read: decision id -> its unanswered intents."""
        return stored.unknown_commits_of(self.engine, self.seal_check, decision_ids)

    def traces(
        self, *, correlation_id: str | None = None, session_id: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Decisions by correlation and/or session id (``None`` matches any), oldest first, at most ``limit``.

        Each is a dict with the ``decisions`` view's fields plus its verified
        outcome (``outcome_id``, ``outcome_correct``, ``outcome_note``; empty
        when no key can verify it): what ``DecisionTracer(store=...).query_traces`` returns.
        """
        return stored.traces(
            self.engine, self.verified_outcomes, correlation_id=correlation_id, session_id=session_id, limit=limit
        )

    def audit_entries(self, correlation_id: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Audit entries (all, or for one correlation id) in the order they were recorded."""
        return stored.audit_entries(self.engine, correlation_id, limit)

    def causal_tree(self, record_id: str) -> list[dict[str, Any]]:
        """The decision span of ``record_id`` and every span below it, depth-first (:func:`.stored.causal_tree`)."""
        return stored.causal_tree(self.engine, self.seal_check, record_id)

    def verify(self, keys: Keys) -> VerifyReport:
        """Check every record span's seal: hash, signature (with ``keys``) and chain links.

        Files left out as corrupt (``skip_corrupt``) are listed in
        :attr:`VerifyReport.unreadable_files`, and the report is then not ok:
        what could not be read was not checked.
        """
        return verify(self.engine, keys)

    def close(self) -> None:
        """Close the DuckDB connections."""
        self.engine.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _recover_logs(dataset: str) -> None:
    """Convert capture write-ahead logs a crashed process left on ``dataset`` (best effort: a reader may not write).

    Their records were acknowledged durable (a gate's intent and commit
    records): a reader must see them, not only the next ``configure()``.
    """
    try:
        recover(dataset)  # nothing to do (and no file opened) without logs or outcomes held by a process
    except Exception as exc:  # noqa: BLE001 - the logs stay on disk for the next configure() to convert
        _log.warning("otel-replay: could not convert the write-ahead logs left in %s: %s", dataset, exc)


def open_store(
    dataset: str | os.PathLike[str], *, skip_corrupt: bool = False, keys: Keys = None, require_signed: bool = True
) -> Store:
    """Open ``dataset`` for querying (``otel_replay.open``); see :class:`Store` for the arguments."""
    return Store(dataset, skip_corrupt=skip_corrupt, keys=keys, require_signed=require_signed)
