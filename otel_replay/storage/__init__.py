"""Dataset files: the backend seam, compaction, the side index, retention, leases, outcome claims.

- :func:`compact` rewrites partitions into large sorted files (atomic swap via a per-partition manifest);
- :func:`live_files` is the reader rule: the files a query should read;
- :func:`files_for` narrows a lookup by id to the files that may hold it;
- :func:`drop_older_than` drops whole old partitions.
"""

from __future__ import annotations

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
