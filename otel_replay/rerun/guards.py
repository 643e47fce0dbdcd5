"""Leak guards of a rerun: nothing leaves the process unless the user allowed it.

One audit hook (:func:`sys.addaudithook`) per process, added at the first
rerun and a no-op (one global read) whenever no rerun is active: audit hooks
cannot be removed. While a rerun runs it sees every network connection
(``socket.connect``, UDP ``sendto``/``sendmsg``), DNS lookup and process
start (``subprocess``, ``os.system``, ``os.exec*``, ``os.posix_spawn``,
``os.spawn*``, ``os.fork``, and ``multiprocessing`` children of every start
method, which raise no audit event of their own when spawned: their start is
patched for the rerun) made from Python, at any depth and on any thread
(the agent's own, its pools', the event loop's resolver), whichever library
makes it: urllib, http.client, aiohttp, raw sockets. Each is a leak, and
refused in both governance levels (a :class:`DeterminismLeakError` raised where
the call was made), unless it is

- telemetry export traffic (:func:`~otel_replay.rerun.callers.exporters_traffic`),
- made inside a boundary the rerun runs live on purpose (``INSIDE``), or
- a connection or lookup of a ``host:port`` the user allowed (``allow_live``;
  the addresses an allowed name resolves to are allowed with it). It runs live,
  is not a leak, and the result lists it under ``live``.

File opens are attributed by module, as clock reads are: only the agent's own
count (the first frame that is not the standard library's belongs to the
agent; see :mod:`otel_replay.rerun.callers`), with no depth limit. Reading a
file of the standard library or of an installed package (``site-packages``,
a ``dist-info/METADATA``), the import system loading code and ``linecache``
reading source for a traceback are not leaks. A relaxed rerun reports a file
open; a strict one refuses it.

The same install starts the alias watch (:mod:`otel_replay.rerun.aliases`): a clock or entropy function the
agent bound before the rerun began, read live, is a leak too (reported; strict refuses it).

Not seen: C code with sockets or processes of its own (gRPC's core, libcurl,
database drivers in C), which never passes through Python's audit events, and
code that took its own reference to ``_posixsubprocess.fork_exec`` before the
rerun began and calls it directly (that call raises no audit event).
"""

from __future__ import annotations

import ipaddress
import multiprocessing
import multiprocessing.process
import os
import re
import site
import socket
import sys
import sysconfig
import threading
from collections.abc import Iterable, Sequence
from types import FrameType
from typing import Any, Protocol

try:
    import _posixsubprocess
except ImportError:  # pragma: no cover - Windows has no fork_exec
    _posixsubprocess = None  # type: ignore[assignment]

from otel_replay import _seam
from otel_replay.errors import ConfigError
from otel_replay.redaction import redact
from otel_replay.rerun.aliases import watch_aliases
from otel_replay.rerun.callers import INSIDE, agent_module, exporters_traffic
from otel_replay.rerun.patching import PatchSet

__all__ = ["LiveAllowList", "install_guards", "parse_allow_live"]

_NETWORK = "network"
_DNS = "dns"
_PROCESS = "process"
_FILE = "file"
_WORLD = "world"
_MP_START = "otel_replay.multiprocessing.start"
_FORK_EXEC = "otel_replay._posixsubprocess.fork_exec"
_EVENTS = {
    "socket.connect": _NETWORK,
    "socket.sendto": _NETWORK,
    "socket.sendmsg": _NETWORK,
    "socket.getaddrinfo": _DNS,
    "socket.gethostbyname": _DNS,
    "socket.gethostbyaddr": _DNS,
    "socket.getnameinfo": _DNS,
    "subprocess.Popen": _PROCESS,
    "os.system": _PROCESS,
    "os.exec": _PROCESS,
    "os.posix_spawn": _PROCESS,
    "os.spawn": _PROCESS,
    "os.fork": _PROCESS,
    "os.forkpty": _PROCESS,
    "pty.spawn": _PROCESS,
    # Not audit events: raised by the patches on multiprocessing's Process.start and _posixsubprocess.fork_exec
    # (what multiprocessing's spawn and forkserver start methods call, with no audit event in CPython).
    _MP_START: _PROCESS,
    _FORK_EXEC: _PROCESS,
    "open": _FILE,
    # Changes to the world outside the process that need no open file: followed like file access (reported;
    # strict refuses), and any of them means the rerun is not matched.
    "os.remove": _WORLD,
    "os.rmdir": _WORLD,
    "os.rename": _WORLD,
    "os.truncate": _WORLD,
    "os.chmod": _WORLD,
    "os.link": _WORLD,
    "os.symlink": _WORLD,
    "shutil.rmtree": _WORLD,
    "os.kill": _WORLD,
    "os.killpg": _WORLD,
    "sqlite3.connect": _WORLD,
}
"""The audit events guarded, by kind."""

