"""Nothing leaves the process in a rerun unless allowed: connects, lookups and processes at any depth and thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.metadata
import json
import multiprocessing
import multiprocessing.forkserver
import os
import platform
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from otel_replay.cli import main
from otel_replay.cli.rerun import DIVERGED
from otel_replay.errors import ConfigError, DeterminismLeakError
from otel_replay.rerun import rerun
from tests._support import Zygote

from .conftest import PYTEST, cli_without_current_directory, record

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def _payments() -> Iterator[tuple[int, list[bytes]]]:
    """A loopback payment service: every POST /pay is one payment, kept in the list."""
    paid: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            paid.append(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            body = json.dumps({"paid": len(paid)}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1]), paid
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


_AGENT = '''
import json, os, urllib.request

def pay():
    """POST /pay with urllib.request: a library the interceptor does not know."""
    port = int(os.environ["PAY_PORT"])
    request = urllib.request.Request(f"http://127.0.0.1:{port}/pay", data=b'{"amount": 4200}', method="POST")
    with urllib.request.urlopen(request, timeout=5) as answer:
        return json.loads(answer.read())
'''


def _pay(host: str, port: int) -> Any:
    request = urllib.request.Request(f"http://{host}:{port}/pay", data=b'{"amount": 4200}', method="POST")
    with urllib.request.urlopen(request, timeout=5) as answer:
        return json.loads(answer.read())


def _cli(zygote: Zygote, cwd: Path, *args: str, port: int) -> subprocess.CompletedProcess[str]:
    """``python -P -m otel_replay *args`` in ``cwd``, a process of its own (a child of the zygote)."""
    env = {**os.environ, "PAY_PORT": str(port), "PYTHONPATH": str(ROOT)}
    return cli_without_current_directory(zygote, cwd, *args, env=env)


@pytest.mark.slow
def test_a_urllib_payment_is_made_once_when_recorded_and_never_again_by_a_rerun(
    dataset: Path, tmp_path: Path, zygote: Zygote
) -> None:
    with _payments() as (port, paid):
        original, _, _ = record(dataset, "pay", lambda: _pay("127.0.0.1", port))
        assert original == {"paid": 1} and len(paid) == 1
        relaxed = rerun(lambda: _pay("127.0.0.1", port), dataset=dataset, session_id="pay")
        assert len(paid) == 1, "a relaxed rerun paid again"
        assert not relaxed.matched and relaxed.summary() != "matched", relaxed.report()
        assert relaxed.error is not None and relaxed.error.startswith("DeterminismLeakError"), relaxed.report()
        assert relaxed.leaks == [f"DNS lookup '127.0.0.1' port {port} outside the recording"], relaxed.leaks
        with pytest.raises(DeterminismLeakError, match="outside the recording; refused"):
            rerun(lambda: _pay("127.0.0.1", port), dataset=dataset, session_id="pay", governance="strict")
        assert len(paid) == 1, "a strict rerun paid again"
        # The CLI, from a project directory holding the agent (found there, as `python -m` finds it).
        (tmp_path / "payagent.py").write_text(_AGENT)
        for governance in ("relaxed", "strict"):
            out = _cli(zygote, tmp_path, "rerun", "pay", "--entrypoint", "payagent:pay", "-d", str(dataset),
                       "--governance", governance, port=port)  # fmt: skip
            assert out.returncode == DIVERGED, out.stdout + out.stderr
            assert "outside the recording" in out.stdout and "matched" not in out.stdout.replace("not matched", "")
        as_json = _cli(zygote, tmp_path, "rerun", "pay", "--entrypoint", "payagent:pay", "-d", str(dataset),
                       "--json", port=port)  # fmt: skip
        line = json.loads(as_json.stdout)
        assert as_json.returncode == DIVERGED and line["matched"] is False and line["live"] == [], as_json.stdout
        assert line["leaks"] == [f"DNS lookup '127.0.0.1' port {port} outside the recording"], as_json.stdout
        assert len(paid) == 1, "the CLI rerun paid again"
        allowed = _cli(zygote, tmp_path, "rerun", "pay", "--entrypoint", "payagent:pay", "-d", str(dataset),
                       "--allow-live", f"127.0.0.1:{port}", port=port)  # fmt: skip
        assert allowed.returncode == 0 and "ran live (allowed)" in allowed.stdout, allowed.stdout + allowed.stderr
        assert len(paid) == 2  # allowed: it ran live, and said so


def _nested(depth: int, action: Callable[[], Any]) -> Any:
    return action() if depth == 0 else _nested(depth - 1, action)


def _caught(action: Callable[[], Any], *, thread: bool) -> None:
    """Run ``action`` 30 frames deep (on a thread of the agent's own if asked); the agent catches the refusal."""
    refused: list[BaseException] = []

    def deep() -> None:
        try:
            _nested(30, action)
        except DeterminismLeakError as exc:
            refused.append(exc)

    if thread:
        worker = threading.Thread(target=deep)
        worker.start()
        worker.join(30)
    else:
        deep()
    if not refused:
        raise AssertionError("the call was not refused")


@contextmanager
def _listener(kind: int) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, kind)
    sock.bind(("127.0.0.1", 0))
    if kind == socket.SOCK_STREAM:
        sock.listen(5)
    sock.setblocking(False)
    try:
        yield sock
    finally:
        sock.close()


