"""What a rerun compares: everything that decides an action, through a keyed hash, stored redacted.

A method's receiver, an HTTP request's method, full URL with its query, headers (minus the volatile ones) and
body, all by their real values; the stored text stays redacted and the stored hashes are keyed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pyarrow.parquet as pq
import pytest
import requests
import urllib3

import otel_replay
from otel_replay.errors import ConfigError
from otel_replay.instrumentation.scripted import ScriptedServer, anthropic_message, chat_completion
from otel_replay.query.store import Store
from otel_replay.rerun import rerun
from otel_replay.rerun.codec import stable_json
from otel_replay.rerun.http_match import VOLATILE_HEADERS, compared_headers
from otel_replay.rerun.load import load_recording
from tests._support import Zygote

from .conftest import record

# --- the receiver of a method tool ----------------------------------------------------------------


@dataclass(frozen=True)
class Account:
    name: str

    @otel_replay.tool(side_effect="financial")
    def pay(self, to: str, amount: int) -> str:
        return f"{self.name} paid {to} {amount}"


class Client:
    """A receiver with no value representation (a live client holding a lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    @otel_replay.tool
    def send(self, to: str) -> str:
        return f"sent to {to}"


def test_a_method_tool_is_compared_with_its_receiver(dataset: Path) -> None:
    original, _, _ = record(dataset, "pay", lambda: Account("treasury").pay("vendor-7", 5000))
    same = rerun(lambda: Account("treasury").pay("vendor-7", 5000), dataset=dataset, session_id="pay")
    assert same.matched and same.output == original, same.report()
    other = rerun(lambda: Account("customer-escrow").pay("vendor-7", 5000), dataset=dataset, session_id="pay")
    assert not other.matched and other.divergence is not None
    assert other.divergence.step == 0 and "other arguments" in other.divergence.reason


def test_a_receiver_with_no_value_representation_makes_the_call_unmatchable(dataset: Path) -> None:
    record(dataset, "send", lambda: Client().send("vendor-7"))
    result = rerun(lambda: Client().send("vendor-7"), dataset=dataset, session_id="send")
    assert not result.matched and result.divergence is not None
    assert "no value representation" in result.divergence.reason and "Client" in result.divergence.reason


@dataclass(frozen=True)
class Ledger:
    name: str

    def transfer(self, to: str, amount: int = 1) -> str:
        return f"{self.name} sent {to} {amount}"


def test_a_method_made_a_tool_in_place_is_compared_with_its_receiver_and_its_own_arguments(dataset: Path) -> None:
    otel_replay.wrap_tool(f"{__name__}:Ledger.transfer")
    try:
        record(dataset, "moved", lambda: Ledger("treasury").transfer("vendor-7", 5))
        same = rerun(lambda: Ledger("treasury").transfer("vendor-7", 5), dataset=dataset, session_id="moved")
        assert same.matched and same.output == "treasury sent vendor-7 5", same.report()
        for changed in (
            lambda: Ledger("escrow").transfer("vendor-7", 5),
            lambda: Ledger("treasury").transfer("v-8", 5),
        ):
            result = rerun(changed, dataset=dataset, session_id="moved")
            assert not result.matched and result.divergence is not None and result.divergence.step == 0
    finally:
        otel_replay.unwrap_tool(f"{__name__}:Ledger.transfer")


# --- a tool's default argument values --------------------------------------------------------------


@otel_replay.tool("pay", side_effect="financial")
def pay_in_usd(to: str, amount: int, currency: str = "USD") -> str:
    return f"paid {to} {amount} {currency}"


@otel_replay.tool("pay", side_effect="financial")
def pay_in_eur(to: str, amount: int, currency: str = "EUR") -> str:
    return f"paid {to} {amount} {currency}"


@otel_replay.tool("note")
def note_v1(*lines: str, level: str = "info", **tags: Any) -> str:
    return f"{level}: {lines} {tags}"


@otel_replay.tool("note")
def note_v2(*lines: str, level: str = "error", **tags: Any) -> str:
    return f"{level}: {lines} {tags}"


@otel_replay.tool("send")
def send_locked(to: str, lock: Any = threading.Lock()) -> str:  # noqa: B008 - a default with no value representation
    return f"sent to {to}"


def test_a_changed_default_argument_value_of_a_tool_is_a_divergence(dataset: Path) -> None:
    original, _, _ = record(dataset, "pay", lambda: pay_in_usd("vendor-7", 5000))
    same = rerun(lambda: pay_in_usd("vendor-7", 5000), dataset=dataset, session_id="pay")
    assert same.matched and same.output == original and same.rules == "", same.report()
    other = rerun(lambda: pay_in_eur("vendor-7", 5000), dataset=dataset, session_id="pay")
    assert not other.matched and other.divergence is not None, other.report()
    assert other.divergence.step == 0 and "other arguments" in other.divergence.reason, other.report()
    # The same action, the currency now passed by hand instead of taken from the default: matched.
    passed = rerun(lambda: pay_in_eur("vendor-7", 5000, currency="USD"), dataset=dataset, session_id="pay")
    assert passed.matched, passed.report()


def test_defaults_beside_star_args_and_star_star_kwargs_are_compared(dataset: Path) -> None:
    record(dataset, "note", lambda: note_v1("a", "b", who="x"))
    assert rerun(lambda: note_v1("a", "b", who="x"), dataset=dataset, session_id="note").matched
    changed = rerun(lambda: note_v2("a", "b", who="x"), dataset=dataset, session_id="note")
    assert not changed.matched and changed.divergence is not None and changed.divergence.step == 0
    assert rerun(lambda: note_v2("a", "b", level="info", who="x"), dataset=dataset, session_id="note").matched


def test_a_default_with_no_value_representation_makes_the_call_unmatchable(dataset: Path) -> None:
    record(dataset, "send", lambda: send_locked("vendor-7"))
    result = rerun(lambda: send_locked("vendor-7"), dataset=dataset, session_id="send")
    assert not result.matched and result.divergence is not None
    assert "no value representation" in result.divergence.reason and "lock" in result.divergence.reason.lower()


def test_a_builtin_tool_without_a_signature_still_reruns_matched(dataset: Path) -> None:
    as_int = otel_replay.tool("as_int")(int)
    record(dataset, "int", lambda: as_int("42"))
    result = rerun(lambda: as_int("42"), dataset=dataset, session_id="int")
    assert result.matched and result.output == 42, result.report()
    assert not rerun(lambda: as_int("43"), dataset=dataset, session_id="int").matched


def test_a_format_3_recording_reruns_by_its_rules_and_says_defaults_are_not_compared(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from otel_replay.rerun import record as record_module
    from otel_replay.rerun.codec import arguments_codec

    with monkeypatch.context() as patch:  # the record mode of format 3, as it was
        patch.setattr(record_module, "RECORDING_FORMAT", 3)
        with arguments_codec(3):
            record(dataset, "pay3", lambda: pay_in_usd("vendor-7", 5000))
    with Store(dataset) as store:
        assert load_recording(store, "pay3").codec == 3
    same = rerun(lambda: pay_in_usd("vendor-7", 5000), dataset=dataset, session_id="pay3", governance="strict")
    assert same.matched, same.report()
    rules = "recorded in format 3: a tool's default argument values"
    assert same.rules.startswith(rules) and rules in same.report() and "record again" in same.report()
    # Its rules: defaults were not compared then, so the changed default still matches it (and says why).
    assert rerun(lambda: pay_in_eur("vendor-7", 5000), dataset=dataset, session_id="pay3").matched
    assert not rerun(lambda: pay_in_usd("vendor-8", 5000), dataset=dataset, session_id="pay3").matched


# --- HTTP: the real values of every part that decides the action ------------------------------------


@contextmanager
def _server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A local server answering every request with 200 and what it received (SHA-256 and length of the body)."""
    seen: list[dict[str, Any]] = []

    class _H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _body(self) -> tuple[str, int]:
            digest, size = hashlib.sha256(), 0
            if (self.headers.get("Transfer-Encoding") or "").lower() == "chunked":
                while True:
                    length = int(self.rfile.readline().split(b";")[0], 16)
                    if not length:
                        self.rfile.readline()
                        break
                    left = length
                    while left:
                        piece = self.rfile.read(min(left, 1 << 20))
                        digest.update(piece)
                        left -= len(piece)
                    size += length
                    self.rfile.readline()
            else:
                left = int(self.headers.get("Content-Length") or 0)
                size = left
                while left:
                    piece = self.rfile.read(min(left, 1 << 20))
                    digest.update(piece)
                    left -= len(piece)
            return digest.hexdigest(), size

        def do_GET(self) -> None:
            digest, size = self._body()
            seen.append({"method": self.command, "path": self.path, "sha256": digest, "bytes": size})
            out = json.dumps({"ok": True}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        do_POST = do_DELETE = do_PUT = do_GET

    server = ThreadingHTTPServer(("127.0.0.1", 0), _H)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _send(
    client: str, method: str, url: str, *, body: bytes | None = None, headers: dict[str, str] | None = None
) -> int:
    if client == "httpx":
        return httpx.request(method, url, content=body, headers=headers).status_code
    if client == "requests":
        return requests.request(method, url, data=body, headers=headers, timeout=5).status_code
    return urllib3.PoolManager().request(method, url, body=body, headers=headers).status


_CLIENTS = ["httpx", "requests", "urllib3"]


def _matched(dataset: Path, session: str, before: Callable[[str], Any], after: Callable[[str], Any]) -> Any:
    """Record ``before`` against a live server, rerun ``after`` (the server is gone): the rerun's result."""
    with _server() as (base, _):
        record(dataset, session, lambda: before(base))
    return rerun(lambda: after(base), dataset=dataset, session_id=session)


def _stored_text(dataset: Path) -> str:
    return "".join(str(pq.read_table(p, columns=["attributes"]).to_pylist()) for p in dataset.rglob("*.parquet"))


@pytest.mark.parametrize("client", _CLIENTS)
def test_a_json_value_behind_a_secret_looking_key_is_compared_while_stored_redacted(dataset: Path, client: str) -> None:
    def swap(token: str) -> Callable[[str], Any]:
        return lambda base: _send(client, "POST", f"{base}/swap", body=json.dumps({"token": token}).encode())

    same = _matched(dataset, "swap", swap("USDC"), swap("USDC"))
    assert same.matched, same.report()
    base = _base_of(dataset)  # the recorded server's (gone now): only the body differs
    other = rerun(lambda: swap("WBTC")(base), dataset=dataset, session_id="swap")
    assert not other.matched and other.divergence is not None and other.divergence.step == 0
    stored = _stored_text(dataset)
    assert "USDC" not in stored and "[REDACTED]" in stored  # `token` looks secret: stored redacted


@pytest.mark.parametrize("client", _CLIENTS)
def test_a_query_value_change_diverges_though_the_query_is_stored_redacted(dataset: Path, client: str) -> None:
    def delete(name: str) -> Callable[[str], Any]:
        return lambda base: _send(client, "DELETE", f"{base}/objects?key={name}")

    same = _matched(dataset, "del", delete("invoice-17.pdf"), delete("invoice-17.pdf"))
    assert same.matched, same.report()
    base = _base_of(dataset)
    result = rerun(lambda: delete("invoice-18.pdf")(base), dataset=dataset, session_id="del")
    assert not result.matched and result.divergence is not None and result.divergence.step == 0
    assert "invoice-17" not in _stored_text(dataset)  # `key=` is redacted in what is stored


def _base_of(dataset: Path) -> str:
    """The server URL the recording in ``dataset`` was made against (from its stored, redacted text)."""
    text = _stored_text(dataset)
    at = text.index("http://127.0.0.1:")
    return text[at : text.index("/", at + len("http://"))]


@pytest.mark.parametrize("client", _CLIENTS)
def test_a_header_change_diverges(dataset: Path, client: str) -> None:
    def pay(account: str) -> Callable[[str], Any]:
        return lambda base: _send(client, "POST", f"{base}/pay", body=b"{}", headers={"X-Account": account})

    same = _matched(dataset, "hdr", pay("treasury"), pay("treasury"))
    assert same.matched, same.report()
    base = _base_of(dataset)
    result = rerun(lambda: pay("escrow")(base), dataset=dataset, session_id="hdr")
    assert not result.matched and result.divergence is not None and result.divergence.step == 0


@pytest.mark.parametrize("client", _CLIENTS)
def test_a_volatile_header_change_still_matches(dataset: Path, client: str) -> None:
    def call(agent: str, trace: str) -> Callable[[str], Any]:
        headers = {"User-Agent": agent, "traceparent": trace, "X-Stainless-Retry-Count": agent[-1]}
        return lambda base: _send(client, "GET", f"{base}/status", headers=headers)

    first = call("agent/1.0", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    second = call("agent/2.1", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    result = _matched(dataset, "vol", first, second)
    assert result.matched, result.report()


def test_compared_headers_leave_out_the_volatile_ones_and_keep_the_rest() -> None:
    headers = [
        (b"Host", b"api.example"),
        (b"User-Agent", b"x"),
        (b"x-stainless-os", b"Linux"),
        (b"Authorization", b"Bearer sk-1"),
        (b"X-Account", b"treasury"),
        (b"X-Account", b"second"),
        (b"Content-Length", b"12"),
        (b"Traceparent", b"00-1-2-01"),
    ]
    assert compared_headers(headers) == [
        ["authorization", "Bearer sk-1"],
        ["host", "api.example"],
        ["x-account", "treasury"],
        ["x-account", "second"],
    ]
    assert {"user-agent", "traceparent", "content-length", "accept-encoding", "date"} <= VOLATILE_HEADERS


def test_compared_headers_are_the_same_on_every_request_whatever_form_the_names_come_in() -> None:
    # Each name is worked out once and remembered: the second, third ... request must compare exactly as the
    # first, volatile names still left out, bytes and text names alike, and a new name still worked out.
    first = [(b"X-Account", b"treasury"), (b"User-Agent", b"a"), ("Idempotency-Key", "k-1"), ("Traceparent", "t")]
    expected = [["idempotency-key", "k-1"], ["x-account", "treasury"]]
    for _ in range(3):
        assert compared_headers(first) == expected
        assert compared_headers({"x-account": "escrow", "USER-AGENT": "b"}) == [["x-account", "escrow"]]
    assert compared_headers([(b"X-Brand-New", b"1"), (b"x-stainless-arch", b"arm64")]) == [["x-brand-new", "1"]]


# --- the real model clients, unchanged, still rerun matched ------------------------------------------


def _model_agent(server: ScriptedServer) -> list[str]:
    chat = openai.OpenAI(base_url=server.base_url, api_key="sk-test-0123456789abcdef", max_retries=0)
    claude = anthropic.Anthropic(base_url=server.root_url, api_key="sk-ant-test-0123456789", max_retries=0)
    first = chat.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "quote?"}])
    second = claude.messages.create(model="claude", max_tokens=32, messages=[{"role": "user", "content": "ok?"}])
    return [str(first.choices[0].message.content), str(second.content[0].text)]  # type: ignore[union-attr]


def test_unchanged_openai_and_anthropic_agents_rerun_matched(dataset: Path) -> None:
    with ScriptedServer([chat_completion("101.5"), anthropic_message("yes")]) as server:
        original, _, _ = record(dataset, "models", lambda: _model_agent(server))
        result = rerun(lambda: _model_agent(server), dataset=dataset, session_id="models", governance="strict")
    assert original == ["101.5", "yes"]
    assert result.matched and result.output == original, result.report()


# --- keyed: nothing stored lets a reader test a guess -------------------------------------------------


@otel_replay.tool
def _charge(api_key: str, amount: int) -> str:
    return f"charged {amount}"


def _plain_hash(boundary: str, name: str, text: str) -> str:
    """The hash codec 2 stored: a plain SHA-256 anyone can recompute from a guess."""
    head = f"{len(boundary)}:{boundary}{len(name)}:{name}"
    return hashlib.sha256((head + text).encode()).hexdigest()[:32]


def test_the_recording_holds_neither_a_secret_nor_a_plain_hash_of_it(dataset: Path) -> None:
    secret = "sk-live-TREASURY-0123456789abcdef"
    body = json.dumps({"api_key": secret}).encode()

    def agent(base: str) -> Any:
        _send("httpx", "POST", f"{base}/charge", body=body, headers={"Authorization": f"Bearer {secret}"})
        return _charge(secret, 5)

    with _server() as (base, _):
        record(dataset, "keyed", lambda: agent(base))
        stored = b"".join(p.read_bytes() for p in dataset.rglob("*.parquet"))
        text = _stored_text(dataset)
        guesses = [
            hashlib.sha256(secret.encode()).hexdigest(),
            hashlib.sha256(body).hexdigest(),
            _plain_hash("tool", "_charge", stable_json({"api_key": secret, "amount": 5})),
        ]
        assert secret not in text and secret.encode() not in stored
        for guess in guesses:
            assert guess[:32] not in text and guess[:32].encode() not in stored
        same = rerun(lambda: agent(base), dataset=dataset, session_id="keyed")
    assert same.matched, same.report()


def test_a_rerun_without_the_recording_s_key_is_refused_naming_it(dataset: Path, monkeypatch: Any) -> None:
    record(dataset, "k", lambda: Account("treasury").pay("vendor-7", 1))
    monkeypatch.setenv("OTEL_REPLAY_SIGNING_KEY", "another-key-0123456789abcdef")
    store = otel_replay.open(dataset, require_signed=False)
    try:
        with pytest.raises(ConfigError, match="not a verification key here; a rerun needs that key"):
            rerun(lambda: Account("treasury").pay("vendor-7", 1), dataset=store, session_id="k")
    finally:
        store.close()


# --- a streamed upload: hashed on its way, compared in a rerun, never held whole --------------------


def _upload(client: str, base: str, chunks: list[bytes]) -> int:
    def gen() -> Iterator[bytes]:
        yield from chunks

    if client == "httpx":
        return httpx.post(f"{base}/upload", content=gen()).status_code
    if client == "httpx-async":

        async def agen() -> Any:
            for chunk in chunks:
                yield chunk

        async def go() -> int:
            async with httpx.AsyncClient() as http:
                return (await http.post(f"{base}/upload", content=agen())).status_code

        return asyncio.run(go())
    if client == "requests":
        return requests.post(f"{base}/upload", data=gen(), timeout=5).status_code
    return urllib3.PoolManager().request("POST", f"{base}/upload", body=gen(), chunked=True).status


@pytest.mark.parametrize("client", ["httpx", "httpx-async", "requests", "urllib3"])
def test_a_streamed_upload_reaches_the_server_unchanged_and_a_changed_one_diverges(dataset: Path, client: str) -> None:
    chunks = [bytes([i]) * 100_000 for i in range(30)]  # 3 MB, past the stored head
    changed = [*chunks[:-1], chunks[-1][:-1] + b"!"]
    with _server() as (base, seen):
        record(dataset, "up", lambda: _upload(client, base, chunks))
    whole = b"".join(chunks)
    assert seen == [
        {"method": "POST", "path": "/upload", "sha256": hashlib.sha256(whole).hexdigest(), "bytes": 3_000_000}
    ]
    same = rerun(lambda: _upload(client, base, chunks), dataset=dataset, session_id="up")
    assert same.matched and same.output == 200, same.report()
    other = rerun(lambda: _upload(client, base, changed), dataset=dataset, session_id="up")
    assert not other.matched and other.divergence is not None and other.divergence.step == 0
    with otel_replay.open(dataset) as store:
        (event,) = load_recording(store, "up").events
    body = json.loads(event.arguments)["body"]  # stored: its length and a keyed digest, never the bytes
    assert body["bytes"] == 3_000_000 and body["digest"] not in (hashlib.sha256(whole).hexdigest()[:32], "")


def _broken_upload(client: str, base: str) -> str:
    def gen() -> Iterator[bytes]:
        yield b"first reading;"
        yield b"second reading;"
        raise ValueError("sensor unplugged")

    try:
        if client == "httpx":
            httpx.post(f"{base}/upload", content=gen())
        elif client == "requests":
            requests.post(f"{base}/upload", data=gen(), timeout=5)
        else:
            urllib3.PoolManager().request("POST", f"{base}/upload", body=gen(), chunked=True)
    except ValueError as exc:
        return f"failed: {exc}"
    return "sent"


@pytest.mark.parametrize("client", ["httpx", "requests", "urllib3"])
def test_an_upload_whose_body_fails_part_way_reruns_matched_with_the_same_error(dataset: Path, client: str) -> None:
    with _server() as (base, _):
        original, _, _ = record(dataset, "broken", lambda: _broken_upload(client, base))
    assert original == "failed: sensor unplugged"
    result = rerun(lambda: _broken_upload(client, base), dataset=dataset, session_id="broken", governance="strict")
    assert result.matched and result.output == original, result.report()


_MEASURE = r"""
import asyncio, json, sys, threading, tracemalloc
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import otel_replay
from otel_replay.rerun import recording, rerun

client, mib, dataset = sys.argv[1], int(sys.argv[2]), sys.argv[3]

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_POST(self):
        while True:  # chunked: read and drop
            size = int(self.rfile.readline().split(b";")[0], 16)
            left = size
            while left:
                left -= len(self.rfile.read(min(left, 1 << 20)))
            self.rfile.readline()
            if not size:
                break
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"ok")

server = ThreadingHTTPServer(("127.0.0.1", 0), H)
server.daemon_threads = True
threading.Thread(target=server.serve_forever, daemon=True).start()
url = f"http://127.0.0.1:{server.server_address[1]}/upload"
CHUNK = b"x" * (1 << 20)

def upload():
    import httpx, requests, urllib3
    def gen():
        for _ in range(mib):
            yield CHUNK
    if client == "httpx":
        return httpx.post(url, content=gen(), timeout=60).status_code
    if client == "httpx-async":
        async def agen():
            for _ in range(mib):
                yield CHUNK
        async def go():
            async with httpx.AsyncClient(timeout=60) as http:
                return (await http.post(url, content=agen())).status_code
        return asyncio.run(go())
    if client == "requests":
        return requests.post(url, data=gen(), timeout=60).status_code
    return urllib3.PoolManager().request("POST", url, body=gen(), chunked=True).status

def measured(run):
    # The peak of what Python holds over the run (tracemalloc: exact, no sampling, and no file read that a
    # rerun's guards would see, as reading the RSS would be).
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    out = run()
    return out, (tracemalloc.get_traced_memory()[1] - base) / 2**20

tracemalloc.start()
telemetry = otel_replay.configure(dataset, service_name="memory", set_global=False)
def record():
    with recording("upload"):
        return upload()
status, recorded = measured(record)
telemetry.force_flush()
result, replayed = measured(lambda: rerun(upload, dataset=dataset, session_id="upload"))
telemetry.shutdown()
out = {"status": status, "matched": result.matched, "report": result.report()}
print(json.dumps({**out, "record_mib": recorded, "rerun_mib": replayed}))

"""


@pytest.mark.slow
@pytest.mark.parametrize("client", ["httpx", "httpx-async", "requests", "urllib3"])
def test_a_streamed_upload_costs_bounded_memory_to_record_and_to_rerun(
    dataset: Path, zygote: Zygote, client: str
) -> None:
    # 64 MiB through a 1 MiB cap: what is held stays near the cap (a rerun's spool keeps 1 MiB in memory, the
    # rest on disk); holding the body whole, as before, costs at least its size.
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OTEL_REPLAY_RERUN_MAX_BODY": str(1 << 20)}
    done = zygote.run(_MEASURE, client, "64", str(dataset), env=env, timeout=300)  # a process of its own
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["status"] == 200 and out["matched"], out["report"]
    print(f"{client}: 64 MiB upload: peak +{out['record_mib']:.1f} MiB recording, +{out['rerun_mib']:.1f} MiB rerun")
    assert out["record_mib"] < 24 and out["rerun_mib"] < 24, out
