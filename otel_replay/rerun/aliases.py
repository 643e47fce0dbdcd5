"""Aliases: a clock or entropy function the agent bound before the rerun began is read live, and said so.

Recording and rerunning replace module attributes (``time.time``, ``uuid.uuid4``,
``datetime.datetime`` ...). Code that took the function itself earlier
(``from time import time`` at import, a dict or a closure holding
``datetime.datetime.now``) calls the original: the recording did not see that
read, and neither would the rerun, which would then say ``matched`` although its
output differs. During a rerun (never while recording) a profile hook
(:func:`sys.setprofile`, and :func:`threading.setprofile` for the threads started
meanwhile, each chained with the hook that was there and restored after) watches
every call of a C function and reports a call of one of the original clock or
entropy functions as a leak: a warning when relaxed (listed in ``result.leaks``,
never matched), refused where it is made when strict.

Watched: the clock functions the boundaries patch (not ``sleep``, which reads
nothing, nor ``localtime`` and the other functions that read the clock only when
not given a time: a profile hook does not see the arguments), ``datetime.now`` and
``utcnow`` of the real class (``date.today`` and ``datetime.today`` only where their
C code does not read ``time.time`` through the module: there, an alias of them is
recorded and served), ``os.urandom``
(under ``uuid.uuid4``, ``secrets`` and ``random.SystemRandom``), the C clock of
``uuid.uuid1``, the draws of the ``random`` module's own generator, and those of
a ``random.Random`` the agent made or re-seeded during the rerun without a seed
(seeded from the OS). A generator given a seed is deterministic and not reported.

Whose read it is follows the boundaries' rule (:mod:`otel_replay.rerun.callers`):
frames of the function's own module (``random``, ``uuid``, ``secrets``) and of
the boundary wrappers are passed over, and the first other frame must be the
agent's. The standard library's, OpenTelemetry's, otel-replay's and the clients'
reads are theirs.

Not seen: a thread running before the rerun began (a pool made at import), a
generator seeded from the OS before it began, an alias called from C
(``functools.partial``, ``map``), and C code reading the clock itself.
"""

from __future__ import annotations

import datetime as _dt
import os
import random
import sys
import threading
import time
import uuid
from collections.abc import Callable
from types import FrameType
from typing import Any

from otel_replay.rerun.boundaries import CLOCK_FUNCTIONS
from otel_replay.rerun.callers import INSIDE, agent_module
from otel_replay.rerun.patching import PatchSet

__all__ = ["watch_aliases"]

_CLOCK = tuple(name for name in CLOCK_FUNCTIONS if name != "sleep")
"""The ``time`` functions that always read a clock (``sleep`` reads nothing: an alias of it only waits)."""


def _today_reads_time_time() -> bool:
    """Whether ``date.today`` of C reads the clock through the ``time`` module's ``time`` (CPython 3.11 does).

    The boundaries patch that name, so such a ``today`` is recorded and served however it was bound. Tried once,
    at import, with ``time.time`` swapped for a moment for one that notes the call and reads the clock.
    """
    real, called = time.time, []

    def noting() -> float:
        called.append(True)
        return real()

    time.time = noting
    try:
        _dt.date.today()
    finally:
        time.time = real
    return bool(called)


def _originals() -> dict[Any, str]:
    """The original C clock and entropy functions, taken at import (before any patch), by what they are."""
    found: dict[Any, str] = {}
    for name in _CLOCK:
        if hasattr(time, name):  # thread_time and clock_gettime are not on every platform
            found[getattr(time, name)] = f"clock time.{name}"
    # A classmethod of C: each access makes a new bound method, equal to any other bound to the same class.
    for name in ("now", "utcnow"):
        found[getattr(_dt.datetime, name)] = f"clock datetime.{name}"
    if not _today_reads_time_time():  # else an alias of ``today`` is recorded and served: not a leak
        found[_dt.date.today] = "clock date.today"
        found[_dt.datetime.today] = "clock datetime.today"
    found[os.urandom] = "entropy os.urandom"
    generate = getattr(uuid, "_generate_time_safe", None)
    if generate is not None:
        found[generate] = "clock uuid.uuid1"  # uuid1 reads its time from C when libuuid has it
    return found


_ORIGINALS = _originals()
_PASSED_OVER = frozenset({"random", "uuid", "secrets", "otel_replay.rerun.boundaries", "wrapt", "wrapt.wrappers"})
"""Modules whose frames are the read's own machinery, not its caller: the function the agent called (uuid4,
``Random.randint``, a secrets function) and the boundary wrapper between a patched name and the original."""


