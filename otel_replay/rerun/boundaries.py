"""The clock and entropy boundaries: wrapt wrappers that go through the one seam.

Patched, while a recording or a rerun is active, by module attribute:

* clock: ``time.time``, ``time.time_ns``, ``time.monotonic``, ``time.monotonic_ns``,
  ``time.perf_counter``, ``time.perf_counter_ns``, ``time.process_time(_ns)``,
  ``time.thread_time(_ns)``, ``time.clock_gettime(_ns)``, ``time.sleep`` (a rerun does not
  wait); ``time.localtime``, ``gmtime``, ``ctime``, ``asctime`` and ``strftime`` when not given
  a time (the current time they read is recorded, as ``time.time()`` would return it, and what they make of it
  is made again); ``datetime.datetime.now`` / ``utcnow`` / ``today`` and ``datetime.date.today``
  (the ``datetime.datetime`` and ``datetime.date`` names are swapped for subclasses
  whose ``isinstance`` checks still accept every real instance);
* entropy: the ``random`` module's functions (every ``*variate`` too), ``uuid.uuid4``, ``uuid.uuid1``,
  ``os.urandom`` and the ``secrets`` functions.

Sequence functions (``choice``, ``choices``, ``sample``, ``shuffle``) record the
*indices* they drew, never the elements, so any object can be chosen; the
draw consumes the generator exactly as the original function would (the
population passed by keyword, ``sample(counts=...)`` and ``choices(weights=...)``
included). An agent's draw that still reaches the real generator in a rerun is
reported as a leak.
"""

from __future__ import annotations

import datetime as _dt
import os
import random
import secrets
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from otel_replay import _seam
from otel_replay._seam import through
from otel_replay.rerun.callers import INSIDE, agent_module
from otel_replay.rerun.codec import (
    ARGUMENTS_CODEC,
    current_codec,
    decode_value,
    encode_value,
    stable_json,
    stable_json_in,
)
from otel_replay.rerun.events import BoundaryCall, stream_key
from otel_replay.rerun.patching import PatchSet, Wrapper

__all__ = ["CLOCK_FUNCTIONS", "ENTROPY_FUNCTIONS", "install_clock_and_entropy"]

CLOCK_FUNCTIONS = (
    "time",
    "time_ns",
    "monotonic",
    "monotonic_ns",
    "perf_counter",
    "perf_counter_ns",
    "process_time",
    "process_time_ns",
    "thread_time",
    "thread_time_ns",
    "clock_gettime",
    "clock_gettime_ns",
    "sleep",
)
CURRENT_TIME_FUNCTIONS = {"localtime": 0, "gmtime": 0, "ctime": 0, "asctime": 0, "strftime": 1}
"""``time`` functions that read the clock when not given a time: name -> the position of that argument."""
RANDOM_FUNCTIONS = (
    "random",
    "uniform",
    "randint",
    "randrange",
    "getrandbits",
    "gauss",
    "normalvariate",
    "expovariate",
    "triangular",
    "betavariate",
    "lognormvariate",
    "gammavariate",
    "paretovariate",
    "weibullvariate",
    "vonmisesvariate",
    *(("binomialvariate",) if hasattr(random, "binomialvariate") else ()),  # Python 3.12+
    "randbytes",
    "seed",
)
SECRETS_FUNCTIONS = ("token_bytes", "token_hex", "token_urlsafe", "randbelow", "randbits")
ENTROPY_FUNCTIONS = (
    *(f"random.{n}" for n in (*RANDOM_FUNCTIONS, "choice", "choices", "sample", "shuffle")),
    "uuid.uuid4",
    "uuid.uuid1",
    "os.urandom",
    *(f"secrets.{n}" for n in (*SECRETS_FUNCTIONS, "choice")),
)


def _cross(boundary: str, name: str, depth: int, arguments: Any, invoke: Callable[[], Any]) -> Any | None:
    """Send one agent call through the seam; ``None`` marks 'not the agent's call, run it directly'."""
    frame = sys._getframe(depth + 1)
    module = frame.f_globals.get("__name__", "")
    if not agent_module(module):
        return _DIRECT
    return _through(boundary, name, f"{module}:{frame.f_code.co_qualname}", arguments, invoke)


