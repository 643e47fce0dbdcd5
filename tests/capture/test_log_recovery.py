"""Recovering the write-ahead logs of processes that died (issue 20): every acknowledged record once, never deleted.

A gate's intent and commit records are fsynced in a log of the process's own
(:mod:`otel_replay.capture.write_ahead`); :func:`otel_replay.capture.log_recovery.recover`
converts what a dead process left, on the next ``configure()``, ``open()``,
``compact`` or ``serve``. These tests damage such logs, race recoveries
against each other and against live writers, and check what ``verify`` says.
The dying agent is the child of ``tests/gate/test_gate_write_ahead.py``.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

import otel_replay
from tests.gate.test_gate_write_ahead import KEY, _gates, _left_behind, _no_row_twice, _reopen, _run


def test_a_damaged_record_in_a_dead_processes_log_is_kept_for_inspection_not_deleted(zygote, tmp_path, caplog):
    dataset, decision_id = _left_behind(zygote, tmp_path)
    (segment,) = (dataset / "_wal").glob("capture-*/*.wal")
    data = bytearray(segment.read_bytes())
    data[40] ^= 0x01  # inside the intent; the commit record after it is whole
    segment.write_bytes(bytes(data))
    with otel_replay.open(dataset) as store:
        assert _gates(store, decision_id) == ["committed"]
    assert "could not be converted whole" in caplog.text and "kept in" in caplog.text
    # Was: the segment was deleted once salvaged: the intent's bytes, the only copy of what it held, were gone.
    kept = segment.parent / "quarantine" / segment.name
    assert kept.read_bytes() == bytes(data)
    report = json.loads(kept.with_name(kept.stem + ".report.json").read_text())
    assert report["segment"] == segment.name and report["records_dropped"] == 1 and report["spans_written"] == 1
    with otel_replay.open(dataset) as store:  # a later recovery leaves it where it is and adds nothing twice
        assert _gates(store, decision_id) == ["committed"]
        _no_row_twice(store)
    assert kept.read_bytes() == bytes(data)


_LIVE = textwrap.dedent(
    """
    import sys
    import otel_replay
    from otel_replay import Action, ActionGate, ReferenceLedger

    dataset = sys.argv[1]
    telemetry = otel_replay.configure(dataset, set_global=False, max_file_age_seconds=3600)
    gate = ActionGate(ReferenceLedger(100), dataset=dataset)
    gate.commit(Action("refund", {"order": "live-1"}, cost=1.0), record_id="live-1")
    print(telemetry.log.directory, flush=True)
    sys.stdin.readline()  # another process opens the dataset meanwhile
    gate.commit(Action("refund", {"order": "live-2"}, cost=1.0), record_id="live-2")
    telemetry.shutdown()
    """
)


def test_a_reader_opening_the_dataset_leaves_a_live_processes_log_to_it(zygote, tmp_path, monkeypatch):
    dataset = tmp_path / "traces"
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", KEY)
    with zygote.popen(_LIVE, str(dataset), stdin=True) as child:
        assert child.stdin is not None
        directory = Path(child.stdout.readline().strip())
        segments = sorted(p.name for p in directory.glob("*.wal"))
        with otel_replay.open(dataset) as store:  # recovers what dead processes left: not this one's log
            assert _gates(store, "live-1") == []
        assert sorted(p.name for p in directory.glob("*.wal")) == segments
        child.stdin.write("go\n")
        child.stdin.flush()
        _, err = child.communicate()
    assert child.returncode == 0, err
    with otel_replay.open(dataset) as store:
        for decision_id in ("live-1", "live-2"):  # the one acknowledged after the reader came and went too
            assert _gates(store, decision_id) == ["intent", "committed"], decision_id
        _no_row_twice(store)


_RECOVERER = textwrap.dedent(
    """
    import sys, time
    import otel_replay
    import otel_replay.storage.convert as convert

    real = convert.ChunkWriter.flush

    def slow_flush(self):  # a slow disk: the two recoveries overlap
        time.sleep(0.5)
        real(self)

    convert.ChunkWriter.flush = slow_flush
    print("start", flush=True)
    otel_replay.open(sys.argv[1]).close()
    """
)


def test_two_processes_recovering_one_dead_log_at_once_store_each_record_once(zygote, tmp_path, monkeypatch):
    dataset, decision_id = _left_behind(zygote, tmp_path)
    env = {**os.environ, "OTEL_REPLAY_SIGNING_KEY": KEY}
    recoverers = [zygote.popen(_RECOVERER, str(dataset), env=env) for _ in range(2)]
    said = [r.communicate() for r in recoverers]
    for recoverer, (out, err) in zip(recoverers, said, strict=True):
        assert recoverer.returncode == 0 and out == "start\n", err
        assert "failed" not in err and "Error" not in err, err  # neither tripped over the other's conversion
    assert not list((dataset / "_wal").glob("capture-*"))
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", KEY)
    with otel_replay.open(dataset) as store:
        assert _gates(store, decision_id) == ["intent", "committed"]
        _no_row_twice(store)


def _damage_every_checksum(segment: Path) -> None:
    """Every record's checksum other: a log this version cannot read (one written in a newer format, say)."""
    data = bytearray(segment.read_bytes())
    offset = 0
    while offset + 8 <= len(data):
        length = int.from_bytes(data[offset : offset + 4], "little")
        data[offset + 4 : offset + 8] = bytes(b ^ 0xFF for b in data[offset + 4 : offset + 8])
        offset += 8 + length
    segment.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flipped-bit", "unreadable-format"])