def _nothing_arrived(sock: socket.socket) -> bool:
    try:
        if sock.type == socket.SOCK_STREAM:
            sock.accept()[0].close()
        else:
            sock.recvfrom(100)
    except BlockingIOError:
        return True
    return False


def _connect(port: int) -> None:
    with socket.socket() as sock:
        sock.connect(("127.0.0.1", port))


def _connect_ex(port: int) -> None:
    with socket.socket() as sock:
        sock.connect_ex(("127.0.0.1", port))


def _udp(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"payment", ("127.0.0.1", port))


@pytest.mark.parametrize("thread", [False, True], ids=["agent", "agents-thread"])
@pytest.mark.parametrize(
    ("what", "kind"),
    [("connect", socket.SOCK_STREAM), ("connect_ex", socket.SOCK_STREAM), ("udp", socket.SOCK_DGRAM)],
)
def test_raw_sockets_are_refused_at_any_depth_and_from_the_agents_threads(
    dataset: Path, what: str, kind: int, thread: bool
) -> None:
    record(dataset, "quiet", lambda: None)
    action = {"connect": _connect, "connect_ex": _connect_ex, "udp": _udp}[what]
    with _listener(kind) as sock:
        port = sock.getsockname()[1]
        result = rerun(lambda: _caught(lambda: action(port), thread=thread), dataset=dataset, session_id="quiet")
        assert _nothing_arrived(sock), f"{what} reached the listener"
    label = "UDP send to" if what == "udp" else "socket connect"
    # A leak made on another thread than the rerun's names that thread: the agent's pool, or one it never started.
    where = " on thread 'Thread-" if thread else " outside the recording"
    assert len(result.leaks) == 1, result.report()
    assert result.leaks[0].startswith(f"{label} ('127.0.0.1', {port}){where}"), result.report()
    assert result.leaks[0].endswith("(deep)' outside the recording" if thread else "recording"), result.report()
    assert result.error is None and not result.matched and result.divergence is None, result.report()


def _touch(marker: Path) -> Callable[[], Any]:
    return lambda: subprocess.run(["touch", str(marker)], check=False)


