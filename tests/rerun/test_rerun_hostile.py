"""A second, adversarial reading: tampered recordings, hostile bodies, threads, interrupts, cost per step."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import requests
import urllib3

import otel_replay
from otel_replay import _seam
from otel_replay import semconv as sc
from otel_replay.errors import ReplayMismatchError, UntrustedRecord
from otel_replay.instrumentation import tool
from otel_replay.rerun import events as rerun_events
from otel_replay.rerun import http_match, recording, rerun
from otel_replay.rerun.codec import encode_result, redact_url, stable_json
from otel_replay.rerun.interceptor import Interceptor
from otel_replay.rerun.record import RecordMode
from otel_replay.rerun.serve import RerunMode

from .conftest import agent, record
from .test_rerun_safety import _originals


def _clock_reads(n: int = 3) -> list[float]:
    return [time.time() for _ in range(n)]


def _edit_recordings(dataset: Path, change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
    """Rewrite the attributes of every recording row (``change`` returns None to leave a row as it is)."""
    for path in dataset.rglob("*.parquet"):
        table = pq.read_table(path)
        rows = table.column("attributes").to_pylist()
        kinds = table.column("replay_kind").to_pylist()
        edited = []
        for kind, text in zip(kinds, rows, strict=True):
            new = change(json.loads(text)) if kind == "recording" else None
            edited.append(text if new is None else json.dumps(new))
        index = table.schema.get_field_index("attributes")
        pq.write_table(table.set_column(index, "attributes", pa.array(edited, pa.string())), path)


def _refused(dataset: Path, session_id: str) -> str:
    with pytest.raises(UntrustedRecord) as caught:
        rerun(_clock_reads, dataset=dataset, session_id=session_id)
    text = str(caught.value)
    assert "\n" not in text and f"session {session_id!r}" in text, text
    return text


def _unseal(attrs: dict[str, Any]) -> dict[str, Any]:
    attrs.pop(sc.RECORD_HASH, None)
    attrs.pop(sc.RECORD_SIGNATURE, None)
    return attrs


def _renumber(attrs: dict[str, Any]) -> dict[str, Any]:
    attrs[sc.RECORDING_CHUNK] = 7
    return attrs


def _edit_value(attrs: dict[str, Any]) -> dict[str, Any]:
    events = json.loads(attrs[sc.RECORDING_EVENTS])
    events[0]["v"] = 1.0
    attrs[sc.RECORDING_EVENTS] = json.dumps(events)
    return attrs


@pytest.mark.parametrize(
    ("edit", "problem"),
    [(_unseal, "unsealed"), (_renumber, "hash mismatch"), (_edit_value, "hash mismatch")],
)
def test_an_edited_forged_or_renumbered_chunk_is_refused_by_session(
    dataset: Path, edit: Callable[[dict[str, Any]], dict[str, Any]], problem: str
) -> None:
    record(dataset, "s1", _clock_reads)
    _edit_recordings(dataset, edit)
    assert problem in _refused(dataset, "s1")


def test_a_chunk_moved_over_from_another_session_is_refused(dataset: Path) -> None:
    record(dataset, "s1", _clock_reads)
    record(dataset, "s2", _clock_reads)
    for path in dataset.rglob("*.parquet"):
        table = pq.read_table(path)
        sessions = table.column("session_id").to_pylist()
        attrs = table.column("attributes").to_pylist()
        for i, (kind, sid) in enumerate(zip(table.column("replay_kind").to_pylist(), sessions, strict=True)):
            if kind == "recording" and sid == "s2":
                sessions[i] = "s1"
                moved = json.loads(attrs[i])
                moved[sc.RECORDING_CHUNK] = 1
                attrs[i] = json.dumps(moved)
        table = table.set_column(table.schema.get_field_index("session_id"), "session_id", pa.array(sessions))
        table = table.set_column(table.schema.get_field_index("attributes"), "attributes", pa.array(attrs))
        pq.write_table(table, path)
    assert "hash mismatch" in _refused(dataset, "s1")


def _cut_recording(dataset: Path, session_id: str) -> None:
    """300 clock reads, one chunk of 256 written, then 'the process dies' (no final chunk)."""
    telemetry = otel_replay.configure(dataset, set_global=False)
    try:
        with otel_replay.session(session_id), Interceptor(RecordMode(session_id)):
            _clock_reads(300)
        telemetry.force_flush()
    finally:
        telemetry.shutdown()


def test_a_sealed_chunk_spliced_in_from_another_recording_of_the_same_id_is_refused(
    dataset: Path, tmp_path: Path
) -> None:
    _cut_recording(dataset, "s1")  # chunk 0 only: the recording ended early
    other = tmp_path / "other"
    record(other, "s1", lambda: _clock_reads(300))  # another run under the same id: chunks 0 and 1 (final)
    # Carry the other run's (genuinely sealed) final chunk over: it continues the cut recording seamlessly.
    target = next(dataset.rglob("*.parquet")).parent
    for n, path in enumerate(other.rglob("*.parquet")):
        table = pq.read_table(path)
        keep = [
            i
            for i, (kind, text) in enumerate(
                zip(table.column("replay_kind").to_pylist(), table.column("attributes").to_pylist(), strict=True)
            )
            if kind == "recording" and json.loads(text)[sc.RECORDING_CHUNK] == 1
        ]
        if keep:
            pq.write_table(table.take(keep), target / f"spliced-{n}.parquet")
    text = _refused(dataset, "s1")
    assert "another recording" in text


def test_an_identical_copy_of_a_chunk_is_not_a_second_claim(dataset: Path) -> None:
    original, _, _ = record(dataset, "s1", _clock_reads)
    path = next(dataset.rglob("*.parquet"))
    pq.write_table(pq.read_table(path), path.with_name("copy-" + path.name))
    result = rerun(_clock_reads, dataset=dataset, session_id="s1", governance="strict")
    assert result.matched and result.output == original, result.report()


# --- patches and interrupts ------------------------------------------------------------------------


def _interrupted() -> None:
    time.time()
    random.random()
    raise KeyboardInterrupt


def test_an_interrupted_record_and_rerun_leave_no_patch_installed(dataset: Path) -> None:
    before = _originals()
    with pytest.raises(KeyboardInterrupt):
        record(dataset, "ki", _interrupted)
    assert _originals() == before
    with pytest.raises(KeyboardInterrupt):
        rerun(_interrupted, dataset=dataset, session_id="ki")
    after = _originals()
    assert all(after[k] is before[k] for k in before), [k for k in before if after[k] is not before[k]]
    # Nothing is left half-active: a new recording starts.
    record(dataset, "after", _clock_reads)


STOP = threading.Event()
HAMMERS: list[threading.Thread] = []


def _spawns_a_hammering_thread() -> float:
    def hammer() -> None:
        while not STOP.is_set():
            time.time()
            random.random()

    thread = threading.Thread(target=hammer, daemon=True, name="hammer")
    HAMMERS.append(thread)
    thread.start()
    return time.time()


def _stop_the_hammers() -> None:
    """Stop the threads the entrypoint left behind and wait for them: each spins on the CPU until it is told."""
    STOP.set()
    while HAMMERS:
        HAMMERS.pop().join(30)
    STOP.clear()


def test_a_thread_that_outlives_the_entrypoint_does_not_break_the_rerun(dataset: Path) -> None:
    STOP.clear()
    try:
        record(dataset, "outlive", _spawns_a_hammering_thread)
    finally:
        _stop_the_hammers()
    try:
        for _ in range(5):  # the thread hammers the seam while the rerun closes: close() must not trip on it
            result = rerun(_spawns_a_hammering_thread, dataset=dataset, session_id="outlive", write=False)
            assert result.steps >= 1
            assert _seam.current() is None and Interceptor._active is None
            _stop_the_hammers()  # one thread at a time: the next rerun is not slowed by this one's spinning
    finally:
        _stop_the_hammers()
    now = time.time()
    assert abs(now - time.time()) < 60  # the real clock again, not a served value


# --- hostile values -----------------------------------------------------------------------------


def _deep(n: int) -> Any:
    value: Any = []
    for _ in range(n):
        value = [value]
    return value


def test_deep_values_never_break_hashing_or_encoding() -> None:
    deep = _deep(100_000)
    assert "$object" in stable_json({"x": deep}) or "nested" in stable_json({"x": deep})
    assert "$unrecordable" in encode_result(deep)


DEEP_RESULTS: list[int] = []


@tool
def deep_tool(payload: Any) -> Any:
    """Takes and returns values nested deeper than any encoder walks."""
    DEEP_RESULTS.append(1)
    return _deep(50_000)


def _calls_deep_tool() -> int:
    out = deep_tool(_deep(50_000))
    depth = 0
    while isinstance(out, list) and out:
        out, depth = out[0], depth + 1
    return depth


def test_a_tool_with_deep_arguments_and_result_is_recorded_without_changing_the_call(dataset: Path) -> None:
    DEEP_RESULTS.clear()
    original, _, _ = record(dataset, "deep", _calls_deep_tool)
    assert original == 50_000 and DEEP_RESULTS == [1]
    # Arguments nested deeper than any encoder walks cannot be compared: a strict rerun refuses the call ...
    with pytest.raises(ReplayMismatchError, match="no value representation"):
        rerun(_calls_deep_tool, dataset=dataset, session_id="deep", governance="strict")
    # ... and a relaxed one cannot serve its result, which the recording could not hold
    relaxed = rerun(_calls_deep_tool, dataset=dataset, session_id="deep")
    assert not relaxed.matched and "could not hold" in str(relaxed.error)
    assert DEEP_RESULTS == [1]  # the tool was not run again


class _Binary(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        self.server.served += 1  # type: ignore[attr-defined]
        payload = b"\xff\xfe\x00\x80" + body[::-1] + bytes([self.server.served])  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@contextmanager
def _binary_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Binary)
    server.daemon_threads = True
    server.served = 0  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _binary_calls(base: str) -> list[bytes]:
    latin = "café".encode("latin-1")
    return [
        httpx.post(f"{base}/bin", content=b"\x00\xff\xc3(" + latin).content,
        requests.post(f"{base}/bin", data=b"\xc0\xaf" * 3, timeout=5).content,
    ]


def test_non_utf8_request_and_response_bodies_round_trip_exactly(dataset: Path) -> None:
    with _binary_server() as base:
        original, _, _ = record(dataset, "bin", lambda: _binary_calls(base))
    result = rerun(lambda: _binary_calls(base), dataset=dataset, session_id="bin", governance="strict")
    assert result.output == original and result.matched, result.report()


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("https://maps.example/geo?key=AIzaSyA-1234567890abcdefghij&q=x", "AIzaSyA-1234567890abcdefghij"),
        ("https://s3.example/o?X-Amz-Signature=abcdef0123456789&X-Amz-Credential=AKIAX/1", "abcdef0123456789"),
        ("https://api.example/v1?client_api_key=zzzsecretzzz", "zzzsecretzzz"),
        ("https://user:hunter2pass@db.example/path", "hunter2pass"),
        ("https://api.example/v1?auth=Bearer%20abcdefgh12345678", "abcdefgh12345678"),
    ],
)
def test_secrets_in_urls_are_redacted(url: str, secret: str) -> None:
    assert secret not in redact_url(url)


# --- cost per step ----------------------------------------------------------------------------------


def _many_posts(api: str, marker: str) -> list[int]:
    with httpx.Client() as client:
        return [client.post(f"{api}/orders", json={"n": i, "m": marker}).status_code for i in range(60)]


def test_a_relaxed_rerun_diverging_at_every_step_looks_for_candidates_once(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with agent.scripted_server() as api:
        record(dataset, "every", lambda: _many_posts(api, "a"))
    searches = []
    real = RerunMode._candidates

    def counted(self: RerunMode, *args: Any) -> list[str]:
        searches.append(args[0])
        return real(self, *args)

    monkeypatch.setattr(RerunMode, "_candidates", counted)
    result = rerun(lambda: _many_posts(api, "b"), dataset=dataset, session_id="every", write=False)
    assert result.divergence is not None and result.divergence.step == 0 and result.divergence.candidates
    assert len(result.warnings) == 60
    assert len(searches) == 1  # only the divergence that is kept is explained; the rest stay O(1)


def _posts_one_changed(api: str, changed: int | None) -> list[int]:
    with httpx.Client() as client:
        return [
            client.post(f"{api}/orders", json={"n": i, "m": "b" if i == changed else "a"}).status_code
            for i in range(60)
        ]


def test_a_rerun_builds_an_http_calls_stored_text_only_when_the_call_diverges(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with agent.scripted_server() as api:
        record(dataset, "texts", lambda: _posts_one_changed(api, None))
    built: list[str] = []
    real = http_match._parts

    def counted(*args: Any) -> dict[str, Any]:
        built.append(str(args[-3]))  # the URL
        return real(*args)

    monkeypatch.setattr(http_match, "_parts", counted)
    same = rerun(lambda: _posts_one_changed(api, None), dataset=dataset, session_id="texts", write=False)
    assert same.matched, same.report()
    assert built == []  # 60 requests matched on their keyed digests: nothing redacted, no part digests
    other = rerun(lambda: _posts_one_changed(api, 31), dataset=dataset, session_id="texts", write=False)
    assert not other.matched and other.divergence is not None
    assert other.divergence.step == 31 and "called with other arguments" in other.divergence.reason
    assert "the parts that differ: body" in other.divergence.expected  # still named, from the digests built
    assert len(built) == 1  # for the one call that diverged


def _hostile_results() -> list[Any]:
    @tool
    def lookup(kind: str) -> Any:
        return {
            "plain": {"name": "ACME é", "none": None, "ok": True, "price": 101.5, "tags": ["a", "b"]},
            "dollar key": {"$ref": "#/x", "n": 1},
            "dollar text": "$5.00",
            "wide int": 2**13_001,
            "surrogate": "name-\udcff",
            "deep": json.loads("[" * 300 + "1" + "]" * 300),
        }[kind]

    kinds = ["plain", "dollar key", "plain", "dollar text", "wide int", "plain", "surrogate", "deep", "plain"]
    return [lookup(kind) for kind in kinds]


def test_a_loaded_recordings_values_hash_in_one_pass_unless_stable_json_would_write_them_otherwise(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original, _, events = record(dataset, "values", _hostile_results)
    walked: list[Any] = []
    real = rerun_events.value_hash

    def counted(value: Any, error: Any = None) -> str:
        walked.append(value)
        return real(value, error)

    monkeypatch.setattr(rerun_events, "value_hash", counted)
    result = rerun(_hostile_results, dataset=dataset, session_id="values", write=False)
    # Same fingerprint: every value hashed in one pass gave the hash the recording made by walking it.
    assert result.matched and result.output == original, result.report()
    assert events == 9
    # Walked as stable_json walks them: a "$" key (and text starting with "$"), a wide int, a lone surrogate
    # (the last three stored tagged, with "$" keys) and nesting past stable_json's depth; the plain four not.
    assert len(walked) == 5


def test_recording_twice_at_once_in_one_process_is_a_clear_error(dataset: Path) -> None:
    from otel_replay.errors import ConfigError

    started = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with recording("first"):
            started.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert started.wait(10)
        with pytest.raises(ConfigError, match="already active"), recording("second"):
            pass
    finally:
        release.set()
        holder.join(10)
    assert Interceptor._active is None and _seam.current() is None


def _secret_echoes(api: str) -> list[Any]:
    payload = json.dumps({"item": "widget", "password": "hunter2-very-secret"}).encode()
    pool = urllib3.PoolManager()
    direct = pool.request("POST", f"{api}/orders", body=payload, headers={"Content-Type": "application/json"})
    via_requests = requests.post(f"{api}/orders", data=payload, timeout=5)
    via_httpx = httpx.post(f"{api}/orders", content=payload)
    return [direct.json()["order"], via_requests.json()["order"], via_httpx.json()["order"]]


def test_a_response_whose_secrets_were_redacted_is_served_with_a_consistent_length(dataset: Path) -> None:
    with agent.scripted_server() as api:
        original, _, _ = record(dataset, "echo", lambda: _secret_echoes(api))
    assert [o["password"] for o in original] == ["hunter2-very-secret"] * 3  # recording changes nothing seen
    stored = "".join(str(pq.read_table(p, columns=["attributes"]).to_pylist()) for p in dataset.rglob("*.parquet"))
    assert "hunter2" not in stored and "REDACTED" in stored
    result = rerun(lambda: _secret_echoes(api), dataset=dataset, session_id="echo")
    assert result.error is None, result.report()
    assert all(order["password"] == "[REDACTED]" for order in result.output), result.output  # never stored
    assert [o["item"] for o in result.output] == ["widget"] * 3


class _Slip:
    """A receipt type of a custom rail: not JSON, so the recording cannot hold it."""

    def __init__(self, amount: float) -> None:
        self.amount = amount


class _SlipRail:
    def __init__(self) -> None:
        self.commits = 0

    def commit(self, action: Any) -> _Slip:
        self.commits += 1
        return _Slip(action.cost)

    def compensate(self, receipt: Any, *, idempotency_key: str) -> None:
        pass


def _commits_through(rail: _SlipRail) -> Any:
    from otel_replay import Action, ActionGate

    return ActionGate(rail).commit(Action("pay", {"to": "acme"}, cost=12.5))


def test_a_custom_rails_receipt_reaches_the_recorded_agent_unchanged(dataset: Path) -> None:
    rail = _SlipRail()
    original, _, _ = record(dataset, "slip", lambda: _commits_through(rail))
    assert isinstance(original, _Slip) and original.amount == 12.5 and rail.commits == 1
    with pytest.raises(ReplayMismatchError, match="could not hold"):
        rerun(lambda: _commits_through(rail), dataset=dataset, session_id="slip", governance="strict")
    assert rail.commits == 1  # the rerun never commits again


def test_a_verbatim_copy_of_a_chunk_at_another_span_is_left_out_and_the_recording_reruns(dataset: Path) -> None:
    """The copy's sealed place names the original's span: it is not the chunk, so it neither blocks nor counts."""
    record(dataset, "s1", _clock_reads)
    paths = sorted(dataset.rglob("*.parquet"))
    table = pa.concat_tables([pq.read_table(p) for p in paths])
    plain = pa.schema([f.with_type(pa.int64()) if pa.types.is_timestamp(f.type) else f for f in table.schema])
    chunk = next(r for r in table.cast(plain).to_pylist() if r["replay_kind"] == "recording")
    copy = dict(chunk, trace_id="a" * 32, span_id="b" * 16)
    pq.write_table(pa.Table.from_pylist([copy], schema=plain).cast(table.schema), paths[0].parent / "copy.parquet")
    result = rerun(_clock_reads, dataset=dataset, session_id="s1")
    assert result.matched, result
    with otel_replay.open(dataset) as store:
        (session,) = [r for r in store.run("rerun_sessions") if r["session_id"] == "s1"]
        assert session["chunks"] == 1  # the analyst views leave the copy out too
        events = store.run("rerun_event_list", session_id="s1")
        assert len(events) == len({e["seq"] for e in events})
