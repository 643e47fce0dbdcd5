"""The exception tree. Every error otel-replay raises on purpose is one of these.

::

    OtelReplayError
    ├── CaptureError              bad input at capture time (state not JSON, act twice)
    │   └── RecordingError        an audit() block completed, but its record could not be sealed or kept
    ├── OutcomeAlreadyRecorded    a second outcome for one decision (immutability)
    ├── ReplayUndecidable         raised by a policy; replay turns it into HUMAN_REVIEW
    ├── RecordNotFound            unknown record or chain id
    ├── DatasetError              the dataset on disk cannot be used
    │   ├── CorruptFileError      one Parquet file is unreadable (names the file)
    │   ├── PartialWriteError     some partition files of a batch were written, then a write failed
    │   ├── LeaseLost             an object-store partition lease expired and another process took it
    │   └── WalBusyError          another receiver owns this write-ahead log directory
    ├── QueryError                DuckDB refused a query (cause kept)
    │   └── ReadOnlyViolation     analyst SQL tried to write, attach or read outside the dataset
    ├── IntegrityError            a signature, hash or chain link does not verify
    │   ├── UntrustedRecord       a record that would drive replay or the gate is unsealed or forged
    │   └── ConflictingRecords    two stored rows claim one record id with different content
    ├── GateError                 the gate refused to act
    │   ├── AlreadyCompensated    a receipt was already compensated (by whom, when)
    │   └── CompensationPending   a claim exists but its rail call never finished (a crash)
    ├── PayloadError              an input document (OTLP body, ingested record, JSON file) is malformed
    ├── Overloaded                the receiver sheds a request (429 / RESOURCE_EXHAUSTED)
    ├── PolicyLoadError           ``module:function`` could not be imported
    ├── PolicyError               a policy raised, or returned something other than (bool, str)
    ├── ConfigError               a setting or environment variable is invalid
    ├── RerunError                a deterministic rerun cannot go on as recorded
    │   ├── ReplayMismatchError   the rerun made a call the recording does not hold (step, expected, candidates)
    │   └── DeterminismLeakError  strict rerun: a file, DNS, socket or entropy read outside the recording
    └── ContractError             contract governance (govern())
        ├── ContractLoadError     a contract file is invalid (every problem: file, line, field)
        ├── ReplayContractError   a model response asked for tool calls the contracts forbid (decision, failures)
        └── ReplayKillError       the governed session was killed (kill() or its circuit breaker)

Foreign exceptions (DuckDB, pyarrow, json, grpc) are converted at the storage,
capture and server boundaries with ``raise ... from exc`` so the cause is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "AlreadyCompensated",
    "CaptureError",
    "CompensationPending",
    "ConfigError",
    "ConflictingRecords",
    "ContractError",
    "ContractLoadError",
    "CorruptFileError",
    "DatasetError",
    "DeterminismLeakError",
    "GateError",
    "IntegrityError",
    "LeaseLost",
    "OtelReplayError",
    "OutcomeAlreadyRecorded",
    "Overloaded",
    "PartialWriteError",
    "PayloadError",
    "PolicyError",
    "PolicyLoadError",
    "QueryError",
    "ReadOnlyViolation",
    "RecordNotFound",
    "RecordingError",
    "ReplayContractError",
    "ReplayKillError",
    "ReplayMismatchError",
    "ReplayUndecidable",
    "RerunError",
    "UntrustedRecord",
    "WalBusyError",
    "message_line",
]


class OtelReplayError(Exception):
    """Base class of every error otel-replay raises deliberately."""

    def __reduce__(self) -> tuple[Any, tuple[type[OtelReplayError], tuple[Any, ...], dict[str, Any]]]:
        """Pickle without calling ``__init__`` (whose arguments differ per class), e.g. from a converter process."""
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(cls: type[OtelReplayError], args: tuple[Any, ...], state: dict[str, Any]) -> OtelReplayError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class CaptureError(OtelReplayError, ValueError):
    """The data handed to a capture API cannot be recorded as given."""


class RecordingError(CaptureError):
    """An ``audit()`` block completed (its action happened) but recording it failed.

    Raised after the block, never instead of the agent's own exception.
    ``record`` is the sealed record when only handing it to the sink failed
    (its span was emitted), else ``None``.
    """

    def __init__(self, message: str, record_id: str, record: object | None = None) -> None:
        super().__init__(message)
        self.record_id = record_id
        self.record = record


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

    def __init__(self, path: str, reason: str, *, skippable: bool = True) -> None:
        """``skippable``: the reader that met it can leave it out (a query can; compaction cannot)."""
        # A compacted file is listed by its partition's manifest: moved aside, it must also be dropped from it.
        aside = (
            "move it aside and run `otel-replay compact --drop-missing`"
            if str(path).replace("\\", "/").rpartition("/")[2].startswith("compact-g")
            else "move it aside"
        )
        skip = ", or open the dataset with skip_corrupt=True / --skip-corrupt" if skippable else ""
        super().__init__(f"corrupt Parquet file {path}: {reason} ({aside}{skip})")
        self.path = path
        self.reason = reason


class PartialWriteError(DatasetError, OSError):
    """Some partitions were written before one failed; ``dates`` lists the ones on disk."""

    def __init__(self, paths: Sequence[Path | str], dates: Sequence[str]) -> None:
        super().__init__(f"wrote {len(paths)} partition file(s) before a write failed")
        self.paths = list(paths)
        self.dates = list(dates)


class LeaseLost(DatasetError):
    """An object-store partition lease is no longer held: it expired and another process took it (or it was deleted).

    Any other :class:`DatasetError` from ``ObjectLease.confirm`` is a failed
    request (a network hiccup, a 5xx): the lease may well still be held.
    """


class WalBusyError(DatasetError):
    """Another process already owns this write-ahead log directory."""


class QueryError(OtelReplayError):
    """DuckDB rejected or failed a query."""


class ReadOnlyViolation(QueryError):
    """Analyst SQL tried to modify something, attach a database or read outside the dataset."""


class IntegrityError(OtelReplayError):
    """A record's hash, signature or chain link does not verify."""