@pytest.mark.parametrize("thread", [False, True], ids=["agent", "agents-thread"])
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("getaddrinfo", "DNS lookup 'payments.example' port 443"),
        ("gethostbyname", "DNS lookup 'payments.example'"),
        ("subprocess", "subprocess ['touch'"),
        ("os.system", "os.system 'touch"),
        ("os.posix_spawn", "os.posix_spawn ['touch'"),
        ("os.posix_spawnp", "os.posix_spawn ['touch'"),
        ("os.fork", "os.fork (a child process)"),
        ("os.execv", "os.exec ['x']"),
    ],
)
def test_lookups_and_processes_are_refused_at_any_depth_and_from_the_agents_threads(
    dataset: Path, tmp_path: Path, name: str, expected: str, thread: bool
) -> None:
    marker = tmp_path / "ran"
    actions: dict[str, Callable[[], Any]] = {
        "getaddrinfo": lambda: socket.getaddrinfo("payments.example", 443),
        "gethostbyname": lambda: socket.gethostbyname("payments.example"),
        "subprocess": _touch(marker),
        "os.system": lambda: os.system(f"touch {marker}"),
        "os.posix_spawn": lambda: os.posix_spawn("/usr/bin/touch", ["touch", str(marker)], dict(os.environ)),
        "os.posix_spawnp": lambda: os.posix_spawnp("touch", ["touch", str(marker)], dict(os.environ)),
        "os.fork": lambda: _fork_touching(marker),
        # A path that does not exist: should the guard fail, exec fails too, and the test process survives.
        "os.execv": lambda: os.execv("/nonexistent/otel-replay-test", ["x"]),
    }
    record(dataset, "quiet", lambda: None)
    result = rerun(lambda: _caught(actions[name], thread=thread), dataset=dataset, session_id="quiet")
    assert not marker.exists(), f"{name} ran"
    assert len(result.leaks) == 1 and result.leaks[0].startswith(expected), result.leaks
    assert not result.matched and result.error is None, result.report()


def _fork_touching(marker: Path) -> None:
    """Fork a child that leaves ``marker`` (and exits at once, should the guard let the fork through)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child of a guard that failed
        try:
            marker.touch()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _child_pays(port: int) -> None:
    """A multiprocessing child's target: one live payment."""
    _pay("127.0.0.1", port)


def _pool_pays(method: str, port: int) -> None:
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context(method)) as pool:
        pool.submit(_child_pays, port).result(60)


@contextmanager
def _semaphores_removed() -> Iterator[None]:
    """Unlink the named semaphores the block leaves in /dev/shm.

    A pool's queue creates its semaphore, then asks the resource tracker (a process refused in a rerun) to
    unlink it later; refused, nobody does. The test cleans up after itself.
    """
    shm = Path("/dev/shm")
    before = set(shm.glob("sem.mp-*")) if shm.is_dir() else set()
    try:
        yield
    finally:
        for left in (set(shm.glob("sem.mp-*")) if shm.is_dir() else set()) - before:
            left.unlink(missing_ok=True)


@pytest.mark.parametrize("pool", [False, True], ids=["process", "pool"])
@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_a_multiprocessing_child_of_every_start_method_is_refused_and_pays_nothing(
    dataset: Path, method: str, pool: bool
) -> None:
    server = multiprocessing.forkserver._forkserver
    running = server._forkserver_pid  # type: ignore[attr-defined]

    def agent(port: int) -> None:
        if pool:
            _pool_pays(method, port)
            return
        child = multiprocessing.get_context(method).Process(target=_child_pays, args=(port,))
        child.start()
        child.join(60)

    with _payments() as (port, paid), _semaphores_removed():
        record(dataset, "quiet", lambda: None)
        result = rerun(lambda: agent(port), dataset=dataset, session_id="quiet")
        assert paid == [], f"a {method} child paid during the rerun"
    # A pool's queues start multiprocessing's resource tracker first (a process start of its own: refused too).
    first = "process start [" if pool and method != "fork" else f"multiprocessing process start ({method})"
    assert len(result.leaks) == 1 and result.leaks[0].startswith(first), result.leaks
    assert not result.matched and result.summary() != "matched", result.report()
    assert result.error is not None and result.error.startswith("DeterminismLeakError"), result.report()
    assert server._forkserver_pid == running, "a fork server was started during the rerun"  # type: ignore[attr-defined]


