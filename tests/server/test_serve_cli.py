"""``otel-replay serve`` as a user runs it: one-line errors, OTEL_REPLAY_* fallbacks, prompt shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from otel_replay.cli import main


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "otel_replay", "serve", *args]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_REPLAY_SERVE")}
    environ.pop("OTEL_REPLAY_DATASET", None)
    environ.update(env or {})
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)


def _finish(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Wait for ``proc`` to exit by itself; a server that keeps running is killed (and the test fails)."""
    try:
        return proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_unusable_dataset_is_a_one_line_error() -> None:
    proc = _serve("--dataset", "/proc/nope", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0")
    out, err = _finish(proc)
    assert proc.returncode == 1, (out, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: cannot use dataset /proc/nope")


def test_unusable_dataset_under_the_cli_runner() -> None:
    result = CliRunner().invoke(main, ["serve", "--dataset", "/proc/nope", "--grpc", "off", "--http", "127.0.0.1:0"])
    assert result.exit_code == 1
    assert isinstance(result.exception, SystemExit)  # click's own error exit, not an escaped exception
    assert "/proc/nope" in result.output


@pytest.mark.slow
def test_serve_falls_back_to_otel_replay_settings(tmp_path: Path) -> None:
    dataset = tmp_path / "from-env"
    env = {
        "OTEL_REPLAY_DATASET": str(dataset),
        "OTEL_REPLAY_SERVE_GRPC": "127.0.0.1:0",
        "OTEL_REPLAY_SERVE_HTTP": "off",
    }
    proc = _serve(env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("otel-replay serve: grpc 127.0.0.1:") and " http off " in line, line
        assert line.rstrip().endswith(f"dataset {dataset}")
        assert (dataset / "_wal" / "default").is_dir()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = _finish(proc)
    assert proc.returncode == 0, err


@pytest.mark.slow
def test_flags_win_over_the_environment(tmp_path: Path) -> None:
    env = {"OTEL_REPLAY_DATASET": str(tmp_path / "env"), "OTEL_REPLAY_SERVE_HTTP": "not-an-address"}
    flag = tmp_path / "flag"
    proc = _serve("--dataset", str(flag), "--grpc", "off", "--http", "127.0.0.1:0", env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "grpc off http 127.0.0.1:" in line and line.rstrip().endswith(f"dataset {flag}"), line
    finally:
        proc.send_signal(signal.SIGTERM)
        _finish(proc)
    assert proc.returncode == 0 and not (tmp_path / "env").exists()


def test_bad_address_in_the_environment_is_a_one_line_error(tmp_path: Path) -> None:
    env = {"OTEL_REPLAY_SERVE_HTTP": "nowhere"}
    proc = _serve("--dataset", str(tmp_path / "ds"), "--grpc", "off", env=env)
    _, err = _finish(proc)
    assert proc.returncode == 1 and "Traceback" not in err
    assert err.strip().splitlines() == ["Error: HTTP address 'nowhere' must look like HOST:PORT"]