class UntrustedRecord(IntegrityError):
    """A record that would drive replay or the gate is unsealed, edited or signed with an unknown key."""


class ConflictingRecords(IntegrityError):
    """Two stored rows claim the same record id with different content; neither is picked."""


class GateError(OtelReplayError):
    """The gate refused to execute."""


class AlreadyCompensated(GateError):
    """The receipt was already compensated; compensation happens at most once."""


class CompensationPending(GateError):
    """A compensation was claimed but never finished (the claimant crashed); resume it explicitly."""


class CompensationInProgress(AlreadyCompensated):
    """Another claimant is compensating the receipt right now: not done yet (it may still fail).

    A subclass of :class:`AlreadyCompensated` so code that only needs "do not
    call the rail again" keeps working; code that reports success must not
    count it as done.
    """


class PayloadError(OtelReplayError, ValueError):
    """An input document (an OTLP request body, an ingested record, a JSON file) is malformed."""


class Overloaded(OtelReplayError):
    """The receiver sheds this request; the client should retry after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: int, *, unavailable: bool = False) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.unavailable = unavailable


class PolicyLoadError(OtelReplayError):
    """A ``module:function`` reference could not be resolved."""


class PolicyError(OtelReplayError, TypeError):
    """A policy raised an exception, or returned something other than ``(justified, reason)``."""


class ConfigError(OtelReplayError, ValueError):
    """A setting, keyword argument or ``OTEL_REPLAY_*`` variable is invalid."""


class RerunError(OtelReplayError):
    """A deterministic rerun cannot continue as recorded (base of the rerun errors)."""


class ReplayMismatchError(RerunError):
    """The rerun made a call the recording does not hold, or holds with other arguments.

    ``step`` is the recorded step (the recording's 0-based number of the call, as the
    closest recorded calls are numbered), ``expected`` what the recording holds there,
    ``actual`` what the rerun did, ``candidates`` the closest recorded calls with the
    matchers each passed and failed.
    """

    def __init__(
        self, message: str, *, step: int = -1, expected: str = "", actual: str = "", candidates: Sequence[str] = ()
    ) -> None:
        super().__init__(message)
        self.step = step
        self.expected = expected
        self.actual = actual
        self.candidates = list(candidates)


class DeterminismLeakError(RerunError):
    """A rerun reached outside the recording: refused (network, DNS, processes, unrecorded HTTP), or strict.

    ``step`` is -1 for a leak (leaks are not steps) and the step of an unrecorded clock or entropy draw.
    """

    def __init__(self, message: str, *, step: int = -1, call: str = "") -> None:
        super().__init__(message)
        self.step = step
        self.call = call


class ContractError(OtelReplayError):
    """Base of the errors of contract governance (``otel_replay.govern``)."""


class ContractLoadError(ContractError, ValueError):
    """A contract file (or the directory) is invalid: the message names the file, line and field.

    ``problems`` holds every problem found (one line each, ``file:line: field: what``); the message is the first,
    with a count of the others, so one bad directory reports everything wrong in it at once.
    """

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems = list(problems) or [message]


class ReplayContractError(ContractError):
    """A model response asked for tool calls the contracts forbid, and the gate mode rejects it.

    ``decision`` is the enforcement decision (:class:`otel_replay.contracts.Decision`), ``failures`` its
    contract failures, each naming the tool, the rule and the contract file and line it came from.
    """

    def __init__(self, message: str, *, decision: Any = None, failures: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.decision = decision
        self.failures = list(failures)


class ReplayKillError(ContractError):
    """The governed session was killed (by ``kill()`` or its circuit breaker): every later call raises this."""

    def __init__(self, message: str, *, session_id: str = "", killed_at: float | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.killed_at = killed_at


def message_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (DuckDB's and Arrow's run to several), or its type's name when empty."""
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__
