"""Aliases: a clock or entropy function bound before the rerun began is read live, and the rerun says so.

``from time import time`` at import, a dict holding ``datetime.datetime.now``,
an unseeded ``random.Random()``: the boundaries patch module attributes, so these
reads are neither recorded nor served. A rerun's profile hook reports each as a
leak (never matched; strict refuses it), on the agent's threads and asyncio tasks
too, while the reads of the standard library, the OpenTelemetry SDK and
otel-replay stay theirs, a seeded generator stays deterministic, and a profiler
the user had set keeps running and is put back.

Each test here fails with the hook left out (``watch_aliases`` returning True
without installing anything): the reads are then live and the rerun says matched.
"""

from __future__ import annotations

import asyncio
import cProfile
import datetime
import email.utils
import random
import secrets
import sys
import threading
import time
import uuid
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_replay.errors import DeterminismLeakError
from otel_replay.rerun import rerun

from .conftest import record

_CLOCK = time.time
_NOW = {"now": datetime.datetime.now}
_UUID4 = uuid.uuid4
"""Bound at import, before any recording or rerun patched the modules."""
_RANDINT = random.randint
_MORE = {
    "uuid1": (uuid.uuid1, "clock uuid.uuid1"),
    "token_hex": (secrets.token_hex, "entropy os.urandom read live through secrets.token_hex"),
    "randint": (lambda: _RANDINT(1, 10**9), "entropy random.getrandbits read live through random.Random.randint"),
    "perf_counter_ns": (time.perf_counter_ns, "clock time.perf_counter_ns"),
    "now_in_utc": (lambda: _NOW["now"](datetime.UTC), "clock datetime.now"),
}


def _in_a_thread() -> str:
    out: list[float] = []
    worker = threading.Thread(target=lambda: out.append(_CLOCK()), name="agent-worker")
    worker.start()
    worker.join()
    return repr(out)


def test_an_alias_read_in_a_thread_the_agent_starts_is_a_leak(dataset: Path) -> None:
    record(dataset, "thread", _in_a_thread)
    result = rerun(_in_a_thread, dataset=dataset, session_id="thread")
    assert not result.matched
    assert any("clock time.time read live by" in leak and "_in_a_thread" in leak for leak in result.leaks), result.leaks


async def _task() -> str:
    await asyncio.sleep(0)
    return str(_UUID4()) + _NOW["now"]().isoformat()


def _in_a_task() -> str:
    return asyncio.run(_task())


def test_an_alias_read_in_an_asyncio_task_is_a_leak(dataset: Path) -> None:
    record(dataset, "task", _in_a_task)
    result = rerun(_in_a_task, dataset=dataset, session_id="task")
    assert not result.matched
    leaks = " | ".join(result.leaks)
    assert "through uuid.uuid4 by tests.rerun.test_rerun_aliases:_task" in leaks, leaks
    assert "clock datetime.now read live by tests.rerun.test_rerun_aliases:_task" in leaks, leaks


def test_a_strict_rerun_refuses_an_alias_read_where_it_is_made(dataset: Path) -> None:
    record(dataset, "strict", lambda: _CLOCK())
    with pytest.raises(DeterminismLeakError, match="clock time.time read live"):
        rerun(lambda: _CLOCK(), dataset=dataset, session_id="strict", governance="strict")
    assert sys.getprofile() is None and threading.getprofile() is None


@pytest.mark.parametrize("name", sorted(_MORE))
def test_other_functions_bound_early_are_reported_by_what_they_read(dataset: Path, name: str) -> None:
    read, says = _MORE[name]
    record(dataset, name, lambda: str(read()))
    result = rerun(lambda: str(read()), dataset=dataset, session_id=name)
    assert not result.matched
    assert any(leak.startswith(says) for leak in result.leaks), result.leaks


def _seeded() -> tuple[Any, ...]:
    reseeded = random.Random()
    reseeded.seed(7)  # seeded from the OS, then given a seed: deterministic from here
    restored = random.Random(3)
    state = restored.getstate()
    restored.random()
    restored.setstate(state)
    return random.Random(42).randint(1, 10**9), reseeded.random(), restored.random(), random.Random("x").random()


def test_a_seeded_generator_is_deterministic_and_not_reported(dataset: Path) -> None:
    original, _, events = record(dataset, "seeded", _seeded)
    assert events == 0
    result = rerun(_seeded, dataset=dataset, session_id="seeded")
    assert result.output == original
    assert result.matched and not result.leaks and not result.warnings, result.report()