_CODE_READERS = frozenset(
    {
        "_frozen_importlib",
        "_frozen_importlib_external",
        "importlib._bootstrap",
        "importlib._bootstrap_external",
        "zipimport",
        "linecache",
    }
)
"""Standard-library modules whose file reads load code (imports, source lines of a traceback), not data."""
_STDLIB = frozenset(sys.stdlib_module_names) - {"__main__"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


class _Leaks(Protocol):
    def leak(self, what: str, *, refuse: bool = False) -> None: ...


# --- allow_live ------------------------------------------------------------------------------
_HOST_NAME = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9_-]{1,63}(?<!-))*\.?")


def _entry(entry: Any) -> tuple[str, int | None]:
    if not isinstance(entry, str):
        raise ConfigError(f"allow_live entry {entry!r} must be a 'host:port' string, not {type(entry).__name__}")
    shown = entry if len(entry) <= 100 else entry[:100] + "…"
    if not entry.isprintable() or any(c.isspace() for c in entry):
        raise ConfigError(f"allow_live entry {shown!r} holds a space or control character")
    host, sep, port = entry.rpartition(":")
    if not sep or not host or not port:
        raise ConfigError(f"allow_live entry {shown!r} must look like 'host:port' or 'host:*'")
    if host.startswith("[") and host.endswith("]"):
        try:
            host = str(ipaddress.IPv6Address(host[1:-1]))
        except ValueError:
            raise ConfigError(f"allow_live entry {shown!r}: {host} is not an IPv6 address") from None
    elif ":" in host:
        raise ConfigError(f"allow_live entry {shown!r}: write an IPv6 address in brackets, as '[::1]:443'")
    elif len(host) > 253 or not _HOST_NAME.fullmatch(host):
        raise ConfigError(f"allow_live entry {shown!r}: the host is not a host name or IP address")
    if port == "*":
        return host.lower().rstrip("."), None
    if not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"allow_live entry {shown!r}: the port must be 1-65535 or '*'")
    return host.lower().rstrip("."), int(port)


def parse_allow_live(entries: Iterable[str] | str | None) -> LiveAllowList:
    """Validate ``allow_live`` entries (``"host:port"``, ``"host:*"``, ``"[::1]:443"``) into an allow-list.

    Raises:
        ConfigError: an entry is not one of those forms (the message names it).

    """
    if entries is None:
        return LiveAllowList(())
    if isinstance(entries, str):  # one entry, not its characters
        entries = [entries]
    return LiveAllowList(tuple(_entry(entry) for entry in entries))


