"""A converter process never outlives the server, even one that died while the converter was still starting."""

from __future__ import annotations

import multiprocessing
import os
import signal
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest

from otel_replay.storage.convert import worker_init

from .._support import Zygote


def _pool(server_pid: int) -> ProcessPoolExecutor:
    ctx = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(1, mp_context=ctx, initializer=worker_init, initargs=(server_pid,))


def test_a_converter_whose_server_is_gone_exits_at_once() -> None:
    # The converter's parent is this process; telling it the server was another pid is what it sees when the
    # server died during its start-up and it was handed to init: it must exit, not watch init forever.
    pool = _pool(server_pid=os.getpid() + 1_000_000)
    try:
        with pytest.raises(BrokenProcessPool):
            pool.submit(os.getpid).result(timeout=60)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def test_a_converter_of_a_live_server_works() -> None:
    pool = _pool(server_pid=os.getpid())
    try:
        assert pool.submit(os.getppid).result(timeout=60) == os.getpid()
    finally:
        pool.shutdown(wait=True)


@pytest.mark.slow
def test_killing_the_server_while_its_converter_starts_leaves_no_orphan(zygote: Zygote, tmp_path: Path) -> None:
    psutil = pytest.importorskip("psutil")
    script = (
        "import sys\n"
        "from otel_replay.server import Receiver, ServerConfig\n"
        "r = Receiver(ServerConfig(dataset=sys.argv[1], grpc=None, http='127.0.0.1:0',"
        " convert_workers=1))\n"
        "r.start()\n"
        "print('ready', flush=True)\n"
        "import time; time.sleep(600)\n"
    )
    # The server is a process of its own forked with the package imported (no interpreter start of its own), so
    # it is ready, and killed, sooner after its converter (a new interpreter, spawned) began to start.
    server = zygote.popen(script, str(tmp_path / "ds"))
    try:
        assert server.stdout.readline().strip() == "ready"
        children = psutil.Process(server.pid).children(recursive=True)
        assert children, "the converter process starts with the server"
        os.kill(server.pid, signal.SIGKILL)  # most likely while the converter is still importing
        assert server.wait(timeout=30) == -signal.SIGKILL
        gone, alive = psutil.wait_procs(children, timeout=30)
        assert alive == [], [p.pid for p in alive]
    finally:
        server.kill()
        server.wait(timeout=30)
        server.stdout.close()
        server.stderr.close()
