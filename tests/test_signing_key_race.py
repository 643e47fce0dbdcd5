"""The default signing key: processes that start together on a fresh machine agree on one key, none fails."""

from __future__ import annotations

import multiprocessing
import os
import warnings
from pathlib import Path
from typing import Any

import pytest

from otel_replay.errors import ConfigError
from otel_replay.integrity import load_signing_key
from otel_replay.signing_keys import DEFAULT_KEY_FILE


def _worker(home: str, barrier: Any, results: Any) -> None:
    os.environ["HOME"] = home
    barrier.wait()  # every worker looks for the key at the same moment
    try:
        results.put(("ok", load_signing_key().key_id))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        results.put(("failed", f"{type(exc).__name__}: {exc}"))


def test_workers_racing_to_create_the_default_key_all_get_the_one_that_was_stored(tmp_path, monkeypatch):
    monkeypatch.delenv("OTEL_REPLAY_SIGNING_KEY")
    ctx = multiprocessing.get_context("fork")
    for attempt in range(6):
        home = tmp_path / f"home{attempt}"
        home.mkdir()
        workers = 8
        barrier, results = ctx.Barrier(workers), ctx.Queue()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded, fork() may deadlock": none is held
            processes = [ctx.Process(target=_worker, args=(str(home), barrier, results)) for _ in range(workers)]
            for process in processes:
                process.start()
        answers = [results.get(timeout=60) for _ in range(workers)]
        for process in processes:
            process.join(timeout=60)
        assert [a for a in answers if a[0] != "ok"] == []  # was: FileExistsError, or "holds fewer than 16 bytes"
        monkeypatch.setenv("HOME", str(home))
        stored = load_signing_key(create=False)
        assert stored is not None and {key_id for _, key_id in answers} == {stored.key_id}
        key_file = Path(str(DEFAULT_KEY_FILE).replace("~", str(home), 1))
        assert [p.name for p in key_file.parent.iterdir()] == [key_file.name]  # no temporary file left behind
        assert key_file.stat().st_mode & 0o077 == 0  # the secret is readable by its owner only


def test_a_signing_key_variable_that_is_not_utf8_names_the_variable(monkeypatch):
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", "\udcff" * 20)  # how Python passes on bytes that are not UTF-8
    with pytest.raises(ConfigError, match="OTEL_REPLAY_SIGNING_KEY"):
        load_signing_key()
