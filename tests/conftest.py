"""Shared fixtures: a signing key, a dataset directory, a configured pipeline, and the demo's dataset."""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace

import otel_replay
from otel_replay import Telemetry
from otel_replay.demo import run_demo

from ._support import TEST_KEY, Demo, Zygote

_BYTECODE_CACHE = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """Compile each module once per run even where the environment forbids bytecode files.

    The suite starts hundreds of Python processes (xdist workers, ``python -m otel_replay``, agents under rerun).
    With ``PYTHONDONTWRITEBYTECODE`` set (common in containers) each of them compiled the package and pytest
    rewrote every test module again: about 0.5 s of CPU per process and 17 s per worker. The compiled files go to
    a private directory made for this run (never beside the sources, as the setting asks), which the processes
    started from here share through ``PYTHONPYCACHEPREFIX``; it is removed when the run ends.
    """
    if not sys.dont_write_bytecode or os.environ.get("PYTHONPYCACHEPREFIX"):
        return  # bytecode is cached already (the usual way, or where the user chose); a worker inherits ours
    cache = Path(tempfile.mkdtemp(prefix="otel-replay-tests-pyc-"))
    config.stash[_BYTECODE_CACHE] = cache
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(cache)
    sys.pycache_prefix = str(cache)
    sys.dont_write_bytecode = False


@pytest.hookimpl(optionalhook=True)  # xdist's hook: a run without xdist (-p no:xdist) must not fail on it
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: half as many workers again as the cores this process may use (three on two cores).

    Many tests spend part of their wall waiting (servers, child processes, a lease's expiry, a browser): on an idle
    machine with two cores, one worker per core left 30% of the CPU unused (410 s of wall for 574 s of CPU), and
    three workers ran the same suite in 327 s, back to back. ``-n N`` still sets the count.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores + max(1, cores // 2)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove this run's bytecode directory, if ``pytest_configure`` made one."""
    cache = config.stash.get(_BYTECODE_CACHE, None)
    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)


@pytest.fixture(autouse=True)
def _stops_what_it_starts() -> Iterator[None]:
    """Fail a test that leaves one of otel-replay's threads running after its fixtures are torn down.

    Such a thread (a lease renewing, an exporter's writer, a converter) lives for the worker's life and its
    traffic reaches whatever test runs next in the worker: a rerun's leak guard sees every thread, and refused
    an unrelated rerun because a lock a test never gave back kept renewing against the object store.
    Threads of wider-scoped fixtures were started before this snapshot and are not counted.
    """
    before = set(threading.enumerate())
    yield
    # A pool's workers (``otel-replay-grpc_0``) start lazily, at a wider-scoped server's first request: its owner's
    # own thread is the one that tells whether it was stopped.
    left = [
        t
        for t in threading.enumerate()
        if t not in before and t.name.startswith("otel-replay-") and not re.search(r"_\d+$", t.name)
    ]
    deadline = time.monotonic() + 30  # a hang guard for threads told to stop that are still winding down
    for thread in left:
        thread.join(max(0.0, deadline - time.monotonic()))
    alive = sorted(t.name for t in left if t.is_alive())
    assert not alive, f"the test left otel-replay threads running: {alive}"


@pytest.fixture(autouse=True)
def signing_key(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Every test signs with a known key and never touches ~/.config."""
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", TEST_KEY)
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))
    monkeypatch.delenv("OTEL_REPLAY_KEY_FILE", raising=False)
    monkeypatch.delenv("OTEL_REPLAY_DATASET", raising=False)
    return TEST_KEY


_ZYGOTE_IMPORTS = (
    "otel_replay",
    "otel_replay.cli",
    "otel_replay.cli.dataset",
    "otel_replay.cli.replay",
    "otel_replay.cli.storage",
    "otel_replay.storage.compact",
    "otel_replay.query.store",
    "otel_replay.gate",
    "boto3",
)


@pytest.fixture(scope="session")
def zygote() -> Iterator[Zygote]:
    """A process of this test process's own that imported the package, its CLI and compaction once, and forks a
    child per script (``zygote.run(code, *args)``, ``zygote.popen(...)``): a real process to crash or kill, without
    a second of imports each time. One per test process (per xdist worker)."""
    forks = Zygote(_ZYGOTE_IMPORTS)
    yield forks
    forks.close()


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return tmp_path / "traces"


@pytest.fixture
def telemetry(dataset: Path) -> Iterator[Telemetry]:
    handle = otel_replay.configure(dataset, service_name="tests", set_global=False)
    yield handle
    handle.shutdown()


@pytest.fixture(autouse=True)
def no_global_tracer_provider() -> Iterator[None]:
    """No test may install a global TracerProvider: it is set-once, so it would outlive the test dead.

    Use ``configure(..., set_global=False)`` or a provider of the test's own.
    """
    before = trace.get_tracer_provider()
    yield
    after = trace.get_tracer_provider()
    assert after is before, f"this test installed a global TracerProvider ({after!r}); use set_global=False"


def _tree(root: Path) -> dict[str, tuple[int, int, int]]:
    """Relative path -> (mode, size, mtime in ns) of everything under ``root``."""
    found = {}
    for path in [root, *root.rglob("*")]:
        info = path.lstat()
        found[path.relative_to(root).as_posix()] = (info.st_mode, info.st_size, info.st_mtime_ns)
    return found


@pytest.fixture(scope="session")
def demo_build(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    """The demo's dataset, written once per test process (once per xdist worker) and then made read-only.

    Tests read it through ``demo_dataset`` (checked unchanged after each test) or
    write to their own copy (``demo_copy``).
    """
    path = tmp_path_factory.mktemp("demo") / "ds"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_REPLAY_SIGNING_KEY", TEST_KEY)
        mp.setenv("HOME", str(tmp_path_factory.mktemp("demo-home")))
        mp.delenv("OTEL_REPLAY_KEY_FILE", raising=False)
        mp.delenv("OTEL_REPLAY_DATASET", raising=False)
        result = run_demo(path)
    assert result.verify.ok, result.verify
    for entry in [path, *path.rglob("*")]:
        if not entry.is_symlink():
            entry.chmod(stat.S_IMODE(entry.stat().st_mode) & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    with otel_replay.open(path) as store:
        (span,) = store.rows("SELECT trace_id, span_id FROM decisions")
    return Demo(path, result.record.record_id, result.correlation_id, span["trace_id"], span["span_id"])


@pytest.fixture
def demo_dataset(demo_build: Demo) -> Iterator[Path]:
    """The shared demo dataset, read-only: the test fails if it changed anything in it (root ignores file modes)."""
    before = _tree(demo_build.path)
    yield demo_build.path
    assert _tree(demo_build.path) == before, "this test changed the shared demo dataset: use demo_copy"


@pytest.fixture
def demo_copy(demo_build: Demo, tmp_path: Path) -> Path:
    """A writable copy of the demo dataset, the test's own."""
    copy = tmp_path / "demo"
    shutil.copytree(demo_build.path, copy, symlinks=True)
    for entry in [copy, *copy.rglob("*")]:
        if not entry.is_symlink():
            entry.chmod(stat.S_IMODE(entry.stat().st_mode) | stat.S_IWUSR)
    return copy