class LiveAllowList:
    """The ``host:port`` pairs a rerun may reach live (hosts compared case-insensitively, exactly).

    ``host`` matches the host a call names: a DNS name (no wildcards: ``api.internal``
    does not allow ``x.api.internal``) or an IP address; ``port`` is exact, or ``*``
    for any. A name allowed here also allows the addresses it resolves to during the rerun,
    so a library that looks the name up and then connects to the address is let through.
    """

    def __init__(self, entries: Sequence[tuple[str, int | None]]) -> None:
        """Hold the validated ``(host, port or None for any)`` entries."""
        self.entries = tuple(entries)
        self._resolved: set[tuple[str, int]] = set()

    def __bool__(self) -> bool:
        return bool(self.entries)

    def allows(self, host: Any, port: Any) -> bool:
        """Whether a call to ``host`` (a name or address) on ``port`` is allowed."""
        if isinstance(host, bytes):
            host = host.decode("ascii", "replace")
        if not isinstance(host, str) or not self.entries:
            return False
        name = host.lower().rstrip(".")
        number = _port(port)
        if number is None:  # a lookup of the name alone (no port yet): any entry of the host allows it
            return port is None and any(name == h for h, _ in self.entries)
        if (name, number) in self._resolved:
            return True
        return any(name == h and (p is None or p == number) for h, p in self.entries)

    def remember(self, resolved: Any) -> None:
        """Addresses an allowed name resolved to (``getaddrinfo``'s result) are allowed too."""
        for item in resolved if isinstance(resolved, list) else ():
            sockaddr = item[4] if isinstance(item, tuple) and len(item) == 5 else None
            if isinstance(sockaddr, tuple) and len(sockaddr) >= 2 and isinstance(sockaddr[0], str):
                self._resolved.add((sockaddr[0].lower(), int(sockaddr[1])))


def _port(port: Any) -> int | None:
    if isinstance(port, bytes):
        port = port.decode("ascii", "replace")
    if isinstance(port, str):
        port = {"http": 80, "https": 443}.get(port.lower(), port)
        port = int(port) if isinstance(port, str) and port.isascii() and port.isdigit() else None
    return port if isinstance(port, int) and not isinstance(port, bool) else None


# --- the hook ---------------------------------------------------------------------------------
class _Guard:
    """What the hook checks against while one rerun is active."""

    def __init__(self, mode: _Leaks | None, allow: LiveAllowList) -> None:
        self.mode = mode
        self.allow = allow
        self.busy = threading.local()
        self.thread = threading.get_ident()

    def leaks_to(self) -> Any:
        return self.mode if self.mode is not None else _seam.current()

    def check(self, kind: str, event: str, args: tuple[Any, ...]) -> None:
        if INSIDE.get():
            return
        if kind == _FILE:
            self._file(args)
            return
        if kind == _WORLD:
            self._world(event, args)
            return
        if kind == _NETWORK or kind == _DNS:
            what, host, port = _network(event, args)
            if host is not None and self.allow.allows(host, port):
                self._live(what)
                return
        else:
            what = _process(event, args)
            if _machine_probe(sys._getframe(2)):
                return
        if exporters_traffic():
            return
        self._leak(what, refuse=True)

    def _file(self, args: tuple[Any, ...]) -> None:
        path, mode, flags = (tuple(args) + (None, None, None))[:3]
        if isinstance(path, int) or path is None:  # an open file descriptor: nothing new is reached
            return
        try:
            name = os.fsdecode(path)
        except (TypeError, ValueError):
            name = repr(path)
        reading = _read_only(mode, flags)
        if reading and _package_file(name):
            return
        if not _agents(sys._getframe(3)) or exporters_traffic():
            return
        self._leak(f"file open {name!r}", refuse=False)

    def _world(self, event: str, args: tuple[Any, ...]) -> None:
        """A file removed, renamed or changed, a signal sent, a database opened: followed as file access is."""
        target = args[0] if args else None
        if event == "sqlite3.connect" and target in (":memory:", b":memory:", ""):
            return  # a database that lives in the process
        if not _agents(sys._getframe(3)) or exporters_traffic():
            return
        shown = os.fsdecode(target) if isinstance(target, bytes) else target
        self._leak(f"{event} {shown!r}", refuse=False)

    def _live(self, what: str) -> None:
        mode = self.leaks_to()
        ran_live = getattr(mode, "ran_live", None)
        if ran_live is not None:
            ran_live(what)

    def _leak(self, what: str, *, refuse: bool) -> None:
        mode = self.leaks_to()
        leak = getattr(mode, "leak", None)
        if leak is not None:
            shown = what if len(what) <= 300 else what[:299] + "…"
            if threading.get_ident() != self.thread:  # say where: the agent's pool, or a thread it never started
                shown += f" on thread {threading.current_thread().name[:80]!r}"
            leak(redact(shown), refuse=refuse)