def _through(boundary: str, name: str, who: str, arguments: Any, invoke: Callable[[], Any]) -> Any:
    """Send the call of consumer ``who`` (``module:qualname``) through the seam."""
    # A read with no arguments (``time.time()``, ``random.random()``: most of an agent's reads) has one text
    # per codec, written once rather than walked for each read.
    text = _NO_ARGUMENTS_TEXT.get(current_codec()) if arguments is _NO_ARGUMENTS else None
    if text is None:
        text = stable_json(arguments)
    call = BoundaryCall(boundary, name, stream=stream_key(boundary, name, who), arguments_text=text)
    return through(call, invoke)


_DIRECT: Any = object()
_NO_ARGUMENTS: list[Any] = [(), {}]
"""The ``[args, kwargs]`` of a call made with none (passed as this very object)."""
_NO_ARGUMENTS_TEXT = {codec: stable_json_in(codec, [(), {}]) for codec in range(1, ARGUMENTS_CODEC + 1)}
"""Its :func:`stable_json` text under each codec."""


_REAL_TIME = time.time
_REAL_LOCALTIME = time.localtime


def _current_time(name: str, position: int) -> Wrapper:
    """A ``time`` function that reads the clock unless given a time: that read is the agent's ``time.time()``."""
    takes_struct = name in ("time.asctime", "time.strftime")

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if INSIDE.get() or kwargs or len(args) != position:
            return wrapped(*args, **kwargs)  # given its time (or a bad call, which raises as it would)
        frame = sys._getframe(1)
        module = frame.f_globals.get("__name__", "")
        if not agent_module(module):
            return wrapped(*args, **kwargs)
        who = f"{module}:{frame.f_code.co_qualname}"
        now = decode_value(_through("clock", name, who, _NO_ARGUMENTS, lambda: encode_value(_REAL_TIME())))
        given = _REAL_LOCALTIME(now) if takes_struct else now  # as they read the local time themselves
        return wrapped(*args, given)

    return wrapper


def _plain(boundary: str, name: str) -> Wrapper:
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if INSIDE.get():
            return wrapped(*args, **kwargs)
        # Whose call it is, first: a library's read (a cookie jar's, a client's timer: most reads in a
        # rerun) runs directly, before anything is built for the seam.
        frame = sys._getframe(1)
        module = frame.f_globals.get("__name__", "")
        if not agent_module(module):
            return wrapped(*args, **kwargs)
        who = f"{module}:{frame.f_code.co_qualname}"
        return decode_value(
            _through(
                boundary,
                name,
                who,
                [args, kwargs] if args or kwargs else _NO_ARGUMENTS,
                lambda: encode_value(wrapped(*args, **kwargs)),
            )
        )

    return wrapper


_POPULATION = {"choice": "seq", "choices": "population", "sample": "population", "shuffle": "x"}
"""The keyword each sequence function takes its population by."""


def _leaked(name: str) -> None:
    """An agent's draw that went to the real generator: in a rerun, a leak (a strict rerun refuses it)."""
    leak = getattr(_seam.current(), "leak", None)
    if leak is not None:
        leak(f"entropy {name} drawn unrecorded")


def _indexed(name: str, kind: str) -> Wrapper:
    """``choice``/``choices``/``sample``/``shuffle``: record the indices drawn, return the elements."""

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if INSIDE.get():
            return wrapped(*args, **kwargs)
        keyword = _POPULATION[kind]
        if args:
            population, rest, options = args[0], args[1:], kwargs
        elif keyword in kwargs:
            options = dict(kwargs)
            population, rest = options.pop(keyword), ()
        else:
            return wrapped(*args, **kwargs)  # no population: the call raises TypeError, nothing is drawn
        try:
            size = len(population)
            if not hasattr(population, "__getitem__"):  # a set: the real call refuses it (TypeError)
                raise TypeError
        except TypeError:
            drawn = wrapped(*args, **kwargs)  # raises for every population without a length ...
            if agent_module(sys._getframe(1).f_globals.get("__name__", "")):
                _leaked(name)  # ... but if it drew anyway, the draw is not in the recording
            return drawn
        rng = getattr(wrapped, "__self__", None)

        def draw() -> Any:
            if kind == "choice":
                if not size:
                    raise IndexError("Cannot choose from an empty sequence")
                assert rng is not None
                return rng._randbelow(size)
            if kind == "shuffle":
                order = list(range(size))
                wrapped(order, *rest, **options)
                return order
            # Drawn over the indices, with the same options (counts=, weights=, k=): the generator is
            # consumed exactly as by the call on the population itself.
            return wrapped(range(size), *rest, **options)

        arguments = [size, [a for a in rest if not callable(a)], options]
        value = _cross("entropy", name, 1, arguments, lambda: encode_value(draw()))
        if value is _DIRECT:
            return wrapped(*args, **kwargs)
        picked = decode_value(value)
        if kind == "choice":
            return population[picked]
        if kind == "shuffle":
            before = list(population)
            population[:] = [before[i] for i in picked]
            return None
        return [population[i] for i in picked]

    return wrapper


