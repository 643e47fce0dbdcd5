"""Bad command-line input and settings: one line naming the option, variable or file; exit non-zero; nothing lost.

Each test here guards a finding of the CLI review (rev-cli): before the fix
the command printed "OK", exited 0, ran out of memory, reported a bug (exit 3)
or said something that named neither the option nor the variable.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

import otel_replay
from otel_replay.cli import main
from otel_replay.cli._inputs import LIVE_STATE_MAX_BYTES
from otel_replay.errors import ConfigError, QueryError
from otel_replay.integrity import load_signing_key
from otel_replay.query.analyst import check_statements
from otel_replay.server.config import ServerConfig
from otel_replay.settings import MAX_WAIT_SECONDS, env_number
from otel_replay.storage.compact_steps import MAX_ROWS, Options

from .._support import in_forked_child

OTEL_REPLAY = str(Path(sys.executable).with_name("otel-replay"))


def run(*args: str, env: dict[str, str] | None = None):
    """Invoke the CLI in-process; any exception but the exit itself fails the test."""
    result = CliRunner().invoke(main, list(args), env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    assert result.exit_code in (0, 1, 2), (result.exit_code, result.output)  # 3 would be "a bug in otel-replay"
    return result


def error_line(result) -> str:
    """The one ``Error:`` line of a failed run (click prints usage lines above a usage error's)."""
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.fixture
def demo(demo_dataset: Path) -> Path:
    """The shared demo dataset (read-only)."""
    return demo_dataset


# --- verify (and every read command) on a directory that is not a dataset root ---------------------------


def test_verify_refuses_a_directory_that_is_not_the_dataset_root(demo: Path, tmp_path: Path) -> None:
    assert run("verify", str(demo)).exit_code == 0
    partition = next((demo / "spans").iterdir())
    unrelated = tmp_path / "etc"
    (unrelated / "sub").mkdir(parents=True)
    for wrong in (demo / "spans", partition, unrelated):
        result = run("verify", str(wrong))
        assert result.exit_code == 1 and "OK" not in result.output  # was: "OK ...: 0 records verified", exit 0
        assert f"dataset {wrong} has no spans/ directory (is this the dataset root?)" in error_line(result)
    assert run("sql", "SELECT count(*) FROM spans", "-d", str(demo / "spans")).exit_code == 1


def test_a_dataset_whose_spans_are_not_written_yet_still_opens(tmp_path: Path) -> None:
    (tmp_path / "fresh" / "_wal" / "default").mkdir(parents=True)  # what `serve` leaves before converting
    result = run("sql", "SELECT count(*) AS n FROM spans", "-d", str(tmp_path / "fresh"), "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"n": 0}


def test_an_empty_dataset_option_is_refused_not_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for args in (["demo", "-d", ""], ["verify", ""], ["sql", "SELECT 1", "-d", " "], ["ingest", ".", "--dataset", ""]):
        result = run(*args)
        assert result.exit_code == 1 and "the dataset is empty" in error_line(result)
    assert list(tmp_path.iterdir()) == []  # was: demo wrote spans/ and a live state into the cwd


# --- devices and oversized input files ------------------------------------------------------------------


def test_a_device_as_live_state_or_key_file_is_refused_without_reading_it(demo: Path) -> None:
    replay = ["replay", "x", "-d", str(demo), "--policy", "otel_replay.demo:budget_policy"]
    result = run(*replay, "--live-state", "/dev/zero")  # was: read until memory ran out (MemoryError, exit 3)
    assert "live state file /dev/zero is not a regular file" in error_line(result)
    result = run("verify", str(demo), "--key-file", "/dev/zero")
    assert "key file /dev/zero is not a regular file" in error_line(result)
    result = run("verify", str(demo), env={"OTEL_REPLAY_SIGNING_KEY": "", "OTEL_REPLAY_KEY_FILE": "/dev/zero"})
    assert "signing key file /dev/zero is not a regular file" in error_line(result)


def test_oversized_live_state_and_key_files_are_refused(demo: Path, tmp_path: Path) -> None:
    big = tmp_path / "state.json"
    with big.open("wb") as handle:
        handle.truncate(LIVE_STATE_MAX_BYTES + 1)  # sparse: no disk used
    replay = ["replay", "x", "-d", str(demo), "--policy", "otel_replay.demo:budget_policy"]
    assert "is larger than 64 MiB" in error_line(run(*replay, "--live-state", str(big)))
    key = tmp_path / "big.key"
    key.write_bytes(b"k" * 5000)
    with pytest.raises(ConfigError, match="larger than 4 KiB"):
        load_signing_key(key_file=key)
    key.write_bytes(b"k" * 32 + b"\n")
    assert load_signing_key(key_file=key) is not None  # an ordinary key file still loads


# --- numbers that passed the check and overflowed later --------------------------------------------------


def test_huge_row_options_name_the_option(demo: Path) -> None:
    for option in ("--target-rows", "--row-group-rows", "--max-batch-rows"):
        result = run("compact", str(demo), option, "99999999999999999999")
        assert result.exit_code == 2 and f"'{option}'" in error_line(result)  # was: "Python int too large ..."
    result = run("chain", "session", "x", "-d", str(demo), "--limit", "9223372036854775807")
    assert result.exit_code == 2 and "'--limit'" in error_line(result)
    with pytest.raises(ConfigError, match="target_rows=2147483648 must be at most"):
        Options(target_rows=MAX_ROWS + 1)


def test_huge_ingest_line_limit_names_the_variable(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("{}\n")
    for value in ("1e30", "1e19"):
        result = run("ingest", str(source), "--dataset", str(tmp_path / "ds"), "-q",
                     env={"OTEL_REPLAY_INGEST_MAX_LINE": value})  # fmt: skip
        assert f"OTEL_REPLAY_INGEST_MAX_LINE='{value}' must be at most" in error_line(result)


def test_env_number_maximum(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_REPLAY_X", "11")
    assert env_number("OTEL_REPLAY_X", 1, maximum=11) == 11
    with pytest.raises(ConfigError, match=r"OTEL_REPLAY_X='11' must be at most 10"):
        env_number("OTEL_REPLAY_X", 1, maximum=10)


def test_huge_intervals_and_timeouts_are_refused_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    serve = ["serve", "--dataset", str(tmp_path / "ds"), "--grpc", "off", "--http", "127.0.0.1:0"]
    for option, name in (("--compact-every", "compact_every_seconds"), ("--read-timeout", "read_timeout_seconds")):
        result = run(*serve, option, "1e10")  # was: serving, with a dead compactor / every request failing
        assert result.exit_code == 1 and f"{name}" in error_line(result) and "at most 1e+07" in error_line(result)
    result = run(*serve, "--metrics-interval", "1e10")
    assert result.exit_code == 2 and "'--metrics-interval'" in error_line(result)
    for field in ("read_timeout_seconds", "flush_seconds", "compact_every_seconds"):
        with pytest.raises(ConfigError, match=field):
            ServerConfig(tmp_path / "ds", **{field: MAX_WAIT_SECONDS * 10})
    ServerConfig(tmp_path / "ds", read_timeout_seconds=MAX_WAIT_SECONDS, compact_every_seconds=MAX_WAIT_SECONDS)
    monkeypatch.setenv("OTEL_REPLAY_COMPACT_EVERY", "1e10")  # was: the compaction thread died with a traceback
    running = set(threading.enumerate())
    with pytest.raises(ConfigError, match="OTEL_REPLAY_COMPACT_EVERY='1e10' must be at most"):
        otel_replay.configure(tmp_path / "ds", set_global=False)
    # Refused before anything starts: was a writer thread left running for the process's life.
    assert [t.name for t in threading.enumerate() if t not in running] == []


# --- SQL text that is not UTF-8 --------------------------------------------------------------------------


def test_sql_that_is_not_utf8_names_the_argument(demo: Path, tmp_path: Path) -> None:
    latin1 = os.fsdecode(b"SELECT 'caf\xe9'")  # how Python hands over a non-UTF-8 argument (surrogateescape)
    result = run("sql", latin1, "-d", str(demo))
    assert "QUERY is not valid UTF-8 (byte 0xe9 at character 11)" in error_line(result)  # was: internal error, 3
    sql_file = tmp_path / "q.sql"
    sql_file.write_bytes(b"SELECT 'caf\xe9'")
    assert f"SQL file {sql_file} is not valid UTF-8 (byte 0xe9 at offset 11)" in error_line(run("sql", str(sql_file),
                                                                                                "-d", str(demo)))
    with otel_replay.open(demo) as store:
        with pytest.raises(QueryError, match="not valid UTF-8"):
            check_statements(store.engine._analyst_con(), latin1)


# --- ingest ----------------------------------------------------------------------------------------------


def test_ingest_prints_file_names_escaped(tmp_path: Path) -> None:
    source = tmp_path / "in"
    source.mkdir()
    (source / "x\x1b]0;pwned\x07\nALL GOOD.jsonl").write_text("{}\n")
    result = run("ingest", str(source), "--dataset", str(tmp_path / "ds"), "-q")
    assert "\x1b" not in result.output and "\nALL GOOD" not in result.output
    assert "x\\x1b]0;pwned\\x07\\nALL GOOD.jsonl" in result.output


def test_ingest_refuses_a_dataset_that_is_not_a_directory_of_this_machine(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("{}\n")
    for dataset, said in (  # nothing is contacted: an object store is refused by what it is, not by a request
        ("s3://otel-replay-bucket/traces", "ingest writes a local dataset directory, not s3://otel-replay-bucket/"),
        ("S3://otel-replay-bucket/traces", "ingest writes a local dataset directory, not S3://otel-replay-bucket/"),
        ("s3://Not_A_Bucket/x", "dataset URI s3://Not_A_Bucket/x: 'Not_A_Bucket' is not a valid S3 bucket name"),
        ("ftp://host/traces", "dataset URI ftp://host/traces: unsupported scheme 'ftp'"),
        ("file://relative/ds", "dataset URI file://relative/ds: a file:// URI needs an absolute path"),
    ):
        result = run("ingest", str(source), "--dataset", dataset, "-q")
        assert result.exit_code == 1 and said in error_line(result), (dataset, result.output)
        assert "ingested" not in result.output
    assert list(tmp_path.iterdir()) == [source]  # nothing was written anywhere
    local = tmp_path / "ds"
    result = run("ingest", str(source), "--dataset", f"file://{local}", "-q")  # a file:// URI is a local directory
    assert result.exit_code == 0 and f"into file://{local}" in result.output
    assert (local / "_ingest").is_dir()


NOBODY = 65534


def _ingest_in_a_child(top: Path, source: Path, as_nobody: bool) -> dict[str, object]:
    """``otel-replay ingest source`` run in a forked child of this process, as user nobody when asked.

    The child has every module this process imported, so nothing is read from the checkout as the other
    user: where the checkout lives (a private parent directory) does not matter.
    """

    def work() -> dict[str, object]:
        try:
            if as_nobody:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            os.chdir(top)
        except PermissionError as exc:
            return {"refused": str(exc)}
        result = CliRunner().invoke(main, ["ingest", str(source), "--dataset", str(top / "ds"), "-q"])
        return {"exit_code": result.exit_code, "stderr": result.stderr, "exception": repr(result.exception)}

    return in_forked_child(work)


def test_ingest_counts_an_unreadable_subdirectory_as_a_failure(tmp_path: Path) -> None:
    as_nobody = os.geteuid() == 0  # root reads every directory: the child drops to user nobody
    top = Path(tempfile.mkdtemp(prefix="otel-replay-unreadable-"))  # under /tmp: reachable by user nobody
    try:
        top.chmod(0o777)
        (top / "in" / "inner").mkdir(parents=True)
        (top / "in" / "inner" / "a.jsonl").write_text("{}\n")
        (top / "in").chmod(0o755)
        # Here first, readable: this process loads every module the command needs, and the child inherits them.
        assert run("ingest", str(top / "in"), "--dataset", str(tmp_path / "ds"), "-q").exit_code == 0
        (top / "in" / "inner").chmod(0)
        done = _ingest_in_a_child(top, top / "in", as_nobody)
        if "refused" in done:
            pytest.skip(f"this system does not let root run a process as user nobody: {done['refused']}")
        stderr = str(done["stderr"])
        assert done["exit_code"] == 1, done  # was: "ingested 0 spans from 0 file(s)", exit 0
        assert f"{top / 'in' / 'inner'}: cannot ingest: the directory cannot be read: Permission denied" in stderr
        assert "1 could not be read" in stderr and "Traceback" not in stderr
    finally:
        for root, _, _ in os.walk(top):
            os.chmod(root, 0o755)
        (top / "in" / "inner").chmod(0o755)
        shutil.rmtree(top, ignore_errors=True)


# --- compact | head --------------------------------------------------------------------------------------


def test_compact_into_a_closed_pipe_still_compacts_every_partition(tmp_path: Path) -> None:
    source, dataset = tmp_path / "in.jsonl", tmp_path / "ds"
    with source.open("w") as out:
        for day, start in enumerate((1764100000000000000, 1764200000000000000, 1764300000000000000)):
            spans = [
                {"traceId": f"{day * 10 + i + 1:032x}", "spanId": f"{day * 10 + i + 1:016x}", "name": "s",
                 "kind": 1, "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 1000)}
                for i in range(3)
            ]  # fmt: skip
            doc = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {"name": "x"}, "spans": spans}]}]}
            out.write(json.dumps(doc) + "\n")
    assert run("ingest", str(source), "--dataset", str(dataset), "-q").exit_code == 0
    reader = subprocess.Popen(["true"], stdin=subprocess.PIPE)
    reader.wait()  # the reader is gone before the first line: every write to the pipe fails
    done = subprocess.run([OTEL_REPLAY, "compact", str(dataset)], stdout=reader.stdin, stderr=subprocess.PIPE,
                          text=True, timeout=300)  # fmt: skip
    reader.stdin.close()
    assert done.returncode == 1 and done.stderr == ""  # quiet, as every command whose reader went away
    partitions = sorted((dataset / "spans").iterdir())
    assert len(partitions) == 3
    assert all((p / "_manifest.json").exists() for p in partitions)  # was: only the first one compacted
