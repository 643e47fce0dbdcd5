"""Dataset files: the backend seam, compaction, the side index, retention, leases, outcome claims.

- :func:`compact` rewrites partitions into large sorted files (atomic swap via a per-partition manifest);
- :func:`live_files` is the reader rule: the files a query should read;
- :func:`files_for` narrows a lookup by id to the files that may hold it;
- :func:`drop_older_than` drops whole old partitions.

The names are imported on first use: the capture path reads and writes
through a few modules of this package (the write-ahead log, the outcome
claims) and does not pay for compaction's DuckDB and Arrow imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from otel_replay import _lazy

if TYPE_CHECKING:  # what the names below resolve to on first use, for type checkers
    from .compact import compact
    from .compact_steps import CompactReport, PartitionReport
    from .lease import PartitionLease
    from .manifest import live_files
    from .retention import RetentionReport, drop_older_than
    from .side_index import files_for

__all__ = [
    "CompactReport",
    "PartitionLease",
    "PartitionReport",
    "RetentionReport",
    "compact",
    "drop_older_than",
    "files_for",
    "live_files",
]

_LAZY = {
    "CompactReport": ".compact_steps",
    "PartitionLease": ".lease",
    "PartitionReport": ".compact_steps",
    "RetentionReport": ".retention",
    "compact": ".compact",
    "drop_older_than": ".retention",
    "files_for": ".side_index",
    "live_files": ".manifest",
}
"""Public names imported on first use: name -> module."""

__getattr__, __dir__ = _lazy.exports(__name__, _LAZY, submodules=True)

