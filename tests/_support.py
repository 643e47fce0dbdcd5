"""Helpers shared by the tests (policies, snapshots, actions, processes forked from a pre-imported parent)."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from otel_replay import Action, DependencySnapshot

TEST_KEY = "test-signing-key-0123456789abcdef"
"""The one signing key of the tests (set for every test by ``tests/conftest.py``)."""


@dataclass(frozen=True)
class Demo:
    """The dataset ``otel-replay demo`` writes, and the ids of its one decision (and of the decision's span)."""

    path: Path
    record_id: str
    correlation_id: str
    trace_id: str
    span_id: str


def budget_policy(state, action):
    if action.arguments.get("recipient") not in state.get("allow_list", []):
        return False, "recipient not allow-listed"
    if action.cost > state.get("budget_remaining", 0):
        return False, "over budget"
    return True, "within budget"


SNAPSHOT_STATE = {"budget_remaining": 10_000, "allow_list": ["acme-supplies"]}


def payment(cost: float = 4200, recipient: str = "acme-supplies") -> Action:
    return Action("vendor_payment", {"recipient": recipient}, cost=cost)


def snapshot() -> DependencySnapshot:
    return DependencySnapshot(SNAPSHOT_STATE, version="v7", captured_at="2026-01-01T00:00:00+00:00")


def fork() -> int:
    """``os.fork()`` from a test process, with what the process holds frozen for the child's garbage collector.

    A worker that ran the receiver's tests keeps gRPC's threads for its life; gRPC then skips its fork handlers
    ("other threads are currently calling into gRPC") and a garbage collection in the child that reached one of
    its inherited objects crashed the child (SIGSEGV, seen once in a full run). Frozen, the objects alive at the
    fork are never collected by the child, which only runs its own work and ends with ``os._exit``.
    """
    gc.freeze()
    pid = -1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded, fork() may deadlock": none is held
            pid = os.fork()
    finally:
        if pid != 0:
            gc.unfreeze()
    return pid


def start_forked_child(work: Callable[[], Any]) -> tuple[int, int]:
    """Run ``work()`` in a child forked from this process, left running: (its pid, the pipe its JSON result comes
    back on; read it with :func:`forked_child_result`, which fails with the child's traceback if ``work`` raised)."""
    read, write = os.pipe()
    pid = fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.close(read)
            said: dict[str, Any] = {"result": work()}
        except BaseException:
            said = {"traceback": traceback.format_exc()}
        finally:
            os.write(write, json.dumps(said).encode())
            os._exit(0)
    os.close(write)
    return pid, read


def forked_child_result(child: tuple[int, int]) -> Any:
    """What the child of :func:`start_forked_child` sent back, once it has ended (its exit code checked)."""
    pid, read = child
    with os.fdopen(read) as pipe:
        said = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, said
    reported = json.loads(said)
    assert "traceback" not in reported, reported["traceback"]
    return reported["result"]


def in_forked_child(work: Callable[[], Any]) -> Any:
    """What ``work()`` returns when run in a forked child of this process (JSON through a pipe)."""
    return forked_child_result(start_forked_child(work))


def timestamps_as_ints(t: pa.DataType) -> pa.DataType:
    """``t`` with every timestamp (also inside lists and structs) as int64: a table cast to it keeps raw ns values."""
    if pa.types.is_timestamp(t):
        return pa.int64()
    if pa.types.is_list(t):
        return pa.list_(timestamps_as_ints(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(timestamps_as_ints(f.type)) for f in t])
    return t


_ZYGOTE = r"""
import gc, importlib, json, os, select, signal, socket, sys, traceback
address, modules = sys.argv[1], sys.argv[2:]
for module in modules:
    try:
        importlib.import_module(module)
    except ImportError:  # an optional dependency not installed: a child that needs it fails as it would alone
        pass
# What the imports made lives as long as any child: frozen, a child's collections never walk it (nor copy its pages
# by touching it), and neither does the collection at the child's exit, which took 0.5 s once the model clients'
# classes were among it.
gc.freeze()
listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
listener.bind(address)
listener.listen(64)
wake_read, wake_write = os.pipe()
os.set_blocking(wake_write, False)
signal.signal(signal.SIGCHLD, lambda *_: None)
signal.set_wakeup_fd(wake_write)
os.write(1, b"ready\n")
waiting = {}


def run(request, fds):
    listener.close()
    for conn in waiting.values():
        conn.close()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.close(wake_read)
    os.close(wake_write)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[:0] = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.argv = request["argv"]
    try:
        exec(compile(request["code"], "<forked>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.exit(1)
    # The interpreter then ends as one started for the script would: exit handlers, finalizers (a database
    # connection closes), flushed output, the exit code of SystemExit.
    sys.exit(0)


while True:
    ready, _, _ = select.select([listener, wake_read, 0], [], [])
    if 0 in ready and not os.read(0, 1):
        break  # the test process closed our stdin (or died): no more work
    if wake_read in ready:
        os.read(wake_read, 4096)
        while waiting:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = waiting.pop(pid)
            reply = {"returncode": os.waitstatus_to_exitcode(status), "cpu": usage.ru_utime + usage.ru_stime}
            conn.send(json.dumps(reply).encode())
            conn.close()
    if listener in ready:
        conn, _ = listener.accept()
        message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        pid = os.fork()
        if pid == 0:
            conn.close()
            run(json.loads(message), fds)
        for fd in fds:
            os.close(fd)
        conn.send(json.dumps({"pid": pid}).encode())
        waiting[pid] = conn
"""


MODEL_CLIENT_IMPORTS = ("openai", "anthropic")
"""What :meth:`Zygote.with_model_clients` imports beyond its parent's modules."""


CLI = "import runpy\nrunpy.run_module('otel_replay', run_name='__main__', alter_sys=True)\n"
"""``python -m otel_replay``, as a script for ``Zygote.run``/``Zygote.popen``."""


class Zygote:
    """A Python process that imported ``modules`` once and forks a child for each script it is asked to run.

    A child is a real process of its own (its own pid, locks, file descriptors; it can crash, ``os._exit`` or be
    killed with SIGKILL) that skips the interpreter's start and the imports, which cost over a second of CPU each
    time. The zygote itself is single-threaded, so forking it is safe. Tests reach it through the session's
    ``zygote`` fixture; a child sees the calling test's environment, working directory and ``sys.argv``.
    :meth:`with_model_clients` gives a zygote of its own forked from it, that imported the model clients too.
    """

    def __init__(self, modules: tuple[str, ...], *, parent: Zygote | None = None) -> None:
        """Start a zygote that imports ``modules``: a new interpreter, or a child of ``parent`` (which imported its
        own modules already, so only the ones it lacks are imported)."""
        self._dir = tempfile.mkdtemp(prefix="zyg-")
        self._address = os.path.join(self._dir, "s")
        self._parent = parent
        self._clients: Zygote | None = None
        self._child: ForkedProcess | None = None
        self._process: subprocess.Popen[bytes] | None = None
        if parent is None:
            self._process = subprocess.Popen(
                [sys.executable, "-c", _ZYGOTE, self._address, *modules], stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
            assert self._process.stdout is not None
            ready = self._process.stdout.readline().decode()
        else:
            self._child = parent.popen(_ZYGOTE, self._address, *modules, stdin=True)
            ready = self._child.stdout.readline()
        assert ready == "ready\n", "the zygote did not start"
        self.children_cpu = 0.0
        """CPU seconds of the children reaped so far (the zygote's, not this process's, children; a child zygote's
        children counted in its parent's figure too)."""

    def with_model_clients(self) -> Zygote:
        """A zygote forked from this one that has also imported the model clients (``openai``, ``anthropic``), made
        at the first call and stopped with this one.

        For children that import them anyway (an example agent, a manual page that instruments the clients, an
        entrypoint built on ``openai``): their imports cost about 2 s of CPU a process (``anthropic`` 1.5 s,
        ``openai`` 0.65 s) and are not what those tests are about. A test whose point is that the child imports a
        client itself (a rerun in which the client is imported, reading its packages' metadata) runs elsewhere.
        """
        if self._clients is None:
            self._clients = Zygote(MODEL_CLIENT_IMPORTS, parent=self)
        return self._clients

    def _reaped(self, cpu: float) -> None:
        self.children_cpu += cpu
        if self._parent is not None:
            self._parent._reaped(cpu)

    def popen(
        self, code: str, *args: str, stdin: bool = False, env: dict[str, str] | None = None, cwd: str | None = None
    ) -> ForkedProcess:
        """Start ``code`` (a script, as for ``python -c``) with ``args`` in ``sys.argv[1:]``; its stdout and stderr
        are pipes read back as text, its stdin a pipe when ``stdin`` is true (else empty)."""
        return ForkedProcess(self, code, args, stdin, dict(os.environ) if env is None else env, cwd or os.getcwd())

    def run(self, code: str, *args: str, timeout: float = 120, **options: Any) -> subprocess.CompletedProcess[str]:
        """Run ``code`` to its end, like ``subprocess.run(..., capture_output=True, text=True)``."""
        child = self.popen(code, *args, **options)
        out, err = child.communicate(timeout=timeout)
        return subprocess.CompletedProcess(["<forked>", *args], child.returncode, out, err)

    def cli(self, *args: str, timeout: float = 120, **options: Any) -> subprocess.CompletedProcess[str]:
        """``python -m otel_replay *args`` in a forked child, to its end."""
        return self.run(CLI, *args, timeout=timeout, **options)

    def close(self) -> None:
        """Stop the zygote (after its children, and a child zygote of its own first) and remove its socket."""
        if self._clients is not None:
            self._clients.close()
            self._clients = None
        if self._child is not None:
            self._child.__exit__()  # end of its stdin: it stops, as its parent does below
        if self._process is not None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            self._process.wait(timeout=60)
            if self._process.stdout is not None:
                self._process.stdout.close()
        shutil.rmtree(self._dir, ignore_errors=True)


class ForkedProcess:
    """One child of a ``Zygote``: the parts of ``subprocess.Popen`` the tests use."""

    def __init__(self, zygote: Zygote, code: str, args: tuple[str, ...], stdin: bool, env: dict[str, str], cwd: str):
        self._zygote = zygote
        self.returncode: int | None = None
        child_in, stdin_write = os.pipe() if stdin else (os.open(os.devnull, os.O_RDONLY), None)
        out_read, child_out = os.pipe()
        err_read, child_err = os.pipe()
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._conn.connect(zygote._address)
        request = {"code": code, "argv": ["-c", *args], "env": env, "cwd": cwd}
        socket.send_fds(self._conn, [json.dumps(request).encode()], [child_in, child_out, child_err])
        for fd in (child_in, child_out, child_err):
            os.close(fd)
        self.pid: int = json.loads(self._conn.recv(1 << 16))["pid"]
        self.stdin = None if stdin_write is None else os.fdopen(stdin_write, "w")
        self.stdout = os.fdopen(out_read)
        self.stderr = os.fdopen(err_read)

    def communicate(self, timeout: float = 120) -> tuple[str, str]:
        """Close stdin, read stdout and stderr to their ends, wait; (stdout, stderr). A child still running after
        ``timeout`` seconds is killed (a hang guard: its return code is then -9)."""
        if self.stdin is not None:
            self.stdin.close()
        guard = threading.Timer(timeout, self.kill)
        guard.start()
        errors: list[str] = []
        reader = threading.Thread(target=lambda: errors.append(self.stderr.read()), daemon=True)
        reader.start()
        try:
            out = self.stdout.read()
            reader.join(timeout)
            self.wait(timeout)
        finally:
            guard.cancel()
        self.stdout.close()
        self.stderr.close()
        return out, errors[0] if errors else ""

    def wait(self, timeout: float = 120) -> int:
        """The exit code once the child ended (negative: killed by that signal), as ``Popen.returncode``."""
        if self.returncode is None:
            self._conn.settimeout(timeout)
            reply = json.loads(self._conn.recv(1 << 16))
            self._conn.close()
            self.returncode = int(reply["returncode"])
            self._zygote._reaped(reply["cpu"])
        return self.returncode

    def __enter__(self) -> ForkedProcess:
        return self

    def __exit__(self, *_: object) -> None:
        """As ``Popen``'s: close stdin, wait for the end, close stdout and stderr."""
        if self.stdin is not None:
            self.stdin.close()
        try:
            self.wait()
        finally:
            self.stdout.close()
            self.stderr.close()

    def kill(self) -> None:
        """SIGKILL the child (if it still runs)."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