def test_allow_live_lets_exactly_the_listed_host_and_port_through(dataset: Path) -> None:
    with _payments() as (port, paid), _payments() as (other, other_paid):
        record(dataset, "quiet", lambda: None)

        def two_payments() -> list[Any]:
            outcomes: list[Any] = []
            for target in (port, other):
                try:
                    outcomes.append(_pay("localhost", target))  # a name: looked up, then its address connected
                except DeterminismLeakError as exc:
                    outcomes.append(type(exc).__name__)
            return outcomes

        result = rerun(two_payments, dataset=dataset, session_id="quiet", allow_live=[f"LOCALHOST:{port}"])
        assert result.output == [{"paid": 1}, "DeterminismLeakError"], result.report()
        assert len(paid) == 1 and other_paid == []
        assert result.leaks == [f"DNS lookup 'localhost' port {other} outside the recording"], result.leaks
        assert f"DNS lookup 'localhost' port {port}" in result.live and any("socket connect" in x for x in result.live)
        assert "ran live (allowed)" in result.report()
        anyport = rerun(two_payments, dataset=dataset, session_id="quiet", allow_live=["localhost:*"])
        assert anyport.output == [{"paid": 2}, {"paid": 1}] and not anyport.leaks, anyport.report()
        # Nothing else is allowed: not a sub-domain, not another host of the same address.
        other_name = rerun(two_payments, dataset=dataset, session_id="quiet", allow_live=["x.localhost:*"])
        assert other_name.output == ["DeterminismLeakError"] * 2 and len(paid) == 2 and len(other_paid) == 1


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("api.internal", "must look like 'host:port'"),
        (":443", "must look like 'host:port'"),
        ("api.internal:", "must look like 'host:port'"),
        ("api.internal:0", "the port must be 1-65535"),
        ("api.internal:65536", "the port must be 1-65535"),
        ("api.internal:https", "the port must be 1-65535"),
        ("api.internal:４４３", "the port must be 1-65535"),  # fullwidth digits
        ("::1:443", "in brackets"),
        ("[not-v6]:443", "is not an IPv6 address"),
        ("api internal:443", "holds a space or control character"),
        ("*:443", "is not a host name"),
        ("ąpi.internal:443", "is not a host name"),
        ("api.internal:443\nX-Injected: 1", "holds a space or control character"),
        ("h" * 5000 + ":443", "is not a host name"),
        (443, "must be a 'host:port' string, not int"),
        (None, "must be a 'host:port' string, not NoneType"),
    ],
)
def test_a_bad_allow_live_entry_is_a_one_line_error_naming_it(dataset: Path, entry: Any, says: str) -> None:
    record(dataset, "quiet", lambda: None)
    with pytest.raises(ConfigError) as raised:
        rerun(lambda: None, dataset=dataset, session_id="quiet", allow_live=["ok.example:1", entry])
    message = str(raised.value)
    assert says in message and "allow_live entry" in message and len(message.splitlines()) == 1, message
    assert repr(entry)[:50] in message or (isinstance(entry, str) and repr(entry[:100])[:50] in message)
    assert len(message) < 400


