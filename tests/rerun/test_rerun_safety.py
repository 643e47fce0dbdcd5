"""Patch removal, threads, redaction, tampering and bad input."""

from __future__ import annotations

import builtins
import datetime
import io
import json
import os
import random
import secrets
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import requests
import requests.adapters
import urllib3.connectionpool

import otel_replay
from otel_replay import _seam
from otel_replay import semconv as sc
from otel_replay.capture.recorder import get_recorder
from otel_replay.errors import (
    ConfigError,
    DatasetError,
    DeterminismLeakError,
    PolicyLoadError,
    RecordNotFound,
    ReplayMismatchError,
    UntrustedRecord,
)
from otel_replay.rerun import recording, rerun
from otel_replay.rerun.interceptor import Interceptor
from tests._support import Zygote

from .conftest import agent, record


def _originals() -> dict[str, Any]:
    return {
        "time.time": time.time,
        "time.monotonic": time.monotonic,
        "time.sleep": time.sleep,
        "datetime.datetime": datetime.datetime,
        "datetime.date": datetime.date,
        "random.random": random.random,
        "random.choice": random.choice,
        "uuid.uuid4": uuid.uuid4,
        "os.urandom": os.urandom,
        "secrets.token_hex": secrets.token_hex,
        "httpx": httpx.HTTPTransport.__dict__["handle_request"],
        "httpx.async": httpx.AsyncHTTPTransport.__dict__["handle_async_request"],
        "httpx2": httpx2.HTTPTransport.__dict__["handle_request"],
        "httpx2.async": httpx2.AsyncHTTPTransport.__dict__["handle_async_request"],
        "requests": requests.adapters.HTTPAdapter.__dict__["send"],
        "urllib3": urllib3.connectionpool.HTTPConnectionPool.__dict__["urlopen"],
        "open": builtins.open,
        "io.open": io.open,
        "getaddrinfo": socket.getaddrinfo,
        "connect": socket.socket.connect,
        "socket.__dict__": "connect" in socket.socket.__dict__,
        "gate": otel_replay.ActionGate.__dict__["commit"],
        "seam": _seam.current(),
        "sink": get_recorder().sink,
        "active": Interceptor._active,
    }


def _boom() -> None:
    time.time()
    raise RuntimeError("agent failed")


def _leaky() -> None:
    uuid.uuid4()
    _boom()


def test_patches_are_removed_exactly_also_when_the_entrypoint_raises(dataset: Path) -> None:
    before = _originals()
    with pytest.raises(RuntimeError, match="agent failed"):
        record(dataset, "s1", _boom)
    after_record = _originals()
    assert all(after_record[k] is before[k] for k in before), [k for k in before if after_record[k] is not before[k]]
    result = rerun(_boom, dataset=dataset, session_id="s1")
    assert result.error == "RuntimeError: agent failed"
    assert result.matched, result.report()  # the original raised the same way
    after_rerun = _originals()
    assert all(after_rerun[k] is before[k] for k in before), [k for k in before if after_rerun[k] is not before[k]]
    with pytest.raises(DeterminismLeakError):
        rerun(_leaky, dataset=dataset, session_id="s1", governance="strict")
    assert all(_originals()[k] is before[k] for k in before)


def _self_recording() -> tuple[bool, float]:
    with recording("again") as mode:
        return mode is None, time.time()


def test_recordings_do_not_nest_and_a_recording_inside_a_rerun_is_a_no_op(dataset: Path) -> None:
    telemetry = otel_replay.configure(dataset, set_global=False)
    try:
        with recording("outer"), pytest.raises(ConfigError, match="do not nest"), recording("inner"):
            pass
        inside_rerun, recorded = _self_recording()
        telemetry.force_flush()
    finally:
        telemetry.shutdown()
    assert not inside_rerun
    result = rerun(_self_recording, dataset=dataset, session_id="again")
    assert result.output == (True, recorded) and result.matched


def _worker(api: str, index: int) -> dict[str, Any]:
    with otel_replay.correlation(f"worker-{index}"):
        quote = httpx.get(f"{api}/quote?worker={index}").json()
        time.sleep(0.001 * (3 - index))  # finish in a different order than started
        return {"quote": quote, "id": str(uuid.uuid4()), "draw": random.random(), "at": time.time()}


