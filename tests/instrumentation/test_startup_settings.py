"""A malformed otel-replay setting stops ``opentelemetry-instrument`` at start: one line, exit 1, agent not run.

Before, OpenTelemetry's start-up logged the error with tracebacks and ran the
agent unrecorded (exit 0, nothing stored), or the recording failed in an
atexit hook after the agent had run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import otel_replay
from otel_replay.errors import ConfigError
from otel_replay.rerun import recording

AGENT = "import time; time.time(); print('agent ran')"
MODEL_CLIENTS = "otel_replay_openai,otel_replay_anthropic"
"""Our model clients' instrumentors, by entry-point name (``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS``)."""


def instrumented(tmp_path: Path, agent: str = AGENT, **env: str) -> subprocess.CompletedProcess[str]:
    launcher = Path(sys.executable).parent / "opentelemetry-instrument"
    full = {
        **os.environ,
        "OTEL_TRACES_EXPORTER": "otel_replay",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_REPLAY_DATASET": str(tmp_path / "ds"),
        "OTEL_REPLAY_RECORD_SESSION": "sess-1",
        **env,
    }
    return subprocess.run(
        [str(launcher), sys.executable, "-c", agent], env=full, capture_output=True, text=True, timeout=180
    )


@pytest.mark.slow
def test_a_good_configuration_records_the_session(tmp_path: Path) -> None:
    # Every instrumentor installed loads (the model clients' too): the other launcher tests leave out what they
    # do not need, so this start is the one that shows a full default start records.
    done = instrumented(tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "agent ran", done.stderr
    with otel_replay.open(tmp_path / "ds") as store:
        assert store.rows("SELECT count(*) AS n FROM spans WHERE session_id = 'sess-1'")[0]["n"] >= 1


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("OTEL_REPLAY_MAX_FILE_AGE", "5s", "cannot export spans to the dataset: OTEL_REPLAY_MAX_FILE_AGE='5s'"),
        ("OTEL_REPLAY_COMPACT_EVERY", "1e10", "OTEL_REPLAY_COMPACT_EVERY='1e10' must be at most"),
        ("OTEL_REPLAY_SIGNING_KEY", "short", "signing key is too short"),  # the exporter meets it first now
        ("OTEL_REPLAY_RERUN_MAX_BODY", "8MiB", "cannot record session sess-1: OTEL_REPLAY_RERUN_MAX_BODY='8MiB'"),
    ],
)
def test_a_malformed_setting_stops_the_process_at_start(
    tmp_path: Path, variable: str, value: str, message: str
) -> None:
    # The model clients' instrumentors are left out: what stops the start is otel-replay's own setting, met by the
    # exporter or the recording's instrumentor, which still load from their entry points through the real launcher.
    # Loaded, they imported anthropic and openai first (2 s of CPU a start) before the recording's setting was read.
    done = instrumented(tmp_path, **{variable: value, "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": MODEL_CLIENTS})
    assert done.returncode == 1, (done.stdout, done.stderr)  # was: 0, the agent ran unrecorded
    assert done.stdout == ""  # the agent never ran
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("otel-replay: ") and message in lines[0] and lines[0].endswith("; not starting")


def test_a_dataset_that_cannot_be_created_stops_the_process_at_start(tmp_path: Path) -> None:
    """As docs/guides/instrumenting.md promises: never an agent run with nothing recorded (pinned in review)."""
    (tmp_path / "a-file").write_text("x")
    done = instrumented(
        tmp_path,
        OTEL_REPLAY_DATASET=str(tmp_path / "a-file"),
        OTEL_REPLAY_RECORD_SESSION="",
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=MODEL_CLIENTS,
    )
    assert done.returncode == 1 and done.stdout == "", (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("otel-replay: cannot export spans to the dataset: cannot create the dataset directory")


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("OTEL_REPLAY_KEY_FILE", "DIRECTORY", "is not a regular file"),  # was: the first audit() block's record lost
        ("OTEL_REPLAY_SIGNING_KEY", "short", "signing key is too short"),
        ("OTEL_REPLAY_OUTCOME_SYNC", "bogus", "OTEL_REPLAY_OUTCOME_SYNC='bogus' must be 'process' or 'machine'"),
        ("OTEL_REPLAY_REDACT_PATTERNS", "(", "OTEL_REPLAY_REDACT_PATTERNS"),
    ],
)
def test_a_bad_record_setting_stops_the_process_at_start_without_a_recording(
    tmp_path: Path, variable: str, value: str, message: str
) -> None:
    """Found in review (twelfth session): without OTEL_REPLAY_RECORD_SESSION nothing read these at start.

    The agent ran (exit 0) and met them at its first record: a sealed decision lost after its action ran, or
    record_outcome() raising. configure() reads them all; the exporter the launcher makes now does too.
    """
    value = str(tmp_path) if value == "DIRECTORY" else value
    env = {variable: value, "OTEL_REPLAY_RECORD_SESSION": "", "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": MODEL_CLIENTS}
    if variable == "OTEL_REPLAY_KEY_FILE":
        env["OTEL_REPLAY_SIGNING_KEY"] = ""  # the key file is read only when no key is given
    done = instrumented(tmp_path, **env)
    assert done.returncode == 1, (done.stdout, done.stderr)  # was: 0, "agent ran"
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("otel-replay: cannot record decisions: ") and message in lines[0], lines[0]
    assert not (tmp_path / "ds").exists()  # refused before the exporter made anything


URL_SPAN = (
    "from opentelemetry import trace\n"
    "with trace.get_tracer('t').start_as_current_span('GET', kind=trace.SpanKind.CLIENT,"
    " attributes={'url.full': 'http://x/?api_key=abc'}):\n"
    "    pass\n"
    "print('agent ran')"
)


def test_a_bad_redaction_pattern_stops_the_start_whatever_the_exporter(tmp_path: Path) -> None:
    """Found in review (twelfth session): with another exporter (console, OTLP) nothing read the pattern at start.

    The agent ran and the correlation processor's URL redaction raised the ConfigError out of the agent's first
    client span (a traceback, exit 1, mid-run). Now the post-instrument hook reads it: one line, the agent not run.
    """
    done = instrumented(
        tmp_path,
        URL_SPAN,
        OTEL_TRACES_EXPORTER="console",
        OTEL_REPLAY_REDACT_PATTERNS="(",
        OTEL_REPLAY_RECORD_SESSION="",
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=MODEL_CLIENTS,
    )
    assert done.returncode == 1 and done.stdout == "", (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr  # was: the agent's traceback
    assert lines[0].startswith("otel-replay: cannot redact spans: OTEL_REPLAY_REDACT_PATTERNS"), lines[0]
    good = instrumented(
        tmp_path,
        URL_SPAN,
        OTEL_TRACES_EXPORTER="console",
        OTEL_REPLAY_RECORD_SESSION="",
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=MODEL_CLIENTS,
    )
    assert good.returncode == 0 and "agent ran" in good.stdout and "api_key=[REDACTED]" in good.stdout, good.stderr


def test_in_process_a_bad_body_cap_fails_when_the_recording_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_REPLAY_RERUN_MAX_BODY", "8MiB")
    with otel_replay.configure(tmp_path / "ds", set_global=False):
        with pytest.raises(ConfigError, match="OTEL_REPLAY_RERUN_MAX_BODY='8MiB' is not a number"):
            with recording("h1"):
                pytest.fail("the recording started with a cap it cannot apply")  # was: every response dropped