class _InstanceOfReal(type):
    """Metaclass: ``isinstance(x, ReplayDatetime)`` is ``isinstance(x, real datetime)``."""

    _real: type

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, cls._real)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls._real)


_REAL_DATETIME = _dt.datetime
_REAL_DATE = _dt.date


def _now(name: str, tz: Any, real: Callable[[], Any], parse: Callable[[str], Any]) -> Any:
    if INSIDE.get():
        return real()
    value = _cross("clock", name, 2, [repr(tz)] if tz is not None else [], lambda: real().isoformat())
    if value is _DIRECT:
        return real()
    result = parse(str(value))
    return result.astimezone(tz) if tz is not None else result


class ReplayDatetime(_REAL_DATETIME, metaclass=_InstanceOfReal):
    """Stands in for ``datetime.datetime`` while recording or rerunning; returns real datetimes."""

    _real = _REAL_DATETIME

    def __new__(cls, *args: Any, **kwargs: Any) -> _dt.datetime:  # type: ignore[misc]
        """Constructors (and ``fromtimestamp``, ``strptime`` ...) build real datetimes, never this stand-in."""
        return _REAL_DATETIME(*args, **kwargs)

    @classmethod
    def now(cls, tz: _dt.tzinfo | None = None) -> _dt.datetime:  # type: ignore[override]
        """The (recorded) current time."""
        return _now("datetime.now", tz, lambda: _REAL_DATETIME.now(tz), _REAL_DATETIME.fromisoformat)

    @classmethod
    def utcnow(cls) -> _dt.datetime:  # type: ignore[override]
        """The (recorded) current UTC time, naive."""
        return _now("datetime.utcnow", None, _REAL_DATETIME.utcnow, _REAL_DATETIME.fromisoformat)

    @classmethod
    def today(cls) -> _dt.datetime:  # type: ignore[override]
        """The (recorded) local time, naive."""
        return _now("datetime.today", None, _REAL_DATETIME.today, _REAL_DATETIME.fromisoformat)


class ReplayDate(_REAL_DATE, metaclass=_InstanceOfReal):
    """Stands in for ``datetime.date`` while recording or rerunning; returns real dates."""

    _real = _REAL_DATE

    def __new__(cls, *args: Any, **kwargs: Any) -> _dt.date:  # type: ignore[misc]
        """Constructors build real dates, never this stand-in."""
        return _REAL_DATE(*args, **kwargs)

    @classmethod
    def today(cls) -> _dt.date:  # type: ignore[override]
        """The (recorded) local date."""
        return _now("date.today", None, _REAL_DATE.today, _REAL_DATE.fromisoformat)


def install_clock_and_entropy(patches: PatchSet) -> None:
    """Wrap every clock and entropy function (see the module docstring) into ``patches``."""
    for fn in CLOCK_FUNCTIONS:
        if hasattr(time, fn):  # thread_time and clock_gettime are not on every platform
            patches.wrap(time, fn, _plain("clock", f"time.{fn}"))
    for fn, position in CURRENT_TIME_FUNCTIONS.items():
        patches.wrap(time, fn, _current_time(f"time.{fn}", position))
    patches.replace(_dt, "datetime", ReplayDatetime)
    patches.replace(_dt, "date", ReplayDate)
    for fn in RANDOM_FUNCTIONS:
        patches.wrap(random, fn, _plain("entropy", f"random.{fn}"))
    for fn in ("choice", "choices", "sample", "shuffle"):
        patches.wrap(random, fn, _indexed(f"random.{fn}", fn))
    patches.wrap(uuid, "uuid4", _plain("entropy", "uuid.uuid4"))
    patches.wrap(uuid, "uuid1", _plain("entropy", "uuid.uuid1"))
    patches.wrap(os, "urandom", _plain("entropy", "os.urandom"))
    for fn in SECRETS_FUNCTIONS:
        patches.wrap(secrets, fn, _plain("entropy", f"secrets.{fn}"))
    patches.wrap(secrets, "choice", _indexed("secrets.choice", "choice"))
