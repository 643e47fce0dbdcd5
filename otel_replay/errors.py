"""The exception tree. Every error otel-replay raises on purpose is one of these.

::

    OtelReplayError
    ├── CaptureError            bad input at capture time (state not JSON, act twice)
    ├── OutcomeAlreadyRecorded  a second outcome for one decision (immutability)
    ├── ReplayUndecidable       raised by a policy; replay turns it into HUMAN_REVIEW
    ├── RecordNotFound          unknown record or chain id
    ├── DatasetError            the dataset on disk cannot be used
    │   └── CorruptFileError    one Parquet file is unreadable (names the file)
    ├── QueryError              DuckDB refused a query (cause kept)
    ├── IntegrityError          a signature or hash chain does not verify
    ├── PolicyLoadError         ``module:function`` could not be imported
    ├── PolicyError             a policy raised, or returned something other than (bool, str)
    └── ConfigError             a setting or environment variable is invalid

Foreign exceptions (DuckDB, pyarrow, json) are converted at the storage and
capture boundaries with ``raise ... from exc`` so the cause is kept.
"""

from __future__ import annotations

__all__ = [
    "CaptureError",
    "ConfigError",
    "CorruptFileError",
    "DatasetError",
    "IntegrityError",
    "OtelReplayError",
    "OutcomeAlreadyRecorded",
    "PolicyError",
    "PolicyLoadError",
    "QueryError",
    "RecordNotFound",
    "ReplayUndecidable",
]


class OtelReplayError(Exception):
    """Base class of every error otel-replay raises deliberately."""


class CaptureError(OtelReplayError, ValueError):
    """The data handed to a capture API cannot be recorded as given."""


class OutcomeAlreadyRecorded(OtelReplayError):
    """An outcome was already recorded for this decision; outcomes are immutable."""


class ReplayUndecidable(OtelReplayError):
    """Raised by a policy that cannot decide; replay routes it to HUMAN_REVIEW."""


class RecordNotFound(OtelReplayError, LookupError):
    """No record, decision or chain with the given id exists in the dataset."""


class DatasetError(OtelReplayError):
    """The dataset directory cannot be read or written as a dataset."""


class CorruptFileError(DatasetError):
    """A Parquet file in the dataset is truncated or unreadable."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(
            f"corrupt Parquet file {path}: {reason} "
            "(move it aside, or open the dataset with skip_corrupt=True / --skip-corrupt)"
        )
        self.path = path
        self.reason = reason


class QueryError(OtelReplayError):
    """DuckDB rejected or failed a query."""


class IntegrityError(OtelReplayError):
    """A record's hash, signature or chain link does not verify."""


class PolicyLoadError(OtelReplayError):
    """A ``module:function`` reference could not be resolved."""


class PolicyError(OtelReplayError, TypeError):
    """A policy raised an exception, or returned something other than ``(justified, reason)``."""


class ConfigError(OtelReplayError, ValueError):
    """A setting, keyword argument or ``OTEL_REPLAY_*`` variable is invalid."""