def test_an_intent_lost_to_damage_in_a_dead_processes_log_is_named_by_verify_never_silently_absent(
    zygote, tmp_path, monkeypatch, caplog, damage
):
    dataset, decision_id, _, book = _run(zygote, tmp_path, "inside_rail", "kill")
    assert book == ["o-1"]  # the rail refunded: the intent, the last record of its log, is the only trace of it
    (segment,) = (dataset / "_wal").glob("capture-*/*.wal")
    if damage == "flipped-bit":
        data = bytearray(segment.read_bytes())
        data[40] ^= 0x01  # whole length, wrong checksum: damage, not a write a crash cut short
        segment.write_bytes(bytes(data))
    else:
        _damage_every_checksum(segment)
    damaged = segment.read_bytes()
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", KEY)
    with otel_replay.open(dataset) as store:
        assert _gates(store, decision_id) == []  # the intent could not be read back
        report = store.verify(None)
    # Was: read as a torn tail (never acknowledged), ignored with a warning, the segment deleted: verify was clean.
    kept = segment.parent / "quarantine" / segment.name
    assert kept.read_bytes() == damaged
    assert not report.ok and report.unreadable_files == [str(kept)]
    assert "kept in" in caplog.text


_FORKS_THEN_DIES = textwrap.dedent(
    """
    import os, signal, sys, time
    import otel_replay
    from otel_replay import Action, ActionGate, ReferenceLedger

    dataset, stop = sys.argv[1:3]
    otel_replay.configure(dataset, set_global=False)
    ActionGate(ReferenceLedger(100), dataset=dataset).commit(Action("refund", {"o": "f-1"}), record_id="forked-1")
    pid = os.fork()
    if pid == 0:  # a worker the agent forked (a pool's), still running when the agent dies
        quiet = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # not holding the test's pipes open
            os.dup2(quiet, fd)
        deadline = time.monotonic() + 60
        while not os.path.exists(stop) and time.monotonic() < deadline:
            time.sleep(0.02)
        os._exit(0)
    print(pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_the_log_of_a_process_that_died_is_recovered_while_a_child_it_forked_still_runs(zygote, tmp_path, monkeypatch):
    dataset, stop = tmp_path / "traces", tmp_path / "stop"
    env = {**os.environ, "OTEL_REPLAY_SIGNING_KEY": KEY}
    child = zygote.run(_FORKS_THEN_DIES, str(dataset), str(stop), env=env)
    assert child.returncode == -9, child.stderr
    worker = int(child.stdout.strip())
    try:
        monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", KEY)
        with otel_replay.open(dataset) as store:
            # Was: the worker held the dead agent's log lock (inherited with fork), so recovery took the log for
            # a live process's and left its acknowledged commit out until the worker exited.
            assert _gates(store, "forked-1") == ["intent", "committed"]
    finally:
        stop.touch()
        deadline = time.monotonic() + 30
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.02)
        if _alive(worker):
            os.kill(worker, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for whoever adopted it does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_compaction_between_a_death_mid_conversion_and_the_recovery_leaves_every_record_once(
    zygote, tmp_path, monkeypatch
):
    from otel_replay.storage.compact import compact

    dataset, decision_id, said, _ = _run(zygote, tmp_path, "converting_bytes", "kill")
    assert said[-1] == "converted-by:otel_replay.capture.log_recovery"  # its files written, the segment not released
    (segment,) = [p for p in (dataset / "_wal").glob("capture-*/*.wal") if p.stat().st_size]  # and an empty active one
    written = sorted(p.name for p in (dataset / "spans").rglob("wal-*.parquet"))
    compact(dataset, grace_seconds=0)  # as serve's background compactor does, before any recovery
    # Was: the files were merged into a compacted file and deleted, and the recovery wrote them again beside it.
    assert sorted(p.name for p in (dataset / "spans").rglob("wal-*.parquet")) == written  # left for later
    _reopen(dataset, monkeypatch)  # the recovery: the segment converted again, then released
    assert not segment.exists()
    compact(dataset, grace_seconds=0)  # now they are compacted
    assert not list((dataset / "spans").rglob("wal-*.parquet"))
    with otel_replay.open(dataset) as store:
        assert _gates(store, decision_id) == ["intent", "committed"]
        _no_row_twice(store)
