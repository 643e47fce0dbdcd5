"""Which span files came from write-ahead log segments still on disk: compaction leaves those out.

A log segment (the receiver's, or a process's capture log) is deleted only
after its Parquet files are written, under names derived from it
(``wal-<log directory>-<segment id>-<chunk>.parquet``). One still on disk (its
process died in between, or is converting it now) is converted again under the
same names by a recovery, a receiver's restart or its live owner; merged into a
compacted file and deleted meanwhile, such a file would come back beside it and
its rows be stored twice.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

__all__ = ["in_flight"]

_LOG_FILE = re.compile(r"wal-(?P<log>.+)-(?P<segment>\d{20}-[0-9a-f]{8})-\d{5}\.parquet")
"""A file converted from a write-ahead log segment: ``wal-<log directory>-<segment id>-<chunk>.parquet``."""


def in_flight(root: Path, names: Sequence[str]) -> set[str]:
    """The ``names`` converted from segments of the logs under ``root`` that are still on disk.

    A quarantined segment not yet salvaged (no report) counts too. Race-free
    with the listing ``names`` came from, if that was taken first: a segment
    released after it is simply not held.
    """
    held: set[str] = set()
    if not any(name.startswith("wal-") for name in names):
        return held
    try:
        logs = set(os.listdir(root))  # most files' logs are long gone: looked up here, not asked of the disk
    except OSError:  # no log was ever kept here
        return held
    listed: dict[str, set[str]] = {}  # a log directory's segments on disk, listed once
    for name in names:
        match = _LOG_FILE.fullmatch(name) if name.startswith("wal-") else None
        if match is None or match["log"] not in logs:
            continue
        segments = listed.get(match["log"])
        if segments is None:
            segments = listed[match["log"]] = _segments_on_disk(root / match["log"])
        if match["segment"] in segments:
            held.add(name)
    return held


def _segments_on_disk(directory: Path) -> set[str]:
    """The ids of the segments in the log ``directory``, and of those in its quarantine not yet salvaged."""
    try:
        found = {name[: -len(".wal")] for name in os.listdir(directory) if name.endswith(".wal")}
    except OSError:  # no such log (its segments all released, or a receiver's --wal-dir elsewhere)
        return set()
    try:
        quarantined = os.listdir(directory / "quarantine")
    except OSError:
        return found
    reported = {name[: -len(".report.json")] for name in quarantined if name.endswith(".report.json")}
    return found | {name[: -len(".wal")] for name in quarantined if name.endswith(".wal")} - reported
