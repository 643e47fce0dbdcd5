"""A write-ahead log's lock file: held while its owner lives, and seen as held by every reader that must keep off it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider

from otel_replay.capture.log_recovery import CAPTURE_PREFIX, log_root, recover
from otel_replay.query.verify import _written_ahead_live
from otel_replay.server import ServerConfig
from otel_replay.server.server import stranded_wal_dirs
from otel_replay.storage.wal import LOCK_NAME, WalBusyError, WriteAheadLog


def _request() -> bytes:
    """One OTLP request of one span: a record a recovery converts."""
    tracer = TracerProvider().get_tracer("test")
    span = tracer.start_span("work", start_time=1_700_000_000_000_000_000)
    span.end(end_time=1_700_000_000_000_000_001)
    return encode_spans([span]).SerializeToString()  # type: ignore[list-item]


def _second_owner(dataset: Path, directory: Path) -> bool:
    try:
        WriteAheadLog(directory).close()
    except WalBusyError:
        return False
    return True


def _recovery(dataset: Path, directory: Path) -> bool:
    recover(str(dataset))
    return not directory.exists()  # converted and removed: taken as a dead process's log


def _stranded(dataset: Path, directory: Path) -> bool:
    config = ServerConfig(dataset, grpc=None, http=None, convert_workers=0, instance="other")
    return [found for found, _ in stranded_wal_dirs(config)] == [directory]


def _verify(dataset: Path, directory: Path) -> bool:
    return not _written_ahead_live(dataset)


# Each reader, and the log directory it looks at: whether it takes the log as nobody's (True) or as a live owner's.
READERS: dict[str, tuple[str, Callable[[Path, Path], bool]]] = {
    "a second WriteAheadLog": ("default", _second_owner),
    "recovery of capture logs (configure, open, compact, serve)": (f"{CAPTURE_PREFIX}1-0000abcd", _recovery),
    "serve's stranded-log warning": ("default", _stranded),
    "verify's live-writer check": (f"{CAPTURE_PREFIX}1-0000abcd", _verify),
}


@pytest.mark.parametrize("reader", list(READERS))
def test_a_held_log_lock_is_seen_by_each_reader_and_a_released_one_is_not(tmp_path: Path, reader: str) -> None:
    name, free = READERS[reader]
    dataset = tmp_path / "ds"
    directory = log_root(str(dataset)) / name
    log = WriteAheadLog(directory)
    try:
        log.append(_request())
        assert (directory / LOCK_NAME).is_file()  # the name every reader probes is the file the owner locks
        assert not free(dataset, directory), f"{reader} took a live owner's log as nobody's"
        assert directory.is_dir()
    finally:
        log.close()
    assert free(dataset, directory), f"{reader} still saw the log of a closed owner as held"