def _threaded(api: str) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(max_workers=3) as pool:
        return list(pool.map(lambda i: _worker(api, i), range(3)))


def test_threads_rerun_identically(dataset: Path) -> None:
    with agent.scripted_server() as api:
        original, fingerprint, _ = record(dataset, "s1", lambda: _threaded(api))
    assert len({row["id"] for row in original}) == 3
    for _ in range(3):
        result = rerun(lambda: _threaded(api), dataset=dataset, session_id="s1")
        assert result.error is None, result.report()
        assert result.output == original and result.matched and result.fingerprint == fingerprint


def _secret_calls(api: str, key: str) -> tuple[int, int]:
    first = httpx.post(f"{api}/orders", json={"api_key": key, "qty": 1}, headers={"Authorization": f"Bearer {key}"})
    second = requests.get(f"{api}/status?token={key}", headers={"X-Api-Key": key}, timeout=5)
    return first.status_code, second.status_code


def test_secrets_are_redacted_before_writing_and_matched_by_their_real_value(dataset: Path) -> None:
    key = "sk-live-SECRET-0123456789abcdef"
    with agent.scripted_server() as api:
        original, _, _ = record(dataset, "s1", lambda: _secret_calls(api, key))
    stored = b"".join(p.read_bytes() for p in dataset.rglob("*.parquet"))
    text = "".join(str(pq.read_table(p, columns=["attributes"]).to_pylist()) for p in dataset.rglob("*.parquet"))
    assert key.encode() not in stored and key not in text
    assert "session=abc123" not in text  # the server's Set-Cookie
    assert "[REDACTED]" in text
    # The same key at rerun time matches; another key (another account acting) is another call, though both
    # are stored alike: the calls are matched on a keyed hash of the real values, never on the redacted text.
    same = rerun(lambda: _secret_calls(api, key), dataset=dataset, session_id="s1")
    assert same.matched and same.output == original, same.report()
    other = rerun(lambda: _secret_calls(api, "sk-live-OTHER-9999999999999999"), dataset=dataset, session_id="s1")
    assert not other.matched and other.divergence is not None and other.divergence.step == 0


