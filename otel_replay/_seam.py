"""The one seam every boundary wrapper calls through.

Each instrumented boundary (a model call, a tool call, an HTTP request, a clock
read, an entropy draw) is wrapped once, with wrapt, and the wrapper hands the
call to :func:`through`. With no mode installed the call simply runs (the
instrumentation's spans are the only effect). The rerun package installs a
:class:`Mode` that records each call's result in record mode and serves the
recorded result back in rerun mode, so the same wrapper records in one run and
replays in the other.

A mode is installed for the whole process (:func:`install`) and may be
overridden for one context (:func:`active`); the fast path when nothing is
installed is one global read and one context-variable lookup.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

BOUNDARIES = ("model", "tool", "http", "clock", "entropy")


@dataclass(frozen=True)
class Call:
    """One crossing of a boundary: what is about to be called, with what."""

    boundary: str
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


class Mode(Protocol):
    """What happens at the seam: pass through, record, or serve a recorded value."""

    def around(self, call: Call, invoke: Callable[[], T]) -> T:
        """Return the call's result, calling ``invoke`` to run it for real (or not)."""
        ...


_process_mode: Mode | None = None
_context_mode: ContextVar[Mode | None] = ContextVar("otel_replay_seam_mode", default=None)


def current() -> Mode | None:
    """The mode in force here: the context's override, else the process-wide one."""
    return _context_mode.get() or _process_mode


def through(call: Call, invoke: Callable[[], T]) -> T:
    """Run one boundary crossing through the mode in force (or directly if none)."""
    mode = _context_mode.get() or _process_mode
    if mode is None:
        return invoke()
    return mode.around(call, invoke)


async def through_async(call: Call, invoke: Callable[[], Awaitable[T]]) -> T:
    """The awaitable form of :func:`through`, for async clients.

    A mode with an ``around_async(call, invoke)`` coroutine method is awaited
    through it; otherwise the mode's ``around`` is used, and its result
    awaited when it is awaitable (``around`` handed ``invoke`` through, so it
    returned the call's coroutine) or returned as is (a served value).
    """
    mode = _context_mode.get() or _process_mode
    if mode is None:
        return await invoke()
    around_async = getattr(mode, "around_async", None)
    if around_async is not None:
        result: T = await around_async(call, invoke)
        return result
    value: Any = mode.around(call, invoke)
    if inspect.isawaitable(value):
        return await value
    return value


def install(mode: Mode | None) -> Mode | None:
    """Install ``mode`` for the whole process (``None`` removes it); returns the previous one."""
    global _process_mode
    previous, _process_mode = _process_mode, mode
    return previous


class _Direct:
    """A mode that runs every call for real and records nothing."""

    def around(self, call: Call, invoke: Callable[[], T]) -> T:
        """Run the call."""
        return invoke()


DIRECT: Mode = _Direct()
"""For otel-replay's own background work (a lease's renewals on a thread of its own): its calls are never an
agent's, so a recording must not take them in, nor a rerun serve them, whenever their timing puts them."""


@contextmanager
def active(mode: Mode) -> Iterator[Mode]:
    """Use ``mode`` for calls made in this context (and tasks it starts)."""
    token = _context_mode.set(mode)
    try:
        yield mode
    finally:
        _context_mode.reset(token)


# --- the rules a boundary call is compared by ------------------------------------------------------------
ARGUMENTS_CODEC = 4
"""The argument and value encoding new recordings use (1: unknown objects named by type only; 2: values
compared by value; 3: also the rules of a rerun whose "matched" means the same actions in the same order,
see :func:`otel_replay.rerun.codec.codec_of_format`; 4: also the default values of the parameters a tool
call left out). Kept here, below instrumentation and rerun, because a tool wrapper decides what of a call
is compared under the codec in force, and record and rerun set it."""

_codec = ARGUMENTS_CODEC
"""The codec in force now: process-wide, as one recording or rerun runs at a time."""


def current_codec() -> int:
    """The codec (and matching rules) in force now: a rerun of an older recording uses that recording's."""
    return _codec


@contextmanager
def arguments_codec(version: int) -> Iterator[None]:
    """Hash and compare arguments and values with codec ``version`` inside (a rerun of an older recording)."""
    global _codec
    previous, _codec = _codec, version
    try:
        yield
    finally:
        _codec = previous