def _reseeded_from_the_os() -> float:
    generator = random.Random(42)
    generator.seed()  # no seed given: from the OS
    return generator.random()


def test_a_generator_given_a_seed_then_reseeded_from_the_os_is_reported(dataset: Path) -> None:
    record(dataset, "reseeded", _reseeded_from_the_os)
    result = rerun(_reseeded_from_the_os, dataset=dataset, session_id="reseeded")
    assert not result.matched
    assert any("entropy random.Random().random read live" in leak for leak in result.leaks), result.leaks


def _library_reads() -> str:
    """The SDK (``from time import time_ns`` at its import) and the standard library read for themselves."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    with provider.get_tracer("agent").start_as_current_span("step"):
        msgid = email.utils.make_msgid(domain="agent.test")  # time.time and random.getrandbits: the standard library's
    provider.shutdown()
    return "ok" if msgid else "no id"


def test_the_sdks_and_the_standard_librarys_own_reads_are_not_leaks(dataset: Path) -> None:
    original, _, _ = record(dataset, "library", _library_reads)
    result = rerun(_library_reads, dataset=dataset, session_id="library")
    assert result.output == original
    assert result.matched and not result.leaks, result.report()


def test_an_aliased_date_today_is_recorded_and_served_through_the_patched_time_time(dataset: Path) -> None:
    """``date.today`` of C reads ``time.time`` through the module: an alias of it is recorded, so not reported."""
    today = datetime.date.today
    original, _, events = record(dataset, "today", lambda: today().isoformat())
    assert events == 1
    result = rerun(lambda: today().isoformat(), dataset=dataset, session_id="today")
    assert result.output == original and result.matched and not result.leaks, result.report()


def test_a_profiler_already_set_keeps_running_and_is_put_back(dataset: Path) -> None:
    seen: list[str] = []

    def mine(frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call" and arg is abs:
            seen.append(threading.current_thread().name)

    def agent() -> float:
        worker = threading.Thread(target=lambda: abs(-1), name="agent-worker")
        worker.start()
        worker.join()
        abs(-1)
        return _CLOCK()

    record(dataset, "profiled", agent)
    sys.setprofile(mine)
    threading.setprofile(mine)
    try:
        seen.clear()
        result = rerun(agent, dataset=dataset, session_id="profiled")
        assert sys.getprofile() is mine
        assert threading.getprofile() is mine
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    assert sorted(seen) == ["MainThread", "agent-worker"]  # chained, in the rerun's thread and the agent's
    assert not result.matched
    assert any("clock time.time read live" in leak for leak in result.leaks), result.leaks


def test_the_hook_is_off_after_a_rerun_and_not_set_while_recording(dataset: Path) -> None:
    during: list[Any] = []

    def agent() -> float:
        during.append(sys.getprofile())
        return time.time()

    record(dataset, "off", agent)
    assert during == [None]
    result = rerun(agent, dataset=dataset, session_id="off")
    assert result.matched, result.report()
    assert during[1] is not None
    assert sys.getprofile() is None and threading.getprofile() is None


def test_a_running_cprofile_is_left_alone_and_the_rerun_warns_that_aliases_are_not_watched(dataset: Path) -> None:
    record(dataset, "cprofiled", lambda: _CLOCK())
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        result = rerun(lambda: _CLOCK(), dataset=dataset, session_id="cprofiled")
        still = sys.getprofile() is profiler
    finally:
        profiler.disable()
    assert still
    assert any("cProfile" in warning for warning in result.warnings), result.warnings


def test_a_thread_that_outlives_the_rerun_takes_the_hook_off_at_its_next_call(dataset: Path) -> None:
    go, after = threading.Event(), []
    worker: list[threading.Thread] = []

    def agent() -> float:
        def lingering() -> None:
            go.wait(10)
            abs(-1)  # the first call after the rerun ended: the hook takes itself off
            after.append(sys.getprofile())

        worker.append(threading.Thread(target=lingering, name="agent-lingering"))
        worker[-1].start()
        return time.time()

    record(dataset, "lingering", agent)
    go.set()  # the recorded run's thread
    worker.pop().join()
    go.clear()
    result = rerun(agent, dataset=dataset, session_id="lingering")
    go.set()
    worker.pop().join()
    assert result.matched, result.report()
    assert after == [None, None]