def _network(event: str, args: tuple[Any, ...]) -> tuple[str, Any, Any]:
    """(what to report, host, port) of a network or DNS event."""
    if event in ("socket.connect", "socket.sendto", "socket.sendmsg"):
        address = args[1] if len(args) > 1 else None
        label = "socket connect" if event == "socket.connect" else "UDP send to"
        if isinstance(address, tuple) and len(address) >= 2:
            return f"{label} {address[:2]!r}", address[0], address[1]
        return f"{label} {address!r}", None, None
    if event == "socket.getaddrinfo":
        return f"DNS lookup {args[0]!r}" + (f" port {args[1]!r}" if args[1] is not None else ""), args[0], args[1]
    if event == "socket.getnameinfo":
        sockaddr = args[0] if args else None
        if isinstance(sockaddr, tuple) and len(sockaddr) >= 2:
            return f"DNS lookup of address {sockaddr[:2]!r}", sockaddr[0], sockaddr[1]
        return f"DNS lookup of address {sockaddr!r}", None, None
    return f"DNS lookup {args[0]!r}" if args else "DNS lookup", args[0] if args else None, None


def _process(event: str, args: tuple[Any, ...]) -> str:
    if event == "subprocess.Popen":
        return f"subprocess {args[1]!r}" if len(args) > 1 else "subprocess"
    if event == "os.system":
        return f"os.system {_text(args[0])!r}" if args else "os.system"
    if event in ("os.exec", "os.posix_spawn"):
        return f"{event} {args[1]!r}" if len(args) > 1 else event
    if event == _MP_START:
        return f"multiprocessing process start ({args[0]})" if args else "multiprocessing process start"
    if event == _FORK_EXEC:
        return f"process start {args[0]!r}" if args else "process start"
    if event == "os.spawn":
        return f"os.spawn {args[2]!r}" if len(args) > 2 else event
    return f"{event} (a child process)"


_PROBES = frozenset({"platform", "uuid", "ctypes.util"})
"""Standard-library modules that start a process only to ask about this machine (``uname -p``, ``ldconfig``)."""


def _machine_probe(frame: FrameType | None) -> bool:
    """Whether the process is started by the standard library asking about the machine (not leaving it)."""
    while frame is not None and _module(frame) in ("subprocess", "os"):
        frame = frame.f_back
    return frame is not None and _module(frame) in _PROBES


def _module(frame: FrameType) -> str:
    """The frame's module name ("" when its globals hold no string there: exec'd code can set anything)."""
    name = frame.f_globals.get("__name__")
    return name if isinstance(name, str) else ""


def _text(value: Any) -> Any:
    """A command given as bytes, shown as text."""
    return os.fsdecode(value) if isinstance(value, bytes) else value


def _read_only(mode: Any, flags: Any) -> bool:
    if isinstance(mode, str):
        return not any(c in mode for c in "wax+")
    return isinstance(flags, int) and not flags & _WRITE_FLAGS


def _agents(frame: FrameType | None) -> bool:
    """Whether the open was the agent's: the first frame not the standard library's is the agent's module.

    A stack of the standard library alone (a thread of its own) is not the agent's; a read by the import
    system or ``linecache`` below that frame is code being loaded, not data.
    """
    while frame is not None:
        module = _module(frame)
        if module in _CODE_READERS:
            return False
        if module.partition(".")[0] not in _STDLIB:
            return agent_module(module)
        frame = frame.f_back
    return False