@pytest.mark.slow
def test_a_bad_allow_live_option_is_a_one_line_error_from_the_cli_and_the_pytest_plugin(
    dataset: Path, tmp_path: Path, zygote: Zygote
) -> None:
    record(dataset, "quiet", lambda: None)
    out = _cli(zygote, tmp_path, "rerun", "quiet", "--entrypoint", "json:dumps", "-d", str(dataset), "--allow-live",
               "nope", port=1)  # fmt: skip
    assert out.returncode == 1 and "allow_live entry 'nope'" in out.stderr and "Traceback" not in out.stderr
    plugin = ["-p", "no:otel_replay", "-p", "otel_replay.rerun.pytest_plugin", "-p", "no:cacheprovider"]
    opts = ["--otel-replay-dataset", str(dataset), "--otel-replay-entrypoint", "json:dumps"]
    bad = zygote.run(
        PYTEST, *plugin, *opts, "--otel-replay-allow-live", "h:0", "--rootdir", str(tmp_path), str(tmp_path),
        cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert bad.returncode == 4 and "--otel-replay-allow-live: allow_live entry 'h:0'" in bad.stderr, bad.stderr


def _reads_installed_packages() -> tuple[str, int]:
    with open(json.__file__, encoding="utf-8") as handle:  # a standard library file
        size = len(handle.read())
    return importlib.metadata.version("openai"), size


def test_reading_installed_packages_and_the_standard_library_is_not_a_leak_in_strict(dataset: Path) -> None:
    original, _, _ = record(dataset, "meta", _reads_installed_packages)
    result = rerun(_reads_installed_packages, dataset=dataset, session_id="meta", governance="strict")
    assert result.output == original and result.matched and not result.leaks, result.report()


def _clock_and_a_file(path: str) -> str:
    time.time()
    for _ in range(3):
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    return text


def test_a_leak_takes_no_step_number_is_reported_once_and_is_never_matched(
    dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "config.txt"
    config.write_text("limit=10")
    record(dataset, "file", lambda: _clock_and_a_file(str(config)))
    with caplog.at_level("WARNING", logger="otel_replay"):
        result = rerun(lambda: _clock_and_a_file(str(config)), dataset=dataset, session_id="file")
    assert result.output == "limit=10" and result.divergence is None and result.steps == 1, result.report()
    assert result.leaks == [f"file open {str(config)!r} outside the recording"], result.leaks
    assert not result.matched and result.summary() != "matched"
    assert result.report().count("file open") == 1 and "file open" not in caplog.text
    with pytest.raises(DeterminismLeakError) as raised:
        rerun(lambda: _clock_and_a_file(str(config)), dataset=dataset, session_id="file", governance="strict")
    assert raised.value.step == -1 and not re.search(r"step \d", str(raised.value)), raised.value


_POLICY = "def policy(state, action):\n    return True, 'fine'\n"
_RAIL = (
    "class Rail:\n    def commit(self, *a): pass\n    def compensate(self, *a): pass\n\n"
    "def make():\n    return Rail()\n"
)


@pytest.mark.slow
def test_policy_rail_and_entrypoint_modules_in_the_current_directory_load(tmp_path: Path, zygote: Zygote) -> None:
    (tmp_path / "projpolicy.py").write_text(_POLICY)
    (tmp_path / "projrail.py").write_text(_RAIL)
    (tmp_path / "state.json").write_text("{}")
    empty = tmp_path / "traces"
    (empty / "spans").mkdir(parents=True)
    # As with -P: Python does not put the current directory on sys.path itself (as the console script does not).
    replay = _cli(zygote, tmp_path, "replay", "no-such-record", "--live-state", "state.json", "--policy",
                  "projpolicy:policy", "-d", str(empty), "--execute", "--rail", "projrail:make", port=1)  # fmt: skip
    assert replay.returncode == 1 and "cannot import" not in replay.stderr, replay.stderr
    assert "no-such-record" in replay.stderr, replay.stderr  # it got past loading both, to the record lookup
    missing = _cli(zygote, tmp_path, "replay", "r", "--live-state", "state.json", "--policy", "nosuchmodule:policy",
                   "-d", str(empty), port=1)  # fmt: skip
    assert missing.returncode == 1 and "cannot import module 'nosuchmodule'" in missing.stderr, missing.stderr
    for command, option in (("replay", "--policy"), ("replay", "--rail"), ("rerun", "--entrypoint"),
                            ("rerun", "--policy"), ("rerun", "--rail")):  # fmt: skip
        shown = CliRunner().invoke(main, [command, "--help"]).output  # the help text needs no process of its own
        block = shown.split(f"  {option} ", 1)[1]
        text = " ".join(re.split(r"\n  -", block, maxsplit=1)[0].split())
        assert "current directory first" in text, (command, option, text)


async def _dial(host: str, port: int) -> None:
    _, writer = await asyncio.open_connection(host, port)
    writer.close()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"], ids=["address", "name-resolved-on-the-loops-pool"])
def test_asyncio_connections_are_refused_too(dataset: Path, host: str) -> None:
    record(dataset, "quiet", lambda: None)

    def agent() -> str:
        try:
            asyncio.run(_dial(host, port))
        except DeterminismLeakError:
            return "refused"
        return "connected"

    with _listener(socket.SOCK_STREAM) as sock:
        port = sock.getsockname()[1]
        result = rerun(agent, dataset=dataset, session_id="quiet")
        assert _nothing_arrived(sock)
    assert result.output == "refused" and len(result.leaks) == 1 and not result.matched, result.report()


@pytest.mark.slow
def test_an_openai_agent_reruns_strict_and_matched_in_a_fresh_process(dataset: Path, tmp_path: Path) -> None:
    """The client is built in the rerun: it reads its packages' metadata and probes the platform (``uname -p``)."""
    from .conftest import EXAMPLES, agent

    with agent.scripted_server() as api, agent.scripted_server() as model:
        env = {**os.environ, "RERUN_EXAMPLE_API": api, "RERUN_EXAMPLE_MODEL": model}
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("RERUN_EXAMPLE_API", api)
            mp.setenv("RERUN_EXAMPLE_MODEL", model)
            record(dataset, "llm", agent.agent_from_env)
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, "-P", "-m", "otel_replay", "rerun", "llm", "--entrypoint",
               "example_rerun_agent:agent_from_env", "-d", str(dataset), "--governance", "strict"]  # fmt: skip
    out = subprocess.run(command, cwd=EXAMPLES, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0 and "(strict): matched" in out.stdout, out.stdout + out.stderr
    assert "leak" not in out.stdout


def _platform_probe() -> str:
    platform._uname_cache = None  # type: ignore[attr-defined]  # asked afresh: `uname -p` runs again
    return platform.platform()


def test_the_standard_library_asking_about_this_machine_is_not_a_leak(dataset: Path) -> None:
    original, _, _ = record(dataset, "probe", _platform_probe)
    result = rerun(_platform_probe, dataset=dataset, session_id="probe", governance="strict")
    assert result.output == original and result.matched and not result.leaks, result.report()


def test_the_libraries_added_in_codec_3_are_the_agents_in_an_older_recordings_rerun() -> None:
    from otel_replay.rerun.callers import agent_module
    from otel_replay.rerun.codec import arguments_codec

    assert not agent_module("httpcore2._sync.connection_pool")
    with arguments_codec(2):  # a format-2 recording recorded httpcore2's clock reads: its rerun still serves them
        assert agent_module("httpcore2._sync.connection_pool")
    assert not agent_module("typing_extensions") and agent_module("my_agent.tools")


def test_code_whose_module_name_is_not_a_string_is_still_guarded(dataset: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("x")
    record(dataset, "quiet", lambda: None)
    code = (
        "open(path).close()\n"
        "try:\n    socket.getaddrinfo('payments.example', 443)\nexcept Exception as e:\n    out.append(e)"
    )
    out: list[BaseException] = []
    scope = {"__name__": ["not", "a", "name"], "path": str(secret), "socket": socket, "out": out}
    result = rerun(lambda: exec(code, scope), dataset=dataset, session_id="quiet")
    assert result.error is None and [type(e) for e in out] == [DeterminismLeakError], result.report()
    assert len(result.leaks) == 2 and result.leaks[0].startswith("file open"), result.leaks


def _changes_the_world(ledger: str, victim: int) -> str:
    import os as _os
    import signal as _signal
    import sqlite3 as _sqlite3

    _os.remove(ledger)
    _os.kill(victim, _signal.SIGTERM)
    with _sqlite3.connect(ledger + ".db") as db:
        db.execute("CREATE TABLE IF NOT EXISTS t (x)")
    return "done"


def test_removing_files_signalling_processes_and_opening_databases_are_leaks_never_matched(
    dataset: Path, tmp_path: Path
) -> None:
    import signal as _signal
    import subprocess as _subprocess

    ledger = tmp_path / "ledger.txt"
    victim = _subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record(dataset, "world", lambda: "done")  # the recorded agent touched nothing
        ledger.write_text("x")
        relaxed = rerun(lambda: _changes_the_world(str(ledger), victim.pid), dataset=dataset, session_id="world")
        assert not relaxed.matched
        assert any("os.remove" in leak for leak in relaxed.leaks), relaxed.leaks
        assert any("os.kill" in leak for leak in relaxed.leaks), relaxed.leaks
        assert any("sqlite3.connect" in leak for leak in relaxed.leaks), relaxed.leaks
        ledger.write_text("x")
        with pytest.raises(DeterminismLeakError, match="os.remove"):
            rerun(
                lambda: _changes_the_world(str(ledger), victim.pid),
                dataset=dataset,
                session_id="world",
                governance="strict",
            )
        assert ledger.exists()  # strict refused the removal before it happened
    finally:
        victim.send_signal(_signal.SIGKILL)
        victim.wait()