class _Watch:
    """What one rerun watches: the functions (by equality) and where a read the agent made is reported."""

    def __init__(self, leaks_to: Callable[[], Any]) -> None:
        self.leaks_to = leaks_to
        self.targets: dict[Any, str] = dict(_ORIGINALS)
        self.active = True
        shared = random._inst
        self._draws_of(shared, "random")  # the module's own generator, behind an alias of its functions

    def _draws_of(self, generator: random.Random, label: str) -> None:
        for name in ("random", "getrandbits"):
            self.targets[getattr(generator, name)] = f"entropy {label}.{name}"

    def seeded(self, generator: random.Random, from_os: bool) -> None:
        """``generator`` was seeded: from the OS (its draws are watched) or from a given value (they are not)."""
        if generator is random._inst:  # served or not, its alias is always live
            return
        if from_os:
            self._draws_of(generator, "random.Random()")
        else:
            for name in ("random", "getrandbits"):
                self.targets.pop(getattr(generator, name), None)

    def report(self, frame: FrameType, function: Any) -> None:
        """An original was called from ``frame``: a leak when the first frame past its machinery is the agent's."""
        if INSIDE.get():  # the rerun itself runs the original (a read it does not hold, run live and reported)
            return
        what = self.targets.get(function)
        entered = ""
        caller: FrameType | None = frame
        while caller is not None:
            module = caller.f_globals.get("__name__")
            if not isinstance(module, str) or module not in _PASSED_OVER:
                break
            if not module.startswith(("otel_replay", "wrapt")):
                entered = f"{module}.{caller.f_code.co_qualname}"
            caller = caller.f_back
        if caller is None or what is None:
            return
        module = caller.f_globals.get("__name__")
        if not isinstance(module, str) or not agent_module(module):
            return
        leak = getattr(self.leaks_to(), "leak", None)
        if leak is None:
            return
        through = f" through {entered}" if entered and not what.endswith(entered) else ""
        if what.startswith("entropy random.Random()"):
            why = "a generator seeded from the OS"
        elif entered.startswith("random.SystemRandom"):
            why = "a generator that reads the OS"
        else:
            why = "a reference taken before the boundaries patched it"
        leak(f"{what} read live{through} by {module}:{caller.f_code.co_qualname} ({why})")


def _hook(watch: _Watch, previous: Callable[..., Any] | None) -> Callable[[FrameType, str, Any], None]:
    """A profile function for one thread: reports reads of the originals, then calls ``previous``."""
    targets = watch.targets
    setprofile = sys.setprofile

    if previous is None:

        def hook(frame: FrameType, event: str, arg: Any) -> None:
            if event == "c_call":
                if arg in targets:
                    watch.report(frame, arg)
                elif not watch.active:  # a thread that outlived the rerun: take the hook off
                    setprofile(None)

        return hook

    def chained(frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call":
            if arg in targets:
                watch.report(frame, arg)
            elif not watch.active:
                setprofile(previous)
        previous(frame, event, arg)

    return chained


def _seeding(watch: _Watch) -> Callable[..., Any]:
    """Wrapper of ``random.Random.seed``: a generator seeded with ``None`` is seeded from the OS."""

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = wrapped(*args, **kwargs)
        seed = args[0] if args else kwargs.get("a")
        if isinstance(instance, random.Random) and not isinstance(instance, random.SystemRandom):
            watch.seeded(instance, seed is None)
        return result

    return wrapper


def _chainable(previous: Any) -> bool:
    """Whether a profile function already set can be called from ours (cProfile's C profiler cannot)."""
    return previous is None or (callable(previous) and type(previous).__module__ != "_lsprof")


def watch_aliases(patches: PatchSet, leaks_to: Callable[[], Any]) -> bool:
    """Watch the current thread, and threads started from now on, until ``patches`` are removed.

    A read is reported to ``leaks_to()``'s ``leak`` method (the rerun's mode).

    Returns False (nothing watched) when the current thread runs a profiler of C that cannot be chained
    (``cProfile``): it is left running, and the caller says so.
    """
    previous = sys.getprofile()
    previous_threads = threading.getprofile()
    if not _chainable(previous) or not _chainable(previous_threads):
        return False
    watch = _Watch(leaks_to)
    patches.wrap(random.Random, "seed", _seeding(watch))
    patches.wrap(random.Random, "setstate", _restoring(watch))

    def stop() -> None:
        watch.active = False
        watch.targets.clear()
        sys.setprofile(previous)
        threading.setprofile(previous_threads)

    patches.call_on_remove(stop)
    threading.setprofile(_hook(watch, previous_threads))
    sys.setprofile(_hook(watch, previous))
    return True


def _restoring(watch: _Watch) -> Callable[..., Any]:
    """Wrapper of ``random.Random.setstate``: a state given back is deterministic."""

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = wrapped(*args, **kwargs)
        if isinstance(instance, random.Random):
            watch.seeded(instance, from_os=False)
        return result

    return wrapper
