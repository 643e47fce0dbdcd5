"""What the receiver's admission of one OTLP request kept and dropped: one record for spans and log records alike."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Admission"]


@dataclass
class Admission:
    """What one request's admission kept and dropped (``rejected`` is the sum of the reasons)."""

    accepted: int = 0
    rejected: int = 0
    bad_ids: int = 0
    bad_times: int = 0
    bad_counts: int = 0
    too_many_dates: int = 0
    too_much_shared: int = 0
    message: str = ""
    days: set[int] = field(default_factory=set)
    """The dates (days since the epoch, UTC) of the records kept; filled only with ``max_dates``."""
