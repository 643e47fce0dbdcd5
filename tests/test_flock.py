"""Writer locks taken without waiting: one holder at a time, a probe that never takes or makes one, no inheritance."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from otel_replay._flock import held_elsewhere, try_lock


def test_a_second_taker_is_refused_until_the_first_closes(tmp_path: Path) -> None:
    lock = tmp_path / "LOCK"
    first = try_lock(lock)
    assert first is not None and lock.exists()
    try:
        assert try_lock(lock) is None  # another open file description, even in this process
        assert held_elsewhere(lock)
    finally:
        os.close(first)
    assert not held_elsewhere(lock)
    again = try_lock(lock)
    assert again is not None
    os.close(again)


def test_the_probe_never_creates_the_file_and_a_missing_lock_is_not_held(tmp_path: Path) -> None:
    lock = tmp_path / "absent" / "LOCK"
    assert not held_elsewhere(lock)
    assert not lock.exists()
    with pytest.raises(FileNotFoundError):
        try_lock(tmp_path / "LOCK", create=False)
    assert not (tmp_path / "LOCK").exists()


def test_a_lock_descriptor_is_not_inherited_by_a_child_that_outlives_its_parent(tmp_path: Path) -> None:
    lock = tmp_path / "LOCK"
    fd = try_lock(lock)
    assert fd is not None
    assert not os.get_inheritable(fd)
    # A child started while the lock is held, told to keep every descriptor it may inherit, and running its own
    # program (it says so): once the parent's descriptor is closed, the lock is free although the child still runs.
    with subprocess.Popen([sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, close_fds=False) as child:
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "up"
            os.close(fd)
            assert not held_elsewhere(lock)
        finally:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(timeout=30)


def test_a_lock_held_by_another_process_is_seen_and_freed_when_that_process_dies(tmp_path: Path) -> None:
    lock = tmp_path / "LOCK"
    code = ("import sys; from otel_replay._flock import try_lock; fd = try_lock(sys.argv[1]); "
            "print('held' if fd is not None else 'busy', flush=True); sys.stdin.read()")
    with subprocess.Popen([sys.executable, "-c", code, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as child:
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "held"
            assert held_elsewhere(lock)
            assert try_lock(lock) is None
        finally:
            child.kill()
            child.wait(timeout=30)
    fd = try_lock(lock)
    assert fd is not None
    os.close(fd)