def _install_prefixes() -> tuple[str, ...]:
    """The standard library's and installed packages' directories (as given and resolved)."""
    places: set[str] = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            places.add(path)
    try:
        places.update(site.getsitepackages())
        places.add(site.getusersitepackages())
    except AttributeError:  # pragma: no cover - an old virtualenv's site module
        pass
    places.update(p for p in sys.path if os.path.basename(p.rstrip(os.sep)) in ("site-packages", "dist-packages"))
    # The standard library's own zip on sys.path (``python311.zip``), probed by imports and metadata searches.
    version = f"python{sys.version_info.major}{sys.version_info.minor}.zip"
    places.update(p for p in sys.path if os.path.basename(p) == version)
    resolved = {os.path.realpath(p) for p in places if p} | {os.path.abspath(p) for p in places if p}
    return tuple(sorted(p.rstrip(os.sep) + os.sep for p in resolved if p and p != os.sep))


_PREFIXES: tuple[str, ...] = ()


def _package_file(name: str) -> bool:
    """Whether ``name`` lies in the standard library or an installed package's directory."""
    absolute = os.path.abspath(name)
    if (absolute + os.sep).startswith(_PREFIXES):
        return True
    return (os.path.realpath(absolute) + os.sep).startswith(_PREFIXES)


_active: _Guard | None = None
"""The guard of the rerun in progress; None otherwise (the hook then returns at once)."""
_hooked = False
_hook_lock = threading.Lock()


def _audit(event: str, args: tuple[Any, ...]) -> None:
    guard = _active
    if guard is None:
        return
    kind = _EVENTS.get(event)
    if kind is None or getattr(guard.busy, "on", False):
        return
    guard.busy.on = True  # the hook's own work (a leak's bookkeeping, a log line) is not guarded again
    try:
        guard.check(kind, event, args)
    finally:
        guard.busy.on = False


def _hook_once() -> None:
    global _hooked, _PREFIXES
    with _hook_lock:
        if not _hooked:
            _PREFIXES = _install_prefixes()
            sys.addaudithook(_audit)
            _hooked = True


def install_guards(
    patches: PatchSet, *, mode: _Leaks | None = None, allow_live: LiveAllowList | None = None
) -> None:
    """Guard the process for one rerun until ``patches`` are removed; leaks go to ``mode`` (or the seam's)."""
    _hook_once()
    allow = allow_live if allow_live is not None else LiveAllowList(())
    guard = _Guard(mode, allow)
    if allow:
        patches.wrap(socket, "getaddrinfo", _remembering(allow))
    patches.wrap(multiprocessing.process.BaseProcess, "start", _starting)
    if _posixsubprocess is not None:
        patches.wrap(_posixsubprocess, "fork_exec", _fork_exec)
    patches.replace(sys.modules[__name__], "_active", guard)
    if not watch_aliases(patches, guard.leaks_to):
        warned = getattr(mode, "warnings", None)
        if isinstance(warned, list):
            warned.append(
                "a profiler of C (cProfile) is running: clock and entropy functions bound before the rerun "
                "began are not watched, so their live reads are not reported"
            )


def _starting(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``Process.start`` of any start method: a process start, checked before anything is set up."""
    method = getattr(instance, "_start_method", None) or multiprocessing.get_start_method(allow_none=True)
    _audit(_MP_START, (method or "default",))
    return wrapped(*args, **kwargs)


def _fork_exec(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``_posixsubprocess.fork_exec`` called by name (multiprocessing's ``spawnv_passfds``): a process start.

    ``subprocess`` holds its own reference, taken at import, and raises ``subprocess.Popen`` first.
    """
    _audit(_FORK_EXEC, args[:1])
    return wrapped(*args, **kwargs)


def _remembering(allow: LiveAllowList) -> Any:
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = wrapped(*args, **kwargs)
        host = args[0] if args else kwargs.get("host")
        port = args[1] if len(args) > 1 else kwargs.get("port")
        if allow.allows(host, port):
            allow.remember(result)
        return result

    return wrapper