def _reads_a_file(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def test_strict_refuses_file_reads_and_sockets_relaxed_reports_them(dataset: Path, tmp_path: Path) -> None:
    target = tmp_path / "config.txt"
    target.write_text("hello")
    record(dataset, "s1", lambda: _reads_a_file(str(target)))
    relaxed = rerun(lambda: _reads_a_file(str(target)), dataset=dataset, session_id="s1")
    assert relaxed.output == "hello" and any("file open" in leak for leak in relaxed.leaks)
    with pytest.raises(DeterminismLeakError, match="file open"):
        rerun(lambda: _reads_a_file(str(target)), dataset=dataset, session_id="s1", governance="strict")
    with pytest.raises(DeterminismLeakError, match="DNS lookup"):
        rerun(lambda: socket.getaddrinfo("localhost", 80), dataset=dataset, session_id="s1", governance="strict")


def test_unknown_session_bad_entrypoint_and_bad_governance(dataset: Path) -> None:
    record(dataset, "s1", time.time)
    with pytest.raises(RecordNotFound, match="no recording for session 'nope'"):
        rerun(time.time, dataset=dataset, session_id="nope")
    with pytest.raises(PolicyLoadError, match="entrypoint 'no_such_module:run'"):
        rerun("no_such_module:run", dataset=dataset, session_id="s1")
    with pytest.raises(ConfigError, match="governance"):
        rerun(time.time, dataset=dataset, session_id="s1", governance="lenient")  # type: ignore[arg-type]


def _rewrite(dataset: Path, change: Any) -> None:
    for path in dataset.rglob("*.parquet"):
        table = pq.read_table(path)
        kinds = table.column("replay_kind").to_pylist()
        attributes = table.column("attributes").to_pylist()
        edited = [change(a) if k == "recording" else a for k, a in zip(kinds, attributes, strict=True)]
        index = table.schema.get_field_index("attributes")
        pq.write_table(table.set_column(index, "attributes", pa.array(edited, pa.string())), path)


def test_a_tampered_recording_is_refused(dataset: Path) -> None:
    record(dataset, "s1", lambda: [random.random() for _ in range(3)])

    def edit(text: str) -> str:
        attrs = json.loads(text)
        events = json.loads(attrs[sc.RECORDING_EVENTS])
        events[1]["v"] = 0.5  # serve a different "random" number
        attrs[sc.RECORDING_EVENTS] = json.dumps(events)
        return json.dumps(attrs)

    _rewrite(dataset, edit)
    with pytest.raises(UntrustedRecord, match=r"recording of session 's1'.*hash mismatch.*tampered"):
        rerun(lambda: random.random(), dataset=dataset, session_id="s1")


def _emit_chunk(dataset: Path, session_id: str, record_id: str, *, version: int, events: str) -> None:
    """Write one sealed, final recording chunk made by hand (a newer format, malformed events ...)."""
    telemetry = otel_replay.configure(dataset, set_global=False)
    try:
        attrs = {
            sc.KIND: sc.KIND_RECORDING,
            sc.SESSION_ID: session_id,
            sc.RECORD_ID: record_id,
            sc.RECORDING_FORMAT: version,
            sc.RECORDING_CHUNK: 0,
            sc.RECORDING_EVENTS: events,
            sc.RECORDING_FINAL: True,
        }
        get_recorder().emit(sc.SPAN_RECORDING, record_id, attrs)
        telemetry.force_flush()
    finally:
        telemetry.shutdown()


def test_a_recording_from_a_newer_format_is_refused(dataset: Path) -> None:
    _emit_chunk(dataset, "future", "chunk-1", version=99, events="[]")
    with pytest.raises(DatasetError, match="format version 99.*upgrade otel-replay"):
        rerun(time.time, dataset=dataset, session_id="future")


def _many_clock_reads() -> list[float]:
    return [time.time() for _ in range(300)]


def test_a_recording_cut_short_reruns_up_to_its_end_and_says_so(dataset: Path) -> None:
    from otel_replay.rerun import record as record_module

    telemetry = otel_replay.configure(dataset, set_global=False)
    try:
        mode = record_module.RecordMode("cut")
        from otel_replay.rerun.interceptor import Interceptor

        with otel_replay.session("cut"), Interceptor(mode):
            values = _many_clock_reads()  # 300 reads: one chunk of 256 is written, then the "process dies"
        telemetry.force_flush()
    finally:
        telemetry.shutdown()
    result = rerun(_many_clock_reads, dataset=dataset, session_id="cut")
    assert not result.recording_complete and result.ended_early and not result.matched
    assert "ended early" in result.summary()
    assert result.error is not None and "the recording ended early" in result.error
    assert result.original_fingerprint is None
    assert len(values) == 300


PROCESS_SCRIPT = """
import random, sys, uuid
import otel_replay
from otel_replay.rerun.autostart import RecordingInstrumentor
otel_replay.configure(sys.argv[1], service_name="whole-process", set_global=True)
RecordingInstrumentor().instrument()
import process_agent
print(process_agent.main())
"""

PROCESS_AGENT = """
import random, time, uuid
def main():
    return [round(random.random(), 12), str(uuid.uuid4()), time.time()]
"""


def test_a_whole_process_is_recorded_from_the_environment_and_reruns(
    dataset: Path, tmp_path: Path, zygote: Zygote
) -> None:
    import sys

    (tmp_path / "process_agent.py").write_text(PROCESS_AGENT)
    env = {**os.environ, "OTEL_REPLAY_RECORD_SESSION": "whole", "PYTHONPATH": str(tmp_path)}
    out = zygote.run(PROCESS_SCRIPT, str(dataset), env=env)  # the whole process recorded: a process of its own
    assert out.returncode == 0, out.stderr
    printed = out.stdout.strip().splitlines()[-1]
    sys.path.insert(0, str(tmp_path))
    try:
        import process_agent  # type: ignore[import-not-found]

        result = rerun(process_agent.main, dataset=dataset, session_id="whole")
    finally:
        sys.path.remove(str(tmp_path))
    assert result.matched, result.report()
    assert repr(result.output) == printed


def test_every_rerun_module_imports_and_records_without_the_http_clients(dataset: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys, pkgutil, importlib, time\n"
        "for name in ('httpx', 'httpx2', 'requests', 'openai', 'anthropic', 'pytest'):\n"
        "    sys.modules[name] = None\n"
        "pkg = importlib.import_module('otel_replay.rerun')\n"
        "for info in pkgutil.iter_modules(pkg.__path__):\n"
        "    importlib.import_module('otel_replay.rerun.' + info.name)\n"
        "import otel_replay\n"
        "from otel_replay.rerun import recording\n"
        "with otel_replay.configure(sys.argv[1], set_global=False):\n"
        "    with recording('bare') as mode:\n"
        "        time.time()\n"
        "print(mode.events)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(dataset)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"


def _post(api: str, payload: Any) -> int:
    response = httpx.post(f"{api}/orders", content=payload, headers={"Content-Type": "application/json"})
    return len(response.content)


def test_hostile_bodies_never_break_the_recorded_call_and_a_capped_body_is_named(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = "[" * 50_000 + "]" * 50_000  # deeper than any JSON parser walks
    monkeypatch.setenv("OTEL_REPLAY_RERUN_MAX_BODY", "2000")
    big = json.dumps({"pad": "x" * 5000, "token": "sk-should-not-leak-0123456789abcdef"})
    with agent.scripted_server() as api:
        original, _, _ = record(dataset, "hostile", lambda: (_post(api, deep.encode()), _post(api, big.encode())))
    text = "".join(str(pq.read_table(p, columns=["attributes"]).to_pylist()) for p in dataset.rglob("*.parquet"))
    assert "sk-should-not-leak" not in text
    assert '\\\\"capped\\\\"' in text or "capped" in text
    relaxed = rerun(
        lambda: (_post(api, deep.encode()), _post(api, big.encode())), dataset=dataset, session_id="hostile"
    )
    assert relaxed.divergence is not None and "capped at 2000 of" in relaxed.divergence.reason
    assert relaxed.output[0] == original[0]
    with pytest.raises(ReplayMismatchError, match="capped at 2000") as caught:
        rerun(
            lambda: (_post(api, deep.encode()), _post(api, big.encode())),
            dataset=dataset,
            session_id="hostile",
            governance="strict",
        )
    assert caught.value.step == 1


def _clock() -> float:
    return time.time()


def test_a_second_rerun_while_one_runs_is_refused(dataset: Path) -> None:
    recorded, _, _ = record(dataset, "s1", _clock)
    inner: list[BaseException] = []

    def nested() -> float:
        try:
            rerun(_clock, dataset=dataset, session_id="s1")
        except ConfigError as exc:
            inner.append(exc)
        return _clock()

    result = rerun(nested, dataset=dataset, session_id="s1")
    assert inner and "already active" in str(inner[0])
    assert result.matched and result.output == recorded, result.report()


def _scoped_steps(api: str) -> list[dict[str, Any]]:
    out = []
    for _ in range(3):
        with otel_replay.correlation() as cid:  # a made-up id: streams are keyed on it, so it must come back
            out.append({"cid": cid, "quote": httpx.get(f"{api}/quote").json(), "draw": random.random()})
    return out


def test_made_up_correlation_ids_come_back_so_streams_still_line_up(dataset: Path) -> None:
    with agent.scripted_server() as api:
        original, _, _ = record(dataset, "s1", lambda: _scoped_steps(api))
    assert len({row["cid"] for row in original}) == 3
    result = rerun(lambda: _scoped_steps(api), dataset=dataset, session_id="s1")
    assert result.output == original and result.matched, result.report()


_REAL_DATETIME = datetime.datetime


def _dates() -> list[Any]:
    made = [datetime.datetime(2020, 1, 1), datetime.datetime.fromtimestamp(0, datetime.UTC), datetime.date(2020, 1, 2)]
    now = datetime.datetime.now(datetime.UTC)
    return [
        [type(v).__name__ for v in made],
        all(type(v) in (_REAL_DATETIME, datetime.date.__base__, type(datetime.date(1, 1, 1))) for v in made),
        isinstance(_REAL_DATETIME(2021, 1, 1), datetime.datetime),
        now.isoformat(),
        datetime.date.today().isoformat(),
        str(datetime.datetime.utcnow()),
    ]


def test_the_datetime_stand_ins_build_real_datetimes_and_replay_now(dataset: Path) -> None:
    original, _, _ = record(dataset, "dates", _dates)
    assert original[0] == ["datetime", "datetime", "date"] and original[1] and original[2]
    result = rerun(_dates, dataset=dataset, session_id="dates")
    assert result.output == original and result.matched, result.report()


def _urllib3_calls(api: str) -> list[Any]:
    import urllib3

    pool = urllib3.PoolManager()
    first = pool.request("GET", f"{api}/quote")
    second = pool.request(
        "POST", f"{api}/orders", body=json.dumps({"n": 1}), headers={"Content-Type": "application/json"}
    )
    via_requests = requests.get(f"{api}/status", timeout=5).json()  # requests' own boundary, not urllib3's
    return [first.status, first.json(), second.json()["ticket"], via_requests]


def test_urllib3_used_directly_is_recorded_and_served(dataset: Path) -> None:
    with agent.scripted_server() as api:
        original, _, events = record(dataset, "u3", lambda: _urllib3_calls(api))
    assert events == 3  # two urllib3 calls and one requests call: nothing recorded twice
    result = rerun(lambda: _urllib3_calls(api), dataset=dataset, session_id="u3", governance="strict")
    assert result.output == original and result.matched, result.report()


def test_one_session_id_recorded_twice_is_refused_by_name(dataset: Path) -> None:
    record(dataset, "twice", _clock)
    record(dataset, "twice", _clock)
    with pytest.raises(DatasetError, match="chunk 0 is claimed by two records.*recorded twice under one session id"):
        rerun(_clock, dataset=dataset, session_id="twice")


def _failing_call(url: str) -> str:
    try:
        httpx.get(url, timeout=2)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}"
    return "answered"


def test_a_recorded_failure_is_raised_again_with_its_type(dataset: Path) -> None:
    with agent.scripted_server() as api:
        pass  # started and stopped: nothing listens on this port any more
    original, _, _ = record(dataset, "fail", lambda: _failing_call(f"{api}/quote"))
    assert original == "ConnectError"
    with agent.scripted_server() as other:
        # Even with a server listening (on another port), the rerun serves the recorded failure.
        result = rerun(lambda: _failing_call(f"{api}/quote"), dataset=dataset, session_id="fail", governance="strict")
    assert other and result.output == "ConnectError" and result.matched, result.report()


def _exits() -> None:
    time.time()
    raise SystemExit(3)


def test_an_agent_calling_sys_exit_ends_its_rerun_not_the_caller(dataset: Path) -> None:
    with pytest.raises(SystemExit):
        record(dataset, "exit", _exits)
    result = rerun(_exits, dataset=dataset, session_id="exit")
    assert result.error == "SystemExit: 3" and result.matched, result.report()


def test_recording_without_a_pipeline_says_it_goes_nowhere(tmp_path: Path) -> None:
    # In a fresh interpreter: whatever ran earlier in this process, no tracer provider is installed there.
    code = (
        "import logging, time\n"
        "logging.basicConfig(format='%(name)s: %(message)s')\n"
        "from otel_replay.rerun import recording\n"
        "with recording('nowhere'):\n"
        "    time.time()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") or k.startswith("OTEL_REPLAY_")}
    command = [sys.executable, "-c", code]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert "otel_replay.rerun" in done.stderr and "not stored anywhere" in done.stderr
    assert "otel_replay.configure" in done.stderr


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ('[{"q": 0}]', "malformed event"),
        ('[{"q": 1, "b": "clock", "n": "time.time", "s": "x", "a": "[]", "h": "0"}]', "out of order"),
        ('{"q": 0}', "malformed event"),
        ("[" * 5000 + "]" * 5000, "recording chunk"),
        ('[{"q": 0, "q": 1}]', "duplicate"),
    ],
)
def test_a_sealed_but_malformed_recording_is_a_one_line_dataset_error(
    dataset: Path, events: str, expected: str
) -> None:
    _emit_chunk(dataset, "bad", "chunk-bad", version=1, events=events)
    with pytest.raises(DatasetError, match=expected) as caught:
        rerun(time.time, dataset=dataset, session_id="bad")
    assert "\n" not in str(caught.value) and "chunk-bad" in str(caught.value)
