"""Leak guards of a rerun: file access, DNS lookups and socket connections made by the agent's code.

Installed only while a rerun runs. A call is the agent's when the first frame
above it that is not the standard library's belongs to the agent (see
:mod:`otel_replay.rerun.callers`); imports never pass through ``open`` and
are not seen. A call made inside a boundary the rerun runs live (a relaxed
fallback) or by an exporter (OpenTelemetry's suppression flag with an export on
the stack: see :func:`~otel_replay.rerun.callers.exporters_traffic`) is allowed;
the agent's own calls under ``suppress_instrumentation()`` are still guarded.
"""

from __future__ import annotations

import builtins
import io
import socket
import sys
from typing import Any

from otel_replay.instrumentation import _seam
from otel_replay.rerun.callers import INSIDE, agent_module, exporters_traffic
from otel_replay.rerun.patching import PatchSet, Wrapper

__all__ = ["install_guards"]

_STDLIB = frozenset(sys.stdlib_module_names)


def _agent_caller() -> bool:
    frame = sys._getframe(2)
    for _ in range(12):
        if frame is None:
            return False
        module = frame.f_globals.get("__name__", "")
        if module.partition(".")[0] not in _STDLIB:
            return agent_module(module)
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _guard(what: str) -> Wrapper:
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not INSIDE.get() and _agent_caller() and not exporters_traffic():
            mode = _seam.current()
            leak = getattr(mode, "leak", None)
            if leak is not None:
                target = args[0] if args else kwargs.get("file", kwargs.get("host", "?"))
                leak(f"{what} {target!r}")
        return wrapped(*args, **kwargs)

    return wrapper


def install_guards(patches: PatchSet) -> None:
    """Guard ``open``, ``socket.getaddrinfo`` and socket connections into ``patches``."""
    opener = _guard("file open")
    patches.wrap(builtins, "open", opener)
    patches.replace(io, "open", builtins.open, original=io.open)
    patches.wrap(socket, "getaddrinfo", _guard("DNS lookup"))
    patches.wrap(socket.socket, "connect", _guard("socket connect"))
    patches.wrap(socket.socket, "connect_ex", _guard("socket connect"))
