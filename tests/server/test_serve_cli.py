"""``otel-replay serve`` as a user runs it: one-line errors, OTEL_REPLAY_* fallbacks, prompt shutdown."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

from otel_replay.cli import main

from .._support import CLI, ForkedProcess, Zygote


def _serve(zygote: Zygote, *args: str, env: dict[str, str] | None = None) -> ForkedProcess:
    """``python -m otel_replay serve *args`` as a real process (forked from the session's zygote: its settings
    are read from ``env`` when the command runs, as in a fresh interpreter), without OTEL_REPLAY_SERVE_* and
    OTEL_REPLAY_DATASET from this process's environment."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_REPLAY_SERVE")}
    environ.pop("OTEL_REPLAY_DATASET", None)
    environ.update(env or {})
    return zygote.popen(CLI, "serve", *args, env=environ)


def _finish(proc: ForkedProcess) -> tuple[str, str]:
    """Wait for ``proc`` to exit by itself; a server still running after 60 s is killed (and the test fails)."""
    return proc.communicate(timeout=60)


def test_unusable_dataset_is_a_one_line_error(zygote: Zygote) -> None:
    proc = _serve(zygote, "--dataset", "/proc/nope", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0")
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
def test_serve_falls_back_to_otel_replay_settings(zygote: Zygote, tmp_path: Path) -> None:
    dataset = tmp_path / "from-env"
    env = {
        "OTEL_REPLAY_DATASET": str(dataset),
        "OTEL_REPLAY_SERVE_GRPC": "127.0.0.1:0",
        "OTEL_REPLAY_SERVE_HTTP": "off",
    }
    proc = _serve(zygote, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("otel-replay serve: grpc 127.0.0.1:") and " http off " in line, line
        assert line.rstrip().endswith(f"dataset {dataset}")
        assert (dataset / "_wal" / "default").is_dir()
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        out, err = _finish(proc)
    assert proc.returncode == 0, err


@pytest.mark.slow
def test_flags_win_over_the_environment(zygote: Zygote, tmp_path: Path) -> None:
    env = {"OTEL_REPLAY_DATASET": str(tmp_path / "env"), "OTEL_REPLAY_SERVE_HTTP": "not-an-address"}
    flag = tmp_path / "flag"
    proc = _serve(zygote, "--dataset", str(flag), "--grpc", "off", "--http", "127.0.0.1:0", env=env)
    try:
        line = proc.stdout.readline()
        assert "grpc off http 127.0.0.1:" in line and line.rstrip().endswith(f"dataset {flag}"), line
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        _finish(proc)
    assert proc.returncode == 0 and not (tmp_path / "env").exists()


def test_bad_address_in_the_environment_is_a_one_line_error(zygote: Zygote, tmp_path: Path) -> None:
    env = {"OTEL_REPLAY_SERVE_HTTP": "nowhere"}
    proc = _serve(zygote, "--dataset", str(tmp_path / "ds"), "--grpc", "off", env=env)
    _, err = _finish(proc)
    assert proc.returncode == 1 and "Traceback" not in err
    assert err.strip().splitlines() == [
        "Error: OTEL_REPLAY_SERVE_HTTP: HTTP address 'nowhere' must look like HOST:PORT"  # the variable is named
    ]


def test_a_port_written_in_other_digits_is_refused(tmp_path: Path) -> None:
    """``int()`` reads Arabic-Indic or fullwidth digits: a port nobody can check by eye is not taken as 12."""
    from otel_replay.errors import ConfigError
    from otel_replay.server.config import parse_address

    assert parse_address("127.0.0.1:4318", "HTTP") == ("127.0.0.1", 4318)
    for text in ("127.0.0.1:\u0661\u0662", "127.0.0.1:\uff14\uff13\uff11\uff18"):
        with pytest.raises(ConfigError, match="must look like HOST:PORT"):
            parse_address(text, "HTTP")
